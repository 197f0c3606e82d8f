// Cheap clocks for the progress paths.
#pragma once

#include <time.h>

#include <cstdint>

namespace zsock {

// CLOCK_MONOTONIC_COARSE in nanoseconds: the kernel's last tick (a few ms
// resolution), read from the vDSO in a few ns with no system call and no
// TSC calibration. For timing liveness checks, lingers and rate limits on
// paths a busy poller runs millions of times a second (absl's
// GetCurrentTimeNanos costs a large share of an empty poll); never for
// latency measurement.
inline int64_t CoarseNowNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

}  // namespace zsock
