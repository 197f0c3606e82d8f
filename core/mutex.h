// zsock::Mutex / zsock::SharedMutex and their guards.
//
// Why not absl::Mutex: Debian's absl 20220623 is built with deadlock
// detection on, so every absl::Mutex::Lock walks a global cycle graph
// (GraphCycles::GetId, thread-identity lookups): an uncontended lock+unlock
// costs well over 100 ns, which dominated unet's per-message cost (perf of
// bench/endpoint_ops_bench). It is also built without ThreadSanitizer
// annotations. These wrap the C++ standard mutexes (pthread: ~20 ns
// uncontended, seen by TSan natively) and carry absl's thread-safety
// annotations, so ABSL_GUARDED_BY and friends keep working.
//
// MutexLock also accepts an absl::Mutex (annotated for TSan) for code that
// still holds one.
#ifndef ZSOCK_CORE_MUTEX_H_
#define ZSOCK_CORE_MUTEX_H_

#include <condition_variable>
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

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }

  std::mutex& native() { return mu_; }

 private:
  std::mutex mu_;
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

// A condition variable for zsock::Mutex (std::condition_variable on the
// underlying std::mutex), with absl::CondVar's calls.
class CondVar {
 public:
  // Requires `mu` held; releases it while waiting.
  void Wait(Mutex* mu) {
    std::unique_lock<std::mutex> lock(mu->native(), std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // Returns true if `deadline` passed (like absl::CondVar::WaitWithDeadline).
  bool WaitWithDeadline(Mutex* mu, absl::Time deadline) {
    if (deadline == absl::InfiniteFuture()) {
      Wait(mu);
      return false;
    }
    std::unique_lock<std::mutex> lock(mu->native(), std::adopt_lock);
    bool timed_out = cv_.wait_until(lock, absl::ToChronoTime(deadline)) == std::cv_status::timeout;
    lock.release();
    return timed_out;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
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

}  // namespace zsock

#endif  // ZSOCK_CORE_MUTEX_H_
