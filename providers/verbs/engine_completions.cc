// The verbs message engine's completions (see engine.h): polling the
// transport, what each work completion ends, the messages that arrive
// (eager, rendezvous, FIN, credits, close), matching them with receives,
// and the rendezvous pulls that RDMA-read large messages.
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/copy.h"
#include "core/status.h"
#include "providers/verbs/engine.h"
#include "providers/verbs/engine_op.h"

namespace zsock::verbs {

size_t Engine::Progress(EngineOutput* out) {
  size_t n = 0;
  std::vector<ibv_wc> wcs;
  wcs.swap(stash_);
  for (const ibv_wc& wc : wcs) HandleWc(wc, out);
  n += wcs.size();
  for (;;) {
    ibv_wc batch[32];
    int got = t_->Poll(32, batch);
    for (int i = 0; i < got; ++i) HandleWc(batch[i], out);
    if (got > 0) n += static_cast<size_t>(got);
    if (got < 32) break;
  }
  Pump(out);
  return n;
}

const char* Engine::OpName(const Op* op) {
  switch (op->kind) {
    case Op::kMessage: return "send";
    case Op::kRts: return "rendezvous request";
    case Op::kRma: return op->op == OpType::kRead ? "RDMA read" : "RDMA write";
    case Op::kAtomic: return op->op == OpType::kFetchAdd ? "atomic fetch-add" : "atomic compare-swap";
    case Op::kPull: return "rendezvous RDMA read";
  }
  return "operation";
}

void Engine::HandleWc(const ibv_wc& wc, EngineOutput* out) {
  if (wc.wr_id & kRecvBit) {
    HandleRecv(wc, out);
    return;
  }
  auto it = ops_.find(wc.wr_id);
  if (it == ops_.end()) return;  // failed already (connection down)
  std::unique_ptr<Op> op = std::move(it->second);
  ops_.erase(it);
  --sq_used_;
  if (wc.status != IBV_WC_SUCCESS) {
    absl::Status st = wc.status == IBV_WC_WR_FLUSH_ERR && dead_
                          ? dead_status_
                          : WcError(wc.status, wc.vendor_err, OpName(op.get()));
    ReleaseSlot(op.get());
    if (op->kind == Op::kRts) --rts_waiting_;
    FailOp(op.get(), st, out);  // (a pull's receive fails in Die, with `st` in its text)
    // An RC QP is in the error state after any failed work request.
    Die(st, out);
    return;
  }
  switch (op->kind) {
    case Op::kMessage:
      ReleaseSlot(op.get());
      if (op->user && !op->done) {
        out->completions.push_back(Done(op->op, op->context, absl::OkStatus(), op->len));
      }
      break;
    case Op::kRts:
      ReleaseSlot(op.get());
      if (fin_early_.erase(op->header.cookie) > 0) {
        --rts_waiting_;
        if (op->user) out->completions.push_back(Done(op->op, op->context, absl::OkStatus(), op->len));
      } else {
        const uint64_t cookie = op->header.cookie;
        rts_[cookie] = std::move(op);  // completes at FIN
      }
      break;
    case Op::kRma:
      out->completions.push_back(Done(op->op, op->context, absl::OkStatus(), op->len));
      break;
    case Op::kAtomic:
      if (op->result != nullptr) {
        std::memcpy(op->result, send_slab_.slot(static_cast<size_t>(op->slot)), 8);
      }
      ReleaseSlot(op.get());
      out->completions.push_back(Done(op->op, op->context, absl::OkStatus(), 8));
      break;
    case Op::kPull:
      FinishPull(op->pull, absl::OkStatus(), out);
      break;
  }
}

void Engine::HandleRecv(const ibv_wc& wc, EngineOutput* out) {
  const size_t slot = wc.wr_id & ~kRecvBit;
  if (wc.status != IBV_WC_SUCCESS) {
    if (wc.status != IBV_WC_WR_FLUSH_ERR) {
      Die(WcError(wc.status, wc.vendor_err, "receive"), out);
    } else if (cfg_.srq) {
      t_->RepostSrq(slot);  // an SRQ buffer flushed by our QP stays usable
    }
    return;
  }
  const uint8_t* p = cfg_.srq ? t_->SrqBuffer(slot) : recv_slab_.slot(slot);
  const size_t slot_size = cfg_.srq ? cfg_.srq_slot_size : recv_slab_.slot_size();
  auto h = DecodeHeader(p, wc.byte_len, slot_size);
  if (!h.ok()) {
    if (cfg_.srq) t_->RepostSrq(slot);
    Die(h.status(), out);
    return;
  }
  credits_.Grant(h->credits);
  HandleMessage(*h, p + kHeaderSize, out);
  if (!RefillRecv(slot, out)) return;
  Pump(out);
}

void Engine::HandleMessage(const Header& h, const uint8_t* body, EngineOutput* out) {
  const bool control = h.flags & kMsgControl;
  switch (h.type) {
    case MsgType::kEager:
      if (control) {
        control_q_.push_back(ControlSlot{true, true, std::vector<uint8_t>(body, body + h.length)});
        FlushControl(out);
      } else {
        Arrival a;
        a.data.assign(body, body + h.length);
        if (auto m = matcher_.Arrive(std::move(a))) HandleMatch(std::move(*m), out);
      }
      break;
    case MsgType::kRts: {
      Arrival a;
      a.rendezvous = true;
      a.rts = DecodeRts(body);
      a.cookie = h.cookie;
      if (control) {
        StartControlPull(a, out);
      } else if (auto m = matcher_.Arrive(std::move(a))) {
        HandleMatch(std::move(*m), out);
      }
      break;
    }
    case MsgType::kFin: {
      auto it = rts_.find(h.cookie);
      if (it != rts_.end()) {
        std::unique_ptr<Op> op = std::move(it->second);
        rts_.erase(it);
        --rts_waiting_;
        // A receiver that discarded the message (longer than its receive)
        // still consumed it: the send itself succeeded.
        if (op->user) out->completions.push_back(Done(op->op, op->context, absl::OkStatus(), op->len));
      } else {
        fin_early_.insert(h.cookie);  // overtook the RTS's own completion
      }
      break;
    }
    case MsgType::kCredit:
      break;
    case MsgType::kClose:
      peer_closed_ = true;
      peer_sent_ = h.aux;
      break;
  }
}

bool Engine::RefillRecv(size_t slot, EngineOutput* out) {
  if (cfg_.srq) {
    t_->RepostSrq(slot);
  } else if (!dead_) {
    if (auto st = PostRecvSlot(slot); !st.ok()) {
      Die(st, out);
      return false;
    }
    if (credits_.Returned(static_cast<uint32_t>(cfg_.recv_depth)) && backlog_.empty()) {
      SendCreditUpdate();
    }
  }
  return true;
}

void Engine::HandleMatch(Match m, EngineOutput* out) {
  const uint64_t context = m.recv.context;
  if (m.truncated) {
    const size_t len = m.msg.rendezvous ? m.msg.rts.length : m.msg.data.size();
    out->completions.push_back(
        Done(OpType::kRecv, context,
             MakeError(absl::StatusCode::kOutOfRange, EMSGSIZE,
                       absl::StrCat("a message of ", len, " bytes met a receive of ", m.recv.len,
                                    " bytes and was discarded"),
                       "post receive buffers as large as the largest message"),
             0));
    if (m.msg.rendezvous && !dead_) QueueFin(m.msg.cookie, EMSGSIZE, out);
    return;
  }
  if (!m.msg.rendezvous) {
    if (!m.msg.data.empty()) CopyBytes(m.recv.buf, m.msg.data.data(), m.msg.data.size());
    out->completions.push_back(Done(OpType::kRecv, context, absl::OkStatus(), m.msg.data.size()));
    return;
  }
  if (dead_) {
    // The sender's buffer is unreachable now.
    out->completions.push_back(Done(OpType::kRecv, context, dead_status_, 0));
    return;
  }
  auto pull = std::make_unique<Pull>();
  pull->recv = m.recv;
  pull->peer_cookie = m.msg.cookie;
  pull->length = m.msg.rts.length;
  Op holder;
  uint32_t lkey = 0;
  if (auto st = LocalKeys(m.recv.buf, pull->length, m.recv.mr, kLocalWrite, &holder, &lkey, nullptr);
      !st.ok()) {
    out->completions.push_back(Done(OpType::kRecv, context, st, 0));
    QueueFin(m.msg.cookie, StatusErrno(st), out);
    return;
  }
  pull->pin = std::move(holder.pin);
  StartPull(std::move(pull), reinterpret_cast<uint64_t>(m.recv.buf), lkey, m.msg.rts, out);
}

void Engine::StartControlPull(const Arrival& a, EngineOutput* out) {
  if (a.rts.length > kMaxMessage) {
    QueueFin(a.cookie, EMSGSIZE, out);
    return;
  }
  auto pull = std::make_unique<Pull>();
  pull->control = true;
  pull->control_seq = control_base_ + control_q_.size();
  control_q_.push_back(ControlSlot{});
  pull->peer_cookie = a.cookie;
  pull->length = a.rts.length;
  pull->control_buf.resize(a.rts.length);
  auto reg = t_->Register(pull->control_buf.data(), a.rts.length, kLocalWrite);
  if (!reg.ok()) {
    control_q_.back().ready = true;  // nothing to deliver; later ones may go
    FlushControl(out);
    QueueFin(a.cookie, StatusErrno(reg.status()), out);
    return;
  }
  pull->control_mr = std::move(*reg);
  const uint32_t lkey = LkeyOf(pull->control_mr.get());
  const uint64_t addr = reinterpret_cast<uint64_t>(pull->control_buf.data());
  StartPull(std::move(pull), addr, lkey, a.rts, out);
}

// RDMA-reads a rendezvous message in chunks of at most max_msg_sz.
void Engine::StartPull(std::unique_ptr<Pull> pull, uint64_t local, uint32_t lkey,
                       const RtsBody& rts, EngineOutput* out) {
  const uint64_t id = next_pull_++;
  const size_t chunk = cfg_.max_msg_sz;
  size_t off = 0;
  int chunks = 0;
  do {
    const size_t n = std::min<size_t>(chunk, rts.length - off);
    auto op = std::make_unique<Op>();
    op->kind = Op::kPull;
    op->pull = id;
    op->wr.kind = WrKind::kRdmaRead;
    op->wr.local_addr = local + off;
    op->wr.length = static_cast<uint32_t>(n);
    op->wr.lkey = lkey;
    op->wr.remote_addr = rts.addr + off;
    op->wr.rkey = rts.rkey;
    backlog_.push_back(std::move(op));
    off += n;
    ++chunks;
  } while (off < rts.length);
  pull->chunks_left = chunks;
  pulls_[id] = std::move(pull);
  Pump(out);
}

void Engine::FinishPull(uint64_t id, const absl::Status& st, EngineOutput* out) {
  auto it = pulls_.find(id);
  if (it == pulls_.end()) return;
  Pull* p = it->second.get();
  if (!st.ok() && p->status.ok()) p->status = st;
  if (--p->chunks_left > 0 && st.ok()) return;
  std::unique_ptr<Pull> pull = std::move(it->second);
  pulls_.erase(it);
  if (pull->control) {
    ControlSlot& slot = control_q_[pull->control_seq - control_base_];
    slot.ready = true;
    slot.ok = pull->status.ok();
    if (slot.ok) slot.data = std::move(pull->control_buf);
    FlushControl(out);
  } else {
    out->completions.push_back(Done(OpType::kRecv, pull->recv.context, pull->status, pull->length));
  }
  if (!dead_) QueueFin(pull->peer_cookie, StatusErrno(pull->status), out);
}

void Engine::FlushControl(EngineOutput* out) {
  while (!control_q_.empty() && control_q_.front().ready) {
    if (control_q_.front().ok) out->control.push_back(std::move(control_q_.front().data));
    control_q_.pop_front();
    ++control_base_;
  }
}

}  // namespace zsock::verbs
