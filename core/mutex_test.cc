// zsock::Mutex (the futex lock of core/mutex.h) and CondVar.
#include "core/mutex.h"

#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace zsock {
namespace {

// CPU time of the calling thread, in milliseconds.
double ThreadCpuMs() {
  rusage ru{};
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_utime.tv_sec * 1e3 + ru.ru_utime.tv_usec / 1e3 + ru.ru_stime.tv_sec * 1e3 +
         ru.ru_stime.tv_usec / 1e3;
}

TEST(Mutex, ExcludesUnderContention) {
  // A non-atomic read-modify-write with a window in it: without mutual
  // exclusion increments are lost.
  Mutex mu;
  uint64_t counter = 0;
  constexpr int kThreads = 6, kIters = 100000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIters; ++i) {
        MutexLock lock(&mu);
        volatile uint64_t v = counter;
        if ((i & 255) == 0) std::this_thread::yield();  // let a holder be preempted
        counter = v + 1;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter, uint64_t{kThreads} * kIters);
}

TEST(Mutex, TryLockFailsWhileHeldAndSucceedsAfter) {
  Mutex mu;
  ASSERT_TRUE(mu.TryLock());
  bool other = true;
  std::thread([&] { other = mu.TryLock(); }).join();
  EXPECT_FALSE(other);
  mu.Unlock();
  std::thread([&] {
    other = mu.TryLock();
    if (other) mu.Unlock();
  }).join();
  EXPECT_TRUE(other);
}

TEST(Mutex, WaitersSleepWhileTheHolderHoldsLong) {
  // Waiters behind a holder that keeps the lock 300 ms must block in the
  // kernel after their short spin, not burn the CPU, and all get the lock.
  Mutex mu;
  std::atomic<int> got{0};
  std::vector<double> cpu_ms(3);
  mu.Lock();
  std::vector<std::thread> waiters;
  for (int t = 0; t < 3; ++t) {
    waiters.emplace_back([&, t] {
      const double before = ThreadCpuMs();
      mu.Lock();
      cpu_ms[t] = ThreadCpuMs() - before;
      got.fetch_add(1);
      mu.Unlock();
    });
  }
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(got.load(), 0);
  mu.Unlock();
  for (auto& t : waiters) t.join();
  EXPECT_EQ(got.load(), 3);
  for (double ms : cpu_ms) EXPECT_LT(ms, 60.0) << "a waiter spun instead of sleeping";
}

TEST(CondVar, SignalWakesAWaiterAndDeadlinesExpire) {
  Mutex mu;
  CondVar cv;
  bool ready = false;
  std::thread waiter([&] {
    MutexLock lock(&mu);
    while (!ready) cv.Wait(&mu);
  });
  absl::SleepFor(absl::Milliseconds(20));
  {
    MutexLock lock(&mu);
    ready = true;
  }
  cv.SignalAll();
  waiter.join();

  MutexLock lock(&mu);
  const absl::Time start = absl::Now();
  EXPECT_TRUE(cv.WaitWithDeadline(&mu, start + absl::Milliseconds(50)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(45));
  // The lock is held again after the wait: TryLock from another thread fails.
  bool other = true;
  std::thread([&] { other = mu.TryLock(); }).join();
  EXPECT_FALSE(other);
}

}  // namespace
}  // namespace zsock
