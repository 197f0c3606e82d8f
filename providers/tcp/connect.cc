// tcp connection set-up: Listen (a kernel listening socket), Accept,
// Connect, and the hello both sides exchange before an endpoint exists.
//
// Connect is bounded by its timeout. Accept's timeout bounds only the wait
// for a connection to arrive: the hello of one that arrived gets the
// connect timeout (connect_timeout_ms), as provider.h asks.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/accept.h"
#include "core/bootstrap_io.h"
#include "core/cq_cast.h"
#include "core/status.h"
#include "providers/tcp/tcp.h"

namespace zsock::tcp {
namespace {

absl::StatusOr<Fd> NewSocket(int family) {
  Fd s(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!s) return ErrnoError(errno, "socket() for tcp failed", "raise the fd limit (ulimit -n)");
  return s;
}

std::string CheckListener(absl::string_view address) {
  return absl::StrCat("check that ", address, " is a zsock tcp listener of this zsock version");
}

class TcpListener final : public Listener {
 public:
  TcpListener(TcpFabric* fabric, Fd sock)
      : fabric_(fabric), sock_(std::move(sock)), address_(BoundAddress(sock_.get())) {}

  std::string address() const override { return address_; }
  int fd() const override { return sock_.get(); }

  absl::StatusOr<std::unique_ptr<Endpoint>> Accept(CompletionQueue* cq,
                                                   absl::Duration timeout) override {
    auto tcq = CqOf<TcpCq>(cq, "tcp", fabric_);
    if (!tcq.ok()) return tcq.status();
    sockaddr_storage from{};
    auto conn = AcceptUntil(sock_.get(), absl::Now() + timeout,
                            absl::StrCat("tcp address ", address_), SOCK_NONBLOCK, &from);
    if (!conn.ok()) return conn.status();
    auto peer = SocketAddress::FromSockaddr(reinterpret_cast<sockaddr*>(&from), sizeof(from));
    if (!peer.ok()) return peer.status();
    return fabric_->Handshake(std::move(*conn), *peer, *tcq,
                              absl::Now() + fabric_->settings().connect_timeout, /*active=*/false);
  }

 private:
  TcpFabric* const fabric_;
  const Fd sock_;
  const std::string address_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Listener>> TcpFabric::Listen(absl::string_view address) {
  auto at = ParseSocketAddress(address);  // "" is 127.0.0.1:0: a free loopback port
  if (!at.ok()) return at.status();
  auto sock = NewSocket(at->family());
  if (!sock.ok()) return sock.status();
  // A restarted server takes its port back from connections in TIME_WAIT;
  // a port with a live listener is still refused (EADDRINUSE).
  int one = 1;
  ::setsockopt(sock->get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(sock->get(), at->get(), at->len) != 0 || ::listen(sock->get(), SOMAXCONN) != 0) {
    return ErrnoError(errno, absl::StrCat("listening on tcp address ", at->ToString(), " failed"),
                      "pick another address or port");
  }
  return std::unique_ptr<Listener>(new TcpListener(this, std::move(*sock)));
}

absl::StatusOr<std::unique_ptr<Endpoint>> TcpFabric::Connect(absl::string_view address,
                                                             CompletionQueue* cq,
                                                             absl::Duration timeout) {
  auto tcq = CqOf<TcpCq>(cq, "tcp", this);
  if (!tcq.ok()) return tcq.status();
  auto to = ParseSocketAddress(address);
  if (!to.ok()) return to.status();
  auto sock = NewSocket(to->family());
  if (!sock.ok()) return sock.status();
  const absl::Time deadline = absl::Now() + timeout;
  int err = ::connect(sock->get(), to->get(), to->len) == 0 ? 0 : errno;
  if (err == EINPROGRESS) {
    const std::string who = absl::StrCat("the tcp listener ", address);
    const std::string fix = CheckListener(address);
    BootstrapIo io(sock->get(), deadline, {who, fix});
    if (absl::Status st = io.Wait(POLLOUT, "the connection"); !st.ok()) return st;
    socklen_t len = sizeof(err);
    ::getsockopt(sock->get(), SOL_SOCKET, SO_ERROR, &err, &len);
  }
  if (err != 0) {  // ECONNREFUSED, at once, where nobody listens
    return ErrnoError(err, absl::StrCat("connecting to tcp address ", address, " failed"),
                      CheckListener(address));
  }
  return Handshake(std::move(*sock), *to, *tcq, deadline, /*active=*/true);
}

absl::StatusOr<std::unique_ptr<Endpoint>> TcpFabric::Handshake(Fd sock, const SocketAddress& peer,
                                                               TcpCq* cq, absl::Time deadline,
                                                               bool active) {
  const std::string name = peer.ToString();
  const std::string who = absl::StrCat("the tcp peer ", name);
  const std::string fix =
      active ? CheckListener(name) : "only zsock tcp endpoints may connect here";
  BootstrapIo io(sock.get(), deadline, {who, fix});
  // Both sides speak first: TCP buffers the hellos, so neither waits.
  const std::string hello(reinterpret_cast<const char*>(&kVersion), sizeof(kVersion));
  if (absl::Status st = io.SendFrame(kHelloMagic, hello); !st.ok()) return st;
  auto theirs = io.RecvFrame(kHelloMagic, 64);  // where a peer that is not zsock fails
  if (!theirs.ok()) return theirs.status();
  uint32_t version = 0;
  if (theirs->size() == sizeof(version)) std::memcpy(&version, theirs->data(), sizeof(version));
  if (version != kVersion) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO,
                     absl::StrCat("the tcp peer ", name, " speaks version ", version,
                                  " of the tcp provider's protocol, this zsock ", kVersion),
                     "run the same zsock version on both ends");
  }
  int nodelay = settings_.nodelay ? 1 : 0;
  ::setsockopt(sock.get(), IPPROTO_TCP, TCP_NODELAY, &nodelay, sizeof(nodelay));
  EndpointInfo info;
  info.local_address = BoundAddress(sock.get());
  info.peer_address = name;
  info.peer_on_host = IsLocalAddress(peer);
  info.rdma_read = info.rdma_write = info.atomics = Support::kEmulated;
  info.notes = {caps_.notes.front()};  // why they are emulated
  return NewEndpoint(this, cq, std::move(sock), std::move(info));
}

}  // namespace zsock::tcp
