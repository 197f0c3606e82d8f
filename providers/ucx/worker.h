// The UCP worker a fabric's endpoints and CQs share (two, when a tcp
// fallback is in use), and its progress.
//
// Every ucp_* call on a worker is made under its lock (`mu`,
// worker_lock.h), and so is every UCX callback. ProgressLocked is the busy
// poll's path (inlined into UcxCq::Progress): it reports sends UCX
// finished inside their call, sends due flow-control reports, drives
// ucp_worker_progress, probes for control messages (Drain*Locked) and
// fails endpoints UCX reported dead. The worker also keeps a free list of
// Ops and a pool of UCX request memory for user receives.
#ifndef ZSOCK_PROVIDERS_UCX_WORKER_H_
#define ZSOCK_PROVIDERS_UCX_WORKER_H_

#include <ucp/api/ucp.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/provider.h"
#include "providers/ucx/context.h"
#include "providers/ucx/cq.h"
#include "providers/ucx/op.h"
#include "providers/ucx/worker_lock.h"

namespace zsock::ucx {

struct EpCore;

// Workers with more endpoints than this find control messages by the
// control bit alone (Worker::DrainControlLocked).
inline constexpr size_t kExactProbeMax = 16;
// A busy poll that handled no arrival still probes the control tags this
// often.
inline constexpr int64_t kProbeIntervalNs = 1000 * 1000;

// Progresses `worker` (its lock held) until `done()` holds or `bound`
// passes; returns done(). For the bounded waits on UCX at a close.
bool ProgressUntil(ucp_worker_h worker, absl::FunctionRef<bool()> done, absl::Duration bound);

class Worker {
 public:
  static absl::StatusOr<std::unique_ptr<Worker>> Create(std::shared_ptr<Context> ctx,
                                                        std::string name, bool serialized);
  ~Worker();

  ucp_worker_h handle() const { return worker_; }
  int efd() const { return efd_; }
  bool rma() const { return ctx_->rma(); }
  const Context& context() const { return *ctx_; }
  const std::string& name() const { return name_; }

  absl::StatusOr<std::string> Address() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // A UCX endpoint to the worker at `address`, with peer-failure handling
  // reporting to `core` (OnEpError).
  absl::StatusOr<ucp_ep_h> CreateEp(const std::string& address, EpCore* core)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Releases `ep` at once (outstanding operations fail with UCS_ERR_CANCELED).
  void CloseEpLocked(ucp_ep_h ep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Drives UCX and receives control messages; handles endpoints UCX
  // reported failed. Returns the events handled.
  // `now` is the coarse clock (CoarseNowNs) as the CQ's Progress last read
  // it (every few polls). Inlined into that Progress: the busy poll's path.
  // `tries`: ucp_worker_progress calls, at most, until one finds something.
  // `quick`: when one did, return at once and leave the rest (the control
  // probe, held sends, failed endpoints) to the next call; the CQ passes
  // false on every kClockPolls-th poll, so that a stream finding something
  // on every poll still gets it done.
  [[gnu::always_inline]] inline size_t ProgressLocked(int64_t now, int tries = 1,
                                                      bool quick = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  enum class Arm {
    kArmed,     // asleep on the wakeup fd until an event
    kPending,   // events are pending: progress now
    kBusyIdle,  // UCX says busy but the last progress found nothing to do
  };
  // ucp_worker_arm. UCX reports "busy" while sends wait for space in a
  // shared-memory FIFO (its mm transport has no send wakeup), and forever
  // after some peer deaths (requests stuck in UCX 1.13, docs/ucx.md); when
  // the last progress found nothing, the caller sleeps with a timer
  // instead of spinning.
  Arm ArmLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Endpoint failure: delivers what the peer sent, then fails the rest.
  void FailLocked(EpCore* c, const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Called from UCX's error callback.
  void MarkUcxFailedLocked(EpCore* c, ucs_status_t st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Discards user messages still queued for a departed endpoint.
  void DiscardMessagesLocked(uint64_t tag) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // User sends and receives (and control receives, TakeControlLocked)
  // come from a free list: a ping-pong makes two per round trip, and malloc
  // plus free (core's release hooks included) cost more than the rest of
  // their bookkeeping. An op is reset when it is taken again, not when it
  // is freed: a receive that finishes is freed between the message's
  // arrival and the caller's reply, and the next post has no such hurry.
  Op* NewOpLocked(Op::Kind kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (nfree_ == 0) return new Op{kind};
    Op* op = free_ops_[--nfree_];
    if (op->used) {
      op->Recycle();
      op->used = false;
    }
    op->kind = kind;
    return op;
  }
  [[gnu::noinline]] static void DropShared(Op* op);
  [[gnu::noinline]] static void DeleteOp(Op* op);
  void FreeOpLocked(Op* op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    // The cold paths are calls: inlined, an Op's destructor would give
    // this function (called for every finished receive) a stack frame.
    if (nfree_ == kMaxFreeOps) {
      DeleteOp(op);
      return;
    }
    // What it shares goes now (an endpoint's core must not outlive its
    // last user in a free list); a user receive shares nothing.
    if (op->keep != nullptr || op->control_in != nullptr) DropShared(op);
    op->used = true;
    free_ops_[nfree_++] = op;
  }

  // A user send UCX finished inside ucp_tag_send_nbx (small messages over
  // shared memory and tcp usually are): its completion waits here, under
  // the mutex the send holds anyway, for the next progress of any CQ on
  // this worker (ReportInlineLocked), which hands it straight to a polling
  // caller. Reporting it at once from Send would take the CQ's own lock
  // and queue, and that poll a second lock.
  // Wakes the CQ's sleeper: its ArmLocked, under this mutex, either saw
  // the entry or set armed_ before we look.
  inline void DeferInlineLocked(UcxCq* cq, Completion c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Request memory for user receives (UCP_OP_ATTR_FIELD_REQUEST): a
  // receive that brings its own costs UCX no allocation when posted and
  // the callback no ucp_request_free, on a ping-pong's every message. A
  // block goes back to the pool in the receive's callback (only a later
  // post takes it again), and the pool frees its blocks only with the
  // worker: UCX still sets and reads a request's flags after its callback
  // returns. Null when UCX did not tell its request size (then UCX
  // allocates, as for every other operation).
  void* TakeRequestLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (free_requests_.empty()) return NewRequestLocked();
    void* r = free_requests_.back();
    free_requests_.pop_back();
    return r;
  }
  void GiveRequestLocked(void* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { free_requests_.push_back(r); }
  // Reports the deferred completions, oldest first. Every other report
  // calls it first (ReportLocked), so an endpoint's sends stay in order.
  // Inline: every progress calls it, and the queue is usually empty.
  size_t ReportInlineLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return inline_done_.empty() ? 0 : ReportInlineSlowLocked();
  }
  bool HasInlineLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !inline_done_.empty(); }
  // A CQ going away: its deferred completions have no reader.
  void ForgetCqLocked(UcxCq* cq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::erase_if(inline_done_, [cq](const auto& e) { return e.first == cq; });
  }
  // Takes back an Op a send did not need (UCX finished it inside the call),
  // untouched but for the fields Submit sets.
  void RecycleUnusedOpLocked(Op* op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    op->completed = false;
    op->ucx_status = UCS_OK;
    if (nfree_ == kMaxFreeOps) {
      DeleteOp(op);
      return;
    }
    free_ops_[nfree_++] = op;
  }

  // Flow control: `c` has a report to send or held sends the window may
  // now let go; done by FlowLocked at the start of the next progress (or at
  // the end of a PostRecv), never from inside a UCX callback
  // (flow_control.cc).
  [[gnu::noinline]] void QueueFlowLocked(EpCore* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  size_t FlowLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  void Track(Op* op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { busy_.insert(op); }
  void Untrack(Op* op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { busy_.erase(op); }

  WorkerMutex mu;
  absl::flat_hash_map<uint32_t, std::shared_ptr<EpCore>> eps ABSL_GUARDED_BY(mu);
  // The endpoints whose sends wait for their window (EpCore::held): every
  // full progress (all but a busy poll's quick return, ProgressLocked)
  // probes them for the peer's report (DrainHoldingLocked), not only once
  // per tick, and not every endpoint of the worker.
  absl::flat_hash_set<EpCore*> holding ABSL_GUARDED_BY(mu);

 private:
  Worker(std::shared_ptr<Context> ctx, ucp_worker_h w, int efd, std::string name,
         bool serialized)
      : mu(serialized), ctx_(std::move(ctx)), worker_(w), efd_(efd), name_(std::move(name)) {}

  size_t DrainControlLocked(int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  size_t DrainCoreLocked(const std::shared_ptr<EpCore>& core) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  size_t DrainAnyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Receives the probed control message `msg` for `core`, in arrival order.
  void TakeControlLocked(const std::shared_ptr<EpCore>& core, ucp_tag_message_h msg,
                         const ucp_tag_recv_info_t& info) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  size_t DrainHoldingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Starts receiving the probed message `msg` into buf for `op`;
  // afterwards op->completed is set (the caller settles it) or UCX owns it.
  void StartProbedLocked(Op* op, ucp_tag_message_h msg, void* buf, size_t len)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The same for a discard, which this worker tracks until UCX finishes it.
  void ReceiveProbedLocked(Op* op, ucp_tag_message_h msg, void* buf, size_t len)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  size_t ReportInlineSlowLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Fails the endpoints UCX's error handler reported (out of the busy
  // poll's line: its message building is most of a progress call's code).
  [[gnu::noinline]] size_t FailReportedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // TakeRequestLocked's pool.
  [[gnu::noinline]] void* NewRequestLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  std::shared_ptr<Context> ctx_;
  ucp_worker_h worker_;
  int efd_;
  std::string name_;
  bool control_backlog_ ABSL_GUARDED_BY(mu) = false;
  int64_t last_probe_ns_ ABSL_GUARDED_BY(mu) = 0;  // DrainControlLocked's last run
  bool probe_due_ ABSL_GUARDED_BY(mu) = true;       // progress found something since
  size_t last_progress_ ABSL_GUARDED_BY(mu) = 1;  // events the last progress handled
  std::vector<std::pair<std::shared_ptr<EpCore>, ucs_status_t>> failed_ ABSL_GUARDED_BY(mu);
  // Operations whose UCX request is outstanding but that no endpoint queue
  // holds: control receives, discards, and operations already reported
  // failed (a dead or closed endpoint) that UCX has not finished.
  std::unordered_set<Op*> busy_ ABSL_GUARDED_BY(mu);
  struct AlignedDelete {
    void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::vector<std::unique_ptr<std::byte[], AlignedDelete>> request_blocks_ ABSL_GUARDED_BY(mu);
  std::vector<void*> free_requests_ ABSL_GUARDED_BY(mu);
  static constexpr size_t kMaxFreeOps = 64;
  // A fixed array, not a vector: a vector's growth path, inlined, would
  // give FreeOpLocked a stack frame.
  std::array<Op*, kMaxFreeOps> free_ops_ ABSL_GUARDED_BY(mu){};
  size_t nfree_ ABSL_GUARDED_BY(mu) = 0;
  std::vector<std::pair<UcxCq*, Completion>> inline_done_ ABSL_GUARDED_BY(mu);
  std::vector<std::shared_ptr<EpCore>> flow_due_ ABSL_GUARDED_BY(mu);  // QueueFlowLocked
};

size_t Worker::ProgressLocked(int64_t now, int tries, bool quick) {
  // Sends finished inside their ucp_tag_send_nbx, before what this
  // progress finds.
  size_t reported = ReportInlineLocked();
  // Flow reports and held sends queued since the last call go first, not
  // after this call's progress: a report that a receive consumed its way
  // to then never delays the reply a ping-pong's caller sends next (the
  // caller's PostRecv or the next progress sends it), and a peer's report
  // opens the window at most one call later.
  if (!flow_due_.empty()) reported += FlowLocked();
  // ucp_worker_progress until it finds something (it handles a batch), at
  // most `tries` times, and only once when there is already something to
  // report: when it found something, the caller gets it now, and more
  // progress waits for the next call (a ping-pong's reply is then sent
  // without it on its path).
  size_t n;
  do {
    n = ucp_worker_progress(worker_);
  } while (n == 0 && reported == 0 && --tries > 0);
  // A busy poll that found something (a ping-pong's every message) goes
  // back to its caller with nothing else on the way: the instructions
  // between UCX's callback and the reply the caller sends are round-trip
  // time. The probe is due; the rest below runs on the next poll that
  // finds nothing, or on the next full one (the caller's kClockPolls).
  if (quick && n > 0) [[likely]] {
    probe_due_ = true;
    n += reported;
    last_progress_ = n;
    return n;
  }
  // Control messages become probe-able when progress handles an arrival:
  // probed on the first call after one that found something, not on every
  // idle busy poll (a large part of its cost), but at least once per coarse
  // tick (UCX may also progress inside other calls, and a stream keeps
  // finding something), and always before arming (ArmLocked).
  // Endpoints whose sends wait for a window look for the report that opens
  // it on every full progress (all but the quick return above).
  if (n > 0) {
    probe_due_ = true;
    if (now - last_probe_ns_ >= kProbeIntervalNs) {
      n += DrainControlLocked(now);
    } else if (!holding.empty()) {
      n += DrainHoldingLocked();
    }
  } else if (probe_due_ || control_backlog_ || now - last_probe_ns_ >= kProbeIntervalNs) {
    n += DrainControlLocked(now);
  } else if (!holding.empty()) {
    n += DrainHoldingLocked();
  }
  if (!failed_.empty()) n += FailReportedLocked();
  n += reported;
  last_progress_ = n;
  return n;
}

void Worker::DeferInlineLocked(UcxCq* cq, Completion c) {
  inline_done_.emplace_back(cq, std::move(c));
  // Core's wake-up (its armed_ is set before ArmProvider takes this mutex
  // to look at inline_done_), deduplicated by core; not only the CQ's own
  // armed_, which any thread's ClearWakeup resets while another sleeps.
  cq->WakeSleeper();
}

}  // namespace zsock::ucx

#endif  // ZSOCK_PROVIDERS_UCX_WORKER_H_
