// Tests of the ucx provider beyond the shared conformance suite: config
// string validation, the transports endpoints report, the fork guard, the
// tcp fallback switch, IPv6 listeners and a malformed handshake.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/provider.h"
#include "gtest/gtest.h"
#include "tests/connect_pair.h"
#include "tests/flow_check.h"

namespace zsock {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(20);

std::string Notes(const std::vector<std::string>& notes) { return absl::StrJoin(notes, " | "); }

void ExpectInvalid(const std::string& config, const std::string& needle) {
  auto fabric = Fabric::Open(config);
  ASSERT_FALSE(fabric.ok()) << config << " opened";
  EXPECT_EQ(fabric.status().code(), absl::StatusCode::kInvalidArgument) << fabric.status();
  EXPECT_TRUE(absl::StrContains(fabric.status().message(), needle))
      << config << ": " << fabric.status();
}

TEST(UcxOptions, RejectsUnknownTransportsAndOptions) {
  ExpectInvalid("ucx:posix,bogus", "unknown UCX transport 'bogus'");
  ExpectInvalid("ucx:tcp?UCX_NO_SUCH_THING=1", "unknown UCX option 'UCX_NO_SUCH_THING'");
  ExpectInvalid("ucx:tcp?UCX_RNDV_THRESH=lots", "UCX_RNDV_THRESH");
  ExpectInvalid("ucx:tcp?UCX_TLS=posix", "after 'ucx:'");
  ExpectInvalid("ucx:tcp?UCX_RCACHE_ENABLE=y", "fixed");
  // Read once when UCX loads: not settable per fabric.
  ExpectInvalid("ucx:tcp?UCX_LOG_LEVEL=info", "cannot be set for one fabric");
  ExpectInvalid("ucx:posix?UCX_POSIX_FIFO_SIZE=128", "UCX_MM_FIFO_SIZE");
  ExpectInvalid("ucx:tcp?fallback=maybe", "fallback=maybe");
  ExpectInvalid("ucx:tcp?speed=fast", "unknown ucx option 'speed'");
  ExpectInvalid("ucx:tcp?threads=single", "threads=single is not multi or serialized");
}

TEST(UcxOptions, PassesUcxVariablesToTheContext) {
  auto fabric = Fabric::Open("ucx:tcp?UCX_RNDV_THRESH=16k&UCX_TCP_NODELAY=n");
  ASSERT_TRUE(fabric.ok()) << fabric.status();
  EXPECT_TRUE(absl::StrContains(Notes((*fabric)->caps().notes), "UCX_RNDV_THRESH=16k"))
      << Notes((*fabric)->caps().notes);
  auto shm = Fabric::Open("ucx:posix,cma?UCX_MM_FIFO_SIZE=128");
  ASSERT_TRUE(shm.ok()) << shm.status();
}

TEST(UcxCaps, SaysWhatIsNative) {
  auto tcp = Fabric::Open("ucx:tcp");
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  EXPECT_EQ((*tcp)->caps().rdma_read, Support::kEmulated);
  EXPECT_EQ((*tcp)->caps().atomics_allocated, Support::kEmulated);
  EXPECT_FALSE((*tcp)->caps().registration_required);
  auto shm = Fabric::Open("ucx:posix,cma");
  ASSERT_TRUE(shm.ok()) << shm.status();
  EXPECT_EQ((*shm)->caps().atomics_allocated, Support::kNative);
  EXPECT_TRUE((*shm)->caps().peer_on_host);
  auto off = Fabric::Open("ucx:posix,cma?native_rma=off");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ((*off)->caps().atomics_allocated, Support::kEmulated);
  EXPECT_TRUE((*off)->caps().thread_safe);
  auto one = Fabric::Open("ucx:posix,cma?threads=serialized");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_FALSE((*one)->caps().thread_safe);
  EXPECT_TRUE(absl::StrContains(Notes((*one)->caps().notes), "threads=serialized"))
      << Notes((*one)->caps().notes);
  EXPECT_TRUE(Fabric::Open("ucx:tcp?threads=multi").ok());
}

// Runs `child` in a forked process (which must open its own fabric) and
// returns its exit code. The tests use processes, not threads, like the
// conformance suite: Debian's absl is not built for ThreadSanitizer, which
// then reports every absl::Mutex-protected access from two threads.
template <typename Fn>
pid_t Spawn(Fn child) {
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(30);
    _exit(child());
  }
  return pid;
}

int Reap(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A listener here and an endpoint connected to it from a child process that
// checks its own side with `check` (exit code 0 = fine). Returns our side.
struct Served {
  std::unique_ptr<Fabric> fabric;
  std::unique_ptr<CompletionQueue> cq;
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Endpoint> server;
  int child_exit = -1;
};

template <typename Check>
Served ServeOne(const std::string& config, const std::string& listen, Check check) {
  Served s;
  auto fabric = Fabric::Open(config);
  EXPECT_TRUE(fabric.ok()) << fabric.status();
  if (!fabric.ok()) return s;
  s.fabric = std::move(*fabric);
  s.cq = *s.fabric->CreateCq();
  auto l = s.fabric->Listen(listen);
  EXPECT_TRUE(l.ok()) << l.status();
  if (!l.ok()) return s;
  s.listener = std::move(*l);
  const std::string address = s.listener->address();
  pid_t pid = Spawn([&]() -> int {
    auto f = Fabric::Open(config);
    if (!f.ok()) return 2;
    auto cq = (*f)->CreateCq();
    auto ep = (*f)->Connect(address, cq->get(), kTimeout);
    if (!ep.ok()) {
      std::fprintf(stderr, "child: %s\n", std::string(ep.status().message()).c_str());
      return 3;
    }
    int rc = check(ep->get());
    // Stay until the parent has looked at its side.
    std::string in(8, '\0');
    if ((*ep)->PostRecv(in.data(), in.size(), nullptr, 1).ok()) {
      Completion c;
      (*cq)->Wait(std::span<Completion>(&c, 1), kTimeout).IgnoreError();
    }
    return rc;
  });
  auto server = s.listener->Accept(s.cq.get(), kTimeout);
  EXPECT_TRUE(server.ok()) << server.status();
  if (server.ok()) {
    s.server = std::move(*server);
    if (s.server->Send("bye", 3, nullptr, 9).ok()) {
      Completion c;
      s.cq->Wait(std::span<Completion>(&c, 1), kTimeout).IgnoreError();
    }
  }
  s.child_exit = Reap(pid);
  return s;
}

// (Each pair lives in its own scope: a process with live ucx endpoints
// cannot fork ucx users, see UcxFork.)
TEST(UcxEndpoint, NotesNameTheTransportsUcxChose) {
  {
    Served tcp = ServeOne("ucx:tcp", "", [](Endpoint* ep) {
      std::string notes = Notes(ep->info().notes);
      if (!absl::StrContains(notes, "UCX lanes: tcp/")) {
        std::fprintf(stderr, "child notes: %s\n", notes.c_str());
        return 1;
      }
      return ep->info().peer_on_host && absl::StartsWith(ep->info().peer_address, "127.0.0.1:")
                 ? 0
                 : 1;
    });
    ASSERT_NE(tcp.server, nullptr);
    EXPECT_EQ(tcp.child_exit, 0);
    EXPECT_TRUE(absl::StrContains(Notes(tcp.server->info().notes), "UCX lanes: tcp/"))
        << Notes(tcp.server->info().notes);
  }

  Served shm = ServeOne("ucx:posix,cma", "", [](Endpoint* ep) {
    std::string notes = Notes(ep->info().notes);
    bool ok = absl::StrContains(notes, "UCX lanes: posix/memory") &&
              absl::StrContains(notes, "cma requested but UCX chose no cma lane") &&
              !absl::StrContains(notes, "fell back");
    if (!ok) std::fprintf(stderr, "child notes: %s\n", notes.c_str());
    return ok ? 0 : 1;
  });
  ASSERT_NE(shm.server, nullptr);
  EXPECT_EQ(shm.child_exit, 0);
  std::string notes = Notes(shm.server->info().notes);
  EXPECT_TRUE(absl::StrContains(notes, "UCX lanes: posix/memory")) << notes;
  EXPECT_TRUE(absl::StrContains(notes, "native UCP operations")) << notes;
}

TEST(UcxEndpoint, ListensOnIpv6Loopback) {
  int probe = socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 sa{};
  sa.sin6_family = AF_INET6;
  sa.sin6_addr = in6addr_loopback;
  bool v6 = probe >= 0 && bind(probe, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0;
  if (probe >= 0) close(probe);
  if (!v6) GTEST_SKIP() << "no IPv6 loopback here";
  Served s = ServeOne("ucx:tcp", "[::1]:0", [](Endpoint* ep) {
    return absl::StartsWith(ep->info().peer_address, "[::1]:") ? 0 : 1;
  });
  ASSERT_NE(s.server, nullptr);
  EXPECT_EQ(s.child_exit, 0);
  EXPECT_TRUE(absl::StartsWith(s.listener->address(), "[::1]:")) << s.listener->address();
}

TEST(UcxEndpoint, MalformedHandshakeIsRefused) {
  auto fabric = Fabric::Open("ucx:tcp");
  ASSERT_TRUE(fabric.ok());
  auto cq = (*fabric)->CreateCq();
  auto listener = (*fabric)->Listen("");
  ASSERT_TRUE(listener.ok());
  std::string addr = (*listener)->address();
  pid_t peer = Spawn([&]() -> int {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(std::stoi(addr.substr(addr.rfind(':') + 1))));
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (connect(s, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) return 1;
    const char junk[] = "\x01\x00\x00\x00\x10\x00\x00\x00garbage garbage!";
    (void)!write(s, junk, sizeof(junk) - 1);
    char b[256];
    while (read(s, b, sizeof(b)) > 0) {
    }
    close(s);
    return 0;
  });
  auto ep = (*listener)->Accept(cq->get(), kTimeout);
  ASSERT_FALSE(ep.ok());
  EXPECT_EQ(ep.status().code(), absl::StatusCode::kFailedPrecondition) << ep.status();
  EXPECT_EQ(Reap(peer), 0);
}

// UCX's async thread does not survive fork: a child forked while the parent
// has endpoints must get a clear error, not a hang.
TEST(UcxFork, ChildOfProcessWithEndpointsIsRefused) {
  Served s = ServeOne("ucx:tcp", "", [](Endpoint*) { return 0; });
  ASSERT_NE(s.server, nullptr);  // our worker exists now
  pid_t pid = Spawn([]() -> int {
    auto fabric = Fabric::Open("ucx:tcp");
    bool refused = !fabric.ok() &&
                   fabric.status().code() == absl::StatusCode::kFailedPrecondition &&
                   absl::StrContains(fabric.status().message(), "fork");
    return refused ? 0 : 1;
  });
  EXPECT_EQ(Reap(pid), 0);
}

// Before any endpoint exists (fabric, CQ and listener are fine), a forked
// child uses UCX normally.
TEST(UcxFork, ChildForkedBeforeEndpointsWorks) {
  auto fabric = Fabric::Open("ucx:tcp");
  ASSERT_TRUE(fabric.ok());
  auto cq = (*fabric)->CreateCq();
  auto listener = (*fabric)->Listen("");
  ASSERT_TRUE(listener.ok());
  std::string addr = (*listener)->address();
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(30);
    auto f = Fabric::Open("ucx:tcp");
    if (!f.ok()) _exit(2);
    auto ccq = (*f)->CreateCq();
    auto ep = (*f)->Connect(addr, ccq->get(), kTimeout);
    if (!ep.ok()) _exit(3);
    if (!(*ep)->Send("hi", 2, nullptr, 1).ok()) _exit(4);
    Completion c;
    if ((*ccq)->Wait(std::span<Completion>(&c, 1), kTimeout).value_or(0) != 1 || !c.status.ok()) {
      _exit(5);
    }
    _exit(0);
  }
  auto ep = (*listener)->Accept(cq->get(), kTimeout);
  ASSERT_TRUE(ep.ok()) << ep.status();
  std::string in(8, '\0');
  ASSERT_TRUE((*ep)->PostRecv(in.data(), in.size(), nullptr, 1).ok());
  Completion c;
  ASSERT_EQ((*cq)->Wait(std::span<Completion>(&c, 1), kTimeout).value_or(0), 1u);
  EXPECT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(in.substr(0, c.length), "hi");
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// A peer under another uid cannot share memory with us; with fallback=none
// the connection fails on both sides and says why.
TEST(UcxFallback, NoneRefusesPeersThatCannotShareMemory) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to start a peer under another uid";
  const std::string config = "ucx:posix,cma?fallback=none";
  auto fabric = Fabric::Open(config);
  ASSERT_TRUE(fabric.ok());
  auto cq = (*fabric)->CreateCq();
  auto listener = (*fabric)->Listen("");
  ASSERT_TRUE(listener.ok());
  std::string addr = (*listener)->address();
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(30);
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(77);
    auto f = Fabric::Open(config);
    if (!f.ok()) _exit(2);
    auto ccq = (*f)->CreateCq();
    auto ep = (*f)->Connect(addr, ccq->get(), kTimeout);
    _exit(!ep.ok() && absl::StrContains(ep.status().message(), "shared memory") ? 0 : 1);
  }
  auto ep = (*listener)->Accept(cq->get(), kTimeout);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) GTEST_SKIP() << "setuid(65534) failed";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ASSERT_FALSE(ep.ok());
  EXPECT_TRUE(absl::StrContains(ep.status().message(), "fallback")) << ep.status();
}


// Flow control (docs/ucx.md): two fabrics (each side's own flow_window),
// an endpoint of each connected in this process, and `idle` more pairs
// beside it (past 16 endpoints a worker finds control messages, the flow
// reports among them, by the control bit instead of each endpoint's tag).
struct FlowPair {
  std::unique_ptr<Fabric> fa, fb;
  std::unique_ptr<CompletionQueue> cq_a, cq_b;
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Endpoint> a, b;
  std::vector<std::unique_ptr<Endpoint>> idle;
};

void OpenFlowPair(const std::string& config_a, const std::string& config_b, FlowPair* p,
                  int idle = 0) {
  auto fa = Fabric::Open(config_a);
  ASSERT_TRUE(fa.ok()) << fa.status();
  auto fb = Fabric::Open(config_b);
  ASSERT_TRUE(fb.ok()) << fb.status();
  p->fa = std::move(*fa);
  p->fb = std::move(*fb);
  p->cq_a = *p->fa->CreateCq();
  p->cq_b = *p->fb->CreateCq();
  auto listener = p->fb->Listen("");
  ASSERT_TRUE(listener.ok()) << listener.status();
  p->listener = std::move(*listener);
  ASSERT_NO_FATAL_FAILURE(ConnectThrough(p->fa.get(), p->listener.get(), p->cq_a.get(),
                                         p->cq_b.get(), &p->a, &p->b, kTimeout));
  for (int i = 0; i < idle; ++i) {
    std::unique_ptr<Endpoint> a, b;
    ASSERT_NO_FATAL_FAILURE(ConnectThrough(p->fa.get(), p->listener.get(), p->cq_a.get(),
                                           p->cq_b.get(), &a, &b, kTimeout));
    p->idle.push_back(std::move(a));
    p->idle.push_back(std::move(b));
  }
}

class UcxFlow : public ::testing::TestWithParam<std::string> {};

// a sends 4 injected messages and then 196 ordinary ones while b posts no
// receive for half a second: with a window of 8 on both sides at most 4 of
// the ordinary sends complete (the injected ones count too); with either
// side at 0 there is no window (UCX buffers them all). Then b receives all
// 200, in order, and every send completes: b's reports reach a, also
// among 20 idle pairs.
TEST_P(UcxFlow, SendsBeyondTheWindowWaitForThePeersReceives) {
  constexpr int kInjected = 4, kMessages = 200;
  struct Case {
    int window_a, window_b, idle;
  };
  for (Case k : {Case{8, 8, 0}, Case{0, 0, 0}, Case{8, 0, 0}, Case{8, 8, 20}}) {
    SCOPED_TRACE(absl::StrCat("flow_window a=", k.window_a, " b=", k.window_b, ", idle pairs ",
                              k.idle));
    const std::string sep = absl::StrContains(GetParam(), "?") ? "&" : "?";
    FlowPair p;
    ASSERT_NO_FATAL_FAILURE(OpenFlowPair(absl::StrCat(GetParam(), sep, "flow_window=", k.window_a),
                                         absl::StrCat(GetParam(), sep, "flow_window=", k.window_b),
                                         &p, k.idle));
    std::vector<std::string> msgs;
    for (int i = 0; i < kMessages; ++i) msgs.push_back(absl::StrCat("message ", i));
    for (int i = 0; i < kMessages; ++i) {
      const uint64_t ctx = i < kInjected ? kInjectContext : static_cast<uint64_t>(i);
      ASSERT_TRUE(p.a->Send(msgs[i].data(), msgs[i].size(), nullptr, ctx).ok()) << i;
    }
    SendsInOrder sends(p.cq_a.get(), kInjected);
    ASSERT_NO_FATAL_FAILURE(ProgressWhileUnreceived(&sends, p.cq_b.get(), absl::Milliseconds(500)));
    const int sent = static_cast<int>(sends.next()) - kInjected;
    if (k.window_a > 0 && k.window_b > 0) {
      EXPECT_LE(sent, k.window_a - kInjected)
          << "sends went beyond the window while the peer received nothing";
      EXPECT_GE(sent, 1);
    } else {
      EXPECT_EQ(sent, kMessages - kInjected) << "without a window UCX takes every message";
    }
    ASSERT_NO_FATAL_FAILURE(
        ReceiveAllInOrder(p.b.get(), p.cq_b.get(), &sends, msgs, kMessages, kTimeout));
  }
}

// An endpoint whose sends wait for the window goes down, closed here or
// by the peer: those UCX took complete, the held ones (injected copies
// among them) fail (Cancelled, or the peer's departure), every completion
// in posting order, nothing leaked (ASan).
TEST_P(UcxFlow, HeldSendsFailInOrderWhenTheEndpointGoesDown) {
  const std::string sep = absl::StrContains(GetParam(), "?") ? "&" : "?";
  const std::string config = absl::StrCat(GetParam(), sep, "flow_window=4");
  for (bool peer_closes : {false, true}) {
    SCOPED_TRACE(peer_closes ? "the peer closes" : "closed here");
    FlowPair p;
    ASSERT_NO_FATAL_FAILURE(OpenFlowPair(config, config, &p));
    constexpr int kMessages = 20;
    const std::string msg = "held";
    for (int i = 0; i < kMessages; ++i) {
      const uint64_t ctx = (i == 10 || i == 11) ? kInjectContext : static_cast<uint64_t>(i);
      ASSERT_TRUE(p.a->Send(msg.data(), msg.size(), nullptr, ctx).ok()) << i;
    }
    std::vector<Completion> got;
    const absl::Time quiet = absl::Now() + absl::Milliseconds(200);
    while (absl::Now() < quiet) {
      Completion c;
      while (p.cq_a->Poll(std::span<Completion>(&c, 1)) == 1) got.push_back(c);
      p.cq_b->Poll(std::span<Completion>(&c, 1));
      absl::SleepFor(absl::Microseconds(200));
    }
    const size_t before = got.size();
    EXPECT_GE(before, 1u);
    EXPECT_LE(before, 4u);
    if (peer_closes) {
      p.b.reset();
    } else {
      p.a->Close();
    }
    const absl::Time deadline = absl::Now() + kTimeout;
    while (got.size() < kMessages - 2 && absl::Now() < deadline) {
      Completion c;
      while (p.cq_a->Poll(std::span<Completion>(&c, 1)) == 1) got.push_back(c);
    }
    ASSERT_EQ(got.size(), kMessages - 2u);  // the injected ones report nothing
    uint64_t expect = 0;
    for (size_t i = 0; i < got.size(); ++i, ++expect) {
      if (expect == 10) expect = 12;
      EXPECT_EQ(got[i].context, expect) << i;
      if (i < before) {
        EXPECT_TRUE(got[i].status.ok()) << got[i].status;
      } else if (peer_closes) {
        EXPECT_EQ(got[i].status.code(), absl::StatusCode::kAborted) << i << ": " << got[i].status;
      } else {
        EXPECT_EQ(got[i].status.code(), absl::StatusCode::kCancelled) << i << ": " << got[i].status;
      }
    }
  }
}

// Control messages reach an endpoint among many on its worker (found by
// the control bit, not by each endpoint's tag): an emulated write and read
// between one pair beside 20 idle ones, both sides polled here.
TEST_P(UcxFlow, ControlMessagesReachAnEndpointAmongMany) {
  FlowPair p;
  ASSERT_NO_FATAL_FAILURE(OpenFlowPair(GetParam(), GetParam(), &p, 20));
  std::vector<uint8_t> target(4096, 0);
  auto mr = p.fb->RegisterMemory(target.data(), target.size(), kRemoteRead | kRemoteWrite);
  ASSERT_TRUE(mr.ok()) << mr.status();
  const RemoteKey key = (*mr)->remote_key();
  std::vector<uint8_t> out(1000), back(1000, 0);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 7 + 1);
  auto wait_a = [&](OpType op) {
    const absl::Time deadline = absl::Now() + kTimeout;
    Completion c;
    while (absl::Now() < deadline) {
      p.cq_b->Poll(std::span<Completion>(&c, 1));  // the target serves emulated RMA
      if (p.cq_a->Poll(std::span<Completion>(&c, 1)) == 1) {
        EXPECT_EQ(c.op, op);
        return c.status;
      }
    }
    return absl::DeadlineExceededError("no completion: a control message was not found");
  };
  ASSERT_TRUE(p.a->Write(out.data(), out.size(), nullptr, key.addr + 100, key, 1).ok());
  absl::Status st = wait_a(OpType::kWrite);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(std::vector<uint8_t>(target.begin() + 100, target.begin() + 1100), out);
  ASSERT_TRUE(p.a->Read(back.data(), back.size(), nullptr, key.addr + 100, key, 2).ok());
  st = wait_a(OpType::kRead);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(back, out);
}

// Also without the worker lock (threads=serialized): each fabric of a
// pair is called from one thread at a time here.
INSTANTIATE_TEST_SUITE_P(Transports, UcxFlow,
                         ::testing::Values("ucx:tcp", "ucx:posix,cma", "ucx:tcp?threads=serialized",
                                           "ucx:posix,cma?threads=serialized"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name =
                               absl::StartsWith(info.param, "ucx:tcp") ? "tcp" : "posix_cma";
                           if (absl::StrContains(info.param, "serialized")) name += "_serialized";
                           return name;
                         });

TEST(UcxFlowOptions, ABadWindowIsRefusedWithTheRange) {
  for (const char* v : {"2", "-1", "many", "2000000"}) {
    auto f = Fabric::Open(absl::StrCat("ucx:tcp?flow_window=", v));
    ASSERT_FALSE(f.ok()) << v;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
    EXPECT_TRUE(absl::StrContains(f.status().message(), "flow_window")) << f.status();
    EXPECT_TRUE(absl::StrContains(f.status().message(), "4 to 1000000")) << f.status();
  }
  EXPECT_TRUE(Fabric::Open("ucx:tcp?flow_window=0").ok());
  EXPECT_TRUE(Fabric::Open("ucx:tcp?flow_window=4").ok());
}

}  // namespace
}  // namespace zsock
