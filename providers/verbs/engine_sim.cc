// The simulated pair of connected RC queue pairs (see engine_sim.h).
#include "providers/verbs/engine_sim.h"

#include <cstring>
#include <random>
#include <utility>

#include "gtest/gtest.h"

namespace zsock::verbs::sim {
namespace {

using PendingSend = SimSide::PendingSend;

// How the front work request of a side ended.
enum class Outcome {
  kDone,    // executed; completes (if signaled) and leaves the send queue
  kFailed,  // completed with an error already; the QP is in the error state
  kRnr,     // the peer has no receive posted: retried later
};

// The front request fails with `st`: it completes with it and the QP enters
// the error state.
void FailFront(SimSide* s, ibv_wc_status st) {
  uint64_t id = s->sq_.front().wr.wr_id;
  s->sq_.pop_front();
  s->Complete(id, st, IBV_WC_SEND);
  s->EnterError();
}

// Whether the request's local buffer is covered by its lkey with `need`
// (inline data and empty requests need none).
bool LocalOk(const SimSide* s, const PendingSend& p, int need) {
  return p.wr.num_sge == 0 || (p.wr.send_flags & IBV_SEND_INLINE) ||
         s->mem.Covers(p.sge.lkey, p.sge.addr, p.sge.length, need);
}

Outcome ExecuteSend(SimSide* s, SimSide* t, const PendingSend& p, const uint8_t* data,
                    uint32_t len) {
  if (!LocalOk(s, p, 0)) {
    FailFront(s, IBV_WC_LOC_PROT_ERR);
    return Outcome::kFailed;
  }
  if (t->rq_.empty()) {
    ++s->rnr_naks;  // rnr_retry=7: retried until a receive is posted
    return Outcome::kRnr;
  }
  SimSide::PostedRecv r = t->rq_.front();
  t->rq_.pop_front();
  if (len > r.sge.length || !t->mem.Covers(r.sge.lkey, r.sge.addr, len, IBV_ACCESS_LOCAL_WRITE)) {
    t->Complete(r.wr_id, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV);
    t->EnterError();
    FailFront(s, IBV_WC_REM_INV_REQ_ERR);
    return Outcome::kFailed;
  }
  if (len > 0) std::memcpy(reinterpret_cast<void*>(r.sge.addr), data, len);
  t->Complete(r.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, len);
  return Outcome::kDone;
}

Outcome ExecuteRdma(SimSide* s, SimSide* t, const PendingSend& p, const uint8_t* data,
                    uint32_t len) {
  const ibv_send_wr& wr = p.wr;
  const bool read = wr.opcode == IBV_WR_RDMA_READ;
  if (!LocalOk(s, p, read ? IBV_ACCESS_LOCAL_WRITE : 0)) {
    FailFront(s, IBV_WC_LOC_PROT_ERR);
    return Outcome::kFailed;
  }
  if (!t->mem.Covers(wr.wr.rdma.rkey, wr.wr.rdma.remote_addr, len,
                     read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE)) {
    FailFront(s, IBV_WC_REM_ACCESS_ERR);
    return Outcome::kFailed;
  }
  if (len > 0) {
    if (read) {
      std::memcpy(reinterpret_cast<void*>(p.sge.addr),
                  reinterpret_cast<const void*>(wr.wr.rdma.remote_addr), len);
    } else {
      std::memcpy(reinterpret_cast<void*>(wr.wr.rdma.remote_addr), data, len);
    }
  }
  return Outcome::kDone;
}

Outcome ExecuteAtomic(SimSide* s, SimSide* t, const PendingSend& p, uint32_t len) {
  const ibv_send_wr& wr = p.wr;
  if (!LocalOk(s, p, IBV_ACCESS_LOCAL_WRITE) || len != 8) {
    FailFront(s, IBV_WC_LOC_PROT_ERR);
    return Outcome::kFailed;
  }
  if (wr.wr.atomic.remote_addr % 8 != 0 ||
      !t->mem.Covers(wr.wr.atomic.rkey, wr.wr.atomic.remote_addr, 8, IBV_ACCESS_REMOTE_ATOMIC)) {
    FailFront(s, IBV_WC_REM_ACCESS_ERR);
    return Outcome::kFailed;
  }
  auto* word = reinterpret_cast<uint64_t*>(wr.wr.atomic.remote_addr);
  uint64_t old = *word;
  if (wr.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
    *word = old + wr.wr.atomic.compare_add;
  } else if (old == wr.wr.atomic.compare_add) {
    *word = wr.wr.atomic.swap;
  }
  std::memcpy(reinterpret_cast<void*>(p.sge.addr), &old, 8);
  return Outcome::kDone;
}

}  // namespace

bool Execute(SimSide* s) {
  if (s->sq_.empty() || s->error_) return false;
  SimSide* t = s->peer;
  const PendingSend& p = s->sq_.front();
  const ibv_send_wr& wr = p.wr;
  const uint32_t len = wr.num_sge > 0 ? p.sge.length : 0;
  if (t->dead_ || t->error_) {
    FailFront(s, IBV_WC_RETRY_EXC_ERR);
    return true;
  }
  const uint8_t* data = (wr.send_flags & IBV_SEND_INLINE)
                            ? p.inline_data.data()
                            : reinterpret_cast<const uint8_t*>(p.sge.addr);
  Outcome outcome;
  switch (wr.opcode) {
    case IBV_WR_SEND:
      outcome = ExecuteSend(s, t, p, data, len);
      break;
    case IBV_WR_RDMA_READ:
    case IBV_WR_RDMA_WRITE:
      outcome = ExecuteRdma(s, t, p, data, len);
      break;
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
    case IBV_WR_ATOMIC_CMP_AND_SWP:
      outcome = ExecuteAtomic(s, t, p, len);
      break;
    default:
      FailFront(s, IBV_WC_LOC_QP_OP_ERR);
      return true;
  }
  if (outcome == Outcome::kRnr) return false;
  if (outcome == Outcome::kFailed) return true;
  uint64_t id = wr.wr_id;
  bool signaled = wr.send_flags & IBV_SEND_SIGNALED;
  s->sq_.pop_front();
  if (signaled) s->Complete(id, IBV_WC_SUCCESS, IBV_WC_SEND, len);
  return true;
}

Pair::Pair(EngineConfig ca, EngineConfig cb)
    : a(ca.sq_depth, ca.max_inline), b(cb.sq_depth, cb.max_inline),
      ea(nullptr, &a, ca), eb(nullptr, &b, cb) {
  a.peer = &b;
  b.peer = &a;
  if (ca.srq) a.MakeSrq(static_cast<size_t>(ca.recv_depth), ca.srq_slot_size);
  if (cb.srq) b.MakeSrq(static_cast<size_t>(cb.recv_depth), cb.srq_slot_size);
  EXPECT_TRUE(ea.Prepare().ok());
  EXPECT_TRUE(eb.Prepare().ok());
  ea.Start(HelloOf(cb), "b");
  eb.Start(HelloOf(ca), "a");
}

Hello Pair::HelloOf(const EngineConfig& c) {
  Hello h;
  h.flags = kHelloAtomics | (c.srq ? kHelloSrq : 0);
  h.credits = static_cast<uint32_t>(c.recv_depth);
  h.eager_size = static_cast<uint32_t>(c.eager_size);
  return h;
}

void Pair::Settle() {
  for (int round = 0; round < 200000; ++round) {
    bool moved = false;
    while (Execute(&a)) moved = true;
    while (Execute(&b)) moved = true;
    moved |= ea.Progress(&oa) > 0;
    moved |= eb.Progress(&ob) > 0;
    if (!moved) return;
  }
  ADD_FAILURE() << "the simulation did not settle";
}

std::optional<Completion> Pair::Next(EngineOutput* out) {
  Settle();
  if (out->completions.empty()) return std::nullopt;
  Completion c = std::move(out->completions.front());
  out->completions.erase(out->completions.begin());
  return c;
}

EngineConfig Small() {
  EngineConfig c;
  c.sq_depth = 8;
  c.recv_depth = 4;
  c.eager_size = 512;
  c.max_inline = 64;
  c.max_msg_sz = 64 * 1024;  // rendezvous pulls of more are split in chunks
  return c;
}

void Fill(uint8_t* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(rng());
}

}  // namespace zsock::verbs::sim
