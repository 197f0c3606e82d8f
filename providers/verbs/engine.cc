// The verbs message engine (see engine.h).
#include "providers/verbs/engine.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/copy.h"
#include "core/log.h"
#include "core/status.h"

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

Engine::Engine(Endpoint* owner, Transport* transport, EngineConfig config)
    : owner_(owner), t_(transport), cfg_(config) {}

Engine::~Engine() = default;

absl::Status Engine::Prepare() {
  send_slab_.slot_size = cfg_.eager_size;
  send_slab_.slots = static_cast<size_t>(cfg_.sq_depth);
  send_slab_.mem.assign(send_slab_.slot_size * send_slab_.slots, 0);
  auto smr = t_->Register(send_slab_.mem.data(), send_slab_.mem.size(), kLocalRead | kLocalWrite);
  if (!smr.ok()) return smr.status();
  send_slab_.mr = std::move(*smr);
  for (size_t i = 0; i < send_slab_.slots; ++i) free_slots_.push_back(static_cast<int>(i));
  if (!cfg_.srq) {
    recv_slab_.slot_size = cfg_.eager_size;
    recv_slab_.slots = static_cast<size_t>(cfg_.recv_depth);
    recv_slab_.mem.assign(recv_slab_.slot_size * recv_slab_.slots, 0);
    auto rmr = t_->Register(recv_slab_.mem.data(), recv_slab_.mem.size(), kLocalWrite);
    if (!rmr.ok()) return rmr.status();
    recv_slab_.mr = std::move(*rmr);
    for (size_t i = 0; i < recv_slab_.slots; ++i) {
      if (auto st = PostRecvSlot(i); !st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

void Engine::Start(const Hello& peer, std::string peer_address) {
  peer_address_ = std::move(peer_address);
  credits_ = Credits((peer.flags & kHelloSrq) ? Credits::kUnlimited : peer.credits);
  peer_eager_ = std::min<size_t>(peer.eager_size, cfg_.eager_size);
  started_ = true;
}

absl::Status Engine::CheckUsable() const {
  if (closed_) {
    return MakeError(absl::StatusCode::kFailedPrecondition, ENOTCONN,
                     "operation on a closed verbs endpoint", "connect a new endpoint");
  }
  if (dead_) return dead_status_;
  return absl::OkStatus();
}

absl::Status Engine::LocalKeys(const void* buf, size_t len, MemoryRegion* mr, uint32_t access,
                               Op* op, uint32_t* lkey, uint32_t* rkey) {
  const MemoryRegion* use = mr;
  if (mr == nullptr || (mr->access() & access) != access) {
    auto reg = t_->Pin(const_cast<void*>(buf), len, access);
    if (!reg.ok()) return reg.status();
    op->pin = *reg;
    use = op->pin.get();
  }
  *lkey = LkeyOf(use);
  if (rkey != nullptr) {
    auto k = DecodeKeyBlob(use->remote_key().blob);
    if (!k.ok()) return k.status();
    *rkey = *k;
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------ operations

absl::Status Engine::Send(const void* buf, size_t len, MemoryRegion* mr, uint64_t context,
                          bool control, EngineOutput* out) {
  if (auto st = CheckUsable(); !st.ok()) return st;
  if (len > kMaxMessage) {
    return MakeError(absl::StatusCode::kInvalidArgument, EMSGSIZE,
                     absl::StrCat("message of ", len, " bytes exceeds verbs' limit ", kMaxMessage),
                     "split it");
  }
  auto op = std::make_unique<Op>();
  op->op = OpType::kSend;
  op->context = context;
  op->len = len;
  op->user = !control;
  op->needs_credit = true;
  op->header.flags = control ? kMsgControl : 0;
  const auto* bytes = static_cast<const uint8_t*>(buf);
  if (len <= eager_payload()) {
    op->kind = Op::kMessage;
    op->header.type = MsgType::kEager;
    op->header.length = static_cast<uint32_t>(len);
    if (control) {
      op->owned.assign(bytes, bytes + len);
      op->src = op->owned.data();
    } else {
      op->src = bytes;  // the caller keeps it valid until the completion
    }
  } else {
    op->kind = Op::kRts;
    op->header.type = MsgType::kRts;
    op->header.cookie = next_cookie_++;
    RtsBody body;
    body.length = len;
    if (control) {
      op->owned.assign(bytes, bytes + len);
      auto reg = t_->Register(op->owned.data(), len, kLocalRead | kRemoteRead);
      if (!reg.ok()) return reg.status();
      op->owned_mr = std::move(*reg);
      body.addr = reinterpret_cast<uint64_t>(op->owned.data());
      auto k = DecodeKeyBlob(op->owned_mr->remote_key().blob);
      if (!k.ok()) return k.status();
      body.rkey = *k;
    } else {
      body.addr = reinterpret_cast<uint64_t>(buf);
      uint32_t lkey = 0;
      if (auto st = LocalKeys(buf, len, mr, kLocalRead | kRemoteRead, op.get(), &lkey, &body.rkey);
          !st.ok()) {
        return st;
      }
    }
    EncodeRts(body, op->rts_body);
  }
  if (!control) ++user_sent_;
  Enqueue(std::move(op), out);
  return absl::OkStatus();
}

absl::Status Engine::PostRecv(void* buf, size_t len, MemoryRegion* mr, uint64_t context,
                              EngineOutput* out) {
  if (closed_) return CheckUsable();
  // After the peer is gone, messages it sent before are still delivered.
  if (dead_ && matcher_.waiting_messages() == 0) return dead_status_;
  if (auto m = matcher_.Post(PostedRecv{buf, len, mr, context})) HandleMatch(std::move(*m), out);
  Pump(out);
  return absl::OkStatus();
}

absl::Status Engine::Rma(WrKind kind, void* local, size_t len, MemoryRegion* mr,
                         uint64_t remote_addr, const RemoteKey& rkey, uint64_t context,
                         EngineOutput* out) {
  if (auto st = CheckUsable(); !st.ok()) return st;
  const bool read = kind == WrKind::kRdmaRead;
  auto key = CheckRemote(rkey, remote_addr, len, read ? kRemoteRead : kRemoteWrite, false);
  if (!key.ok()) return key.status();
  if (len > cfg_.max_msg_sz) {
    return MakeError(absl::StatusCode::kInvalidArgument, EMSGSIZE,
                     absl::StrCat("RDMA ", read ? "read" : "write", " of ", len,
                                  " bytes exceeds the port's max_msg_sz ", cfg_.max_msg_sz),
                     "split the transfer");
  }
  auto op = std::make_unique<Op>();
  op->kind = Op::kRma;
  op->op = read ? OpType::kRead : OpType::kWrite;
  op->context = context;
  op->len = len;
  op->user = true;
  op->wr.kind = kind;
  op->wr.local_addr = reinterpret_cast<uint64_t>(local);
  op->wr.length = static_cast<uint32_t>(len);
  op->wr.remote_addr = remote_addr;
  op->wr.rkey = *key;
  // Writes that fit inline need no registration: the HCA copies at post time.
  if (len > 0 && (read || len > cfg_.max_inline)) {
    if (auto st = LocalKeys(local, len, mr, read ? kLocalWrite : kLocalRead, op.get(),
                            &op->wr.lkey, nullptr);
        !st.ok()) {
      return st;
    }
  }
  Enqueue(std::move(op), out);
  return absl::OkStatus();
}

absl::Status Engine::Atomic(WrKind kind, uint64_t* result, uint64_t remote_addr,
                            const RemoteKey& rkey, uint64_t a, uint64_t b, uint64_t context,
                            EngineOutput* out) {
  if (auto st = CheckUsable(); !st.ok()) return st;
  auto key = CheckRemote(rkey, remote_addr, 8, kRemoteAtomic, true);
  if (!key.ok()) return key.status();
  auto op = std::make_unique<Op>();
  op->kind = Op::kAtomic;
  op->op = kind == WrKind::kFetchAdd ? OpType::kFetchAdd : OpType::kCompareSwap;
  op->context = context;
  op->len = 8;
  op->user = true;
  op->result = result;
  op->wr.kind = kind;
  op->wr.length = 8;
  op->wr.remote_addr = remote_addr;
  op->wr.rkey = *key;
  op->wr.compare_add = a;
  op->wr.swap = b;
  Enqueue(std::move(op), out);
  return absl::OkStatus();
}

void Engine::QueueClose(EngineOutput* out) {
  if (!started_ || dead_ || closed_) return;
  auto op = std::make_unique<Op>();
  op->kind = Op::kMessage;
  op->header.type = MsgType::kClose;
  op->header.aux = user_sent_;
  op->needs_credit = true;
  Enqueue(std::move(op), out);
}

bool Engine::Idle() const {
  return dead_ || (backlog_.empty() && ops_.empty() && rts_waiting_ == 0);
}

// ------------------------------------------------------------ posting

void Engine::Enqueue(std::unique_ptr<Op> op, EngineOutput* out) {
  backlog_.push_back(std::move(op));
  Pump(out);
}

// Posts from the backlog, in order, while the send queue, the send slots
// and the peer's credits allow. What does not fit waits for completions.
void Engine::Pump(EngineOutput* out) {
  while (!backlog_.empty() && !dead_ && started_) {
    Op* op = backlog_.front().get();
    const bool needs_slot = op->kind == Op::kMessage || op->kind == Op::kRts || op->kind == Op::kAtomic;
    if (sq_used_ >= static_cast<size_t>(cfg_.sq_depth)) return;
    if (needs_slot && free_slots_.empty()) return;
    if (op->needs_credit && !credits_.Take()) {
      // Out of credits: if we owe the peer some, tell it now, or two peers
      // that both wait for credits would wait for each other.
      SendCreditUpdate();
      return;
    }
    std::unique_ptr<Op> owned = std::move(backlog_.front());
    backlog_.pop_front();
    const uint64_t id = next_wr_;
    absl::Status st = Post(owned.get());
    if (!st.ok()) {
      if (owned->needs_credit) credits_.Grant(1);
      const bool pull = owned->kind == Op::kPull;
      const uint64_t pull_id = owned->pull;
      FailOp(owned.get(), st, out);
      if (pull) {
        FinishPull(pull_id, st, out);
      }
      // A post the QP refuses (not a bad request of ours) means the QP is
      // unusable: the connection ends.
      if (StatusErrno(st) != EINVAL && StatusErrno(st) != EMSGSIZE) Die(st, out);
      continue;
    }
    next_wr_ = id + 1;
    if (owned->done && owned->user) {
      // An inline send: the HCA copied the data at post time.
      out->completions.push_back(Done(owned->op, owned->context, absl::OkStatus(), owned->len));
    }
    ops_.emplace(id, std::move(owned));
  }
}

absl::Status Engine::Post(Op* op) {
  WorkRequest wr = op->wr;
  wr.wr_id = next_wr_;
  const bool message = op->kind == Op::kMessage || op->kind == Op::kRts;
  if (message || op->kind == Op::kAtomic) {
    op->slot = free_slots_.front();
    free_slots_.pop_front();
  }
  uint8_t* slot = op->slot >= 0 ? send_slab_.slot(static_cast<size_t>(op->slot)) : nullptr;
  if (message) {
    op->header.credits = credits_.TakeReturn();
    EncodeHeader(op->header, slot);
    const size_t body = op->kind == Op::kRts ? kRtsBodySize : op->header.length;
    const uint8_t* src = op->kind == Op::kRts ? op->rts_body : op->src;
    if (body > 0) CopyBytes(slot + kHeaderSize, src, body);
    wr.kind = WrKind::kSend;
    wr.local_addr = reinterpret_cast<uint64_t>(slot);
    wr.length = static_cast<uint32_t>(kHeaderSize + body);
    wr.lkey = LkeyOf(send_slab_.mr.get());
  } else if (op->kind == Op::kAtomic) {
    wr.local_addr = reinterpret_cast<uint64_t>(slot);
    wr.lkey = LkeyOf(send_slab_.mr.get());
  }
  ibv_send_wr swr;
  ibv_sge sge;
  absl::Status st = BuildSendWr(wr, cfg_.max_inline, cfg_.max_msg_sz, &swr, &sge);
  if (st.ok()) {
    if (int rc = t_->PostSend(&swr); rc != 0) {
      st = ErrnoError(rc, "ibv_post_send",
                      rc == ENOMEM ? "the send queue overflowed (zsock tracks its depth: a bug)"
                                   : "the QP is in an error state; reconnect");
      // EINVAL from the QP is not a bad request of ours: the QP is broken.
      if (rc == EINVAL) st = MakeError(absl::StatusCode::kAborted, EIO, st.message());
    }
  }
  if (!st.ok()) {
    ReleaseSlot(op);
    return st;
  }
  ++sq_used_;
  if (op->kind == Op::kRts) ++rts_waiting_;
  if (op->kind == Op::kMessage && op->user && (swr.send_flags & IBV_SEND_INLINE)) op->done = true;
  return absl::OkStatus();
}

void Engine::ReleaseSlot(Op* op) {
  if (op->slot >= 0) free_slots_.push_back(op->slot);
  op->slot = -1;
}

absl::Status Engine::PostRecvSlot(size_t i) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uint64_t>(recv_slab_.slot(i));
  sge.length = static_cast<uint32_t>(recv_slab_.slot_size);
  sge.lkey = LkeyOf(recv_slab_.mr.get());
  ibv_recv_wr wr{};
  wr.wr_id = kRecvBit | i;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  if (int rc = t_->PostRecv(&wr); rc != 0) return ErrnoError(rc, "ibv_post_recv");
  return absl::OkStatus();
}

Completion Engine::Done(OpType op, uint64_t context, absl::Status st, size_t len) {
  Completion c;
  c.context = context;
  c.op = op;
  c.endpoint = owner_;
  c.length = st.ok() ? len : 0;
  c.status = std::move(st);
  return c;
}

void Engine::FailOp(Op* op, const absl::Status& st, EngineOutput* out) {
  if (op->user && !op->done) {
    op->done = true;
    out->completions.push_back(Done(op->op, op->context, st, 0));
  }
}

// ------------------------------------------------------------ completions

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
  const size_t slot_size = cfg_.srq ? cfg_.srq_slot_size : recv_slab_.slot_size;
  auto h = DecodeHeader(p, wc.byte_len, slot_size);
  if (!h.ok()) {
    if (cfg_.srq) t_->RepostSrq(slot);
    Die(h.status(), out);
    return;
  }
  credits_.Grant(h->credits);
  const bool control = h->flags & kMsgControl;
  switch (h->type) {
    case MsgType::kEager:
      if (control) {
        control_q_.push_back(ControlSlot{true, true, std::vector<uint8_t>(p + kHeaderSize, p + kHeaderSize + h->length)});
        FlushControl(out);
      } else {
        Arrival a;
        a.data.assign(p + kHeaderSize, p + kHeaderSize + h->length);
        if (auto m = matcher_.Arrive(std::move(a))) HandleMatch(std::move(*m), out);
      }
      break;
    case MsgType::kRts: {
      Arrival a;
      a.rendezvous = true;
      a.rts = DecodeRts(p + kHeaderSize);
      a.cookie = h->cookie;
      if (control) {
        StartControlPull(a, out);
      } else if (auto m = matcher_.Arrive(std::move(a))) {
        HandleMatch(std::move(*m), out);
      }
      break;
    }
    case MsgType::kFin: {
      auto it = rts_.find(h->cookie);
      if (it != rts_.end()) {
        std::unique_ptr<Op> op = std::move(it->second);
        rts_.erase(it);
        --rts_waiting_;
        // A receiver that discarded the message (longer than its receive)
        // still consumed it: the send itself succeeded.
        if (op->user) out->completions.push_back(Done(op->op, op->context, absl::OkStatus(), op->len));
      } else {
        fin_early_.insert(h->cookie);  // overtook the RTS's own completion
      }
      break;
    }
    case MsgType::kCredit:
      break;
    case MsgType::kClose:
      peer_closed_ = true;
      peer_sent_ = h->aux;
      break;
  }
  if (cfg_.srq) {
    t_->RepostSrq(slot);
  } else if (!dead_) {
    if (auto st = PostRecvSlot(slot); !st.ok()) {
      Die(st, out);
      return;
    }
    if (credits_.Returned(static_cast<uint32_t>(cfg_.recv_depth)) && backlog_.empty()) {
      SendCreditUpdate();
    }
  }
  Pump(out);
}

// An explicit credit update; it may take our last credit (Credits).
void Engine::SendCreditUpdate() {
  if (!started_ || dead_ || credits_.pending_return() == 0) return;
  if (sq_used_ >= static_cast<size_t>(cfg_.sq_depth) || free_slots_.empty()) return;
  if (!credits_.TakeForUpdate()) return;
  auto op = std::make_unique<Op>();
  op->kind = Op::kMessage;
  op->header.type = MsgType::kCredit;
  op->credit_update = true;
  const uint64_t id = next_wr_;
  if (Post(op.get()).ok()) {
    next_wr_ = id + 1;
    ops_.emplace(id, std::move(op));
  } else {
    credits_.Grant(1);
  }
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

void Engine::QueueFin(uint64_t cookie, int err, EngineOutput* out) {
  auto op = std::make_unique<Op>();
  op->kind = Op::kMessage;
  op->header.type = MsgType::kFin;
  op->header.cookie = cookie;
  op->header.aux = static_cast<uint64_t>(err);
  op->needs_credit = true;
  backlog_.push_back(std::move(op));
  Pump(out);
}

// ------------------------------------------------------------ teardown

void Engine::Die(const absl::Status& why, EngineOutput* out) {
  if (dead_) return;
  dead_ = true;
  dead_status_ = MakeError(absl::StatusCode::kAborted, ECONNRESET,
                           absl::StrCat("the verbs connection to ", peer_address_,
                                        " failed: ", why.message()),
                           "reconnect");
  ZS_LOG(kInfo, "verbs endpoint to %s is down: %s", peer_address_, why.ToString());
  FailAll(dead_status_, out);
  out->fail_emulated = true;
}

void Engine::Fail(const absl::Status& why, bool closed, EngineOutput* out) {
  if (closed) closed_ = true;
  if (!dead_) {
    dead_ = true;
    dead_status_ = why;
    ZS_LOG(kInfo, "verbs endpoint to %s is down: %s", peer_address_, why.ToString());
    out->fail_emulated = true;
  }
  FailAll(why, out);
  if (closed) matcher_.TakeMessages();  // nobody will receive them now
}

void Engine::FailAll(const absl::Status& why, EngineOutput* out) {
  for (auto& op : backlog_) FailOp(op.get(), why, out);
  backlog_.clear();
  for (auto& [cookie, op] : rts_) FailOp(op.get(), why, out);
  rts_.clear();
  rts_waiting_ = 0;
  for (auto& [id, op] : ops_) FailOp(op.get(), why, out);
  ops_.clear();
  for (auto& [id, pull] : pulls_) {
    if (!pull->control) out->completions.push_back(Done(OpType::kRecv, pull->recv.context, why, 0));
  }
  pulls_.clear();
  // Receives waiting for messages fail; messages that already arrived stay
  // for receives posted later (data the peer sent before it died comes first).
  for (const PostedRecv& r : matcher_.TakeRecvs()) {
    out->completions.push_back(Done(OpType::kRecv, r.context, why, 0));
  }
}

}  // namespace zsock::verbs
