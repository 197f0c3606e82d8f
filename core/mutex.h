// zsock::Mutex / zsock::SharedMutex and their guards.
//
// Why not absl::Mutex: Debian's absl 20220623 is built with deadlock
// detection on, so every absl::Mutex::Lock walks a global cycle graph
// (GraphCycles::GetId, thread-identity lookups): an uncontended lock+unlock
// costs over a hundred nanoseconds, more than the rest of a unet message.
// It is also built without ThreadSanitizer annotations.
//
// Why not std::mutex either (written by hand, no library offers it): the
// provider and SDP locks are taken several times per message (a ucx
// ping-pong takes its worker's lock three times per message and side).
// glibc's pthread mutex costs about 60 instructions per lock+unlock and
// goes to sleep in futex(2) at the first contention, without spinning: the
// SDP engine's application thread and progress thread meet on the
// connection lock, and each meeting cost two system calls. Mutex below is
// the futex mutex of Drepper's "Futexes Are Tricky" (states 0 free, 1
// held, 2 held with possible sleepers; one compare-exchange to lock, one
// exchange to unlock, a futex wake only when someone may sleep), with a
// short spin before sleeping (docs/decisions/0001-futex-mutex.md has the
// measurements).
// Waiters block in the kernel after the spin: no busy wait is ever needed.
//
// Under ThreadSanitizer it is std::mutex, so TSan keeps its lock checks
// (lock-order inversions); the futex lock is tested by core/mutex_test.
// All carry absl's thread-safety annotations, so ABSL_GUARDED_BY and
// friends keep working.
//
// MutexLock also accepts an absl::Mutex (annotated for TSan) for code that
// still holds one.
#ifndef ZSOCK_CORE_MUTEX_H_
#define ZSOCK_CORE_MUTEX_H_

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <shared_mutex>

#include "absl/base/dynamic_annotations.h"
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace zsock {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

#if defined(__SANITIZE_THREAD__)
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }
#else
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    uint32_t c = kFree;
    if (__builtin_expect(state_.compare_exchange_strong(c, kHeld, std::memory_order_acquire), 1)) {
      return;
    }
    LockSlow();
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    if (__builtin_expect(state_.exchange(kFree, std::memory_order_release) == kContended, 0)) {
      WakeOne();
    }
  }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) {
    uint32_t c = kFree;
    return state_.compare_exchange_strong(c, kHeld, std::memory_order_acquire);
  }
#endif

  // BasicLockable, for std::unique_lock and std::condition_variable_any.
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { Lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { Unlock(); }

 private:
#if defined(__SANITIZE_THREAD__)
  std::mutex mu_;
#else
  static constexpr uint32_t kFree = 0, kHeld = 1, kContended = 2;
  // Spin iterations (a pause each, tens of ns) before sleeping: about the
  // length of a provider's critical section, so that a holder running on
  // the other core is waited for without two system calls.
  static constexpr int kSpins = 128;

  __attribute__((noinline)) void LockSlow() {
    uint32_t c = kFree;
    for (int i = 0; i < kSpins; ++i) {
      __builtin_ia32_pause();
      c = state_.load(std::memory_order_relaxed);
      if (c == kFree && state_.compare_exchange_weak(c, kHeld, std::memory_order_acquire)) return;
      if (c == kContended) break;  // others sleep already: queue behind them
    }
    // Mark "someone may sleep" and take it if it was free meanwhile; else
    // sleep while it stays marked (FUTEX_WAIT returns at once if it moved,
    // and on EINTR; the loop retakes the mark either way).
    c = state_.exchange(kContended, std::memory_order_acquire);
    while (c != kFree) {
      ::syscall(SYS_futex, &state_, FUTEX_WAIT_PRIVATE, kContended, nullptr, nullptr, 0);
      c = state_.exchange(kContended, std::memory_order_acquire);
    }
  }
  __attribute__((noinline)) void WakeOne() {
    ::syscall(SYS_futex, &state_, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
  }

  std::atomic<uint32_t> state_{kFree};
#endif
};

class ABSL_LOCKABLE SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { mu_.lock_shared(); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

// A condition variable for zsock::Mutex (std::condition_variable_any, which
// takes any lock; its own internal lock costs only the rare Signal, which
// callers skip without waiters), with absl::CondVar's calls.
class CondVar {
 public:
  // Requires `mu` held; releases it while waiting.
  void Wait(Mutex* mu) {
    std::unique_lock<Mutex> lock(*mu, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // Returns true if `deadline` passed (like absl::CondVar::WaitWithDeadline).
  bool WaitWithDeadline(Mutex* mu, absl::Time deadline) {
    if (deadline == absl::InfiniteFuture()) {
      Wait(mu);
      return false;
    }
    std::unique_lock<Mutex> lock(*mu, std::adopt_lock);
    bool timed_out = cv_.wait_until(lock, absl::ToChronoTime(deadline)) == std::cv_status::timeout;
    lock.release();
    return timed_out;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  explicit MutexLock(absl::Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : absl_mu_(mu) {
    absl_mu_->Lock();
    ABSL_ANNOTATE_RWLOCK_ACQUIRED(absl_mu_, 1);
  }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {
    if (mu_ != nullptr) {
      mu_->Unlock();
    } else {
      ABSL_ANNOTATE_RWLOCK_RELEASED(absl_mu_, 1);
      absl_mu_->Unlock();
    }
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_ = nullptr;
  absl::Mutex* const absl_mu_ = nullptr;
};

// The scoped guard of any lockable with Lock()/Unlock() (a provider's own
// domain or worker lock), annotated like MutexLock.
template <typename M>
class ABSL_SCOPED_LOCKABLE ScopedLock {
 public:
  explicit ScopedLock(M* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~ScopedLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  ScopedLock(const ScopedLock&) = delete;
  ScopedLock& operator=(const ScopedLock&) = delete;

 private:
  M* const mu_;
};

}  // namespace zsock

#endif  // ZSOCK_CORE_MUTEX_H_
