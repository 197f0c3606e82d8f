// The verbs engine's flow control over the simulated QP pair
// (engine_sim.h): back-pressure from the send queue, credits in one and
// both directions, and a shared receive queue paced by RNR.
#include <cerrno>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/provider.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "providers/verbs/engine.h"
#include "providers/verbs/engine_sim.h"

namespace zsock::verbs::sim {
namespace {

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

}  // namespace
}  // namespace zsock::verbs::sim
