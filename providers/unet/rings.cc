// unet's per-message path (endpoint.h): sends into the peer's rings and
// buffers, receives from ours, and Progress, which moves both along.
//
// Sends are queued per ring (user, control) and pushed while the peer's
// ring has descriptors and its free ring has buffers; messages up to kInline
// bytes travel in the descriptor, larger ones in buffers, chunked. Receives
// are matched in order to the descriptors of our user ring; control
// messages are assembled and handed to core. After publishing, Notify
// rings the peer's bell and wakes its CQ if it sleeps.
//
// The helpers of this path are defined `inline` in this file, their only
// user, so that the compiler can fold them into Send, PostRecv and Progress.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/copy.h"
#include "providers/unet/endpoint.h"

namespace zsock::unet {

absl::Status UnetEndpoint::Send(const void* buf, size_t len, MemoryRegion*, uint64_t context) {
  if (context == kInjectContext && len > kInline) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("an injected send of ", len, " bytes exceeds unet's inject_size ",
                                  kInline),
                     "inject at most caps().inject_size bytes, or send with a context");
  }
  return Enqueue(kUserMsg, static_cast<const uint8_t*>(buf), len, {}, context);
}

absl::Status UnetEndpoint::SendControl(std::span<const uint8_t> msg) {
  return Enqueue(kControlMsg, nullptr, msg.size(), std::vector<uint8_t>(msg.begin(), msg.end()),
                 0);
}

inline void UnetEndpoint::UpdateHintsLocked() {
  hint_busy_.store(!sendq_.empty() || !ctlq_.empty() || !sent_done_.empty() || dead_,
                   std::memory_order_relaxed);
  hint_posted_.store(!posted_.empty(), std::memory_order_relaxed);
}

// Whether Progress may have anything to do, read without the lock: a
// stale answer costs one poll (the next sees the update), and sleeping is
// decided by ArmAndCheck under the lock, so no wakeup is lost.
inline bool UnetEndpoint::MayHaveWork() const {
  if (hint_busy_.load(std::memory_order_relaxed)) return true;
  if (rx_ctl_.Peek() != nullptr) return true;
  return hint_posted_.load(std::memory_order_relaxed) && rx_user_.Peek() != nullptr;
}

absl::Status UnetEndpoint::PostRecv(void* buf, size_t len, MemoryRegion*, uint64_t context) {
  MutexLock lock(&mu_);
  if (closed_) return ClosedError();
  if (dead_ && (rx_abandoned_ || !rx_pending_locked())) return dead_status_;
  posted_.push_back({static_cast<uint8_t*>(buf), len, context});
  UpdateHintsLocked();
  // A message may already wait for this receive while another thread
  // sleeps on the CQ: wake it to match them. (Only a sleeper: a write(2)
  // per repost would cost a small-message stream much of its CPU.
  // ArmAndCheck takes mu_, so an Arm racing with this either sees the
  // message or is seen by WakeSleeper.)
  if (rx_user_.Peek() != nullptr) {
    MarkSelf();  // before the wake-up: the woken thread looks at marked endpoints
    cq_->WakeSleeper();
  }
  return absl::OkStatus();
}

// Tells the peer's CQ to look at the peer endpoint (its bell bit), and
// wakes it if it sleeps. Called after publishing into the peer's rings or
// returning its buffers.
inline void UnetEndpoint::Notify() {
  // Orders what was published before the bell's reads (RingBell).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // The sleeper stores armed, then reads the bits (seq_cst, in
  // UnetCq::ArmProvider); we set a bit (a seq_cst RMW), then read armed
  // (seq_cst): one of us sees the other. A bit found already set needs
  // no order: whoever clears it looks at the rings after the fence above.
  RingBell(peer_bell_, p_.peer_bell_slot);
  if (peer_bell_->armed.load(std::memory_order_seq_cst) != 0 &&
      peer_bell_->armed.exchange(0, std::memory_order_seq_cst) != 0) {
    uint64_t one = 1;
    ssize_t rc = ::write(p_.peer_event.get(), &one, sizeof(one));
    (void)rc;  // EAGAIN: the counter is already non-zero, the peer wakes anyway
  }
}

// Moves pending sends into the peer's rings as far as descriptors and
// buffers allow. Returns whether anything was published.
// (`List`: Completions, or sent_done_'s vector.)
template <typename List>
inline bool UnetEndpoint::PushSendsLocked(List* done) {
  bool published = PushQueueLocked(&ctlq_, done);
  published |= PushQueueLocked(&sendq_, done);
  return published;
}

// Moves one queue's messages into the peer's rings (user and control
// messages use separate rings and buffer pools, so neither blocks the other).
template <typename List>
bool UnetEndpoint::PushQueueLocked(std::deque<PendingSend>* queue, List* done) {
  bool published = false;
  const uint32_t bufsize = p_.tx_layout.buffer_size;
  while (!queue->empty()) {
    PendingSend& ps = queue->front();
    const bool ctl = ps.type == kControlMsg;
    RingProducer<Desc>& ring = ctl ? tx_ctl_ : tx_user_;
    while (!ps.started || ps.offset < ps.len) {
      Desc* d = ring.TryClaim();
      if (d == nullptr) return published;
      size_t chunk;
      uint8_t flags = ps.started ? 0 : kFirst;
      if (!ps.started && ps.len <= kInline) {
        chunk = ps.len;
        flags |= kInlineData;
        if (chunk > 0) std::memcpy(d->data, ps.data, chunk);
        d->buf = 0;
      } else {
        RingConsumer<FreeSlot>& free = ctl ? tx_ctl_free_ : tx_user_free_;
        FreeSlot* fs = free.Peek();
        if (fs == nullptr) return published;
        uint32_t idx = fs->buf;
        free.Release(fs);
        // The owner hands out its own indices; trust but verify.
        if (!InPool(idx, ctl, p_.tx_layout.nbuffers)) {
          MarkDeadLocked(MakeError(absl::StatusCode::kDataLoss, EPROTO,
                                   "the unet peer returned an invalid buffer index",
                                   "the peer is faulty; reconnect"));
          return published;
        }
        chunk = std::min<size_t>(bufsize, ps.len - ps.offset);
        CopyBytes(p_.tx.get() + p_.tx_layout.buffers + size_t{idx} * bufsize,
                  ps.data + ps.offset, chunk);
        d->buf = idx;
      }
      d->type = ps.type;
      d->len = static_cast<uint32_t>(chunk);
      d->total = ps.len;
      ps.offset += chunk;
      ps.started = true;
      if (ps.offset == ps.len) flags |= kLast;
      d->flags = flags;
      ring.Publish(d);
      published = true;
    }
    if (!ctl && ps.context != kInjectContext) {
      Completion c;
      c.context = ps.context;
      c.op = OpType::kSend;
      c.length = ps.len;
      c.endpoint = this;
      done->push_back(std::move(c));
    }
    queue->pop_front();
  }
  return published;
}

absl::Status UnetEndpoint::Enqueue(uint8_t type, const uint8_t* data, size_t len,
                                   std::vector<uint8_t> owned, uint64_t context) {
  if (len > kMaxMessage) {
    return MakeError(absl::StatusCode::kInvalidArgument, EMSGSIZE,
                     absl::StrCat("message of ", len, " bytes exceeds unet's maximum of ",
                                  kMaxMessage),
                     "split the message");
  }
  bool notify = false;
  {
    MutexLock lock(&mu_);
    if (closed_) return ClosedError();
    if (dead_) return dead_status_;
    PendingSend ps{type, data, std::move(owned), len, 0, false, context};
    if (!ps.owned.empty()) ps.data = ps.owned.data();
    auto& q = type == kControlMsg ? ctlq_ : sendq_;
    q.push_back(std::move(ps));
    if (q.size() == 1) {
      // Sends that reached the peer's ring here report at the CQ's next
      // progress of this endpoint, which hands them straight to a polling
      // caller: pushing them from here would take the CQ's lock and queue,
      // and the poll that takes them a second lock. ArmAndCheck looks at
      // them under mu_, so WakeSleeper wakes a sleeper that armed after it.
      const size_t before = sent_done_.size();
      notify = PushSendsLocked(&sent_done_);
      if (sent_done_.size() > before) {
        MarkSelf();  // before the wake-up: the woken thread looks at marked endpoints
        cq_->WakeSleeper();
      }
    }
    // An injected send still queued (the peer's ring is full) keeps a
    // copy: the caller's buffer is its own again once Send returns. (It
    // is the queue's last entry: the queue is first in, first out.)
    if (context == kInjectContext && !q.empty() && q.back().owned.empty()) {
      PendingSend& last = q.back();
      last.owned.assign(last.data, last.data + last.len);
      last.data = last.owned.data();
    }
    UpdateHintsLocked();
    if (!q.empty()) MarkSelf();  // waits for ring slots or buffers
  }
  if (notify) Notify();
  return absl::OkStatus();
}

inline void UnetEndpoint::ReturnBuffer(bool ctl, uint32_t idx) {
  RingProducer<FreeSlot>& ring = ctl ? rx_ctl_free_ : rx_user_free_;
  FreeSlot* fs = ring.TryClaim();
  // Cannot be full while the peer follows the protocol: at most as many
  // indices are returned as exist.
  if (fs == nullptr) {
    MarkDeadLocked(ProtocolError("free ring overflow (peer corrupted its slots)"));
    return;
  }
  fs->buf = idx;
  ring.Publish(fs);
}

// Consumes the control ring into complete messages.
inline size_t UnetEndpoint::DrainControlLocked(std::vector<std::vector<uint8_t>>* out) {
  size_t n = 0;
  while (Desc* d = rx_ctl_.Peek()) {
    Chunk c;
    if (!ReadChunk(d, true, p_.rx_layout, p_.rx.get(), &c) || !ctl_in_.InOrder(c)) {
      MarkDeadLocked(ProtocolError("bad control descriptor"));
      return n;
    }
    if (c.flags & kFirst) {
      ctl_in_.Start(c.total);
      // Grows with what arrives; the announced total is the peer's word.
      ctl_in_.control.reserve(std::min<uint64_t>(c.total, 64 * 1024));
    }
    if (!ctl_in_.Fits(c.len)) {
      MarkDeadLocked(ProtocolError("control message longer than announced"));
      return n;
    }
    ctl_in_.control.insert(ctl_in_.control.end(), c.data, c.data + c.len);
    ctl_in_.got += c.len;
    rx_ctl_.Release(d);
    if (!(c.flags & kInlineData)) ReturnBuffer(true, c.buf);
    ++n;
    if (c.flags & kLast) {
      if (!ctl_in_.Complete()) {
        MarkDeadLocked(ProtocolError("control message shorter than announced"));
        return n;
      }
      out->push_back(std::move(ctl_in_.control));
      ctl_in_ = Incoming{};
    }
  }
  return n;
}

// Matches user messages to posted receives.
inline size_t UnetEndpoint::DrainUserLocked(Completions* done) {
  size_t n = 0;
  while (!posted_.empty()) {
    Desc* d = rx_user_.Peek();
    if (d == nullptr) break;
    Chunk c;
    if (!ReadChunk(d, false, p_.rx_layout, p_.rx.get(), &c) || !user_in_.InOrder(c)) {
      MarkDeadLocked(ProtocolError("bad user descriptor"));
      return n;
    }
    PostedRecv& r = posted_.front();
    if (c.flags & kFirst) {
      user_in_.Start(c.total);
      user_in_.truncated = c.total > r.len;
    }
    if (!user_in_.Fits(c.len)) {
      MarkDeadLocked(ProtocolError("message longer than announced"));
      return n;
    }
    if (!user_in_.truncated && c.len > 0) CopyBytes(r.buf + user_in_.got, c.data, c.len);
    user_in_.got += c.len;
    rx_user_.Release(d);
    if (!(c.flags & kInlineData)) ReturnBuffer(false, c.buf);
    ++n;
    if (c.flags & kLast) {
      if (!user_in_.Complete()) {
        MarkDeadLocked(ProtocolError("message shorter than announced"));
        return n;
      }
      // Straight into the polling caller's output where it can be.
      Completion& comp = cq_->EmitSlot(done);
      comp.context = r.context;
      comp.op = OpType::kRecv;
      comp.endpoint = this;
      if (user_in_.truncated) {
        comp.length = 0;
        comp.status = MakeError(absl::StatusCode::kOutOfRange, EMSGSIZE,
                                absl::StrCat("a ", user_in_.total, "-byte message met a ", r.len,
                                             "-byte receive and was discarded"),
                                "post receive buffers as large as the largest message");
      } else {
        comp.length = user_in_.total;
        comp.status = absl::OkStatus();
      }
      posted_.pop_front();
      user_in_ = Incoming{};
    }
  }
  return n;
}

// The peer is gone or broke the protocol: queued sends and emulated
// operations can never finish, and receives fail once everything the peer
// sent has been consumed.
inline void UnetEndpoint::FailOnDeathLocked(Completions* done, absl::Status* emulated_failure) {
  if (!dead_sends_failed_) {
    dead_sends_failed_ = true;
    FailSendsLocked(dead_status_, done);
    *emulated_failure = dead_status_;
  }
  if (!posted_.empty() && (rx_abandoned_ || rx_user_.Peek() == nullptr)) {
    absl::Status why = dead_status_;
    if (user_in_.active && !rx_abandoned_) {
      why = MakeError(absl::StatusCode::kAborted, ECONNRESET,
                      absl::StrCat("unet peer pid ", p_.peer_pid, " went away after ",
                                   user_in_.got, " of ", user_in_.total, " bytes of a message"),
                      "reconnect and resend");
      user_in_ = Incoming{};
    }
    FlushLocked(why, done);
  }
}

size_t UnetEndpoint::Progress(bool check_liveness) {
  if (!check_liveness && !MayHaveWork()) return 0;
  std::vector<std::vector<uint8_t>> control;
  Completions done;
  absl::Status emulated_failure;
  size_t n = 0;
  bool notify = false;
  {
    MutexLock lock(&mu_);
    if (closed_) return 0;
    // Sends that completed in Enqueue, ahead of anything found now. Pushed
    // here, so that sent_done_ keeps its capacity (a stream defers many
    // between polls, and a moved-out vector would be allocated again).
    if (!sent_done_.empty()) {
      n += sent_done_.size();
      cq_->PushAll(std::span<Completion>(sent_done_.data(), sent_done_.size()));
      sent_done_.clear();
    }
    size_t consumed = 0;
    if (!rx_abandoned_) consumed += DrainControlLocked(&control);
    if (!rx_abandoned_) consumed += DrainUserLocked(&done);
    n += consumed;
    if ((!sendq_.empty() || !ctlq_.empty()) && !dead_) notify |= PushSendsLocked(&done);
    // Consuming frees ring slots (and maybe buffers) a sleeping sender may
    // be waiting for.
    notify |= consumed > 0;
    if (!dead_ && check_liveness && (!ServiceSocketLocked() || PeerGone())) {
      MarkDeadLocked(MakeError(absl::StatusCode::kAborted, ECONNRESET,
                               absl::StrCat("unet peer pid ", p_.peer_pid,
                                            " closed the connection (it exited, was killed or closed the endpoint)"),
                               "reconnect; data the peer sent before it went away was delivered"));
    }
    if (dead_) {
      FailOnDeathLocked(&done, &emulated_failure);
      n += done.size();
    }
    UpdateHintsLocked();
    // Work left (sends waiting for the peer, messages beyond this pass):
    // keep the bell bit this progress took.
    if (MayHaveWork()) MarkSelf();
  }
  if (notify) Notify();
  for (auto& c : done) cq_->Push(std::move(c));
  for (auto& m : control) DeliverControl(m);
  if (!emulated_failure.ok()) FailEmulated(emulated_failure);
  return n;
}

bool UnetEndpoint::ArmAndCheck() {
  // The CQ has set its bell's armed flag (UnetCq::ArmProvider).
  MutexLock lock(&mu_);
  if (closed_) return false;
  if (!sent_done_.empty()) return true;
  if (dead_) {
    return !dead_sends_failed_ || !posted_.empty() || (!rx_abandoned_ && rx_ctl_.Peek() != nullptr);
  }
  if (rx_ctl_.Peek() != nullptr) return true;
  if (!posted_.empty() && rx_user_.Peek() != nullptr) return true;
  // Progress possible if a queued message finds a descriptor and, if
  // needed, a buffer.
  for (const auto* q : {&ctlq_, &sendq_}) {
    if (q->empty()) continue;
    const PendingSend& ps = q->front();
    bool ctl = ps.type == kControlMsg;
    if ((ctl ? tx_ctl_ : tx_user_).TryClaim() != nullptr &&
        ((!ps.started && ps.len <= kInline) || (ctl ? tx_ctl_free_ : tx_user_free_).Peek() != nullptr)) {
      return true;
    }
  }
  return false;
}

}  // namespace zsock::unet
