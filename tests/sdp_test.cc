// The SDP engine over every provider configuration linked in, in both data
// paths (bcopy, zcopy), with two real processes per test.
//
// Fork rule (docs/provider-interface.md, tests/conformance_test.cc): the
// parent opens its engine (fabric + CQ) and listener, then forks; children
// open their own engine and leave with _exit; no endpoint exists at fork.
#include <signal.h>
#include <sys/mman.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/rcache.h"
#include "tests/child_process.h"
#include "core/sdp/az_guard.h"
#include "core/sdp/engine.h"
#include "core/sdp/wire.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "tests/conformance_configs.h"

namespace zsock::sdp {
namespace {

using wire::MessageId;

constexpr absl::Duration kCallTimeout = absl::Seconds(60);

absl::Time Deadline() { return absl::Now() + kCallTimeout; }

[[noreturn]] void ChildFail(int line, const std::string& what) {
  std::fprintf(stderr, "child %d: sdp_test.cc:%d: %s\n", getpid(), line, what.c_str());
  std::fflush(stderr);
  _exit(1);
}
#define CHILD_CHECK(cond) \
  do {                    \
    if (!(cond)) ChildFail(__LINE__, "check failed: " #cond); \
  } while (0)
#define CHILD_OK(expr)                                                        \
  do {                                                                        \
    absl::Status _st = (expr);                                                \
    if (!_st.ok()) ChildFail(__LINE__, std::string(#expr ": ") + _st.ToString()); \
  } while (0)

pid_t Spawn(std::function<int()> body) {
  return zsock::testutil::SpawnChild(std::move(body), absl::Seconds(300));
}

int Reap(pid_t pid, absl::Duration timeout = absl::Seconds(300)) {
  return zsock::testutil::ReapChild(pid, timeout);
}

// The byte at stream offset i: word (i / 8) of a keyed mix, byte i % 8.
inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
void FillStream(uint8_t* p, uint64_t off, size_t n, uint64_t seed) {
  size_t i = 0;
  while (i < n && (off + i) % 8 != 0) {
    uint64_t w = Mix(((off + i) / 8) ^ seed);
    p[i] = static_cast<uint8_t>(w >> (8 * ((off + i) % 8)));
    ++i;
  }
  for (; i + 8 <= n; i += 8) {
    uint64_t w = Mix(((off + i) / 8) ^ seed);
    std::memcpy(p + i, &w, 8);
  }
  for (; i < n; ++i) {
    uint64_t w = Mix(((off + i) / 8) ^ seed);
    p[i] = static_cast<uint8_t>(w >> (8 * ((off + i) % 8)));
  }
}
// Returns the first offset that differs, or -1.
int64_t CheckStream(const uint8_t* p, uint64_t off, size_t n, uint64_t seed,
                    std::vector<uint8_t>* scratch) {
  scratch->resize(std::max(scratch->size(), n));
  FillStream(scratch->data(), off, n, seed);
  if (std::memcmp(p, scratch->data(), n) == 0) return -1;
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != (*scratch)[i]) return static_cast<int64_t>(off + i);
  }
  return -1;
}

// Log-uniform size in [1, max].
size_t RandomSize(std::mt19937_64& rng, size_t max) {
  std::uniform_real_distribution<double> d(0, std::log(static_cast<double>(max)));
  return std::min(max, std::max<size_t>(1, static_cast<size_t>(std::exp(d(rng)))));
}

struct Param {
  std::string config;
  Mode mode;
  AzPolicy policy = AzPolicy::kCopy;
};

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  std::string s = info.param.config + (info.param.mode == Mode::kZcopy ? "_zcopy"
                                       : info.param.mode == Mode::kAz  ? "_azcopy"
                                                                        : "_bcopy");
  if (info.param.mode == Mode::kAz) s += info.param.policy == AzPolicy::kBlock ? "_block" : "_copy";
  for (char& ch : s) {
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return s;
}

// bcopy and zcopy over every configuration (SdpCancelTest); `general`:
// the general matrix (SdpTest), bcopy over every configuration and zcopy
// and azcopy where RunsEveryMode says.
std::vector<Param> AllParams(bool general = false) {
  std::vector<Param> out;
  for (const auto& c : ConformanceConfigurations()) {
    out.push_back({c, Mode::kBcopy});
    if (general && !RunsEveryMode(c)) continue;
    out.push_back({c, Mode::kZcopy});
    if (general) out.push_back({c, Mode::kAz});
  }
  return out;
}

class SdpTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    auto engine = Engine::Create({GetParam().config, false});
    if (!engine.ok()) {
      auto code = engine.status().code();
      if (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kNotFound ||
          code == absl::StatusCode::kFailedPrecondition) {
        GTEST_SKIP() << "provider configuration '" << GetParam().config
                     << "' cannot run here: " << engine.status().message();
      }
      FAIL() << engine.status();
    }
    engine_ = std::move(*engine);
    auto l = engine_->Listen("", Options());
    ASSERT_TRUE(l.ok()) << l.status();
    listener_ = std::move(*l);
  }

  ConnectionOptions Options() const {
    ConnectionOptions o;
    o.mode = GetParam().mode;
    o.az_policy = GetParam().policy;
    o.zcopy_threshold = 64 << 10;
    return o;
  }

  // Bytes each direction carries in the transfer test: 512 MiB per
  // direction (1 GiB per mode) on the default unet configuration, 64 MiB on
  // the others (slower providers; see docs/protocol.md).
  size_t TransferBytes() const {
    if (const char* env = getenv("ZSOCK_TEST_SDP_MIB")) return size_t(atoi(env)) << 20;
    return GetParam().config == "unet" ? size_t{512} << 20 : size_t{64} << 20;
  }

  // In a child: its own engine and a connection to the parent.
  struct ChildSide {
    std::unique_ptr<Engine> engine;
    std::unique_ptr<Connection> conn;
  };
  ChildSide ChildConnect(ConnectionOptions o, bool progress_thread = false) {
    ChildSide s;
    auto e = Engine::Create({GetParam().config, progress_thread});
    CHILD_OK(e.status());
    s.engine = std::move(*e);
    auto c = s.engine->Connect(listener_->address(), o, Deadline());
    CHILD_OK(c.status());
    s.conn = std::move(*c);
    return s;
  }
  ChildSide ChildConnect() { return ChildConnect(Options()); }
  // A child's usual ending: shuts down writing, waits for the parent's end
  // of stream; returns the child's exit status (0). A failure names the
  // caller's line.
  static int ChildFinish(ChildSide& s, int line = __builtin_LINE()) {
    if (absl::Status st = s.conn->Shutdown(SHUT_WR); !st.ok()) {
      ChildFail(line, "ChildFinish: Shutdown(SHUT_WR): " + st.ToString());
    }
    char b;
    auto r = s.conn->Recv(&b, 1, 0, Deadline());
    if (!r.ok() || *r != 0) {
      ChildFail(line, "ChildFinish: expected the parent's end of stream, got " +
                          (r.ok() ? std::to_string(*r) + " bytes" : r.status().ToString()));
    }
    return 0;
  }

  // The parent's end of a test with a child that reads until the end of
  // stream and then closes: shut down writing, read the child's end (its
  // close needs this side's progress), reap it.
  static void EndOfStreamBothWays(Connection* c, pid_t child) {
    ASSERT_TRUE(c->Shutdown(SHUT_WR).ok());
    uint8_t b;
    auto eof = c->Recv(&b, 1, 0, Deadline());
    ASSERT_TRUE(eof.ok()) << eof.status();
    EXPECT_EQ(*eof, 0u);
    EXPECT_EQ(Reap(child), 0);
  }

  // An engine of this configuration with its own spin bounds, and a
  // listener on it (the adaptive-spin tests); the listener is null, and
  // the test has failed, if either could not be made.
  std::pair<std::unique_ptr<Engine>, std::unique_ptr<Listener>> EngineWithSpin(SpinBounds spin) {
    EngineOptions eo;
    eo.fabric = GetParam().config;
    eo.spin = spin;
    auto engine = Engine::Create(eo);
    EXPECT_TRUE(engine.ok()) << engine.status();
    if (!engine.ok()) return {};
    auto l = (*engine)->Listen("", Options());
    EXPECT_TRUE(l.ok()) << l.status();
    if (!l.ok()) return {};
    return {std::move(*engine), std::move(*l)};
  }

  // Reaps the child while this side's engine makes progress as an event
  // loop's would (Poll, then a wait on its fd), for tests where no call of
  // ours is waiting: the child's exit status, or -1 if it did not exit
  // within 60 s (then it is killed).
  int ReapWhilePolling(pid_t child) {
    const absl::Time until = absl::Now() + absl::Seconds(60);
    while (absl::Now() < until) {
      engine_->Poll();
      pollfd pfd{engine_->wait_fd(), POLLIN, 0};
      ::poll(&pfd, 1, 10);
      int status = 0;
      if (waitpid(child, &status, WNOHANG) == child) {
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
    }
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    return -1;
  }

  std::unique_ptr<Connection> AcceptOne() {
    auto c = listener_->Accept(Deadline());
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Listener> listener_;
};

// Writes `total` stream bytes in random-length sends; returns "" or an error.
std::string WriteStream(Connection* c, size_t total, uint64_t seed) {
  std::mt19937_64 rng(seed * 7 + 1);
  std::vector<uint8_t> buf(size_t{64} << 20);
  uint64_t off = 0;
  while (off < total) {
    size_t n = std::min<size_t>(RandomSize(rng, buf.size()), total - off);
    FillStream(buf.data(), off, n, seed);
    size_t done = 0;
    while (done < n) {
      auto r = c->Send(buf.data() + done, n - done, 0, Deadline());
      if (!r.ok()) return absl::StrCat("send at ", off + done, ": ", r.status().ToString());
      done += *r;
    }
    off += n;
  }
  return "";
}

// Reads `total` stream bytes in random-length receives and checks them.
std::string ReadStream(Connection* c, size_t total, uint64_t seed) {
  std::mt19937_64 rng(seed * 13 + 5);
  std::vector<uint8_t> buf(size_t{64} << 20), scratch;
  uint64_t off = 0;
  while (off < total) {
    size_t n = RandomSize(rng, buf.size());
    int flags = (rng() % 4 == 0) ? MSG_WAITALL : 0;
    if (flags == MSG_WAITALL) n = std::min<size_t>(n, total - off);
    auto r = c->Recv(buf.data(), n, flags, Deadline());
    if (!r.ok()) return absl::StrCat("recv at ", off, ": ", r.status().ToString());
    if (*r == 0) return absl::StrCat("unexpected end of stream at ", off);
    if (flags == MSG_WAITALL && *r != n) return absl::StrCat("WAITALL returned ", *r, " of ", n);
    if (off + *r > total) return absl::StrCat("received past the end: ", off + *r);
    int64_t bad = CheckStream(buf.data(), off, *r, seed, &scratch);
    if (bad >= 0) return absl::StrCat("byte ", bad, " differs (read of ", *r, " at ", off, ")");
    off += *r;
  }
  // Then end of stream.
  auto r = c->Recv(buf.data(), 1, 0, Deadline());
  if (!r.ok()) return absl::StrCat("recv at end: ", r.status().ToString());
  if (*r != 0) return "data after the expected end";
  return "";
}

TEST_P(SdpTest, RandomLengthsBothDirectionsByteExact) {
  const size_t total = TransferBytes();
  pid_t child = Spawn([&] {
    ChildSide s = ChildConnect();
    std::string werr, rerr;
    std::thread w([&] {
      werr = WriteStream(s.conn.get(), total, 1);
      if (werr.empty()) {
        auto st = s.conn->Shutdown(SHUT_WR);
        if (!st.ok()) werr = st.ToString();
      }
    });
    rerr = ReadStream(s.conn.get(), total, 2);
    w.join();
    if (!werr.empty()) ChildFail(__LINE__, "writer: " + werr);
    if (!rerr.empty()) ChildFail(__LINE__, "reader: " + rerr);
    auto stats = s.conn->stats();
    std::fprintf(stderr, "child: sent bcopy %llu srcavail %llu sinkavail %llu, stalls %llu, "
                 "coalesced %llu\n",
                 (unsigned long long)stats.bytes_sent_bcopy,
                 (unsigned long long)stats.bytes_sent_srcavail,
                 (unsigned long long)stats.bytes_sent_sinkavail,
                 (unsigned long long)stats.credit_stalls,
                 (unsigned long long)stats.coalesced_sends);
    CHILD_OK(s.conn->Close());
    return 0;
  });
  auto c = AcceptOne();
  ASSERT_NE(c, nullptr);
  absl::Time start = absl::Now();
  std::string werr, rerr;
  std::thread w([&] {
    werr = WriteStream(c.get(), total, 2);
    if (werr.empty()) {
      auto st = c->Shutdown(SHUT_WR);
      if (!st.ok()) werr = st.ToString();
    }
  });
  rerr = ReadStream(c.get(), total, 1);
  w.join();
  EXPECT_EQ(werr, "");
  EXPECT_EQ(rerr, "");
  double secs = absl::ToDoubleSeconds(absl::Now() - start);
  auto stats = c->stats();
  std::printf("%s: %zu MiB each way in %.2f s; parent received bcopy %llu srcavail %llu "
              "sinkavail %llu\n",
              GetParam().config.c_str(), total >> 20, secs,
              (unsigned long long)stats.bytes_recv_bcopy,
              (unsigned long long)stats.bytes_recv_srcavail,
              (unsigned long long)stats.bytes_recv_sinkavail);
  EXPECT_EQ(stats.bytes_recv_bcopy + stats.bytes_recv_srcavail + stats.bytes_recv_sinkavail +
                stats.bytes_recv_pull,
            total);
  // In bcopy mode the child's sends of 32 KiB and more go pulled where it
  // is offered (the two sides run the same provider, so this side's view
  // is the child's); in zcopy modes those above zcopy_threshold do not.
  if (!c->pull_negotiated()) {
    EXPECT_EQ(stats.bytes_recv_pull, 0u);
  } else if (GetParam().mode == Mode::kBcopy) {
    EXPECT_GT(stats.bytes_recv_pull, 0u);
  }
  if (GetParam().mode == Mode::kBcopy) {
    EXPECT_EQ(stats.bytes_recv_bcopy + stats.bytes_recv_pull, total);
  } else {
    EXPECT_GT(stats.bytes_recv_srcavail + stats.bytes_recv_sinkavail, 0u);
  }
  if (GetParam().mode == Mode::kAz && c->az_negotiated()) {
    // The writer refills its buffer right after each send: AZ-SDP's faults.
    std::printf("parent sent %llu asynchronous SrcAvails; faults %llu, copies %llu, "
                "blocks %llu, fallbacks %llu\n",
                (unsigned long long)stats.az_srcavail_sent, (unsigned long long)stats.az_faults,
                (unsigned long long)stats.az_copies, (unsigned long long)stats.az_blocks,
                (unsigned long long)stats.az_fallbacks);
    EXPECT_GT(stats.az_srcavail_sent, 0u);
    EXPECT_GT(stats.az_faults, 0u);
  }
  EXPECT_TRUE(c->Close().ok());
  EXPECT_EQ(Reap(child), 0);
}

// Many small writes while the reader is slow: they coalesce (reverse
// packetization) and arrive byte-exact.
// Pulled bcopy (docs/protocol.md): where the peer offers it, the large
// sends of a bcopy stream go as pulled SrcAvails, in stream order with the
// small sends between them and byte-exact; with pull_threshold 0 none does,
// and where it is not offered (every provider but unet) none does either.
TEST_P(SdpTest, PulledBcopyKeepsStreamOrderWithSmallSends) {
  if (GetParam().mode != Mode::kBcopy) GTEST_SKIP() << "bcopy mode's path";
  // Large sends (a pull buffer's worth and more, odd sizes) between small
  // ones, so that adverts and Data interleave, and the ring wraps.
  const std::vector<size_t> sizes = {(1 << 20) + 13, 100,        (300 << 10) + 7, 5,
                                     (32 << 10),      (32 << 10) - 1, (3 << 20) + 4095, 1,
                                     (700 << 10),     4096};
  size_t total = 0;
  for (size_t n : sizes) total += n;
  constexpr uint64_t kSeed = 43;
  auto send_all = [&](Connection* c) -> std::string {
    std::vector<uint8_t> buf(4 << 20);
    uint64_t off = 0;
    for (size_t n : sizes) {
      FillStream(buf.data(), off, n, kSeed);
      for (size_t done = 0; done < n;) {
        auto r = c->Send(buf.data() + done, n - done, 0, Deadline());
        if (!r.ok()) return r.status().ToString();
        done += *r;
      }
      off += n;
    }
    return "";
  };
  pid_t child = Spawn([&] {
    ConnectionOptions never = Options();
    never.pull_threshold = 0;
    for (ConnectionOptions o : {Options(), never}) {
      ChildSide s = ChildConnect(o);
      std::string err = send_all(s.conn.get());
      if (!err.empty()) ChildFail(__LINE__, err);
      const uint64_t adverts = s.conn->stats().pull_srcavail_sent;
      if (s.conn->pull_negotiated()) {
        CHILD_CHECK(adverts >= 7);  // the 1 MiB send alone takes four
      } else {
        CHILD_CHECK(adverts == 0);
      }
      ChildFinish(s);
    }
    return 0;
  });
  for (int i = 0; i < 2; ++i) {
    auto c = AcceptOne();
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(ReadStream(c.get(), total, kSeed), "") << "connection " << i;
    const ConnectionStats st = c->stats();
    EXPECT_EQ(st.bytes_recv_bcopy + st.bytes_recv_pull, total);
    // The child's view decides; this side's offer is what it saw.
    if (i == 0 && c->pull_negotiated()) {
      EXPECT_GT(st.bytes_recv_pull, size_t{4} << 20) << "connection " << i;
    } else {
      EXPECT_EQ(st.bytes_recv_pull, 0u) << "connection " << i;
    }
    ASSERT_TRUE(c->Shutdown(SHUT_WR).ok());
  }
  EXPECT_EQ(Reap(child), 0);
}

// A receiver that shuts down reading discards pulled adverts, queued and
// arriving, as it discards Data: the sender's sends all return and its
// Close finishes (it does not wait for reads that will never come).
TEST_P(SdpTest, ShutdownReadDiscardsPulledAdverts) {
  if (GetParam().mode != Mode::kBcopy) GTEST_SKIP() << "bcopy mode's path";
  constexpr size_t kSend = 1 << 20;
  constexpr int kSends = 8;
  pid_t child = Spawn([&] {
    ChildSide s = ChildConnect();
    std::vector<uint8_t> buf(kSend, 0x5c);
    for (int i = 0; i < kSends; ++i) {
      for (size_t done = 0; done < kSend;) {
        auto r = s.conn->Send(buf.data() + done, kSend - done, 0, Deadline());
        CHILD_OK(r.status());
        done += *r;
      }
    }
    CHILD_OK(s.conn->Shutdown(SHUT_WR));
    CHILD_OK(s.conn->Close());
    return 0;
  });
  auto c = AcceptOne();
  ASSERT_NE(c, nullptr);
  uint8_t b[16];
  auto r = c->Recv(b, sizeof(b), MSG_WAITALL, Deadline());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(b[0], 0x5c);
  ASSERT_TRUE(c->Shutdown(SHUT_RD).ok());
  // No call of ours waits now: make progress as an event loop would, so
  // that the discards reach the child.
  EXPECT_EQ(ReapWhilePolling(child), 0) << "the sender is stuck";
  auto eof = c->Recv(b, sizeof(b), 0, Deadline());
  ASSERT_TRUE(eof.ok()) << eof.status();
  EXPECT_EQ(*eof, 0u);
}

TEST_P(SdpTest, SmallWritesCoalesceWhileCreditsAreOut) {
  constexpr size_t kWrites = 20000;
  pid_t child = Spawn([&] {
    ChildSide s = ChildConnect();
    uint64_t off = 0;
    std::vector<uint8_t> buf(64);
    for (size_t i = 0; i < kWrites; ++i) {
      size_t n = 1 + i % 61;
      FillStream(buf.data(), off, n, 9);
      auto r = s.conn->Send(buf.data(), n, 0, Deadline());
      CHILD_OK(r.status());
      CHILD_CHECK(*r == n);
      off += n;
    }
    auto stats = s.conn->stats();
    CHILD_CHECK(stats.coalesced_sends > 0);
    CHILD_CHECK(stats.messages_sent < kWrites);
    CHILD_OK(s.conn->Close());
    return 0;
  });
  auto c = AcceptOne();
  ASSERT_NE(c, nullptr);
  absl::SleepFor(absl::Milliseconds(300));  // let the writer run out of credits
  size_t total = 0;
  for (size_t i = 0; i < kWrites; ++i) total += 1 + i % 61;
  EXPECT_EQ(ReadStream(c.get(), total, 9), "");
  EXPECT_LT(c->stats().messages_received, kWrites);
  EXPECT_EQ(Reap(child), 0);
}

// Autocork (docs/protocol.md): a burst of small writes leaves as few
// messages, and a tail held back when the burst ends reaches the peer with
// no further call by the sender (the peer's acknowledgement wakes the
// sender's progress thread, which sends it).
TEST_P(SdpTest, AutocorkTailLeavesWhileTheSenderMakesNoCalls) {
  constexpr int kBurst = 64, kSize = 8, kMaxBursts = 200;
  // The parent's "got the burst" goes through a pipe: a receive on the
  // connection would itself send a held tail (FlushTail).
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  pid_t child = Spawn([&] {
    ChildSide s = ChildConnect(Options(), /*progress_thread=*/true);
    std::vector<uint8_t> buf(kSize);
    uint64_t off = 0;
    int held_at_end = 0;
    for (int b = 0; b < kMaxBursts && held_at_end < 3; ++b) {
      for (int i = 0; i < kBurst; ++i) {
        FillStream(buf.data(), off, kSize, 41);
        auto r = s.conn->Send(buf.data(), kSize, 0, Deadline());
        CHILD_OK(r.status());
        CHILD_CHECK(*r == static_cast<size_t>(kSize));
        off += kSize;
      }
      if (s.conn->stats().held_bytes > 0) held_at_end++;
      // Now no call until the parent has every byte of the burst.
      uint8_t more = 0;
      CHILD_CHECK(read(go[0], &more, 1) == 1);
      if (more == 0) break;
    }
    ConnectionStats st = s.conn->stats();
    std::fprintf(stderr, "child: %llu bytes in %llu messages; tails held at a burst's end %d, "
                 "holds %llu, requests %llu\n",
                 (unsigned long long)off, (unsigned long long)st.messages_sent, held_at_end,
                 (unsigned long long)st.autocork_holds, (unsigned long long)st.ack_requests);
    CHILD_CHECK(held_at_end > 0);
    CHILD_CHECK(st.ack_requests > 0 && st.autocork_holds > 0);
    CHILD_CHECK(st.messages_sent < off / kSize);
    CHILD_OK(s.conn->Close());
    return 0;
  });
  auto c = AcceptOne();
  ASSERT_NE(c, nullptr);
  std::vector<uint8_t> buf(kBurst * kSize), scratch;
  uint64_t off = 0;
  for (int b = 0; b < kMaxBursts; ++b) {
    // Bounded: a tail nobody sends fails here instead of hanging.
    auto r = c->Recv(buf.data(), buf.size(), MSG_WAITALL, Deadline::After(absl::Seconds(20)));
    if (r.ok() && *r == 0) break;  // the child saw enough held tails and closed
    ASSERT_TRUE(r.ok()) << "burst " << b << ": " << r.status();
    ASSERT_EQ(*r, buf.size()) << "burst " << b;
    ASSERT_EQ(CheckStream(buf.data(), off, buf.size(), 41, &scratch), -1) << "burst " << b;
    off += buf.size();
    uint8_t more = b + 1 < kMaxBursts ? 1 : 0;
    ASSERT_EQ(write(go[1], &more, 1), 1);
  }
  EXPECT_EQ(Reap(child), 0);
  close(go[0]);
  close(go[1]);
}

// Sporadic request and reply with the application thread blocked in its
// receive: the progress thread stands aside (Engine::StandAsideForApp)
// rather than sleep on the CQ's fd beside it, where both woke for every
// message and the progress thread took vCPU time and the poll token just
// when the reply was due. Counted: how often the progress thread woke from
// the CQ's fd (once per message before, a few times in all now). The echo
// is checked too.
TEST_P(SdpTest, ProgressThreadStandsAsideWhileTheApplicationWaits) {
  constexpr int kRounds = 40;
  pid_t child = Spawn([&] {
    ChildSide s = ChildConnect(Options(), /*progress_thread=*/true);
    // From the first message on: set-up may wake the progress thread (shm's
    // CQ has a poll timer), and that is not what is counted.
    uint64_t before = 0;
    for (int r = 0; r < kRounds; ++r) {
      uint64_t v = 0;
      auto got = s.conn->Recv(&v, sizeof(v), MSG_WAITALL, Deadline::After(absl::Seconds(20)));
      CHILD_OK(got.status());
      CHILD_CHECK(*got == sizeof(v) && v == static_cast<uint64_t>(r));
      if (r == 0) before = s.engine->stats().background_wakes;
      v += 1000;
      auto sent = s.conn->Send(&v, sizeof(v), 0, Deadline());
      CHILD_OK(sent.status());
    }
    const uint64_t wakes = s.engine->stats().background_wakes - before;
    std::fprintf(stderr, "child: the progress thread woke from the CQ %llu times in %d round trips\n",
                 (unsigned long long)wakes, kRounds - 1);
    CHILD_CHECK(wakes <= kRounds / 4);
    return ChildFinish(s);
  });
  auto c = AcceptOne();
  ASSERT_NE(c, nullptr);
  for (int r = 0; r < kRounds; ++r) {
    usleep(3000);  // the child's receive spins out and sleeps
    uint64_t v = static_cast<uint64_t>(r);
    ASSERT_TRUE(c->Send(&v, sizeof(v), 0, Deadline()).ok());
    auto got = c->Recv(&v, sizeof(v), MSG_WAITALL, Deadline::After(absl::Seconds(20)));
    ASSERT_TRUE(got.ok()) << "round " << r << ": " << got.status();
    ASSERT_EQ(v, static_cast<uint64_t>(r) + 1000) << "round " << r;
  }
  ASSERT_TRUE(c->Shutdown(SHUT_WR).ok());
  char b;
  auto end = c->Recv(&b, 1, 0, Deadline::After(absl::Seconds(20)));
  ASSERT_TRUE(end.ok() && *end == 0) << end.status();
  EXPECT_EQ(Reap(child), 0);
}

// A request written in three pieces, then a wait for the reply: the third
// piece is held but leaves when the receive waits, and since no later send
// joins it, the sender soon stops asking for acknowledgements (each costs
// the peer a message) instead of asking for every request.
TEST_P(SdpTest, AutocorkBacksOffForRequestsWrittenInPieces) {
  constexpr int kRounds = 300;
  pid_t child = Spawn([&] {
    ChildSide s = ChildConnect(Options(), /*progress_thread=*/true);
    uint8_t req[24], rep[8];
    uint64_t off = 0;
    for (int i = 0; i < kRounds; ++i) {
      FillStream(req, off, sizeof req, 47);
      for (int p = 0; p < 3; ++p) CHILD_OK(s.conn->Send(req + 8 * p, 8, 0, Deadline()).status());
      off += sizeof req;
      auto r = s.conn->Recv(rep, sizeof rep, MSG_WAITALL, Deadline::After(absl::Seconds(20)));
      CHILD_OK(r.status());
      CHILD_CHECK(*r == sizeof rep);
    }
    ConnectionStats st = s.conn->stats();
    std::fprintf(stderr, "child: %d requests in %llu messages; acknowledgement requests %llu, "
                 "holds %llu\n", kRounds, (unsigned long long)st.messages_sent,
                 (unsigned long long)st.ack_requests, (unsigned long long)st.autocork_holds);
    CHILD_CHECK(st.ack_requests < 40);
    CHILD_OK(s.conn->Close());
    return 0;
  });
  auto c = AcceptOne();
  ASSERT_NE(c, nullptr);
  uint8_t req[24], rep[8] = {};
  std::vector<uint8_t> scratch;
  uint64_t off = 0;
  for (int i = 0; i < kRounds; ++i) {
    auto r = c->Recv(req, sizeof req, MSG_WAITALL, Deadline::After(absl::Seconds(20)));
    ASSERT_TRUE(r.ok()) << "request " << i << ": " << r.status();
    ASSERT_EQ(*r, sizeof req);
    ASSERT_EQ(CheckStream(req, off, sizeof req, 47, &scratch), -1) << "request " << i;
    off += sizeof req;
    ASSERT_TRUE(c->Send(rep, sizeof rep, 0, Deadline()).ok());
  }
  EXPECT_LT(c->stats().ack_answers, 40u);
  auto end = c->Recv(req, 1, 0, Deadline::After(absl::Seconds(20)));  // the child's close
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(*end, 0u);
  EXPECT_EQ(Reap(child), 0);
}

// Turning autocork off sends a held tail at once, and then every small send
// goes as its own message (credits permitting) with no acknowledgement
// requests.
TEST_P(SdpTest, AutocorkOffSendsTheHeldTailAndRequestsNothing) {
  constexpr int kSize = 8;
  pid_t child = Spawn([&] {
    ChildSide s = ChildConnect(Options(), /*progress_thread=*/true);
    std::vector<uint8_t> buf(kSize);
    uint64_t off = 0;
    auto send = [&] {
      FillStream(buf.data(), off, kSize, 43);
      auto r = s.conn->Send(buf.data(), kSize, 0, Deadline());
      CHILD_OK(r.status());
      off += kSize;
    };
    bool held = false;
    for (int i = 0; i < 100000 && !held; ++i) {
      send();
      held = s.conn->stats().held_bytes > 0;
    }
    CHILD_CHECK(held);
    // Held with credits to spare: turning autocork off posts it at once.
    s.conn->SetAutocork(false);
    CHILD_CHECK(s.conn->stats().queued_bytes == 0);
    CHILD_CHECK(!s.conn->options().autocork);
    ConnectionStats before = s.conn->stats();
    for (int i = 0; i < 200; ++i) send();
    ConnectionStats after = s.conn->stats();
    CHILD_CHECK(after.ack_requests == before.ack_requests);
    CHILD_CHECK(after.autocork_holds == before.autocork_holds);
    uint64_t total = off;
    CHILD_OK(s.conn->Send(&total, sizeof total, 0, Deadline()).status());
    CHILD_OK(s.conn->Close());
    return 0;
  });
  auto c = AcceptOne();
  ASSERT_NE(c, nullptr);
  // Read everything up to the end of stream; the last 8 bytes are the
  // count of the stream bytes before them.
  std::string got;
  std::vector<uint8_t> buf(1 << 16);
  for (;;) {
    auto r = c->Recv(buf.data(), buf.size(), 0, Deadline::After(absl::Seconds(20)));
    ASSERT_TRUE(r.ok()) << r.status();
    if (*r == 0) break;
    got.append(reinterpret_cast<char*>(buf.data()), *r);
  }
  ASSERT_GE(got.size(), 8u);
  uint64_t total;
  std::memcpy(&total, got.data() + got.size() - 8, 8);
  ASSERT_EQ(total, got.size() - 8);
  std::vector<uint8_t> scratch;
  EXPECT_EQ(CheckStream(reinterpret_cast<const uint8_t*>(got.data()), 0, total, 43, &scratch), -1);
  EXPECT_EQ(Reap(child), 0);
}

TEST_P(SdpTest, HalfCloseDeliversEverythingThenZero) {
  pid_t child = Spawn([&] {
    ChildSide s = ChildConnect();
    std::vector<uint8_t> buf(300000);
    FillStream(buf.data(), 0, buf.size(), 3);
    auto r = s.conn->Send(buf.data(), buf.size(), 0, Deadline());
    CHILD_OK(r.status());
    CHILD_OK(s.conn->Shutdown(SHUT_WR));
    // Sending after SHUT_WR fails with EPIPE.
    auto again = s.conn->Send(buf.data(), 1, 0, Deadline());
    CHILD_CHECK(!again.ok() && StatusErrno(again.status()) == EPIPE);
    // The other direction still works.
    std::string err = ReadStream(s.conn.get(), 1000, 4);
    if (!err.empty()) ChildFail(__LINE__, err);
    CHILD_CHECK(s.conn->readiness() & kRdHup);
    CHILD_OK(s.conn->Close());
    return 0;
  });
  auto c = AcceptOne();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(ReadStream(c.get(), 300000, 3), "");
  EXPECT_TRUE(c->readiness() & kReadable);
  EXPECT_TRUE(c->readiness() & kRdHup);
  std::vector<uint8_t> buf(1000);
  FillStream(buf.data(), 0, buf.size(), 4);
  auto r = c->Send(buf.data(), buf.size(), 0, Deadline());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(c->Shutdown(SHUT_WR).ok());
  EXPECT_EQ(Reap(child), 0);
  EXPECT_TRUE(c->Close().ok());
}

TEST_P(SdpTest, AbortResetsThePeer) {
  pid_t child = Spawn([&] {
    ChildSide s = ChildConnect();
    char b[100];
    auto r = s.conn->Recv(b, sizeof(b), MSG_WAITALL, Deadline());
    CHILD_OK(r.status());
    s.conn->Abort();
    auto again = s.conn->Recv(b, 1, 0, Deadline());
    CHILD_CHECK(!again.ok());
    return 0;
  });
  auto c = AcceptOne();
  ASSERT_NE(c, nullptr);
  std::vector<uint8_t> buf(100, 7);
  ASSERT_TRUE(c->Send(buf.data(), buf.size(), 0, Deadline()).ok());
  std::vector<uint32_t> seen;
  c->SetReadinessCallback([&](uint32_t r) { seen.push_back(r); });
  auto r = c->Recv(buf.data(), buf.size(), 0, Deadline());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_EQ(StatusErrno(r.status()), ECONNRESET) << r.status();
  auto s = c->Send(buf.data(), buf.size(), 0, Deadline());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(StatusErrno(s.status()), ECONNRESET);
  EXPECT_TRUE(c->readiness() & kError);
  ASSERT_FALSE(seen.empty());
  EXPECT_TRUE(seen.back() & kError);
  EXPECT_EQ(Reap(child), 0);
}

TEST_P(SdpTest, PeerKilledMidTransferFailsBlockedCalls) {
  if (absl::StartsWith(GetParam().config, "ofi:shm")) {
    GTEST_SKIP() << "libfabric 1.17 shm keeps each peer's queue lock (a spin lock) in shared "
                    "memory: a peer SIGKILLed while it holds it leaves every later send to it, "
                    "and the survivor's own progress, spinning inside libfabric (docs/ofi.md)";
  }
  pid_t child = Spawn([&] {
    ChildSide s = ChildConnect();
    std::vector<uint8_t> buf(1 << 20, 1);
    for (;;) {  // sends forever, never reads
      if (!s.conn->Send(buf.data(), buf.size(), 0, Deadline()).ok()) return 2;
    }
  });
  auto c = AcceptOne();
  ASSERT_NE(c, nullptr);
  std::atomic<bool> writer_done{false};
  absl::Status writer_status;
  std::thread w([&] {
    std::vector<uint8_t> buf(1 << 20, 2);
    for (;;) {
      auto r = c->Send(buf.data(), buf.size(), 0, Deadline());
      if (!r.ok()) {
        writer_status = r.status();
        break;
      }
    }
    writer_done = true;
  });
  std::vector<uint8_t> buf(1 << 20);
  size_t got = 0;
  absl::Status early;
  while (got < (size_t{8} << 20)) {
    auto r = c->Recv(buf.data(), buf.size(), 0, Deadline());
    if (!r.ok()) {
      early = r.status();
      break;
    }
    got += *r;
  }
  if (!early.ok()) {
    int status = 0;
    std::string how = "still running";
    if (waitpid(child, &status, WNOHANG) == child) {
      how = WIFSIGNALED(status) ? absl::StrCat("killed by signal ", WTERMSIG(status))
                                : absl::StrCat("exited with ", WEXITSTATUS(status));
    } else {
      kill(child, SIGKILL);
      Reap(child);
    }
    c->Abort();
    w.join();
    FAIL() << "before the kill (the child " << how << "): " << early;
  }
  kill(child, SIGKILL);
  absl::Time killed = absl::Now();
  absl::Status reader_status;
  for (;;) {
    auto r = c->Recv(buf.data(), buf.size(), 0, Deadline());
    if (!r.ok()) {
      reader_status = r.status();
      break;
    }
    ASSERT_GT(*r, 0u) << "end of stream instead of an error";
  }
  w.join();
  EXPECT_TRUE(writer_done);
  EXPECT_LT(absl::Now() - killed, absl::Seconds(30));
  EXPECT_EQ(reader_status.code(), absl::StatusCode::kAborted) << reader_status;
  EXPECT_EQ(StatusErrno(reader_status), ECONNRESET) << reader_status;
  EXPECT_TRUE(StatusErrno(writer_status) == ECONNRESET || StatusErrno(writer_status) == EPIPE)
      << writer_status;
  EXPECT_EQ(Reap(child), -SIGKILL);
}

// With a progress thread, a connection progresses while the application
// sleeps: the readiness callback fires (as the sockets layer will mirror it
// onto a real fd) without any call into the engine.
TEST_P(SdpTest, ProgressThreadFiresReadinessWhileTheAppSleeps) {
  pid_t child = Spawn([&] {
    ChildSide s;
    auto e = Engine::Create({GetParam().config, /*progress_thread=*/true});
    CHILD_OK(e.status());
    s.engine = std::move(*e);
    auto c = s.engine->Connect(listener_->address(), Options(), Deadline());
    CHILD_OK(c.status());
    s.conn = std::move(*c);
    absl::Mutex mu;
    bool readable = false;
    s.conn->SetReadinessCallback([&](uint32_t r) {
      absl::MutexLock l(&mu);
      if (r & kReadable) readable = true;
    });
    uint8_t go = 1;
    CHILD_OK(s.conn->Send(&go, 1, 0, Deadline()).status());
    {
      // Sleep without calling the engine until the callback reports data.
      absl::MutexLock l(&mu);
      CHILD_CHECK(mu.AwaitWithTimeout(absl::Condition(&readable), absl::Seconds(30)));
    }
    std::string err = ReadStream(s.conn.get(), 100000, 31);
    if (!err.empty()) ChildFail(__LINE__, err);
    return 0;
  });
  auto c = AcceptOne();
  ASSERT_NE(c, nullptr);
  uint8_t go = 0;
  auto g = c->Recv(&go, 1, 0, Deadline());
  ASSERT_TRUE(g.ok()) << g.status();
  absl::SleepFor(absl::Milliseconds(100));  // the child is asleep by now
  std::vector<uint8_t> buf(100000);
  FillStream(buf.data(), 0, buf.size(), 31);
  ASSERT_TRUE(c->Send(buf.data(), buf.size(), 0, Deadline()).ok());
  ASSERT_TRUE(c->Shutdown(SHUT_WR).ok());
  auto eof = c->Recv(buf.data(), 1, 0, Deadline());
  ASSERT_TRUE(eof.ok()) << eof.status();
  EXPECT_EQ(*eof, 0u);
  EXPECT_EQ(Reap(child), 0);
}

// An application thread's wait learns how soon its replies come
// (core/adaptive_spin.h; milliseconds here, so that a loaded machine's
// wake-ups stay inside the bands): with a 1 ms floor and a 50 ms ceiling,
// a reply that comes about 5 ms into a receive, after the spin ran out and
// the thread slept, grows the engine's spin; receives that time out halve
// it, down to the floor.
TEST_P(SdpTest, ApplicationWaitsLearnHowSoonRepliesCome) {
  auto [engine, l] = EngineWithSpin({1'000'000, 50'000'000});
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(engine->stats().spin_ns, 1'000'000);
  const std::string address = l->address();
  // The child echoes each byte 5 ms after it came, until end of stream.
  pid_t child = Spawn([&] {
    auto e = Engine::Create({GetParam().config, false});
    CHILD_OK(e.status());
    auto c = (*e)->Connect(address, Options(), Deadline());
    CHILD_OK(c.status());
    for (;;) {
      uint8_t b = 0;
      auto r = (*c)->Recv(&b, 1, 0, Deadline());
      CHILD_OK(r.status());
      if (*r == 0) break;
      absl::SleepFor(absl::Milliseconds(5));
      CHILD_OK((*c)->Send(&b, 1, 0, Deadline()).status());
    }
    return 0;
  });
  auto c = l->Accept(Deadline());
  ASSERT_TRUE(c.ok()) << c.status();
  auto timed_out_recv = [&] {
    uint8_t b;
    auto r = (*c)->Recv(&b, 1, 0, absl::Now() + absl::Milliseconds(2));
    EXPECT_FALSE(r.ok() && *r > 0) << "a byte came that nobody sent";
  };
  // Whatever setting up taught it, timeouts bring it to the floor.
  for (int i = 0; i < 8; ++i) timed_out_recv();
  ASSERT_EQ(engine->stats().spin_ns, 1'000'000);
  // Round trips until the spin grows. A receive whose 1 ms spin was
  // preempted past 5 ms finds the reply spinning, and one whose reply a
  // loaded machine held past the 50 ms ceiling finds it too late: neither
  // teaches anything, and the next round trip tries again.
  const uint64_t sleeps = engine->stats().leader_sleeps;
  for (int i = 0; i < 50 && engine->stats().spin_ns == 1'000'000; ++i) {
    uint8_t b = static_cast<uint8_t>(i + 1);
    ASSERT_TRUE((*c)->Send(&b, 1, 0, Deadline()).ok());
    uint8_t back = 0;
    auto r = (*c)->Recv(&back, 1, 0, Deadline());
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(*r, 1u);
    EXPECT_EQ(back, b);
  }
  ASSERT_GT(engine->stats().leader_sleeps, sleeps) << "no receive slept in 50 round trips";
  // At least doubled: a reply came within the ceiling. (By how much more
  // depends on when the wait began against the child's 5 ms, which a
  // loaded machine moves; AdaptiveSpin's own test checks the rule.)
  const int64_t grown = engine->stats().spin_ns;
  EXPECT_GE(grown, 2'000'000) << "in 50 round trips, no reply found about 5 ms into a "
                                 "receive that slept after 1 ms grew the spin";
  EXPECT_LE(grown, 50'000'000);
  // A receive that times out with nothing arriving halves the spin. One
  // that the peer's trailing traffic woke (a credit or flow report for the
  // last reply, landing inside its 2 ms) ended its wait with work and
  // teaches nothing, so give it a few tries; each must still time out.
  for (int i = 0; i < 5 && engine->stats().spin_ns > grown / 2; ++i) timed_out_recv();
  EXPECT_LE(engine->stats().spin_ns, grown / 2) << "five timed-out receives left the spin";
  // End of stream both ways (the child's close needs this side's progress).
  EndOfStreamBothWays(c->get(), child);
}

// The engine calls its fabric from its progress thread and from the
// application's threads: a fabric configured for one thread at a time
// (ucx's threads=serialized) is refused, saying what to change.
TEST(SdpEngine, RefusesASingleThreadedFabric) {
  auto e = Engine::Create({"ucx:tcp?threads=serialized", false});
  ASSERT_FALSE(e.ok()) << "the engine took a fabric that allows one thread at a time";
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << e.status();
  EXPECT_TRUE(absl::StrContains(e.status().message(), "single-threaded")) << e.status();
  EXPECT_TRUE(absl::StrContains(e.status().message(), "drop threads=serialized")) << e.status();
  EXPECT_TRUE(Engine::Create({"ucx:tcp?threads=multi", false}).ok());
}

// A blocking call's spin ends at its deadline: with a 300 ms spin (as a
// large spin_max_us allows), a receive with a 20 ms timeout and nothing to
// read returns well before the spin would have ended.
TEST_P(SdpTest, ALongSpinEndsAtTheCallersDeadline) {
  auto [engine, l] = EngineWithSpin({300'000'000, 300'000'000});
  ASSERT_NE(l, nullptr);
  const std::string address = l->address();
  pid_t child = Spawn([&] {  // connects, then waits for the end of stream
    auto e = Engine::Create({GetParam().config, false});
    CHILD_OK(e.status());
    auto c = (*e)->Connect(address, Options(), Deadline());
    CHILD_OK(c.status());
    uint8_t b;
    auto r = (*c)->Recv(&b, 1, 0, Deadline());
    CHILD_OK(r.status());
    CHILD_CHECK(*r == 0);
    return 0;
  });
  auto c = l->Accept(Deadline());
  ASSERT_TRUE(c.ok()) << c.status();
  uint8_t b;
  const absl::Time t0 = absl::Now();
  auto r = (*c)->Recv(&b, 1, 0, t0 + absl::Milliseconds(20));
  const absl::Duration took = absl::Now() - t0;
  EXPECT_FALSE(r.ok() && *r > 0) << "a byte came that nobody sent";
  EXPECT_LT(took, absl::Milliseconds(250)) << "the 300 ms spin ran past the 20 ms deadline";
  EndOfStreamBothWays(c->get(), child);
}

// Each malformed message aborts only its own connection.
TEST_P(SdpTest, MalformedHeadersAbortOnlyThatConnection) {
  auto raw = [](MessageId mid, uint32_t len, uint16_t bufs, uint32_t mseq, uint32_t ack,
                std::string body = "") {
    std::string s(16, '\0');
    s[0] = static_cast<char>(mid);
    std::memcpy(&s[2], &bufs, 2);
    std::memcpy(&s[4], &len, 4);
    std::memcpy(&s[8], &mseq, 4);
    std::memcpy(&s[12], &ack, 4);
    return s + body;
  };
  std::string compl_body(8, '\0');
  compl_body[0] = 99;  // names an advert that does not exist
  // A pulled SrcAvail that names a lock word: refused whether or not this
  // side offered pulled bcopy.
  wire::Advert pull_advert;
  pull_advert.addr = 4096;
  pull_advert.length = 4096;
  pull_advert.az_slot = 0;
  pull_advert.key_bytes = RemoteKey{4096, 4096, kRemoteRead, {1, 2, 3, 4}}.Serialize();
  const std::string pull_with_slot = wire::EncodeToString(
      wire::Message{{MessageId::kSrcAvail, wire::kFlagPull}, pull_advert});
  const std::vector<std::string> variants = {
      raw(static_cast<MessageId>(0x42), 16, 1, 0, 0),                // unknown id
      pull_with_slot,                                                // Pull + lock word
      raw(MessageId::kData, 1000, 1, 0, 0),                          // wrong length
      raw(MessageId::kData, 16, 4000, 0, 0),                         // credits beyond max
      raw(MessageId::kData, 16, 1, 1000, 0),                         // out of sequence
      raw(MessageId::kData, 16, 1, 0, 999999),                       // acks the future
      raw(MessageId::kRdmaRdCompl, 24, 1, 0, 0, compl_body),         // unknown advert
      raw(MessageId::kHelloAck, 16, 1, 0, 0),                        // short Hello
      raw(MessageId::kDisconnReq, 17, 1, 0, 0, std::string(1, 'x')),  // body on DisconnReq
  };
  const size_t n = variants.size();
  pid_t child = Spawn([&] {
    ChildSide good = ChildConnect();
    std::vector<ChildSide> bad;
    for (size_t i = 0; i < n; ++i) bad.push_back(ChildConnect());
    for (size_t i = 0; i < n; ++i) {
      uint8_t tag = static_cast<uint8_t>(i + 1);
      CHILD_OK(bad[i].conn->Send(&tag, 1, 0, Deadline()).status());
      CHILD_OK(bad[i].conn->TestInjectRaw(variants[i]));
    }
    uint8_t tag = 0;
    CHILD_OK(good.conn->Send(&tag, 1, 0, Deadline()).status());
    // Each bad connection gets reset by the parent's AbortConn.
    for (size_t i = 0; i < n; ++i) {
      char b;
      auto r = bad[i].conn->Recv(&b, 1, 0, Deadline());
      CHILD_CHECK(!r.ok());
      CHILD_CHECK(StatusErrno(r.status()) == ECONNRESET);
    }
    std::string err = ReadStream(good.conn.get(), 5000, 11);
    if (!err.empty()) ChildFail(__LINE__, err);
    return 0;
  });
  std::vector<std::unique_ptr<Connection>> conns;
  for (size_t i = 0; i < n + 1; ++i) {
    conns.push_back(AcceptOne());
    ASSERT_NE(conns.back(), nullptr);
  }
  Connection* good = nullptr;
  for (auto& c : conns) {
    uint8_t tag = 0xff;
    auto r = c->Recv(&tag, 1, 0, Deadline());
    ASSERT_TRUE(r.ok()) << r.status();
    if (tag == 0) {
      good = c.get();
      continue;
    }
    auto bad = c->Recv(&tag, 1, 0, Deadline());
    ASSERT_FALSE(bad.ok()) << "variant " << int(tag);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kAborted) << bad.status();
    EXPECT_EQ(StatusErrno(bad.status()), EPROTO) << "variant " << int(tag) << ": " << bad.status();
  }
  ASSERT_NE(good, nullptr);
  std::vector<uint8_t> buf(5000);
  FillStream(buf.data(), 0, buf.size(), 11);
  auto r = good->Send(buf.data(), buf.size(), 0, Deadline());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(good->Shutdown(SHUT_WR).ok());
  auto eof = good->Recv(buf.data(), 1, 0, Deadline());  // the child's Close
  ASSERT_TRUE(eof.ok()) << eof.status();
  EXPECT_EQ(*eof, 0u);
  EXPECT_GE(engine_->stats().protocol_aborts, n);
  EXPECT_EQ(Reap(child), 0);
}

TEST_P(SdpTest, NonBlockingCallsReturnWouldBlock) {
  pid_t child = Spawn([&] {
    ChildSide s = ChildConnect();
    char b[10];
    auto r = s.conn->Recv(b, sizeof(b), MSG_WAITALL, Deadline());
    CHILD_OK(r.status());
    CHILD_CHECK(*r == sizeof(b));
    return 0;
  });
  auto c = AcceptOne();
  ASSERT_NE(c, nullptr);
  char b[10] = {};
  auto r = c->Recv(b, sizeof(b), MSG_DONTWAIT);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(StatusErrno(r.status()), EAGAIN);
  EXPECT_FALSE(c->readiness() & kReadable);
  EXPECT_TRUE(c->readiness() & kWritable);
  ASSERT_TRUE(c->Send(b, sizeof(b), MSG_DONTWAIT).ok());
  // The child closes: MSG_PEEK sees the end of stream (and acknowledges the
  // DisconnReq the child's Close waits for).
  auto eof = c->Recv(b, sizeof(b), MSG_PEEK, Deadline());
  ASSERT_TRUE(eof.ok()) << eof.status();
  EXPECT_EQ(*eof, 0u);
  EXPECT_EQ(Reap(child), 0);
}

// Whenever a connection says it is writable, a non-blocking send takes
// bytes: a full pull buffer sends the rest by bcopy instead of EAGAIN (an
// event loop would spin otherwise). Then the stream arrives byte-exact.
// (Not writable need not mean EAGAIN: the send's own progress may free
// room.)
TEST_P(SdpTest, NonBlockingSendTakesBytesWheneverWritable) {
  if (GetParam().mode != Mode::kBcopy) GTEST_SKIP() << "bcopy mode's path";
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  constexpr uint64_t kSeed = 47;
  pid_t child = Spawn([&] {
    close(go[1]);
    ChildSide s = ChildConnect();
    char one;
    CHILD_CHECK(read(go[0], &one, 1) == 1);  // the parent filled its buffers
    std::vector<uint8_t> buf(1 << 20), scratch;
    uint64_t off = 0;
    for (;;) {
      auto r = s.conn->Recv(buf.data(), buf.size(), 0, Deadline());
      CHILD_OK(r.status());
      if (*r == 0) break;
      CHILD_CHECK(CheckStream(buf.data(), off, *r, kSeed, &scratch) == -1);
      off += *r;
    }
    CHILD_CHECK(off >= (512u << 10));
    CHILD_OK(s.conn->Close());
    return 0;
  });
  close(go[0]);
  auto c = AcceptOne();
  ASSERT_NE(c, nullptr);
  constexpr size_t kChunk = 4 << 20;
  std::vector<uint8_t> buf(kChunk);
  uint64_t off = 0;
  int sends = 0;
  while ((c->readiness() & kWritable) && sends < 64) {
    FillStream(buf.data(), off, kChunk, kSeed);
    auto r = c->Send(buf.data(), kChunk, MSG_DONTWAIT);
    ASSERT_TRUE(r.ok()) << "writable, yet send " << sends << " after " << off << " bytes: "
                        << r.status();
    ASSERT_GT(*r, 0u);
    off += *r;
    ++sends;
  }
  EXPECT_LT(sends, 64) << "never stopped being writable";
  EXPECT_GE(off, uint64_t{512} << 10);
  ASSERT_EQ(write(go[1], "g", 1), 1);
  close(go[1]);
  ASSERT_TRUE(c->Shutdown(SHUT_WR).ok());
  EXPECT_EQ(ReapWhilePolling(child), 0);
}

// ---- ZCopy cancel races, each forced (test hooks and deadlines) and
// checked byte-exact. They run in the zcopy instantiation only.

// Page-aligned, page-granular buffers: no heap neighbour shares their pages,
// so no free() elsewhere revokes their registration (a heap buffer's zero-copy
// transfer falls back to bcopy when that happens, which would make these
// tests take another path than the one they force).
struct PageBuf {
  explicit PageBuf(size_t n) : n_(n) {
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    p_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  ~PageBuf() {
    if (p_ != nullptr) munmap(p_, n_);
  }
  uint8_t* data() { return p_; }
  size_t size() const { return n_; }
  uint8_t* p_;
  size_t n_;
};

class SdpCancelTest : public SdpTest {
 protected:
  void SetUp() override {
    if (GetParam().mode != Mode::kZcopy) GTEST_SKIP() << "zero-copy races: zcopy mode only";
    SdpTest::SetUp();
  }
  // Re-listens with options carrying a hold hook for the accepted side.
  void ListenHolding(MessageId held) {
    ConnectionOptions o = Options();
    o.test_hold = [held](MessageId m) { return m != held; };
    auto l = engine_->Listen("", o);
    ASSERT_TRUE(l.ok()) << l.status();
    listener_ = std::move(*l);
  }
};

// Waits (making progress) until pred() or 30 s.
bool WaitFor(Engine* e, const std::function<bool()>& pred) {
  absl::Time end = absl::Now() + absl::Seconds(30);
  while (!pred()) {
    if (absl::Now() > end) return false;
    e->Poll();
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

constexpr size_t kBig = 1 << 20;

// Sends stream bytes [0, total) whatever the partial results; returns "".
std::string SendAll(Connection* c, PageBuf& buf, size_t from) {
  size_t off = from;
  while (off < buf.size()) {
    auto r = c->Send(buf.data() + off, buf.size() - off, 0, Deadline());
    if (!r.ok()) return r.status().ToString();
    off += *r;
  }
  return "";
}

// The source gives up before the sink reads: SrcAvailCancel, answered by
// RdmaRdCompl(CancelReply, 0); the source resends; nothing is lost or
// duplicated.
TEST_P(SdpCancelTest, SourceGivesUpBeforeTheSinkReads) {
  pid_t child = Spawn([&] {
    ChildSide s = ChildConnect();
    PageBuf buf(kBig);
    FillStream(buf.data(), 0, buf.size(), 21);
    auto r = s.conn->Send(buf.data(), buf.size(), 0, absl::Now() + absl::Milliseconds(300));
    size_t sent = 0;
    if (r.ok()) {
      sent = *r;
    } else {
      CHILD_CHECK(r.status().code() == absl::StatusCode::kDeadlineExceeded);
    }
    CHILD_CHECK(s.conn->stats().srcavail_cancels == 1);
    std::string err = SendAll(s.conn.get(), buf, sent);
    if (!err.empty()) ChildFail(__LINE__, err);
    return ChildFinish(s);
  });
  auto c = AcceptOne();
  ASSERT_NE(c, nullptr);
  absl::SleepFor(absl::Seconds(1));  // not reading: the source's deadline passes
  EXPECT_EQ(ReadStream(c.get(), kBig, 21), "");
  EXPECT_GE(c->stats().cancels_received, 1u);
  EXPECT_TRUE(c->Shutdown(SHUT_WR).ok());
  EXPECT_EQ(Reap(child), 0);
}

// The cancel crosses the sink's final RdmaRdCompl (held by a hook until the
// cancel arrived): the sink answers CancelReply(0) after it; the source
// counts every byte once and its Send returns them all.
TEST_P(SdpCancelTest, CancelCrossesTheFinalReadCompletion) {
  ListenHolding(MessageId::kRdmaRdCompl);
  pid_t child = Spawn([&] {
    ChildSide s = ChildConnect();
    PageBuf buf(kBig);
    FillStream(buf.data(), 0, buf.size(), 22);
    auto r = s.conn->Send(buf.data(), buf.size(), 0, absl::Now() + absl::Milliseconds(500));
    CHILD_OK(r.status());
    CHILD_CHECK(*r == kBig);
    CHILD_CHECK(s.conn->stats().srcavail_cancels == 1);
    CHILD_CHECK(s.conn->stats().bytes_sent_srcavail == kBig);
    return ChildFinish(s);
  });
  auto c = AcceptOne();
  ASSERT_NE(c, nullptr);
  PageBuf buf(kBig);
  std::vector<uint8_t> scratch;
  // Peek first (a peek never announces a SinkAvail), so the data comes by
  // the child's SrcAvail.
  auto p = c->Recv(buf.data(), 1, MSG_PEEK, Deadline());
  ASSERT_TRUE(p.ok()) << p.status();
  auto r = c->Recv(buf.data(), buf.size(), MSG_WAITALL, Deadline());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(*r, kBig);
  EXPECT_EQ(CheckStream(buf.data(), 0, kBig, 22, &scratch), -1);
  ASSERT_TRUE(WaitFor(engine_.get(), [&] { return c->stats().cancels_received >= 1; }));
  c->TestReleaseHeld();
  auto eof = c->Recv(buf.data(), 1, 0, Deadline());
  ASSERT_TRUE(eof.ok()) << eof.status();
  EXPECT_EQ(*eof, 0u);
  EXPECT_TRUE(c->Shutdown(SHUT_WR).ok());
  EXPECT_EQ(Reap(child), 0);
}

// The sink gives up before the source writes: SinkAvailCancel answered by
// SinkCancelAck; the data then comes another way, byte-exact.
TEST_P(SdpCancelTest, SinkGivesUpBeforeTheSourceWrites) {
  pid_t child = Spawn([&] {
    ChildSide s = ChildConnect();
    char go;
    auto g = s.conn->Recv(&go, 1, 0, Deadline());  // progresses: acks the cancel
    CHILD_OK(g.status());
    CHILD_CHECK(*g == 1);
    CHILD_CHECK(s.conn->stats().sinkavail_received == 1);
    CHILD_CHECK(s.conn->stats().cancels_received == 1);
    PageBuf buf(kBig);
    FillStream(buf.data(), 0, buf.size(), 23);
    std::string err = SendAll(s.conn.get(), buf, 0);
    if (!err.empty()) ChildFail(__LINE__, err);
    return ChildFinish(s);
  });
  auto c = AcceptOne();
  ASSERT_NE(c, nullptr);
  PageBuf buf(kBig);
  auto r = c->Recv(buf.data(), buf.size(), 0, absl::Now() + absl::Milliseconds(300));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_EQ(c->stats().sinkavail_sent, 1u);
  EXPECT_EQ(c->stats().sinkavail_cancels, 1u);
  char go = 1;
  ASSERT_TRUE(c->Send(&go, 1, 0, Deadline()).ok());
  EXPECT_EQ(ReadStream(c.get(), kBig, 23), "");
  EXPECT_TRUE(c->Shutdown(SHUT_WR).ok());
  EXPECT_EQ(Reap(child), 0);
}

// The sink's cancel crosses the source's write (its RdmaWrCompl held by a
// hook until the cancel arrived): the sink takes the written bytes, the ack
// follows the completion; every byte arrives once.
TEST_P(SdpCancelTest, SinkCancelCrossesTheWrite) {
  pid_t child = Spawn([&] {
    ConnectionOptions o = Options();
    o.test_hold = [](MessageId m) { return m != MessageId::kRdmaWrCompl; };
    ChildSide s = ChildConnect(o);
    CHILD_CHECK(WaitFor(s.engine.get(), [&] { return s.conn->stats().sinkavail_received >= 1; }));
    PageBuf buf(kBig);
    FillStream(buf.data(), 0, buf.size(), 24);
    auto r = s.conn->Send(buf.data(), buf.size(), 0, Deadline());
    CHILD_OK(r.status());
    CHILD_CHECK(s.conn->stats().bytes_sent_sinkavail == *r);
    CHILD_CHECK(WaitFor(s.engine.get(), [&] { return s.conn->stats().cancels_received >= 1; }));
    s.conn->TestReleaseHeld();
    std::string err = SendAll(s.conn.get(), buf, *r);
    if (!err.empty()) ChildFail(__LINE__, err);
    return ChildFinish(s);
  });
  auto c = AcceptOne();
  ASSERT_NE(c, nullptr);
  PageBuf buf(kBig);
  std::vector<uint8_t> scratch;
  auto r = c->Recv(buf.data(), buf.size(), 0, absl::Now() + absl::Seconds(2));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_GT(*r, 0u);
  EXPECT_EQ(CheckStream(buf.data(), 0, *r, 24, &scratch), -1);
  EXPECT_EQ(c->stats().sinkavail_cancels, 1u);
  EXPECT_EQ(c->stats().bytes_recv_sinkavail, *r);
  // The rest of the stream follows.
  size_t off = *r;
  while (off < kBig) {
    auto k = c->Recv(buf.data(), kBig - off, 0, Deadline());
    ASSERT_TRUE(k.ok()) << k.status();
    ASSERT_GT(*k, 0u);
    ASSERT_EQ(CheckStream(buf.data(), off, *k, 24, &scratch), -1);
    off += *k;
  }
  auto eof = c->Recv(buf.data(), 1, 0, Deadline());
  ASSERT_TRUE(eof.ok()) << eof.status();
  EXPECT_EQ(*eof, 0u);
  EXPECT_TRUE(c->Shutdown(SHUT_WR).ok());
  EXPECT_EQ(Reap(child), 0);
}

// Both announce at once: the source's SrcAvail (held by a hook) and the
// sink's SinkAvail cross; the source voids the SinkAvail, the sink voids it
// on seeing the SrcAvail, and the data goes by RDMA read, byte-exact.
TEST_P(SdpCancelTest, SrcAvailAndSinkAvailCross) {
  int queued[2];
  ASSERT_EQ(pipe(queued), 0);
  pid_t child = Spawn([&] {
    ConnectionOptions o = Options();
    o.test_hold = [](MessageId m) { return m != MessageId::kSrcAvail; };
    ChildSide s = ChildConnect(o);
    PageBuf buf(kBig);
    FillStream(buf.data(), 0, buf.size(), 25);
    absl::StatusOr<size_t> r;
    std::thread sender([&] { r = s.conn->Send(buf.data(), buf.size(), 0, Deadline()); });
    // Tell the parent once the SrcAvail is queued (and held): its SinkAvail
    // then certainly crosses it.
    bool queued_ok = WaitFor(s.engine.get(), [&] { return s.conn->stats().srcavail_sent >= 1; });
    char one = 1;
    CHILD_CHECK(write(queued[1], &one, 1) == 1);
    CHILD_CHECK(queued_ok);
    bool seen = WaitFor(s.engine.get(), [&] { return s.conn->stats().sinkavail_received >= 1; });
    s.conn->TestReleaseHeld();
    sender.join();
    CHILD_CHECK(seen);
    CHILD_OK(r.status());
    CHILD_CHECK(*r == kBig);
    CHILD_CHECK(s.conn->stats().bytes_sent_srcavail == kBig);
    CHILD_CHECK(s.conn->stats().bytes_sent_sinkavail == 0);
    return ChildFinish(s);
  });
  close(queued[1]);  // a child that dies before writing ends the read (EOF), not hangs it
  auto c = AcceptOne();
  ASSERT_NE(c, nullptr);
  char one;
  ASSERT_EQ(read(queued[0], &one, 1), 1);
  close(queued[0]);
  PageBuf buf(kBig);
  std::vector<uint8_t> scratch;
  auto r = c->Recv(buf.data(), buf.size(), MSG_WAITALL, Deadline());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(*r, kBig);
  EXPECT_EQ(CheckStream(buf.data(), 0, kBig, 25, &scratch), -1);
  EXPECT_EQ(c->stats().sinkavail_sent, 1u);
  EXPECT_EQ(c->stats().sinkavail_void, 1u);
  EXPECT_EQ(c->stats().bytes_recv_srcavail, kBig);
  auto eof = c->Recv(buf.data(), 1, 0, Deadline());
  ASSERT_TRUE(eof.ok()) << eof.status();
  EXPECT_EQ(*eof, 0u);
  EXPECT_TRUE(c->Shutdown(SHUT_WR).ok());
  EXPECT_EQ(Reap(child), 0);
}

// The sink reads one SrcAvail in many small pieces (its buffers are smaller
// than the advert): every byte once, all by RDMA read.
TEST_P(SdpCancelTest, SinkReadsASrcAvailInSmallPieces) {
  pid_t child = Spawn([&] {
    ChildSide s = ChildConnect();
    PageBuf buf(kBig);
    FillStream(buf.data(), 0, buf.size(), 26);
    auto r = s.conn->Send(buf.data(), buf.size(), 0, Deadline());
    CHILD_OK(r.status());
    CHILD_CHECK(*r == kBig);
    CHILD_CHECK(s.conn->stats().bytes_sent_srcavail == kBig);
    return ChildFinish(s);
  });
  auto c = AcceptOne();
  ASSERT_NE(c, nullptr);
  std::vector<uint8_t> piece(1000), scratch;
  size_t off = 0;
  while (off < kBig) {
    auto k = c->Recv(piece.data(), piece.size(), 0, Deadline());
    ASSERT_TRUE(k.ok()) << k.status();
    ASSERT_GT(*k, 0u);
    ASSERT_EQ(CheckStream(piece.data(), off, *k, 26, &scratch), -1) << "at " << off;
    off += *k;
  }
  EXPECT_EQ(c->stats().bytes_recv_srcavail, kBig);
  auto eof = c->Recv(piece.data(), 1, 0, Deadline());
  ASSERT_TRUE(eof.ok()) << eof.status();
  EXPECT_EQ(*eof, 0u);
  EXPECT_TRUE(c->Shutdown(SHUT_WR).ok());
  EXPECT_EQ(Reap(child), 0);
}

// The source's registration is revoked while its SrcAvail is outstanding
// (as a free() of a heap neighbour does): the sink's read is refused, it
// answers SendSmall and the source sends the rest by bcopy, byte-exact.
// On ofi a refused remote access ends the connection (as on an RC queue
// pair; docs/provider-interface.md), so there is no fallback to exercise.
bool RefusalEndsConnection(const std::string& config) { return config.rfind("ofi", 0) == 0; }

TEST_P(SdpCancelTest, RevokedSourceFallsBackToBcopy) {
  if (RefusalEndsConnection(GetParam().config)) {
    GTEST_SKIP() << "a refused RDMA access ends an ofi connection: no fallback to test";
  }
  int revoked[2];
  ASSERT_EQ(pipe(revoked), 0);
  pid_t child = Spawn([&] {
    ChildSide s = ChildConnect();
    PageBuf buf(kBig);
    FillStream(buf.data(), 0, buf.size(), 27);
    std::thread revoker([&] {
      WaitFor(s.engine.get(), [&] { return s.conn->stats().srcavail_sent >= 1; });
      s.engine->fabric()->rcache().Invalidate(buf.data(), buf.size());
      char one = 1;
      CHILD_CHECK(write(revoked[1], &one, 1) == 1);
    });
    auto r = s.conn->Send(buf.data(), buf.size(), 0, Deadline());
    revoker.join();
    CHILD_OK(r.status());
    CHILD_CHECK(*r == kBig);
    CHILD_CHECK(s.conn->stats().sendsmall == 1);
    return ChildFinish(s);
  });
  close(revoked[1]);  // as above: EOF if the child dies first
  auto c = AcceptOne();
  ASSERT_NE(c, nullptr);
  char one;
  ASSERT_EQ(read(revoked[0], &one, 1), 1);  // the key is revoked before we read
  close(revoked[0]);
  EXPECT_EQ(ReadStream(c.get(), kBig, 27), "");
  EXPECT_EQ(c->stats().rdma_fallbacks, 1u);
  EXPECT_EQ(c->stats().bytes_recv_srcavail, 0u);
  // The rest came by Data, or into a SinkAvail of this side.
  EXPECT_EQ(c->stats().bytes_recv_bcopy + c->stats().bytes_recv_sinkavail, kBig);
  EXPECT_TRUE(c->Shutdown(SHUT_WR).ok());
  EXPECT_EQ(Reap(child), 0);
}

// The sink's registration is revoked while its SinkAvail is outstanding:
// the source's RDMA write is refused, it voids the SinkAvail by sending the
// bytes as Data, and the sink receives them in the same place, byte-exact.
TEST_P(SdpCancelTest, RevokedSinkFallsBackToBcopy) {
  if (RefusalEndsConnection(GetParam().config)) {
    GTEST_SKIP() << "a refused RDMA access ends an ofi connection: no fallback to test";
  }
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  pid_t child = Spawn([&] {
    ChildSide s = ChildConnect();
    char one;
    CHILD_CHECK(read(go[0], &one, 1) == 1);
    CHILD_CHECK(WaitFor(s.engine.get(), [&] { return s.conn->stats().sinkavail_received >= 1; }));
    PageBuf buf(kBig);
    FillStream(buf.data(), 0, buf.size(), 28);
    std::string err = SendAll(s.conn.get(), buf, 0);
    if (!err.empty()) ChildFail(__LINE__, err);
    CHILD_CHECK(s.conn->stats().rdma_fallbacks >= 1);
    return ChildFinish(s);
  });
  auto c = AcceptOne();
  ASSERT_NE(c, nullptr);
  PageBuf buf(kBig);
  std::vector<uint8_t> scratch;
  std::thread revoker([&] {
    WaitFor(engine_.get(), [&] { return c->stats().sinkavail_sent >= 1; });
    absl::SleepFor(absl::Milliseconds(50));  // the SinkAvail is registered by now
    engine_->fabric()->rcache().Invalidate(buf.data(), buf.size());
    char one = 1;
    EXPECT_EQ(write(go[1], &one, 1), 1);
  });
  auto r = c->Recv(buf.data(), buf.size(), MSG_WAITALL, Deadline());
  revoker.join();
  close(go[0]);
  close(go[1]);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(*r, kBig);
  EXPECT_EQ(CheckStream(buf.data(), 0, kBig, 28, &scratch), -1);
  EXPECT_GE(c->stats().sinkavail_void, 1u);  // later SinkAvails may race the Data too
  auto eof = c->Recv(buf.data(), 1, 0, Deadline());
  ASSERT_TRUE(eof.ok()) << eof.status();
  EXPECT_EQ(*eof, 0u);
  EXPECT_TRUE(c->Shutdown(SHUT_WR).ok());
  EXPECT_EQ(Reap(child), 0);
}


// ---------------------------------------------------------------- AZ-SDP
//
// The sender is the parent; the receiver, a child with a progress thread (so
// remote atomics on its lock words complete while it waits), reads only
// when told through a pipe. That makes every race deterministic: a write
// before the go-ahead finds the receiver idle (copy-on-write wins its lock
// word), a write after it waits for the pull (block-on-write).

std::vector<Param> AzParams() {
  std::vector<Param> out;
  for (const auto& c : ConformanceConfigurations()) {
    out.push_back({c, Mode::kAz, AzPolicy::kCopy});
    out.push_back({c, Mode::kAz, AzPolicy::kBlock});
  }
  return out;
}

class SdpAzTest : public SdpTest {
 protected:
  void SetUp() override {
    SdpTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    const Capabilities& caps = engine_->fabric()->caps();
    if (caps.rdma_read == Support::kNone || caps.atomics == Support::kNone) {
      GTEST_SKIP() << GetParam().config << " has no RDMA read or atomics: AZ-SDP needs both";
    }
    ASSERT_EQ(pipe(go_), 0);
  }
  void TearDown() override {
    if (go_[0] >= 0) close(go_[0]);
    if (go_[1] >= 0) close(go_[1]);
  }
  bool copy() const { return GetParam().policy == AzPolicy::kCopy; }
  // The accepted side gets `o` (the connecting child keeps Options()).
  void Relisten(const ConnectionOptions& o) {
    auto l = engine_->Listen("", o);
    ASSERT_TRUE(l.ok()) << l.status();
    listener_ = std::move(*l);
  }
  void Go() { ASSERT_EQ(write(go_[1], "g", 1), 1); }

  // Child: waits for the go-ahead, then reads `total` stream bytes of
  // `seed` and checks them; exits 0 if all are right.
  pid_t SpawnReceiver(size_t total, uint64_t seed) {
    return Spawn([this, total, seed] {
      ChildSide s = ChildConnect(Options(), /*progress_thread=*/true);
      return ReceiveAfterGo(s, total, seed);
    });
  }
  // Child: waits for the go-ahead, reads `total` stream bytes of `seed`
  // and checks them, shuts down writing and waits for the parent's end.
  int ReceiveAfterGo(ChildSide& s, size_t total, uint64_t seed) {
    char g;
    CHILD_CHECK(read(go_[0], &g, 1) == 1);
    std::vector<uint8_t> buf(total), scratch;
    auto r = s.conn->Recv(buf.data(), total, MSG_WAITALL, Deadline());
    CHILD_OK(r.status());
    CHILD_CHECK(*r == total);
    int64_t bad = CheckStream(buf.data(), 0, total, seed, &scratch);
    if (bad >= 0) ChildFail(__LINE__, absl::StrCat("byte ", bad, " differs"));
    return ChildFinish(s);
  }
  std::unique_ptr<Connection> AcceptAz() {
    auto c = AcceptOne();
    if (c != nullptr) {
      EXPECT_TRUE(c->az_negotiated()) << GetParam().config;
    }
    return c;
  }
  void Finish(Connection* c, pid_t child) {
    EXPECT_TRUE(c->Shutdown(SHUT_WR).ok());
    char b;
    EXPECT_EQ(c->Recv(&b, 1, 0, Deadline()).value_or(1), 0u);
    EXPECT_EQ(Reap(child), 0);
  }

  int go_[2] = {-1, -1};
};

// After send returns, the application overwrites the buffer at once, K
// times; the receiver still gets exactly the bytes of each call.
TEST_P(SdpAzTest, OverwriteRightAfterSendKeepsTheBytesOfTheCall) {
  constexpr size_t kMsg = 1 << 20;
  constexpr int kRounds = 8;
  pid_t child = SpawnReceiver(kMsg * kRounds, 31);
  auto c = AcceptAz();
  ASSERT_NE(c, nullptr);
  PageBuf buf(kMsg);
  for (int i = 0; i < kRounds; ++i) {
    FillStream(buf.data(), uint64_t{kMsg} * i, kMsg, 31);  // faults from round 1 on
    auto r = c->Send(buf.data(), kMsg, 0, Deadline());
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(*r, kMsg);
    if (i == 0) {
      // Returned although the receiver has not pulled a byte.
      EXPECT_EQ(c->stats().bytes_sent_srcavail, 0u);
      if (!copy()) Go();  // block-on-write: the writes wait for the pulls
    }
  }
  if (copy()) Go();
  Finish(c.get(), child);
  auto st = c->stats();
  EXPECT_EQ(st.az_srcavail_sent, static_cast<uint64_t>(kRounds));
  EXPECT_EQ(st.bytes_sent_srcavail, kMsg * kRounds);
  EXPECT_EQ(st.az_faults, static_cast<uint64_t>(kRounds - 1));
  if (copy()) {
    EXPECT_EQ(st.az_copies, static_cast<uint64_t>(kRounds - 1));  // the receiver was idle
    EXPECT_EQ(st.az_blocks, 0u);
  } else {
    EXPECT_EQ(st.az_copies, 0u);
    EXPECT_EQ(st.az_blocks, static_cast<uint64_t>(kRounds - 1));
  }
}

// Unaligned buffer: the page-aligned middle goes asynchronously, the head
// and tail by bcopy; another thread overwrites the whole buffer.
TEST_P(SdpAzTest, UnalignedBufferHybridAndAnotherThreadWrites) {
  constexpr size_t kLen = (2 << 20) + 300;
  pid_t child = SpawnReceiver(kLen, 32);
  auto c = AcceptAz();
  ASSERT_NE(c, nullptr);
  PageBuf buf(3 << 20);
  uint8_t* p = buf.data() + 100;
  FillStream(p, 0, kLen, 32);
  auto r = c->Send(p, kLen, 0, Deadline());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, kLen);
  if (!copy()) Go();
  std::thread t([&] { std::memset(p, 0xee, kLen); });  // not the sending thread
  t.join();
  if (copy()) Go();
  Finish(c.get(), child);
  auto st = c->stats();
  EXPECT_EQ(st.az_srcavail_sent, 1u);
  EXPECT_EQ(st.az_hybrid_bcopy, az::PageSize() - 100);
  EXPECT_EQ(st.bytes_sent_srcavail + st.bytes_sent_bcopy, kLen);
  EXPECT_GE(st.az_faults, 1u);
}

// A memfd mapped twice: written through the mapping that was not sent.
TEST_P(SdpAzTest, AliasedMappingWrittenThroughTheOtherAddress) {
  constexpr size_t kLen = 1 << 20;
  pid_t child = SpawnReceiver(kLen, 33);
  auto c = AcceptAz();
  ASSERT_NE(c, nullptr);
  int fd = memfd_create("az-alias", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, kLen), 0);
  auto* a = static_cast<uint8_t*>(mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  auto* b = static_cast<uint8_t*>(mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(a, MAP_FAILED);
  ASSERT_NE(b, MAP_FAILED);
  close(fd);
  FillStream(a, 0, kLen, 33);
  const uint64_t aliases = az::Guard::Get().stats().alias_ranges;
  auto r = c->Send(a, kLen, 0, Deadline());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(az::Guard::Get().stats().alias_ranges, aliases + 1);
  if (!copy()) Go();
  std::memset(b, 0x5a, kLen);  // through the other address
  if (copy()) Go();
  EXPECT_EQ(a[0], 0x5a);  // the same pages
  Finish(c.get(), child);
  EXPECT_GE(c->stats().az_faults, 1u);
  munmap(a, kLen);
  munmap(b, kLen);
}

// free() of a buffer still being sent waits for (or copies out) its
// transfer; the memory is then reused and scribbled over.
TEST_P(SdpAzTest, FreeOfABufferBeingSentWaitsForIt) {
  constexpr size_t kLen = 1 << 20;
  pid_t child = SpawnReceiver(kLen, 34);
  auto c = AcceptAz();
  ASSERT_NE(c, nullptr);
  auto* p = static_cast<uint8_t*>(std::malloc(kLen));
  ASSERT_NE(p, nullptr);
  FillStream(p, 0, kLen, 34);
  auto r = c->Send(p, kLen, 0, Deadline());
  ASSERT_TRUE(r.ok()) << r.status();
  if (!copy()) Go();
  std::free(p);
  for (int i = 0; i < 4; ++i) {
    void* q = std::malloc(kLen);
    std::memset(q, 0x77, kLen);
    std::free(q);
  }
  if (copy()) Go();
  Finish(c.get(), child);
  EXPECT_GE(c->stats().az_faults, 1u);
}

// One buffer sent twice before either send is pulled (a stream re-sending
// a buffer): the second send finds its pages read-only already and does not
// protect them again; releasing the first must leave them protected for the
// second. A write after both sends keeps the bytes of both calls.
TEST_P(SdpAzTest, ABufferSentTwiceStaysProtectedUntilBothArePulled) {
  constexpr size_t kLen = 1 << 20;
  pid_t child = Spawn([this] {
    ChildSide s = ChildConnect(Options(), /*progress_thread=*/true);
    char g;
    CHILD_CHECK(read(go_[0], &g, 1) == 1);
    std::vector<uint8_t> buf(kLen), scratch;
    for (int round = 0; round < 2; ++round) {  // the same bytes twice
      auto r = s.conn->Recv(buf.data(), kLen, MSG_WAITALL, Deadline());
      CHILD_OK(r.status());
      CHILD_CHECK(*r == kLen);
      int64_t bad = CheckStream(buf.data(), 0, kLen, 63, &scratch);
      if (bad >= 0) ChildFail(__LINE__, absl::StrCat("round ", round, ": byte ", bad, " differs"));
    }
    return ChildFinish(s);
  });
  auto c = AcceptAz();
  ASSERT_NE(c, nullptr);
  PageBuf buf(kLen);
  FillStream(buf.data(), 0, kLen, 63);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(c->Send(buf.data(), kLen, 0, Deadline()).ok());
  EXPECT_EQ(c->stats().az_srcavail_sent, 2u);
  if (!copy()) Go();  // block-on-write: the write waits for both pulls
  std::memset(buf.data(), 0x5a, kLen);
  if (copy()) Go();
  Finish(c.get(), child);
  auto st = c->stats();
  EXPECT_EQ(st.bytes_sent_srcavail, 2 * kLen);
  EXPECT_GE(st.az_faults, 1u);  // the write met the protection, whichever send it waited for
}

// A receive into a buffer still being sent, with only the peer's end of
// stream to report, writes nothing: it returns 0 at once and settles
// nothing (under block-on-write it said EAGAIN until the pull; under
// copy-on-write it copied the send aside first).
TEST_P(SdpAzTest, EndOfStreamIntoTheSentBufferReturnsZeroWithoutSettling) {
  constexpr size_t kLen = 1 << 20;
  pid_t child = Spawn([this] {
    ChildSide s = ChildConnect(Options(), /*progress_thread=*/true);
    CHILD_OK(s.conn->Shutdown(SHUT_WR));
    return ReceiveAfterGo(s, kLen, 64);
  });
  auto c = AcceptAz();
  ASSERT_NE(c, nullptr);
  PageBuf buf(kLen);
  FillStream(buf.data(), 0, kLen, 64);
  ASSERT_TRUE(c->Send(buf.data(), kLen, 0, Deadline()).ok());
  char other;
  auto eof = c->Recv(&other, 1, MSG_PEEK, Deadline());  // waits for the end of stream
  ASSERT_TRUE(eof.ok()) << eof.status();
  ASSERT_EQ(*eof, 0u);
  auto r = c->Recv(buf.data(), kLen, MSG_DONTWAIT, Deadline());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 0u);
  EXPECT_EQ(c->stats().az_faults, 0u);
  Go();
  // Not Finish: its receive returns at once here (the end of stream came
  // first), and the child's pull may need this side's progress (emulated
  // RDMA reads). Close waits for the pull, making progress.
  EXPECT_TRUE(c->Close().ok());
  EXPECT_EQ(Reap(child), 0);
}

// A receive into a buffer that is still being sent from (echo servers do
// this) settles the send first.
TEST_P(SdpAzTest, ReceiveIntoABufferStillBeingSent) {
  constexpr size_t kLen = 1 << 20;
  pid_t child = Spawn([&] {
    ChildSide s = ChildConnect(Options(), /*progress_thread=*/true);
    PageBuf out(kLen);
    FillStream(out.data(), 0, kLen, 36);
    auto w = s.conn->Send(out.data(), kLen, 0, Deadline());
    CHILD_OK(w.status());
    return ReceiveAfterGo(s, kLen, 35);
  });
  auto c = AcceptAz();
  ASSERT_NE(c, nullptr);
  PageBuf buf(kLen);
  FillStream(buf.data(), 0, kLen, 35);
  ASSERT_TRUE(c->Send(buf.data(), kLen, 0, Deadline()).ok());
  if (!copy()) Go();
  auto r = c->Recv(buf.data(), kLen, MSG_WAITALL, Deadline());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(*r, kLen);
  std::vector<uint8_t> scratch;
  EXPECT_LT(CheckStream(buf.data(), 0, kLen, 36, &scratch), 0);
  if (copy()) Go();
  Finish(c.get(), child);
}

// An echo server receives into the buffer it has just sent from. Its peer
// pulls that data before it answers, so the pull's completion arrives ahead
// of the answer and frees the buffer: the receive must wait for that, not
// settle the send at once (a fault that copied 1 MiB aside every round).
TEST_P(SdpAzTest, EchoIntoTheSentBufferWaitsForThePullInsteadOfFaulting) {
  constexpr size_t kLen = 1 << 20;
  constexpr int kRounds = 4;
  pid_t child = Spawn([&] {
    ChildSide s = ChildConnect(Options(), /*progress_thread=*/true);
    PageBuf out(kLen), in(kLen);
    std::vector<uint8_t> scratch;
    for (int i = 0; i < kRounds; ++i) {
      FillStream(out.data(), uint64_t{kLen} * i, kLen, 60);
      auto w = s.conn->Send(out.data(), kLen, 0, Deadline());
      CHILD_OK(w.status());
      auto r = s.conn->Recv(in.data(), kLen, MSG_WAITALL, Deadline());
      CHILD_OK(r.status());
      CHILD_CHECK(*r == kLen);
      CHILD_CHECK(CheckStream(in.data(), uint64_t{kLen} * i, kLen, 60, &scratch) < 0);
    }
    return ChildFinish(s);
  });
  auto c = AcceptAz();
  ASSERT_NE(c, nullptr);
  PageBuf buf(kLen);
  std::vector<uint8_t> scratch;
  for (int i = 0; i < kRounds; ++i) {
    auto r = c->Recv(buf.data(), kLen, MSG_WAITALL, Deadline());
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(*r, kLen);
    ASSERT_LT(CheckStream(buf.data(), uint64_t{kLen} * i, kLen, 60, &scratch), 0) << "round " << i;
    auto w = c->Send(buf.data(), kLen, 0, Deadline());
    ASSERT_TRUE(w.ok()) << w.status();
  }
  Finish(c.get(), child);
  auto st = c->stats();
  EXPECT_EQ(st.az_srcavail_sent, static_cast<uint64_t>(kRounds));
  EXPECT_EQ(st.az_faults, 0u) << "copies " << st.az_copies << ", blocks " << st.az_blocks;
}

// A non-blocking receive into a buffer still being sent, with nothing to
// receive, says EAGAIN and leaves the send alone (no copy, no wait).
TEST_P(SdpAzTest, NonBlockingReceiveIntoTheSentBufferWithNothingThereSaysEagain) {
  constexpr size_t kLen = 1 << 20;
  pid_t child = SpawnReceiver(kLen, 61);
  auto c = AcceptAz();
  ASSERT_NE(c, nullptr);
  PageBuf buf(kLen);
  FillStream(buf.data(), 0, kLen, 61);
  ASSERT_TRUE(c->Send(buf.data(), kLen, 0, Deadline()).ok());
  auto r = c->Recv(buf.data(), kLen, MSG_DONTWAIT, Deadline());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_EQ(c->stats().az_faults, 0u);
  Go();
  Finish(c.get(), child);
}

// A non-blocking receive into a buffer still being sent, with data there to
// receive: copy-on-write copies the sent bytes aside and receives; under
// block-on-write, settling means waiting for the peer's pull, so the call
// says EAGAIN instead (it blocked until the pull before), and the data
// stays in the stream for the next receive.
TEST_P(SdpAzTest, NonBlockingReceiveIntoABufferAwaitingItsPullNeverBlocks) {
  constexpr size_t kLen = 1 << 20;
  static constexpr char kHello[] = "sixteen bytes!!";
  pid_t child = Spawn([this] {
    ChildSide s = ChildConnect(Options(), /*progress_thread=*/true);
    CHILD_OK(s.conn->Send(kHello, sizeof(kHello), 0, Deadline()).status());
    return ReceiveAfterGo(s, kLen, 62);  // pulls only when told
  });
  auto c = AcceptAz();
  ASSERT_NE(c, nullptr);
  PageBuf buf(kLen);
  FillStream(buf.data(), 0, kLen, 62);
  ASSERT_TRUE(c->Send(buf.data(), kLen, 0, Deadline()).ok());
  // Wait (into another buffer, peeking) until the child's bytes are here.
  char peek[sizeof(kHello)];
  auto p = c->Recv(peek, sizeof(peek), MSG_PEEK | MSG_WAITALL, Deadline());
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(*p, sizeof(kHello));
  auto r = c->Recv(buf.data(), sizeof(kHello), MSG_DONTWAIT, Deadline());
  if (copy()) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, sizeof(kHello));
    EXPECT_EQ(std::memcmp(buf.data(), kHello, sizeof(kHello)), 0);
    EXPECT_EQ(c->stats().az_copies, 1u);
    Go();
  } else {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
    Go();  // the pull frees the buffer; the bytes are still in the stream
    auto again = c->Recv(buf.data(), sizeof(kHello), MSG_WAITALL, Deadline());
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(*again, sizeof(kHello));
    EXPECT_EQ(std::memcmp(buf.data(), kHello, sizeof(kHello)), 0);
  }
  Finish(c.get(), child);
}

// The application's own SIGSEGV handlers keep their faults: one with
// SA_SIGINFO installed before zsock's, a plain one installed after it (the
// next send puts zsock's back in front, chaining to it).
std::atomic<int> g_app_faults{0};
uint8_t* g_app_page = nullptr;
void AppInfoHandler(int, siginfo_t* si, void*) {
  g_app_faults++;
  mprotect(reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(si->si_addr) & ~uintptr_t{4095}),
           4096, PROT_READ | PROT_WRITE);
}
void AppPlainHandler(int) {
  g_app_faults += 100;
  mprotect(g_app_page, 4096, PROT_READ | PROT_WRITE);
}

TEST_P(SdpAzTest, ApplicationSigsegvHandlersStillGetTheirFaults) {
  constexpr size_t kLen = 1 << 20;
  pid_t child = SpawnReceiver(2 * kLen, 37);
  auto c = AcceptAz();
  ASSERT_NE(c, nullptr);
  struct sigaction old_sa, sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = AppInfoHandler;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGSEGV, &sa, &old_sa), 0);
  PageBuf own(2 * 4096);
  g_app_page = own.data() + 4096;
  g_app_faults = 0;

  PageBuf buf(kLen);
  FillStream(buf.data(), 0, kLen, 37);
  ASSERT_TRUE(c->Send(buf.data(), kLen, 0, Deadline()).ok());
  ASSERT_EQ(mprotect(own.data(), 4096, PROT_NONE), 0);
  own.data()[10] = 1;  // the application's fault: its SA_SIGINFO handler
  EXPECT_EQ(g_app_faults.load(), 1);
  if (!copy()) Go();
  FillStream(buf.data(), kLen, kLen, 37);  // zsock's fault

  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = AppPlainHandler;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGSEGV, &sa, nullptr), 0);  // replaces zsock's
  ASSERT_TRUE(c->Send(buf.data(), kLen, 0, Deadline()).ok());  // reinstalls it
  FillStream(buf.data(), 0, kLen, 99);  // zsock's fault again
  ASSERT_EQ(mprotect(g_app_page, 4096, PROT_NONE), 0);
  g_app_page[10] = 1;  // the plain handler
  EXPECT_EQ(g_app_faults.load(), 101);
  if (copy()) Go();
  Finish(c.get(), child);
  EXPECT_GE(c->stats().az_faults, 2u);
  sigaction(SIGSEGV, &old_sa, nullptr);
}

// Too many faults: the connection falls back to zcopy and says so.
TEST_P(SdpAzTest, FallsBackToZcopyAfterTooManyFaults) {
  constexpr size_t kMsg = 256 << 10;
  constexpr int kRounds = 20;
  ConnectionOptions o = Options();
  o.az_fault_limit = 3;
  Relisten(o);
  pid_t child = SpawnReceiver(kMsg * kRounds, 38);
  auto c = AcceptAz();
  ASSERT_NE(c, nullptr);
  Go();  // reads along (zcopy sends wait for it)
  PageBuf buf(kMsg);
  for (int i = 0; i < kRounds; ++i) {
    FillStream(buf.data(), uint64_t{kMsg} * i, kMsg, 38);
    auto r = c->Send(buf.data(), kMsg, 0, Deadline());
    ASSERT_TRUE(r.ok()) << r.status();
  }
  Finish(c.get(), child);
  auto st = c->stats();
  EXPECT_EQ(st.az_fallbacks, 1u);
  EXPECT_EQ(st.az_faults, 4u);  // the fourth crossed the limit
  EXPECT_LT(st.az_srcavail_sent, static_cast<uint64_t>(kRounds));
  EXPECT_GT(st.srcavail_sent, 0u);  // synchronous from then on
  EXPECT_EQ(c->options().mode, Mode::kZcopy);
}

// fork() while a buffer is protected: the child can write its copy at once
// (no stuck protection); the parent's transfer is unaffected.
TEST_P(SdpAzTest, ForkWhileProtectedLeavesNoStuckPages) {
  constexpr size_t kLen = 1 << 20;
  pid_t child = SpawnReceiver(kLen, 39);
  auto c = AcceptAz();
  ASSERT_NE(c, nullptr);
  PageBuf buf(kLen);
  FillStream(buf.data(), 0, kLen, 39);
  ASSERT_TRUE(c->Send(buf.data(), kLen, 0, Deadline()).ok());
  pid_t g = fork();
  if (g == 0) {
    std::memset(buf.data(), 0x11, kLen);  // would hang on a stuck protection
    _exit(buf.data()[kLen - 1] == 0x11 ? 0 : 1);
  }
  ASSERT_GT(g, 0);
  EXPECT_EQ(Reap(g, absl::Seconds(30)), 0);
  Go();
  Finish(c.get(), child);
}

// Receive side (az_early_recv): a large page-aligned receive returns before
// its data lands; the pages are inaccessible until it does, and reading
// them waits and then sees the arrived bytes. The receiver has no progress
// thread, so nothing lands before its own first access (a fault).
TEST_P(SdpAzTest, ReceiveReturnsBeforeTheDataLandsAndReadsSeeIt) {
  constexpr size_t kLen = 4 << 20;
  ConnectionOptions o = Options();
  o.az_early_recv = true;
  Relisten(o);
  pid_t child = Spawn([&] {
    ChildSide s = ChildConnect(Options(), /*progress_thread=*/true);
    PageBuf out(kLen);
    FillStream(out.data(), 0, kLen, 40);
    auto w = s.conn->Send(out.data(), kLen, 0, Deadline());
    CHILD_OK(w.status());
    return ChildFinish(s);
  });
  auto c = AcceptAz();
  ASSERT_NE(c, nullptr);
  PageBuf buf(kLen);
  std::vector<uint8_t> scratch;
  size_t got = 0;
  while (got < kLen) {
    auto r = c->Recv(buf.data() + got, kLen - got, 0, Deadline());
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_GT(*r, 0u);
    // Read what the call returned at once: faults until it landed.
    EXPECT_LT(CheckStream(buf.data() + got, got, *r, 40, &scratch), 0) << "at " << got;
    got += *r;
  }
  auto st = c->stats();
  EXPECT_GE(st.az_recv_early, 1u);
  EXPECT_GE(st.az_faults, 1u);
  EXPECT_EQ(st.bytes_recv_srcavail, kLen);
  // The buffer is ordinary memory again: writable, and usable by the kernel.
  std::memset(buf.data(), 1, kLen);
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  EXPECT_EQ(write(p[1], buf.data(), 4096), 4096);
  close(p[0]);
  close(p[1]);
  Finish(c.get(), child);
}

// An echo with az_early_recv: the buffer a receive returned early is sent
// straight back; the send waits for the landing and echoes the right bytes.
TEST_P(SdpAzTest, EchoOfAnEarlyReceive) {
  constexpr size_t kLen = 2 << 20;
  ConnectionOptions o = Options();
  o.az_early_recv = true;
  Relisten(o);
  pid_t child = Spawn([&] {
    ChildSide s = ChildConnect(Options(), /*progress_thread=*/true);
    PageBuf out(kLen);
    FillStream(out.data(), 0, kLen, 41);
    CHILD_OK(s.conn->Send(out.data(), kLen, 0, Deadline()).status());
    std::vector<uint8_t> in(kLen), scratch;
    auto r = s.conn->Recv(in.data(), kLen, MSG_WAITALL, Deadline());
    CHILD_OK(r.status());
    CHILD_CHECK(*r == kLen);
    CHILD_CHECK(CheckStream(in.data(), 0, kLen, 41, &scratch) < 0);
    return ChildFinish(s);
  });
  auto c = AcceptAz();
  ASSERT_NE(c, nullptr);
  PageBuf buf(kLen);
  size_t got = 0;
  while (got < kLen) {
    auto r = c->Recv(buf.data() + got, kLen - got, 0, Deadline());
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_GT(*r, 0u);
    // Echo at once, before touching the bytes.
    auto w = c->Send(buf.data() + got, *r, 0, Deadline());
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_EQ(*w, *r);
    got += *r;
  }
  EXPECT_GE(c->stats().az_recv_early, 1u);
  Finish(c.get(), child);
}

INSTANTIATE_TEST_SUITE_P(Providers, SdpAzTest, ::testing::ValuesIn(AzParams()), ParamName);

INSTANTIATE_TEST_SUITE_P(Providers, SdpCancelTest, ::testing::ValuesIn(AllParams()), ParamName);

INSTANTIATE_TEST_SUITE_P(Providers, SdpTest, ::testing::ValuesIn(AllParams(true)), ParamName);

}  // namespace
}  // namespace zsock::sdp
