// LingerTimer: a CQ's tick while one of its endpoints lingers (its peer
// closed gracefully and what it sent is still being delivered). A
// lingering endpoint's fds leave the wait set (at end of file they would
// keep it readable, every sleep a spin), so a sleeper wakes on this tick
// instead, every kLingerTickNs, to see whether the linger is over.
#ifndef ZSOCK_PROVIDERS_OFI_LINGER_TIMER_H_
#define ZSOCK_PROVIDERS_OFI_LINGER_TIMER_H_

#include <atomic>
#include <cstdint>

#include "core/fd.h"
#include "core/mutex.h"

namespace zsock::ofi {

inline constexpr int64_t kLingerTickNs = 5 * 1000 * 1000;

class LingerTimer {
 public:
  explicit LingerTimer(Fd timer) : timer_(std::move(timer)) {}

  // The timerfd, for the CQ's wait set.
  int fd() const { return timer_.get(); }
  // An endpoint starts (+1) or ends (-1) a linger.
  void Add(int d) { lingering_.fetch_add(d, std::memory_order_relaxed); }
  // Before a sleep: ticks while an endpoint lingers, and stops (draining an
  // expiry nobody read) once none does.
  void Arm() {
    if (lingering_.load(std::memory_order_relaxed) > 0 || armed_.load(std::memory_order_relaxed)) {
      ArmOrDisarm();
    }
  }
  // After a wake-up: consumes an expiry, while the timer is in use (it may
  // be what woke the sleeper).
  void Clear();

 private:
  void ArmOrDisarm();

  Fd timer_;
  Mutex mu_;  // arming and disarming timer_
  std::atomic<bool> armed_{false};  // the timer is in use: Clear reads it
  std::atomic<int> lingering_{0};   // endpoints lingering
};

}  // namespace zsock::ofi

#endif  // ZSOCK_PROVIDERS_OFI_LINGER_TIMER_H_
