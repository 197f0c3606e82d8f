#include "core/bootstrap_io.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "core/liveness.h"
#include "core/status.h"
#include "gtest/gtest.h"

namespace zsock {
namespace {

struct Pair {
  Pair() {
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fd), 0);
  }
  ~Pair() {
    for (int f : fd) {
      if (f >= 0) ::close(f);
    }
  }
  int fd[2] = {-1, -1};
};

// `peer` must outlive the BootstrapIo (Options holds views).
BootstrapIo::Options Named(absl::string_view peer) {
  BootstrapIo::Options o;
  o.peer = peer;
  o.fix = "check the test peer";
  return o;
}

TEST(BootstrapIo, MovesEveryByteAcrossManyPartialWrites) {
  Pair p;
  // Larger than a socket buffer: Write must wait for the reader.
  std::string out(4 << 20, '\0');
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(i * 7);
  std::string in(out.size(), '\0');
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  std::thread reader([&] {
    BootstrapIo io(p.fd[1], deadline, Named("the writer"));
    EXPECT_TRUE(io.Read(in.data(), in.size()).ok());
  });
  BootstrapIo io(p.fd[0], deadline, Named("the reader"));
  EXPECT_TRUE(io.Write(out.data(), out.size()).ok());
  reader.join();
  EXPECT_EQ(in, out);
}

TEST(BootstrapIo, ASilentPeerFailsAtTheDeadlineNamingIt) {
  Pair p;
  BootstrapIo io(p.fd[0], absl::Now() + absl::Milliseconds(100), Named("the ucx peer"));
  char c;
  const absl::Time start = absl::Now();
  absl::Status st = io.Read(&c, 1, "the hello");
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(90));
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(StatusErrno(st), ETIMEDOUT);
  EXPECT_NE(st.message().find("the ucx peer did not complete the hello in time"), absl::string_view::npos)
      << st;
  EXPECT_NE(st.message().find("check the test peer"), absl::string_view::npos) << st;
}

TEST(BootstrapIo, AnIdleLimitBoundsEachWaitNotTheExchange) {
  Pair p;
  BootstrapIo::Options o = Named("the bench peer");
  o.idle_limit = absl::Milliseconds(300);
  // The deadline has passed already: with an idle limit it does not count.
  BootstrapIo io(p.fd[0], absl::Now() - absl::Seconds(1), o);
  std::thread writer([&] {
    for (int i = 0; i < 4; ++i) {
      absl::SleepFor(absl::Milliseconds(100));
      char c = static_cast<char>('a' + i);
      EXPECT_EQ(::send(p.fd[1], &c, 1, 0), 1);
    }
  });
  char got[4];
  EXPECT_TRUE(io.Read(got, 4).ok());
  writer.join();
  EXPECT_EQ(std::string(got, 4), "abcd");
  absl::Status st = io.Read(got, 1, "the answer");
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(st.message().find("the bench peer made no progress for 300ms during the answer"), absl::string_view::npos) << st;
}

TEST(BootstrapIo, APeerThatClosesMidMessageIsUnavailable) {
  Pair p;
  ASSERT_EQ(::send(p.fd[1], "ab", 2, 0), 2);
  ::close(p.fd[1]);
  p.fd[1] = -1;
  BootstrapIo io(p.fd[0], absl::Now() + absl::Seconds(5), Named("the ofi peer"));
  char buf[4];
  absl::Status st = io.Read(buf, 4, "the address exchange");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(StatusErrno(st), ECONNRESET);
  EXPECT_NE(st.message().find("the ofi peer closed the connection during the address exchange"), absl::string_view::npos) << st;
  // Writing to the closed peer fails with its errno, and raises no SIGPIPE.
  EXPECT_EQ(StatusErrno(io.Write("x", 1)), EPIPE);
}

TEST(BootstrapIo, FramesRoundTripAndAreChecked) {
  Pair p;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  BootstrapIo a(p.fd[0], deadline, Named("b")), b(p.fd[1], deadline, Named("a"));
  ASSERT_TRUE(a.SendFrame(7, "hello").ok());
  auto got = b.RecvFrame(7, 64);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "hello");
  ASSERT_TRUE(a.SendFrame(7, "").ok());
  EXPECT_EQ(*b.RecvFrame(7, 64), "");
  ASSERT_TRUE(a.SendFrame(8, "x").ok());
  auto wrong_type = b.RecvFrame(7, 64);
  EXPECT_EQ(StatusErrno(wrong_type.status()), EPROTO);
  Pair q;
  BootstrapIo c(q.fd[0], deadline, Named("d")), d(q.fd[1], deadline, Named("c"));
  ASSERT_TRUE(c.SendFrame(7, std::string(65, 'x')).ok());
  auto too_long = d.RecvFrame(7, 64);
  EXPECT_EQ(StatusErrno(too_long.status()), EPROTO);
  EXPECT_NE(too_long.status().message().find("65 bytes"), absl::string_view::npos);
}

TEST(LivenessTicker, DueWhenRequestedOrWhenTheIntervalPassed) {
  LivenessTicker t(/*interval_ns=*/1000);
  EXPECT_TRUE(t.Due(5000)) << "the first look is due";
  EXPECT_FALSE(t.Due(5500));
  t.Request();
  EXPECT_TRUE(t.Due(5600));
  EXPECT_FALSE(t.Due(5700)) << "a request is consumed by the look it causes";
  EXPECT_TRUE(t.Due(6100)) << "the interval passed since the last timed look";
  EXPECT_FALSE(t.Due(6200));
}

}  // namespace
}  // namespace zsock
