// The tcp CQ: progress is one epoll_wait, with no timeout, over the
// endpoints' sockets and a turn for each endpoint it names. Sleeping is
// core's: CqBase::Wait polls wait_fd, this same epoll set, which
// also holds core's wake fd.
#include <sys/epoll.h>

#include <cerrno>

#include "core/status.h"
#include "providers/tcp/tcp.h"

namespace zsock::tcp {

absl::StatusOr<std::unique_ptr<TcpCq>> TcpCq::Create(TcpFabric* fabric) {
  Fd epoll(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll) {
    return ErrnoError(errno, "epoll_create1 for a tcp CQ failed", "raise the fd limit (ulimit -n)");
  }
  auto cq = std::unique_ptr<TcpCq>(new TcpCq(fabric, std::move(epoll)));
  if (cq->Control(EPOLL_CTL_ADD, cq->wake_fd(), EPOLLIN, nullptr) != 0) {
    return ErrnoError(errno, "adding the wake fd to a tcp CQ's epoll set failed");
  }
  return cq;
}

absl::StatusOr<std::unique_ptr<CompletionQueue>> TcpFabric::CreateCq() {
  auto cq = TcpCq::Create(this);
  if (!cq.ok()) return cq.status();
  return std::unique_ptr<CompletionQueue>(std::move(*cq));
}

int TcpCq::Control(int op, int fd, uint32_t events, TcpEndpoint* ep) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = ep;
  return ::epoll_ctl(epoll_.get(), op, fd, &ev);
}

size_t TcpCq::Progress() {
  // A bounded batch per call: level-triggered epoll reports the sockets it
  // left out (and those with more to read) next time, and moves those it
  // reported behind them, so every endpoint gets its turn.
  constexpr int kBatch = 64;
  epoll_event events[kBatch];
  MutexLock lock(&mu_);
  const int n = ::epoll_wait(epoll_.get(), events, kBatch, 0);
  size_t handled = 0;
  for (int i = 0; i < n; ++i) {
    auto* ep = static_cast<TcpEndpoint*>(events[i].data.ptr);
    if (ep != nullptr) handled += OnReady(ep, events[i].events);
  }
  return handled;
}

}  // namespace zsock::tcp
