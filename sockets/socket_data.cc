// zsock::Socket's data calls: Send and Recv, on the lock-free path of a
// connected socket (fast_conn_) or the locked one, and what their results
// become (errno, readiness, SIGPIPE). The per-message path: its helpers
// stay in this file so that they inline.
#include "sockets/socket.h"

#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <cerrno>

#include "absl/time/clock.h"
#include "core/status.h"

namespace zsock {
namespace {

bool WouldBlock(const absl::Status& s) {
  int e = StatusErrno(s);
  return e == EAGAIN || e == EWOULDBLOCK;
}

// SO_RCVTIMEO / SO_SNDTIMEO (in microseconds, 0: none) as a deadline that
// reads the clock only if the call waits (sdp::Deadline says why).
sdp::Deadline DeadlineFrom(const std::atomic<int64_t>& us) {
  const int64_t v = us.load(std::memory_order_relaxed);
  if (v == 0) return absl::InfiniteFuture();
  return sdp::Deadline::After(absl::Microseconds(v));
}

}  // namespace

absl::StatusOr<size_t> Socket::Send(std::span<const iovec> iov, int flags) {
  const int f = nonblocking() || (flags & MSG_DONTWAIT) ? MSG_DONTWAIT : 0;
  if (sdp::Connection* fc = fast_conn_.load(std::memory_order_acquire)) {
    return SendResult(fc->Send(iov, f, DeadlineFrom(sndtimeo_us_)), flags);
  }
  std::shared_ptr<sdp::Connection> c;
  sdp::Deadline deadline = absl::InfiniteFuture();
  bool shut_wr = false;
  {
    MutexLock lock(&mu_);
    if (state_ == State::kConnecting) {
      return ErrnoError(nonblocking() || (flags & MSG_DONTWAIT) ? EAGAIN : ENOTCONN,
                        "send: the connection is not set up yet");
    }
    if (state_ != State::kConnected) {
      return ErrnoError(state_ == State::kClosed ? EBADF : ENOTCONN,
                        "send on an unconnected socket");
    }
    c = conn_;
    deadline = DeadlineFrom(sndtimeo_us_);
    shut_wr = shut_wr_;
  }
  if (shut_wr) {
    // Outside mu_, and touching nothing of this socket afterwards: a
    // SIGPIPE handler may call zs_* itself (and, through the lookup cache,
    // drop the last reference to a socket another thread closed).
    absl::Status err = ErrnoError(EPIPE, "send after shutdown(SHUT_WR)");
    if (!(flags & MSG_NOSIGNAL)) ::pthread_kill(::pthread_self(), SIGPIPE);
    return err;
  }
  return SendResult(c->Send(iov, f, deadline), flags);
}

absl::StatusOr<size_t> Socket::SendResult(absl::StatusOr<size_t> n, int flags) {
  if (!n.ok() && absl::IsDeadlineExceeded(n.status())) {
    return ErrnoError(EAGAIN, "send: SO_SNDTIMEO expired");  // what send(2) reports
  }
  if (!n.ok()) {
    if (WouldBlock(n.status())) MarkUnwritable();
    if (StatusErrno(n.status()) == EPIPE && !(flags & MSG_NOSIGNAL)) {
      // What send(2) does on a TCP socket; last, as above.
      ::pthread_kill(::pthread_self(), SIGPIPE);
    }
  }
  return n;
}

absl::StatusOr<size_t> Socket::Recv(std::span<const iovec> iov, int flags) {
  int f = flags & (MSG_PEEK | MSG_WAITALL);
  if (nonblocking() || (flags & MSG_DONTWAIT)) f |= MSG_DONTWAIT;
  if (sdp::Connection* fc = fast_conn_.load(std::memory_order_acquire)) {
    return RecvResult(fc->Recv(iov, f, DeadlineFrom(rcvtimeo_us_)));
  }
  std::shared_ptr<sdp::Connection> c;
  sdp::Deadline deadline = absl::InfiniteFuture();
  {
    MutexLock lock(&mu_);
    if (state_ == State::kConnecting && (nonblocking() || (flags & MSG_DONTWAIT))) {
      return ErrnoError(EAGAIN, "recv: the connection is not set up yet");
    }
    if (state_ != State::kConnected) {
      return ErrnoError(state_ == State::kClosed ? EBADF : ENOTCONN,
                        "recv on an unconnected socket");
    }
    if (shut_rd_) return size_t{0};
    c = conn_;
    deadline = DeadlineFrom(rcvtimeo_us_);
  }
  return RecvResult(c->Recv(iov, f, deadline));
}

absl::StatusOr<size_t> Socket::RecvResult(absl::StatusOr<size_t> n) {
  if (!n.ok() && absl::IsDeadlineExceeded(n.status())) {
    return ErrnoError(EAGAIN, "recv: SO_RCVTIMEO expired");
  }
  if (!n.ok() && WouldBlock(n.status())) MarkUnreadable();
  return n;
}

}  // namespace zsock
