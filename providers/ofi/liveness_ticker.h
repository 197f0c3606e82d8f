// LivenessTicker: when a CQ's progress looks at its endpoints' peers
// (whether each is still there): after every wake-up of a sleeper, at
// least once per interval of busy polling, and on demand; on demand also
// every endpoint, whether or not its liveness fd turned readable. Due is
// on every poll's path: inline, and a plain load when nothing is asked.
#ifndef ZSOCK_PROVIDERS_OFI_LIVENESS_TICKER_H_
#define ZSOCK_PROVIDERS_OFI_LIVENESS_TICKER_H_

#include <atomic>
#include <cstdint>

namespace zsock::ofi {

class LivenessTicker {
 public:
  explicit LivenessTicker(int64_t interval_ns) : interval_ns_(interval_ns) {}

  // Whether this progress checks; `now` from CoarseNowNs. Each request, and
  // each interval, makes one progress check.
  bool Due(int64_t now) {
    // A plain load first: a busy poll costs no read-modify-write here.
    bool check = requested_.load(std::memory_order_relaxed) &&
                 requested_.exchange(false, std::memory_order_relaxed);
    if (now - last_ns_.load(std::memory_order_relaxed) > interval_ns_) {
      last_ns_.store(now, std::memory_order_relaxed);
      check = true;
    }
    return check;
  }
  // Whether the check that is due covers every endpoint (RequestAll), once.
  bool TakeAll() { return all_.exchange(false, std::memory_order_relaxed); }

  // The next progress checks (a sleeper woke: something may have ended).
  void Request() { requested_.store(true, std::memory_order_relaxed); }
  // The next progress checks every endpoint.
  void RequestAll() {
    all_.store(true, std::memory_order_relaxed);
    requested_.store(true, std::memory_order_relaxed);
  }

 private:
  const int64_t interval_ns_;
  std::atomic<bool> requested_{false};
  std::atomic<bool> all_{false};
  std::atomic<int64_t> last_ns_{0};
};

}  // namespace zsock::ofi

#endif  // ZSOCK_PROVIDERS_OFI_LIVENESS_TICKER_H_
