// LingerTimer: arming, disarming and draining the linger tick.
#include "providers/ofi/linger_timer.h"

#include <sys/timerfd.h>
#include <unistd.h>

namespace zsock::ofi {

void LingerTimer::Clear() {
  if (armed_.load(std::memory_order_relaxed)) {
    uint64_t v;
    ssize_t rc = ::read(timer_.get(), &v, sizeof(v));
    (void)rc;  // EAGAIN: not what woke us
  }
}

void LingerTimer::ArmOrDisarm() {
  // Under a lock with the count read inside it, so that a thread that saw
  // no linger cannot disarm the tick of one that saw it.
  MutexLock lock(&mu_);
  itimerspec ts{};
  if (lingering_.load(std::memory_order_relaxed) > 0) {
    ts.it_value.tv_nsec = kLingerTickNs;
    armed_.store(true, std::memory_order_relaxed);
    ::timerfd_settime(timer_.get(), 0, &ts, nullptr);
  } else {
    // The linger is over: disarm, and drain an expiry nobody read.
    ::timerfd_settime(timer_.get(), 0, &ts, nullptr);
    uint64_t v;
    ssize_t rc = ::read(timer_.get(), &v, sizeof(v));
    (void)rc;
    armed_.store(false, std::memory_order_relaxed);
  }
}

}  // namespace zsock::ofi
