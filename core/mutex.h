// zsock::MutexLock: absl::MutexLock that ThreadSanitizer can see.
//
// Debian's absl is built without TSan annotations, so TSan does not know
// that absl::Mutex orders memory and reports races between accesses that
// the mutex protects. This guard annotates acquire/release (no-ops outside
// TSan builds); use it instead of absl::MutexLock everywhere in zsock.
#ifndef ZSOCK_CORE_MUTEX_H_
#define ZSOCK_CORE_MUTEX_H_

#include "absl/base/dynamic_annotations.h"
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace zsock {

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(absl::Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
    ABSL_ANNOTATE_RWLOCK_ACQUIRED(mu_, 1);
  }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {
    ABSL_ANNOTATE_RWLOCK_RELEASED(mu_, 1);
    mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  absl::Mutex* const mu_;
};

}  // namespace zsock

#endif  // ZSOCK_CORE_MUTEX_H_
