#include "bench/placement.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <utility>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "bench/clock.h"

namespace zsock::bench {
namespace {

int PinSelf(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

}  // namespace

absl::StatusOr<double> LineTransferNs(int cpu_a, int cpu_b, int rounds) {
  const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  for (int cpu : {cpu_a, cpu_b}) {
    if (cpu < 0 || cpu >= ncpu) {
      return absl::InvalidArgumentError(absl::StrCat(
          "line transfer probe: CPU ", cpu, " is not online (", ncpu,
          " online CPUs); pick CPUs from 0 to ", ncpu - 1));
    }
  }
  if (cpu_a == cpu_b) {
    return absl::InvalidArgumentError(
        absl::StrCat("line transfer probe: both threads on CPU ", cpu_a, "; pick two CPUs"));
  }
  if (rounds <= 0) return absl::InvalidArgumentError("line transfer probe: rounds must be > 0");
  // The word alone on its line, so that only the probe's two threads touch
  // it. Both sides run in threads of their own: the caller's affinity stays
  // as it was.
  struct alignas(64) Line {
    std::atomic<int64_t> v{0};
  };
  Line line;
  std::atomic<bool> stop{false};
  int err_a = 0, err_b = 0;
  int64_t t0 = 0, t1 = 0;
  // Waits for the word to reach `want`; false when the other side gave up.
  auto await = [&](int64_t want) {
    while (line.v.load(std::memory_order_acquire) != want) {
      if (stop.load(std::memory_order_relaxed)) return false;
    }
    return true;
  };
  std::thread b([&] {
    if ((err_b = PinSelf(cpu_b)) != 0) {
      stop.store(true);
      return;
    }
    for (int64_t i = 0; i < rounds; ++i) {
      if (!await(2 * i + 1)) return;
      line.v.store(2 * i + 2, std::memory_order_release);
    }
  });
  std::thread a([&] {
    if ((err_a = PinSelf(cpu_a)) != 0) {
      stop.store(true);
      return;
    }
    t0 = NowNs();
    for (int64_t i = 0; i < rounds; ++i) {
      line.v.store(2 * i + 1, std::memory_order_release);
      if (!await(2 * i + 2)) return;
    }
    t1 = NowNs();
  });
  a.join();
  b.join();
  for (auto [cpu, err] : {std::pair{cpu_a, err_a}, std::pair{cpu_b, err_b}}) {
    if (err != 0) {
      return absl::InternalError(absl::StrCat("line transfer probe: pinning a thread to CPU ",
                                              cpu, ": ", std::strerror(err)));
    }
  }
  return static_cast<double>(t1 - t0) / rounds / 2.0;
}

}  // namespace zsock::bench
