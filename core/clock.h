// Cheap clocks for the progress paths.
#pragma once

#include <sched.h>
#include <time.h>

#include <cstdint>

namespace zsock {

// CLOCK_MONOTONIC_COARSE in nanoseconds: the kernel's last tick (a few ms
// resolution), read from the vDSO in a few ns with no system call and no
// TSC calibration. For timing liveness checks, lingers and rate limits on
// paths a busy poller runs millions of times a second (absl's
// GetCurrentTimeNanos measured at a tenth of an empty poll); never for
// latency measurement.
inline int64_t CoarseNowNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// A spinning CompletionQueue::Wait gives its CPU away this often. A peer
// process it woke (the sender of the reply it waits for, woken by its
// request) is often placed on the spinner's own CPU, where it waits for the
// whole spin: with spin_us=20, a 64-byte round trip between two unpinned
// processes that sleep between messages took 60 us at p50, 30 without
// spinning, 25 with a yield every 5 us (17 every 2 us, but that cost 64 KiB
// ping-pong 10%; bench/wakeup_bench, provider_bench --wait=adaptive).
// sched_yield lets such a peer run and returns at once when nothing else
// is runnable here. Not in the SDP engine's spin: there the other runnable
// thread is usually the engine's own progress thread, and handing it the
// CPU made a pinned 64 KiB ping-pong 3-5x slower.
inline constexpr int64_t kSpinYieldNs = 5000;
inline void SpinYield() { ::sched_yield(); }

}  // namespace zsock
