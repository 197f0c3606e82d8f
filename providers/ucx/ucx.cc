// ucx: the zsock provider over UCX 1.13 at the UCP level (docs/ucx.md).
//
// One UCP context + worker per fabric ("ucx:tcp", "ucx:posix,cma",
// "ucx:all"; the spec is UCX_TLS of that context). The worker is created at
// the first connection, not at Open, so that processes forked before any
// endpoint exists start with clean UCX state (UCX's async thread does not
// survive fork; see ForkGuard).
//
// Connections: a plain TCP socket per connection carries the handshake
// (worker addresses, endpoint ids, the probe for shared memory) and then
// stays open as the liveness signal; endpoints are ucp_ep_create'd from the
// exchanged worker addresses with peer-failure error handling. (UCP's own
// sockaddr listener cannot be used: its connection manager runs on UCX's
// async thread, so it hangs in forked children, and in UCX 1.13 it cannot
// connect shared-memory-only contexts at all.) When shared memory cannot
// reach a peer (another user, ptrace policy, another host) the endpoint
// falls back to a second, tcp-only context and says so in its notes.
//
// Two-sided messages: ucp_tag_send_nbx / ucp_tag_recv_nbx with a tag naming
// the receiving endpoint (id + secret exchanged at connect; tag matching is
// per worker). Control messages use the same ids with the control bit and
// are probed by progress (after an arrival, once per coarse tick, before
// sleeping), so a user message waiting for a receive never blocks them.
// Completions are reported in posting order.
//
// One-sided operations: on ordinary memory UCX 1.13 has no transport RMA on
// these transports, only its software emulation, which writes wherever the
// peer says without any key check; zsock uses core emulation there (the
// target checks every access against its registration table). On memory
// from AllocateRegistered (posix shared memory) RMA and atomics are native
// UCP operations, checked first against the target's key table, which the
// initiator maps through ucp_rkey_ptr (the unet pin protocol).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <time.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <source_location>
#include <unordered_set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/accept.h"
#include "core/clock.h"
#include "core/fd.h"
#include "core/flow_window.h"
#include "core/keyslot.h"
#include "core/log.h"
#include "core/mutex.h"
#include "core/provider.h"
#include "core/status.h"
#include "providers/ucx/bootstrap_io.h"
#include "providers/ucx/context.h"
#include "providers/ucx/hello.h"
#include "providers/ucx/key_table.h"
#include "providers/ucx/options.h"
#include "providers/ucx/peer_probe.h"
#include "providers/ucx/socket_address.h"
#include "providers/ucx/ucs_error.h"
#include "providers/ucx/worker_lock.h"

namespace zsock::ucx {
namespace {

constexpr size_t kMaxMessage = size_t{1} << 30;
// Capabilities::inject_size: UCX's eager-short limit on shared memory (UCX
// 1.13's posix FIFO elements are 128 bytes; `ucp_ep_print_info` shows
// "0..<egr/short>..93"; tcp's is larger). UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL
// succeeds only on that short path: a longer injected send would always
// take the copy (an Op, a request, a callback), costlier than an ordinary
// send.
constexpr size_t kInjectSize = 92;
// Flow control. An endpoint hands UCX at most Settings::flow_window user
// sends (option flow_window, default 1024; 0: no limit) beyond what the
// peer has reported consumed. UCP completes an eager send once the message
// is out of the sender's hands, and the receiver's UCP keeps every message
// that arrives before its receive is posted on its unexpected queue,
// without bound and without telling the sender: 4,000,000 sends of 8 bytes
// to a peer that posted nothing cost 750 MB over tcp and over shared memory
// alike (the posix FIFO bounds only what is in flight, not what the
// receiver copies out of it). With the window the peer holds
// at most this many such messages, and later sends wait on the sender's
// side (EpCore::held) until the peer reports it has received more. The
// counters and the report's record are core's (core/flow_window.h).

// The fabric's own record of a registration. The key table may be mapped by
// peers (ucp_rkey_ptr on shared memory) and so written by them; decisions
// about this process's memory (emulated accesses) use only this copy.
struct PrivateSlot {
  std::atomic<uint32_t> gen{0};     // odd while live
  std::atomic<uint32_t> active{0};  // local emulated accesses in progress
  uint64_t addr = 0;
  uint64_t len = 0;
  uint32_t access = 0;
};

// ---------------------------------------------------------------- UCX objects

class UcxFabric;
class UcxCq;
class UcxEndpoint;
struct EpCore;

// A control message received for an endpoint, in arrival order.
class Worker;

struct ControlIn {
  std::vector<uint8_t> data;
  bool done = false;
  bool ok = true;
  bool handled = false;  // a flow-control report, taken by the provider
};

// One UCX operation in flight. Callbacks run inside the ucp_* calls zsock
// makes while holding the worker's mutex.
struct Op {
  enum class Kind {
    kUserSend,
    kUserRecv,
    kInjectSend,  // an injected user send UCX could not finish in the call: owns a copy
    kControlSend,
    kControlRecv,
    kNative,
    kDiscard
  };
  Kind kind;
  // The connection; null for kDiscard and stray control messages. A user
  // send or receive in its endpoint's queue (EpCore::sends / recvs) needs
  // no reference: the endpoint flushes its queues before it lets go of its
  // core (Close, FailRemainingLocked). Copying the shared_ptr there cost
  // two locked read-modify-writes per message. Every op that leaves a
  // queue while UCX still owns it (an orphan), and every other kind,
  // holds `keep`.
  EpCore* core = nullptr;
  std::shared_ptr<EpCore> keep;
  Worker* worker = nullptr;      // kControlRecv / kDiscard: tracked by this worker
  OpType op = OpType::kSend;
  uint64_t context = 0;
  size_t length = 0;
  void* request = nullptr;
  // A user receive's request memory, from its core's worker's pool
  // (Worker::TakeRequestLocked), until its callback.
  void* own_request = nullptr;
  bool ucx_busy = false;   // UCX still owns `request`
  bool posting = false;    // inside the ucp_*_nbx call that started it
  bool completed = false;  // UCX reported completion (ucx_status, info)
  ucs_status_t ucx_status = UCS_OK;
  bool done = false;
  bool reported = false;  // completion delivered (maybe before UCX finished)
  absl::Status status;
  ucp_tag_recv_info_t info{};
  std::vector<uint8_t> owned;  // control or injected payload, or discard buffer
  const void* buf = nullptr;   // a user send held for the window (EpCore::held): its data
  std::shared_ptr<ControlIn> control_in;
  KeySlot* pinned = nullptr;   // native: target's key slot while accessing
  uint64_t* result = nullptr;  // native atomics: where the old value goes
  uint64_t value = 0;          // native atomics: addend / compare value
  uint64_t reply = 0;          // native atomics: swap value in, old value out
  bool used = false;           // in Worker's free list, not yet Recycle()d

  // Back to the state of a new Op of the same kind, for Worker's free list
  // (user sends and receives, control receives). Field by field: `*this = Op{kind}` built,
  // moved and destroyed a whole Op, a tenth of a 64-byte ping-pong's
  // one-way time over shared memory.
  void Recycle() {
    core = nullptr;
    if (keep != nullptr) keep.reset();
    worker = nullptr;
    op = OpType::kSend;
    context = 0;
    length = 0;
    request = nullptr;
    own_request = nullptr;
    ucx_busy = posting = completed = done = reported = false;
    ucx_status = UCS_OK;
    if (!status.ok()) status = absl::OkStatus();
    info = {};
    owned.clear();
    buf = nullptr;
    control_in.reset();
    pinned = nullptr;
    result = nullptr;
    value = reply = 0;
  }
};

// Parsed from ucp_ep_print_info: "lane[1]:  0:posix/memory.0 md[0] -> ... amo#0 am".
struct Lane {
  std::string transport;  // "posix/memory", "tcp/lo"
  std::vector<std::string> uses;
};

std::vector<Lane> ParseLanes(const std::string& text) {
  std::vector<Lane> lanes;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.find("lane[") == absl::string_view::npos) continue;
    std::vector<absl::string_view> tok = absl::StrSplit(line, ' ', absl::SkipEmpty());
    size_t i = 0;
    while (i < tok.size() && !absl::StartsWith(tok[i], "lane[")) ++i;
    if (i + 1 >= tok.size()) continue;
    Lane lane;
    absl::string_view t = tok[i + 1];
    if (size_t c = t.find(':'); c != absl::string_view::npos) t = t.substr(c + 1);
    if (size_t d = t.rfind('.'); d != absl::string_view::npos && t.find('/') < d) {
      t = t.substr(0, d);
    }
    lane.transport = std::string(t);
    size_t arrow = i + 2;
    while (arrow < tok.size() && tok[arrow] != "->") ++arrow;
    for (size_t k = arrow + 2; k < tok.size(); ++k) {
      absl::string_view u = tok[k];
      if (size_t h = u.find('#'); h != absl::string_view::npos) u = u.substr(0, h);
      lane.uses.emplace_back(u);
    }
    lanes.push_back(std::move(lane));
  }
  return lanes;
}

constexpr uint64_t kControlBit = 1;  // the tag's channel bit
uint64_t MakeTag(uint32_t id, uint32_t secret, bool control) {
  return (uint64_t{id} << 32) | (uint64_t{secret & 0x7fffffffu} << 1) | (control ? kControlBit : 0);
}
constexpr uint64_t kFullMask = ~uint64_t{0};
// Workers with more endpoints than this find control messages by the
// control bit alone (Worker::DrainControlLocked).
constexpr size_t kExactProbeMax = 16;
// A busy poll that handled no arrival still probes the control tags this
// often.
constexpr int64_t kProbeIntervalNs = 1000 * 1000;

// Runs the ucp_*_nbx call that starts `op`. UCX may complete the operation
// at once (NULL), fail it at once (an error pointer: returned here, `op` is
// untouched and still the caller's), or return a request whose callback
// comes later -- or, with UCP_OP_ATTR_FLAG_NO_IMM_CMPL, already ran inside
// the call (so the request is freed and must not be touched). Afterwards
// either op->completed is set (the caller settles it) or UCX owns it.
template <typename Call>
ucs_status_t Submit(Op* op, Call call) {
  op->posting = true;
  void* req = call();
  op->posting = false;
  if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
  if (req == nullptr) {
    op->completed = true;
    op->ucx_status = UCS_OK;
  } else if (!op->completed) {
    op->request = req;
    op->ucx_busy = true;
  }
  return UCS_OK;
}

struct Op;
void SettleLocked(Op* op);
void NoteConsumedLocked(EpCore* c);
void OnSend(void* request, ucs_status_t status, void* user_data);
void OnRecv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
            void* user_data);
void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status);

// Progresses `worker` (its lock held) until `done()` holds or `bound`
// passes; returns done(). For the bounded waits on UCX at a close.
bool ProgressUntil(ucp_worker_h worker, absl::FunctionRef<bool()> done, absl::Duration bound) {
  const absl::Time deadline = absl::Now() + bound;
  while (!done() && absl::Now() < deadline) ucp_worker_progress(worker);
  return done();
}

// A UCP worker shared by every endpoint and CQ of a fabric (two, when a
// tcp fallback is in use). Every ucp_* call on it is made under `mu`
// (UCS_THREAD_MODE_SERIALIZED).
class Worker {
 public:
  static absl::StatusOr<std::unique_ptr<Worker>> Create(std::shared_ptr<Context> ctx,
                                                        std::string name, bool serialized) {
    if (auto st = ForkGuard::Get().Check(); !st.ok()) return st;
    ucp_worker_params_t params{};
    params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    ucp_worker_h handle = nullptr;
    ucs_status_t st = ucp_worker_create(ctx->handle(), &params, &handle);
    if (st != UCS_OK) {
      return UcsError(st, "creating a UCX worker failed", "raise the fd limit (ulimit -n)");
    }
    int efd = -1;
    st = ucp_worker_get_efd(handle, &efd);
    if (st != UCS_OK) {
      ucp_worker_destroy(handle);
      return UcsError(st, "UCX gave no wakeup fd for its worker");
    }
    ForkGuard::Get().Add();
    return std::unique_ptr<Worker>(
        new Worker(std::move(ctx), handle, efd, std::move(name), serialized));
  }

  ~Worker() {
    {
      WorkerLock lock(&mu);
      // Requests UCX has not finished yet (matched control receives, ...).
      for (int i = 0; i < 1000 && !busy_.empty(); ++i) ucp_worker_progress(worker_);
    }
    ucp_worker_destroy(worker_);
    // What UCX never completed (docs/ucx.md: requests stuck after some peer
    // deaths) can no longer call back.
    WorkerLock lock(&mu);
    for (Op* op : busy_) delete op;
    busy_.clear();
    for (size_t i = 0; i < nfree_; ++i) delete free_ops_[i];
    nfree_ = 0;
    ForkGuard::Get().Remove();
  }

  ucp_worker_h handle() const { return worker_; }
  int efd() const { return efd_; }
  bool rma() const { return ctx_->rma(); }
  const Context& context() const { return *ctx_; }
  const std::string& name() const { return name_; }

  absl::StatusOr<std::string> Address() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    ucs_status_t st = ucp_worker_get_address(worker_, &addr, &len);
    if (st != UCS_OK) return UcsError(st, "UCX gave no worker address");
    std::string out(reinterpret_cast<const char*>(addr), len);
    ucp_worker_release_address(worker_, addr);
    return out;
  }

  absl::StatusOr<ucp_ep_h> CreateEp(const std::string& address, EpCore* core)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(address.data());
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = OnEpError;
    params.err_handler.arg = core;
    ucp_ep_h ep = nullptr;
    ucs_status_t st = ucp_ep_create(worker_, &params, &ep);
    if (st != UCS_OK) {
      return UcsError(st, absl::StrCat("UCX could not create an endpoint to the peer over '",
                                       absl::StrJoin(ctx_->transports(), ","), "'"),
                      "ucx_info -d shows the transports; the peer must share one with us");
    }
    return ep;
  }

  // Releases `ep` at once (outstanding operations fail with UCS_ERR_CANCELED).
  void CloseEpLocked(ucp_ep_h ep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    params.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* req = ucp_ep_close_nbx(ep, &params);
    if (req == nullptr || UCS_PTR_IS_ERR(req)) return;
    if (!ProgressUntil(
            worker_, [req] { return ucp_request_check_status(req) != UCS_INPROGRESS; },
            absl::Seconds(2))) {
      ZS_LOG(kWarn, "UCX did not finish closing an endpoint within 2 s; leaving it");
      return;
    }
    ucp_request_free(req);
  }

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
  Arm ArmLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!inline_done_.empty()) return Arm::kPending;  // the next progress reports them
    // An unprobed control message does not keep UCX busy: look before sleeping.
    if (DrainControlLocked(CoarseNowNs()) > 0) return Arm::kPending;
    if (control_backlog_ || !failed_.empty() || !flow_due_.empty()) return Arm::kPending;
    ucs_status_t st = ucp_worker_arm(worker_);
    if (st == UCS_OK) return Arm::kArmed;
    if (st != UCS_ERR_BUSY) {
      ZS_LOG(kWarn, "ucp_worker_arm failed: %s", ucs_status_string(st));
    }
    return last_progress_ == 0 ? Arm::kBusyIdle : Arm::kPending;
  }

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
  [[gnu::noinline]] static void DropShared(Op* op) {
    op->keep.reset();
    op->control_in.reset();
  }
  [[gnu::noinline]] static void DeleteOp(Op* op) { delete op; }
  void FreeOpLocked(Op* op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    // (The cold paths are calls: inline, an Op's destructor gave this,
    // called for every finished receive, a frame of five saved registers.)
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
  // caller. Reporting it at once from Send took the CQ's own lock and
  // queue, and that poll a second lock: a tenth of a 64-byte ping-pong.
  // Wakes the CQ's sleeper: its ArmLocked, under this mutex, either saw
  // the entry or set armed_ before we look.
  void DeferInlineLocked(UcxCq* cq, Completion c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

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
  // the end of a PostRecv), never from inside a UCX callback.
  void QueueFlowLocked(EpCore* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
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
  // TakeRequestLocked's pool.
  [[gnu::noinline]] void* NewRequestLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const size_t size = ctx_->request_size();
    if (size == 0) return nullptr;
    // UCX's request sits right before the pointer it is given.
    request_blocks_.emplace_back(new (std::align_val_t{64}) std::byte[size]());
    return request_blocks_.back().get() + size;
  }
  struct AlignedDelete {
    void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::vector<std::unique_ptr<std::byte[], AlignedDelete>> request_blocks_ ABSL_GUARDED_BY(mu);
  std::vector<void*> free_requests_ ABSL_GUARDED_BY(mu);
  static constexpr size_t kMaxFreeOps = 64;
  // A fixed array, not a vector: a vector's growth path, inlined, gave
  // FreeOpLocked a frame of five saved registers.
  std::array<Op*, kMaxFreeOps> free_ops_ ABSL_GUARDED_BY(mu){};
  size_t nfree_ ABSL_GUARDED_BY(mu) = 0;
  std::vector<std::pair<UcxCq*, Completion>> inline_done_ ABSL_GUARDED_BY(mu);
  std::vector<std::shared_ptr<EpCore>> flow_due_ ABSL_GUARDED_BY(mu);  // QueueFlowLocked
};

// The completion queue: an epoll set (its wait_fd) holding the workers'
// wakeup fds, an eventfd for completions delivered from outside its own
// progress, and a nested epoll set of its endpoints' connection sockets.
class UcxCq final : public CompletionQueue {
 public:
  static absl::StatusOr<std::unique_ptr<UcxCq>> Create(UcxFabric* fabric);
  ~UcxCq() override;

  static constexpr int64_t kMinBackoffNs = 20 * 1000;
  static constexpr int64_t kMaxBackoffNs = 2 * 1000 * 1000;
  static constexpr int64_t kSocketCheckNs = 1000 * 1000;

  int wait_fd() const override { return epoll_.get(); }
  UcxFabric* fabric() const { return fabric_; }

  // Reports a completion; wakes a waiter unless this CQ is progressing on
  // this thread (its caller polls next anyway).
  void Deliver(Completion c);
  // An endpoint of this CQ has control messages or an emulation failure for
  // Service(): the next Progress looks (a busy poll with nothing noted
  // takes neither mu_ nor the endpoints' worker mutexes).
  void NoteService() { service_pending_.store(true, std::memory_order_release); }
  void WakeWaiter() {
    // Written once until Drain reads it (as core's Wake): every send that
    // finishes inside its call wakes a sleeping waiter.
    if (wake_pending_.load(std::memory_order_seq_cst)) return;
    wake_pending_.store(true, std::memory_order_seq_cst);
    uint64_t one = 1;
    ssize_t rc = ::write(event_.get(), &one, sizeof(one));
    (void)rc;  // EAGAIN: the counter is non-zero, the waiter wakes anyway
  }
  bool IsProgressingHere() const;
  void WatchWorker(int efd) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = efd;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, efd, &ev);
  }
  // A worker whose arm failed leaves its fd readable; while it has nothing
  // to progress, the CQ waits on its timer instead (see ArmProvider).
  void MuteWorker(int efd, bool mute) {
    epoll_event ev{};
    ev.events = mute ? 0u : static_cast<uint32_t>(EPOLLIN);
    ev.data.fd = efd;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, efd, &ev);
  }
  void Attach(UcxEndpoint* ep, int sock);
  void Detach(UcxEndpoint* ep, int sock);
  void Unwatch(int sock) { ::epoll_ctl(socks_.get(), EPOLL_CTL_DEL, sock, nullptr); }

 protected:
  size_t Progress() override;
  bool ArmProvider() override;
  // Progress's cold parts: a second worker (the tcp fallback), the sockets
  // and the endpoints' service.
  [[gnu::noinline]] size_t ProgressOtherLocked(Worker* w, int64_t now);
  [[gnu::noinline]] size_t LookAtSocketsAndEndpoints(int64_t now);
  void ClearWakeup() override {
    armed_.store(false, std::memory_order_seq_cst);
    check_socks_.store(true, std::memory_order_relaxed);
    polls_.store(0, std::memory_order_relaxed);  // a fresh clock for the wakeup's poll
    Drain();
  }
  void UnmuteAll() {
    MutexLock lock(&mute_mu_);
    for (int efd : muted_) MuteWorker(efd, false);
    muted_.clear();
  }
  // Makes wait_fd readable after `ns` (0: never).
  void SetTimer(int64_t ns) {
    itimerspec t{};
    t.it_value.tv_sec = ns / 1000000000;
    t.it_value.tv_nsec = ns % 1000000000;
    ::timerfd_settime(timer_.get(), 0, &t, nullptr);
  }

 private:
  UcxCq(UcxFabric* fabric, Fd epoll, Fd socks, Fd event, Fd timer, int idle_tries)
      : fabric_(fabric), epoll_(std::move(epoll)), socks_(std::move(socks)),
        event_(std::move(event)), timer_(std::move(timer)), idle_tries_(idle_tries) {}
  // Reads, then clears wake_pending_ (core's DrainWake says why that order).
  void Drain() {
    uint64_t v;
    while (::read(event_.get(), &v, sizeof(v)) == sizeof(v)) {
    }
    wake_pending_.store(false, std::memory_order_seq_cst);
    while (::read(timer_.get(), &v, sizeof(v)) == sizeof(v)) {
    }
  }

  UcxFabric* fabric_;
  Fd epoll_;
  Fd socks_;
  Fd event_;
  Fd timer_;  // backoff while UCX is busy with nothing to progress
  std::atomic<int64_t> backoff_ns_{kMinBackoffNs};
  Mutex mute_mu_;
  std::vector<int> muted_ ABSL_GUARDED_BY(mute_mu_);  // worker fds taken out of epoll_
  std::atomic<bool> wake_pending_{false};  // event_ written, not yet drained
  std::atomic<bool> pushed_{false};  // delivered from outside Progress since it ran
  std::atomic<bool> armed_{false};   // a waiter may sleep on wait_fd
  std::atomic<bool> check_socks_{true};  // look at the sockets in the next Progress
  std::atomic<bool> service_pending_{true};  // NoteService
  std::atomic<int64_t> last_sock_check_{0};
  static constexpr uint32_t kClockPolls = 8;
  // ucp_worker_progress calls per Progress while nothing turns up, on a
  // shared-memory-only fabric. A busy poller sees a message as soon as the
  // call after its arrival looks, and zsock's own part of a poll (core's
  // Poll, this Progress, the worker lock: about 12 ns of an idle poll's
  // 17) came between every two looks; with 4 tries they come once per
  // four (an idle poll 17 -> 29 ns, a look every 7 ns). A/B within one run
  // (blocks of 1000 round trips alternating, docs/ucx.md "Numbers"):
  // 64-byte one-way over shared memory 3.4 ns shorter with 4, 2.5 with 2,
  // 3.5 with 8, 1.7 longer with 16 (an idle poll of 70 ns). One try where
  // tcp is in the worker: its progress is an epoll_wait call (an idle poll
  // 182 ns; 4 tries made it 635), beside which zsock's part is nothing.
  static constexpr int kIdleTries = 4;
  const int idle_tries_;
  std::atomic<uint32_t> polls_{0};    // Progress calls (Progress: the clock's reads)
  std::atomic<int64_t> now_ns_{0};    // the coarse clock when last read
  Mutex mu_;
  std::vector<UcxEndpoint*> endpoints_ ABSL_GUARDED_BY(mu_);
};

thread_local const UcxCq* t_progressing = nullptr;

bool UcxCq::IsProgressingHere() const { return t_progressing == this; }

void UcxCq::Deliver(Completion c) {
  Push(std::move(c));
  if (!IsProgressingHere()) {
    // Dekker with ArmProvider: either it sees pushed_ or we see armed_.
    pushed_.store(true, std::memory_order_seq_cst);
    if (armed_.load(std::memory_order_seq_cst)) WakeWaiter();
  }
}

// The state of one connection that UCX callbacks reach; guarded by the
// worker's mutex. It outlives the endpoint object while UCX still owns
// requests that point to it.
struct EpCore : std::enable_shared_from_this<EpCore> {
  Worker* worker = nullptr;
  UcxCq* cq = nullptr;
  Endpoint* ep = nullptr;  // null once the endpoint object is gone
  uint32_t local_id = 0;
  uint32_t local_secret = 0;
  uint32_t peer_id = 0;
  uint32_t peer_secret = 0;
  uint32_t peer_pid = 0;
  ucp_ep_h uep = nullptr;
  bool closed = false;
  bool dead = false;
  absl::Status dead_status;
  bool fail_emulated = false;  // FailEmulated still to be called
  std::deque<Op*> sends;       // user sends, in posting order
  std::deque<Op*> recvs;       // user receives, in posting order
  std::unordered_set<Op*> others;   // control sends and native operations
  std::deque<std::shared_ptr<ControlIn>> control;
  // Native RMA: the peer's key table, mapped through ucp_rkey_ptr.
  bool native = false;
  ucp_rkey_h table_rkey = nullptr;
  KeySlot* peer_table = nullptr;
  size_t peer_slots = 0;
  absl::flat_hash_map<uint32_t, std::pair<uint32_t, ucp_rkey_h>> rkeys;  // slot -> (gen, rkey)
  // Flow control (Settings::flow_window; started at the handshake). User
  // messages (sends and injected sends) beyond the window wait in `held`,
  // in order (user sends are also in `sends`, injected copies in `others`).
  FlowWindow flow;
  uint64_t user_received = 0;  // the peer's user messages our receives consumed
  bool flow_queued = false;    // in the worker's flow_due_ list
  std::deque<Op*> held;

  // Whether a new user send must wait behind the window.
  bool MustHold() const { return flow.on() && (!held.empty() || !flow.open()); }

  uint64_t RecvTag(bool control) const { return MakeTag(local_id, local_secret, control); }
  uint64_t SendTag(bool control) const { return MakeTag(peer_id, peer_secret, control); }
};

absl::Status ClosedError() {
  return MakeError(absl::StatusCode::kFailedPrecondition, ENOTCONN,
                   "operation on a closed ucx endpoint", "connect a new endpoint");
}

absl::Status ClosedCancel() {
  return MakeError(absl::StatusCode::kCancelled, ECANCELED, "the ucx endpoint was closed", "");
}

// The status of a finished UCX operation of `c`.
absl::Status OpStatus(EpCore* c, ucs_status_t st, OpType op) {
  if (st == UCS_OK) return absl::OkStatus();
  if (st == UCS_ERR_MESSAGE_TRUNCATED) {
    return MakeError(absl::StatusCode::kOutOfRange, EMSGSIZE,
                     "the message is longer than the posted receive; it was discarded",
                     "post receives as large as the largest message the peer sends");
  }
  if (c != nullptr && c->closed && !c->dead) return ClosedCancel();
  if (c != nullptr && c->dead) return c->dead_status;
  return UcsError(st, absl::StrCat("ucx ", OpTypeName(op), " failed"));
}

void ReportLocked(EpCore* c, Op* op) {
  op->reported = true;
  if (c->ep == nullptr || c->cq == nullptr) return;
  c->worker->ReportInlineLocked();  // earlier sends first
  Completion comp;
  comp.context = op->context;
  comp.op = op->op;
  comp.length = op->status.ok() ? op->length : 0;
  comp.endpoint = c->ep;
  comp.status = op->status;
  c->cq->Deliver(std::move(comp));
}

// Reports finished operations at the front of `q`, in posting order.
void FlushLocked(EpCore* c, std::deque<Op*>* q) {
  while (!q->empty() && q->front()->done) {
    Op* op = q->front();
    q->pop_front();
    ReportLocked(c, op);
    if (op->ucx_busy) {
      if (op->keep == nullptr) op->keep = c->shared_from_this();  // an orphan now
      c->worker->Track(op);  // reported; UCX still owns the request
    } else {
      c->worker->FreeOpLocked(op);
    }
  }
}

// Marks every unfinished operation of `c` failed with `why`; UCX keeps the
// requests it still owns (their callbacks only free them).
void FailRemainingLocked(EpCore* c, const absl::Status& why) {
  // Held sends were never given to UCX: user sends fail below with the
  // rest of the queue; injected copies just go.
  for (Op* op : c->held) {
    if (op->kind == Op::Kind::kInjectSend) {
      c->others.erase(op);
      delete op;
    }
  }
  c->held.clear();
  c->worker->holding.erase(c);
  for (std::deque<Op*>* q : {&c->sends, &c->recvs}) {
    for (Op* op : *q) {
      if (!op->done) {
        op->done = true;
        op->status = why;
      }
    }
    FlushLocked(c, q);
  }
  std::vector<Op*> others(c->others.begin(), c->others.end());
  for (Op* op : others) {
    if (op->kind != Op::Kind::kNative || op->reported) continue;
    op->status = why;
    if (op->pinned != nullptr) {
      Unpin(op->pinned);
      op->pinned = nullptr;
    }
    ReportLocked(c, op);
    c->others.erase(op);
    c->worker->Track(op);
  }
}

void ReleaseRkeysLocked(EpCore* c) {
  for (auto& [slot, entry] : c->rkeys) ucp_rkey_destroy(entry.second);
  c->rkeys.clear();
  if (c->table_rkey != nullptr) ucp_rkey_destroy(c->table_rkey);
  c->table_rkey = nullptr;
  c->peer_table = nullptr;
  c->native = false;
}

void CancelRecvsLocked(Worker* w, EpCore* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu) {
  std::vector<void*> reqs;
  for (Op* op : c->recvs) {
    if (!op->done && op->ucx_busy) reqs.push_back(op->request);
  }
  // Cancelling completes expected receives at once (callback included);
  // receives UCX has already matched are left to finish or fail.
  for (void* req : reqs) ucp_request_cancel(w->handle(), req);
}

// Receives that UCX matched before the cancel (a rendezvous under way)
// still write into their buffers, which the caller frees once Close
// returns (the SDP engine's receive ring): progress until they finish,
// before the UCX endpoint goes (closing it first may strand the
// rendezvous), for at most 2 s, as CloseEpLocked. Found by a socket closed
// while the peer's large message was arriving (zsock_test
// CloseRacesCallsInOtherThreads on ucx: a write into the unmapped ring).
void FinishMatchedRecvsLocked(Worker* w, EpCore* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu) {
  const auto busy = [c] {
    for (const Op* op : c->recvs) {
      if (op->ucx_busy) return true;
    }
    return false;
  };
  if (!ProgressUntil(w->handle(), [&] { return !busy(); }, absl::Seconds(2))) {
    ZS_LOG(kWarn,
           "a receive UCX had matched did not finish within 2 s of its endpoint's close "
           "(the peer stalled mid-rendezvous); its buffer may still be written");
  }
}

void CloseUcpEpLocked(Worker* w, EpCore* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu) {
  if (c->uep == nullptr) return;
  ReleaseRkeysLocked(c);
  ucp_ep_h ep = c->uep;
  c->uep = nullptr;
  w->CloseEpLocked(ep);
}

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
  // idle busy poll (a tenth of its cost), but at least once per coarse tick
  // (UCX may also progress inside other calls, and a stream keeps finding
  // something), and always before arming (ArmLocked).
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

size_t Worker::FailReportedLocked() {
  size_t n = 0;
  while (!failed_.empty()) {
    auto [core, st] = failed_.back();
    failed_.pop_back();
    FailLocked(core.get(),
               UcsError(st,
                        absl::StrCat("UCX reported the connection to pid ", core->peer_pid,
                                     " failed"),
                        "reconnect; data the peer sent before it failed was delivered"));
    ++n;
  }
  return n;
}

void Worker::DeferInlineLocked(UcxCq* cq, Completion c) {
  inline_done_.emplace_back(cq, std::move(c));
  // Core's wake-up (its armed_ is set before ArmProvider takes this mutex
  // to look at inline_done_), deduplicated by core; not only the CQ's own
  // armed_, which any thread's ClearWakeup resets while another sleeps.
  cq->WakeSleeper();
}

size_t Worker::ReportInlineSlowLocked() {
  // Deliver only queues or hands over (no call back into the worker), and
  // clear keeps the vector's capacity for the next batch.
  // A send's completion for the CQ whose Poll runs this (a ping-pong's
  // every send) goes straight into Poll's output, without Deliver's Push
  // and its two moves of the Completion.
  const size_t n = inline_done_.size();
  for (auto& [cq, c] : inline_done_) {
    if (Completion* slot = cq->DirectSlot(); slot != nullptr) {
      *slot = std::move(c);
    } else {
      cq->Deliver(std::move(c));
    }
  }
  inline_done_.clear();
  return n;
}

// Receives the control messages waiting for each endpoint. Probing each
// endpoint's exact tag keeps this cheap: UCX finds fully masked tags by
// hash, while a wildcard probe scans every unexpected message (user
// messages nobody has posted a receive for yet included).
size_t Worker::DrainControlLocked(int64_t now) {
  size_t n = 0;
  control_backlog_ = false;
  probe_due_ = false;
  last_probe_ns_ = now;
  // Few endpoints: each one's exact control tag (a hash lookup in UCX).
  // Many: one probe for the control bit, which walks UCX's unexpected
  // messages instead (user messages no receive has taken yet, which flow
  // control bounds): a sweep of 500 endpoints cost 13 us after every
  // progress that found something.
  if (eps.size() > kExactProbeMax) return DrainAnyLocked();
  for (auto& [id, core] : eps) {
    if (!core->closed) n += DrainCoreLocked(core);
  }
  return n;
}

size_t Worker::DrainHoldingLocked() {
  // Walks a copy: what draining settles must be free to change the set.
  absl::InlinedVector<EpCore*, 8> cores(holding.begin(), holding.end());
  size_t n = 0;
  for (EpCore* c : cores) {
    if (!c->closed) n += DrainCoreLocked(c->shared_from_this());
  }
  return n;
}

size_t Worker::DrainCoreLocked(const std::shared_ptr<EpCore>& core) {
  size_t n = 0;
  for (int i = 0;; ++i) {
    if (i == 64) {
      control_backlog_ = true;  // more next time; Arm reports pending
      break;
    }
    ucp_tag_recv_info_t info{};
    ucp_tag_message_h msg =
        ucp_tag_probe_nb(worker_, core->RecvTag(true), kFullMask, 1, &info);
    if (msg == nullptr) break;
    ++n;
    TakeControlLocked(core, msg, info);
  }
  return n;
}

size_t Worker::DrainAnyLocked() {
  size_t n = 0;
  for (int i = 0;; ++i) {
    if (i == 256) {
      control_backlog_ = true;  // more next time; Arm reports pending
      break;
    }
    ucp_tag_recv_info_t info{};
    ucp_tag_message_h msg = ucp_tag_probe_nb(worker_, 1, kControlBit, 1, &info);
    if (msg == nullptr) break;
    ++n;
    auto it = eps.find(static_cast<uint32_t>(info.sender_tag >> 32));
    if (it != eps.end() && !it->second->closed && it->second->RecvTag(true) == info.sender_tag) {
      TakeControlLocked(it->second, msg, info);
      continue;
    }
    // For an endpoint that is closed or gone (or a wrong secret): dropped.
    auto* op = new Op{Op::Kind::kDiscard};
    op->worker = this;
    op->owned.resize(info.length);
    ReceiveProbedLocked(op, msg, op->owned.data(), op->owned.size());
  }
  return n;
}

void Worker::TakeControlLocked(const std::shared_ptr<EpCore>& core, ucp_tag_message_h msg,
                               const ucp_tag_recv_info_t& info) {
  // Into an Op of the free list: UCX finishes an eager message that is
  // already here inside the call, and a flow report (every quarter of a
  // stream's window) is then taken at once, with no ControlIn, tracking
  // or allocation.
  Op* op = NewOpLocked(Op::Kind::kControlRecv);
  op->owned.resize(info.length);
  StartProbedLocked(op, msg, op->owned.data(), op->owned.size());
  if (uint64_t consumed = 0; op->completed && op->ucx_status == UCS_OK &&
                             DecodeRecord(op->owned, kFlowReportMarker, &consumed)) {
    core->flow.PeerReported(consumed);
    if (!core->held.empty()) QueueFlowLocked(core.get());
    FreeOpLocked(op);
    return;
  }
  // Anything else goes to the endpoint (Service), in arrival order.
  auto in = std::make_shared<ControlIn>();
  core->control.push_back(in);
  op->core = core.get();
  op->keep = core;
  op->worker = this;
  op->control_in = std::move(in);
  if (core->cq != nullptr) core->cq->NoteService();
  if (op->completed) {
    SettleLocked(op);
  } else {
    Track(op);
  }
  if (!core->control.empty() && core->cq != nullptr && !core->cq->IsProgressingHere()) {
    core->cq->WakeWaiter();
  }
}

void Worker::MarkUcxFailedLocked(EpCore* c, ucs_status_t st) {
  auto it = eps.find(c->local_id);
  if (it == eps.end()) return;
  failed_.emplace_back(it->second, st);
}

void Worker::FailLocked(EpCore* c, const absl::Status& why) {
  if (!c->closed && !c->dead) {
    c->dead = true;
    c->dead_status = why;
    c->fail_emulated = true;
    if (c->cq != nullptr) c->cq->NoteService();
    // Deliver what the peer sent before it went away.
    for (int i = 0; i < 256 && ucp_worker_progress(worker_) > 0; ++i) {
    }
    DrainControlLocked(CoarseNowNs());
  }
  CancelRecvsLocked(this, c);
  CloseUcpEpLocked(this, c);
  FailRemainingLocked(c, c->closed ? ClosedCancel() : c->dead_status);
  if (c->cq != nullptr && !c->cq->IsProgressingHere()) c->cq->WakeWaiter();
}

void Worker::DiscardMessagesLocked(uint64_t tag) {
  for (int i = 0; i < 4096; ++i) {
    ucp_tag_recv_info_t info{};
    ucp_tag_message_h msg = ucp_tag_probe_nb(worker_, tag, kFullMask, 1, &info);
    if (msg == nullptr) return;
    auto* op = new Op{Op::Kind::kDiscard};
    op->worker = this;
    op->owned.resize(info.length);
    ReceiveProbedLocked(op, msg, op->owned.data(), op->owned.size());
  }
}

void Worker::StartProbedLocked(Op* op, ucp_tag_message_h msg, void* buf, size_t len) {
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_RECV_INFO;
  p.cb.recv = OnRecv;
  p.user_data = op;
  p.recv_info.tag_info = &op->info;
  ucs_status_t st = Submit(op, [&] { return ucp_tag_msg_recv_nbx(worker_, buf, len, msg, &p); });
  if (st != UCS_OK) {
    op->completed = true;
    op->ucx_status = st;
  }
}

void Worker::ReceiveProbedLocked(Op* op, ucp_tag_message_h msg, void* buf, size_t len) {
  StartProbedLocked(op, msg, buf, len);
  if (op->completed) {
    SettleLocked(op);
  } else {
    Track(op);
  }
}

// Finishes an operation UCX completed (op->completed), after its
// ucp_*_nbx call returned. Out of line: OnRecv's direct path (a
// ping-pong's every receive) must not carry its frame.
[[gnu::noinline]] void SettleLocked(Op* op) {
  EpCore* c = op->core;
  const ucs_status_t st = op->ucx_status;
  if (op->reported) {  // an orphan: its completion went out already
    if (c != nullptr) c->worker->Untrack(op);
    delete op;
    return;
  }
  switch (op->kind) {
    case Op::Kind::kUserSend:
    case Op::Kind::kUserRecv:
      op->done = true;
      op->status = OpStatus(c, st, op->op);
      if (op->kind == Op::Kind::kUserRecv && st == UCS_OK) op->length = op->info.length;
      // A truncated message was consumed too (UCX discards the rest).
      if (op->kind == Op::Kind::kUserRecv && (st == UCS_OK || st == UCS_ERR_MESSAGE_TRUNCATED)) {
        NoteConsumedLocked(c);
      }
      FlushLocked(c, op->kind == Op::Kind::kUserSend ? &c->sends : &c->recvs);
      return;
    case Op::Kind::kInjectSend:
    case Op::Kind::kControlSend:
      // No completion: an injected send's failure shows as the endpoint's
      // (the error handler marks it dead), as the contract says.
      if (st != UCS_OK && c != nullptr && !c->dead && !c->closed) {
        ZS_LOG(kDebug, "a ucx %s message was not delivered: %s",
               op->kind == Op::Kind::kInjectSend ? "injected" : "control", ucs_status_string(st));
      }
      if (c != nullptr) c->others.erase(op);
      delete op;
      return;
    case Op::Kind::kControlRecv:
      op->control_in->data = std::move(op->owned);  // TakeControlLocked's buffer
      op->control_in->done = true;
      op->control_in->ok = (st == UCS_OK);
      if (uint64_t consumed = 0;
          st == UCS_OK && c != nullptr &&
          DecodeRecord(op->control_in->data, kFlowReportMarker, &consumed)) {
        op->control_in->handled = true;  // the peer's flow report
        c->flow.PeerReported(consumed);
        if (!c->held.empty()) c->worker->QueueFlowLocked(c);
      }
      if (c != nullptr && c->cq != nullptr) c->cq->NoteService();
      op->worker->Untrack(op);
      if (c != nullptr && c->cq != nullptr && !c->cq->IsProgressingHere()) c->cq->WakeWaiter();
      delete op;
      return;
    case Op::Kind::kNative:
      if (op->pinned != nullptr) Unpin(op->pinned);
      op->pinned = nullptr;
      if (st == UCS_OK && op->result != nullptr) *op->result = op->reply;
      op->status = OpStatus(c, st, op->op);
      c->others.erase(op);
      ReportLocked(c, op);
      delete op;
      return;
    case Op::Kind::kDiscard:
      op->worker->Untrack(op);
      delete op;
      return;
  }
}

// A user receive that finished first in its endpoint's queue, while the
// thread polls its CQ with nothing queued (a ping-pong's every message):
// written straight into Poll's output and the Op recycled, without the
// Settle / Flush / Report chain and its Completion moves. False when any
// of that does not hold; the caller then takes the ordinary path.
bool ReportRecvDirectLocked(Op* op, const ucp_tag_recv_info_t& info) {
  if (op->kind != Op::Kind::kUserRecv || op->reported) return false;
  EpCore* c = op->core;
  if (c == nullptr || c->ep == nullptr || c->cq == nullptr || c->recvs.empty() ||
      c->recvs.front() != op || c->worker->HasInlineLocked()) {
    return false;
  }
  // A later receive that finished first is flushed with this one. (An
  // iterator step, not size() and an index: a deque's are a dozen
  // instructions each, on a ping-pong's every receive.)
  if (auto next = std::next(c->recvs.begin()); next != c->recvs.end() && (*next)->done) {
    return false;
  }
  Completion* slot = c->cq->DirectSlot();
  if (slot == nullptr) return false;
  c->recvs.pop_front();
  NoteConsumedLocked(c);
  slot->context = op->context;
  slot->op = OpType::kRecv;
  slot->length = info.length;
  slot->endpoint = c->ep;
  slot->status = absl::OkStatus();
  c->worker->FreeOpLocked(op);
  return true;
}

void OnSend(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  op->ucx_busy = false;
  ucp_request_free(request);
  op->completed = true;
  op->ucx_status = status;
  if (!op->posting) SettleLocked(op);
}

void OnRecv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
            void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  op->ucx_busy = false;
  if (op->own_request != nullptr) {
    op->core->worker->GiveRequestLocked(op->own_request);  // (an orphan keeps its core)
    op->own_request = nullptr;
  } else {
    ucp_request_free(request);
  }
  if (status == UCS_OK && info != nullptr && !op->posting && ReportRecvDirectLocked(op, *info)) {
    return;
  }
  op->completed = true;
  op->ucx_status = status;
  if (info != nullptr) op->info = *info;
  if (!op->posting) SettleLocked(op);
}

void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* c = static_cast<EpCore*>(arg);
  c->worker->MarkUcxFailedLocked(c, status);
}

// ---------------------------------------------------------------- flow control

// Counts a message of the peer's that one of our receives consumed, and
// queues a report when one is due.
void NoteConsumedLocked(EpCore* c) {
  if (!c->flow.on()) return;
  if (c->flow.ReportDue(++c->user_received)) c->worker->QueueFlowLocked(c);
}

// Sends a copy of `msg` that reports no completion (kInjectSend on the
// user tag, kControlSend on the control tag): the Op owns the bytes and
// waits in EpCore::others until UCX finishes it.
[[gnu::noinline]] absl::Status SendCopyLocked(EpCore* c, Op::Kind kind,
                                              std::span<const uint8_t> msg,
                                              absl::string_view what) {
  auto* op = new Op{kind};
  op->core = c;
  op->keep = c->shared_from_this();
  op->owned.assign(msg.begin(), msg.end());
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = OnSend;
  p.user_data = op;
  c->others.insert(op);
  const uint64_t tag = c->SendTag(kind == Op::Kind::kControlSend);
  ucs_status_t st = Submit(
      op, [&] { return ucp_tag_send_nbx(c->uep, op->owned.data(), op->owned.size(), tag, &p); });
  if (st != UCS_OK) {
    c->others.erase(op);
    delete op;
    return UcsError(st, what);
  }
  if (kind == Op::Kind::kInjectSend) c->flow.Posted();
  if (op->completed) SettleLocked(op);
  return absl::OkStatus();
}

// The parameters of a send UCX must finish inside its call
// (UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL), built once: UCX reads only the fields
// op_attr_mask names, and zeroing the whole struct on every send was a
// dozen stores on a ping-pong reply's path.
constexpr ucp_request_param_t kImmediateParam = [] {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL;
  return p;
}();

[[gnu::noinline]] absl::Status SendNowSlowLocked(EpCore* c, Op::Kind kind,
                                                 std::span<const uint8_t> msg,
                                                 absl::string_view what, void* req);

// Sends `msg` without a completion (an injected send, or a control
// message such as a flow report) from the caller's buffer when UCX
// finishes it inside the call (UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL: the
// common case, a message on the transport's eager-short path while
// nothing is queued), else from a copy (SendCopyLocked). UCP keeps the
// endpoint's sends in order either way. A control message longer than
// inject_size (an emulated RMA's data) goes from a copy at once: UCX
// would not finish it in the call. Inlined: an injected send (a
// ping-pong's reply) then makes no call of zsock's before UCX's.
[[gnu::always_inline]] inline absl::Status SendNowLocked(EpCore* c, Op::Kind kind,
                                                         std::span<const uint8_t> msg,
                                                         absl::string_view what) {
  if (msg.size() > kInjectSize) [[unlikely]] return SendCopyLocked(c, kind, msg, what);
  const bool user = kind == Op::Kind::kInjectSend;
  void* req =
      ucp_tag_send_nbx(c->uep, msg.data(), msg.size(), c->SendTag(!user), &kImmediateParam);
  if (req != nullptr) [[unlikely]] return SendNowSlowLocked(c, kind, msg, what, req);
  if (user) c->flow.Posted();
  return absl::OkStatus();
}

// What UCX did not finish inside the call: a request (the flag ignored) or
// no room now (a copy goes instead).
absl::Status SendNowSlowLocked(EpCore* c, Op::Kind kind, std::span<const uint8_t> msg,
                               absl::string_view what, void* req) {
  const bool user = kind == Op::Kind::kInjectSend;
  if (!UCS_PTR_IS_ERR(req)) {
    if (user) c->flow.Posted();  // given to UCX, whatever becomes of it
    // UCX ignored the flag (1.13 does not): the buffer is still UCX's, so
    // wait, a bounded time; then cancel, and the send is lost like one to
    // a peer that failed.
    ucs_status_t st = UCS_INPROGRESS;
    ProgressUntil(
        c->worker->handle(),
        [&] { return (st = ucp_request_check_status(req)) != UCS_INPROGRESS; },
        absl::Seconds(1));
    if (st == UCS_INPROGRESS) {
      // Stuck (docs/ucx.md: after some shared-memory peer deaths): cancel
      // and give it a moment more; a request UCX still keeps then is left
      // to it (freed when it finishes), and the send reported failed.
      ucp_request_cancel(c->worker->handle(), req);
      for (int i = 0; i < 1000 && (st = ucp_request_check_status(req)) == UCS_INPROGRESS; ++i) {
        ucp_worker_progress(c->worker->handle());
      }
    }
    ucp_request_free(req);
    if (st == UCS_INPROGRESS) st = UCS_ERR_TIMED_OUT;
    return st == UCS_OK ? absl::OkStatus() : UcsError(st, what);
  }
  if (UCS_PTR_STATUS(req) != UCS_ERR_NO_RESOURCE) return UcsError(UCS_PTR_STATUS(req), what);
  return SendCopyLocked(c, kind, msg, what);
}

// A user send (or an injected send's copy, already in `others`) waits for
// the window, behind those already waiting.
void HoldLocked(EpCore* c, Op* op) {
  if (c->held.empty()) c->worker->holding.insert(c);
  c->held.push_back(op);
}

// Hands held sends to UCX, oldest first, while the window is open.
size_t ReleaseHeldLocked(EpCore* c) {
  size_t n = 0;
  while (!c->held.empty() && c->flow.open()) {
    Op* op = c->held.front();
    c->held.pop_front();
    if (c->held.empty()) c->worker->holding.erase(c);
    ++n;
    const bool copy = op->kind == Op::Kind::kInjectSend;
    const void* data = copy ? op->owned.data() : op->buf;
    const size_t len = copy ? op->owned.size() : op->length;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = OnSend;
    p.user_data = op;
    ucs_status_t st =
        Submit(op, [&] { return ucp_tag_send_nbx(c->uep, data, len, c->SendTag(false), &p); });
    if (st == UCS_OK) {
      c->flow.Posted();
    } else {
      op->completed = true;  // settled as failed: a user send reports it in order
      op->ucx_status = st;
    }
    if (op->completed) SettleLocked(op);
  }
  return n;
}

[[gnu::noinline]] void Worker::QueueFlowLocked(EpCore* c) {
  if (c->flow_queued) return;
  c->flow_queued = true;
  flow_due_.push_back(c->shared_from_this());
}

size_t Worker::FlowLocked() {
  std::vector<std::shared_ptr<EpCore>> due;
  due.swap(flow_due_);
  size_t n = 0;
  for (const auto& c : due) {
    c->flow_queued = false;
    if (c->closed || c->dead || c->uep == nullptr) continue;
    if (c->flow.ReportDue(c->user_received)) {
      // Never behind our own held sends: the peer's window may be what
      // waits for it. A failed one means the endpoint is failing (UCX's
      // error handler reports that).
      if (SendNowLocked(c.get(), Op::Kind::kControlSend,
                        EncodeRecord(kFlowReportMarker, c->user_received),
                        "sending a ucx flow-control report failed")
              .ok()) {
        c->flow.Reported(c->user_received);
        ++n;
      }
    }
    n += ReleaseHeldLocked(c.get());
  }
  return n;
}

// ---------------------------------------------------------------- fabric

class UcxRegion;

class UcxFabric final : public Fabric {
 public:
  static absl::StatusOr<std::unique_ptr<Fabric>> Open(const FabricSpec& spec);
  ~UcxFabric() override;

  const Capabilities& caps() const override { return caps_; }
  const Settings& settings() const { return settings_; }

  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* addr, size_t len,
                                                               uint32_t access) override;
  absl::StatusOr<std::unique_ptr<MemoryRegion>> AllocateRegistered(size_t len,
                                                                   uint32_t access) override;
  absl::Status AccessLocal(const RemoteKey& rkey, uint64_t addr, size_t len, uint32_t access,
                           absl::FunctionRef<void(void*)> fn) override {
    BlobKey key;
    if (!DecodeBlob(rkey, &key) || key.slot >= slots_ || (key.gen & 1) == 0) {
      return RemoteKeyError("the key is malformed", addr, len);
    }
    PrivateSlot& p = own_[key.slot];
    if (absl::Status st = PinKeySlot(&p, key.gen, addr, len, access); !st.ok()) return st;
    fn(reinterpret_cast<void*>(addr));
    UnpinKeySlot(&p);
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<CompletionQueue>> CreateCq() override {
    auto cq = UcxCq::Create(this);
    if (!cq.ok()) return cq.status();
    return std::unique_ptr<CompletionQueue>(std::move(*cq));
  }
  absl::StatusOr<std::unique_ptr<Listener>> Listen(absl::string_view address) override;
  absl::StatusOr<std::unique_ptr<Endpoint>> Connect(absl::string_view address,
                                                    CompletionQueue* cq,
                                                    absl::Duration timeout) override;

  absl::StatusOr<std::unique_ptr<Endpoint>> Handshake(Fd sock, CompletionQueue* cq,
                                                      absl::Time deadline);

  // Workers that exist (created at the first connection).
  // Called on every Poll: no allocation.
  absl::InlinedVector<Worker*, 2> LiveWorkers() const {
    absl::InlinedVector<Worker*, 2> out;
    ForEachLiveWorker([&out](Worker* w) { out.push_back(w); });
    return out;
  }
  Worker* primary() const { return primary_.load(std::memory_order_acquire); }
  Worker* fallback() const { return fallback_.load(std::memory_order_acquire); }
  // The same without building a vector.
  template <typename F>
  void ForEachLiveWorker(F f) const {
    Worker* p = primary();
    if (p != nullptr) f(p);
    if (Worker* w = fallback(); w != nullptr && w != p) f(w);
  }
  void AddCq(UcxCq* cq) {
    MutexLock lock(&cq_mu_);
    cqs_.push_back(cq);
    for (Worker* w : LiveWorkers()) cq->WatchWorker(w->efd());
  }
  void RemoveCq(UcxCq* cq) {
    MutexLock lock(&cq_mu_);
    cqs_.erase(std::remove(cqs_.begin(), cqs_.end(), cq), cqs_.end());
  }

  void ReleaseSlot(uint32_t slot) {
    MutexLock lock(&slot_mu_);
    free_slots_.push_back(slot);
  }
  void UnmapMemory(ucp_mem_h memh) {
    MutexLock lock(&ctx_mu_);
    ucp_mem_unmap(primary_ctx_->handle(), memh);
  }

 private:
  UcxFabric(const FabricSpec& spec, Settings s, std::shared_ptr<Context> ctx)
      : settings_(std::move(s)), primary_ctx_(std::move(ctx)) {
    caps_.provider = "ucx";
    caps_.spec = spec.ToString();
  }
  absl::Status InitTable();
  void InitCaps();
  absl::StatusOr<Worker*> PrimaryWorker();
  absl::StatusOr<Worker*> FallbackWorker();
  absl::StatusOr<Worker*> StartWorker(std::shared_ptr<Context> ctx, const char* name,
                                      std::unique_ptr<Worker>* slot,
                                      std::atomic<Worker*>* published)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(worker_mu_);
  absl::StatusOr<std::unique_ptr<UcxRegion>> RegisterSlot(void* addr, size_t len,
                                                          uint32_t access, uint16_t flags,
                                                          const std::string& rkey,
                                                          ucp_mem_h memh);

  Capabilities caps_;
  Settings settings_;
  std::shared_ptr<Context> primary_ctx_;
  bool native_ = false;  // primary context has RMA/atomics and a shared key table

  // Key table: in shared memory (ucp_mem_map ALLOCATE) when native_.
  KeySlot* table_ = nullptr;
  std::unique_ptr<PrivateSlot[]> own_;  // private records, one per slot
  size_t slots_ = 0;
  ucp_mem_h table_memh_ = nullptr;
  size_t table_map_len_ = 0;  // when mmap'ed instead
  std::string table_rkey_;
  Mutex slot_mu_;
  std::vector<uint32_t> free_slots_ ABSL_GUARDED_BY(slot_mu_);
  Mutex ctx_mu_;  // ucp_mem_map / unmap / rkey_pack on the primary context

  Mutex worker_mu_;
  std::shared_ptr<Context> fallback_ctx_ ABSL_GUARDED_BY(worker_mu_);
  std::unique_ptr<Worker> primary_worker_ ABSL_GUARDED_BY(worker_mu_);
  std::unique_ptr<Worker> fallback_worker_ ABSL_GUARDED_BY(worker_mu_);
  std::atomic<Worker*> primary_{nullptr};
  std::atomic<Worker*> fallback_{nullptr};
  std::atomic<uint32_t> next_id_{1};

  Mutex cq_mu_;
  std::vector<UcxCq*> cqs_ ABSL_GUARDED_BY(cq_mu_);
};

// ---------------------------------------------------------------- regions


class UcxRegion final : public MemoryRegion {
 public:
  UcxRegion(UcxFabric* fabric, void* addr, size_t len, uint32_t access, uint32_t slot,
            uint32_t gen, uint8_t flags, KeySlot* entry, PrivateSlot* own, ucp_mem_h memh)
      : MemoryRegion(addr, len, access), fabric_(fabric), slot_(slot), gen_(gen),
        flags_(flags), entry_(entry), own_(own), memh_(memh) {}
  ~UcxRegion() override {
    Revoke();
    if (memh_ != nullptr) fabric_->UnmapMemory(memh_);  // frees allocated memory
    fabric_->ReleaseSlot(slot_);
  }

  RemoteKey remote_key() const override {
    RemoteKey key;
    key.addr = reinterpret_cast<uint64_t>(addr());
    key.length = length();
    key.access = access();
    key.blob.assign(kBlobSize, 0);
    key.blob[0] = 1;
    key.blob[1] = flags_;
    std::memcpy(key.blob.data() + 4, &slot_, 4);
    std::memcpy(key.blob.data() + 8, &gen_, 4);
    return key;
  }

  void Revoke() noexcept override {
    uint32_t expected = gen_;
    // The private generation decides: peers may write the shared one.
    if (!own_->gen.compare_exchange_strong(expected, gen_ + 1, std::memory_order_seq_cst)) {
      return;  // already revoked
    }
    entry_->gen.store(gen_ + 1, std::memory_order_seq_cst);
    while (own_->active.load(std::memory_order_seq_cst) != 0) sched_yield();
    // Peers inside a native access: wait at most one second (a peer killed
    // mid-access would otherwise hold us forever).
    const int64_t deadline = absl::GetCurrentTimeNanos() + 1000000000;
    while (entry_->active.load(std::memory_order_seq_cst) != 0 &&
           absl::GetCurrentTimeNanos() < deadline) {
      sched_yield();
    }
  }

 private:
  UcxFabric* fabric_;
  uint32_t slot_;
  uint32_t gen_;
  uint8_t flags_;
  KeySlot* entry_;
  PrivateSlot* own_;
  ucp_mem_h memh_;  // allocated regions only: owns the memory
};

absl::StatusOr<std::unique_ptr<UcxRegion>> UcxFabric::RegisterSlot(
    void* addr, size_t len, uint32_t access, uint16_t flags, const std::string& rkey,
    ucp_mem_h memh) {
  if (addr == nullptr || len == 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     "cannot register an empty or null range", "register at least one byte");
  }
  uint32_t slot;
  {
    MutexLock lock(&slot_mu_);
    if (free_slots_.empty()) {
      return MakeError(absl::StatusCode::kResourceExhausted, ENOSPC,
                       absl::StrCat("all ", slots_, " ucx registrations are in use"),
                       "release registrations, or raise the fabric option max_registrations "
                       "(the registration cache evicts unused ones)");
    }
    slot = free_slots_.back();
    free_slots_.pop_back();
  }
  PrivateSlot* own = &own_[slot];
  own->addr = reinterpret_cast<uint64_t>(addr);
  own->len = len;
  own->access = access;
  uint32_t gen = own->gen.load(std::memory_order_relaxed) + 1;  // even -> odd: live
  if ((gen & 1) == 0) ++gen;
  own->gen.store(gen, std::memory_order_seq_cst);
  KeySlot* e = &table_[slot];
  e->addr = own->addr;
  e->len = len;
  e->access = access;
  e->flags = flags;
  e->rkey_len = static_cast<uint16_t>(rkey.size());
  if (!rkey.empty()) std::memcpy(e->rkey, rkey.data(), rkey.size());
  e->gen.store(gen, std::memory_order_seq_cst);
  return std::make_unique<UcxRegion>(this, addr, len, access, slot, gen,
                                     static_cast<uint8_t>(flags), e, own, memh);
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> UcxFabric::RegisterMemory(void* addr, size_t len,
                                                                        uint32_t access) {
  // Ordinary memory needs no UCX registration: its one-sided operations go
  // through core emulation, which the target checks against this table.
  auto r = RegisterSlot(addr, len, access, 0, {}, nullptr);
  if (!r.ok()) return r.status();
  return std::unique_ptr<MemoryRegion>(std::move(*r));
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> UcxFabric::AllocateRegistered(size_t len,
                                                                           uint32_t access) {
  if (!native_) return Fabric::AllocateRegistered(len, access);
  if (len == 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     "cannot allocate an empty registered region", "ask for at least one byte");
  }
  ucp_mem_h memh = nullptr;
  std::string rkey;
  ucp_mem_attr_t attr{};
  {
    MutexLock lock(&ctx_mu_);
    ucp_mem_map_params_t p{};
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    p.length = len;
    p.flags = UCP_MEM_MAP_ALLOCATE;
    ucs_status_t st = ucp_mem_map(primary_ctx_->handle(), &p, &memh);
    if (st != UCS_OK) {
      return UcsError(st, absl::StrCat("UCX could not allocate ", len, " registered bytes"),
                      "check free space in /dev/shm and memory limits");
    }
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    ucp_mem_query(memh, &attr);
    void* buf = nullptr;
    size_t buf_len = 0;
    if (ucp_rkey_pack(primary_ctx_->handle(), memh, &buf, &buf_len) == UCS_OK) {
      if (buf_len <= sizeof(KeySlot::rkey)) {
        rkey.assign(static_cast<const char*>(buf), buf_len);
      } else {
        ZS_LOG(kInfo, "UCX rkey of %zu bytes does not fit the key table (%zu): remote "
               "operations on this region are emulated", buf_len, sizeof(KeySlot::rkey));
      }
      ucp_rkey_buffer_release(buf);
    }
  }
  std::memset(attr.address, 0, len);  // like the default (fresh anonymous pages)
  auto r = RegisterSlot(attr.address, len, access, rkey.empty() ? 0 : kSlotNative, rkey, memh);
  if (!r.ok()) {
    UnmapMemory(memh);
    return r.status();
  }
  return std::unique_ptr<MemoryRegion>(std::move(*r));
}

// ---------------------------------------------------------------- endpoint

// Send's refusal of a message too long for it. Out of line, as every cold
// path of a call made per message: the strings it builds would otherwise
// give the call a stack frame (and its canary) on every message.
[[gnu::noinline, gnu::cold]] absl::Status SendTooLongError(size_t len) {
  if (len > kMaxMessage) {
    return MakeError(absl::StatusCode::kInvalidArgument, EMSGSIZE,
                     absl::StrCat("message of ", len, " bytes exceeds ucx's maximum of ",
                                  kMaxMessage),
                     "split the message");
  }
  return MakeError(absl::StatusCode::kInvalidArgument, EMSGSIZE,
                   absl::StrCat("an injected send of ", len, " bytes exceeds ucx's inject_size ",
                                kInjectSize),
                   "inject at most caps().inject_size bytes, or send with a context");
}

class UcxEndpoint final : public Endpoint {
 public:
  UcxEndpoint(UcxFabric* fabric, UcxCq* cq, std::shared_ptr<EpCore> core, Fd sock,
              EndpointInfo info)
      : Endpoint(fabric, cq), cq_(cq), core_(std::move(core)), sock_(std::move(sock)),
        info_(std::move(info)) {
    {
      WorkerLock lock(&core_->worker->mu);
      core_->ep = this;
    }
    cq_->Attach(this, sock_.get());
  }

  ~UcxEndpoint() override {
    Close();
    cq_->Detach(this, sock_.get());
    Worker* w = core_->worker;
    WorkerLock lock(&w->mu);
    w->DiscardMessagesLocked(core_->RecvTag(false));
    w->DiscardMessagesLocked(core_->RecvTag(true));
    w->eps.erase(core_->local_id);
    core_->ep = nullptr;
  }

  const EndpointInfo& info() const override { return info_; }

  absl::Status Send(const void* buf, size_t len, MemoryRegion* mr, uint64_t context) override {
    if (context != kInjectContext) return SendTracked(buf, len, mr, context);
    // An injected send, a ping-pong's reply: this path only, in a frame
    // of its own (the tracked send's, inlined, cost this one a dozen
    // saved registers and stack slots).
    if (len > kInjectSize) return SendTooLongError(len);
    EpCore* c = core_.get();
    WorkerLock lock(&c->worker->mu);
    if (c->closed || c->dead) [[unlikely]] return c->closed ? ClosedError() : c->dead_status;
    return InjectLocked(c, buf, len);
  }

  // A send that reports its completion.
  [[gnu::noinline]] absl::Status SendTracked(const void* buf, size_t len, MemoryRegion*,
                                             uint64_t context) {
    if (len > kMaxMessage) return SendTooLongError(len);
    EpCore* c = core_.get();
    Worker* w = c->worker;
    WorkerLock lock(&w->mu);
    if (c->closed) return ClosedError();
    if (c->dead) return c->dead_status;
    if (c->MustHold()) {
      // Beyond the window: handed to UCX when the peer reports (FlowLocked).
      auto* op = w->NewOpLocked(Op::Kind::kUserSend);
      op->core = c;
      op->op = OpType::kSend;
      op->context = context;
      op->length = len;
      op->buf = buf;
      c->sends.push_back(op);
      HoldLocked(c, op);
      return absl::OkStatus();
    }
    auto* op = w->NewOpLocked(Op::Kind::kUserSend);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = OnSend;
    p.user_data = op;
    // Callbacks do not settle an op during its call (Submit), so the op
    // joins the endpoint's queue only once UCX has kept it.
    ucs_status_t st =
        Submit(op, [&] { return ucp_tag_send_nbx(c->uep, buf, len, c->SendTag(false), &p); });
    if (st != UCS_OK) {
      w->RecycleUnusedOpLocked(op);
      return UcsError(st, "ucx send failed");
    }
    c->flow.Posted();
    if (op->completed && op->ucx_status == UCS_OK && c->sends.empty()) {
      // Finished inside the call, nothing of this endpoint ahead of it.
      w->RecycleUnusedOpLocked(op);
      Completion done;
      done.context = context;
      done.op = OpType::kSend;
      done.length = len;
      done.endpoint = this;
      w->DeferInlineLocked(cq_, std::move(done));
      return absl::OkStatus();
    }
    op->core = c;
    op->op = OpType::kSend;
    op->context = context;
    op->length = len;
    c->sends.push_back(op);
    if (op->completed) SettleLocked(op);
    return absl::OkStatus();
  }

  absl::Status PostRecv(void* buf, size_t len, MemoryRegion*, uint64_t context) override {
    EpCore* c = core_.get();
    Worker* w = c->worker;
    WorkerLock lock(&w->mu);
    if (c->closed) return ClosedError();
    if (c->dead) {
      // Messages the peer sent before it died are still delivered.
      ucp_tag_recv_info_t info{};
      if (ucp_tag_probe_nb(w->handle(), c->RecvTag(false), kFullMask, 0, &info) == nullptr) {
        return c->dead_status;
      }
    }
    auto* op = w->NewOpLocked(Op::Kind::kUserRecv);
    op->core = c;
    op->op = OpType::kRecv;
    op->context = context;
    // UCX 1.13 does not fill recv_info when a receive completes at once
    // (contrary to its documentation), so completion always goes through
    // the callback, which gets the length.
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.recv = OnRecv;
    p.user_data = op;
    if (void* r = w->TakeRequestLocked(); r != nullptr) {
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_REQUEST;
      p.request = r;
      op->own_request = r;
    }
    c->recvs.push_back(op);
    ucs_status_t st = Submit(op, [&] {
      return ucp_tag_recv_nbx(w->handle(), buf, len, c->RecvTag(false), kFullMask, &p);
    });
    if (op->own_request != nullptr && st != UCS_OK) {
      // Refused in the call (no callback follows): the memory is ours.
      w->GiveRequestLocked(op->own_request);
      op->own_request = nullptr;
    }
    if (st == UCS_ERR_MESSAGE_TRUNCATED) {
      op->completed = true;
      op->ucx_status = st;
    } else if (st != UCS_OK) {
      c->recvs.pop_back();
      delete op;
      return UcsError(st, "posting a ucx receive failed");
    }
    if (op->completed) {
      SettleLocked(op);  // may report and free `op`
    } else if (c->dead) {
      // Matched a message from a dead peer that can no longer finish.
      CancelRecvsLocked(w, c);
      FailRemainingLocked(c, c->dead_status);
    }
    if (c->flow_queued) w->FlowLocked();  // a report due: no need to wait for a progress
    return absl::OkStatus();
  }

  // An injected send (Capabilities::inject_size): no completion is
  // reported; SendNowLocked sends it from the caller's buffer or a copy.
  absl::Status InjectLocked(EpCore* c, const void* buf, size_t len)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->worker->mu) {
    if (c->MustHold()) [[unlikely]] return HoldInjectedLocked(c, buf, len);
    return SendNowLocked(c, Op::Kind::kInjectSend,
                         std::span<const uint8_t>(static_cast<const uint8_t*>(buf), len),
                         "ucx injected send failed");
  }

  // Beyond the window: a copy waits (FlowLocked sends it).
  [[gnu::noinline]] absl::Status HoldInjectedLocked(EpCore* c, const void* buf, size_t len)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->worker->mu) {
    auto* op = new Op{Op::Kind::kInjectSend};
    op->core = c;
    op->keep = core_;
    op->owned.assign(static_cast<const uint8_t*>(buf), static_cast<const uint8_t*>(buf) + len);
    c->others.insert(op);
    HoldLocked(c, op);
    return absl::OkStatus();
  }

  absl::Status SendControl(std::span<const uint8_t> msg) override {
    EpCore* c = core_.get();
    WorkerLock lock(&c->worker->mu);
    if (c->closed) return ClosedError();
    if (c->dead) return c->dead_status;
    return SendNowLocked(c, Op::Kind::kControlSend, msg, "sending a ucx control message failed");
  }

  absl::Status Read(void* local, size_t len, MemoryRegion* mr, uint64_t remote_addr,
                    const RemoteKey& rkey, uint64_t context) override {
    bool handled = false;
    absl::Status st = Native(OpType::kRead, local, len, remote_addr, rkey, 0, 0, nullptr,
                             context, &handled);
    if (handled) return st;
    return Endpoint::Read(local, len, mr, remote_addr, rkey, context);
  }

  absl::Status Write(const void* local, size_t len, MemoryRegion* mr, uint64_t remote_addr,
                     const RemoteKey& rkey, uint64_t context) override {
    bool handled = false;
    absl::Status st = Native(OpType::kWrite, const_cast<void*>(local), len, remote_addr, rkey,
                             0, 0, nullptr, context, &handled);
    if (handled) return st;
    return Endpoint::Write(local, len, mr, remote_addr, rkey, context);
  }

  absl::Status FetchAdd(uint64_t* result, uint64_t remote_addr, const RemoteKey& rkey,
                        uint64_t add, uint64_t context) override {
    bool handled = false;
    absl::Status st = Native(OpType::kFetchAdd, nullptr, 8, remote_addr, rkey, add, 0, result,
                             context, &handled);
    if (handled) return st;
    return Endpoint::FetchAdd(result, remote_addr, rkey, add, context);
  }

  absl::Status CompareSwap(uint64_t* result, uint64_t remote_addr, const RemoteKey& rkey,
                           uint64_t compare, uint64_t swap, uint64_t context) override {
    bool handled = false;
    absl::Status st = Native(OpType::kCompareSwap, nullptr, 8, remote_addr, rkey, compare, swap,
                             result, context, &handled);
    if (handled) return st;
    return Endpoint::CompareSwap(result, remote_addr, rkey, compare, swap, context);
  }

  void Close() override {
    EpCore* c = core_.get();
    {
      WorkerLock lock(&c->worker->mu);
      if (c->closed) return;
      c->closed = true;
      c->fail_emulated = false;
      c->worker->ReportInlineLocked();  // sends that finished before the close
      CancelRecvsLocked(c->worker, c);
      FinishMatchedRecvsLocked(c->worker, c);
      CloseUcpEpLocked(c->worker, c);
      FailRemainingLocked(c, ClosedCancel());
    }
    ::shutdown(sock_.get(), SHUT_RDWR);  // the peer sees the connection end
    FailEmulated(ClosedCancel());
  }

  // ---- for UcxCq ----
  // The connection socket became readable: the peer went away (it sends
  // nothing after the handshake).
  void OnSocketEvent() {
    char b;
    ssize_t n = ::recv(sock_.get(), &b, 1, MSG_DONTWAIT | MSG_PEEK);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    cq_->Unwatch(sock_.get());
    EpCore* c = core_.get();
    WorkerLock lock(&c->worker->mu);
    c->worker->FailLocked(
        c, MakeError(absl::StatusCode::kAborted, ECONNRESET,
                     absl::StrCat("ucx peer pid ", c->peer_pid,
                                  n > 0 ? " broke the connection protocol"
                                        : " closed the connection (it exited, was killed or "
                                          "closed the endpoint)"),
                     "reconnect; data the peer sent before it went away was delivered"));
  }

  // Delivers control messages and a pending emulation failure; called by
  // the endpoint's CQ without any provider lock the handlers could need.
  size_t Service() {
    std::vector<std::shared_ptr<ControlIn>> ready;
    absl::Status fail;
    EpCore* c = core_.get();
    {
      WorkerLock lock(&c->worker->mu);
      while (!c->control.empty() && c->control.front()->done) {
        ready.push_back(std::move(c->control.front()));
        c->control.pop_front();
      }
      if (c->fail_emulated) {
        c->fail_emulated = false;
        fail = c->dead_status;
      }
    }
    for (const auto& in : ready) {
      if (in->ok && !in->handled) DeliverControl(in->data);
    }
    if (!fail.ok()) FailEmulated(fail);
    return ready.size() + (fail.ok() ? 0 : 1);
  }

  bool HasWork() {
    EpCore* c = core_.get();
    WorkerLock lock(&c->worker->mu);
    return c->fail_emulated || (!c->control.empty() && c->control.front()->done);
  }

 private:
  // Native UCP RMA/atomics on a peer's AllocateRegistered memory, after
  // checking the peer's own record of the key. *handled = false: not such
  // memory (or not over shared memory): the caller emulates.
  absl::Status Native(OpType type, void* local, size_t len, uint64_t raddr,
                      const RemoteKey& rkey, uint64_t a, uint64_t b, uint64_t* result,
                      uint64_t context, bool* handled) {
    BlobKey key;
    if (!DecodeBlob(rkey, &key) || (key.flags & kSlotNative) == 0) return absl::OkStatus();
    EpCore* c = core_.get();
    Worker* w = c->worker;
    WorkerLock lock(&w->mu);
    if (!c->native) return absl::OkStatus();
    *handled = true;
    if (c->closed) return ClosedError();
    if (c->dead) return c->dead_status;
    if (type == OpType::kFetchAdd || type == OpType::kCompareSwap) {
      if (raddr % 8 != 0) {
        return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                         absl::StrCat("atomic on remote address 0x", absl::Hex(raddr),
                                      " which is not 8-byte aligned"),
                         "atomics operate on aligned 8-byte words");
      }
    }
    KeySlot* e = nullptr;
    if (auto st = PinKey(c->peer_table, c->peer_slots, key, raddr, len, AccessFor(type), &e);
        !st.ok()) {
      return st;
    }
    if ((e->flags & kSlotNative) == 0 || e->rkey_len == 0 || e->rkey_len > sizeof(e->rkey)) {
      Unpin(e);
      *handled = false;  // emulate: the peer could not publish a UCX key for it
      return absl::OkStatus();
    }
    ucp_rkey_h rk = nullptr;
    auto it = c->rkeys.find(key.slot);
    if (it != c->rkeys.end() && it->second.first == key.gen) {
      rk = it->second.second;
    } else {
      if (it != c->rkeys.end()) {
        ucp_rkey_destroy(it->second.second);
        c->rkeys.erase(it);
      }
      uint8_t packed[sizeof(e->rkey)];
      std::memcpy(packed, e->rkey, e->rkey_len);  // the target's record, not the key's
      ucs_status_t st = ucp_ep_rkey_unpack(c->uep, packed, &rk);
      if (st != UCS_OK) {
        Unpin(e);
        return UcsError(st, "UCX could not unpack the peer's key");
      }
      c->rkeys[key.slot] = {key.gen, rk};
    }
    auto* op = new Op{Op::Kind::kNative};
    op->core = c;
    op->keep = core_;
    op->op = type;
    op->context = context;
    op->length = len;
    op->pinned = e;
    op->result = result;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = OnSend;
    p.user_data = op;
    if (type == OpType::kFetchAdd || type == OpType::kCompareSwap) {
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER;
      p.datatype = ucp_dt_make_contig(8);
      p.reply_buffer = &op->reply;
      // ADD: buffer = addend. CSWAP: buffer = compare value, reply_buffer =
      // swap value in, old value out (ucp.h's atomic_ops table).
      op->value = a;
      if (type == OpType::kCompareSwap) op->reply = b;
    }
    c->others.insert(op);
    ucs_status_t st = Submit(op, [&]() -> void* {
      switch (type) {
        case OpType::kRead: return ucp_get_nbx(c->uep, local, len, raddr, rk, &p);
        case OpType::kWrite: return ucp_put_nbx(c->uep, local, len, raddr, rk, &p);
        case OpType::kFetchAdd:
          return ucp_atomic_op_nbx(c->uep, UCP_ATOMIC_OP_ADD, &op->value, 1, raddr, rk, &p);
        default:
          return ucp_atomic_op_nbx(c->uep, UCP_ATOMIC_OP_CSWAP, &op->value, 1, raddr, rk, &p);
      }
    });
    if (st != UCS_OK) {
      Unpin(e);
      c->others.erase(op);
      delete op;
      return UcsError(st, absl::StrCat("ucx ", OpTypeName(type), " failed"));
    }
    if (op->completed) SettleLocked(op);
    return absl::OkStatus();
  }

  UcxCq* cq_;
  std::shared_ptr<EpCore> core_;
  Fd sock_;
  EndpointInfo info_;
};

// ---------------------------------------------------------------- CQ methods

absl::StatusOr<std::unique_ptr<UcxCq>> UcxCq::Create(UcxFabric* fabric) {
  int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (efd < 0) return ErrnoError(errno, "eventfd for a ucx CQ failed", "raise the fd limit (ulimit -n)");
  Fd event(efd);
  int epfd = ::epoll_create1(EPOLL_CLOEXEC);
  if (epfd < 0) return ErrnoError(errno, "epoll_create1 for a ucx CQ failed", "raise the fd limit (ulimit -n)");
  Fd ep(epfd);
  int sfd = ::epoll_create1(EPOLL_CLOEXEC);
  if (sfd < 0) return ErrnoError(errno, "epoll_create1 for a ucx CQ failed", "raise the fd limit (ulimit -n)");
  Fd socks(sfd);
  int tfd = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (tfd < 0) return ErrnoError(errno, "timerfd_create for a ucx CQ failed", "raise the fd limit (ulimit -n)");
  Fd timer(tfd);
  for (int fd : {efd, sfd, tfd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      return ErrnoError(errno, "building the ucx CQ's epoll set failed");
    }
  }
  const Settings& s = fabric->settings();
  const int tries = s.same_host_only && s.has_mm ? kIdleTries : 1;
  auto cq = std::unique_ptr<UcxCq>(new UcxCq(fabric, std::move(ep), std::move(socks),
                                             std::move(event), std::move(timer), tries));
  // Core's wake eventfd (Push/Wake from other threads) joins the wait set.
  epoll_event wev{};
  wev.events = EPOLLIN;
  wev.data.fd = cq->wake_fd();
  if (::epoll_ctl(epfd, EPOLL_CTL_ADD, cq->wake_fd(), &wev) != 0) {
    return ErrnoError(errno, "adding the wake eventfd to the ucx CQ epoll set failed");
  }
  fabric->AddCq(cq.get());
  return cq;
}

UcxCq::~UcxCq() {
  fabric_->RemoveCq(this);
  fabric_->ForEachLiveWorker([this](Worker* w) {
    WorkerLock lock(&w->mu);
    w->ForgetCqLocked(this);
  });
}

void UcxCq::Attach(UcxEndpoint* ep, int sock) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.ptr = ep;
  MutexLock lock(&mu_);
  ::epoll_ctl(socks_.get(), EPOLL_CTL_ADD, sock, &ev);
  endpoints_.push_back(ep);
  NoteService();
}

void UcxCq::Detach(UcxEndpoint* ep, int sock) {
  MutexLock lock(&mu_);
  ::epoll_ctl(socks_.get(), EPOLL_CTL_DEL, sock, nullptr);
  endpoints_.erase(std::remove(endpoints_.begin(), endpoints_.end(), ep), endpoints_.end());
}

size_t UcxCq::Progress() {
  const UcxCq* outer = t_progressing;
  t_progressing = this;
  // A plain load first: a busy poll costs no locked store here.
  if (pushed_.load(std::memory_order_relaxed)) pushed_.store(false, std::memory_order_seq_cst);
  // The coarse clock is read on every kClockPolls-th progress and kept
  // between: what it times (the sockets' look below, the workers'
  // control probe) is due every millisecond or so and may come a few
  // polls late, while a busy poll's every instruction delays the moment
  // it sees a reply. (Plain loads and stores: a poll racing another on
  // this CQ may read the clock once more or less.)
  const uint32_t k = polls_.load(std::memory_order_relaxed);
  polls_.store(k + 1, std::memory_order_relaxed);
  int64_t now;
  if (k % kClockPolls == 0) {
    now = CoarseNowNs();
    now_ns_.store(now, std::memory_order_relaxed);
  } else {
    now = now_ns_.load(std::memory_order_relaxed);
  }
  // The busy poll's path is this function, the worker's ProgressLocked and
  // ucp_worker_progress: no closure, no call for the primary worker, and
  // the rarely needed socket and endpoint service out of line (a reply is
  // detected one idle poll sooner the shorter the poll is).
  size_t n = 0;
  const bool quick = k % kClockPolls != 0;
  Worker* primary = fabric_->primary();
  if (primary != nullptr) {
    WorkerLock lock(&primary->mu);
    n = primary->ProgressLocked(now, idle_tries_, quick);
  }
  // Found something on a poll that is not a full one: back to the caller
  // at once; the fallback worker and the sockets wait for the next poll
  // (at most kClockPolls - 1 later).
  if (quick && n > 0) [[likely]] {
    backoff_ns_.store(kMinBackoffNs, std::memory_order_relaxed);
    t_progressing = outer;
    return n;
  }
  if (Worker* w = fabric_->fallback(); w != nullptr && w != primary) [[unlikely]] {
    n += ProgressOtherLocked(w, now);
  }
  // The connection sockets only signal a peer's end, and looking at them
  // costs a system call: a busy poller (ping-pong) looks once per tick of
  // the coarse clock (a few ms; reading it costs no system call), a waiter
  // after every wakeup (ClearWakeup, ArmProvider). The endpoints are
  // serviced then too, and whenever one noted work (NoteService).
  if (check_socks_.load(std::memory_order_relaxed) ||
      service_pending_.load(std::memory_order_relaxed) ||
      now - last_sock_check_.load(std::memory_order_relaxed) >= kSocketCheckNs) [[unlikely]] {
    n += LookAtSocketsAndEndpoints(now);
  }
  if (n > 0) backoff_ns_.store(kMinBackoffNs, std::memory_order_relaxed);
  t_progressing = outer;
  return n;
}

size_t UcxCq::ProgressOtherLocked(Worker* w, int64_t now) {
  WorkerLock lock(&w->mu);
  return w->ProgressLocked(now);
}

size_t UcxCq::LookAtSocketsAndEndpoints(int64_t now) {
  size_t n = 0;
  const bool socks = (check_socks_.load(std::memory_order_relaxed) &&
                      check_socks_.exchange(false, std::memory_order_relaxed)) ||
                     now - last_sock_check_.load(std::memory_order_relaxed) >= kSocketCheckNs;
  const bool service = service_pending_.load(std::memory_order_acquire) &&
                       service_pending_.exchange(false, std::memory_order_acq_rel);
  if (!socks && !service) return 0;
  MutexLock lock(&mu_);
  if (socks) {
    last_sock_check_.store(now, std::memory_order_relaxed);
    epoll_event evs[64];
    int k = ::epoll_wait(socks_.get(), evs, 64, 0);
    for (int i = 0; i < k; ++i) {
      static_cast<UcxEndpoint*>(evs[i].data.ptr)->OnSocketEvent();
      ++n;
    }
  }
  for (UcxEndpoint* ep : endpoints_) n += ep->Service();
  return n;
}

bool UcxCq::ArmProvider() {
  armed_.store(true, std::memory_order_seq_cst);
  Drain();
  if (pushed_.load(std::memory_order_seq_cst)) return false;
  epoll_event ev;
  if (::epoll_wait(socks_.get(), &ev, 1, 0) > 0) {
    check_socks_.store(true, std::memory_order_relaxed);
    return false;
  }
  bool busy_idle = false;
  std::vector<int> idle;
  for (Worker* w : fabric_->LiveWorkers()) {
    Worker::Arm state;
    {
      WorkerLock lock(&w->mu);
      state = w->ArmLocked();
    }
    switch (state) {
      case Worker::Arm::kArmed: break;
      case Worker::Arm::kPending: UnmuteAll(); return false;
      case Worker::Arm::kBusyIdle: busy_idle = true; idle.push_back(w->efd()); break;
    }
  }
  {
    MutexLock lock(&mu_);
    for (UcxEndpoint* ep : endpoints_) {
      if (ep->HasWork()) return false;
    }
  }
  UnmuteAll();
  if (busy_idle) {
    // Sleep, but not for long: UCX may need polling to move on.
    MutexLock lock(&mute_mu_);
    for (int efd : idle) MuteWorker(efd, true);
    muted_ = std::move(idle);
    int64_t ns = backoff_ns_.load(std::memory_order_relaxed);
    SetTimer(ns);
    backoff_ns_.store(std::min(ns * 2, kMaxBackoffNs), std::memory_order_relaxed);
  }
  return true;
}

// ---------------------------------------------------------------- listener

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
  return std::unique_ptr<Listener>(new UcxListener(this, std::move(sock), SocketAddress(fd, false)));
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
        if (auto st = WaitFd(fd, POLLOUT, deadline, "accept the connection"); !st.ok()) return st;
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

// ---------------------------------------------------------------- fabric methods

absl::StatusOr<std::unique_ptr<Fabric>> UcxFabric::Open(const FabricSpec& spec) {
  if (auto st = ForkGuard::Get().Check(); !st.ok()) return st;
  auto settings = LoadSettings(spec);
  if (!settings.ok()) return settings.status();
  // Native RMA only where every peer of the context shares memory with us:
  // enabling UCP RMA/atomics also enables UCX's unchecked software
  // emulation of them for whoever is connected.
  const bool rma = settings->native_rma && settings->same_host_only && settings->has_mm;
  auto ctx = Context::Create(settings->tls, *settings, settings->has_mm, rma);
  if (!ctx.ok()) return ctx.status();
  auto fabric = std::unique_ptr<UcxFabric>(
      new UcxFabric(spec, *std::move(settings), std::shared_ptr<Context>(std::move(*ctx))));
  if (auto st = fabric->InitTable(); !st.ok()) return st;
  fabric->InitCaps();
  return std::unique_ptr<Fabric>(std::move(fabric));
}

absl::Status UcxFabric::InitTable() {
  slots_ = settings_.max_registrations;
  const size_t bytes = slots_ * sizeof(KeySlot);
  if (primary_ctx_->rma()) {
    MutexLock lock(&ctx_mu_);
    ucp_mem_map_params_t p{};
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    p.length = bytes;
    p.flags = UCP_MEM_MAP_ALLOCATE;
    if (ucp_mem_map(primary_ctx_->handle(), &p, &table_memh_) == UCS_OK) {
      ucp_mem_attr_t attr{};
      attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
      ucp_mem_query(table_memh_, &attr);
      table_ = static_cast<KeySlot*>(attr.address);
      void* buf = nullptr;
      size_t len = 0;
      if (ucp_rkey_pack(primary_ctx_->handle(), table_memh_, &buf, &len) == UCS_OK) {
        table_rkey_.assign(static_cast<const char*>(buf), len);
        ucp_rkey_buffer_release(buf);
        native_ = true;
      }
    } else {
      table_memh_ = nullptr;
    }
  }
  if (table_ == nullptr) {
    void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
      return ErrnoError(errno, "allocating the ucx key table failed",
                        "lower max_registrations or raise memory limits");
    }
    table_ = static_cast<KeySlot*>(mem);
    table_map_len_ = bytes;
  }
  for (size_t i = 0; i < slots_; ++i) {
    new (&table_[i]) KeySlot{};
  }
  own_ = std::make_unique<PrivateSlot[]>(slots_);
  MutexLock lock(&slot_mu_);
  for (size_t i = slots_; i > 0; --i) free_slots_.push_back(static_cast<uint32_t>(i - 1));
  return absl::OkStatus();
}

void UcxFabric::InitCaps() {
  const Settings& s = settings_;
  caps_.send_recv = Support::kNative;
  caps_.rdma_read = Support::kEmulated;
  caps_.rdma_write = Support::kEmulated;
  caps_.atomics = Support::kEmulated;
  caps_.atomics_allocated = native_ ? Support::kNative : Support::kEmulated;
  caps_.max_msg_size = kMaxMessage;
  // Emulated: a read's answer carries data and headers in one control
  // message (kEmulationHeadroom).
  caps_.max_rma_size = kMaxMessage - kEmulationHeadroom;
  caps_.inline_size = 0;
  caps_.inject_size = kInjectSize;
  caps_.registration_required = false;
  caps_.peer_on_host = s.same_host_only;
  caps_.wait_fd = true;
  caps_.thread_safe = !s.serialized;
  if (s.serialized) {
    caps_.notes.push_back(
        "threads=serialized: one thread at a time calls into this fabric; no worker lock");
  }
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  caps_.notes.push_back(absl::StrCat(
      "UCX ", major, ".", minor, ".", release, ", UCX_TLS=", s.tls, "; UCX opened: ",
      primary_ctx_->resources().empty() ? std::string("nothing")
                                        : absl::StrJoin(primary_ctx_->resources(), ", ")));
  std::vector<std::string> missing;
  for (const std::string& t : s.requested) {
    bool alias = t == "all" || t == "sm" || t == "shm" || t == "mm";
    const auto& opened = primary_ctx_->transports();
    if (!alias && std::find(opened.begin(), opened.end(), t) == opened.end()) missing.push_back(t);
  }
  if (!missing.empty()) {
    caps_.notes.push_back(absl::StrCat(
        "requested but not available here: ", absl::StrJoin(missing, ","),
        " (ucx_info -d shows what this host offers; cma needs ptrace permission)"));
  }
  if (s.has_cma) {
    caps_.notes.push_back(
        "cma: UCX 1.13 selects no cma lane for endpoints with peer-failure handling, which "
        "zsock needs to fail a dead peer's operations; rendezvous goes through shared memory "
        "(each endpoint's notes list its lanes)");
  }
  if (s.same_host_only) {
    caps_.notes.push_back(
        s.fallback_tcp
            ? "peers that cannot share memory with this process (another user, ptrace policy, "
              "another host or pid namespace) are connected over tcp instead; their endpoint "
              "notes say so and why (fallback=none makes that an error)"
            : "fallback=none: connections to peers that cannot share memory fail");
  }
  caps_.notes.push_back(
      "rdma read/write and atomics on ordinary memory: core emulation, performed by the "
      "target's progress engine after checking its own registration table; UCX 1.13 has no "
      "transport RMA for such memory here and its software RMA writes wherever the peer says "
      "without any key check, so zsock does not use it");
  if (native_) {
    caps_.notes.push_back(
        "memory from AllocateRegistered lives in UCX posix shared memory: rdma read/write "
        "and atomics on it are native UCP operations (no target progress needed), checked "
        "first against the target's key table, which peers map through ucp_rkey_ptr");
  } else if (s.same_host_only && s.has_mm && !s.native_rma) {
    caps_.notes.push_back("native_rma=off: every one-sided operation is emulated");
  }
  caps_.notes.push_back(
      "UCP's registration cache is off (RCACHE_ENABLE=n): it installs UCM memory hooks and "
      "starts UCX's async thread at ucp_init; zsock's rcache and memhooks invalidate "
      "registrations instead");
  if (!s.ucx_options_text.empty()) {
    caps_.notes.push_back(absl::StrCat("UCX options: ", absl::StrJoin(s.ucx_options_text, " ")));
  }
}

UcxFabric::~UcxFabric() {
  ReleaseCache();
  {
    MutexLock lock(&worker_mu_);
    primary_.store(nullptr);
    fallback_.store(nullptr);
    primary_worker_.reset();
    fallback_worker_.reset();
    fallback_ctx_.reset();
  }
  if (table_memh_ != nullptr) {
    MutexLock lock(&ctx_mu_);
    ucp_mem_unmap(primary_ctx_->handle(), table_memh_);
  } else if (table_map_len_ > 0) {
    ::munmap(table_, table_map_len_);
  }
}

absl::StatusOr<Worker*> UcxFabric::StartWorker(std::shared_ptr<Context> ctx, const char* name,
                                               std::unique_ptr<Worker>* slot,
                                               std::atomic<Worker*>* published) {
  auto w = Worker::Create(std::move(ctx), name, settings_.serialized);
  if (!w.ok()) return w.status();
  *slot = std::move(*w);
  published->store(slot->get(), std::memory_order_release);
  MutexLock lock(&cq_mu_);
  for (UcxCq* cq : cqs_) cq->WatchWorker((*slot)->efd());
  return slot->get();
}

absl::StatusOr<Worker*> UcxFabric::PrimaryWorker() {
  MutexLock lock(&worker_mu_);
  if (primary_worker_ != nullptr) return primary_worker_.get();
  return StartWorker(primary_ctx_, "primary", &primary_worker_, &primary_);
}

absl::StatusOr<Worker*> UcxFabric::FallbackWorker() {
  MutexLock lock(&worker_mu_);
  if (settings_.tls == "tcp") {  // the primary already is tcp
    if (primary_worker_ != nullptr) return primary_worker_.get();
    return StartWorker(primary_ctx_, "primary", &primary_worker_, &primary_);
  }
  if (fallback_worker_ != nullptr) return fallback_worker_.get();
  if (fallback_ctx_ == nullptr) {
    Settings tcp;
    auto ctx = Context::Create("tcp", tcp, /*mm=*/false, /*rma=*/false);
    if (!ctx.ok()) return ctx.status();
    fallback_ctx_ = std::shared_ptr<Context>(std::move(*ctx));
  }
  return StartWorker(fallback_ctx_, "tcp fallback", &fallback_worker_, &fallback_);
}

absl::StatusOr<std::unique_ptr<Endpoint>> UcxFabric::Handshake(Fd sock, CompletionQueue* cq,
                                                              absl::Time deadline) {
  auto* ucq = dynamic_cast<UcxCq*>(cq);
  if (ucq == nullptr || ucq->fabric() != this) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     "the completion queue does not belong to this ucx fabric",
                     "create the CQ with the same fabric as the endpoint");
  }
  auto primary = PrimaryWorker();
  if (!primary.ok()) return primary.status();
  Worker* w = *primary;
  auto core = std::make_shared<EpCore>();
  core->cq = ucq;
  core->local_id = next_id_.fetch_add(1);
  if (core->local_id == 0) core->local_id = next_id_.fetch_add(1);
  core->local_secret = static_cast<uint32_t>(RandomU64()) & 0x7fffffffu;

  Hello mine;
  {
    WorkerLock lock(&w->mu);
    auto addr = w->Address();
    if (!addr.ok()) return addr.status();
    mine.address = *addr;
  }
  const ShmProbe& probe = Probe();
  auto boot = BootId();
  HelloFixed& f = mine.fixed;
  f.magic = kHelloMagic;
  f.version = kWireVersion;
  f.flags = static_cast<uint16_t>((settings_.fallback_tcp ? kHelloFallbackTcp : 0) |
                                  (native_ ? kHelloNativeTable : 0));
  f.pid = static_cast<uint32_t>(::getpid());
  f.uid = static_cast<uint32_t>(::getuid());
  f.ep_id = core->local_id;
  f.secret = core->local_secret;
  f.probe_nonce = probe.nonce;
  f.probe_fd = probe.fd;
  f.table_slots = static_cast<uint32_t>(slots_);
  f.table_addr = reinterpret_cast<uint64_t>(table_);
  f.flow_window = settings_.flow_window;
  std::memcpy(f.boot_id, boot.data(), boot.size());
  if (native_) mine.table_rkey = table_rkey_;
  mine.tls = settings_.tls;
  if (auto st = SendFrame(sock.get(), kHelloFrame, mine.Encode(), deadline); !st.ok()) return st;
  auto theirs_bytes = RecvFrame(sock.get(), kHelloFrame, deadline);
  if (!theirs_bytes.ok()) return theirs_bytes.status();
  auto theirs = Hello::Decode(*theirs_bytes);
  if (!theirs.ok()) return theirs.status();
  core->peer_id = theirs->fixed.ep_id;
  core->peer_secret = theirs->fixed.secret;
  core->peer_pid = theirs->fixed.pid;
  // Flow control when both sides window: each reports its consumption
  // often enough for the other's window.
  core->flow.Start(f.flow_window, theirs->fixed.flow_window);
  const bool same_host = std::memcmp(theirs->fixed.boot_id, boot.data(), boot.size()) == 0;

  // Phase 1: the primary transports.
  absl::Status attempt;
  if (settings_.same_host_only && !same_host) {
    attempt = MakeError(absl::StatusCode::kUnavailable, EHOSTUNREACH,
                        absl::StrCat("the peer runs on another host, which transports '",
                                     settings_.tls, "' cannot reach"),
                        "use ucx:tcp (or keep fallback=tcp)");
  } else if (settings_.has_mm) {
    attempt = ProbeSharedMemory(theirs->fixed.pid, theirs->fixed.probe_fd,
                                theirs->fixed.probe_nonce);
  }
  ucp_ep_h uep = nullptr;
  core->worker = w;
  if (attempt.ok()) {
    WorkerLock lock(&w->mu);
    auto ep = w->CreateEp(theirs->address, core.get());
    if (ep.ok()) {
      uep = *ep;
      core->uep = uep;
      w->eps[core->local_id] = core;  // before our verdict: the peer may send at once
    } else {
      attempt = ep.status();
    }
  }
  std::string verdict(4, '\0');
  verdict[0] = attempt.ok() ? 1 : 0;
  if (!attempt.ok()) verdict += std::string(attempt.message()).substr(0, 2048);
  auto unregister = [&](Worker* wk) {
    WorkerLock lock(&wk->mu);
    wk->eps.erase(core->local_id);
    if (core->uep != nullptr) {
      ucp_ep_h ep = core->uep;
      core->uep = nullptr;
      wk->CloseEpLocked(ep);
    }
  };
  if (auto st = SendFrame(sock.get(), kVerdictFrame, verdict, deadline); !st.ok()) {
    unregister(w);
    return st;
  }
  auto their_verdict = RecvFrame(sock.get(), kVerdictFrame, deadline);
  if (!their_verdict.ok() || their_verdict->size() < 4) {
    unregister(w);
    if (!their_verdict.ok()) return their_verdict.status();
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO, "malformed ucx verdict",
                     "the peer is not a compatible zsock ucx endpoint");
  }
  const bool their_ok = (*their_verdict)[0] == 1;
  std::string fallback_note;
  if (!attempt.ok() || !their_ok) {
    unregister(w);
    std::string why = !attempt.ok()
                          ? std::string(attempt.message())
                          : absl::StrCat("the peer (pid ", theirs->fixed.pid,
                                         ") could not reach us: ", their_verdict->substr(4));
    const bool can_fall_back = settings_.fallback_tcp &&
                               (theirs->fixed.flags & kHelloFallbackTcp) != 0;
    if (!can_fall_back) {
      return MakeError(absl::StatusCode::kFailedPrecondition, ECONNREFUSED,
                       absl::StrCat("cannot connect over ucx:", settings_.tls, ": ", why),
                       "set fallback=tcp on both sides, or fix the cause above");
    }
    auto fb = FallbackWorker();
    if (!fb.ok()) return fb.status();
    w = *fb;
    core->worker = w;
    std::string addr;
    {
      WorkerLock lock(&w->mu);
      auto a = w->Address();
      if (!a.ok()) return a.status();
      addr = *a;
      w->eps[core->local_id] = core;
    }
    if (auto st = SendFrame(sock.get(), kFallbackFrame, addr, deadline); !st.ok()) {
      unregister(w);
      return st;
    }
    auto their_addr = RecvFrame(sock.get(), kFallbackFrame, deadline);
    if (!their_addr.ok()) {
      unregister(w);
      return their_addr.status();
    }
    WorkerLock lock(&w->mu);
    auto ep = w->CreateEp(*their_addr, core.get());
    if (!ep.ok()) {
      w->eps.erase(core->local_id);
      return ep.status();
    }
    core->uep = *ep;
    fallback_note = absl::StrCat("fell back to tcp: ", why);
    ZS_LOG(kInfo, "ucx connection to pid %u %s", theirs->fixed.pid, fallback_note);
  }

  EndpointInfo info;
  info.local_address = SocketAddress(sock.get(), false);
  info.peer_address = SocketAddress(sock.get(), true);
  info.peer_on_host = same_host;
  info.rdma_read = Support::kEmulated;
  info.rdma_write = Support::kEmulated;
  info.atomics = Support::kEmulated;
  {
    WorkerLock lock(&w->mu);
    std::string text = CaptureOutput([&](FILE* out) { ucp_ep_print_info(core->uep, out); });
    std::vector<Lane> lanes = ParseLanes(text);
    std::vector<std::string> parts;
    bool shm_amo = false, cma_lane = false, shm_lane = false;
    for (const Lane& l : lanes) {
      parts.push_back(absl::StrCat(l.transport, " (", absl::StrJoin(l.uses, " "), ")"));
      bool shm = absl::StartsWith(l.transport, "posix/") || absl::StartsWith(l.transport, "sysv/");
      shm_lane |= shm;
      cma_lane |= absl::StartsWith(l.transport, "cma/");
      for (const auto& u : l.uses) shm_amo |= (shm && u == "amo");
    }
    info.notes.push_back(absl::StrCat("UCX lanes", w == *primary ? "" : " (tcp fallback context)",
                                      ": ", parts.empty() ? "?" : absl::StrJoin(parts, ", ")));
    if (!fallback_note.empty()) {
      info.notes.push_back(absl::StrCat(
          fallback_note, ". This endpoint uses tcp although ucx:", settings_.tls,
          " was asked for"));
    } else if (settings_.has_mm && !shm_lane) {
      info.notes.push_back("shared memory was requested but UCX chose no shared-memory lane");
    }
    if (settings_.has_cma && !cma_lane) {
      info.notes.push_back(
          "cma requested but UCX chose no cma lane (UCX 1.13 does not with peer-failure "
          "handling)");
    }
    // Native RMA on the peer's AllocateRegistered memory: map its key table.
    if (w->rma() && (theirs->fixed.flags & kHelloNativeTable) != 0 &&
        !theirs->table_rkey.empty() && shm_amo && theirs->fixed.table_slots > 0) {
      ucp_rkey_h rk = nullptr;
      void* ptr = nullptr;
      if (ucp_ep_rkey_unpack(core->uep, theirs->table_rkey.data(), &rk) == UCS_OK) {
        if (ucp_rkey_ptr(rk, theirs->fixed.table_addr, &ptr) == UCS_OK && ptr != nullptr) {
          core->table_rkey = rk;
          core->peer_table = static_cast<KeySlot*>(ptr);
          core->peer_slots = theirs->fixed.table_slots;
          core->native = true;
        } else {
          ucp_rkey_destroy(rk);
        }
      }
    }
    info.notes.push_back(
        core->native
            ? "rdma read/write and atomics: native UCP operations on memory from the peer's "
              "AllocateRegistered (checked against its key table); on other memory emulated "
              "by the peer's progress engine, which checks every access"
            : "rdma read/write and atomics: emulated by the peer's progress engine, which "
              "checks every access against its registrations (UCX would only emulate them "
              "itself, without checks)");
  }
  return std::unique_ptr<Endpoint>(
      new UcxEndpoint(this, ucq, std::move(core), std::move(sock), std::move(info)));
}

const bool kRegistered = RegisterProvider(ProviderInfo{
    "ucx",
    "UCX 1.13 (UCP tag matching; tcp, posix shared memory, cma)",
    {"ucx:tcp", "ucx:posix,cma"},
    [](const FabricSpec& spec) { return UcxFabric::Open(spec); },
});

}  // namespace
}  // namespace zsock::ucx
