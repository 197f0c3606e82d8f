#include "bench/clock.h"

#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "bench/samples.h"
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

// How many of the pages under [p, p + bytes) are resident (mincore).
size_t ResidentPages(const void* p, size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes + page - 1) / page * page;
  std::vector<unsigned char> in((end - begin) / page);
  EXPECT_EQ(::mincore(reinterpret_cast<void*>(begin), end - begin, in.data()), 0);
  size_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return n;
}

// A million samples (8 MB: a fresh mapping, not heap reuse): reserve
// alone leaves the pages unmapped, which a timed loop would fault in;
// ReserveTouched leaves none to fault, and the vector empty.
TEST(BenchSamples, ReserveTouchedMapsEveryPage) {
  constexpr size_t kN = 1 << 20;
  std::vector<double> plain;
  plain.reserve(kN);
  const size_t pages = (kN * sizeof(double)) / static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  if (ResidentPages(plain.data(), kN * sizeof(double)) >= pages / 2) {
    GTEST_SKIP() << "here reserve's memory is already resident (MALLOC_PERTURB_, or reused "
                    "heap): the check below would prove nothing";
  }
  std::vector<double> v;
  ReserveTouched(&v, kN);
  EXPECT_TRUE(v.empty());
  ASSERT_GE(v.capacity(), kN);
  EXPECT_GE(ResidentPages(v.data(), kN * sizeof(double)), pages);
}

}  // namespace
}  // namespace zsock::bench
