// The liveness ticker: decides which of a CQ's progress calls look for dead
// peers (readable connection sockets and pidfds). A wake-up of the CQ asks
// for one look, since something may have become readable; a CQ polled
// without ever sleeping looks at least every kIntervalNs all the same.
//
// Kept apart because every provider keeps one of these; it is meant to be
// replaced by a shared core helper. Inline: Due() runs on every poll.
#ifndef ZSOCK_PROVIDERS_UNET_LIVENESS_H_
#define ZSOCK_PROVIDERS_UNET_LIVENESS_H_

#include <atomic>
#include <cstdint>

#include "core/clock.h"

namespace zsock::unet {

class LivenessTicker {
 public:
  // The backstop's period: a dead peer noticed within milliseconds is
  // soon enough, and a look costs system calls.
  static constexpr int64_t kIntervalNs = 20 * 1000 * 1000;

  // The next progress looks (the CQ was woken up).
  void Request() { requested_.store(true, std::memory_order_relaxed); }

  // Whether this progress looks: one was requested, or the period is over.
  bool Due() {
    // A plain load first: a busy poll costs no read-modify-write here.
    bool check = requested_.load(std::memory_order_relaxed) &&
                 requested_.exchange(false, std::memory_order_relaxed);
    // The period is milliseconds: the coarse clock's tick precision is plenty.
    const int64_t now = CoarseNowNs();
    if (now - last_ns_.load(std::memory_order_relaxed) > kIntervalNs) {
      last_ns_.store(now, std::memory_order_relaxed);
      check = true;
    }
    return check;
  }

 private:
  std::atomic<bool> requested_{false};
  std::atomic<int64_t> last_ns_{0};
};

}  // namespace zsock::unet

#endif  // ZSOCK_PROVIDERS_UNET_LIVENESS_H_
