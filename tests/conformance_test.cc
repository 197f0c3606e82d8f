// The provider conformance suite: one test body per behaviour, instantiated
// for every provider configuration (see kConfigurations below). Every test
// runs two real processes: the test process and one or more forked children
// that open their own fabric. A configuration that cannot be opened on this
// machine is SKIPPED with the reason the provider gave.
//
// Fork rule (docs/provider-interface.md): children fork before the parent
// creates endpoints, open their own fabric, and leave with _exit.
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/provider.h"
#include "tests/child_process.h"
#include "core/rcache.h"
#include "core/sockaddr.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "tests/conformance_configs.h"

namespace zsock {
namespace {

constexpr absl::Duration kOpTimeout = absl::Seconds(30);

// ---- child-process helpers ----

[[noreturn]] void ChildFail(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "child %d: %s:%d: %s\n", getpid(), file, line, what.c_str());
  std::fflush(stderr);
  _exit(1);
}

#define CHILD_CHECK(cond)                                            \
  do {                                                               \
    if (!(cond)) ChildFail(__FILE__, __LINE__, "check failed: " #cond); \
  } while (0)
#define CHILD_OK(expr)                                                     \
  do {                                                                     \
    absl::Status _st = (expr);                                             \
    if (!_st.ok()) ChildFail(__FILE__, __LINE__, #expr ": " + _st.ToString()); \
  } while (0)

// Forks a child running `body`; its return value is the exit status.
pid_t Spawn(std::function<int()> body) {
  return zsock::testutil::SpawnChild(std::move(body), absl::Seconds(120));
}

// Waits for a child; returns its exit code, or -signal, or -1000 on timeout.
int Reap(pid_t pid, absl::Duration timeout = absl::Seconds(120)) {
  return zsock::testutil::ReapChild(pid, timeout);
}

// Waits for exactly one completion.
absl::StatusOr<Completion> WaitOne(CompletionQueue* cq, absl::Duration timeout = kOpTimeout) {
  Completion c;
  absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError("no completion within the timeout");
    }
    auto n = cq->Wait(std::span<Completion>(&c, 1), left);
    if (!n.ok()) return n.status();
    if (*n == 1) return c;
  }
}

// Waits for a completion and requires it to be OK.
absl::StatusOr<Completion> WaitOk(CompletionQueue* cq) {
  auto c = WaitOne(cq);
  if (!c.ok()) return c.status();
  if (!c->status.ok()) return c->status;
  return c;
}

void Fill(uint8_t* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<uint8_t>(rng());
}

bool Check(const uint8_t* p, size_t n, uint64_t seed) {
  std::vector<uint8_t> want(n);
  Fill(want.data(), n, seed);
  return n == 0 || std::memcmp(p, want.data(), n) == 0;
}

// Sends a small blob and waits for its completion.
absl::Status SendBlob(Endpoint* ep, const std::string& blob) {
  if (auto st = ep->Send(blob.data(), blob.size(), nullptr, 1); !st.ok()) return st;
  for (;;) {
    auto c = WaitOne(ep->cq());
    if (!c.ok()) return c.status();
    if (!c->status.ok()) return c->status;
    if (c->op == OpType::kSend) return absl::OkStatus();
  }
}

absl::StatusOr<std::string> RecvBlob(Endpoint* ep, size_t max = 4096) {
  std::string buf(max, '\0');
  if (auto st = ep->PostRecv(buf.data(), buf.size(), nullptr, 2); !st.ok()) return st;
  for (;;) {
    auto c = WaitOne(ep->cq());
    if (!c.ok()) return c.status();
    if (!c->status.ok()) return c->status;
    if (c->op == OpType::kRecv) {
      buf.resize(c->length);
      return buf;
    }
  }
}

// Receives a peer's serialized remote key (SendBlob of Serialize()).
absl::StatusOr<RemoteKey> RecvKey(Endpoint* ep) {
  auto blob = RecvBlob(ep);
  if (!blob.ok()) return blob.status();
  return RemoteKey::Parse(*blob);
}

class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto fabric = Fabric::Open(GetParam());
    if (!fabric.ok()) {
      if (fabric.status().code() == absl::StatusCode::kUnavailable ||
          fabric.status().code() == absl::StatusCode::kNotFound ||
          fabric.status().code() == absl::StatusCode::kFailedPrecondition) {
        GTEST_SKIP() << "provider configuration '" << GetParam()
                     << "' cannot run here: " << fabric.status().message();
      }
      FAIL() << fabric.status();
    }
    fabric_ = std::move(*fabric);
    auto cq = fabric_->CreateCq();
    ASSERT_TRUE(cq.ok()) << cq.status();
    cq_ = std::move(*cq);
    auto listener = fabric_->Listen("");
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_ = std::move(*listener);
  }

  std::unique_ptr<Endpoint> AcceptOne() {
    auto ep = listener_->Accept(cq_.get(), kOpTimeout);
    EXPECT_TRUE(ep.ok()) << ep.status();
    return ep.ok() ? std::move(*ep) : nullptr;
  }

  // In a child: opens a fabric + CQ and connects n endpoints on that CQ.
  struct ChildConns {
    std::unique_ptr<Fabric> fabric;
    std::unique_ptr<CompletionQueue> cq;
    std::vector<std::unique_ptr<Endpoint>> eps;
  };
  ChildConns ChildConnectMany(int n) {
    ChildConns c;
    auto fabric = Fabric::Open(GetParam());
    CHILD_OK(fabric.status());
    c.fabric = std::move(*fabric);
    auto cq = c.fabric->CreateCq();
    CHILD_OK(cq.status());
    c.cq = std::move(*cq);
    for (int i = 0; i < n; ++i) {
      auto ep = c.fabric->Connect(listener_->address(), c.cq.get(), kOpTimeout);
      CHILD_OK(ep.status());
      c.eps.push_back(std::move(*ep));
    }
    return c;
  }

  // In a child: opens a fabric + CQ and connects to the parent's listener.
  struct ChildConn {
    std::unique_ptr<Fabric> fabric;
    std::unique_ptr<CompletionQueue> cq;
    std::unique_ptr<Endpoint> ep;
  };
  ChildConn ChildConnect() {
    ChildConns m = ChildConnectMany(1);
    return {std::move(m.fabric), std::move(m.cq), std::move(m.eps[0])};
  }

  // In a child: connects, then waits until the parent writes a byte to
  // go[1], so the parent's sends meet a peer that neither posts receives
  // nor polls until then.
  ChildConn ChildConnectThenAwait(const int go[2]) {
    close(go[1]);
    ChildConn c = ChildConnect();
    char b;
    CHILD_CHECK(read(go[0], &b, 1) == 1);
    return c;
  }

  std::unique_ptr<Fabric> fabric_;
  std::unique_ptr<CompletionQueue> cq_;
  std::unique_ptr<Listener> listener_;
};

TEST_P(Conformance, ConnectAcceptAndExchange) {
  pid_t child = Spawn([&] {
    ChildConn c = ChildConnect();
    CHILD_OK(SendBlob(c.ep.get(), "hello from child"));
    auto reply = RecvBlob(c.ep.get());
    CHILD_OK(reply.status());
    CHILD_CHECK(*reply == "hello from parent");
    return 0;
  });
  auto ep = AcceptOne();
  ASSERT_NE(ep, nullptr);
  auto msg = RecvBlob(ep.get());
  ASSERT_TRUE(msg.ok()) << msg.status();
  EXPECT_EQ(*msg, "hello from child");
  ASSERT_TRUE(SendBlob(ep.get(), "hello from parent").ok());
  EXPECT_EQ(Reap(child), 0);
  EXPECT_FALSE(ep->info().peer_address.empty());
}

// Every provider takes socket addresses (the sockets layer's form): port 0
// picks a free port that address() reports, a port in use is refused with
// EADDRINUSE, and a peer connects to the reported IP:PORT.
TEST_P(Conformance, ListensAndConnectsOnSocketAddresses) {
  auto l = fabric_->Listen("127.0.0.1:0");
  ASSERT_TRUE(l.ok()) << l.status();
  auto addr = ParseSocketAddress((*l)->address());
  ASSERT_TRUE(addr.ok()) << (*l)->address() << ": " << addr.status();
  EXPECT_NE(addr->port(), 0) << (*l)->address();
  EXPECT_TRUE(addr->is_loopback()) << (*l)->address();
  auto again = fabric_->Listen((*l)->address());
  ASSERT_FALSE(again.ok()) << "a second listener on " << (*l)->address();
  EXPECT_EQ(StatusErrno(again.status()), EADDRINUSE) << again.status();

  const std::string target = (*l)->address();
  pid_t child = Spawn([&] {
    auto fabric = Fabric::Open(GetParam());
    CHILD_OK(fabric.status());
    auto cq = (*fabric)->CreateCq();
    CHILD_OK(cq.status());
    auto ep = (*fabric)->Connect(target, cq->get(), kOpTimeout);
    CHILD_OK(ep.status());
    CHILD_OK(SendBlob(ep->get(), "over a socket address"));
    return 0;
  });
  auto ep = (*l)->Accept(cq_.get(), kOpTimeout);
  ASSERT_TRUE(ep.ok()) << ep.status();
  auto msg = RecvBlob(ep->get());
  ASSERT_TRUE(msg.ok()) << msg.status();
  EXPECT_EQ(*msg, "over a socket address");
  EXPECT_EQ(Reap(child), 0);
}

// A socket address where nobody listens is refused at once with
// ECONNREFUSED, as TCP refuses it, not after the connect timeout.
TEST_P(Conformance, ConnectWhereNobodyListensIsRefused) {
  std::string address;
  {
    auto l = fabric_->Listen("127.0.0.1:0");
    ASSERT_TRUE(l.ok()) << l.status();
    address = (*l)->address();
  }  // closed: the port is free again
  const absl::Time start = absl::Now();
  auto ep = fabric_->Connect(address, cq_.get(), absl::Seconds(60));
  ASSERT_FALSE(ep.ok()) << address;
  EXPECT_EQ(StatusErrno(ep.status()), ECONNREFUSED) << ep.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << "waited for the connect timeout";
}

// Sizes from 0 B to 16 MiB, around the inline and buffer limits, each
// checked byte for byte after travelling child -> parent -> child.
TEST_P(Conformance, SendRecvSizesByteExact) {
  const std::vector<size_t> sizes = {0, 1, 7, 8, 63, 64, 95, 96, 97, 1000, 4095, 4096,
                                     4097, 32767, 32768, 32769, 65536, 100001,
                                     size_t{1} << 20, (size_t{1} << 20) + 3, size_t{16} << 20};
  pid_t child = Spawn([&] {
    ChildConn c = ChildConnect();
    std::vector<uint8_t> out(sizes.back()), in(sizes.back());
    for (size_t i = 0; i < sizes.size(); ++i) {
      Fill(out.data(), sizes[i], i);
      CHILD_OK(c.ep->PostRecv(in.data(), in.size(), nullptr, 100 + i));
      CHILD_OK(c.ep->Send(out.data(), sizes[i], nullptr, i));
      bool sent = false, got = false;
      while (!sent || !got) {
        auto comp = WaitOk(c.cq.get());
        CHILD_OK(comp.status());
        if (comp->op == OpType::kSend) { CHILD_CHECK(comp->context == i); sent = true; }
        if (comp->op == OpType::kRecv) {
          CHILD_CHECK(comp->context == 100 + i);
          CHILD_CHECK(comp->length == sizes[i]);
          CHILD_CHECK(Check(in.data(), sizes[i], i));
          got = true;
        }
      }
    }
    return 0;
  });
  auto ep = AcceptOne();
  ASSERT_NE(ep, nullptr);
  std::vector<uint8_t> buf(sizes.back());
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(ep->PostRecv(buf.data(), buf.size(), nullptr, i).ok());
    auto c = WaitOk(cq_.get());
    ASSERT_TRUE(c.ok()) << "size " << sizes[i] << ": " << c.status();
    ASSERT_EQ(c->op, OpType::kRecv);
    ASSERT_EQ(c->length, sizes[i]);
    ASSERT_TRUE(Check(buf.data(), sizes[i], i)) << "size " << sizes[i];
    ASSERT_TRUE(ep->Send(buf.data(), sizes[i], nullptr, 1000 + i).ok());
    auto s = WaitOk(cq_.get());
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_EQ(s->op, OpType::kSend);
  }
  EXPECT_EQ(Reap(child), 0);
}

// Capabilities::inline_size is a promise: a send of at most that many bytes
// completes while the peer neither posts a receive nor polls (here it is
// blocked reading a pipe), and the bytes still arrive exactly afterwards.
TEST_P(Conformance, InlineSendsCompleteWithoutThePeer) {
  const size_t inline_size = fabric_->caps().inline_size;
  if (inline_size == 0) GTEST_SKIP() << "this configuration promises no inline sends (inline_size 0)";
  const std::vector<size_t> sizes = {1, inline_size};
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  pid_t child = Spawn([&] {
    ChildConn c = ChildConnectThenAwait(go);  // the parent has seen its sends complete
    std::vector<uint8_t> in(inline_size);
    for (size_t i = 0; i < sizes.size(); ++i) {
      CHILD_OK(c.ep->PostRecv(in.data(), in.size(), nullptr, i));
      auto comp = WaitOk(c.cq.get());
      CHILD_OK(comp.status());
      CHILD_CHECK(comp->op == OpType::kRecv && comp->length == sizes[i]);
      CHILD_CHECK(Check(in.data(), sizes[i], 40 + i));
    }
    CHILD_OK(SendBlob(c.ep.get(), "received"));
    return 0;
  });
  close(go[0]);
  auto ep = AcceptOne();
  ASSERT_NE(ep, nullptr);
  std::vector<std::vector<uint8_t>> out;
  for (size_t i = 0; i < sizes.size(); ++i) {
    out.emplace_back(sizes[i]);
    Fill(out.back().data(), sizes[i], 40 + i);
    ASSERT_TRUE(ep->Send(out.back().data(), sizes[i], nullptr, i).ok());
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto c = WaitOk(cq_.get());
    ASSERT_TRUE(c.ok()) << "an inline send of " << sizes[i]
                        << " bytes did not complete while the peer was away: " << c.status();
    EXPECT_EQ(c->op, OpType::kSend);
  }
  // The buffers are the caller's again: overwriting them changes nothing.
  for (auto& o : out) std::fill(o.begin(), o.end(), 0xee);
  ASSERT_EQ(write(go[1], "g", 1), 1);
  close(go[1]);
  auto done = RecvBlob(ep.get());
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(*done, "received");
  EXPECT_EQ(Reap(child), 0);
}

// Capabilities::inject_size: a send with context kInjectContext has copied
// its bytes when Send returns (the buffer is overwritten at once) and
// reports no completion. More are injected than unet's default ring holds
// (256) while the peer neither posts receives nor polls, so some wait
// inside the provider; all arrive intact and in order (zero bytes
// included), and of the sender's send completions only the ordinary send
// that follows them reports.
TEST_P(Conformance, InjectedSendsCopyAndReportNothing) {
  const size_t inject = fabric_->caps().inject_size;
  if (inject == 0) GTEST_SKIP() << "this configuration offers no injected sends (inject_size 0)";
  constexpr int kInjected = 3000;
  auto size_of = [inject](int i) { return static_cast<size_t>(i) % (inject + 1); };
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  pid_t child = Spawn([&] {
    ChildConn c = ChildConnectThenAwait(go);  // everything has been sent
    std::vector<uint8_t> in(std::max<size_t>(inject, 3));
    for (int i = 0; i <= kInjected; ++i) {
      CHILD_OK(c.ep->PostRecv(in.data(), in.size(), nullptr, static_cast<uint64_t>(i)));
      auto comp = WaitOk(c.cq.get());
      CHILD_OK(comp.status());
      CHILD_CHECK(comp->op == OpType::kRecv);
      const size_t want = i < kInjected ? size_of(i) : 3;
      CHILD_CHECK(comp->length == want);
      CHILD_CHECK(i < kInjected ? Check(in.data(), want, 500 + i)
                                : std::memcmp(in.data(), "end", 3) == 0);
    }
    CHILD_OK(SendBlob(c.ep.get(), "received"));
    return 0;
  });
  close(go[0]);
  absl::Cleanup release_child = [&] { close(go[1]); };  // also when an ASSERT returns early
  auto ep = AcceptOne();
  ASSERT_NE(ep, nullptr);
  std::vector<uint8_t> buf(inject);
  for (int i = 0; i < kInjected; ++i) {
    Fill(buf.data(), size_of(i), 500 + i);
    ASSERT_TRUE(ep->Send(buf.data(), size_of(i), nullptr, kInjectContext).ok()) << "message " << i;
    std::fill(buf.begin(), buf.end(), 0xee);  // the caller's again
  }
  ASSERT_TRUE(ep->Send("end", 3, nullptr, 7).ok());
  ASSERT_EQ(write(go[1], "g", 1), 1);
  // Every completion until the child's answer arrives: the ordinary send's
  // and the answer's receive, nothing for the injected sends.
  std::string answer(64, '\0');
  ASSERT_TRUE(ep->PostRecv(answer.data(), answer.size(), nullptr, 8).ok());
  int sends = 0;
  for (bool received = false; !received;) {
    auto c = WaitOk(cq_.get());
    ASSERT_TRUE(c.ok()) << c.status();
    if (c->op == OpType::kRecv) {
      ASSERT_EQ(c->context, 8u);
      answer.resize(c->length);
      received = true;
    } else {
      EXPECT_EQ(c->context, 7u) << "an injected send reported a completion";
      ++sends;
    }
  }
  EXPECT_EQ(answer, "received");
  // The ordinary send's completion may come after the answer.
  Completion extra[1];
  while (sends == 0) {
    auto more = cq_->Wait(extra, absl::Seconds(10));
    ASSERT_TRUE(more.ok()) << more.status();
    ASSERT_EQ(*more, 1u) << "the ordinary send never completed";
    EXPECT_EQ(extra[0].context, 7u) << "an injected send reported a completion";
    ++sends;
  }
  EXPECT_EQ(sends, 1);
  auto more = cq_->Wait(extra, absl::Milliseconds(100));
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_EQ(*more, 0u) << "unexpected completion with context " << extra[0].context;
  EXPECT_EQ(Reap(child), 0);
}

// Many sends outstanding at once arrive complete and in order.
TEST_P(Conformance, OrderingWithManyOutstanding) {
  constexpr int kMessages = 2000;
  pid_t child = Spawn([&] {
    ChildConn c = ChildConnect();
    std::vector<std::vector<uint8_t>> msgs(kMessages);
    for (int i = 0; i < kMessages; ++i) {
      msgs[i].resize(8 + (i * 7919) % 70000);
      Fill(msgs[i].data(), msgs[i].size(), i);
      std::memcpy(msgs[i].data(), &i, sizeof(i));
      CHILD_OK(c.ep->Send(msgs[i].data(), msgs[i].size(), nullptr, i));
    }
    // Completions may come in any order; each send completes exactly once.
    std::vector<int> sent(kMessages, 0);
    for (int n = 0; n < kMessages; ++n) {
      auto comp = WaitOk(c.cq.get());
      CHILD_OK(comp.status());
      CHILD_CHECK(comp->op == OpType::kSend && comp->context < kMessages);
      CHILD_CHECK(++sent[comp->context] == 1);
    }
    auto done = RecvBlob(c.ep.get());
    CHILD_OK(done.status());
    return 0;
  });
  auto ep = AcceptOne();
  ASSERT_NE(ep, nullptr);
  // The k-th receive posted has context k. Receives match messages in
  // posting order, so receive k must hold exactly message k, whatever order
  // the completions come in; the buffer it frees is posted again at once, as
  // the next receive in posting order.
  constexpr int kWindow = 32;
  std::vector<std::vector<uint8_t>> bufs(kWindow, std::vector<uint8_t>(80000));
  std::vector<int> slot_of(kMessages, -1);
  int next_post = 0;
  auto post = [&](int slot) {
    slot_of[next_post] = slot;
    return ep->PostRecv(bufs[slot].data(), bufs[slot].size(), nullptr, next_post++);
  };
  for (int b = 0; b < kWindow; ++b) ASSERT_TRUE(post(b).ok());
  std::vector<int> got(kMessages, 0);
  for (int n = 0; n < kMessages; ++n) {
    auto c = WaitOk(cq_.get());
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_EQ(c->op, OpType::kRecv);
    const int k = static_cast<int>(c->context);
    ASSERT_TRUE(k >= 0 && k < next_post && ++got[k] == 1) << "context " << k;
    uint8_t* p = bufs[slot_of[k]].data();
    int seq;
    std::memcpy(&seq, p, sizeof(seq));
    ASSERT_EQ(seq, k) << "receive " << k << " matched message " << seq;
    ASSERT_EQ(c->length, 8 + (static_cast<size_t>(k) * 7919) % 70000);
    std::vector<uint8_t> want(c->length);
    Fill(want.data(), want.size(), k);
    std::memcpy(want.data(), &k, sizeof(k));
    ASSERT_EQ(std::memcmp(p, want.data(), c->length), 0) << "message " << k;
    if (next_post < kMessages) {
      ASSERT_TRUE(post(slot_of[k]).ok());
    }
  }
  ASSERT_TRUE(SendBlob(ep.get(), "done").ok());
  EXPECT_EQ(Reap(child), 0);
}

// RDMA write and read at unaligned offsets and across page boundaries.
TEST_P(Conformance, ReadWriteUnalignedAcrossPages) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t region = 4 * page;
  std::vector<uint8_t> target(region, 0xee);
  auto mr = fabric_->RegisterMemory(target.data(), region, kAccessAll);
  ASSERT_TRUE(mr.ok()) << mr.status();
  struct Case { size_t off, len; };
  const std::vector<Case> cases = {{0, 1}, {1, 7}, {3, page}, {page - 5, 10},
                                   {page - 1, 2 * page + 2}, {17, region - 17}, {region - 1, 1}};
  pid_t child = Spawn([&] {
    ChildConn c = ChildConnect();
    auto key = RecvKey(c.ep.get());
    CHILD_OK(key.status());
    std::vector<uint8_t> local(region), back(region);
    for (size_t i = 0; i < cases.size(); ++i) {
      Fill(local.data(), cases[i].len, 500 + i);
      CHILD_OK(c.ep->Write(local.data(), cases[i].len, nullptr, key->addr + cases[i].off, *key, i));
      auto w = WaitOk(c.cq.get());
      CHILD_OK(w.status());
      CHILD_CHECK(w->op == OpType::kWrite && w->context == i);
      std::fill(back.begin(), back.end(), 0);
      CHILD_OK(c.ep->Read(back.data(), cases[i].len, nullptr, key->addr + cases[i].off, *key, i));
      auto r = WaitOk(c.cq.get());
      CHILD_OK(r.status());
      CHILD_CHECK(r->op == OpType::kRead && r->length == cases[i].len);
      CHILD_CHECK(Check(back.data(), cases[i].len, 500 + i));
      CHILD_OK(SendBlob(c.ep.get(), absl::StrCat(i)));  // parent checks its memory
      auto ack = RecvBlob(c.ep.get());
      CHILD_OK(ack.status());
    }
    return 0;
  });
  auto ep = AcceptOne();
  ASSERT_NE(ep, nullptr);
  ASSERT_TRUE(SendBlob(ep.get(), (*mr)->remote_key().Serialize()).ok());
  for (size_t i = 0; i < cases.size(); ++i) {
    // The target keeps polling (emulated RMA is served by its progress).
    auto idx = RecvBlob(ep.get());
    ASSERT_TRUE(idx.ok()) << idx.status();
    ASSERT_EQ(*idx, absl::StrCat(i));
    EXPECT_TRUE(Check(target.data() + cases[i].off, cases[i].len, 500 + i)) << "case " << i;
    // Nothing outside the range was touched.
    for (size_t b = 0; b < region; ++b) {
      if (b >= cases[i].off && b < cases[i].off + cases[i].len) continue;
      ASSERT_EQ(target[b], 0xee) << "case " << i << ": byte " << b << " outside the range changed";
    }
    std::fill(target.begin(), target.end(), 0xee);  // fresh guard for the next case
    ASSERT_TRUE(SendBlob(ep.get(), "ok").ok());
  }
  EXPECT_EQ(Reap(child), 0);
}

// max_rma_size is the contract's largest single Read / Write: one of
// exactly that size moves every byte, and one a byte larger is refused (at
// the call or in its completion), never left without a completion. Until
// 2026-11-23 an emulated read of 65025-65536 bytes over ofi:shm passed the
// initiator's check, and the target, unable to fit the answer in one of its
// 64 KiB control messages, dropped it: the read never completed.
TEST_P(Conformance, RmaOfMaxRmaSizeWorksAndLargerIsRefused) {
  const size_t max = fabric_->caps().max_rma_size;
  if (fabric_->caps().rdma_read == Support::kNone) GTEST_SKIP() << "no RDMA read here";
  if (max == 0 || max > (size_t{8} << 20)) {
    GTEST_SKIP() << "max_rma_size is " << max << " bytes: the boundary is beyond what this "
                 << "test registers (8 MiB)";
  }
  const size_t region = 2 * max + 4096;
  std::vector<uint8_t> target(region);
  Fill(target.data(), region, 71);
  auto mr = fabric_->RegisterMemory(target.data(), region, kAccessAll);
  ASSERT_TRUE(mr.ok()) << mr.status();
  pid_t child = Spawn([&] {
    ChildConn c = ChildConnect();
    auto key = RecvKey(c.ep.get());
    CHILD_OK(key.status());
    std::vector<uint8_t> local(region, 0);
    CHILD_OK(c.ep->Read(local.data(), max, nullptr, key->addr, *key, 1));
    auto r = WaitOk(c.cq.get());
    CHILD_OK(r.status());
    CHILD_CHECK(r->op == OpType::kRead && r->length == max);
    CHILD_CHECK(Check(local.data(), max, 71));
    Fill(local.data(), max, 72);
    CHILD_OK(c.ep->Write(local.data(), max, nullptr, key->addr, *key, 2));
    auto w = WaitOk(c.cq.get());
    CHILD_OK(w.status());
    CHILD_CHECK(w->op == OpType::kWrite && w->length == max);
    CHILD_OK(SendBlob(c.ep.get(), "wrote"));  // the parent checks its memory
    auto ack = RecvBlob(c.ep.get());
    CHILD_OK(ack.status());
    // One byte more, and twice as much (past what the emulation's control
    // messages carry): refused, by the call or by the completion.
    for (size_t len : {max + 1, 2 * max}) {
      for (OpType op : {OpType::kRead, OpType::kWrite}) {
        absl::Status st = op == OpType::kRead
                              ? c.ep->Read(local.data(), len, nullptr, key->addr, *key, 3)
                              : c.ep->Write(local.data(), len, nullptr, key->addr, *key, 3);
        if (st.ok()) {
          auto done = WaitOne(c.cq.get(), absl::Seconds(10));
          if (!done.ok()) {
            ChildFail(__FILE__, __LINE__,
                      absl::StrCat(OpTypeName(op), " of ", len, " bytes (max_rma_size ", max,
                                   ") never completed: ", done.status().ToString()));
          }
          st = done->status;
        }
        if (st.ok()) {
          ChildFail(__FILE__, __LINE__,
                    absl::StrCat(OpTypeName(op), " of ", len, " bytes (max_rma_size ", max,
                                 ") succeeded"));
        }
      }
    }
    CHILD_OK(SendBlob(c.ep.get(), "done"));
    return 0;
  });
  auto ep = AcceptOne();
  ASSERT_NE(ep, nullptr);
  ASSERT_TRUE(SendBlob(ep.get(), (*mr)->remote_key().Serialize()).ok());
  // The target keeps polling: emulated RMA is served by its progress.
  auto wrote = RecvBlob(ep.get());
  ASSERT_TRUE(wrote.ok()) << wrote.status();
  ASSERT_EQ(*wrote, "wrote");
  EXPECT_TRUE(Check(target.data(), max, 72)) << "the write of max_rma_size bytes";
  std::vector<uint8_t> first(region);
  Fill(first.data(), region, 71);
  EXPECT_EQ(std::memcmp(first.data() + max, target.data() + max, region - max), 0)
      << "bytes past the write changed";
  ASSERT_TRUE(SendBlob(ep.get(), "ok").ok());
  auto done = RecvBlob(ep.get());
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(*done, "done");
  EXPECT_EQ(Reap(child), 0);
}

// A peer that may not attach to our memory (here: it runs as another user,
// so ptrace policy denies cross-memory attach) sees that at connect, says
// why in its endpoint info, and its RDMA still works by the fallback path.
TEST_P(Conformance, DeniedCrossMemoryAttachFallsBack) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "needs root to start a peer under another uid (denying cross-memory attach)";
  }
  std::vector<uint8_t> target(8192, 0);
  auto mr = fabric_->RegisterMemory(target.data(), target.size(), kAccessAll);
  ASSERT_TRUE(mr.ok()) << mr.status();
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pid_t child = Spawn([&]() -> int {
    close(pipefd[0]);
    char ok = 1;
    if (setgid(65534) != 0 || setuid(65534) != 0) {
      ok = 0;  // cannot change uid here (user namespace): report and stop
      CHILD_CHECK(write(pipefd[1], &ok, 1) == 1);
      return 0;
    }
    CHILD_CHECK(write(pipefd[1], &ok, 1) == 1);
    ChildConn c;
    auto fabric = Fabric::Open(GetParam());
    CHILD_OK(fabric.status());
    c.fabric = std::move(*fabric);
    auto cq = c.fabric->CreateCq();
    CHILD_OK(cq.status());
    c.cq = std::move(*cq);
    auto ep = c.fabric->Connect(listener_->address(), c.cq.get(), kOpTimeout);
    // A provider that cannot connect peers of different users (ofi:shm)
    // must say so, as a precondition, on both sides.
    if (ep.status().code() == absl::StatusCode::kFailedPrecondition) return 3;
    CHILD_OK(ep.status());
    c.ep = std::move(*ep);
    auto key = RecvKey(c.ep.get());
    CHILD_OK(key.status());
    const EndpointInfo& info = c.ep->info();
    // Providers that never use cross-memory attach report native here.
    // An emulated path is always explained in the endpoint's notes.
    if (info.rdma_write == Support::kEmulated) CHILD_CHECK(!info.notes.empty());
    std::vector<uint8_t> data(5000), back(5000);
    Fill(data.data(), data.size(), 77);
    CHILD_OK(c.ep->Write(data.data(), data.size(), nullptr, key->addr + 100, *key, 1));
    CHILD_OK(WaitOk(c.cq.get()).status());
    CHILD_OK(c.ep->Read(back.data(), back.size(), nullptr, key->addr + 100, *key, 2));
    CHILD_OK(WaitOk(c.cq.get()).status());
    CHILD_CHECK(Check(back.data(), back.size(), 77));
    CHILD_OK(SendBlob(c.ep.get(), info.rdma_write == Support::kEmulated ? "emulated" : "native"));
    return 0;
  });
  close(pipefd[1]);
  char ok = 0;
  ASSERT_EQ(read(pipefd[0], &ok, 1), 1);
  close(pipefd[0]);
  if (!ok) {
    EXPECT_EQ(Reap(child), 0);
    GTEST_SKIP() << "setuid(65534) failed here (a user namespace without that uid?)";
  }
  auto accepted = listener_->Accept(cq_.get(), kOpTimeout);
  if (!accepted.ok() && accepted.status().code() == absl::StatusCode::kFailedPrecondition) {
    EXPECT_EQ(Reap(child), 3) << "only this side refused the peer of another user";
    GTEST_SKIP() << "peers of different users cannot connect here, and both sides say so: "
                 << accepted.status().message();
  }
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  auto ep = std::move(*accepted);
  ASSERT_TRUE(SendBlob(ep.get(), (*mr)->remote_key().Serialize()).ok());
  auto how = RecvBlob(ep.get());
  ASSERT_TRUE(how.ok()) << how.status();
  if (fabric_->caps().provider == "unet") {
    EXPECT_EQ(*how, "emulated");
  }
  EXPECT_TRUE(Check(target.data() + 100, 5000, 77));
  EXPECT_EQ(Reap(child), 0);
}

// Fetch-add and compare-and-swap from two processes at once: exact totals.
TEST_P(Conformance, AtomicsUnderContentionFromTwoProcesses) {
  constexpr int kOps = 2000;
  alignas(64) static uint64_t words[2];
  words[0] = 0;
  words[1] = 0;
  auto mr = fabric_->RegisterMemory(words, sizeof(words), kAccessAll);
  ASSERT_TRUE(mr.ok()) << mr.status();
  auto client = [&](int id) {
    return [&, id] {
      ChildConn c = ChildConnect();
      auto key = RecvKey(c.ep.get());
      CHILD_OK(key.status());
      std::vector<uint64_t> seen;
      for (int i = 0; i < kOps; ++i) {
        uint64_t old = ~0ull;
        CHILD_OK(c.ep->FetchAdd(&old, key->addr, *key, 1, i));
        auto comp = WaitOk(c.cq.get());
        CHILD_OK(comp.status());
        CHILD_CHECK(comp->op == OpType::kFetchAdd);
        seen.push_back(old);
      }
      // fetch-add returns strictly increasing old values to one client.
      for (size_t i = 1; i < seen.size(); ++i) CHILD_CHECK(seen[i] > seen[i - 1]);
      // CAS increment loop on the second word.
      for (int i = 0; i < kOps; ++i) {
        uint64_t expected = 0;
        for (;;) {
          uint64_t old = 0;
          CHILD_OK(c.ep->CompareSwap(&old, key->addr + 8, *key, expected, expected + 1, i));
          auto comp = WaitOk(c.cq.get());
          CHILD_OK(comp.status());
          if (old == expected) break;
          expected = old;
        }
      }
      CHILD_OK(SendBlob(c.ep.get(), absl::StrCat("done", id)));
      return 0;
    };
  };
  pid_t a = Spawn(client(1));
  pid_t b = Spawn(client(2));
  auto ea = AcceptOne();
  auto eb = AcceptOne();
  ASSERT_NE(ea, nullptr);
  ASSERT_NE(eb, nullptr);
  std::string key = (*mr)->remote_key().Serialize();
  ASSERT_TRUE(SendBlob(ea.get(), key).ok());
  ASSERT_TRUE(SendBlob(eb.get(), key).ok());
  std::string ba(64, 0), bb(64, 0);
  ASSERT_TRUE(ea->PostRecv(ba.data(), ba.size(), nullptr, 1).ok());
  ASSERT_TRUE(eb->PostRecv(bb.data(), bb.size(), nullptr, 2).ok());
  int done = 0;
  while (done < 2) {
    auto c = WaitOk(cq_.get());
    ASSERT_TRUE(c.ok()) << c.status();
    if (c->op == OpType::kRecv) ++done;
  }
  EXPECT_EQ(__atomic_load_n(&words[0], __ATOMIC_SEQ_CST), uint64_t{2 * kOps});
  EXPECT_EQ(__atomic_load_n(&words[1], __ATOMIC_SEQ_CST), uint64_t{2 * kOps});
  EXPECT_EQ(Reap(a), 0);
  EXPECT_EQ(Reap(b), 0);
}

// Atomics on memory from AllocateRegistered from two processes: exact
// totals. Where the provider says they are native, the target does not poll
// its CQ at all while they run: they must not need its progress.
TEST_P(Conformance, AtomicsOnAllocatedMemory) {
  constexpr int kOps = 5000;
  auto mr = fabric_->AllocateRegistered(64, kAccessAll);
  ASSERT_TRUE(mr.ok()) << mr.status();
  auto* words = static_cast<uint64_t*>((*mr)->addr());
  const bool native = fabric_->caps().atomics_allocated == Support::kNative;
  auto client = [&] {
    return [&]() -> int {
      ChildConn c = ChildConnect();
      auto key = RecvKey(c.ep.get());
      CHILD_OK(key.status());
      for (int i = 0; i < kOps; ++i) {
        uint64_t old = 0;
        CHILD_OK(c.ep->FetchAdd(&old, key->addr, *key, 3, i));
        CHILD_OK(WaitOk(c.cq.get()).status());
        uint64_t expected = __atomic_load_n(&old, __ATOMIC_RELAXED) % 7;
        for (;;) {  // CAS increment of the second word
          uint64_t seen = 0;
          CHILD_OK(c.ep->CompareSwap(&seen, key->addr + 8, *key, expected, expected + 1, i));
          CHILD_OK(WaitOk(c.cq.get()).status());
          if (seen == expected) break;
          expected = seen;
        }
      }
      return 0;
    };
  };
  pid_t a = Spawn(client());
  pid_t b = Spawn(client());
  auto ea = AcceptOne();
  auto eb = AcceptOne();
  ASSERT_NE(ea, nullptr);
  ASSERT_NE(eb, nullptr);
  std::string key = (*mr)->remote_key().Serialize();
  ASSERT_TRUE(SendBlob(ea.get(), key).ok());
  ASSERT_TRUE(SendBlob(eb.get(), key).ok());
  if (native) {
    // No Poll, no Wait: just wait for the children to finish.
    EXPECT_EQ(Reap(a, absl::Seconds(60)), 0);
    EXPECT_EQ(Reap(b, absl::Seconds(60)), 0);
  } else {
    int exited = 0;
    std::vector<pid_t> kids = {a, b};
    absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (exited < 2 && absl::Now() < deadline) {
      Completion c;
      cq_->Wait(std::span<Completion>(&c, 1), absl::Milliseconds(10)).IgnoreError();
      for (pid_t& k : kids) {
        int status;
        if (k > 0 && waitpid(k, &status, WNOHANG) == k) {
          EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
          k = 0;
          ++exited;
        }
      }
    }
    EXPECT_EQ(exited, 2);
  }
  EXPECT_EQ(__atomic_load_n(&words[0], __ATOMIC_SEQ_CST), uint64_t{2 * 3 * kOps});
  EXPECT_EQ(__atomic_load_n(&words[1], __ATOMIC_SEQ_CST), uint64_t{2 * kOps});
}

// RDMA read and write of memory from AllocateRegisteredFor, by that
// endpoint's peer: byte-exact both ways, and a read past the region is
// refused. Where the provider says such RMA is native (rma_allocated, the
// initiator copies through its own mapping: unet), the target does not
// poll its CQ at all meanwhile.
TEST_P(Conformance, RmaOnMemoryAllocatedForAPeer) {
  if (fabric_->caps().rdma_read == Support::kNone || fabric_->caps().rdma_write == Support::kNone) {
    GTEST_SKIP() << "no RDMA read/write on " << GetParam();
  }
  const size_t max_rma = fabric_->caps().max_rma_size;
  const size_t kHalf = std::min<size_t>(128 << 10, max_rma > 0 ? max_rma : size_t{128} << 10);
  pid_t child = Spawn([&] {
    ChildConn c = ChildConnect();
    auto key = RecvKey(c.ep.get());
    CHILD_OK(key.status());
    std::vector<uint8_t> in(kHalf), out(kHalf);
    CHILD_OK(c.ep->Read(in.data(), kHalf, nullptr, key->addr, *key, 1));
    CHILD_OK(WaitOk(c.cq.get()).status());
    for (size_t i = 0; i < kHalf; ++i) CHILD_CHECK(in[i] == static_cast<uint8_t>(i * 7 + 1));
    for (size_t i = 0; i < kHalf; ++i) out[i] = static_cast<uint8_t>(i * 5 + 3);
    CHILD_OK(c.ep->Write(out.data(), kHalf, nullptr, key->addr + kHalf, *key, 2));
    CHILD_OK(WaitOk(c.cq.get()).status());
    // Past the end: refused at the call or by its completion.
    absl::Status past = c.ep->Read(in.data(), 64, nullptr, key->addr + 2 * kHalf - 32, *key, 3);
    if (past.ok()) past = WaitOk(c.cq.get()).status();
    CHILD_CHECK(!past.ok());
    return 0;
  });
  auto ep = AcceptOne();
  ASSERT_NE(ep, nullptr);
  auto mr = fabric_->AllocateRegisteredFor(ep.get(), 2 * kHalf, kAccessAll);
  ASSERT_TRUE(mr.ok()) << mr.status();
  auto* mem = static_cast<uint8_t*>((*mr)->addr());
  for (size_t i = 0; i < kHalf; ++i) mem[i] = static_cast<uint8_t>(i * 7 + 1);
  ASSERT_TRUE(SendBlob(ep.get(), (*mr)->remote_key().Serialize()).ok());
  if (fabric_->caps().rma_allocated == Support::kNative) {
    EXPECT_EQ(Reap(child, absl::Seconds(60)), 0);  // no Poll, no Wait
  } else {
    int status = 0;
    bool exited = false;
    absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (!exited && absl::Now() < deadline) {
      Completion c;
      cq_->Wait(std::span<Completion>(&c, 1), absl::Milliseconds(10)).IgnoreError();
      if (waitpid(child, &status, WNOHANG) == child) exited = true;
    }
    ASSERT_TRUE(exited);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  size_t bad = 0;
  for (size_t i = 0; i < kHalf; ++i) bad += mem[kHalf + i] != static_cast<uint8_t>(i * 5 + 3);
  EXPECT_EQ(bad, 0u);
}

// A remote key used outside its bounds or rights is refused, and the
// target's memory around it is untouched. A refused access may end the
// connection (as a remote access error does to an RC queue pair), so each
// case runs on a connection of its own.
TEST_P(Conformance, RemoteKeyOutOfBoundsIsRefused) {
  std::vector<uint8_t> memory(3 * 4096, 0x5a);
  uint8_t* region = memory.data() + 4096;
  auto mr = fabric_->RegisterMemory(region, 4096, kRemoteRead);  // read-only
  ASSERT_TRUE(mr.ok()) << mr.status();
  const std::string key_bytes = (*mr)->remote_key().Serialize();
  // Each case: what the child does with the key; true = must be refused.
  using Op = std::function<absl::Status(Endpoint*, const RemoteKey&, uint8_t*)>;
  struct Case {
    const char* name;
    Op op;
    bool refused;
  };
  const std::vector<Case> cases = {
      {"read past the end", [](Endpoint* ep, const RemoteKey& k, uint8_t* b) {
         return ep->Read(b, 16, nullptr, k.addr + 4090, k, 1); }, true},
      {"read before the start", [](Endpoint* ep, const RemoteKey& k, uint8_t* b) {
         return ep->Read(b, 8, nullptr, k.addr - 8, k, 2); }, true},
      {"read longer than the region", [](Endpoint* ep, const RemoteKey& k, uint8_t* b) {
         return ep->Read(b, 8192, nullptr, k.addr, k, 3); }, true},
      // Inside the forged range, outside the real one, under virtual and
      // offset addressing alike (offsets count from the key's claimed base).
      {"forged wider key", [](Endpoint* ep, const RemoteKey& k, uint8_t* b) {
         RemoteKey forged = k;
         forged.addr -= 4096;
         forged.length += 8192;
         return ep->Read(b, 16, nullptr, k.addr + 4096, forged, 4); }, true},
      {"write through a read-only key", [](Endpoint* ep, const RemoteKey& k, uint8_t* b) {
         return ep->Write(b, 8, nullptr, k.addr, k, 5); }, true},
      {"atomic through a read-only key", [](Endpoint* ep, const RemoteKey& k, uint8_t* b) {
         static uint64_t old;
         return ep->FetchAdd(&old, k.addr, k, 1, 6); }, true},
      {"valid read", [](Endpoint* ep, const RemoteKey& k, uint8_t* b) {
         return ep->Read(b, 4096, nullptr, k.addr, k, 7); }, false},
  };
  // All children fork before any endpoint exists (the suite's fork rule),
  // then connect in any order; each runs its own case.
  std::vector<pid_t> children;
  for (const Case& c : cases) {
    children.push_back(Spawn([&]() -> int {
      ChildConn conn = ChildConnect();
      auto key = RecvKey(conn.ep.get());
      CHILD_OK(key.status());
      std::vector<uint8_t> buf(8192, 0x11);
      absl::Status st = c.op(conn.ep.get(), *key, buf.data());
      if (st.ok()) {  // accepted: the verdict comes in the completion
        auto comp = WaitOne(conn.cq.get());
        CHILD_OK(comp.status());
        st = comp->status;
      }
      if (c.refused) {
        if (st.ok()) ChildFail(__FILE__, __LINE__, std::string(c.name) + " was not refused");
      } else {
        CHILD_OK(st);
        for (size_t i = 0; i < 4096; ++i) CHILD_CHECK(buf[i] == 0x5a);
      }
      return 0;
    }));
  }
  // Every child's handshake first, then the keys: a key's send waits for
  // the provider's connection to that child (rxm connects on first use),
  // and under a loaded CI machine seven of those one after another kept
  // the last children's handshakes waiting past their timeout.
  std::vector<std::unique_ptr<Endpoint>> eps;
  for (size_t i = 0; i < cases.size(); ++i) {
    eps.push_back(AcceptOne());
    ASSERT_NE(eps.back(), nullptr);
  }
  for (auto& ep : eps) {
    absl::Status st = SendBlob(ep.get(), key_bytes);
    ASSERT_TRUE(st.ok()) << st;
  }
  // The target keeps progressing (emulated accesses are served by it) until
  // every child is done.
  std::map<pid_t, int> exits;
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (exits.size() < children.size() && absl::Now() < deadline) {
    Completion comp;
    cq_->Wait(std::span<Completion>(&comp, 1), absl::Milliseconds(10)).IgnoreError();
    for (pid_t pid : children) {
      int status = 0;
      if (!exits.contains(pid) && waitpid(pid, &status, WNOHANG) == pid) exits[pid] = status;
    }
  }
  for (size_t i = 0; i < children.size(); ++i) {
    auto it = exits.find(children[i]);
    ASSERT_NE(it, exits.end()) << cases[i].name << ": the child did not finish";
    EXPECT_TRUE(WIFEXITED(it->second) && WEXITSTATUS(it->second) == 0)
        << cases[i].name << ": status " << it->second;
  }
  for (size_t i = 0; i < memory.size(); ++i) ASSERT_EQ(memory[i], 0x5a) << "byte " << i;
}

// Registration cache: hits, LRU eviction and invalidation on munmap; the
// stale key is refused by the target afterwards.
TEST_P(Conformance, RegistrationCacheHitsEvictsAndInvalidates) {
  const size_t len = 64 * 1024;
  void* mem = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  RegistrationCache& cache = fabric_->rcache();
  RcacheStats before = cache.stats();
  auto r1 = cache.Get(mem, len, kAccessAll);
  ASSERT_TRUE(r1.ok()) << r1.status();
  auto r2 = cache.Get(static_cast<uint8_t*>(mem) + 100, 1000, kRemoteRead);
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(r1->get(), r2->get()) << "a covered sub-range must hit the cache";
  RcacheStats mid = cache.stats();
  EXPECT_EQ(mid.hits - before.hits, 1u);
  EXPECT_EQ(mid.misses - before.misses, 1u);
  std::string key = (*r1)->remote_key().Serialize();
  r2->reset();
  r1->reset();

  pid_t child = Spawn([&] {
    ChildConn c = ChildConnect();
    auto k = RecvKey(c.ep.get());
    CHILD_OK(k.status());
    uint64_t v = 0;
    CHILD_OK(c.ep->Read(&v, 8, nullptr, k->addr, *k, 1));
    CHILD_OK(WaitOk(c.cq.get()).status());
    CHILD_OK(SendBlob(c.ep.get(), "read1"));
    auto go = RecvBlob(c.ep.get());  // parent has unmapped the memory
    CHILD_OK(go.status());
    absl::Status st = c.ep->Read(&v, 8, nullptr, k->addr, *k, 2);
    if (st.ok()) {
      auto comp = WaitOne(c.cq.get());
      CHILD_OK(comp.status());
      st = comp->status;
    }
    CHILD_CHECK(!st.ok());  // the stale key is refused (the exit code says so:
    return 0;               // a refused access may end the connection)
  });
  auto ep = AcceptOne();
  ASSERT_NE(ep, nullptr);
  ASSERT_TRUE(SendBlob(ep.get(), key).ok());
  auto r = RecvBlob(ep.get());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(munmap(mem, len), 0);
  EXPECT_EQ(cache.stats().invalidations - before.invalidations, 1u);
  // A new mapping, possibly at the same address, is registered anew.
  void* again = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(again, MAP_FAILED);
  uint64_t misses = cache.stats().misses;
  auto r3 = cache.Get(again, len, kAccessAll);
  ASSERT_TRUE(r3.ok());
  EXPECT_EQ(cache.stats().misses, misses + 1);
  ASSERT_TRUE(SendBlob(ep.get(), "go").ok());
  int status = 0;
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (waitpid(child, &status, WNOHANG) != child && absl::Now() < deadline) {
    Completion comp;  // keep serving: the refusal may come from our progress
    cq_->Wait(std::span<Completion>(&comp, 1), absl::Milliseconds(10)).IgnoreError();
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the stale key was not refused";
  r3->reset();
  munmap(again, len);

  // Eviction: more unused registrations than the cache keeps. The pages are
  // one apart so that no two registrations overlap (and merge).
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  auto* pages = static_cast<uint8_t*>(
      mmap(nullptr, 16 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(pages, MAP_FAILED);
  {
    RegistrationCache small(
        [this](void* a, size_t l, uint32_t acc) { return fabric_->RegisterMemory(a, l, acc); },
        RcacheLimits{1 << 30, 4});
    for (int i = 0; i < 8; ++i) ASSERT_TRUE(small.Get(pages + 2 * i * page, 100, kAccessAll).ok());
    EXPECT_EQ(small.stats().entries, 4u);
    EXPECT_EQ(small.stats().evictions, 4u);
    // The most recent four are the ones kept: they hit.
    uint64_t hits = small.stats().hits;
    for (int i = 4; i < 8; ++i) ASSERT_TRUE(small.Get(pages + 2 * i * page, 100, kAccessAll).ok());
    EXPECT_EQ(small.stats().hits, hits + 4);
  }
  munmap(pages, 16 * page);
}

// Waiting through the CQ fd inside the application's own epoll set.
TEST_P(Conformance, WaitThroughCqFdInEpoll) {
  pid_t child = Spawn([&] {
    ChildConn c = ChildConnect();
    auto go = RecvBlob(c.ep.get());
    CHILD_OK(go.status());
    absl::SleepFor(absl::Milliseconds(200));  // parent is asleep in epoll_wait
    CHILD_OK(SendBlob(c.ep.get(), "wake up"));
    // Stay connected until the parent has seen the message: our exit would
    // wake it through the connection's end, hiding a missing wakeup.
    auto bye = RecvBlob(c.ep.get());
    CHILD_OK(bye.status());
    return 0;
  });
  auto ep = AcceptOne();
  ASSERT_NE(ep, nullptr);
  std::string buf(64, 0);
  ASSERT_TRUE(ep->PostRecv(buf.data(), buf.size(), nullptr, 9).ok());
  ASSERT_TRUE(SendBlob(ep.get(), "go").ok());
  int epfd = epoll_create1(EPOLL_CLOEXEC);
  ASSERT_GE(epfd, 0);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 42;
  ASSERT_EQ(epoll_ctl(epfd, EPOLL_CTL_ADD, cq_->wait_fd(), &ev), 0);
  Completion c;
  bool got = false;
  int wakeups = 0;
  absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!got && absl::Now() < deadline) {
    if (cq_->Arm()) {
      epoll_event out{};
      int n = epoll_wait(epfd, &out, 1, 20000);
      ASSERT_GE(n, 0);
      if (n == 1) {
        EXPECT_EQ(out.data.u64, 42u);
        ++wakeups;
      }
    }
    if (cq_->Poll(std::span<Completion>(&c, 1)) == 1) got = true;
  }
  ASSERT_TRUE(got) << "epoll on the CQ fd never reported the message";
  EXPECT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(c.context, 9u);
  EXPECT_EQ(buf.substr(0, c.length), "wake up");
  EXPECT_GE(wakeups, 1);
  // Idle now: a wake-up that has been served must not leave the fd
  // readable, or every later sleep returns at once (a hidden busy loop; the
  // engine's leader spun like that on unet). Providers without a wait
  // object wake on a timer that backs off to 1 ms: a few hundred wake-ups
  // in 300 ms at most; a stuck fd gives tens of thousands.
  int idle_wakeups = 0;
  const absl::Time idle_end = absl::Now() + absl::Milliseconds(300);
  for (absl::Time now = absl::Now(); now < idle_end; now = absl::Now()) {
    if (cq_->Arm()) {
      epoll_event out{};
      int ms = static_cast<int>(absl::ToInt64Milliseconds(idle_end - now)) + 1;
      if (epoll_wait(epfd, &out, 1, ms) == 1) ++idle_wakeups;
    }
    ASSERT_EQ(cq_->Poll(std::span<Completion>(&c, 1)), 0u) << "a completion from nowhere";
  }
  EXPECT_LT(idle_wakeups, 1000) << "the CQ fd stays readable with nothing to do";
  close(epfd);
  ASSERT_TRUE(SendBlob(ep.get(), "bye").ok());
  EXPECT_EQ(Reap(child), 0);
}

// A wake-up stays on wait_fd until the next Arm: a thread that merely polls
// (the SDP engine's application threads beside its sleeping progress
// thread) must not swallow it, or the sleeper's poll(2) goes back to sleep.
TEST_P(Conformance, PollLeavesTheWakeupForTheSleeper) {
  auto readable = [&] {
    pollfd p{cq_->wait_fd(), POLLIN, 0};
    return ::poll(&p, 1, 0) == 1;
  };
  ASSERT_TRUE(cq_->Arm());
  cq_->Wake();
  EXPECT_TRUE(readable());
  Completion c;
  EXPECT_EQ(cq_->Poll(std::span<Completion>(&c, 1)), 0u);
  EXPECT_TRUE(readable()) << "Poll drained the wake-up meant for a thread asleep on wait_fd";
  EXPECT_TRUE(cq_->Arm());  // takes it
}

// A thread asleep in Wait wakes when another thread creates its completion:
// a send completing at once, and a receive posted for a message that had
// already arrived.
TEST_P(Conformance, WaitWakesForWorkFromAnotherThread) {
  if (!fabric_->caps().thread_safe) {
    GTEST_SKIP() << "a single-threaded configuration (one thread at a time calls into the "
                    "fabric): this test posts from one thread while another waits";
  }
  pid_t child = Spawn([&] {
    ChildConn c = ChildConnect();
    CHILD_OK(SendBlob(c.ep.get(), "early"));  // arrives before any receive
    auto done = RecvBlob(c.ep.get());
    CHILD_OK(done.status());
    return 0;
  });
  auto ep = AcceptOne();
  ASSERT_NE(ep, nullptr);
  absl::SleepFor(absl::Milliseconds(200));  // "early" is waiting, unmatched
  char buf[64] = {};
  for (int round = 0; round < 2; ++round) {
    Completion c;
    absl::Duration took;
    std::thread waiter([&] {
      absl::Time start = absl::Now();
      auto n = cq_->Wait(std::span<Completion>(&c, 1), absl::Seconds(20));
      took = absl::Now() - start;
      EXPECT_TRUE(n.ok() && *n == 1);
    });
    absl::SleepFor(absl::Milliseconds(100));  // the waiter is asleep by now
    if (round == 0) {
      ASSERT_TRUE(ep->PostRecv(buf, sizeof(buf), nullptr, 7).ok());
    } else {
      ASSERT_TRUE(ep->Send("done", 4, nullptr, 8).ok());
    }
    waiter.join();
    EXPECT_TRUE(c.status.ok()) << c.status;
    EXPECT_EQ(c.context, round == 0 ? 7u : 8u);
    EXPECT_LT(took, absl::Seconds(10)) << "round " << round << ": the waiter was not woken";
  }
  EXPECT_EQ(std::string(buf, 5), "early");
  EXPECT_EQ(Reap(child), 0);
}

// A peer killed with SIGKILL mid-transfer fails our operations within one
// second instead of hanging: sends towards it and receives from it.
TEST_P(Conformance, PeerKilledMidTransferFailsOperations) {
  pid_t child = Spawn([&]() -> int {
    ChildConn c = ChildConnect();
    // Receive a little, then stall until killed.
    std::vector<uint8_t> buf(1 << 20);
    CHILD_OK(c.ep->PostRecv(buf.data(), buf.size(), nullptr, 1));
    CHILD_OK(WaitOk(c.cq.get()).status());
    // Start sending a large message the parent will not fully receive.
    std::vector<uint8_t> big(64 << 20, 7);
    CHILD_OK(c.ep->Send(big.data(), big.size(), nullptr, 2));
    for (;;) pause();
  });
  auto ep = AcceptOne();
  ASSERT_NE(ep, nullptr);
  std::vector<uint8_t> msg(1 << 20, 3);
  // Many sends outstanding towards a peer that stops receiving.
  constexpr int kSends = 64;
  for (int i = 0; i < kSends; ++i) ASSERT_TRUE(ep->Send(msg.data(), msg.size(), nullptr, i).ok());
  // And a receive for the child's 64 MiB message, which never finishes.
  std::vector<uint8_t> in(1 << 20);
  ASSERT_TRUE(ep->PostRecv(in.data(), in.size(), nullptr, 1000).ok());
  // Every operation must complete exactly once: before or after the kill.
  std::map<uint64_t, int> seen;
  int errors = 0;
  bool recv_failed = false;
  auto tally = [&](const Completion& c) {
    ++seen[c.context];
    if (!c.status.ok()) {
      ++errors;
      if (c.op == OpType::kRecv) recv_failed = true;
    }
  };
  absl::SleepFor(absl::Milliseconds(300));
  Completion drain[64];
  for (size_t n = cq_->Poll(drain), i = 0; i < n; ++i) tally(drain[i]);
  ASSERT_EQ(kill(child, SIGKILL), 0);
  absl::Time killed = absl::Now();
  EXPECT_EQ(Reap(child), -SIGKILL);
  absl::Time last_failure = killed;
  while (seen.size() < kSends + 1) {
    auto c = WaitOne(cq_.get(), absl::Seconds(2));
    if (!c.ok()) break;
    if (!c->status.ok()) last_failure = absl::Now();
    tally(*c);
  }
  EXPECT_EQ(seen.size(), size_t{kSends + 1}) << "operations never completed";
  for (const auto& [ctx, count] : seen) EXPECT_EQ(count, 1) << "context " << ctx;
  EXPECT_GT(errors, 0);
  EXPECT_TRUE(recv_failed) << "the receive from the killed peer never failed";
  EXPECT_LT(last_failure - killed, absl::Seconds(1))
      << "operations failed only " << (last_failure - killed) << " after the kill";
  // Nothing more arrives.
  Completion extra;
  EXPECT_EQ(cq_->Poll(std::span<Completion>(&extra, 1)), 0u);
  // New operations fail at once.
  EXPECT_FALSE(ep->Send(msg.data(), 10, nullptr, 9999).ok());
}

// 64 endpoints from one child process on one CQ, all live at once.
TEST_P(Conformance, SixtyFourConcurrentEndpoints) {
  constexpr int kEndpoints = 64;
  pid_t child = Spawn([&] {
    ChildConns conns = ChildConnectMany(kEndpoints);
    auto& eps = conns.eps;
    CompletionQueue* cq = conns.cq.get();
    std::vector<std::string> in(kEndpoints, std::string(64, 0));
    std::vector<std::string> out(kEndpoints);
    for (int i = 0; i < kEndpoints; ++i) {
      CHILD_OK(eps[i]->PostRecv(in[i].data(), in[i].size(), nullptr, 1000 + i));
      out[i] = absl::StrCat("endpoint ", i);
      CHILD_OK(eps[i]->Send(out[i].data(), out[i].size(), nullptr, i));
    }
    int recvs = 0, sends = 0;
    while (recvs < kEndpoints || sends < kEndpoints) {
      auto c = WaitOk(cq);
      CHILD_OK(c.status());
      if (c->op == OpType::kSend) { ++sends; continue; }
      int i = static_cast<int>(c->context) - 1000;
      CHILD_CHECK(i >= 0 && i < kEndpoints);
      CHILD_CHECK(in[i].substr(0, c->length) == absl::StrCat("reply ", i));
      ++recvs;
    }
    return 0;
  });
  std::vector<std::unique_ptr<Endpoint>> eps;
  for (int i = 0; i < kEndpoints; ++i) {
    eps.push_back(AcceptOne());
    ASSERT_NE(eps.back(), nullptr);
  }
  std::vector<std::string> in(kEndpoints, std::string(64, 0));
  for (int i = 0; i < kEndpoints; ++i) {
    ASSERT_TRUE(eps[i]->PostRecv(in[i].data(), in[i].size(), nullptr, i).ok());
  }
  std::vector<std::string> replies(kEndpoints);
  int recvs = 0, sends = 0;
  while (recvs < kEndpoints || sends < kEndpoints) {
    auto c = WaitOk(cq_.get());
    ASSERT_TRUE(c.ok()) << c.status();
    if (c->op == OpType::kSend) { ++sends; continue; }
    int i = static_cast<int>(c->context);
    ASSERT_EQ(c->endpoint, eps[i].get());
    std::string got = in[i].substr(0, c->length);
    int n = std::stoi(got.substr(9));
    replies[i] = absl::StrCat("reply ", n);
    ASSERT_TRUE(eps[i]->Send(replies[i].data(), replies[i].size(), nullptr, 100 + i).ok());
    ++recvs;
  }
  EXPECT_EQ(Reap(child), 0);
}

// Sustained traffic among 40 endpoints per CQ, more than unet and ucx poll
// one by one (both then look only where a peer signalled: unet's CQ bell,
// ucx's control-bit probe). Round trips on endpoints picked at random, some
// after a pause long enough for the child's CQ to fall asleep; a receive
// posted after its message arrived; then a burst on one endpoint far beyond
// what the provider buffers, drained by a peer with 4 receives posted. A
// message the CQ failed to look at would hang here (the waits time out).
TEST_P(Conformance, TrafficAmongManyEndpointsOnOneCq) {
  // An open bug, not a limit of this host: in one of about 150 runs
  // (2026-11-24, a clean-clone CI under ASan) over rxm with FI_WAIT_FD CQs
  // and no timer, the first message on one of the 40 endpoints (round 3)
  // never reached the sleeping child within 30 s. Not reproduced in about
  // 250 later runs, under load too. Suspected: rxm's lazily made
  // connection, whose CM progress libfabric rate-limits. cq_wait=fd now
  // has a backstop timer, which bounds such a stall to backstop_ms; only
  // the configuration without it (backstop_ms=0) skips. docs/ofi.md, "Left".
  if (absl::StrContains(GetParam(), "ofi_rxm") &&
      absl::StrContains(GetParam(), "backstop_ms=0")) {
    GTEST_SKIP() << "open bug over rxm with FI_WAIT_FD and no backstop timer: a first message "
                    "among 40 endpoints was once not delivered within 30 s (docs/ofi.md, \"Left\")";
  }
  constexpr int kEndpoints = 40;
  constexpr int kRounds = 300;
  constexpr int kBurst = 1000;
  constexpr int kBurstEp = 7, kLateEp = 21, kDoneEp = 33;
  struct Msg {
    uint32_t round;
    uint32_t ep;
  };
  pid_t child = Spawn([&] {
    ChildConns conns = ChildConnectMany(kEndpoints);
    auto& eps = conns.eps;
    CompletionQueue* cq = conns.cq.get();
    std::vector<Msg> in(kEndpoints), echo(kEndpoints);
    auto post = [&](int i) {
      CHILD_OK(eps[i]->PostRecv(&in[i], sizeof(Msg), nullptr, static_cast<uint64_t>(i)));
    };
    for (int i = 0; i < kEndpoints; ++i) {
      if (i != kLateEp && i != kBurstEp) post(i);  // both get theirs later
    }
    auto next_recv = [&] {  // the echoes' send completions are skipped
      for (;;) {
        auto got = WaitOk(cq);
        CHILD_OK(got.status());
        if (got->op != OpType::kSend) return std::move(*got);
      }
    };
    // Round trips: echo each message on its endpoint.
    for (int r = 0; r < kRounds; ++r) {
      Completion c = next_recv();
      const int i = static_cast<int>(c.context);
      CHILD_CHECK(i >= 0 && i < kEndpoints && c.endpoint == eps[i].get());
      CHILD_CHECK(c.length == sizeof(Msg) && in[i].round == static_cast<uint32_t>(r) &&
                  in[i].ep == static_cast<uint32_t>(i));
      // The parent waits for this echo before it sends on i again.
      echo[i] = in[i];
      post(i);
      CHILD_OK(eps[i]->Send(&echo[i], sizeof(Msg), nullptr, 5000));
    }
    // The parent's message on kLateEp has had time to arrive; post for it.
    usleep(20000);
    post(kLateEp);
    Completion late = next_recv();
    CHILD_CHECK(late.context == static_cast<uint64_t>(kLateEp) && in[kLateEp].round == 0xdead);
    // The burst: 4 receives at a time, in order.
    std::vector<Msg> burst(4);
    for (int k = 0; k < 4; ++k) {
      CHILD_OK(eps[kBurstEp]->PostRecv(&burst[k], sizeof(Msg), nullptr, 1000 + k));
    }
    for (int got_n = 0; got_n < kBurst;) {
      Completion got = next_recv();
      const int k = static_cast<int>(got.context) - 1000;
      CHILD_CHECK(k >= 0 && k < 4 && burst[k].round == static_cast<uint32_t>(got_n));
      ++got_n;
      if (got_n + 3 < kBurst) {
        CHILD_OK(eps[kBurstEp]->PostRecv(&burst[k], sizeof(Msg), nullptr, 1000 + k));
      }
    }
    Msg done{0xd0e, kDoneEp};
    CHILD_OK(eps[kDoneEp]->Send(&done, sizeof(done), nullptr, 1));
    for (;;) {
      auto got = WaitOk(cq);
      CHILD_OK(got.status());
      if (got->op == OpType::kSend && got->context == 1) break;
    }
    usleep(100000);  // the endpoints stay a little after the last send
    return 0;
  });
  std::vector<std::unique_ptr<Endpoint>> eps;
  for (int i = 0; i < kEndpoints; ++i) {
    eps.push_back(AcceptOne());
    ASSERT_NE(eps.back(), nullptr);
  }
  std::mt19937 rng(42);
  Msg out{}, back{};
  for (int r = 0; r < kRounds; ++r) {
    const int i = static_cast<int>(rng() % kEndpoints);
    if (i == kLateEp || i == kBurstEp) {  // kept for the late receive and the burst
      --r;
      continue;
    }
    if (r % 10 == 9) usleep(3000);  // the child's CQ spins out and sleeps
    ASSERT_TRUE(eps[i]->PostRecv(&back, sizeof(back), nullptr, 500).ok());
    out = {static_cast<uint32_t>(r), static_cast<uint32_t>(i)};
    ASSERT_TRUE(eps[i]->Send(&out, sizeof(out), nullptr, 600).ok());
    for (int pending = 2; pending > 0; --pending) {
      auto c = WaitOk(cq_.get());
      ASSERT_TRUE(c.ok()) << "round " << r << " on endpoint " << i << ": " << c.status();
      ASSERT_EQ(c->endpoint, eps[i].get());
      if (c->op == OpType::kRecv) {
        ASSERT_EQ(back.round, static_cast<uint32_t>(r));
        ASSERT_EQ(back.ep, static_cast<uint32_t>(i));
      }
    }
  }
  Msg late{0xdead, kLateEp};
  ASSERT_TRUE(eps[kLateEp]->Send(&late, sizeof(late), nullptr, 700).ok());
  ASSERT_TRUE(WaitOk(cq_.get()).ok());
  std::vector<Msg> burst(kBurst);
  for (int k = 0; k < kBurst; ++k) {
    burst[k] = {static_cast<uint32_t>(k), kBurstEp};
    ASSERT_TRUE(eps[kBurstEp]->Send(&burst[k], sizeof(Msg), nullptr, 2000 + k).ok());
  }
  Msg done{};
  ASSERT_TRUE(eps[kDoneEp]->PostRecv(&done, sizeof(done), nullptr, 800).ok());
  int sent = 0;
  bool finished = false;
  while (sent < kBurst || !finished) {
    auto c = WaitOk(cq_.get());
    ASSERT_TRUE(c.ok()) << sent << " of " << kBurst << " burst sends completed: " << c.status();
    if (c->op == OpType::kSend) {
      ASSERT_EQ(c->context, static_cast<uint64_t>(2000 + sent));  // in order
      ++sent;
    } else {
      ASSERT_EQ(c->endpoint, eps[kDoneEp].get());
      ASSERT_EQ(done.round, 0xd0eu);
      finished = true;
    }
  }
  EXPECT_EQ(Reap(child), 0);
}

// Several peers on one CQ; one is killed while the parent sleeps in Wait.
// That endpoint's receive fails promptly and the others, whose liveness
// signals stayed quiet, still work: unet and ofi's RDM endpoints look only
// at the endpoints whose socket or pidfd turned readable, so a wrong pick
// would miss the death or fail a live peer.
TEST_P(Conformance, KilledPeerAmongSeveralFailsOnlyItsEndpoint) {
  constexpr int kPeers = 6;
  std::vector<pid_t> children;
  for (int i = 0; i < kPeers; ++i) {
    children.push_back(Spawn([&]() -> int {
      ChildConn c = ChildConnect();
      for (;;) {
        auto msg = RecvBlob(c.ep.get());
        CHILD_OK(msg.status());
        if (*msg == "pid?") {
          CHILD_OK(SendBlob(c.ep.get(), std::to_string(getpid())));
        } else {
          CHILD_OK(SendBlob(c.ep.get(), *msg));  // the echo ends it
          return 0;
        }
      }
    }));
  }
  std::vector<std::unique_ptr<Endpoint>> eps;
  for (int i = 0; i < kPeers; ++i) {
    eps.push_back(AcceptOne());
    ASSERT_NE(eps.back(), nullptr);
  }
  // Which child is behind which endpoint.
  std::vector<pid_t> pid_of(kPeers);
  for (int i = 0; i < kPeers; ++i) {
    ASSERT_TRUE(SendBlob(eps[i].get(), "pid?").ok());
    auto pid = RecvBlob(eps[i].get());
    ASSERT_TRUE(pid.ok()) << pid.status();
    pid_of[i] = static_cast<pid_t>(std::stol(*pid));
  }
  constexpr int kVictim = 2;
  std::vector<std::string> in(kPeers, std::string(64, '\0'));
  for (int i = 0; i < kPeers; ++i) {
    ASSERT_TRUE(eps[i]->PostRecv(in[i].data(), in[i].size(), nullptr, 100 + i).ok());
  }
  // The parent is asleep in Wait when the peer dies (spin_us is 20 us).
  std::thread killer([&] {
    absl::SleepFor(absl::Milliseconds(200));
    kill(pid_of[kVictim], SIGKILL);
  });
  auto failed = WaitOne(cq_.get(), absl::Seconds(5));
  killer.join();
  EXPECT_EQ(Reap(pid_of[kVictim]), -SIGKILL);
  ASSERT_TRUE(failed.ok()) << "the death of a peer among " << kPeers << " went unnoticed: "
                           << failed.status();
  EXPECT_FALSE(failed->status.ok());
  EXPECT_EQ(failed->context, uint64_t{100 + kVictim}) << failed->status;
  EXPECT_EQ(failed->endpoint, eps[kVictim].get());
  // Nothing else happened to the others, and they still answer.
  Completion extra;
  EXPECT_EQ(cq_->Poll(std::span<Completion>(&extra, 1)), 0u) << extra.status;
  int echoes = 0, sends = 0;
  for (int i = 0; i < kPeers; ++i) {
    if (i == kVictim) continue;
    ASSERT_TRUE(eps[i]->Send("bye", 3, nullptr, 200 + i).ok());
  }
  while (echoes < kPeers - 1 || sends < kPeers - 1) {
    auto c = WaitOne(cq_.get());
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE(c->status.ok()) << "context " << c->context << ": " << c->status;
    if (c->op == OpType::kSend) {
      ++sends;
      continue;
    }
    const int i = static_cast<int>(c->context) - 100;
    ASSERT_TRUE(i >= 0 && i < kPeers && i != kVictim) << c->context;
    EXPECT_EQ(in[i].substr(0, c->length), "bye");
    ++echoes;
  }
  for (int i = 0; i < kPeers; ++i) {
    if (i == kVictim) continue;
    EXPECT_EQ(Reap(pid_of[i]), 0) << "child " << i;
  }
}

// A message longer than the posted receive fails that receive. After it the
// next message arrives intact, or (libfabric tcp drops the connection on a
// truncation, as on a refused access) the connection reports an error:
// nothing arrives wrong and nothing is lost silently.
TEST_P(Conformance, OversizedMessageFailsOnlyThatReceive) {
  pid_t child = Spawn([&] {
    ChildConn c = ChildConnect();
    std::string big(1000, 'x');
    CHILD_OK(SendBlob(c.ep.get(), big));
    CHILD_OK(SendBlob(c.ep.get(), "after"));
    return 0;
  });
  auto ep = AcceptOne();
  ASSERT_NE(ep, nullptr);
  std::string small(10, 0);
  ASSERT_TRUE(ep->PostRecv(small.data(), small.size(), nullptr, 1).ok());
  auto c = WaitOne(cq_.get());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->status.code(), absl::StatusCode::kOutOfRange) << c->status;
  auto next = RecvBlob(ep.get());
  if (fabric_->caps().provider == "unet") {
    ASSERT_TRUE(next.ok()) << next.status();
  }
  if (next.ok()) {
    EXPECT_EQ(*next, "after");
  }
  Reap(child);  // its last send may fail if the connection ended
}

// Every registered configuration, plus the ofi tcp ones with CQs that have
// no wait object (cq_wait=none, for busy pollers): their blocking waits
// take a different path (a timer instead of the CQ's fd, docs/ofi.md);
// ofi:tcp waiting on its CQs' FI_WAIT_FD objects instead of its sockets;
// with no backstop timer, ofi:tcp on its sockets and rxm on its
// FI_WAIT_FD objects (a wake-up they miss then fails a test instead of
// costing a millisecond); and ucx without its worker lock
// (threads=serialized: every test but one calls each fabric from one
// thread, its peers being processes).
std::vector<std::string> SuiteConfigurations() {
  return ConformanceConfigurations(
      {"ofi:tcp;ofi_rxm?iface=lo&cq_wait=none", "ofi:tcp?iface=lo&cq_wait=none",
       "ofi:tcp?iface=lo&cq_wait=fd", "ofi:tcp?iface=lo&backstop_ms=0",
       "ofi:tcp;ofi_rxm?iface=lo&backstop_ms=0", "ucx:tcp?threads=serialized",
       "ucx:posix,cma?threads=serialized"});
}

INSTANTIATE_TEST_SUITE_P(Providers, Conformance,
                         ::testing::ValuesIn(SuiteConfigurations()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name;
                           for (char ch : info.param) {
                             name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace zsock
