// ofi provider specifics the conformance suite does not cover, on
// connected pairs: how blocked waits sleep and wake (CQ wait objects, the
// connections' sockets, the backstop timer), the linger after a graceful
// close, unregistered local buffers, and rxm's flow window.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/provider.h"
#include "core/rcache.h"
#include "gtest/gtest.h"
#include "tests/connect_pair.h"
#include "tests/flow_check.h"

namespace zsock {
namespace {

// Two endpoints of one fabric, connected in one process.
//
// BlockedWaitDoesNotSpin: a thread blocked in Wait on a connected but idle
// endpoint sleeps: it uses a small fraction of a core (shm, without a CQ
// wait object, wakes at most every millisecond), whichever way the provider
// signals.
class OfiPair : public ::testing::TestWithParam<std::string> {
 protected:
  // Sends `msgs` from a_, then both sides progress (one thread; rxm and shm
  // need the receiver's progress to finish a send) until every send
  // completed, b posting nothing; then a_ closes.
  void SendAllThenCloseA(const std::vector<std::string>& msgs) {
    for (size_t i = 0; i < msgs.size(); ++i) {
      absl::Status st = a_->Send(msgs[i].data(), msgs[i].size(), nullptr, i);
      ASSERT_TRUE(st.ok()) << st;
    }
    size_t sent = 0;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (sent < msgs.size() && absl::Now() < deadline) {
      Completion c;
      if (cq_a_->Poll(std::span<Completion>(&c, 1)) == 1) {
        ASSERT_TRUE(c.status.ok()) << c.status;
        ++sent;
      }
      ASSERT_EQ(cq_b_->Wait(std::span<Completion>(&c, 1), absl::Milliseconds(1)).value_or(0), 0u);
    }
    ASSERT_EQ(sent, msgs.size());
    a_->Close();
  }

  // b receives `msgs` in order, each into a receive posted only now; then
  // nothing more: the next receive fails (or cannot be posted) promptly.
  void ReceiveAllThenTheClose(const std::vector<std::string>& msgs) {
    for (size_t i = 0; i < msgs.size(); ++i) {
      char buf[64] = {};
      ASSERT_TRUE(b_->PostRecv(buf, sizeof(buf), nullptr, 100 + i).ok()) << i;
      Completion c;
      auto n = cq_b_->Wait(std::span<Completion>(&c, 1), absl::Seconds(10));
      ASSERT_TRUE(n.ok() && *n == 1) << i;
      ASSERT_TRUE(c.status.ok()) << "message " << i << ": " << c.status;
      EXPECT_EQ(std::string(buf, c.length), msgs[i]);
    }
    char buf[64];
    absl::Status st = b_->PostRecv(buf, sizeof(buf), nullptr, 200);
    if (st.ok()) {
      Completion c;
      auto n = cq_b_->Wait(std::span<Completion>(&c, 1), absl::Seconds(5));
      ASSERT_TRUE(n.ok() && *n == 1) << "the close was never reported";
      st = c.status;
    }
    EXPECT_FALSE(st.ok());
  }

  // Opens the fabric and two CQs, and connects endpoint a_ (on cq_a_) to
  // b_ (accepted on cq_b_).
  void ConnectPair() {
    auto fabric = Fabric::Open(GetParam());
    ASSERT_TRUE(fabric.ok()) << fabric.status();
    fabric_ = std::move(*fabric);
    auto cq_a = fabric_->CreateCq();
    auto cq_b = fabric_->CreateCq();
    ASSERT_TRUE(cq_a.ok() && cq_b.ok());
    cq_a_ = std::move(*cq_a);
    cq_b_ = std::move(*cq_b);
    auto listener = fabric_->Listen("");
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_ = std::move(*listener);
    ConnectThrough(fabric_.get(), listener_.get(), cq_a_.get(), cq_b_.get(), &a_, &b_);
  }

  // Destroyed in reverse: a_ first, the fabric last.
  std::unique_ptr<Fabric> fabric_;
  std::unique_ptr<CompletionQueue> cq_a_, cq_b_;
  std::unique_ptr<Listener> listener_;
  std::unique_ptr<Endpoint> b_, a_;
};

double ThreadCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

TEST_P(OfiPair, BlockedWaitDoesNotSpin) {
  ASSERT_NO_FATAL_FAILURE(ConnectPair());
  char buf[16];
  ASSERT_TRUE(a_->PostRecv(buf, sizeof(buf), nullptr, 1).ok());
  const double cpu0 = ThreadCpuSeconds();
  const absl::Time t0 = absl::Now();
  Completion c;
  auto n = cq_a_->Wait(std::span<Completion>(&c, 1), absl::Milliseconds(1000));
  const double wall = absl::ToDoubleSeconds(absl::Now() - t0);
  const double cpu = ThreadCpuSeconds() - cpu0;
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 0u);
  EXPECT_GE(wall, 0.9);
  std::printf("%s: %.4f s CPU in %.3f s blocked\n", GetParam().c_str(), cpu, wall);
  EXPECT_LT(cpu, 0.1 * wall) << GetParam() << ": a blocked wait used " << cpu << " s of CPU in "
                              << wall << " s";
}

// After the peer's graceful close, with its messages still undelivered
// (nothing posted for them), the endpoint lingers for them; a thread blocked
// in Wait meanwhile sleeps too. Then the messages are delivered, and the
// close reported.
TEST_P(OfiPair, BlockedWaitDuringLingerDoesNotSpin) {
  ASSERT_NO_FATAL_FAILURE(ConnectPair());
  constexpr int kMessages = 3;
  const std::string msg = "lingering";
  ASSERT_NO_FATAL_FAILURE(SendAllThenCloseA(std::vector<std::string>(kMessages, msg)));
  const double cpu0 = ThreadCpuSeconds();
  const absl::Time t0 = absl::Now();
  while (absl::Now() - t0 < absl::Seconds(1)) {
    Completion c;
    ASSERT_EQ(cq_b_->Wait(std::span<Completion>(&c, 1), absl::Milliseconds(100)).value_or(0), 0u);
  }
  const double wall = absl::ToDoubleSeconds(absl::Now() - t0);
  const double cpu = ThreadCpuSeconds() - cpu0;
  std::printf("%s: %.4f s CPU in %.3f s of linger\n", GetParam().c_str(), cpu, wall);
  EXPECT_LT(cpu, 0.2 * wall) << GetParam() << ": a wait during the linger used " << cpu
                             << " s of CPU in " << wall << " s";
  ASSERT_NO_FATAL_FAILURE(ReceiveAllThenTheClose(std::vector<std::string>(kMessages, msg)));
}

// A thread blocked in Wait gets a message the peer sends while it sleeps,
// whatever wakes it (the CQ's fd, an MSG event queue's, or the timer of a
// CQ without a wait object), long before its timeout.
TEST_P(OfiPair, BlockedWaitWakesForArrivingData) {
  ASSERT_NO_FATAL_FAILURE(ConnectPair());
  char buf[16] = {};
  ASSERT_TRUE(a_->PostRecv(buf, sizeof(buf), nullptr, 7).ok());
  absl::StatusOr<size_t> got;
  Completion c;
  absl::Duration waited;
  std::thread sleeper([&] {
    const absl::Time t0 = absl::Now();
    got = cq_a_->Wait(std::span<Completion>(&c, 1), absl::Seconds(20));
    waited = absl::Now() - t0;
  });
  absl::SleepFor(absl::Milliseconds(200));  // past the CQ's spin: the sleeper sleeps
  const char msg[] = "wake up";
  ASSERT_TRUE(b_->Send(msg, sizeof(msg), nullptr, 1).ok());
  // The sender's CQ reports its send (and keeps its side progressing).
  Completion sent;
  auto s = cq_b_->Wait(std::span<Completion>(&sent, 1), absl::Seconds(20));
  sleeper.join();
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(*got, 1u) << GetParam() << ": the sleeper timed out after " << waited;
  EXPECT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(c.context, 7u);
  EXPECT_EQ(c.length, sizeof(msg));
  EXPECT_STREQ(buf, msg);
  EXPECT_LT(waited, absl::Seconds(10)) << GetParam();
}

// What a peer sent before it closed gracefully is delivered, even to
// receives posted after the close was seen; then the connection reports
// the close.
TEST_P(OfiPair, MessagesSentBeforeAGracefulCloseAreDelivered) {
  ASSERT_NO_FATAL_FAILURE(ConnectPair());
  constexpr int kMessages = 5;
  std::vector<std::string> out;
  for (int i = 0; i < kMessages; ++i) out.push_back("message " + std::to_string(i));
  ASSERT_NO_FATAL_FAILURE(SendAllThenCloseA(out));
  // Let b notice the close before it posts anything.
  absl::Time until = absl::Now() + absl::Milliseconds(300);
  while (absl::Now() < until) {
    Completion c;
    ASSERT_EQ(cq_b_->Wait(std::span<Completion>(&c, 1), absl::Milliseconds(20)).value_or(0), 0u);
  }
  ASSERT_NO_FATAL_FAILURE(ReceiveAllThenTheClose(out));
}

// Read, write and send from buffers passed without their region: with
// mr_local=on (the FI_MR_LOCAL path) descriptors come from the registration
// cache and are held until the operation completes.
TEST_P(OfiPair, OperationsOnUnregisteredLocalBuffers) {
  ASSERT_NO_FATAL_FAILURE(ConnectPair());
  std::vector<uint8_t> target(8192, 0);
  auto mr = fabric_->RegisterMemory(target.data(), target.size(), kAccessAll);
  ASSERT_TRUE(mr.ok()) << mr.status();
  RemoteKey key = (*mr)->remote_key();
  // One thread drives both sides until `a` reports one completion.
  auto finish = [&]() -> absl::Status {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      Completion c;
      if (cq_a_->Poll(std::span<Completion>(&c, 1)) == 1) return c.status;
      cq_b_->Poll(std::span<Completion>(&c, 1));
    }
    return absl::DeadlineExceededError("no completion");
  };
  std::vector<uint8_t> out(5000), back(5000, 0);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 7 + 1);
  ASSERT_TRUE(a_->Write(out.data(), out.size(), nullptr, key.addr + 100, key, 1).ok());
  ASSERT_TRUE(finish().ok());
  ASSERT_TRUE(a_->Read(back.data(), back.size(), nullptr, key.addr + 100, key, 2).ok());
  ASSERT_TRUE(finish().ok());
  EXPECT_EQ(back, out);
  EXPECT_EQ(std::vector<uint8_t>(target.begin() + 100, target.begin() + 5100), out);
  char in[64] = {};
  ASSERT_TRUE(b_->PostRecv(in, sizeof(in), nullptr, 3).ok());
  ASSERT_TRUE(a_->Send("unregistered", 12, nullptr, 4).ok());
  ASSERT_TRUE(finish().ok());
  Completion c;
  auto n = cq_b_->Wait(std::span<Completion>(&c, 1), absl::Seconds(10));
  ASSERT_TRUE(n.ok() && *n == 1);
  ASSERT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(std::string(in, c.length), "unregistered");
  if (absl::StrContains(GetParam(), "mr_local=on")) {
    EXPECT_TRUE(fabric_->caps().registration_required);
    EXPECT_GE(fabric_->rcache().stats().misses, 1u) << "descriptors did not come from the cache";
  }
}

int OpenFds() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// The fds in an epoll set (its /proc fdinfo "tfd:" lines).
std::vector<int> EpollMembers(int epfd) {
  std::ifstream in(absl::StrCat("/proc/self/fdinfo/", epfd));
  std::vector<int> fds;
  std::string word;
  while (in >> word) {
    int fd;
    if (word == "tfd:" && in >> fd) fds.push_back(fd);
  }
  return fds;
}

// "IP:PORT" of an IPv4 socket address (the tests run over lo).
std::string HostPort(const sockaddr_storage& ss) {
  if (ss.ss_family != AF_INET) return "";
  auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
  char host[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
  return absl::StrCat(host, ":", ntohs(a->sin_port));
}

// Whether `fd` is a TCP socket from `local` to `peer` (both "IP:PORT").
bool IsConnection(int fd, const std::string& local, const std::string& peer) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return false;
  const std::string mine = HostPort(ss);
  len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return false;
  return mine == local && HostPort(ss) == peer;
}

// ofi:tcp's default wait: each CQ's wait set holds the TCP sockets of its
// endpoint's connections (data and control), found although both ends live
// in this process, with their addresses swapped; cq_wait=fd holds none.
// The duplicates are closed with the endpoints: no fd outlives them.
TEST(OfiSockets, TheWaitSetHoldsTheConnectionsSockets) {
  for (const char* config : {"ofi:tcp?iface=lo", "ofi:tcp?iface=lo&cq_wait=fd"}) {
    const bool sockets = !absl::StrContains(config, "cq_wait=fd");
    auto fabric = Fabric::Open(config);
    ASSERT_TRUE(fabric.ok()) << fabric.status();
    int before = -1;
    for (int round = 0; round < 2; ++round) {
      // Round 0 warms libfabric up (its own lasting fds); round 1 counts.
      if (round == 1) before = OpenFds();
      auto cq_a = (*fabric)->CreateCq();
      auto cq_b = (*fabric)->CreateCq();
      ASSERT_TRUE(cq_a.ok() && cq_b.ok());
      auto listener = (*fabric)->Listen("");
      ASSERT_TRUE(listener.ok()) << listener.status();
      std::unique_ptr<Endpoint> a, b;
      ASSERT_NO_FATAL_FAILURE(
          ConnectThrough(fabric->get(), listener->get(), cq_a->get(), cq_b->get(), &a, &b));
      for (auto [ep, cq] : {std::pair{a.get(), cq_a->get()}, std::pair{b.get(), cq_b->get()}}) {
        const EndpointInfo& info = ep->info();
        int data = 0, connections = 0;
        for (int fd : EpollMembers(cq->wait_fd())) {
          sockaddr_storage ss{};
          socklen_t len = sizeof(ss);
          if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) ++connections;
          if (IsConnection(fd, info.local_address, info.peer_address)) ++data;
        }
        EXPECT_EQ(data, sockets ? 1 : 0) << config << ": " << info.local_address << " -> "
                                         << info.peer_address;
        EXPECT_EQ(connections, sockets ? 2 : 0) << config << ": the data and control connections";
      }
      // Still a working pair.
      char buf[8] = {};
      ASSERT_TRUE(b->PostRecv(buf, sizeof(buf), nullptr, 1).ok());
      ASSERT_TRUE(a->Send("ping", 5, nullptr, 2).ok());
      Completion c;
      auto n = (*cq_b)->Wait(std::span<Completion>(&c, 1), absl::Seconds(10));
      ASSERT_TRUE(n.ok() && *n == 1);
      EXPECT_STREQ(buf, "ping");
      a.reset();
      b.reset();
    }
    EXPECT_EQ(OpenFds(), before) << config << ": fds left behind by a connection";
  }
}

// A fabric, two CQs (a: connecting side, b: accepting side) and a listener.
struct Net {
  std::unique_ptr<Fabric> fabric;
  std::unique_ptr<CompletionQueue> cq_a, cq_b;
  std::unique_ptr<Listener> listener;
};

void OpenNet(const std::string& config, Net* net) {
  auto fabric = Fabric::Open(config);
  ASSERT_TRUE(fabric.ok()) << fabric.status();
  net->fabric = std::move(*fabric);
  auto cq_a = net->fabric->CreateCq();
  auto cq_b = net->fabric->CreateCq();
  ASSERT_TRUE(cq_a.ok() && cq_b.ok());
  net->cq_a = std::move(*cq_a);
  net->cq_b = std::move(*cq_b);
  auto listener = net->fabric->Listen("");
  ASSERT_TRUE(listener.ok()) << listener.status();
  net->listener = std::move(*listener);
}

// cq_wait=fd's backstop timer: a thread asleep in Wait on an idle rxm
// connection wakes every backstop_ms to poll (a wake-up libfabric's fd
// missed costs at most that), and without the timer it sleeps on. Counted
// as the thread's voluntary context switches: each is one sleep.
TEST(OfiBackstop, SleeperOnFdWaitsPollsEveryBackstopMs) {
  auto sleeps_in_half_a_second = [](const std::string& config) -> long {
    Net net;
    OpenNet(config, &net);
    if (::testing::Test::HasFatalFailure()) return -1;
    std::unique_ptr<Endpoint> a, b;
    ConnectThrough(net.fabric.get(), net.listener.get(), net.cq_a.get(), net.cq_b.get(), &a, &b);
    if (::testing::Test::HasFatalFailure()) return -1;
    char buf[16];
    EXPECT_TRUE(a->PostRecv(buf, sizeof(buf), nullptr, 1).ok());
    rusage before{}, after{};
    getrusage(RUSAGE_THREAD, &before);
    Completion c;
    auto n = net.cq_a->Wait(std::span<Completion>(&c, 1), absl::Milliseconds(500));
    getrusage(RUSAGE_THREAD, &after);
    EXPECT_TRUE(n.ok() && *n == 0) << config << ": " << n.status();
    const long sleeps = after.ru_nvcsw - before.ru_nvcsw;
    std::printf("%s: %ld sleeps in 0.5 s of Wait\n", config.c_str(), sleeps);
    return sleeps;
  };
  const long timed = sleeps_in_half_a_second("ofi:tcp;ofi_rxm?iface=lo&backstop_ms=20");
  const long bare = sleeps_in_half_a_second("ofi:tcp;ofi_rxm?iface=lo&backstop_ms=0");
  EXPECT_GE(timed, 12) << "a 20 ms backstop should wake the sleeper about 25 times in 0.5 s";
  EXPECT_LE(timed, 60) << "the backstop should not make the sleeper spin";
  EXPECT_LT(bare, timed / 2) << "without the backstop the sleeper should stay asleep";
}

// cq_wait=sockets with many connections on one CQ, where a poll reads only
// the endpoints that have something to find, and without the backstop
// timer: a wake-up missed, or an endpoint skipped that had a completion,
// fails a Wait. A server thread answers on every connection; the client
// sends to them in a changing order, waiting (asleep, past the spin) for
// each answer; the server's replies also complete while it sleeps.
TEST(OfiSockets, ManyConnectionsOnOneCqWakeForEveryMessage) {
  Net net;
  ASSERT_NO_FATAL_FAILURE(OpenNet("ofi:tcp?iface=lo&backstop_ms=0", &net));
  constexpr int kConns = 12, kRounds = 20;
  std::vector<std::unique_ptr<Endpoint>> a(kConns), b(kConns);
  for (int i = 0; i < kConns; ++i) {
    ASSERT_NO_FATAL_FAILURE(
        ConnectThrough(net.fabric.get(), net.listener.get(), net.cq_a.get(), net.cq_b.get(), &a[i], &b[i]));
  }
  std::vector<std::array<char, 32>> in_a(kConns), in_b(kConns);
  for (int i = 0; i < kConns; ++i) {
    ASSERT_TRUE(a[i]->PostRecv(in_a[i].data(), in_a[i].size(), nullptr, i).ok());
    ASSERT_TRUE(b[i]->PostRecv(in_b[i].data(), in_b[i].size(), nullptr, i).ok());
  }
  constexpr uint64_t kSendCtx = 1000;
  std::atomic<int> served{0};
  std::string server_error;
  std::thread server([&] {
    int replies_done = 0;
    while (served.load() < kConns * kRounds || replies_done < kConns * kRounds) {
      Completion c;
      auto n = net.cq_b->Wait(std::span<Completion>(&c, 1), absl::Seconds(10));
      if (!n.ok() || *n == 0) {
        server_error = absl::StrCat("the server's wait timed out after ", served.load(), " requests");
        return;
      }
      if (!c.status.ok()) {
        server_error = c.status.ToString();
        return;
      }
      if (c.context >= kSendCtx) {
        ++replies_done;
        continue;
      }
      const int i = static_cast<int>(c.context);
      std::string reply = absl::StrCat("re:", std::string(in_b[i].data(), c.length));
      if (!b[i]->PostRecv(in_b[i].data(), in_b[i].size(), nullptr, i).ok() ||
          !b[i]->Send(reply.data(), reply.size(), nullptr, kSendCtx + i).ok()) {
        server_error = "the server could not post";
        return;
      }
      served.fetch_add(1);
    }
  });
  for (int round = 0; round < kRounds && server_error.empty(); ++round) {
    for (int k = 0; k < kConns; ++k) {
      const int i = (k * 5 + round) % kConns;  // 5 and 12 coprime: each once per round
      const std::string msg = absl::StrCat("r", round, "c", i);
      ASSERT_TRUE(a[i]->Send(msg.data(), msg.size(), nullptr, kSendCtx + i).ok());
      bool got_reply = false;
      while (!got_reply) {
        Completion c;
        auto n = net.cq_a->Wait(std::span<Completion>(&c, 1), absl::Seconds(10));
        ASSERT_TRUE(n.ok() && *n == 1) << "round " << round << ", connection " << i
                                       << ": no completion in 10 s (a missed wake-up)";
        ASSERT_TRUE(c.status.ok()) << c.status;
        if (c.context >= kSendCtx) continue;  // our send's completion
        ASSERT_EQ(c.context, static_cast<uint64_t>(i));
        EXPECT_EQ(std::string(in_a[i].data(), c.length), "re:" + msg);
        ASSERT_TRUE(a[i]->PostRecv(in_a[i].data(), in_a[i].size(), nullptr, i).ok());
        got_reply = true;
      }
      // Now and then past the spin, so that both sides sleep.
      if (k % 4 == 0) absl::SleepFor(absl::Milliseconds(1));
    }
  }
  server.join();
  EXPECT_EQ(server_error, "");
  EXPECT_EQ(served.load(), kConns * kRounds);
}

// cq_wait=sockets without the backstop: a target asleep in Wait serves a
// pipeline of RMA writes and reads, which complete nothing on its side
// (libfabric tcp may serve one request per progress and leave the next
// ones in the socket, with no new edge to wake the target).
TEST(OfiSockets, PipelinedRmaToASleepingTargetCompletes) {
  Net net;
  ASSERT_NO_FATAL_FAILURE(OpenNet("ofi:tcp?iface=lo&backstop_ms=0", &net));
  std::unique_ptr<Endpoint> a, b;
  ASSERT_NO_FATAL_FAILURE(ConnectThrough(net.fabric.get(), net.listener.get(), net.cq_a.get(), net.cq_b.get(), &a, &b));
  constexpr size_t kChunk = 64 * 1024;
  constexpr int kOps = 32;
  std::vector<uint8_t> target(kChunk * kOps, 0), source(kChunk * kOps), back(kChunk * kOps, 0);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 13 + 5);
  auto tmr = net.fabric->RegisterMemory(target.data(), target.size(), kAccessAll);
  auto smr = net.fabric->RegisterMemory(source.data(), source.size(), kAccessAll);
  auto bmr = net.fabric->RegisterMemory(back.data(), back.size(), kAccessAll);
  ASSERT_TRUE(tmr.ok() && smr.ok() && bmr.ok());
  RemoteKey key = (*tmr)->remote_key();
  // The target sleeps in one long Wait (its progress serves the requests)
  // until the initiator's closing message arrives.
  char bye[8] = {};
  ASSERT_TRUE(b->PostRecv(bye, sizeof(bye), nullptr, 99).ok());
  std::thread target_side([&] {
    for (;;) {
      Completion c;
      auto n = net.cq_b->Wait(std::span<Completion>(&c, 1), absl::Seconds(60));
      if (!n.ok() || *n == 0 || c.context == 99) return;
    }
  });
  // Ends the target whether the test passes or fails.
  auto bye_and_join = absl::MakeCleanup([&] {
    (void)a->Send("bye", 4, nullptr, 100);
    target_side.join();
  });
  auto finish = [&](const char* what) {
    for (int i = 0; i < kOps; ++i) {
      Completion c;
      auto n = net.cq_a->Wait(std::span<Completion>(&c, 1), absl::Seconds(10));
      ASSERT_TRUE(n.ok() && *n == 1) << what << ": " << i << " of " << kOps
                                     << " completed in 10 s (the target was not woken)";
      ASSERT_TRUE(c.status.ok()) << c.status;
    }
  };
  absl::SleepFor(absl::Milliseconds(50));  // the target is asleep
  for (int i = 0; i < kOps; ++i) {
    ASSERT_TRUE(a->Write(source.data() + i * kChunk, kChunk, smr->get(), key.addr + i * kChunk, key, i).ok());
  }
  ASSERT_NO_FATAL_FAILURE(finish("writes"));
  EXPECT_EQ(target, source);
  absl::SleepFor(absl::Milliseconds(50));
  for (int i = 0; i < kOps; ++i) {
    ASSERT_TRUE(a->Read(back.data() + i * kChunk, kChunk, bmr->get(), key.addr + i * kChunk, key, i).ok());
  }
  ASSERT_NO_FATAL_FAILURE(finish("reads"));
  EXPECT_EQ(back, source);
}

// rxm keeps every message that arrives before its receive is posted in a
// 16 KiB bounce buffer, and never pushes back: without a window, a sender
// that outruns its peer grows the peer's memory without bound. With
// flow_window=8 the sender hands at most 8 messages to libfabric while the
// peer posts nothing (only those complete); the rest wait in its backlog
// and follow, in order, as the peer's receives consume and report them.
// flow_window=0 shows what the test tells apart: rxm takes them all.
TEST(OfiFlow, RxmSendsBeyondTheWindowWaitForThePeersReceives) {
  constexpr int kMessages = 200;
  for (int window : {8, 0}) {
    SCOPED_TRACE(absl::StrCat("flow_window=", window));
    Net net;
    ASSERT_NO_FATAL_FAILURE(
        OpenNet(absl::StrCat("ofi:tcp;ofi_rxm?iface=lo&flow_window=", window), &net));
    std::unique_ptr<Endpoint> a, b;
    ASSERT_NO_FATAL_FAILURE(ConnectThrough(net.fabric.get(), net.listener.get(), net.cq_a.get(),
                                           net.cq_b.get(), &a, &b));
    ASSERT_TRUE(a && b);
    std::vector<std::string> msgs;
    for (int i = 0; i < kMessages; ++i) msgs.push_back(absl::StrCat("message ", i));
    for (int i = 0; i < kMessages; ++i) {
      ASSERT_TRUE(a->Send(msgs[i].data(), msgs[i].size(), nullptr, i).ok()) << i;
    }
    // Both sides progress for half a second; b posts nothing.
    SendsInOrder sends(net.cq_a.get(), 0);
    ASSERT_NO_FATAL_FAILURE(
        ProgressWhileUnreceived(&sends, net.cq_b.get(), absl::Milliseconds(500)));
    const int sent = static_cast<int>(sends.next());
    if (window > 0) {
      EXPECT_LE(sent, window) << "sends went beyond the window while the peer received nothing";
      EXPECT_GE(sent, 1);
    } else {
      EXPECT_GT(sent, 8) << "without a window rxm should take more than 8 messages";
    }
    // Now b receives them all, in order, while a keeps progressing.
    ASSERT_NO_FATAL_FAILURE(
        ReceiveAllInOrder(b.get(), net.cq_b.get(), &sends, msgs, kMessages, absl::Seconds(10)));
    a->Close();
    b->Close();
  }
}

INSTANTIATE_TEST_SUITE_P(Configurations, OfiPair,
                         ::testing::Values("ofi:tcp;ofi_rxm?iface=lo", "ofi:tcp?iface=lo", "ofi:shm",
                                           "ofi:tcp;ofi_rxm?iface=lo&mr_local=on",
                                           "ofi:tcp?iface=lo&mr_local=on", "ofi:tcp?iface=lo&cq_wait=none",
                                           "ofi:tcp;ofi_rxm?iface=lo&cq_wait=none",
                                           "ofi:tcp?iface=lo&cq_wait=fd", "ofi:tcp?iface=lo&backstop_ms=0"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name;
                           for (char ch : info.param) name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return name;
                         });

}  // namespace
}  // namespace zsock
