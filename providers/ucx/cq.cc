// The ucx CQ: creation, the busy poll's Progress, the sockets' look and
// arming for a wait.
#include "providers/ucx/cq.h"

#include <sys/eventfd.h>

#include <algorithm>
#include <cerrno>

#include "core/clock.h"
#include "core/status.h"
#include "providers/ucx/endpoint.h"
#include "providers/ucx/fabric.h"
#include "providers/ucx/worker.h"

namespace zsock::ucx {
namespace {

thread_local const UcxCq* t_progressing = nullptr;

}  // namespace

bool UcxCq::IsProgressingHere() const { return t_progressing == this; }

void UcxCq::Deliver(Completion c) {
  Push(std::move(c));
  if (!IsProgressingHere()) {
    // Dekker with ArmProvider: either it sees pushed_ or we see armed_.
    pushed_.store(true, std::memory_order_seq_cst);
    if (armed_.load(std::memory_order_seq_cst)) WakeWaiter();
  }
}

absl::StatusOr<std::unique_ptr<UcxCq>> UcxCq::Create(UcxFabric* fabric) {
  constexpr const char* kFix = "raise the fd limit (ulimit -n)";
  int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (efd < 0) return ErrnoError(errno, "eventfd for a ucx CQ failed", kFix);
  Fd event(efd);
  int epfd = ::epoll_create1(EPOLL_CLOEXEC);
  if (epfd < 0) return ErrnoError(errno, "epoll_create1 for a ucx CQ failed", kFix);
  Fd ep(epfd);
  int sfd = ::epoll_create1(EPOLL_CLOEXEC);
  if (sfd < 0) return ErrnoError(errno, "epoll_create1 for a ucx CQ failed", kFix);
  Fd socks(sfd);
  int tfd = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (tfd < 0) return ErrnoError(errno, "timerfd_create for a ucx CQ failed", kFix);
  Fd timer(tfd);
  for (int fd : {efd, sfd, tfd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      return ErrnoError(errno, "building the ucx CQ's epoll set failed");
    }
  }
  const Settings& s = fabric->settings();
  const int tries = s.same_host_only && s.has_mm ? kIdleTries : 1;
  auto cq = std::unique_ptr<UcxCq>(new UcxCq(fabric, std::move(ep), std::move(socks),
                                             std::move(event), std::move(timer), tries));
  // Core's wake eventfd (Push/Wake from other threads) joins the wait set.
  epoll_event wev{};
  wev.events = EPOLLIN;
  wev.data.fd = cq->wake_fd();
  if (::epoll_ctl(epfd, EPOLL_CTL_ADD, cq->wake_fd(), &wev) != 0) {
    return ErrnoError(errno, "adding the wake eventfd to the ucx CQ epoll set failed");
  }
  fabric->AddCq(cq.get());
  return cq;
}

UcxCq::~UcxCq() {
  fabric_->RemoveCq(this);
  fabric_->ForEachLiveWorker([this](Worker* w) {
    WorkerLock lock(&w->mu);
    w->ForgetCqLocked(this);
  });
}

void UcxCq::Attach(UcxEndpoint* ep, int sock) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.ptr = ep;
  MutexLock lock(&mu_);
  ::epoll_ctl(socks_.get(), EPOLL_CTL_ADD, sock, &ev);
  endpoints_.push_back(ep);
  NoteService();
}

void UcxCq::Detach(UcxEndpoint* ep, int sock) {
  MutexLock lock(&mu_);
  ::epoll_ctl(socks_.get(), EPOLL_CTL_DEL, sock, nullptr);
  endpoints_.erase(std::remove(endpoints_.begin(), endpoints_.end(), ep), endpoints_.end());
}

size_t UcxCq::Progress() {
  const UcxCq* outer = t_progressing;
  t_progressing = this;
  // A plain load first: a busy poll costs no locked store here.
  if (pushed_.load(std::memory_order_relaxed)) pushed_.store(false, std::memory_order_seq_cst);
  // The coarse clock is read on every kClockPolls-th progress and kept
  // between: what it times (the sockets' look below, the workers'
  // control probe) is due every millisecond or so and may come a few
  // polls late, while a busy poll's every instruction delays the moment
  // it sees a reply. (Plain loads and stores: a poll racing another on
  // this CQ may read the clock once more or less.)
  const uint32_t k = polls_.load(std::memory_order_relaxed);
  polls_.store(k + 1, std::memory_order_relaxed);
  int64_t now;
  if (k % kClockPolls == 0) {
    now = CoarseNowNs();
    now_ns_.store(now, std::memory_order_relaxed);
  } else {
    now = now_ns_.load(std::memory_order_relaxed);
  }
  // The busy poll's path is this function, the worker's ProgressLocked and
  // ucp_worker_progress: no closure, no call for the primary worker, and
  // the rarely needed socket and endpoint service out of line (a reply is
  // detected one idle poll sooner the shorter the poll is).
  size_t n = 0;
  const bool quick = k % kClockPolls != 0;
  Worker* primary = fabric_->primary();
  if (primary != nullptr) {
    WorkerLock lock(&primary->mu);
    n = primary->ProgressLocked(now, idle_tries_, quick);
  }
  // Found something on a poll that is not a full one: back to the caller
  // at once; the fallback worker and the sockets wait for the next poll
  // (at most kClockPolls - 1 later).
  if (quick && n > 0) [[likely]] {
    backoff_ns_.store(kMinBackoffNs, std::memory_order_relaxed);
    t_progressing = outer;
    return n;
  }
  if (Worker* w = fabric_->fallback(); w != nullptr && w != primary) [[unlikely]] {
    n += ProgressOtherLocked(w, now);
  }
  // The connection sockets only signal a peer's end, and looking at them
  // costs a system call: a busy poller (ping-pong) looks once per tick of
  // the coarse clock (a few ms; reading it costs no system call), a waiter
  // after every wakeup (ClearWakeup, ArmProvider). The endpoints are
  // serviced then too, and whenever one noted work (NoteService).
  if (check_socks_.load(std::memory_order_relaxed) ||
      service_pending_.load(std::memory_order_relaxed) ||
      now - last_sock_check_.load(std::memory_order_relaxed) >= kSocketCheckNs) [[unlikely]] {
    n += LookAtSocketsAndEndpoints(now);
  }
  if (n > 0) backoff_ns_.store(kMinBackoffNs, std::memory_order_relaxed);
  t_progressing = outer;
  return n;
}

size_t UcxCq::ProgressOtherLocked(Worker* w, int64_t now) {
  WorkerLock lock(&w->mu);
  return w->ProgressLocked(now);
}

size_t UcxCq::LookAtSocketsAndEndpoints(int64_t now) {
  size_t n = 0;
  const bool socks = (check_socks_.load(std::memory_order_relaxed) &&
                      check_socks_.exchange(false, std::memory_order_relaxed)) ||
                     now - last_sock_check_.load(std::memory_order_relaxed) >= kSocketCheckNs;
  const bool service = service_pending_.load(std::memory_order_acquire) &&
                       service_pending_.exchange(false, std::memory_order_acq_rel);
  if (!socks && !service) return 0;
  MutexLock lock(&mu_);
  if (socks) {
    last_sock_check_.store(now, std::memory_order_relaxed);
    epoll_event evs[64];
    int k = ::epoll_wait(socks_.get(), evs, 64, 0);
    for (int i = 0; i < k; ++i) {
      static_cast<UcxEndpoint*>(evs[i].data.ptr)->OnSocketEvent();
      ++n;
    }
  }
  for (UcxEndpoint* ep : endpoints_) n += ep->Service();
  return n;
}

bool UcxCq::ArmProvider() {
  armed_.store(true, std::memory_order_seq_cst);
  Drain();
  if (pushed_.load(std::memory_order_seq_cst)) return false;
  epoll_event ev;
  if (::epoll_wait(socks_.get(), &ev, 1, 0) > 0) {
    check_socks_.store(true, std::memory_order_relaxed);
    return false;
  }
  bool busy_idle = false;
  std::vector<int> idle;
  for (Worker* w : fabric_->LiveWorkers()) {
    Worker::Arm state;
    {
      WorkerLock lock(&w->mu);
      state = w->ArmLocked();
    }
    switch (state) {
      case Worker::Arm::kArmed: break;
      case Worker::Arm::kPending: UnmuteAll(); return false;
      case Worker::Arm::kBusyIdle: busy_idle = true; idle.push_back(w->efd()); break;
    }
  }
  {
    MutexLock lock(&mu_);
    for (UcxEndpoint* ep : endpoints_) {
      if (ep->HasWork()) return false;
    }
  }
  UnmuteAll();
  if (busy_idle) {
    // Sleep, but not for long: UCX may need polling to move on.
    MutexLock lock(&mute_mu_);
    for (int efd : idle) MuteWorker(efd, true);
    muted_ = std::move(idle);
    int64_t ns = backoff_ns_.load(std::memory_order_relaxed);
    SetTimer(ns);
    backoff_ns_.store(std::min(ns * 2, kMaxBackoffNs), std::memory_order_relaxed);
  }
  return true;
}

}  // namespace zsock::ucx
