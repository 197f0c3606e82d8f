// The worker: creation, endpoints, arming, control-message probes and
// failed endpoints. ProgressLocked itself is inline in worker.h.
#include "providers/ucx/worker.h"

#include <new>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/clock.h"
#include "core/flow_window.h"
#include "core/log.h"
#include "providers/ucx/ep_core.h"
#include "providers/ucx/flow_control.h"
#include "providers/ucx/ucs_error.h"

namespace zsock::ucx {

bool ProgressUntil(ucp_worker_h worker, absl::FunctionRef<bool()> done, absl::Duration bound) {
  const absl::Time deadline = absl::Now() + bound;
  while (!done() && absl::Now() < deadline) ucp_worker_progress(worker);
  return done();
}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(std::shared_ptr<Context> ctx,
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

Worker::~Worker() {
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

absl::StatusOr<std::string> Worker::Address() {
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  ucs_status_t st = ucp_worker_get_address(worker_, &addr, &len);
  if (st != UCS_OK) return UcsError(st, "UCX gave no worker address");
  std::string out(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(worker_, addr);
  return out;
}

absl::StatusOr<ucp_ep_h> Worker::CreateEp(const std::string& address, EpCore* core) {
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

void Worker::CloseEpLocked(ucp_ep_h ep) {
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

Worker::Arm Worker::ArmLocked() {
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

void Worker::DropShared(Op* op) {
  op->keep.reset();
  op->control_in.reset();
}

void Worker::DeleteOp(Op* op) { delete op; }

void* Worker::NewRequestLocked() {
  const size_t size = ctx_->request_size();
  if (size == 0) return nullptr;
  // UCX's request sits right before the pointer it is given.
  request_blocks_.emplace_back(new (std::align_val_t{64}) std::byte[size]());
  return request_blocks_.back().get() + size;
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
  // control bounds): a sweep of hundreds of endpoints after every progress
  // that found something costs far more.
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

}  // namespace zsock::ucx
