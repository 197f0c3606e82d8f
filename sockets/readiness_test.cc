// ReadinessFd: the program's poll/select/epoll see exactly the state zsock
// sets, level- and edge-triggered, across threads.
#include "sockets/readiness.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/select.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace zsock {
namespace {

short Revents(int fd) {
  pollfd p{fd, POLLIN | POLLOUT | POLLRDHUP, 0};
  int rc = ::poll(&p, 1, 0);
  EXPECT_GE(rc, 0);
  return rc == 1 ? p.revents : 0;
}

std::unique_ptr<ReadinessFd> Make(bool cloexec = true) {
  auto r = ReadinessFd::Create(cloexec);
  EXPECT_TRUE(r.ok()) << r.status();
  return std::move(*r);
}

TEST(ReadinessFd, StartsWritableNotReadable) {
  auto r = Make();
  EXPECT_EQ(Revents(r->fd()), POLLOUT);
  EXPECT_FALSE(r->readable());
  EXPECT_TRUE(r->writable());
}

TEST(ReadinessFd, EveryCombinationOfReadableAndWritable) {
  auto r = Make();
  for (bool rd : {false, true, false, true}) {
    for (bool wr : {true, false, true, false, true}) {
      r->SetReadable(rd);
      r->SetWritable(wr);
      short want = static_cast<short>((rd ? POLLIN : 0) | (wr ? POLLOUT : 0));
      EXPECT_EQ(Revents(r->fd()), want) << "readable=" << rd << " writable=" << wr;
      EXPECT_EQ(r->readable(), rd);
      EXPECT_EQ(r->writable(), wr);
    }
  }
}

TEST(ReadinessFd, NeitherReadableNorWritableSleepsInPoll) {
  auto r = Make();
  r->SetWritable(false);
  pollfd p{r->fd(), POLLIN | POLLOUT, 0};
  EXPECT_EQ(::poll(&p, 1, 50), 0);
}

TEST(ReadinessFd, SelectAgrees) {
  auto r = Make();
  auto check = [&](bool rd, bool wr) {
    fd_set rs, ws;
    FD_ZERO(&rs);
    FD_ZERO(&ws);
    FD_SET(r->fd(), &rs);
    FD_SET(r->fd(), &ws);
    timeval tv{0, 0};
    ASSERT_GE(::select(r->fd() + 1, &rs, &ws, nullptr, &tv), 0);
    EXPECT_EQ(FD_ISSET(r->fd(), &rs) != 0, rd);
    EXPECT_EQ(FD_ISSET(r->fd(), &ws) != 0, wr);
  };
  check(false, true);
  r->SetReadable(true);
  check(true, true);
  r->SetWritable(false);
  check(true, false);
  r->SetReadable(false);
  check(false, false);
}

int EpollWaitOne(int ep, int timeout_ms, uint32_t* events) {
  epoll_event ev{};
  int n = ::epoll_wait(ep, &ev, 1, timeout_ms);
  if (n == 1) *events = ev.events;
  return n;
}

TEST(ReadinessFd, EpollLevelTriggeredRepeats) {
  auto r = Make();
  int ep = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, r->fd(), &ev), 0);
  uint32_t events = 0;
  EXPECT_EQ(EpollWaitOne(ep, 0, &events), 0);
  r->SetReadable(true);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(EpollWaitOne(ep, 0, &events), 1);
    EXPECT_TRUE(events & EPOLLIN);
  }
  r->SetReadable(false);
  EXPECT_EQ(EpollWaitOne(ep, 0, &events), 0);
  ::close(ep);
}

TEST(ReadinessFd, EpollEdgeTriggeredOneEdgePerTransition) {
  auto r = Make();
  int ep = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLET;
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, r->fd(), &ev), 0);
  uint32_t events = 0;
  // Registration reports the current state (writable) once.
  ASSERT_EQ(EpollWaitOne(ep, 0, &events), 1);
  EXPECT_EQ(events, uint32_t{EPOLLOUT});
  EXPECT_EQ(EpollWaitOne(ep, 0, &events), 0);

  r->SetReadable(true);
  ASSERT_EQ(EpollWaitOne(ep, 0, &events), 1);
  EXPECT_TRUE(events & EPOLLIN);
  EXPECT_EQ(EpollWaitOne(ep, 0, &events), 0) << "an edge, not a level";
  r->SetReadable(true);  // already readable: no new edge, no system call
  EXPECT_EQ(EpollWaitOne(ep, 0, &events), 0);
  r->SetReadable(false);
  r->SetReadable(true);
  ASSERT_EQ(EpollWaitOne(ep, 0, &events), 1);
  EXPECT_TRUE(events & EPOLLIN);

  // Unwritable then writable again: one EPOLLOUT edge.
  r->SetWritable(false);
  EpollWaitOne(ep, 0, &events);  // filling may or may not produce an event
  r->SetWritable(true);
  ASSERT_EQ(EpollWaitOne(ep, 0, &events), 1);
  EXPECT_TRUE(events & EPOLLOUT);
  ::close(ep);
}

TEST(ReadinessFd, WakesAWatcherInAnotherThread) {
  auto r = Make();
  r->SetWritable(false);
  std::atomic<short> seen{0};
  std::thread watcher([&] {
    pollfd p{r->fd(), POLLIN, 0};
    if (::poll(&p, 1, 10000) == 1) seen = p.revents;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  r->SetReadable(true);
  watcher.join();
  EXPECT_EQ(seen.load(), POLLIN);
}

TEST(ReadinessFd, EndOfStreamIsReadableWithRdhupForever) {
  auto r = Make();
  r->SetEndOfStream();
  EXPECT_EQ(Revents(r->fd()), POLLIN | POLLOUT | POLLRDHUP);
  r->SetReadable(false);  // ignored: end of stream stays readable
  EXPECT_EQ(Revents(r->fd()), POLLIN | POLLOUT | POLLRDHUP);
  EXPECT_TRUE(r->readable());
}

TEST(ReadinessFd, HangupReportsEverythingEvenWhenUnwritable) {
  auto r = Make();
  r->SetWritable(false);
  r->SetHangup();
  pollfd p{r->fd(), POLLIN | POLLOUT | POLLRDHUP, 0};
  ASSERT_EQ(::poll(&p, 1, 0), 1);
  EXPECT_EQ(p.revents, POLLIN | POLLOUT | POLLRDHUP | POLLHUP);
  r->SetWritable(false);  // ignored after hangup
  r->SetReadable(false);
  ASSERT_EQ(::poll(&p, 1, 0), 1);
  EXPECT_EQ(p.revents, POLLIN | POLLOUT | POLLRDHUP | POLLHUP);
}

TEST(ReadinessFd, CloexecAsRequested) {
  auto a = Make(true);
  auto b = Make(false);
  EXPECT_EQ(::fcntl(a->fd(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  EXPECT_EQ(::fcntl(b->fd(), F_GETFD) & FD_CLOEXEC, 0);
}

TEST(ReadinessFd, ManyAtOnceStayIndependent) {
  std::vector<std::unique_ptr<ReadinessFd>> fds;
  for (int i = 0; i < 200; ++i) fds.push_back(Make());
  for (int i = 0; i < 200; ++i) {
    fds[i]->SetReadable(i % 2 == 0);
    fds[i]->SetWritable(i % 3 != 0);
  }
  for (int i = 0; i < 200; ++i) {
    short want = static_cast<short>((i % 2 == 0 ? POLLIN : 0) | (i % 3 != 0 ? POLLOUT : 0));
    EXPECT_EQ(Revents(fds[i]->fd()), want) << i;
  }
}

}  // namespace
}  // namespace zsock
