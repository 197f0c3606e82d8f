// zsock::Socket's data calls: Send and Recv, and what their results become
// (errno, readiness, SIGPIPE). The per-message path: its helpers stay in
// this file so that they inline.
//
// Async-signal safety: send(2) and recv(2) may be called from a signal
// handler, so a refused Send or Recv (closed, unconnected, connecting, shut
// down, a timeout) allocates nothing and takes no lock: the socket's state
// comes from one atomic word (CallTarget) and the error is a prepared one
// (PreparedError, built when the socket was made). docs/sockets.md says
// what else a handler's call meets.
#include "sockets/socket.h"

#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <cerrno>

#include "absl/time/clock.h"
#include "core/status.h"

namespace zsock {
namespace {

constinit const PreparedError kSendConnecting(EAGAIN, "send: the connection is not set up yet");
constinit const PreparedError kSendConnectingBlocking(ENOTCONN,
                                                      "send: the connection is not set up yet");
constinit const PreparedError kSendClosed(EBADF, "send on an unconnected socket");
constinit const PreparedError kSendUnconnected(ENOTCONN, "send on an unconnected socket");
constinit const PreparedError kSendShutDown(EPIPE, "send after shutdown(SHUT_WR)");
constinit const PreparedError kSendTimedOut(EAGAIN, "send: SO_SNDTIMEO expired");
constinit const PreparedError kRecvConnecting(EAGAIN, "recv: the connection is not set up yet");
constinit const PreparedError kRecvClosed(EBADF, "recv on an unconnected socket");
constinit const PreparedError kRecvUnconnected(ENOTCONN, "recv on an unconnected socket");
constinit const PreparedError kRecvTimedOut(EAGAIN, "recv: SO_RCVTIMEO expired");

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

void Socket::PrepareCallErrors() {
  for (const PreparedError* e :
       {&kSendConnecting, &kSendConnectingBlocking, &kSendClosed, &kSendUnconnected,
        &kSendShutDown, &kSendTimedOut, &kRecvConnecting, &kRecvClosed, &kRecvUnconnected,
        &kRecvTimedOut}) {
    e->Prepare();
  }
}

absl::StatusOr<size_t> Socket::Send(std::span<const iovec> iov, int flags) {
  const bool dontwait = nonblocking() || (flags & MSG_DONTWAIT);
  const CallTarget target = send_target_.load(std::memory_order_acquire);
  sdp::Connection* c = target.connection();
  if (c == nullptr) [[unlikely]] {
    return RefuseSend(target.refusal(), dontwait, flags);
  }
  return SendResult(c->Send(iov, dontwait ? MSG_DONTWAIT : 0, DeadlineFrom(sndtimeo_us_)), flags);
}

absl::StatusOr<size_t> Socket::RefuseSend(CallTarget::Refusal why, bool dontwait, int flags) {
  switch (why) {
    case CallTarget::kConnecting:
      return dontwait ? kSendConnecting.Get() : kSendConnectingBlocking.Get();
    case CallTarget::kClosed:
      return kSendClosed.Get();
    case CallTarget::kShutDown: {
      // Touching nothing of the socket afterwards (this is static): a
      // SIGPIPE handler may call zs_* itself (and, through the lookup
      // cache, drop the last reference to a socket another thread closed).
      absl::Status err = kSendShutDown.Get();
      if (!(flags & MSG_NOSIGNAL)) ::pthread_kill(::pthread_self(), SIGPIPE);
      return err;
    }
    case CallTarget::kUnconnected:
      break;
  }
  return kSendUnconnected.Get();
}

absl::StatusOr<size_t> Socket::SendResult(absl::StatusOr<size_t> n, int flags) {
  if (!n.ok() && absl::IsDeadlineExceeded(n.status())) {
    return kSendTimedOut.Get();  // what send(2) reports
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
  const bool dontwait = nonblocking() || (flags & MSG_DONTWAIT);
  const CallTarget target = recv_target_.load(std::memory_order_acquire);
  sdp::Connection* c = target.connection();
  if (c == nullptr) [[unlikely]] {
    return RefuseRecv(target.refusal(), dontwait);
  }
  const int f = (flags & (MSG_PEEK | MSG_WAITALL)) | (dontwait ? MSG_DONTWAIT : 0);
  return RecvResult(c->Recv(iov, f, DeadlineFrom(rcvtimeo_us_)));
}

absl::StatusOr<size_t> Socket::RefuseRecv(CallTarget::Refusal why, bool dontwait) {
  switch (why) {
    case CallTarget::kConnecting:
      return dontwait ? kRecvConnecting.Get() : kRecvUnconnected.Get();
    case CallTarget::kClosed:
      return kRecvClosed.Get();
    case CallTarget::kShutDown:
      return size_t{0};  // after shutdown(SHUT_RD), as TCP
    case CallTarget::kUnconnected:
      break;
  }
  return kRecvUnconnected.Get();
}

absl::StatusOr<size_t> Socket::RecvResult(absl::StatusOr<size_t> n) {
  if (!n.ok() && absl::IsDeadlineExceeded(n.status())) {
    return kRecvTimedOut.Get();
  }
  if (!n.ok() && WouldBlock(n.status())) MarkUnreadable();
  return n;
}

}  // namespace zsock
