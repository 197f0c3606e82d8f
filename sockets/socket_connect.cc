// zsock::Socket's connection set-up: bind, listen (with its acceptor
// thread), accept and connect, and the kernel sockets that hold a zsock
// socket's port.
#include "sockets/socket.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/log.h"
#include "core/status.h"

namespace zsock {
namespace {

// The source address the kernel would use to reach `to` (connect on a UDP
// socket sends nothing), with port 0.
SocketAddress SourceFor(const SocketAddress& to) {
  SocketAddress out;
  Fd udp(::socket(to.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (udp && ::connect(udp.get(), to.get(), to.len) == 0) {
    out.len = sizeof(out.storage);
    if (::getsockname(udp.get(), reinterpret_cast<sockaddr*>(&out.storage), &out.len) == 0) {
      out.set_port(0);
      return out;
    }
  }
  auto loop = ParseSocketAddress(to.family() == AF_INET6 ? "[::1]:0" : "127.0.0.1:0");
  return loop.ok() ? *loop : out;
}

// Binds a kernel TCP socket to `addr` to hold its port (SO_REUSEADDR, never
// listening: a provider's own listener may bind the port later). Updates
// `addr` with the port the kernel picked for port 0.
absl::StatusOr<Fd> ReservePort(SocketAddress* addr) {
  Fd fd(::socket(addr->family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoError(errno, "socket() to reserve a port failed");
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), addr->get(), addr->len) != 0) {
    int e = errno;
    return ErrnoError(e, absl::StrCat("bind to ", addr->ToString(), " failed"),
                      e == EADDRINUSE      ? "the port is in use; pick another or use port 0"
                      : e == EADDRNOTAVAIL ? "use an address of this host"
                                           : "");
  }
  auto bound = ParseSocketAddress(BoundAddress(fd.get()));
  if (bound.ok()) addr->set_port(bound->port());
  return fd;
}

}  // namespace

absl::Status Socket::Bind(const sockaddr* addr, socklen_t len) {
  auto a = SocketAddress::FromSockaddr(addr, len);
  if (!a.ok()) return a.status();
  if (a->family() != family_) {
    return ErrnoError(EAFNOSUPPORT, "bind: address family differs from the socket's");
  }
  MutexLock lock(&mu_);
  if (state_ != State::kNew) return ErrnoError(EINVAL, "bind: the socket is already bound");
  if (reuseaddr_ == 0 || a->port() == 0) {
    auto fd = ReservePort(&*a);
    if (!fd.ok()) return fd.status();
    port_reservation_ = std::move(*fd);
  }
  local_ = *a;
  SetStateLocked(State::kBound);
  return absl::OkStatus();
}

absl::Status Socket::Listen(int backlog) {
  auto engine = SocketEngine();
  if (!engine.ok()) return engine.status();
  MutexLock lock(&mu_);
  // As listen(2): at least one, at most SOMAXCONN finished connections wait.
  const size_t queue = static_cast<size_t>(std::clamp(backlog, 1, SOMAXCONN));
  if (state_ == State::kListening) {
    backlog_ = queue;  // adjusts the backlog, as listen(2) does
    if (listener_ && backlog > 0) ::listen(listener_->fd(), backlog);
    accepted_cv_.SignalAll();
    return absl::OkStatus();
  }
  if (state_ != State::kNew && state_ != State::kBound) {
    return ErrnoError(EINVAL, "listen: the socket is connected or connecting");
  }
  if (state_ == State::kNew) {
    auto any = ParseSocketAddress(family_ == AF_INET6 ? "[::]:0" : "0.0.0.0:0");
    if (!any.ok()) return any.status();
    auto fd = ReservePort(&*any);
    if (!fd.ok()) return fd.status();
    port_reservation_ = std::move(*fd);
    local_ = *any;
  }
  // The provider's listener takes the port over from the reservation.
  port_reservation_.reset();
  sdp::ConnectionOptions options = OptionsLocked();
  auto l = (*engine)->Listen(local_.ToString(), options);
  if (!l.ok()) return l.status();
  int efd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (efd < 0) return ErrnoError(errno, "eventfd for a listening socket failed");
  acceptor_stop_ = Fd(efd);
  // The program's fd is readable while a finished connection waits; a
  // listening socket is never writable (as in the kernel).
  {
    MutexLock rl(&rfd_mu_);
    rfd_->SetReadable(false);
    rfd_->SetWritable(false);
  }
  // The provider listener's kernel socket (if any) holds the
  // not-yet-accepted connections.
  if (backlog > 0) ::listen((*l)->fd(), backlog);
  backlog_ = queue;
  listener_ = std::move(*l);
  SetStateLocked(State::kListening);
  acceptor_ = std::thread([this, lp = listener_.get()] { AcceptLoop(lp); });
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Socket>> Socket::Accept(int flags, SocketAddress* peer) {
  std::unique_ptr<sdp::Connection> conn;
  {
    MutexLock lock(&mu_);
    // SO_RCVTIMEO bounds a blocking accept, as for TCP.
    const int64_t timeo_us = rcvtimeo_us_.load(std::memory_order_relaxed);
    const absl::Time deadline =
        timeo_us == 0 ? absl::InfiniteFuture() : absl::Now() + absl::Microseconds(timeo_us);
    for (;;) {
      if (state_ != State::kListening) {
        return state_ == State::kClosed
                   ? ErrnoError(EBADF, "accept: the socket was closed")
                   : ErrnoError(EINVAL, "accept: the socket is not listening");
      }
      if (!accepted_.empty()) break;
      if (nonblocking()) return ErrnoError(EAGAIN, "accept: no connection is waiting");
      if (accepted_cv_.WaitWithDeadline(&mu_, deadline) && accepted_.empty()) {
        return ErrnoError(EAGAIN, "accept: timed out (SO_RCVTIMEO)");
      }
    }
    conn = std::move(accepted_.front());
    accepted_.pop_front();
    if (accepted_.empty()) {
      MutexLock rl(&rfd_mu_);
      if (rfd_) rfd_->SetReadable(false);
    }
    accepted_cv_.SignalAll();  // room in the queue for the acceptor
  }
  auto s = FromConnection(family_, std::move(conn), flags);
  if (!s.ok()) return s.status();
  SetAcceptedLocalAddress(**s);
  if (peer != nullptr) {
    MutexLock lock(&(*s)->mu_);
    *peer = (*s)->peer_;
  }
  return s;
}

void Socket::SetAcceptedLocalAddress(Socket& accepted) {
  MutexLock lock(&accepted.mu_);
  MutexLock l2(&mu_);
  SocketAddress local = local_;
  if (local.is_wildcard() && accepted.peer_.len != 0) {
    local = SourceFor(accepted.peer_);
    local.set_port(local_.port());
  }
  accepted.local_ = local;
}

void Socket::AcceptLoop(sdp::Listener* l) {
  for (;;) {
    {
      // Like a full kernel accept queue: leave further connections waiting
      // in the provider until the program accepts.
      MutexLock lock(&mu_);
      while (state_ == State::kListening && accepted_.size() >= backlog_) accepted_cv_.Wait(&mu_);
      if (state_ != State::kListening) return;
    }
    pollfd p[2] = {{l->fd(), POLLIN, 0}, {acceptor_stop_.get(), POLLIN, 0}};
    int rc = ::poll(p, 2, -1);
    if (rc < 0) {
      if (errno == EINTR) continue;
      ZS_LOG(kError, "accept: poll on the listener failed (%s); this socket accepts no more",
             std::strerror(errno));
      return;
    }
    if (p[1].revents != 0) return;
    if (p[0].revents == 0) continue;
    // Short waits for an arrival (the fd may be readable with nothing to
    // take, e.g. libfabric's EQ), so Close is noticed; an arrived
    // connection's set-up has connect_timeout_ms (sdp::Listener::Accept).
    auto conn = l->Accept(absl::Now() + absl::Milliseconds(200));
    if (!conn.ok()) {
      // Nothing there after all (another process took it), or a client that
      // went away or stalled during set-up: not the listener's failure; the
      // program never sees it (as the kernel drops a half-open connection).
      if (StatusErrno(conn.status()) != EAGAIN && !absl::IsDeadlineExceeded(conn.status())) {
        ZS_LOG(kInfo, "accept: a connection failed during set-up: %s", conn.status().ToString());
      }
      if (p[0].revents & (POLLERR | POLLHUP | POLLNVAL)) {
        // A broken listener would wake this loop forever.
        ZS_LOG(kError, "accept: the provider's listener failed; this socket accepts no more");
        return;
      }
      continue;
    }
    MutexLock lock(&mu_);
    if (state_ != State::kListening) return;  // closed meanwhile: the connection is dropped
    accepted_.push_back(std::move(*conn));
    {
      MutexLock rl(&rfd_mu_);
      if (rfd_) rfd_->SetReadable(true);
    }
    accepted_cv_.SignalAll();
  }
}

void Socket::StopAcceptor() {
  if (!acceptor_.joinable()) return;
  uint64_t one = 1;
  (void)!::write(acceptor_stop_.get(), &one, sizeof(one));
  accepted_cv_.SignalAll();
  acceptor_.join();  // never this thread: the acceptor does not close its socket
}

absl::Status Socket::ConnectError(const absl::Status& why, const SocketAddress& to) {
  int e = StatusErrno(why);
  if (e == ENOENT || e == 0) e = ECONNREFUSED;  // unet: nobody listens on that port
  if (absl::IsDeadlineExceeded(why)) e = ETIMEDOUT;
  return MakeError(absl::StatusCode::kUnavailable, e,
                   absl::StrCat("connect to ", to.ToString(), " failed: ", why.message()));
}

absl::Status Socket::Connect(const sockaddr* addr, socklen_t len) {
  auto engine = SocketEngine();
  if (!engine.ok()) return engine.status();
  auto to = SocketAddress::FromSockaddr(addr, len);
  if (!to.ok()) return to.status();
  if (to->family() != family_) return ErrnoError(EAFNOSUPPORT, "connect: address family differs");
  if (to->port() == 0) return ErrnoError(ECONNREFUSED, "connect: port 0");
  sdp::ConnectionOptions options;
  {
    MutexLock lock(&mu_);
    switch (state_) {
      case State::kConnected:
        return ErrnoError(EISCONN, "connect: the socket is already connected");
      case State::kConnecting:
        return ErrnoError(EALREADY, "connect: a connection attempt is in progress");
      case State::kListening:
      case State::kClosed:
        return ErrnoError(EINVAL, "connect on a listening or closed socket");
      case State::kNew: {
        SocketAddress local = SourceFor(*to);
        auto fd = ReservePort(&local);
        if (fd.ok()) {
          port_reservation_ = std::move(*fd);
          local_ = local;
        }
        break;
      }
      case State::kBound:
        break;
    }
    peer_ = *to;
    SetStateLocked(State::kConnecting);
    options = OptionsLocked();
    options.local_sockaddr = local_.ToString();
  }
  const std::string target = to->ToString();
  if (nonblocking()) {
    {
      MutexLock rl(&rfd_mu_);
      rfd_->SetWritable(false);  // POLLOUT means "connected (or failed)"
    }
    std::thread([self = shared_from_this(), engine = *engine, target, options, to = *to] {
      self->FinishConnect(engine, target, options, to);
    }).detach();
    return ErrnoError(EINPROGRESS, "connect: in progress");
  }
  auto conn = (*engine)->Connect(target, options);
  MutexLock lock(&mu_);
  if (state_ != State::kConnecting) return ErrnoError(EBADF, "connect: the socket was closed");
  if (!conn.ok()) {
    SetStateLocked(State::kBound);
    return ConnectError(conn.status(), *to);
  }
  Attach(std::shared_ptr<sdp::Connection>(std::move(*conn)));
  return absl::OkStatus();
}

void Socket::FinishConnect(sdp::Engine* engine, const std::string& target,
                           const sdp::ConnectionOptions& options, const SocketAddress& to) {
  auto conn = engine->Connect(target, options);
  MutexLock lock(&mu_);
  if (state_ != State::kConnecting) return;  // closed meanwhile
  if (conn.ok()) {
    Attach(std::shared_ptr<sdp::Connection>(std::move(*conn)));
    return;
  }
  so_error_ = ConnectError(conn.status(), to);
  SetStateLocked(State::kBound);
  MutexLock rl(&rfd_mu_);
  if (rfd_) rfd_->SetHangup();  // POLLOUT|POLLERR-like; SO_ERROR says why
}

}  // namespace zsock
