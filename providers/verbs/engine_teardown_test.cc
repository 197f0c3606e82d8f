// How a verbs engine's connection ends, over the simulated QP pair
// (engine_sim.h): a dead peer, a graceful close, and a hostile message.
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

}  // namespace
}  // namespace zsock::verbs::sim
