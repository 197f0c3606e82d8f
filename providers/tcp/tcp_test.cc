// The tcp provider's own behaviour, beyond the conformance suite: its
// options, peers that are not zsock (plain sockets on either side), a
// message too long for its receive, and a peer that ends mid-message or
// sends garbage (a hand-written peer speaking the wire format of tcp.h).
#include "providers/tcp/tcp.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "core/bootstrap_io.h"
#include "core/sockaddr.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "tests/connect_pair.h"

namespace zsock::tcp {
namespace {

absl::StatusOr<Completion> WaitOne(CompletionQueue* cq,
                                   absl::Duration timeout = absl::Seconds(10)) {
  Completion c;
  auto n = cq->Wait(std::span<Completion>(&c, 1), timeout);
  if (!n.ok()) return n.status();
  if (*n == 0) return absl::DeadlineExceededError("no completion");
  return c;
}

TEST(TcpOptions, UnknownOptionsAndSpecsAreRefusedNamingTheAccepted) {
  auto bogus = Fabric::Open("tcp?bogus=1");
  ASSERT_FALSE(bogus.ok());
  EXPECT_EQ(bogus.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bogus.status().message(), "'bogus'")) << bogus.status();
  EXPECT_TRUE(absl::StrContains(bogus.status().message(), "nodelay=on|off")) << bogus.status();
  auto maybe = Fabric::Open("tcp?nodelay=maybe");
  ASSERT_FALSE(maybe.ok());
  EXPECT_TRUE(absl::StrContains(maybe.status().message(), "nodelay")) << maybe.status();
  auto spec = Fabric::Open("tcp:eth0");
  ASSERT_FALSE(spec.ok());
  EXPECT_TRUE(absl::StrContains(spec.status().message(), "no spec")) << spec.status();
  auto off = Fabric::Open("tcp?nodelay=off");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ((*off)->caps().provider, "tcp");
}

// A plain kernel TCP socket listening on 127.0.0.1, for peers that are
// not zsock.
struct PlainListener {
  PlainListener() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    auto at = ParseSocketAddress("127.0.0.1:0");
    EXPECT_TRUE(at.ok());
    EXPECT_EQ(::bind(fd, at->get(), at->len), 0);
    EXPECT_EQ(::listen(fd, 4), 0);
    address = BoundAddress(fd);
  }
  ~PlainListener() { ::close(fd); }
  int fd;
  std::string address;
};

class TcpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto fabric = Fabric::Open("tcp");
    ASSERT_TRUE(fabric.ok()) << fabric.status();
    fabric_ = std::move(*fabric);
    auto cq = fabric_->CreateCq();
    ASSERT_TRUE(cq.ok()) << cq.status();
    cq_ = std::move(*cq);
    auto listener = fabric_->Listen("");
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_ = std::move(*listener);
  }

  void TearDown() override {
    if (raw_ >= 0) ::close(raw_);
  }

  // A plain socket connected to our listener that says a correct hello,
  // and our endpoint for it (raw_ep_) with a receive posted (context 1).
  void ConnectRawPeer() {
    auto to = ParseSocketAddress(listener_->address());
    raw_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_EQ(::connect(raw_, to->get(), to->len), 0);
    BootstrapIo io(raw_, absl::Now() + absl::Seconds(10), {});
    const std::string hello(reinterpret_cast<const char*>(&kVersion), sizeof(kVersion));
    ASSERT_TRUE(io.SendFrame(kHelloMagic, hello).ok());
    auto ep = listener_->Accept(cq_.get(), absl::Seconds(10));
    ASSERT_TRUE(ep.ok()) << ep.status();
    raw_ep_ = std::move(*ep);
    auto theirs = io.RecvFrame(kHelloMagic, 64);
    ASSERT_TRUE(theirs.ok() && *theirs == hello) << theirs.status();
    ASSERT_TRUE(raw_ep_->PostRecv(recv_buf_, sizeof(recv_buf_), nullptr, 1).ok());
  }
  void RawWrite(const void* data, size_t len) {
    ASSERT_EQ(::write(raw_, data, len), static_cast<ssize_t>(len));
  }

  // Two endpoints of our own: a_ (on a_cq_) connected to b_ (on cq_).
  void ConnectPair() {
    auto cq = fabric_->CreateCq();
    ASSERT_TRUE(cq.ok()) << cq.status();
    a_cq_ = std::move(*cq);
    ConnectThrough(fabric_.get(), listener_.get(), a_cq_.get(), cq_.get(), &a_, &b_);
  }

  std::unique_ptr<Fabric> fabric_;
  std::unique_ptr<CompletionQueue> cq_;
  std::unique_ptr<Listener> listener_;
  int raw_ = -1;
  std::unique_ptr<Endpoint> raw_ep_;
  char recv_buf_[2000];
  std::unique_ptr<CompletionQueue> a_cq_;
  std::unique_ptr<Endpoint> a_, b_;
};

TEST_F(TcpTest, ConnectingToAServerThatIsNotZsockFailsClearly) {
  PlainListener http;
  std::thread server([&] {
    int c = ::accept(http.fd, nullptr, nullptr);
    char buf[64];
    ASSERT_GT(::read(c, buf, sizeof(buf)), 0);  // our hello
    const char reply[] = "HTTP/1.0 400 Bad Request\r\n\r\n";
    ASSERT_EQ(::write(c, reply, sizeof(reply) - 1), static_cast<ssize_t>(sizeof(reply) - 1));
    ::close(c);
  });
  auto ep = fabric_->Connect(http.address, cq_.get(), absl::Seconds(10));
  server.join();
  ASSERT_FALSE(ep.ok());
  EXPECT_EQ(StatusErrno(ep.status()), EPROTO) << ep.status();
  EXPECT_TRUE(absl::StrContains(ep.status().message(), "zsock tcp listener")) << ep.status();
}

TEST_F(TcpTest, ASilentServerTimesOutWithinTheConnectTimeout) {
  PlainListener silent;  // the kernel completes the connection; nobody speaks
  const absl::Time start = absl::Now();
  auto ep = fabric_->Connect(silent.address, cq_.get(), absl::Milliseconds(300));
  ASSERT_FALSE(ep.ok());
  EXPECT_EQ(ep.status().code(), absl::StatusCode::kDeadlineExceeded) << ep.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(TcpTest, AClientThatIsNotZsockIsRefusedAndTheListenerGoesOn) {
  auto to = ParseSocketAddress(listener_->address());
  int junk = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(::connect(junk, to->get(), to->len), 0);
  ASSERT_EQ(::write(junk, "GET / HTTP/1.0\r\n\r\n", 18), 18);
  auto refused = listener_->Accept(cq_.get(), absl::Seconds(10));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(StatusErrno(refused.status()), EPROTO) << refused.status();
  ::close(junk);
  ConnectPair();
}

// Too long for its receive: that receive fails with OutOfRange (EMSGSIZE)
// and the message is dropped, whether it arrives after the receive was
// posted or before; the next message is intact.
TEST_F(TcpTest, AMessageTooLongForItsReceiveFailsOnlyThatReceive) {
  ConnectPair();
  Endpoint* a = a_.get();
  Endpoint* b = b_.get();
  const std::string big(50000, 'x');
  char small[16];
  for (bool posted_first : {true, false}) {
    if (posted_first) {
      ASSERT_TRUE(b->PostRecv(small, sizeof(small), nullptr, 1).ok());
    }
    ASSERT_TRUE(a->Send(big.data(), big.size(), nullptr, 2).ok());
    ASSERT_TRUE(a->Send("after", 5, nullptr, 3).ok());
    if (!posted_first) {
      absl::SleepFor(absl::Milliseconds(50));
      Completion none[1];
      ASSERT_TRUE(cq_->Poll(none) == 0);  // both arrive, unexpected
      ASSERT_TRUE(b->PostRecv(small, sizeof(small), nullptr, 1).ok());
    }
    auto failed = WaitOne(cq_.get());
    ASSERT_TRUE(failed.ok()) << failed.status();
    EXPECT_EQ(failed->context, 1u);
    EXPECT_EQ(failed->status.code(), absl::StatusCode::kOutOfRange) << failed->status;
    EXPECT_EQ(StatusErrno(failed->status), EMSGSIZE);
    ASSERT_TRUE(b->PostRecv(small, sizeof(small), nullptr, 4).ok());
    auto next = WaitOne(cq_.get());
    ASSERT_TRUE(next.ok() && next->status.ok()) << next.status();
    EXPECT_EQ(std::string(small, next->length), "after");
    for (int sends = 0; sends < 2; ++sends) ASSERT_TRUE(WaitOne(a_cq_.get()).ok());
  }
}

// A peer that stops in the middle of a message: the receive it was filling
// fails with Aborted (ECONNRESET) naming the peer, and so do an emulated
// read waiting for its answer and any later send.
TEST_F(TcpTest, APeerEndingMidMessageFailsEveryOperation) {
  ConnectRawPeer();
  Endpoint* ep = raw_ep_.get();
  RemoteKey key{0x10000, 4096, kAccessAll, std::vector<uint8_t>(8)};
  uint64_t word = 0;
  ASSERT_TRUE(ep->Read(&word, 8, nullptr, 0x10000, key, 2).ok());  // never answered
  const FrameHeader h{1000, kUserFrame, {}};
  RawWrite(&h, sizeof(h));
  RawWrite("only ten b", 10);
  ::shutdown(raw_, SHUT_WR);  // the end, with our bytes unread: a FIN, not a reset
  for (int i = 0; i < 2; ++i) {
    auto c = WaitOne(cq_.get());
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->status.code(), absl::StatusCode::kAborted) << c->status;
    EXPECT_EQ(StatusErrno(c->status), ECONNRESET);
    EXPECT_TRUE(absl::StrContains(c->status.message(), ep->info().peer_address)) << c->status;
    if (c->op == OpType::kRecv) {
      EXPECT_TRUE(absl::StrContains(c->status.message(), "middle of a message")) << c->status;
    }
  }
  absl::Status later = ep->Send("x", 1, nullptr, 3);
  EXPECT_EQ(later.code(), absl::StatusCode::kAborted) << later;
}

TEST_F(TcpTest, AMalformedFrameEndsTheConnection) {
  ConnectRawPeer();
  const FrameHeader h{4, 9, {}};  // no such kind
  RawWrite(&h, sizeof(h));
  auto c = WaitOne(cq_.get());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(StatusErrno(c->status), EPROTO) << c->status;
  EXPECT_TRUE(absl::StrContains(c->status.message(), "malformed frame")) << c->status;
}

// Close is graceful: what was sent before it arrives, then the end; the
// closing side's own receives complete with Cancelled.
TEST_F(TcpTest, CloseDeliversWhatWasSentThenEnds) {
  ConnectPair();
  Endpoint* a = a_.get();
  Endpoint* b = b_.get();
  char mine[8];
  ASSERT_TRUE(a->PostRecv(mine, sizeof(mine), nullptr, 9).ok());
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(a->Send("msg", 3, nullptr, i).ok());
  a->Close();
  for (int i = 0; i < 4; ++i) {  // three sends, the receive
    auto c = WaitOne(a_cq_.get());
    ASSERT_TRUE(c.ok()) << c.status();
    if (c->op == OpType::kRecv) {
      EXPECT_EQ(c->status.code(), absl::StatusCode::kCancelled) << c->status;
    }
  }
  char buf[8];
  for (uint64_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(b->PostRecv(buf, sizeof(buf), nullptr, i).ok());
    auto c = WaitOne(cq_.get());
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(c->status.ok()) << c->status;
    EXPECT_EQ(c->length, 3u);
  }
  // The end: refused at once if b saw it already, else by the completion.
  absl::Status end = b->PostRecv(buf, sizeof(buf), nullptr, 3);
  if (end.ok()) {
    auto c = WaitOne(cq_.get());
    ASSERT_TRUE(c.ok()) << c.status();
    end = c->status;
  }
  EXPECT_EQ(end.code(), absl::StatusCode::kAborted) << end;
}

}  // namespace
}  // namespace zsock::tcp
