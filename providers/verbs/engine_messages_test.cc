// The verbs engine's messages over the simulated QP pair (engine_sim.h):
// every size byte-exact (eager and rendezvous), inline sends, messages
// that wait for receives, oversized messages, and control messages.
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

}  // namespace
}  // namespace zsock::verbs::sim
