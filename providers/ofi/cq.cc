// OfiCq: progress over the endpoints' fi CQs, the wait set and its timers,
// and fi_trywait before a sleep; OfiFabric::CreateCq.
#include "providers/ofi/cq.h"

#include <rdma/fi_eq.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/clock.h"
#include "core/log.h"
#include "core/status.h"
#include "providers/ofi/domain_lock.h"
#include "providers/ofi/endpoint.h"
#include "providers/ofi/errors.h"
#include "providers/ofi/fabric.h"

namespace zsock::ofi {
namespace {

// cq_wait=sockets: from this many endpoints on a CQ on, a poll reads only
// the fi CQs of endpoints with something to find (OfiCq::Progress).
constexpr size_t kSelectiveMin = 8;

}  // namespace

OfiCq::OfiCq(OfiFabric* fabric, Fd timer, Fd linger_timer, Fd epoll, bool sockets, bool fi_waits,
             int64_t backstop_ns)
    : fabric_(fabric), timer_(std::move(timer)), fi_waits_(fi_waits),
      has_trywait_fids_(fi_waits || fabric->msg()),
      min_poll_ns_(fi_waits ? backstop_ns
                   : sockets ? std::min(kMinBackstopNs, backstop_ns) : kMinPollNs),
      max_poll_ns_(sockets || fi_waits ? backstop_ns : kMaxPollNs), poll_ns_(min_poll_ns_),
      on_sockets_(sockets), linger_(std::move(linger_timer)), epoll_(std::move(epoll)) {}

void OfiCq::WatchWake() {
  Watch(wake_fd());
  if (timer_) Watch(timer_.get());
  Watch(linger_.fd());
}

void OfiCq::Watch(int fd, const OfiEndpoint* owner) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.ptr = const_cast<OfiEndpoint*>(owner);
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev);
}

void OfiCq::WatchSocket(int fd, const OfiEndpoint* owner) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
  ev.data.ptr = const_cast<OfiEndpoint*>(owner);
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev);
}

void OfiCq::Unwatch(int fd) { ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr); }

void OfiCq::ClearWakeup() {
  uint64_t v;
  if (timer_) {
    while (::read(timer_.get(), &v, sizeof(v)) == sizeof(v)) {}
  }
  linger_.Clear();
  liveness_.Request();
}

void OfiCq::Attach(OfiEndpoint* ep) {
  MutexLock lock(&mu_);
  DomLock dom(&fabric_->dom_mu());
  endpoints_.push_back(ep);
}

void OfiCq::Detach(OfiEndpoint* ep) {
  MutexLock lock(&mu_);
  DomLock dom(&fabric_->dom_mu());
  std::erase(endpoints_, ep);
  // Its control messages not yet handed on go with it: a later endpoint at
  // the same address must not get them.
  std::erase_if(pending_control_, [ep](const auto& d) { return d.first == ep; });
}

size_t OfiCq::Progress() {
  const int64_t now = CoarseNowNs();
  const bool check = liveness_.Due(now);
  const bool all = check && StartLivenessCheck();
  // cq_wait=sockets with many endpoints: an fi CQ read costs libfabric tcp
  // a poll(2) of that endpoint's sockets, so a poll that read every
  // endpoint's grew with the idle connections (measured: idle connections
  // made sporadic round trips much slower than with FI_WAIT_FD, whose reads
  // cost an epoll_wait). One epoll_wait names the endpoints whose sockets
  // had an edge; only they, those with posts or work left, and every
  // endpoint every kLivenessIntervalNs (a backstop), are read.
  bool full = true;
  if (on_sockets_) {
    const int64_t last = last_full_ns_.load(std::memory_order_relaxed);
    full = now - last > kLivenessIntervalNs;
    if (full) last_full_ns_.store(now, std::memory_order_relaxed);
  }
  // Completions and control messages are taken out under the domain lock
  // alone (it keeps the endpoint list in place); they are handed on after
  // it is released, since their consumers post again. Control messages
  // wait in one queue, in the order they were drained, for whichever poll
  // takes mu_ first: concurrent polls hand them on in order.
  CompletionList out;
  size_t n = 0;
  bool control = false;
  {
    DomLock lock(&fabric_->dom_mu());
    progressed_posts_ = posts_;
    // cq_wait=sockets: the edges are consumed here, and always followed by
    // the reads (all endpoints', or those with an edge); on a liveness
    // check at least, so that they do not pile up for a sleeper's poll(2).
    const bool selective = on_sockets_ && endpoints_.size() >= kSelectiveMin;
    if (on_sockets_ && (selective || check)) hot_.Collect(epoll_.get(), WatchedBoundLocked());
    for (OfiEndpoint* ep : endpoints_) {
      if (selective && !full && !ep->MayHaveWorkLocked(hot_)) continue;
      control_.clear();
      const size_t before = out.size();
      const size_t k = ep->ProgressLocked(&out, &control_);
      n += k;
      // Found something: there may be more. Found nothing but took bytes
      // and left some (a pipeline of RMA requests, one served per read):
      // read it again, without waiting for the next full pass.
      bool more = k > 0 || out.size() > before || !control_.empty();
      if (!more && selective) more = ep->SocketsMovedLocked();
      ep->SetPollHintLocked(more);
      for (auto& m : control_) pending_control_.emplace_back(ep, std::move(m));
    }
    control = !pending_control_.empty();
  }
  const size_t done = n + out.size();
  if (done > 0) poll_ns_.store(min_poll_ns_, std::memory_order_relaxed);
  if (!out.empty()) PushAll(std::span<Completion>(out.data(), out.size()));
  if (check || control) DeliverControlAndCheck(check, all);
  return done;
}

// Not with cq_wait=sockets: its MSG endpoints are all checked anyway, and
// Progress collects the sockets' edges (with the domain lock, right before
// the reads they call for).
bool OfiCq::StartLivenessCheck() {
  MutexLock list_lock(&mu_);
  const bool all = liveness_.TakeAll();
  if (!all && !on_sockets_) ready_.Collect(epoll_.get(), WatchedBoundLocked());
  return all;
}

void OfiCq::DeliverControlAndCheck(bool check, bool all) {
  // mu_ keeps the endpoints in place while their messages are handed on
  // (Detach drops a leaving endpoint's queued messages under both locks).
  MutexLock list_lock(&mu_);
  std::deque<std::pair<OfiEndpoint*, std::vector<uint8_t>>> deliveries;
  {
    DomLock lock(&fabric_->dom_mu());
    deliveries.swap(pending_control_);
  }
  for (auto& [ep, msg] : deliveries) ep->DeliverControl(msg);
  // Liveness after draining: a FIN already received decides how a closed
  // socket is treated.
  if (check) {
    for (OfiEndpoint* ep : endpoints_) {
      if (all || !ep->LivenessByReadiness() || ready_.contains(ep)) ep->CheckPeer();
    }
  }
}

bool OfiCq::ArmProvider() {
  if (WorkBeforeSleep()) return false;
  if (has_trywait_fids_ && !TryWait()) return false;
  ArmTimer();
  linger_.Arm();
  return true;
}

// Injected sends wait for the next progress (RdmEndpoint::TryInject, which
// wakes a sleeper that armed after this look); so do operations posted
// since (PostedLocked).
bool OfiCq::WorkBeforeSleep() {
  DomLock lock(&fabric_->dom_mu());
  if (posts_ != progressed_posts_) return true;
  const bool sockets = fabric_->wait_sockets();
  for (OfiEndpoint* ep : endpoints_) {
    if (ep->HasInjectedLocked() || (sockets && ep->MayNeedReadBeforeSleepLocked())) return true;
  }
  return false;
}

// RDM without a CQ wait object (shm, cq_wait=none) has nothing for
// fi_trywait: only the timer.
bool OfiCq::TryWait() {
  MutexLock list_lock(&mu_);
  // The fids under the domain lock: an endpoint's Shutdown closes them
  // under it (without mu_).
  DomLock lock(&fabric_->dom_mu());
  std::vector<fid*> fids;
  for (OfiEndpoint* ep : endpoints_) {
    // Not a lingering endpoint's: its fds are out of the wait set.
    if (ep->Lingering()) continue;
    ep->AppendTrywaitFidsLocked(fi_waits_, &fids);
  }
  return fids.empty() ||
         fi_trywait(fabric_->fabric(), fids.data(), static_cast<int>(fids.size())) == FI_SUCCESS;
}

void OfiCq::ArmTimer() {
  if (!timer_ || max_poll_ns_ <= 0) return;
  int64_t ns = poll_ns_.load(std::memory_order_relaxed);
  poll_ns_.store(std::min(2 * ns, max_poll_ns_), std::memory_order_relaxed);
  itimerspec ts{};
  ts.it_value.tv_sec = ns / 1000000000;  // backstop_ms may be a second or more
  ts.it_value.tv_nsec = ns % 1000000000;
  if (::timerfd_settime(timer_.get(), 0, &ts, nullptr) != 0) {
    ZS_LOG(kWarn, "ofi: arming the CQ's poll timer (%lld ns) failed: %s", static_cast<long long>(ns),
           std::strerror(errno));
  }
}

absl::StatusOr<std::unique_ptr<CompletionQueue>> OfiFabric::CreateCq() {
  // The poll timer (no wait object) or the backstop (FI_WAIT_FD, sockets).
  const bool want_timer = !fi_wait_fd_ || settings_.backstop_ns > 0;
  Fd timer;
  if (want_timer) timer.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  Fd linger_timer(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  Fd epoll(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll || !linger_timer || (want_timer && !timer)) {
    return ErrnoError(errno, "creating the ofi CQ wait set failed", "raise the fd limit (ulimit -n)");
  }
  auto cq = std::unique_ptr<OfiCq>(
      new OfiCq(this, std::move(timer), std::move(linger_timer), std::move(epoll), wait_sockets_,
                fi_wait_fd_, settings_.backstop_ns));
  cq->WatchWake();
  return std::unique_ptr<CompletionQueue>(std::move(cq));
}

absl::Status OpenEndpointCq(fid_domain* domain, bool wait_fd, fid_cq** cq, int* fd) {
  fi_cq_attr attr{};
  attr.format = FI_CQ_FORMAT_TAGGED;
  attr.size = 4096;
  attr.wait_obj = wait_fd ? FI_WAIT_FD : FI_WAIT_NONE;
  int rc = fi_cq_open(domain, &attr, cq, nullptr);
  if (rc != 0) return FiError(rc, "fi_cq_open");
  *fd = -1;
  if (wait_fd && (rc = fi_control(&(*cq)->fid, FI_GETWAIT, fd)) != 0) {
    fi_close(&(*cq)->fid);
    *cq = nullptr;
    return FiError(rc, "fi_control(FI_GETWAIT)");
  }
  return absl::OkStatus();
}

}  // namespace zsock::ofi
