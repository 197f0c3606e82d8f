// The busy-polled kernel TCP baseline really polls: while a receive waits
// for data its thread runs (CPU time) and never sleeps (no voluntary
// context switch), where the blocking baseline sleeps; and it keeps the
// kernel's semantics for non-blocking sockets and receive timeouts.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/sockops.h"
#include "gtest/gtest.h"

namespace zsock::bench {
namespace {

// A connected loopback TCP pair made through `ops` (client, server).
struct Pair {
  int client = -1;
  int server = -1;
};

Pair Connect(const SockOps& ops) {
  Pair p;
  int lfd = ops.socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(lfd, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(ops.bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  EXPECT_EQ(ops.listen(lfd, 1), 0);
  socklen_t len = sizeof(sa);
  EXPECT_EQ(ops.getsockname(lfd, reinterpret_cast<sockaddr*>(&sa), &len), 0);
  p.client = ops.socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_EQ(ops.connect(p.client, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  p.server = ops.accept(lfd, nullptr, nullptr);
  EXPECT_GE(p.server, 0);
  ops.close(lfd);
  return p;
}

// This thread's CPU time and voluntary context switches.
struct ThreadUsage {
  absl::Duration cpu;
  long voluntary_switches;
};

ThreadUsage Usage() {
  rusage ru{};
  getrusage(RUSAGE_THREAD, &ru);
  return {absl::DurationFromTimeval(ru.ru_utime) + absl::DurationFromTimeval(ru.ru_stime),
          ru.ru_nvcsw};
}

// Receives one byte that another thread sends after `delay`; returns what
// the receiving thread spent meanwhile.
ThreadUsage WaitForByte(const SockOps& ops, absl::Duration delay) {
  Pair p = Connect(ops);
  std::thread sender([&] {
    absl::SleepFor(delay);
    char c = 'x';
    EXPECT_EQ(::send(p.client, &c, 1, 0), 1);
  });
  const ThreadUsage before = Usage();
  char c = 0;
  EXPECT_EQ(ops.recv(p.server, &c, 1, 0), 1);
  const ThreadUsage after = Usage();
  sender.join();
  EXPECT_EQ(c, 'x');
  ops.close(p.client);
  ops.close(p.server);
  return {after.cpu - before.cpu, after.voluntary_switches - before.voluntary_switches};
}

TEST(KernelTcpBusy, WaitingReceiveRunsAndNeverSleeps) {
  const absl::Duration wait = absl::Milliseconds(300);
  const ThreadUsage busy = WaitForByte(KernelTcpBusyOps(), wait);
  // Runnable throughout: on a loaded machine it shares a core, so ask for
  // a share, not the whole wait.
  EXPECT_GT(busy.cpu, wait / 10) << "the busy receive did not spin";
  EXPECT_EQ(busy.voluntary_switches, 0) << "the busy receive slept in a system call";
}

TEST(KernelTcpBusy, TheBlockingBaselineSleepsInstead) {
  const absl::Duration wait = absl::Milliseconds(300);
  const ThreadUsage blocking = WaitForByte(KernelTcpOps(), wait);
  EXPECT_LT(blocking.cpu, wait / 10);
  EXPECT_GE(blocking.voluntary_switches, 1);
}

TEST(KernelTcpBusy, NonBlockingSocketGetsEagainAtOnce) {
  const SockOps& ops = KernelTcpBusyOps();
  Pair p = Connect(ops);
  const int flags = ops.fcntl(p.server, F_GETFL);
  ASSERT_GE(flags, 0);
  ASSERT_EQ(ops.fcntl(p.server, F_SETFL, flags | O_NONBLOCK), 0);
  char c;
  const absl::Time start = absl::Now();
  EXPECT_EQ(ops.recv(p.server, &c, 1, 0), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  // Blocking again: the next receive waits for the byte.
  ASSERT_EQ(ops.fcntl(p.server, F_SETFL, flags), 0);
  ASSERT_EQ(::send(p.client, "y", 1, 0), 1);
  EXPECT_EQ(ops.recv(p.server, &c, 1, 0), 1);
  EXPECT_EQ(c, 'y');
  ops.close(p.client);
  ops.close(p.server);
}

TEST(KernelTcpBusy, ReceiveTimeoutEndsTheSpin) {
  const SockOps& ops = KernelTcpBusyOps();
  Pair p = Connect(ops);
  timeval tv{.tv_sec = 0, .tv_usec = 200 * 1000};
  ASSERT_EQ(ops.setsockopt(p.server, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
  char c;
  const absl::Time start = absl::Now();
  EXPECT_EQ(ops.recv(p.server, &c, 1, 0), -1);
  EXPECT_EQ(errno, EAGAIN);
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(200));
  EXPECT_LT(took, absl::Seconds(10));
  ops.close(p.client);
  ops.close(p.server);
}

TEST(KernelTcpBusy, PollSpinsUntilReadyOrTimeout) {
  const SockOps& ops = KernelTcpBusyOps();
  Pair p = Connect(ops);
  pollfd pfd{p.server, POLLIN, 0};
  const absl::Time start = absl::Now();
  EXPECT_EQ(ops.poll(&pfd, 1, 100), 0);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  ASSERT_EQ(::send(p.client, "z", 1, 0), 1);
  EXPECT_EQ(ops.poll(&pfd, 1, 10000), 1);
  EXPECT_TRUE(pfd.revents & POLLIN);
  // A peer that closes is an end of stream, not a spin.
  ops.close(p.client);
  char buf[4];
  EXPECT_EQ(ops.recv(p.server, buf, sizeof(buf), 0), 1);
  EXPECT_EQ(ops.recv(p.server, buf, sizeof(buf), 0), 0);
  ops.close(p.server);
}

}  // namespace
}  // namespace zsock::bench
