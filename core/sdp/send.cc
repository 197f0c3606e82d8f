// Connection::Send (connection.h): each piece of the caller's buffers goes
// the first of these ways that applies: into a SinkAvail the peer
// announced (zcopy_source.cc), as an asynchronous SrcAvail (AZ-SDP, az.cc),
// as a SrcAvail the Send waits for (zcopy_source.cc), pulled (pull.cc), or
// copied into Data messages (bcopy). Small sends, most of them, only
// append to the data queue and post: that path stays in this file.
#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "core/log.h"
#include "core/mutex.h"
#include "core/sdp/az_guard.h"
#include "core/sdp/calls.h"
#include "core/sdp/conn_state.h"
#include "core/sdp/engine.h"

namespace zsock::sdp {

absl::StatusOr<size_t> Connection::Send(const void* buf, size_t len, int flags,
                                        Deadline deadline) {
  iovec v{const_cast<void*>(buf), len};
  return Send(std::span<const iovec>(&v, 1), flags, deadline);
}

absl::StatusOr<size_t> Connection::Send(std::span<const iovec> iov, int flags,
                                        Deadline deadline) {
  if (StateUnlocked() == nullptr) return Closed();
  Engine* e = engine_;
  // A buffer whose receive is still landing (AZ-SDP az_early_recv) is
  // unreadable: wait for it before any lock is held (echo servers do this).
  for (const iovec& v : iov) az::Guard::Get().WaitReadable(v.iov_base, v.iov_len);
  absl::StatusOr<size_t> result;
  // Readiness changes found on the way (the entry's progress, waits) are
  // reported on every return, once the lock is released.
  absl::Cleanup callbacks = [e] { e->RunCallbacks(); };
  {
    MutexLock lock(&e->mu_);
    ConnState* c = state_;
    if (c == nullptr) return Closed();  // closed by another thread meanwhile
    CallScope in_call(c);
    if (c->PollBeforeSend(iov)) e->ProgressLocked();
    bool dontwait = flags & MSG_DONTWAIT;
    if (!e->WaitLocked([&] { return !c->calls.send_busy; }, dontwait ? kNoWait : deadline)) {
      return dontwait ? WouldBlock() : TimedOut();
    }
    c->calls.send_busy = true;
    absl::Cleanup done = [&] {
      c->calls.send_busy = false;
      e->NoteReadinessLocked(c);
      e->NotifyLocked();
    };
    if (!c->failure.error.ok()) return c->failure.error;
    if (c->shut.wr) return PipeError();
    if (c->phase != ConnState::Phase::kOpen) return Closed();
    SendCall call(deadline, dontwait, std::max<size_t>(c->opt.zcopy_threshold, 1));
    for (const iovec& v : iov) {
      call.Start(v);
      while (call.off < call.n) {
        if (!c->failure.error.ok()) return call.Partial(c->failure.error);
        if (c->SendNext(call) == Step::kEnd) return call.Partial(call.end);
      }
    }
    result = call.total;
    ZS_LOG(kTrace, "sdp conn %d send -> %zu", static_cast<int>(c->id), call.total);
  }
  return result;
}

bool ConnState::PollBeforeSend(std::span<const iovec> iov) {
  // What arrived while the application was away: credits, the peer's
  // SinkAvail, AZ-SDP completions. Not needed by a small send that can
  // be posted at once (nothing queued ahead, credits and a slot free):
  // the poll would cost it as much as the send itself.
  // Autocork: while a tail is held, a burst of small sends fills it and
  // polls only every kCorkPollEvery sends; while an acknowledgement
  // request is out and nothing is held, poll first: an answer already
  // here lets this send go at once (and the request counts as one no
  // send waited for).
  if (tx.ctlq.empty() && HeldBytes() > 0 && IovBytes(iov) <= CorkFlagMax()) {
    bcopy.ackreq_useful = true;  // a send joins a held tail: the request pays
    return ++tx.dataq.front().appends % kCorkPollEvery == 0;
  }
  return bcopy.ackreq_out || !CanPostSmall(iov);
}

Step ConnState::SendNext(SendCall& call) {
  const size_t rem = call.rem();
  // A valid SinkAvail from the peer takes the next bytes.
  if (source.peer_sink.valid && !call.dontwait) return SendToPeerSink(call);
  if (call.force_bcopy == 0 && az.enabled && opt.mode == Mode::kAz && rem >= call.threshold &&
      !call.az_sync) {
    if (Step s = SendAsync(call); s != Step::kPass) return s;
  }
  call.az_sync = false;
  if (call.force_bcopy == 0 && (opt.mode == Mode::kZcopy || opt.mode == Mode::kAz) &&
      rem >= call.threshold && (peer.caps & wire::kCapRdmaRead) && !call.dontwait) {
    if (Step s = SendSrcAvail(call); s != Step::kPass) return s;
  }
  if (Step s = SendPulled(call); s != Step::kPass) return s;
  return SendBcopy(call);
}

Step ConnState::SendPulled(SendCall& call) {
  // Pulled bcopy: one copy into our pull buffer; the peer reads it
  // straight into its application's buffer (pull.cc).
  // A non-blocking send that finds the pull buffer full goes by bcopy
  // below, as far as the send slots take it: readiness (CanAppend)
  // promised that much.
  const size_t rem = call.rem();
  size_t pull_at = 0, room = 0;
  if (call.force_bcopy != 0 || !PullWanted(rem) || !EnsurePullBuffer() ||
      ((room = PullRoom(rem, &pull_at)) == 0 && call.dontwait)) {
    return Step::kPass;
  }
  if (room > 0) {
    QueuePull(call.q(), room, pull_at);
    call.Took(room);
    return Step::kNext;
  }
  TryTransmit();
  if (!engine->WaitLocked([&] { return !failure.error.ok() || PullRoom(rem, &pull_at) > 0; },
                          call.deadline)) {
    return call.End(TimedOut());
  }
  return Step::kNext;
}

Step ConnState::SendBcopy(SendCall& call) {
  const size_t rem = call.rem();
  size_t want = call.force_bcopy ? std::min(rem, call.force_bcopy) : rem;
  size_t k = AppendData(call.q(), want);
  if (k > 0) {
    call.Took(k);
    if (call.force_bcopy) call.force_bcopy -= k;
    TryTransmit();
    return Step::kNext;
  }
  TryTransmit();
  if (call.dontwait) return call.End(WouldBlock());
  if (!engine->WaitLocked(
          [&] { return !failure.error.ok() || CanAppend() || source.peer_sink.valid; },
          call.deadline)) {
    return call.End(TimedOut());
  }
  return Step::kNext;
}

}  // namespace zsock::sdp
