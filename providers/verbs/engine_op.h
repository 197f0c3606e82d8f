// What the verbs engine's files share (engine.h says which holds what): an
// operation in flight, a rendezvous receive in progress, and the small
// helpers every path calls, inline so that the per-message paths in
// engine.cc and engine_completions.cc keep them in line.
#ifndef ZSOCK_PROVIDERS_VERBS_ENGINE_OP_H_
#define ZSOCK_PROVIDERS_VERBS_ENGINE_OP_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/provider.h"
#include "core/status.h"
#include "providers/verbs/engine.h"
#include "providers/verbs/region.h"

namespace zsock::verbs {

// One operation in flight (or waiting in the backlog).
struct Engine::Op {
  enum Kind {
    kMessage,  // a message in a send slot (user, control or protocol)
    kRts,      // rendezvous request; the user's send ends at FIN
    kRma,      // user RDMA read/write
    kAtomic,   // user atomic; the result lands in the send slot
    kPull,     // the receiver's RDMA read of a rendezvous message (one chunk)
  };
  Kind kind = kMessage;
  OpType op = OpType::kSend;
  uint64_t context = 0;
  size_t len = 0;
  bool user = false;           // reports a Completion
  bool done = false;           // already reported (inline sends)
  bool needs_credit = false;
  bool credit_update = false;  // an explicit kCredit message
  int slot = -1;               // send slot
  WorkRequest wr;
  Header header;               // messages: credits filled in at post time
  const uint8_t* src = nullptr;         // eager payload (the caller's buffer or `owned`)
  uint8_t rts_body[kRtsBodySize] = {};  // kRts: what follows the header
  uint64_t* result = nullptr;           // atomics
  std::shared_ptr<MemoryRegion> pin;    // a cache registration held until completion
  std::vector<uint8_t> owned;           // control-message bytes
  std::unique_ptr<MemoryRegion> owned_mr;
  uint64_t pull = 0;                    // kPull: its rendezvous receive
};

// A rendezvous receive in progress.
struct Engine::Pull {
  PostedRecv recv;
  bool control = false;
  std::vector<uint8_t> control_buf;
  std::unique_ptr<MemoryRegion> control_mr;
  std::shared_ptr<MemoryRegion> pin;
  uint64_t peer_cookie = 0;
  size_t length = 0;
  uint64_t control_seq = 0;
  int chunks_left = 0;
  absl::Status status;
};

inline void Engine::ReleaseSlot(Op* op) {
  if (op->slot >= 0) send_slab_.Put(static_cast<size_t>(op->slot));
  op->slot = -1;
}

inline absl::Status Engine::PostRecvSlot(size_t i) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uint64_t>(recv_slab_.slot(i));
  sge.length = static_cast<uint32_t>(recv_slab_.slot_size());
  sge.lkey = LkeyOf(recv_slab_.mr());
  ibv_recv_wr wr{};
  wr.wr_id = kRecvBit | i;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  if (int rc = t_->PostRecv(&wr); rc != 0) return ErrnoError(rc, "ibv_post_recv");
  return absl::OkStatus();
}

inline Completion Engine::Done(OpType op, uint64_t context, absl::Status st, size_t len) {
  Completion c;
  c.context = context;
  c.op = op;
  c.endpoint = owner_;
  c.length = st.ok() ? len : 0;
  c.status = std::move(st);
  return c;
}

inline void Engine::FailOp(Op* op, const absl::Status& st, EngineOutput* out) {
  if (op->user && !op->done) {
    op->done = true;
    out->completions.push_back(Done(op->op, op->context, st, 0));
  }
}

}  // namespace zsock::verbs

#endif  // ZSOCK_PROVIDERS_VERBS_ENGINE_OP_H_
