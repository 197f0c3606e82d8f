#include "bench/clock.h"

#include <time.h>

#include <fstream>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace zsock::bench {

int64_t MonotonicNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

namespace {

struct Calibration {
  bool tsc = false;
  uint64_t tsc0 = 0;
  int64_t ns0 = 0;
  double ns_per_tick = 0;
};

Calibration g_cal;
std::once_flag g_once;

bool InvariantTsc() {
#if defined(__x86_64__)
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "flags")) {
      return absl::StrContains(line, " constant_tsc") && absl::StrContains(line, " nonstop_tsc");
    }
  }
#endif
  return false;
}

void DoCalibrate() {
  if (!InvariantTsc()) return;
#if defined(__x86_64__)
  const uint64_t c0 = __rdtsc();
  const int64_t t0 = MonotonicNs();
  int64_t t1 = t0;
  while (t1 - t0 < 20 * 1000 * 1000) t1 = MonotonicNs();
  const uint64_t c1 = __rdtsc();
  if (c1 <= c0) return;
  g_cal.ns_per_tick = static_cast<double>(t1 - t0) / static_cast<double>(c1 - c0);
  g_cal.tsc0 = c0;
  g_cal.ns0 = t0;
  g_cal.tsc = true;
#endif
}

}  // namespace

void Calibrate() { std::call_once(g_once, DoCalibrate); }

int64_t NowNs() {
  Calibrate();
#if defined(__x86_64__)
  if (g_cal.tsc) {
    // Signed: another core's TSC may trail the calibrating core's by a few
    // ticks, and an unsigned difference would wrap.
    const auto ticks = static_cast<int64_t>(__rdtsc() - g_cal.tsc0);
    return g_cal.ns0 + static_cast<int64_t>(static_cast<double>(ticks) * g_cal.ns_per_tick);
  }
#endif
  return MonotonicNs();
}

std::string ClockSource() {
  Calibrate();
  if (g_cal.tsc) return absl::StrFormat("tsc (%.3f GHz)", 1.0 / g_cal.ns_per_tick);
  return "clock_gettime(CLOCK_MONOTONIC)";
}

}  // namespace zsock::bench
