// Connection::Recv (connection.h): copies what the receive stream holds
// (Data from the private buffers, or SrcAvails read by RDMA into the
// caller's buffer, zcopy_sink.cc), then, if the call must wait and its
// buffer is large, announces it in a SinkAvail (zcopy_sink.cc). Small
// receives, most of them, only copy Data out of the queue: that path stays
// in this file.
#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "core/copy.h"
#include "core/log.h"
#include "core/mutex.h"
#include "core/sdp/az_guard.h"
#include "core/sdp/calls.h"
#include "core/sdp/conn_state.h"
#include "core/sdp/engine.h"

namespace zsock::sdp {

namespace {

// Whether `iov` overlaps a buffer this process is still sending from.
bool SendProtected(std::span<const iovec> iov) {
  for (const iovec& v : iov) {
    if (az::Guard::Get().Overlaps(v.iov_base, v.iov_len)) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<size_t> Connection::Recv(void* buf, size_t len, int flags, Deadline deadline) {
  iovec v{buf, len};
  return Recv(std::span<const iovec>(&v, 1), flags, deadline);
}

absl::StatusOr<size_t> Connection::Recv(std::span<const iovec> iov, int flags,
                                        Deadline deadline) {
  if (StateUnlocked() == nullptr) return Closed();
  Engine* e = engine_;
  if (SendProtected(iov)) {
    if (absl::Status st = SettleSendProtected(iov, flags, deadline); !st.ok()) return st;
  }
  absl::Cleanup callbacks = [e] { e->RunCallbacks(); };  // as in Send
  MutexLock lock(&e->mu_);
  ConnState* c = state_;
  if (c == nullptr) return Closed();  // closed by another thread meanwhile
  CallScope in_call(c);
  // Bytes already queued came before anything the CQ holds: with some at
  // the head, copy them without polling (waits below still progress).
  if (c->rx.queue.empty() || c->rx.queue.front().kind != RxSeg::kData) e->ProgressLocked();
  const bool dontwait = flags & MSG_DONTWAIT;
  if (!e->WaitLocked([&] { return !c->calls.recv_busy; }, dontwait ? kNoWait : deadline)) {
    return dontwait ? WouldBlock() : TimedOut();
  }
  c->calls.recv_busy = true;
  absl::Cleanup done = [&] {
    c->calls.recv_busy = false;
    e->NoteReadinessLocked(c);
    e->NotifyLocked();
  };
  const Fabric* fabric = c->ep->fabric();
  RecvCall call(iov, flags, deadline,
                fabric->caps().max_rma_size ? fabric->caps().max_rma_size : kMaxAdvert);
  if (call.cur.done()) return size_t{0};
  return c->RecvLoop(call);
}

// A buffer this process is still sending from (AZ-SDP) is read-only, and
// must be settled (copy-on-write, or a wait for the pull) before anything
// is written into it. Not before there is something to write, though: a
// request/response peer pulls our data before it answers, so its
// RdmaRdCompl comes ahead of its reply and usually frees the buffer at no
// cost (settling at once made every large azcopy ping-pong copy its whole
// buffer aside). So wait, making progress, until the buffer is writable or
// the stream has something for it; settle then, without the engine lock
// (the fault path takes it).
absl::Status Connection::SettleSendProtected(std::span<const iovec> iov, int flags,
                                             const Deadline& deadline) {
  Engine* e = engine_;
  bool receivable;
  bool has_bytes;
  bool block_policy;
  {
    MutexLock lock(&e->mu_);
    ConnState* c = state_;
    if (c == nullptr) return Closed();
    CallScope in_call(c);
    block_policy = c->opt.az_policy == AzPolicy::kBlock;
    e->ProgressLocked();
    const auto ready = [&] {
      return !c->rx.queue.empty() || c->shut.peer_wr || !c->failure.error.ok() || c->shut.rd;
    };
    e->WaitLocked([&] { return !SendProtected(iov) || ready(); },
                  (flags & MSG_DONTWAIT) ? kNoWait : deadline);
    receivable = ready();
    // With only an end of stream, a reset or SHUT_RD to report, nothing
    // will be written into the buffer (and no bytes can follow those).
    has_bytes = !c->rx.queue.empty();
  }
  e->RunCallbacks();
  if (!SendProtected(iov) || (receivable && !has_bytes)) return absl::OkStatus();
  if (!receivable) return (flags & MSG_DONTWAIT) ? WouldBlock() : TimedOut();
  // Block-on-write settles by waiting for the peer's pull, which a
  // non-blocking call must not do: try again later (each retry makes
  // progress; an event loop sees the socket readable and spins until
  // the pull completes). Copy-on-write settles at once, or waits only
  // for a pull the peer has already started. (The receiving
  // connection's policy decides here; the fault path uses the policy of
  // the connection sending the buffer, which differs only when the two
  // were given different ConnectionOptions.)
  if ((flags & MSG_DONTWAIT) && block_policy) return WouldBlock();
  for (const iovec& v : iov) {
    if (az::Guard::Get().Overlaps(v.iov_base, v.iov_len)) {
      az::Guard::Get().WaitWritable(v.iov_base, v.iov_len);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> ConnState::RecvLoop(RecvCall& call) {
  for (;;) {
    if (failure.local_abort) return failure.error;
    if (shut.rd) return call.copied;
    // 1. Copy what the stream holds.
    if (CopyQueued(call) == Step::kEnd) return call.Result();
    TryTransmit();
    if (call.cur.done() || (call.copied > 0 && !call.waitall)) break;
    // End of stream: the peer's DisconnReq came after all its data (even
    // if the connection failed afterwards, unless it was reset).
    if (shut.peer_wr && rx.queue.empty() && !failure.peer_aborted) break;
    if (!failure.error.ok()) {
      return call.copied ? absl::StatusOr<size_t>(call.copied) : failure.error;
    }
    if (call.peek && call.copied > 0) break;
    // This thread is about to wait for the peer (or to tell an event loop
    // to): it sends nothing more meanwhile, so a tail autocork holds goes
    // now instead of after the peer's acknowledgement.
    FlushTail();
    if (call.dontwait) {
      if (call.copied > 0) break;
      return WouldBlock();
    }
    // 2. Nothing queued: announce the buffer (SinkAvail) if it is large.
    if (!call.peek && rx.queue.empty() && opt.mode == Mode::kZcopy &&
        (peer.caps & wire::kCapRdmaWrite) && call.cur.space() >= opt.zcopy_threshold &&
        !sink.advert.active && !shut.rd) {
      const Step s = RecvIntoSinkAvail(call);
      if (s == Step::kEnd) return call.Result();
      if (s == Step::kNext) continue;
    }
    if (!engine->WaitLocked([&] {
          return !rx.queue.empty() || shut.peer_wr || !failure.error.ok() || shut.rd;
        }, call.deadline)) {
      if (call.copied > 0) break;
      return TimedOut();
    }
  }
  ZS_LOG(kTrace, "sdp conn %d recv -> %zu", static_cast<int>(id), call.copied);
  return call.copied;
}

Step ConnState::CopyQueued(RecvCall& call) {
  size_t peek_skip = 0;  // PEEK: bytes of the queue already copied
  for (size_t si = 0; !call.cur.done() && si < rx.queue.size();) {
    RxSeg& s = rx.queue[si];
    size_t avail = s.len - s.off;
    size_t start = s.off;
    if (call.peek) {
      if (peek_skip >= avail) {
        peek_skip -= avail;
        ++si;
        continue;
      }
      start += peek_skip;
      avail -= peek_skip;
      peek_skip = 0;
    }
    if (s.kind == RxSeg::kData) {
      size_t k = std::min(avail, call.cur.space());
      CopyBytes(call.cur.ptr(), s.data + start, k);
      call.Took(k);
      if (call.peek) {
        if (k == avail) ++si;
        continue;
      }
      s.off += k;
      stats.bytes_recv_bcopy += k;
      if (s.off == s.len) {
        int b = s.buf;
        rx.queue.pop_front();
        Repost(b);
      }
      continue;
    }
    switch (RecvFromSrcAvail(call, si, start, avail)) {
      case SegStep::kPass:
      case SegStep::kNextSeg:
        ++si;
        break;
      case SegStep::kSameSeg:
        break;
      case SegStep::kRestart:
        si = 0;
        peek_skip = 0;
        if (call.peek) return Step::kNext;  // a peek starts over
        break;
      case SegStep::kStop:
        return Step::kNext;
      case SegStep::kEnd:
        return Step::kEnd;
    }
  }
  return Step::kNext;
}

}  // namespace zsock::sdp
