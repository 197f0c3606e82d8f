// zsock::Socket's readiness: the mirrored fd (sockets/readiness.h) kept in
// step with the connection, and Events for zs_poll.
//
// The mirror only ever turns readiness on from the connection's callbacks;
// it is turned off by the call that found nothing to do (MarkUnreadable /
// MarkUnwritable), so a socket that stays busy costs no system calls, and,
// with the watch narrowed to the bits the mirror shows off, no callbacks.
#include "sockets/socket.h"

#include <poll.h>

namespace zsock {

void Socket::OnReadiness(uint32_t r) {
  MutexLock lock(&rfd_mu_);
  if (!rfd_) return;
  constexpr uint32_t kDataBits = sdp::kReadable | sdp::kWritable;
  if (live_conn_ != nullptr && (r & kDataBits) != 0) {
    // The engine computed `r` before this callback ran. Meanwhile a call
    // may have taken the data (or the room) and turned the bit off
    // (MarkNotReady): set from `r` alone, poll would report a readiness
    // that is gone, and a recv right after it say EAGAIN. Only what still
    // holds turns the mirror on; the engine calls again on the next change
    // (the watch takes the bit back in below).
    r &= ~kDataBits | live_conn_->readiness();
  }
  if (r & (sdp::kError | sdp::kHup)) {
    rfd_->SetHangup();
  } else {
    if (r & sdp::kRdHup) rfd_->SetEndOfStream();
    if (r & sdp::kReadable) rfd_->SetReadable(true);
    if (r & sdp::kWritable) rfd_->SetWritable(true);
  }
  WatchLocked();
}

void Socket::WatchLocked() {
  if (!watch_ || !rfd_) return;
  uint32_t bits = sdp::kError | sdp::kHup | sdp::kRdHup;
  if (!rfd_->readable()) bits |= sdp::kReadable;
  if (!rfd_->writable()) bits |= sdp::kWritable;
  // seq_cst: see Engine::NoteReadinessLocked.
  watch_->store(bits, std::memory_order_seq_cst);
}

void Socket::MarkUnreadable() { MarkNotReady(sdp::kReadable); }

void Socket::MarkUnwritable() { MarkNotReady(sdp::kWritable); }

void Socket::MarkNotReady(uint32_t bit) {
  // The connection from live_conn_ under rfd_mu_, not conn_ under mu_: a
  // send or receive that met EAGAIN takes no lock of the socket but this
  // one (socket_data.cc).
  MutexLock lock(&rfd_mu_);
  if (!rfd_) return;
  sdp::Connection* c = live_conn_;
  const auto set = [&](bool on) {
    if (bit == sdp::kReadable) {
      rfd_->SetReadable(on);
    } else {
      rfd_->SetWritable(on);
    }
  };
  set(false);
  if (!c) return;
  // The connection may have become ready between the failed call and here,
  // unreported (the watch left the bit out while the mirror showed it):
  // watch again, then look.
  WatchLocked();
  if (c->readiness() & (bit | sdp::kError | sdp::kHup)) set(true);
  WatchLocked();
}

short Socket::Events() {
  std::shared_ptr<sdp::Connection> c;
  {
    MutexLock lock(&mu_);
    switch (state_) {
      case State::kListening:
        return accepted_.empty() ? 0 : POLLIN;
      case State::kConnecting:
        return 0;
      case State::kConnected:
        c = conn_;
        break;
      case State::kClosed:
        return POLLNVAL;
      default:
        // Unconnected (or after a failed connect): like TCP, POLLOUT|POLLHUP.
        return static_cast<short>(POLLOUT | POLLHUP | (so_error_.ok() ? 0 : POLLERR));
    }
  }
  uint32_t r = c->readiness();
  short ev = 0;
  if (r & sdp::kReadable) ev |= POLLIN;
  if (r & sdp::kWritable) ev |= POLLOUT;
  if (r & sdp::kError) ev |= POLLERR;
  if (r & sdp::kHup) ev |= POLLHUP;
  if (r & sdp::kRdHup) ev |= POLLRDHUP | POLLIN;
  {
    MutexLock lock(&mu_);
    if (shut_rd_) ev |= POLLIN | POLLRDHUP;
  }
  // Bring the mirror down to the truth, so a following poll(2) sleeps.
  if (!(ev & POLLIN)) MarkUnreadable();
  if (!(ev & POLLOUT)) MarkUnwritable();
  return ev;
}

}  // namespace zsock
