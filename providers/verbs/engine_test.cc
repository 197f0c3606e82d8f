// The verbs message engine end to end over a simulated pair of connected
// RC queue pairs: no device is needed. The simulation executes the
// ibv_send_wr / ibv_recv_wr the engines post the way an HCA does (SEND into
// the next posted receive, RDMA READ/WRITE and atomics checked against the
// target's registrations by rkey, inline data copied at post time, RNR when
// no receive is posted, error states that flush everything) and reports
// ibv_wc entries, so what is tested here is the protocol: framing,
// eager/rendezvous, matching, credits, back-pressure and teardown.
#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/provider.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "providers/verbs/engine.h"
#include "providers/verbs/verbs_core.h"

namespace zsock::verbs {
namespace {

// Registrations of one simulated host: lkey/rkey -> range and rights.
class SimMemory : public Registrar {
 public:
  struct Mr {
    uint64_t addr;
    uint64_t len;
    int access;
    bool live = true;
  };
  absl::StatusOr<Keys> Register(void* addr, size_t len, int ibv_access) override {
    uint32_t key = next_++;
    mrs_[key] = Mr{reinterpret_cast<uint64_t>(addr), len, ibv_access};
    ++registrations;
    return Keys{reinterpret_cast<void*>(uintptr_t{key}), key, key};
  }
  void Deregister(void* handle) noexcept override {
    mrs_[static_cast<uint32_t>(reinterpret_cast<uintptr_t>(handle))].live = false;
  }
  // Whether key covers [addr, addr + len) with `need` (IBV_ACCESS_* bits; 0
  // = local read, always granted).
  bool Covers(uint32_t key, uint64_t addr, uint64_t len, int need) const {
    auto it = mrs_.find(key);
    if (it == mrs_.end() || !it->second.live) return false;
    const Mr& m = it->second;
    return addr >= m.addr && len <= m.len && addr - m.addr <= m.len - len &&
           (m.access & need) == need;
  }
  RegTable table;
  int registrations = 0;

 private:
  uint32_t next_ = 0x100;
  std::map<uint32_t, Mr> mrs_;
};

class SimSide;

// One side of the connection: the engine's Transport.
class SimSide : public Transport {
 public:
  struct PendingSend {
    ibv_send_wr wr;
    ibv_sge sge;
    std::vector<uint8_t> inline_data;
  };
  struct PostedRecv {
    uint64_t wr_id;
    ibv_sge sge;
  };

  SimSide(int sq_depth, uint32_t max_inline) : sq_depth_(sq_depth), max_inline_(max_inline) {}
  ~SimSide() override { srq_mr_.reset(); }  // before `mem`, its registrar

  // A shared receive queue: `slots` buffers of `size` bytes.
  void MakeSrq(size_t slots, size_t size) {
    srq_mem_.assign(slots * size, 0);
    srq_size_ = size;
    auto mr = Register(srq_mem_.data(), srq_mem_.size(), kLocalWrite);
    srq_mr_ = std::move(*mr);
    for (size_t i = 0; i < slots; ++i) RepostSrq(i);
  }
  const uint8_t* SrqBuffer(size_t slot) override { return srq_mem_.data() + slot * srq_size_; }
  void RepostSrq(size_t slot) override {
    ibv_sge sge{reinterpret_cast<uint64_t>(srq_mem_.data() + slot * srq_size_),
                static_cast<uint32_t>(srq_size_), LkeyOf(srq_mr_.get())};
    rq_.push_back(PostedRecv{Engine::kRecvBit | slot, sge});
    ++srq_reposts;
  }
  std::vector<uint8_t> srq_mem_;
  size_t srq_size_ = 0;
  std::unique_ptr<MemoryRegion> srq_mr_;
  int srq_reposts = 0;

  int PostSend(ibv_send_wr* wr) override {
    if (error_) return EINVAL;
    if (static_cast<int>(sq_.size() + unpolled_sends_) >= sq_depth_) {
      ++overflows;
      return ENOMEM;
    }
    PendingSend p;
    p.wr = *wr;
    if (wr->num_sge > 0) p.sge = wr->sg_list[0];
    p.wr.sg_list = wr->num_sge > 0 ? &p.sge : nullptr;
    if (wr->send_flags & IBV_SEND_INLINE) {
      if (wr->num_sge > 0 && p.sge.length > max_inline_) return EINVAL;
      if (wr->num_sge > 0) {
        const auto* src = reinterpret_cast<const uint8_t*>(p.sge.addr);
        p.inline_data.assign(src, src + p.sge.length);
      }
      ++inline_posts;
    }
    if (wr->opcode == IBV_WR_SEND) ++sends_posted;
    sq_.push_back(std::move(p));
    return 0;
  }
  int PostRecv(ibv_recv_wr* wr) override {
    if (error_) return EINVAL;
    rq_.push_back(PostedRecv{wr->wr_id, wr->sg_list[0]});
    return 0;
  }
  int Poll(int n, ibv_wc* wc) override {
    int got = 0;
    while (got < n && !cq_.empty()) {
      wc[got] = cq_.front();
      cq_.pop_front();
      if (!(wc[got].wr_id & Engine::kRecvBit)) --unpolled_sends_;
      ++got;
    }
    return got;
  }
  absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(void* addr, size_t len,
                                                         uint32_t access) override {
    return verbs::Register(&mem, &mem.table, addr, len, access);
  }
  absl::StatusOr<std::shared_ptr<MemoryRegion>> Pin(void* addr, size_t len,
                                                    uint32_t access) override {
    ++pins;
    auto r = verbs::Register(&mem, &mem.table, addr, len, access);
    if (!r.ok()) return r.status();
    return std::shared_ptr<MemoryRegion>(std::move(*r));
  }

  void Complete(uint64_t wr_id, ibv_wc_status st, ibv_wc_opcode opcode, uint32_t len = 0) {
    ibv_wc wc{};
    wc.wr_id = wr_id;
    wc.status = st;
    wc.opcode = opcode;
    wc.byte_len = len;
    cq_.push_back(wc);
    if (!(wr_id & Engine::kRecvBit)) ++unpolled_sends_;
  }

  // The QP enters the error state: everything posted is flushed.
  void EnterError() {
    if (error_) return;
    error_ = true;
    for (auto& p : sq_) Complete(p.wr.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND);
    sq_.clear();
    for (auto& r : rq_) Complete(r.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV);
    rq_.clear();
  }

  SimMemory mem;
  SimSide* peer = nullptr;
  std::deque<PendingSend> sq_;
  std::deque<PostedRecv> rq_;
  std::deque<ibv_wc> cq_;
  int unpolled_sends_ = 0;
  int sq_depth_;
  uint32_t max_inline_;
  bool error_ = false;
  bool dead_ = false;  // the process is gone: nothing answers
  int overflows = 0;
  int inline_posts = 0;
  int sends_posted = 0;
  int rnr_naks = 0;
  int pins = 0;
};

// Executes the front work request of `s` against its peer; false if none
// could run (empty, or RNR: the peer has no receive posted).
bool Execute(SimSide* s) {
  if (s->sq_.empty() || s->error_) return false;
  SimSide* t = s->peer;
  SimSide::PendingSend& p = s->sq_.front();
  const ibv_send_wr& wr = p.wr;
  const uint32_t len = wr.num_sge > 0 ? p.sge.length : 0;
  auto local = [&](int need) {
    return wr.num_sge == 0 || (wr.send_flags & IBV_SEND_INLINE) ||
           s->mem.Covers(p.sge.lkey, p.sge.addr, p.sge.length, need);
  };
  auto fail = [&](ibv_wc_status st) {
    uint64_t id = wr.wr_id;
    s->sq_.pop_front();
    s->Complete(id, st, IBV_WC_SEND);
    s->EnterError();
  };
  if (t->dead_ || t->error_) {
    fail(IBV_WC_RETRY_EXC_ERR);
    return true;
  }
  const uint8_t* data = (wr.send_flags & IBV_SEND_INLINE) ? p.inline_data.data()
                                                          : reinterpret_cast<const uint8_t*>(p.sge.addr);
  switch (wr.opcode) {
    case IBV_WR_SEND: {
      if (!local(0)) {
        fail(IBV_WC_LOC_PROT_ERR);
        return true;
      }
      if (t->rq_.empty()) {
        ++s->rnr_naks;  // rnr_retry=7: retried until a receive is posted
        return false;
      }
      SimSide::PostedRecv r = t->rq_.front();
      t->rq_.pop_front();
      if (len > r.sge.length || !t->mem.Covers(r.sge.lkey, r.sge.addr, len, IBV_ACCESS_LOCAL_WRITE)) {
        t->Complete(r.wr_id, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV);
        t->EnterError();
        fail(IBV_WC_REM_INV_REQ_ERR);
        return true;
      }
      if (len > 0) std::memcpy(reinterpret_cast<void*>(r.sge.addr), data, len);
      t->Complete(r.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, len);
      break;
    }
    case IBV_WR_RDMA_READ:
    case IBV_WR_RDMA_WRITE: {
      const bool read = wr.opcode == IBV_WR_RDMA_READ;
      if (!local(read ? IBV_ACCESS_LOCAL_WRITE : 0)) {
        fail(IBV_WC_LOC_PROT_ERR);
        return true;
      }
      if (!t->mem.Covers(wr.wr.rdma.rkey, wr.wr.rdma.remote_addr, len,
                         read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE)) {
        fail(IBV_WC_REM_ACCESS_ERR);
        return true;
      }
      if (len > 0) {
        if (read) {
          std::memcpy(reinterpret_cast<void*>(p.sge.addr),
                      reinterpret_cast<const void*>(wr.wr.rdma.remote_addr), len);
        } else {
          std::memcpy(reinterpret_cast<void*>(wr.wr.rdma.remote_addr), data, len);
        }
      }
      break;
    }
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
    case IBV_WR_ATOMIC_CMP_AND_SWP: {
      if (!local(IBV_ACCESS_LOCAL_WRITE) || len != 8) {
        fail(IBV_WC_LOC_PROT_ERR);
        return true;
      }
      if (wr.wr.atomic.remote_addr % 8 != 0 ||
          !t->mem.Covers(wr.wr.atomic.rkey, wr.wr.atomic.remote_addr, 8, IBV_ACCESS_REMOTE_ATOMIC)) {
        fail(IBV_WC_REM_ACCESS_ERR);
        return true;
      }
      auto* word = reinterpret_cast<uint64_t*>(wr.wr.atomic.remote_addr);
      uint64_t old = *word;
      if (wr.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
        *word = old + wr.wr.atomic.compare_add;
      } else if (old == wr.wr.atomic.compare_add) {
        *word = wr.wr.atomic.swap;
      }
      std::memcpy(reinterpret_cast<void*>(p.sge.addr), &old, 8);
      break;
    }
    default:
      fail(IBV_WC_LOC_QP_OP_ERR);
      return true;
  }
  uint64_t id = wr.wr_id;
  bool signaled = wr.send_flags & IBV_SEND_SIGNALED;
  s->sq_.pop_front();
  if (signaled) s->Complete(id, IBV_WC_SUCCESS, IBV_WC_SEND, len);
  return true;
}

// A connected pair of engines over the simulation.
struct Pair {
  explicit Pair(EngineConfig ca, EngineConfig cb)
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
  static Hello HelloOf(const EngineConfig& c) {
    Hello h;
    h.flags = kHelloAtomics | (c.srq ? kHelloSrq : 0);
    h.credits = static_cast<uint32_t>(c.recv_depth);
    h.eager_size = static_cast<uint32_t>(c.eager_size);
    return h;
  }
  // Runs the wire and both engines until nothing moves.
  void Settle() {
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
  // The next completion of a side (settling as needed).
  std::optional<Completion> Next(EngineOutput* out) {
    Settle();
    if (out->completions.empty()) return std::nullopt;
    Completion c = std::move(out->completions.front());
    out->completions.erase(out->completions.begin());
    return c;
  }
  SimSide a, b;
  Engine ea, eb;
  EngineOutput oa, ob;
};

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

TEST(Engine, SizesFromZeroToFourMiBArriveByteExact) {
  Pair w(Small(), Small());
  const std::vector<size_t> sizes = {0, 1, 7, 40, 64 - kHeaderSize, 64 - kHeaderSize + 1, 487,
                                     488, 489, 4096, 65535, 65536, 65537, 200000, (4u << 20) + 3};
  std::vector<uint8_t> out(sizes.back()), in(sizes.back());
  for (size_t i = 0; i < sizes.size(); ++i) {
    Fill(out.data(), sizes[i], i);
    std::fill(in.begin(), in.end(), 0);
    ASSERT_TRUE(w.eb.PostRecv(in.data(), in.size(), nullptr, 100 + i, &w.ob).ok());
    ASSERT_TRUE(w.ea.Send(out.data(), sizes[i], nullptr, i, false, &w.oa).ok());
    auto r = w.Next(&w.ob);
    ASSERT_TRUE(r.has_value()) << "size " << sizes[i];
    ASSERT_TRUE(r->status.ok()) << r->status;
    EXPECT_EQ(r->op, OpType::kRecv);
    EXPECT_EQ(r->context, 100 + i);
    ASSERT_EQ(r->length, sizes[i]);
    EXPECT_EQ(std::memcmp(in.data(), out.data(), sizes[i]), 0) << "size " << sizes[i];
    auto s = w.Next(&w.oa);
    ASSERT_TRUE(s.has_value());
    ASSERT_TRUE(s->status.ok()) << s->status;
    EXPECT_EQ(s->op, OpType::kSend);
    EXPECT_EQ(s->context, i);
    EXPECT_EQ(s->length, sizes[i]);
  }
  EXPECT_EQ(w.a.overflows + w.b.overflows, 0);
  EXPECT_GT(w.a.inline_posts, 0) << "small messages go inline";
  EXPECT_GT(w.b.pins, 0) << "the receiver registers unregistered buffers through the cache";
  EXPECT_GT(w.a.pins, 0) << "the sender exposes large buffers through the cache";
}

TEST(Engine, InlineSendsCompleteAtOnce) {
  Pair w(Small(), Small());
  char msg[8] = "inline";
  ASSERT_TRUE(w.ea.Send(msg, sizeof(msg), nullptr, 7, false, &w.oa).ok());
  // Reported before any progress: the data was copied at post time.
  ASSERT_EQ(w.oa.completions.size(), 1u);
  EXPECT_EQ(w.oa.completions[0].context, 7u);
  EXPECT_TRUE(w.oa.completions[0].status.ok());
  EXPECT_EQ(w.a.inline_posts, 1);
  std::memset(msg, 'x', sizeof(msg));  // reusing the buffer changes nothing
  char in[16] = {};
  ASSERT_TRUE(w.eb.PostRecv(in, sizeof(in), nullptr, 1, &w.ob).ok());
  auto r = w.Next(&w.ob);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(std::string(in), "inline");
  w.Settle();
  EXPECT_EQ(w.oa.completions.size(), 1u) << "the inline send is reported exactly once";
}

// 2000 messages of mixed sizes with a small send queue, few credits and a
// window of 32 receives: order kept, each completes once, the send queue
// never overflows and the receiver is never overrun.
TEST(Engine, ManyOutstandingWithBackPressureAndCredits) {
  constexpr int kMessages = 2000;
  Pair w(Small(), Small());
  std::vector<std::vector<uint8_t>> msgs(kMessages);
  for (int i = 0; i < kMessages; ++i) {
    msgs[i].resize(8 + (static_cast<size_t>(i) * 7919) % 3000);
    Fill(msgs[i].data(), msgs[i].size(), i);
    std::memcpy(msgs[i].data(), &i, sizeof(i));
    ASSERT_TRUE(w.ea.Send(msgs[i].data(), msgs[i].size(), nullptr, i, false, &w.oa).ok());
  }
  EXPECT_LE(w.ea.sq_used(), 8u);
  EXPECT_GT(w.ea.backlog(), 0u) << "the backlog absorbs what the send queue cannot take";
  constexpr int kWindow = 32;
  std::vector<std::vector<uint8_t>> bufs(kWindow, std::vector<uint8_t>(4000));
  std::vector<int> slot_of(kMessages, -1);
  int next_post = 0;
  auto post = [&](int slot) {
    slot_of[next_post] = slot;
    return w.eb.PostRecv(bufs[slot].data(), bufs[slot].size(), nullptr, next_post++, &w.ob);
  };
  for (int b = 0; b < kWindow; ++b) ASSERT_TRUE(post(b).ok());
  std::vector<int> got(kMessages, 0);
  for (int n = 0; n < kMessages; ++n) {
    auto c = w.Next(&w.ob);
    ASSERT_TRUE(c.has_value()) << "after " << n;
    ASSERT_TRUE(c->status.ok()) << c->status;
    const int k = static_cast<int>(c->context);
    ASSERT_TRUE(k >= 0 && k < next_post && ++got[k] == 1);
    int seq;
    std::memcpy(&seq, bufs[slot_of[k]].data(), sizeof(seq));
    ASSERT_EQ(seq, k);
    ASSERT_EQ(c->length, msgs[k].size());
    ASSERT_EQ(std::memcmp(bufs[slot_of[k]].data(), msgs[k].data(), c->length), 0);
    if (next_post < kMessages) {
      ASSERT_TRUE(post(slot_of[k]).ok());
    }
  }
  w.Settle();
  std::vector<int> sent(kMessages, 0);
  for (const Completion& c : w.oa.completions) {
    ASSERT_TRUE(c.status.ok()) << c.status;
    ++sent[c.context];
  }
  for (int i = 0; i < kMessages; ++i) ASSERT_EQ(sent[i], 1) << i;
  EXPECT_EQ(w.a.overflows, 0);
  EXPECT_EQ(w.a.rnr_naks, 0) << "credits must keep the sender within the receiver's buffers";
  EXPECT_EQ(w.b.rnr_naks, 0);
  EXPECT_TRUE(w.ea.Idle());
}

// Both sides send at once, eager and rendezvous mixed, with 4 credits each:
// neither waits for the other forever (credit updates get through while
// both backlogs are blocked), and no receiver is overrun.
TEST(Engine, BothDirectionsAtOnceWithFewCredits) {
  constexpr int kMessages = 300;
  Pair w(Small(), Small());
  std::vector<std::vector<uint8_t>> out(kMessages);
  for (int i = 0; i < kMessages; ++i) {
    out[i].assign(i % 3 == 0 ? 3000 : 100, static_cast<uint8_t>(i));
    ASSERT_TRUE(w.ea.Send(out[i].data(), out[i].size(), nullptr, i, false, &w.oa).ok());
    ASSERT_TRUE(w.eb.Send(out[i].data(), out[i].size(), nullptr, i, false, &w.ob).ok());
  }
  std::vector<std::vector<uint8_t>> ina(kMessages, std::vector<uint8_t>(4000)),
      inb(kMessages, std::vector<uint8_t>(4000));
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_TRUE(w.ea.PostRecv(ina[i].data(), 4000, nullptr, 1000 + i, &w.oa).ok());
    ASSERT_TRUE(w.eb.PostRecv(inb[i].data(), 4000, nullptr, 1000 + i, &w.ob).ok());
  }
  w.Settle();
  for (EngineOutput* o : {&w.oa, &w.ob}) {
    std::map<uint64_t, int> seen;
    for (const Completion& c : o->completions) {
      ASSERT_TRUE(c.status.ok()) << c.status;
      ++seen[c.context];
      if (c.context >= 1000) {
        const int i = static_cast<int>(c.context - 1000);
        ASSERT_EQ(c.length, out[i].size());
      }
    }
    EXPECT_EQ(seen.size(), size_t{2 * kMessages}) << "every send and receive completed";
    for (const auto& [ctx, n] : seen) EXPECT_EQ(n, 1) << ctx;
  }
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_EQ(std::memcmp(ina[i].data(), out[i].data(), out[i].size()), 0) << i;
    ASSERT_EQ(std::memcmp(inb[i].data(), out[i].data(), out[i].size()), 0) << i;
  }
  EXPECT_EQ(w.a.overflows + w.b.overflows, 0);
  EXPECT_EQ(w.a.rnr_naks + w.b.rnr_naks, 0) << "credits keep both receivers ahead";
  EXPECT_TRUE(w.ea.Idle());
  EXPECT_TRUE(w.eb.Idle());
}

// Messages that arrive before any receive is posted wait (no RNR, no loss).
TEST(Engine, UnexpectedMessagesWaitForReceives) {
  Pair w(Small(), Small());
  std::vector<std::string> msgs = {"early one", std::string(2000, 'r'), "early three"};
  for (size_t i = 0; i < msgs.size(); ++i) {
    ASSERT_TRUE(w.ea.Send(msgs[i].data(), msgs[i].size(), nullptr, i, false, &w.oa).ok());
  }
  w.Settle();
  EXPECT_EQ(w.a.rnr_naks, 0);
  for (size_t i = 0; i < msgs.size(); ++i) {
    std::string in(4096, 0);
    ASSERT_TRUE(w.eb.PostRecv(in.data(), in.size(), nullptr, i, &w.ob).ok());
    auto c = w.Next(&w.ob);
    ASSERT_TRUE(c.has_value());
    ASSERT_TRUE(c->status.ok()) << c->status;
    EXPECT_EQ(in.substr(0, c->length), msgs[i]);
  }
}

TEST(Engine, OversizedMessagesFailOnlyTheirReceive) {
  Pair w(Small(), Small());
  for (size_t big : {size_t{300}, size_t{100000}}) {  // eager, then rendezvous
    std::string msg(big, 'x'), after = "after";
    ASSERT_TRUE(w.ea.Send(msg.data(), msg.size(), nullptr, 1, false, &w.oa).ok());
    ASSERT_TRUE(w.ea.Send(after.data(), after.size(), nullptr, 2, false, &w.oa).ok());
    std::string small(10, 0);
    ASSERT_TRUE(w.eb.PostRecv(small.data(), small.size(), nullptr, 10, &w.ob).ok());
    auto c = w.Next(&w.ob);
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->status.code(), absl::StatusCode::kOutOfRange) << c->status;
    EXPECT_EQ(StatusErrno(c->status), EMSGSIZE);
    std::string next(64, 0);
    ASSERT_TRUE(w.eb.PostRecv(next.data(), next.size(), nullptr, 11, &w.ob).ok());
    auto n = w.Next(&w.ob);
    ASSERT_TRUE(n.has_value());
    ASSERT_TRUE(n->status.ok()) << n->status;
    EXPECT_EQ(next.substr(0, n->length), "after");
    w.Settle();
    // Both sends succeeded (the receiver consumed the big one).
    int sends = 0;
    for (const Completion& s : w.oa.completions) {
      EXPECT_TRUE(s.status.ok()) << s.status;
      ++sends;
    }
    EXPECT_EQ(sends, 2);
    w.oa.completions.clear();
  }
}

TEST(Engine, RdmaReadWriteAndAtomics) {
  Pair w(Small(), Small());
  std::vector<uint8_t> target(3 * 4096, 0xee);
  auto mr = w.b.Register(target.data(), target.size(), kAccessAll);
  ASSERT_TRUE(mr.ok());
  RemoteKey key = (*mr)->remote_key();
  std::vector<uint8_t> local(5000);
  Fill(local.data(), local.size(), 9);
  // A small write goes inline and needs no registration.
  ASSERT_TRUE(w.ea.Rma(WrKind::kRdmaWrite, local.data(), 40, nullptr, key.addr + 3, key, 1, &w.oa).ok());
  auto c = w.Next(&w.oa);
  ASSERT_TRUE(c.has_value() && c->status.ok());
  EXPECT_EQ(c->op, OpType::kWrite);
  EXPECT_EQ(std::memcmp(target.data() + 3, local.data(), 40), 0);
  EXPECT_EQ(target[2], 0xee);
  EXPECT_EQ(target[43], 0xee);
  ASSERT_TRUE(w.ea.Rma(WrKind::kRdmaWrite, local.data(), 5000, nullptr, key.addr + 4000, key, 2, &w.oa).ok());
  c = w.Next(&w.oa);
  ASSERT_TRUE(c.has_value() && c->status.ok()) << (c ? c->status.ToString() : "none");
  EXPECT_EQ(std::memcmp(target.data() + 4000, local.data(), 5000), 0);
  std::vector<uint8_t> back(5000, 0);
  ASSERT_TRUE(w.ea.Rma(WrKind::kRdmaRead, back.data(), 5000, nullptr, key.addr + 4000, key, 3, &w.oa).ok());
  c = w.Next(&w.oa);
  ASSERT_TRUE(c.has_value() && c->status.ok());
  EXPECT_EQ(c->op, OpType::kRead);
  EXPECT_EQ(c->length, 5000u);
  EXPECT_EQ(back, std::vector<uint8_t>(local.begin(), local.begin() + 5000));

  auto* word = reinterpret_cast<uint64_t*>(target.data() + 8192);
  *word = 40;
  uint64_t old = 0;
  ASSERT_TRUE(w.ea.Atomic(WrKind::kFetchAdd, &old, key.addr + 8192, key, 2, 0, 4, &w.oa).ok());
  c = w.Next(&w.oa);
  ASSERT_TRUE(c.has_value() && c->status.ok());
  EXPECT_EQ(c->op, OpType::kFetchAdd);
  EXPECT_EQ(old, 40u);
  EXPECT_EQ(*word, 42u);
  ASSERT_TRUE(w.ea.Atomic(WrKind::kCompareSwap, &old, key.addr + 8192, key, 42, 7, 5, &w.oa).ok());
  c = w.Next(&w.oa);
  ASSERT_TRUE(c.has_value() && c->status.ok());
  EXPECT_EQ(old, 42u);
  EXPECT_EQ(*word, 7u);
  ASSERT_TRUE(w.ea.Atomic(WrKind::kCompareSwap, &old, key.addr + 8192, key, 42, 9, 6, &w.oa).ok());
  c = w.Next(&w.oa);
  ASSERT_TRUE(c.has_value() && c->status.ok());
  EXPECT_EQ(old, 7u);
  EXPECT_EQ(*word, 7u) << "compare failed: no swap";
  // Misaligned atomics and ranges outside the key fail before posting.
  EXPECT_EQ(w.ea.Atomic(WrKind::kFetchAdd, &old, key.addr + 8196, key, 1, 0, 7, &w.oa).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.ea.Rma(WrKind::kRdmaRead, back.data(), 16, nullptr, key.addr + target.size() - 8,
                     key, 8, &w.oa).code(),
            absl::StatusCode::kOutOfRange);
}

// A forged key (wider than the registration) passes the initiator's check
// but the target's HCA refuses it: REM_ACCESS_ERR, the connection ends and
// everything else fails exactly once.
TEST(Engine, RefusedAccessEndsTheConnection) {
  Pair w(Small(), Small());
  std::vector<uint8_t> target(4096, 0x5a);
  auto mr = w.b.Register(target.data(), target.size(), kRemoteRead);
  ASSERT_TRUE(mr.ok());
  RemoteKey forged = (*mr)->remote_key();
  forged.length += 4096;
  std::vector<uint8_t> buf(64);
  std::string pending(8, 'p');
  std::string in(64, 0);
  ASSERT_TRUE(w.ea.PostRecv(in.data(), in.size(), nullptr, 50, &w.oa).ok());
  ASSERT_TRUE(w.ea.Rma(WrKind::kRdmaRead, buf.data(), 16, nullptr, forged.addr + 4096, forged, 1, &w.oa).ok());
  w.Settle();
  std::map<uint64_t, absl::Status> seen;
  for (const Completion& c : w.oa.completions) {
    EXPECT_FALSE(seen.contains(c.context)) << c.context;
    seen[c.context] = c.status;
  }
  ASSERT_TRUE(seen.contains(1));
  EXPECT_EQ(seen[1].code(), absl::StatusCode::kPermissionDenied) << seen[1];
  EXPECT_TRUE(absl::StrContains(seen[1].message(), "remote access error")) << seen[1];
  ASSERT_TRUE(seen.contains(50)) << "the posted receive fails too";
  EXPECT_EQ(seen[50].code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(w.ea.dead());
  auto later = w.ea.Send(pending.data(), pending.size(), nullptr, 2, false, &w.oa);
  EXPECT_EQ(later.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(StatusErrno(later), ECONNRESET);
  EXPECT_TRUE(w.oa.fail_emulated);
}

// The peer dies: operations in flight and queued fail once, within the
// engine's own progress; data already received is still delivered.
TEST(Engine, DeadPeerFailsEverythingOnceButKeepsWhatArrived) {
  Pair w(Small(), Small());
  std::string early = "sent before dying";
  ASSERT_TRUE(w.eb.Send(early.data(), early.size(), nullptr, 1, false, &w.ob).ok());
  w.Settle();
  w.b.dead_ = true;
  std::vector<uint8_t> big(100000, 3);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(w.ea.Send(big.data(), i % 2 ? 100 : big.size(), nullptr, 100 + i, false, &w.oa).ok());
  }
  w.Settle();
  std::map<uint64_t, int> count;
  for (const Completion& c : w.oa.completions) {
    ++count[c.context];
    EXPECT_EQ(c.status.code(), absl::StatusCode::kAborted) << c.status;
    EXPECT_EQ(StatusErrno(c.status), ECONNRESET);
  }
  // Inline sends completed at post; the rest failed, each exactly once.
  for (int i = 0; i < 20; ++i) EXPECT_LE(count[100 + i], 1) << i;
  EXPECT_TRUE(w.ea.dead());
  EXPECT_TRUE(absl::StrContains(w.ea.dead_status().ToString(), "dead or unreachable"))
      << w.ea.dead_status();
  // What arrived before the death is still delivered.
  std::string in(64, 0);
  ASSERT_TRUE(w.ea.PostRecv(in.data(), in.size(), nullptr, 9, &w.oa).ok());
  ASSERT_FALSE(w.oa.completions.empty());
  EXPECT_TRUE(w.oa.completions.back().status.ok());
  EXPECT_EQ(in.substr(0, w.oa.completions.back().length), early);
  // After that, receives fail at once.
  EXPECT_FALSE(w.ea.PostRecv(in.data(), in.size(), nullptr, 10, &w.oa).ok());
}

TEST(Engine, CloseWaitsForRendezvousAndAnnouncesTheCount) {
  Pair w(Small(), Small());
  std::vector<uint8_t> big(50000, 1);
  std::string small = "small";
  ASSERT_TRUE(w.ea.Send(big.data(), big.size(), nullptr, 1, false, &w.oa).ok());
  ASSERT_TRUE(w.ea.Send(small.data(), small.size(), nullptr, 2, false, &w.oa).ok());
  w.ea.QueueClose(&w.oa);
  w.Settle();
  EXPECT_FALSE(w.ea.Idle()) << "the rendezvous send waits for the receiver's FIN";
  EXPECT_TRUE(w.eb.peer_closed());
  std::vector<uint8_t> in(60000);
  ASSERT_TRUE(w.eb.PostRecv(in.data(), in.size(), nullptr, 1, &w.ob).ok());
  ASSERT_TRUE(w.eb.PostRecv(in.data(), in.size(), nullptr, 2, &w.ob).ok());
  w.Settle();
  EXPECT_TRUE(w.ea.Idle());
  ASSERT_EQ(w.ob.completions.size(), 2u);
  EXPECT_EQ(w.ob.completions[0].length + w.ob.completions[1].length, big.size() + small.size());
  w.ea.Fail(absl::CancelledError("closed"), /*closed=*/true, &w.oa);
  EXPECT_TRUE(w.ea.closed());
  EXPECT_EQ(w.ea.Send(small.data(), small.size(), nullptr, 3, false, &w.oa).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(Engine, ControlMessagesSmallAndLarge) {
  Pair w(Small(), Small());
  std::vector<uint8_t> small(100, 4), large(70000, 5);
  ASSERT_TRUE(w.ea.Send(small.data(), small.size(), nullptr, 0, true, &w.oa).ok());
  ASSERT_TRUE(w.ea.Send(large.data(), large.size(), nullptr, 0, true, &w.oa).ok());
  // A user message waiting for a receive does not hold control traffic up.
  std::string user = "user";
  ASSERT_TRUE(w.ea.Send(user.data(), user.size(), nullptr, 9, false, &w.oa).ok());
  ASSERT_TRUE(w.ea.Send(small.data(), 10, nullptr, 0, true, &w.oa).ok());
  w.Settle();
  ASSERT_EQ(w.ob.control.size(), 3u);
  EXPECT_EQ(w.ob.control[0], small);
  EXPECT_EQ(w.ob.control[1], large);
  EXPECT_EQ(w.ob.control[2], std::vector<uint8_t>(small.begin(), small.begin() + 10));
  EXPECT_TRUE(w.ob.completions.empty());
  for (const Completion& c : w.oa.completions) EXPECT_EQ(c.context, 9u) << "control sends report nothing";
}

TEST(Engine, HostileMessageEndsOnlyThatConnection) {
  Pair w(Small(), Small());
  // The peer's HCA delivers bytes that are not a valid header.
  ASSERT_FALSE(w.b.rq_.empty());
  SimSide::PostedRecv r = w.b.rq_.front();
  w.b.rq_.pop_front();
  std::memset(reinterpret_cast<void*>(r.sge.addr), 0xff, 64);
  w.b.Complete(r.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, 64);
  w.Settle();
  EXPECT_TRUE(w.eb.dead());
  EXPECT_TRUE(absl::StrContains(w.eb.dead_status().message(), "malformed verbs message"))
      << w.eb.dead_status();
  // A rendezvous request naming memory the peer never registered is
  // refused by the (simulated) HCA, not read.
  Pair v(Small(), Small());
  SimSide::PostedRecv q = v.b.rq_.front();
  v.b.rq_.pop_front();
  uint8_t* p = reinterpret_cast<uint8_t*>(q.sge.addr);
  Header h;
  h.type = MsgType::kRts;
  h.cookie = 1;
  EncodeHeader(h, p);
  static uint8_t secret[64];
  EncodeRts(RtsBody{reinterpret_cast<uint64_t>(secret), 64, 0x9999}, p + kHeaderSize);
  v.b.Complete(q.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, kHeaderSize + kRtsBodySize);
  std::vector<uint8_t> in(64);
  ASSERT_TRUE(v.eb.PostRecv(in.data(), in.size(), nullptr, 3, &v.ob).ok());
  v.Settle();
  ASSERT_FALSE(v.ob.completions.empty());
  EXPECT_FALSE(v.ob.completions.back().status.ok());
}

// With a shared receive queue there are no credits: a burst larger than the
// queue is paced by RNR retry (the sender waits, nothing is lost) and every
// buffer goes back to the SRQ.
TEST(Engine, SharedReceiveQueue) {
  EngineConfig srq = Small();
  srq.srq = true;
  srq.srq_slot_size = srq.eager_size;
  Pair w(Small(), srq);
  constexpr int kMessages = 50;
  std::vector<std::string> msgs(kMessages);
  for (int i = 0; i < kMessages; ++i) {
    msgs[i] = std::string(1 + (i * 37) % 1500, static_cast<char>('a' + i % 26));
    ASSERT_TRUE(w.ea.Send(msgs[i].data(), msgs[i].size(), nullptr, i, false, &w.oa).ok());
  }
  EXPECT_EQ(w.ea.credits(), Credits::kUnlimited) << "no credits towards an SRQ";
  EXPECT_LE(w.ea.sq_used(), 8u) << "only the send queue limits";
  w.Settle();
  EXPECT_GT(w.a.rnr_naks, 0) << "the SRQ (4 buffers) paced the burst by RNR";
  std::vector<std::string> in(kMessages, std::string(2000, 0));
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_TRUE(w.eb.PostRecv(in[i].data(), in[i].size(), nullptr, i, &w.ob).ok());
  }
  w.Settle();
  ASSERT_EQ(w.ob.completions.size(), size_t{kMessages});
  for (const Completion& c : w.ob.completions) {
    ASSERT_TRUE(c.status.ok()) << c.status;
    EXPECT_EQ(in[c.context].substr(0, c.length), msgs[c.context]);
  }
  EXPECT_GE(w.b.srq_reposts, 4 + kMessages);
  EXPECT_EQ(w.b.rq_.size(), 4u) << "every SRQ buffer is back";
}

// Random traffic both ways under random limits: every byte arrives in
// order, every operation completes exactly once, no queue overflows.
TEST(Engine, RandomTrafficUnderRandomLimits) {
  for (uint32_t seed = 1; seed <= 25; ++seed) {
    std::mt19937 rng(seed);
    EngineConfig c;
    c.sq_depth = 4 + static_cast<int>(rng() % 13);
    c.recv_depth = 4 + static_cast<int>(rng() % 5);
    c.eager_size = 256 + (rng() % 4) * 512;
    c.max_inline = static_cast<uint32_t>(rng() % 3 == 0 ? 0 : 24 + rng() % 200);
    c.max_msg_sz = 4096u << (rng() % 5);
    Pair w(c, c);
    struct Dir {
      Engine* tx;
      Engine* rx;
      EngineOutput* txo;
      EngineOutput* rxo;
      std::vector<std::vector<uint8_t>> sent;
      std::vector<std::vector<uint8_t>> bufs;
      int posted = 0;
    };
    Dir dirs[2] = {{&w.ea, &w.eb, &w.oa, &w.ob, {}, {}, 0}, {&w.eb, &w.ea, &w.ob, &w.oa, {}, {}, 0}};
    constexpr int kPerDir = 120;
    for (Dir& d : dirs) {
      d.sent.resize(kPerDir);
      d.bufs.assign(kPerDir, std::vector<uint8_t>(40000));
    }
    std::vector<uint8_t> target(8192, 0);
    auto tmr = w.b.Register(target.data(), target.size(), kAccessAll);
    ASSERT_TRUE(tmr.ok());
    RemoteKey tkey = (*tmr)->remote_key();
    std::vector<std::vector<uint8_t>> reads;
    int next_send[2] = {0, 0};
    for (int step = 0; step < 2000; ++step) {
      const int which = static_cast<int>(rng() % 2);
      Dir& d = dirs[which];
      switch (rng() % 5) {
        case 0:
        case 1:
          if (next_send[which] < kPerDir) {
            int i = next_send[which]++;
            size_t len = rng() % 4 == 0 ? rng() % 40000 : rng() % 600;
            d.sent[i].resize(len);
            Fill(d.sent[i].data(), len, seed * 1000 + which * 500 + i);
            ASSERT_TRUE(d.tx->Send(d.sent[i].data(), len, nullptr, i, false, d.txo).ok());
          }
          break;
        case 2:
          if (d.posted < kPerDir) {
            int i = d.posted++;
            ASSERT_TRUE(d.rx->PostRecv(d.bufs[i].data(), d.bufs[i].size(), nullptr, 10000 + i, d.rxo).ok());
          }
          break;
        case 3: {
          size_t off = rng() % 4096, len = 1 + rng() % 4096;
          std::vector<uint8_t> src(len);
          Fill(src.data(), len, step);
          reads.push_back(src);
          ASSERT_TRUE(w.ea.Rma(WrKind::kRdmaWrite, reads.back().data(), len, nullptr, tkey.addr + off,
                               tkey, 50000 + step, &w.oa).ok());
          break;
        }
        default:
          if (rng() % 2) {
            Execute(&w.a);
          } else {
            Execute(&w.b);
          }
          w.ea.Progress(&w.oa);
          w.eb.Progress(&w.ob);
      }
    }
    for (int which = 0; which < 2; ++which) {
      Dir& d = dirs[which];
      while (next_send[which] < kPerDir) {
        int i = next_send[which]++;
        d.sent[i].assign(1 + i % 300, static_cast<uint8_t>(i));
        ASSERT_TRUE(d.tx->Send(d.sent[i].data(), d.sent[i].size(), nullptr, i, false, d.txo).ok());
      }
      while (d.posted < kPerDir) {
        int i = d.posted++;
        ASSERT_TRUE(d.rx->PostRecv(d.bufs[i].data(), d.bufs[i].size(), nullptr, 10000 + i, d.rxo).ok());
      }
    }
    w.Settle();
    ASSERT_FALSE(w.ea.dead()) << "seed " << seed << ": " << w.ea.dead_status();
    ASSERT_FALSE(w.eb.dead()) << "seed " << seed << ": " << w.eb.dead_status();
    for (int which = 0; which < 2; ++which) {
      Dir& d = dirs[which];
      std::map<uint64_t, int> sends, recvs;
      for (const Completion& c : d.txo->completions) {
        ASSERT_TRUE(c.status.ok()) << "seed " << seed << ": " << c.status;
        if (c.op == OpType::kSend) ++sends[c.context];
      }
      for (const Completion& c : d.rxo->completions) {
        ASSERT_TRUE(c.status.ok()) << "seed " << seed << ": " << c.status;
        if (c.op != OpType::kRecv) continue;
        const int i = static_cast<int>(c.context - 10000);
        ++recvs[c.context];
        ASSERT_EQ(c.length, d.sent[i].size()) << "seed " << seed << " dir " << which << " msg " << i;
        // std::equal, not memcmp: an empty message's data() may be null.
        ASSERT_TRUE(std::equal(d.sent[i].begin(), d.sent[i].end(), d.bufs[i].begin()))
            << "seed " << seed << " dir " << which << " msg " << i;
      }
      EXPECT_EQ(sends.size(), size_t{kPerDir}) << "seed " << seed;
      EXPECT_EQ(recvs.size(), size_t{kPerDir}) << "seed " << seed;
      for (const auto& [ctx, n] : sends) EXPECT_EQ(n, 1);
      for (const auto& [ctx, n] : recvs) EXPECT_EQ(n, 1);
    }
    EXPECT_EQ(w.a.overflows + w.b.overflows, 0) << "seed " << seed;
    EXPECT_EQ(w.a.rnr_naks + w.b.rnr_naks, 0) << "seed " << seed;
    EXPECT_TRUE(w.ea.Idle() && w.eb.Idle()) << "seed " << seed;
  }
}

}  // namespace
}  // namespace zsock::verbs
