// One UCX operation in flight (Op) and how it completes.
//
// An Op is started by Submit; UCX then completes it inside the call or
// later through a callback (OnSend, OnRecv), which runs inside a ucp_*
// call zsock makes while holding the worker's lock. SettleLocked finishes
// it: user sends and receives are reported in posting order (FlushLocked,
// ReportLocked), control receives go to their endpoint's queue, sends
// without completion just go. A failed endpoint's UCX error callback is
// OnEpError.
#ifndef ZSOCK_PROVIDERS_UCX_OP_H_
#define ZSOCK_PROVIDERS_UCX_OP_H_

#include <ucp/api/ucp.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "core/provider.h"
#include "providers/ucx/key_table.h"

namespace zsock::ucx {

struct EpCore;
class Worker;

// A control message received for an endpoint, in arrival order.
struct ControlIn {
  std::vector<uint8_t> data;
  bool done = false;
  bool ok = true;
  bool handled = false;  // a flow-control report, taken by the provider
};

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
  // core (Close, FailRemainingLocked), and copying the shared_ptr costs
  // two locked read-modify-writes per message. Every op that leaves a
  // queue while UCX still owns it (an orphan), and every other kind,
  // holds `keep`.
  EpCore* core = nullptr;
  std::shared_ptr<EpCore> keep;
  Worker* worker = nullptr;  // kControlRecv / kDiscard: tracked by this worker
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
  // (user sends and receives, control receives). Field by field:
  // assigning a fresh Op would build, move and destroy a whole one, a
  // measurable part of a small message's one-way time.
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

// Finishes an operation UCX completed (op->completed), after its
// ucp_*_nbx call returned; may free `op`. Out of line: OnRecv's direct
// path (a ping-pong's every receive) must not carry its frame.
[[gnu::noinline]] void SettleLocked(Op* op);

// The status of a finished UCX operation of `c` (null: none).
absl::Status OpStatus(EpCore* c, ucs_status_t st, OpType op);

// Delivers `op`'s completion to `c`'s CQ (after the worker's deferred
// ones, so that an endpoint's sends stay in order).
void ReportLocked(EpCore* c, Op* op);
// Reports finished operations at the front of `q`, in posting order.
void FlushLocked(EpCore* c, std::deque<Op*>* q);

// UCX callbacks (user_data: the Op; arg: the EpCore).
void OnSend(void* request, ucs_status_t status, void* user_data);
void OnRecv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
            void* user_data);
void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status);

}  // namespace zsock::ucx

#endif  // ZSOCK_PROVIDERS_UCX_OP_H_
