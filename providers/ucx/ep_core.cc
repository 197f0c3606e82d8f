// Taking a connection down: failing what is left, cancelling receives,
// closing the UCX endpoint.
#include "providers/ucx/ep_core.h"

#include <cerrno>
#include <vector>

#include "core/log.h"
#include "core/status.h"

namespace zsock::ucx {

absl::Status ClosedError() {
  return MakeError(absl::StatusCode::kFailedPrecondition, ENOTCONN,
                   "operation on a closed ucx endpoint", "connect a new endpoint");
}

absl::Status ClosedCancel() {
  return MakeError(absl::StatusCode::kCancelled, ECANCELED, "the ucx endpoint was closed", "");
}

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

namespace {

void ReleaseRkeysLocked(EpCore* c) {
  for (auto& [slot, entry] : c->rkeys) ucp_rkey_destroy(entry.second);
  c->rkeys.clear();
  if (c->table_rkey != nullptr) ucp_rkey_destroy(c->table_rkey);
  c->table_rkey = nullptr;
  c->peer_table = nullptr;
  c->native = false;
}

}  // namespace

void CancelRecvsLocked(Worker* w, EpCore* c) {
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
// rendezvous), for at most 2 s, as CloseEpLocked. Otherwise a socket
// closed while the peer's large message arrives has it written into the
// unmapped ring (zsock_test CloseRacesCallsInOtherThreads).
void FinishMatchedRecvsLocked(Worker* w, EpCore* c) {
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

void CloseUcpEpLocked(Worker* w, EpCore* c) {
  if (c->uep == nullptr) return;
  ReleaseRkeysLocked(c);
  ucp_ep_h ep = c->uep;
  c->uep = nullptr;
  w->CloseEpLocked(ep);
}

}  // namespace zsock::ucx
