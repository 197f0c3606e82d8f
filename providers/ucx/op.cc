// Completing operations: UCX's callbacks, settling, and reporting in
// posting order. OnRecv's direct path (ReportRecvDirectLocked) is a
// ping-pong's every receive: it and what it calls stay in this file or
// inline in headers.
#include "providers/ucx/op.h"

#include <iterator>

#include "absl/strings/str_cat.h"
#include "core/log.h"
#include "core/status.h"
#include "providers/ucx/cq.h"
#include "providers/ucx/ep_core.h"
#include "providers/ucx/flow_control.h"
#include "providers/ucx/ucs_error.h"
#include "providers/ucx/worker.h"

namespace zsock::ucx {

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

namespace {

// SettleLocked for a control message received (TakeControlLocked's
// buffer): to the endpoint's queue, or taken here if it is a flow report.
void SettleControlRecvLocked(Op* op, EpCore* c, ucs_status_t st) {
  op->control_in->data = std::move(op->owned);
  op->control_in->done = true;
  op->control_in->ok = (st == UCS_OK);
  if (uint64_t consumed = 0; st == UCS_OK && c != nullptr &&
                             DecodeRecord(op->control_in->data, kFlowReportMarker, &consumed)) {
    op->control_in->handled = true;  // the peer's flow report
    c->flow.PeerReported(consumed);
    if (!c->held.empty()) c->worker->QueueFlowLocked(c);
  }
  if (c != nullptr && c->cq != nullptr) c->cq->NoteService();
  op->worker->Untrack(op);
  if (c != nullptr && c->cq != nullptr && !c->cq->IsProgressingHere()) c->cq->WakeWaiter();
  delete op;
}

}  // namespace

void SettleLocked(Op* op) {
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
      SettleControlRecvLocked(op, c, st);
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

namespace {

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
  // iterator step, not size() and an index, which cost a deque more
  // instructions, on a ping-pong's every receive.)
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

}  // namespace

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

}  // namespace zsock::ucx
