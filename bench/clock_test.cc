#include "bench/clock.h"

#include <time.h>

#include <cstdlib>

#include "gtest/gtest.h"

namespace zsock::bench {
namespace {

// NowNs tracks CLOCK_MONOTONIC: the same origin and, over 100 ms of
// sleep, the same rate (a wrong TSC scale would be off by its error).
TEST(BenchClock, TracksTheMonotonicClock) {
  Calibrate();
  const int64_t a = NowNs(), ma = MonotonicNs();
  EXPECT_LT(std::llabs(a - ma), 1000 * 1000) << ClockSource();  // within 1 ms
  timespec d{0, 100 * 1000 * 1000};
  ::nanosleep(&d, nullptr);
  const int64_t b = NowNs(), mb = MonotonicNs();
  const double rate = static_cast<double>(b - a) / static_cast<double>(mb - ma);
  EXPECT_NEAR(rate, 1.0, 0.001) << ClockSource();
}

TEST(BenchClock, NeverGoesBackwards) {
  int64_t prev = NowNs();
  for (int i = 0; i < 1000000; ++i) {
    const int64_t now = NowNs();
    ASSERT_GE(now, prev) << "at read " << i << ", " << ClockSource();
    prev = now;
  }
}

}  // namespace
}  // namespace zsock::bench
