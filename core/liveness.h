// LivenessTicker: when a provider's progress should look for dead peers.
//
// A peer's death shows as a readable liveness fd (its bootstrap socket's
// EOF, a pidfd), which a busy poll should not pay a system call per poll
// to notice. So a CQ looks only when something asked for it (a wake-up
// from its wait fd, an endpoint's request) or when the interval passed
// since the last look (a backstop for deaths nothing announced). Due() is
// a relaxed load on the fast path: a busy poll costs no read-modify-write.
#ifndef ZSOCK_CORE_LIVENESS_H_
#define ZSOCK_CORE_LIVENESS_H_

#include <atomic>
#include <cstdint>

namespace zsock {

class LivenessTicker {
 public:
  // Dead-peer checks at least every `interval_ns`.
  explicit LivenessTicker(int64_t interval_ns) : interval_ns_(interval_ns) {}

  // The next Due() answers true (a wake-up may mean a peer went away).
  void Request() { requested_.store(true, std::memory_order_relaxed); }
  // Request, and the look it causes covers every endpoint, not only those
  // whose liveness fd turned readable (TakeAll says so, once).
  void RequestAll() {
    all_.store(true, std::memory_order_relaxed);
    requested_.store(true, std::memory_order_relaxed);
  }
  // Whether a RequestAll is pending; consumes it. Called when Due() is true.
  bool TakeAll() { return all_.exchange(false, std::memory_order_relaxed); }

  // True when a look is due at `now_ns` (core/clock.h's coarse clock is
  // precise enough: the interval is milliseconds): requested since the
  // last call, or the interval passed. Either way the request is consumed.
  bool Due(int64_t now_ns) {
    bool due = requested_.load(std::memory_order_relaxed) &&
               requested_.exchange(false, std::memory_order_relaxed);
    if (now_ns - last_ns_.load(std::memory_order_relaxed) > interval_ns_) {
      last_ns_.store(now_ns, std::memory_order_relaxed);
      due = true;
    }
    return due;
  }

  int64_t interval_ns() const { return interval_ns_; }

 private:
  const int64_t interval_ns_;
  std::atomic<bool> requested_{false};
  std::atomic<bool> all_{false};
  std::atomic<int64_t> last_ns_{0};
};

}  // namespace zsock

#endif  // ZSOCK_CORE_LIVENESS_H_
