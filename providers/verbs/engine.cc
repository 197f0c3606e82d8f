// The verbs message engine (see engine.h): setting up, the operations a
// caller posts, posting them in order as the send queue, the send slots and
// the peer's credits allow, and failing everything once when the
// connection ends.
#include "providers/verbs/engine.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/copy.h"
#include "core/log.h"
#include "core/status.h"
#include "providers/verbs/engine_op.h"

namespace zsock::verbs {

Engine::Engine(Endpoint* owner, Transport* transport, EngineConfig config)
    : owner_(owner), t_(transport), cfg_(config) {}

Engine::~Engine() = default;

absl::Status Engine::Prepare() {
  if (auto st = send_slab_.Init(cfg_.eager_size, static_cast<size_t>(cfg_.sq_depth),
                                [&](void* addr, size_t len) {
                                  return t_->Register(addr, len, kLocalRead | kLocalWrite);
                                });
      !st.ok()) {
    return st;
  }
  if (!cfg_.srq) {
    if (auto st = recv_slab_.Init(
            cfg_.eager_size, static_cast<size_t>(cfg_.recv_depth),
            [&](void* addr, size_t len) { return t_->Register(addr, len, kLocalWrite); });
        !st.ok()) {
      return st;
    }
    for (size_t i = 0; i < recv_slab_.count(); ++i) {
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
    *rkey = k->rkey;
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
      body.rkey = k->rkey;
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
    if (needs_slot && !send_slab_.has_free()) return;
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
    op->slot = static_cast<int>(send_slab_.Take());
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
    wr.lkey = LkeyOf(send_slab_.mr());
  } else if (op->kind == Op::kAtomic) {
    wr.local_addr = reinterpret_cast<uint64_t>(slot);
    wr.lkey = LkeyOf(send_slab_.mr());
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

// An explicit credit update; it may take our last credit (Credits).
void Engine::SendCreditUpdate() {
  if (!started_ || dead_ || credits_.pending_return() == 0) return;
  if (sq_used_ >= static_cast<size_t>(cfg_.sq_depth) || !send_slab_.has_free()) return;
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
