// The ucx endpoint's two-sided operations, close and service.
#include "providers/ucx/endpoint.h"

#include <sys/socket.h>

#include <cerrno>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "providers/ucx/fabric.h"
#include "providers/ucx/flow_control.h"
#include "providers/ucx/inject.h"
#include "providers/ucx/ucs_error.h"
#include "providers/ucx/worker.h"

namespace zsock::ucx {
namespace {

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

}  // namespace

UcxEndpoint::UcxEndpoint(UcxFabric* fabric, UcxCq* cq, std::shared_ptr<EpCore> core, Fd sock,
                         EndpointInfo info)
    : Endpoint(fabric, cq), cq_(cq), core_(std::move(core)), sock_(std::move(sock)),
      info_(std::move(info)) {
  {
    WorkerLock lock(&core_->worker->mu);
    core_->ep = this;
  }
  cq_->Attach(this, sock_.get());
}

UcxEndpoint::~UcxEndpoint() {
  Close();
  cq_->Detach(this, sock_.get());
  Worker* w = core_->worker;
  WorkerLock lock(&w->mu);
  w->DiscardMessagesLocked(core_->RecvTag(false));
  w->DiscardMessagesLocked(core_->RecvTag(true));
  w->eps.erase(core_->local_id);
  core_->ep = nullptr;
}

// Inline into Send: the injected send's path.
inline absl::Status UcxEndpoint::InjectLocked(EpCore* c, const void* buf, size_t len) {
  if (c->MustHold()) [[unlikely]] return HoldInjectedLocked(c, buf, len);
  return SendNowLocked(c, Op::Kind::kInjectSend,
                       std::span<const uint8_t>(static_cast<const uint8_t*>(buf), len),
                       "ucx injected send failed");
}

absl::Status UcxEndpoint::Send(const void* buf, size_t len, MemoryRegion* mr, uint64_t context) {
  if (context != kInjectContext) return SendTracked(buf, len, mr, context);
  // An injected send, a ping-pong's reply: this path only, in a frame of
  // its own (the tracked send, inlined, would burden this one with its
  // saved registers and stack slots).
  if (len > kInjectSize) return SendTooLongError(len);
  EpCore* c = core_.get();
  WorkerLock lock(&c->worker->mu);
  if (c->closed || c->dead) [[unlikely]] return c->closed ? ClosedError() : c->dead_status;
  return InjectLocked(c, buf, len);
}

absl::Status UcxEndpoint::HoldInjectedLocked(EpCore* c, const void* buf, size_t len) {
  auto* op = new Op{Op::Kind::kInjectSend};
  op->core = c;
  op->keep = core_;
  op->owned.assign(static_cast<const uint8_t*>(buf), static_cast<const uint8_t*>(buf) + len);
  c->others.insert(op);
  HoldLocked(c, op);
  return absl::OkStatus();
}

absl::Status UcxEndpoint::SendTracked(const void* buf, size_t len, MemoryRegion*,
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

absl::Status UcxEndpoint::PostRecv(void* buf, size_t len, MemoryRegion*, uint64_t context) {
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

absl::Status UcxEndpoint::SendControl(std::span<const uint8_t> msg) {
  EpCore* c = core_.get();
  WorkerLock lock(&c->worker->mu);
  if (c->closed) return ClosedError();
  if (c->dead) return c->dead_status;
  return SendNowLocked(c, Op::Kind::kControlSend, msg, "sending a ucx control message failed");
}

void UcxEndpoint::Close() {
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

void UcxEndpoint::OnSocketEvent() {
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

size_t UcxEndpoint::Service() {
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

bool UcxEndpoint::HasWork() {
  EpCore* c = core_.get();
  WorkerLock lock(&c->worker->mu);
  return c->fail_emulated || (!c->control.empty() && c->control.front()->done);
}

}  // namespace zsock::ucx
