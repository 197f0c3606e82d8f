// The verbs engine under random traffic both ways and random limits, over
// the simulated QP pair (engine_sim.h): every byte arrives in order, every
// operation completes exactly once, no queue overflows.
#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "core/provider.h"
#include "gtest/gtest.h"
#include "providers/verbs/engine.h"
#include "providers/verbs/engine_sim.h"

namespace zsock::verbs::sim {
namespace {

constexpr int kPerDir = 120;

// One direction of the traffic: its engines, what it sent and where it
// receives.
struct Dir {
  Engine* tx;
  Engine* rx;
  EngineOutput* txo;
  EngineOutput* rxo;
  std::vector<std::vector<uint8_t>> sent;
  std::vector<std::vector<uint8_t>> bufs;
  int posted = 0;
  int next_send = 0;
};

// The peer's memory the random RDMA writes go to, and their sources (kept
// until they complete).
struct Target {
  std::vector<uint8_t> mem;
  RemoteKey key;
  std::vector<std::vector<uint8_t>> writes;
};

EngineConfig RandomConfig(std::mt19937& rng) {
  EngineConfig c;
  c.sq_depth = 4 + static_cast<int>(rng() % 13);
  c.recv_depth = 4 + static_cast<int>(rng() % 5);
  c.eager_size = 256 + (rng() % 4) * 512;
  c.max_inline = static_cast<uint32_t>(rng() % 3 == 0 ? 0 : 24 + rng() % 200);
  c.max_msg_sz = 4096u << (rng() % 5);
  return c;
}

// One random step: a send, a receive posted, an RDMA write, or the wire
// and both engines moving.
void RandomStep(std::mt19937& rng, uint32_t seed, int step, Pair& w, Dir* dirs, Target& target) {
  const int which = static_cast<int>(rng() % 2);
  Dir& d = dirs[which];
  switch (rng() % 5) {
    case 0:
    case 1:
      if (d.next_send < kPerDir) {
        int i = d.next_send++;
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
      target.writes.push_back(src);
      ASSERT_TRUE(w.ea.Rma(WrKind::kRdmaWrite, target.writes.back().data(), len, nullptr,
                           target.key.addr + off, target.key, 50000 + step, &w.oa).ok());
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

// The rest of each direction's sends and receives.
void Finish(Dir* dirs) {
  for (int which = 0; which < 2; ++which) {
    Dir& d = dirs[which];
    while (d.next_send < kPerDir) {
      int i = d.next_send++;
      d.sent[i].assign(1 + i % 300, static_cast<uint8_t>(i));
      ASSERT_TRUE(d.tx->Send(d.sent[i].data(), d.sent[i].size(), nullptr, i, false, d.txo).ok());
    }
    while (d.posted < kPerDir) {
      int i = d.posted++;
      ASSERT_TRUE(d.rx->PostRecv(d.bufs[i].data(), d.bufs[i].size(), nullptr, 10000 + i, d.rxo).ok());
    }
  }
}

// Every send of direction `which` completed once, and every message
// arrived once, in its receive, byte-exact.
void Verify(uint32_t seed, int which, const Dir& d) {
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

TEST(Engine, RandomTrafficUnderRandomLimits) {
  for (uint32_t seed = 1; seed <= 25; ++seed) {
    std::mt19937 rng(seed);
    EngineConfig c = RandomConfig(rng);
    Pair w(c, c);
    Dir dirs[2] = {{&w.ea, &w.eb, &w.oa, &w.ob, {}, {}, 0}, {&w.eb, &w.ea, &w.ob, &w.oa, {}, {}, 0}};
    for (Dir& d : dirs) {
      d.sent.resize(kPerDir);
      d.bufs.assign(kPerDir, std::vector<uint8_t>(40000));
    }
    Target target;
    target.mem.assign(8192, 0);
    auto tmr = w.b.Register(target.mem.data(), target.mem.size(), kAccessAll);
    ASSERT_TRUE(tmr.ok());
    target.key = (*tmr)->remote_key();
    for (int step = 0; step < 2000; ++step) {
      ASSERT_NO_FATAL_FAILURE(RandomStep(rng, seed, step, w, dirs, target));
    }
    ASSERT_NO_FATAL_FAILURE(Finish(dirs));
    w.Settle();
    ASSERT_FALSE(w.ea.dead()) << "seed " << seed << ": " << w.ea.dead_status();
    ASSERT_FALSE(w.eb.dead()) << "seed " << seed << ": " << w.eb.dead_status();
    for (int which = 0; which < 2; ++which) {
      ASSERT_NO_FATAL_FAILURE(Verify(seed, which, dirs[which]));
    }
    EXPECT_EQ(w.a.overflows + w.b.overflows, 0) << "seed " << seed;
    EXPECT_EQ(w.a.rnr_naks + w.b.rnr_naks, 0) << "seed " << seed;
    EXPECT_TRUE(w.ea.Idle() && w.eb.Idle()) << "seed " << seed;
  }
}

}  // namespace
}  // namespace zsock::verbs::sim
