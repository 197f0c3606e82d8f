// Flow control's sending side: held sends and reports (Worker::FlowLocked).
#include "providers/ucx/flow_control.h"

#include <memory>
#include <vector>

#include "core/flow_window.h"
#include "providers/ucx/inject.h"

namespace zsock::ucx {

void HoldLocked(EpCore* c, Op* op) {
  if (c->held.empty()) c->worker->holding.insert(c);
  c->held.push_back(op);
}

namespace {

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

}  // namespace

void Worker::QueueFlowLocked(EpCore* c) {
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

}  // namespace zsock::ucx
