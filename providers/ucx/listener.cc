// Listening for and connecting ucx connections: the TCP socket each
// connection's handshake runs on (UcxFabric::Handshake).
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/accept.h"
#include "core/status.h"
#include "providers/ucx/hello.h"
#include "providers/ucx/fabric.h"
#include "providers/ucx/socket_address.h"

namespace zsock::ucx {
namespace {

class UcxListener final : public Listener {
 public:
  UcxListener(UcxFabric* fabric, Fd sock, std::string address)
      : fabric_(fabric), sock_(std::move(sock)), address_(std::move(address)) {}

  std::string address() const override { return address_; }
  int fd() const override { return sock_.get(); }

  absl::StatusOr<std::unique_ptr<Endpoint>> Accept(CompletionQueue* cq,
                                                   absl::Duration timeout) override {
    absl::Time deadline = absl::Now() + timeout;
    auto fd = AcceptUntil(sock_.get(), deadline, absl::StrCat("ucx address '", address_, "'"),
                          SOCK_NONBLOCK);
    if (!fd.ok()) return fd.status();
    int one = 1;
    ::setsockopt(fd->get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    // Arrived: its set-up gets the connect timeout (Listener::Accept).
    absl::Duration hs = fabric_->settings().connect_timeout;
    return fabric_->Handshake(std::move(*fd), cq, absl::Now() + hs);
  }

 private:
  UcxFabric* fabric_;
  Fd sock_;
  std::string address_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Listener>> UcxFabric::Listen(absl::string_view address) {
  std::string text(address.empty() ? "127.0.0.1:0" : address);
  socklen_t len = 0;
  auto sa = ParseAddress(text, &len);
  if (!sa.ok()) return sa.status();
  int fd = ::socket(sa->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return ErrnoError(errno, "socket() for a ucx listener failed");
  Fd sock(fd);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&*sa), len) != 0) {
    return ErrnoError(errno, absl::StrCat("binding ucx address '", text, "' failed"),
                      errno == EADDRINUSE ? "another process listens there; pick another port"
                                          : "use an address of this host");
  }
  if (::listen(fd, 1024) != 0) return ErrnoError(errno, "listen on a ucx socket failed");
  return std::unique_ptr<Listener>(
      new UcxListener(this, std::move(sock), SocketAddress(fd, false)));
}

absl::StatusOr<std::unique_ptr<Endpoint>> UcxFabric::Connect(absl::string_view address,
                                                            CompletionQueue* cq,
                                                            absl::Duration timeout) {
  socklen_t len = 0;
  auto sa = ParseAddress(address, &len);
  if (!sa.ok()) return sa.status();
  absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    int fd = ::socket(sa->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return ErrnoError(errno, "socket() for a ucx connection failed");
    Fd sock(fd);
    int err = 0;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&*sa), len) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        if (auto st = HandshakeIo(fd, deadline).Wait(POLLOUT, "the connection"); !st.ok()) {
          return st;
        }
        socklen_t elen = sizeof(err);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
      }
    }
    if (err == 0) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return Handshake(std::move(sock), cq, deadline);
    }
    if (err == EINTR && absl::Now() < deadline) continue;
    // Refused at once, as TCP refuses (docs/provider-interface.md, Addresses).
    return ErrnoError(err, absl::StrCat("connecting to ucx address '", address, "' failed"),
                      err == ECONNREFUSED ? "start a listener on that address first" : "");
  }
}

}  // namespace zsock::ucx
