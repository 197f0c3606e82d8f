// RDM connection set-up: the TCP listener, connecting to one, and the
// hello exchange that makes an RdmEndpoint of the connection.
#include "providers/ofi/connect.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "core/accept.h"
#include "core/bootstrap_io.h"
#include "core/cq_cast.h"
#include "core/fd.h"
#include "core/status.h"
#include "providers/ofi/cq.h"
#include "providers/ofi/errors.h"
#include "providers/ofi/fabric.h"
#include "providers/ofi/handshake.h"
#include "providers/ofi/host_port.h"
#include "providers/ofi/rdm_endpoint.h"

namespace zsock::ofi {
namespace {

constexpr absl::string_view kShmRegionPrefix = "zsock-";

// 64 random bits from the kernel (names that must not repeat on a host).
uint64_t RandomU64() {
  uint64_t v = 0;
  if (::getrandom(&v, sizeof(v), 0) != sizeof(v)) {
    v = static_cast<uint64_t>(absl::GetCurrentTimeNanos()) ^ (static_cast<uint64_t>(::getpid()) << 40);
  }
  return v;
}

// The shm region name (its /dev/shm entry) in the peer's hello, if it is
// one of zsock's (OpenRdmPartsLocked names them); empty otherwise.
std::string PeerShmRegion(const OfiHello& theirs) {
  absl::string_view name(reinterpret_cast<const char*>(theirs.name), theirs.name_len);
  name = name.substr(0, name.find('\0'));
  absl::ConsumePrefix(&name, "fi_shm://");
  return absl::StartsWith(name, kShmRegionPrefix) ? std::string(name) : std::string();
}

// Opens and enables the endpoint with its address vector (room for one
// peer) and fi CQ; its address goes into `mine`.
absl::Status OpenRdmPartsLocked(OfiFabric* fabric, EndpointParts* p, OfiHello* mine) {
  int rc = fi_endpoint(fabric->domain(), fabric->info(), &p->ep, nullptr);
  if (rc != 0) return FiError(rc, "fi_endpoint");
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  av_attr.count = 1;
  if ((rc = fi_av_open(fabric->domain(), &av_attr, &p->av, nullptr)) != 0) return FiError(rc, "fi_av_open");
  if ((rc = fi_ep_bind(p->ep, &p->av->fid, 0)) != 0) return FiError(rc, "fi_ep_bind(av)");
  if (auto st = OpenEndpointCq(fabric->domain(), fabric->fi_wait_fd(), &p->fcq, &p->fcq_fd); !st.ok()) {
    return st;
  }
  if ((rc = fi_ep_bind(p->ep, &p->fcq->fid, FI_TRANSMIT | FI_RECV)) != 0) {
    return FiError(rc, "fi_ep_bind(cq)");
  }
  if (std::string_view(fabric->info()->fabric_attr->prov_name) == "shm") {
    // shm names its region after the pid ("fi_shm://<pid>..."), and pids
    // repeat across pid namespaces sharing one /dev/shm (containers,
    // Bazel's sandbox): two endpoints then open one region and connects
    // are reset. A random name is unique on the host.
    std::string name =
        absl::StrCat("fi_shm://", kShmRegionPrefix, absl::Hex(RandomU64(), absl::kZeroPad16));
    if ((rc = fi_setname(&p->ep->fid, name.data(), name.size() + 1)) != 0) {
      return FiError(rc, "fi_setname");
    }
  }
  if ((rc = fi_enable(p->ep)) != 0) return FiError(rc, "fi_enable");
  size_t len = sizeof(mine->name);
  if ((rc = fi_getname(&p->ep->fid, mine->name, &len)) != 0) return FiError(rc, "fi_getname");
  mine->name_len = static_cast<uint16_t>(len);
  return absl::OkStatus();
}

// Sends `mine` and receives the peer's hello into `theirs`, refusing one
// that is malformed or, on shm, from another user.
absl::Status ExchangeHello(OfiFabric* fabric, int oob, OfiHello& mine, OfiHello* theirs,
                           absl::Time deadline) {
  BootstrapIo io(oob, deadline,
                 {.peer = "the ofi peer",
                  .fix = "check that the peer runs zsock with the same ofi provider and "
                         "version; its log says if it refused the connection"});
  constexpr absl::string_view kWhat = "the connection handshake";
  if (auto st = io.Write(&mine, sizeof(mine), kWhat); !st.ok()) return st;
  if (auto st = io.Read(theirs, sizeof(*theirs), kWhat); !st.ok()) return st;
  if (theirs->magic != kHelloMagic || theirs->version != kHelloVersion ||
      theirs->name_len == 0 || theirs->name_len > sizeof(theirs->name)) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO,
                     "malformed ofi connection hello",
                     "the peer is not a compatible zsock ofi endpoint");
  }
  // shm regions are created for their owner only: a peer of another user
  // cannot map ours (fi_av_insert fails on its side) and must not be able
  // to. Both sides see the mismatch and say so, rather than one side failing
  // with EINVAL and the other with a connection reset.
  if (std::string(fabric->info()->fabric_attr->prov_name) == "shm" && theirs->uid != mine.uid) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPERM,
                     absl::StrCat("ofi:shm connects peers of the same user only: the peer runs as uid ",
                                  theirs->uid, ", this process as uid ", mine.uid,
                                  " (shm regions are private to their user)"),
                     "run both peers as one user, or use ofi:tcp;ofi_rxm between users");
  }
  return absl::OkStatus();
}

absl::Status InsertPeer(OfiFabric* fabric, fid_av* av, const OfiHello& theirs, fi_addr_t* peer) {
  DomLock lock(&fabric->dom_mu());
  int rc = fi_av_insert(av, theirs.name, 1, peer, 0, nullptr);
  if (rc != 1) {
    return FiError(rc < 0 ? rc : -FI_EINVAL, "fi_av_insert of the peer's address",
                   "the peer uses another ofi provider or domain; use the same config string");
  }
  return absl::OkStatus();
}

// Makes an RdmEndpoint of TCP connection `oob` (from `local` to `peer`).
absl::StatusOr<std::unique_ptr<Endpoint>> Establish(OfiFabric* fabric, Fd oob, std::string local,
                                                    std::string peer, CompletionQueue* cq,
                                                    absl::Time deadline) {
  auto ocq = CqOf<OfiCq>(cq, "ofi", fabric);
  if (!ocq.ok()) return ocq.status();
  int one = 1;
  ::setsockopt(oob.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // Non-blocking, so that the deadline bounds every wait of the hello's
  // I/O (later uses of the socket pass MSG_DONTWAIT anyway).
  ::fcntl(oob.get(), F_SETFL, ::fcntl(oob.get(), F_GETFL) | O_NONBLOCK);
  EndpointParts parts;
  auto fail = [&](absl::Status st) {
    parts.Close();
    return st;
  };
  OfiHello mine{};
  if (auto st = OpenParts(fabric, &parts,
                          [&](EndpointParts* p) { return OpenRdmPartsLocked(fabric, p, &mine); });
      !st.ok()) {
    return st;
  }
  mine.magic = kHelloMagic;
  mine.version = kHelloVersion;
  // Our flow window (0: none). A peer before flow control sends 0 here.
  mine.reserved = static_cast<uint32_t>(fabric->flow_window());
  mine.uid = static_cast<uint32_t>(::geteuid());
  OfiHello theirs{};
  if (auto st = ExchangeHello(fabric, oob.get(), mine, &theirs, deadline); !st.ok()) return fail(st);
  fi_addr_t peer_addr = FI_ADDR_UNSPEC;
  if (auto st = InsertPeer(fabric, parts.av, theirs, &peer_addr); !st.ok()) return fail(st);
  EndpointInfo info = fabric->NewEndpointInfo("");
  info.local_address = local;
  info.peer_address = peer;
  auto endpoint = std::make_unique<RdmEndpoint>(fabric, *ocq, parts.ep, parts.av, parts.fcq,
                                                parts.fcq_fd, peer_addr, std::move(oob),
                                                std::move(info));
  // Flow control only when both sides window: each then reports its
  // consumption often enough for the other's window.
  if (mine.reserved != 0 && theirs.reserved != 0) endpoint->SetFlow(mine.reserved, theirs.reserved);
  if (std::string_view(fabric->info()->fabric_attr->prov_name) == "shm") {
    endpoint->SetPeerShmRegion(PeerShmRegion(theirs));
  }
  if (auto st = endpoint->Start(); !st.ok()) return st;
  return std::unique_ptr<Endpoint>(std::move(endpoint));
}

class RdmListener final : public Listener {
 public:
  RdmListener(OfiFabric* fabric, Fd sock, std::string address)
      : fabric_(fabric), sock_(std::move(sock)), address_(std::move(address)) {}
  std::string address() const override { return address_; }
  int fd() const override { return sock_.get(); }
  absl::StatusOr<std::unique_ptr<Endpoint>> Accept(CompletionQueue* cq, absl::Duration timeout) override {
    absl::Time deadline = absl::Now() + timeout;
    sockaddr_storage peer{};
    auto fd = AcceptUntil(sock_.get(), deadline, absl::StrCat("ofi address ", address_), 0, &peer);
    if (!fd.ok()) return fd.status();
    // Arrived: its set-up gets the connect timeout (Listener::Accept).
    absl::Duration hs = fabric_->settings().connect_timeout;
    return Establish(fabric_, std::move(*fd), address_, FormatHostPort(peer), cq, absl::Now() + hs);
  }

 private:
  OfiFabric* fabric_;
  Fd sock_;
  std::string address_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Listener>> ListenRdm(OfiFabric* fabric, absl::string_view address) {
  socklen_t len = 0;
  auto ss = ParseHostPort(address.empty() ? "127.0.0.1:0" : address, &len);
  if (!ss.ok()) return ss.status();
  Fd sock(::socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!sock) return ErrnoError(errno, "socket() for an ofi listener failed");
  int one = 1;
  ::setsockopt(sock.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(sock.get(), reinterpret_cast<sockaddr*>(&*ss), len) != 0) {
    return ErrnoError(errno, absl::StrCat("binding ofi address ", address, " failed"),
                      errno == EADDRINUSE ? "pick another port" : "use an address of this host");
  }
  if (::listen(sock.get(), 1024) != 0) return ErrnoError(errno, "listen() failed");
  sockaddr_storage bound{};
  socklen_t bl = sizeof(bound);
  ::getsockname(sock.get(), reinterpret_cast<sockaddr*>(&bound), &bl);
  return std::unique_ptr<Listener>(new RdmListener(fabric, std::move(sock), FormatHostPort(bound)));
}

absl::StatusOr<std::unique_ptr<Endpoint>> ConnectRdm(OfiFabric* fabric, absl::string_view address,
                                                     CompletionQueue* cq, absl::Duration timeout) {
  socklen_t len = 0;
  auto ss = ParseHostPort(address, &len);
  if (!ss.ok()) return ss.status();
  absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    Fd sock(::socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!sock) return ErrnoError(errno, "socket() for an ofi connection failed");
    if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&*ss), len) == 0) {
      sockaddr_storage local{};
      socklen_t ll = sizeof(local);
      ::getsockname(sock.get(), reinterpret_cast<sockaddr*>(&local), &ll);
      return Establish(fabric, std::move(sock), FormatHostPort(local), std::string(address), cq,
                       deadline);
    }
    int err = errno;
    if (err == EINTR && absl::Now() < deadline) continue;
    // Refused at once, as TCP refuses (docs/provider-interface.md, Addresses).
    return ErrnoError(err, absl::StrCat("connecting to ofi address ", address, " failed"),
                      err == ECONNREFUSED ? "start a listener there first" : "check the address and routes");
  }
}

}  // namespace zsock::ofi
