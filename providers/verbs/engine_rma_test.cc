// The verbs engine's one-sided operations over the simulated QP pair
// (engine_sim.h): RDMA read and write, atomics, and an access the target
// refuses.
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

}  // namespace
}  // namespace zsock::verbs::sim
