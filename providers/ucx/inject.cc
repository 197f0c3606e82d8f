// The slow paths of sends without completion: copies and requests UCX kept.
#include "providers/ucx/inject.h"

#include "providers/ucx/ucs_error.h"
#include "providers/ucx/worker.h"

namespace zsock::ucx {

absl::Status SendCopyLocked(EpCore* c, Op::Kind kind, std::span<const uint8_t> msg,
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

}  // namespace zsock::ucx
