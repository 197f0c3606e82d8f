// The worker's lock and its scoped guard. Every ucp_* call on a worker,
// and every change to the state UCX callbacks reach (EpCore, Op), is made
// under it (UCS_THREAD_MODE_SERIALIZED).
//
// With threads=serialized (Settings::serialized) the application calls
// into the fabric from one thread at a time, as UCX's
// UCS_THREAD_MODE_SERIALIZED asks, and the lock is not taken: a lock and
// an unlock on every call is measurable on small-message streams, while
// ping-pong latency does not change (docs/ucx.md, "Thread modes"). A
// CondVar never waits on it.
//
// Each provider writes such a scoped lock for itself; it is kept apart
// here so that one shared core toolkit can replace it.
#ifndef ZSOCK_PROVIDERS_UCX_WORKER_LOCK_H_
#define ZSOCK_PROVIDERS_UCX_WORKER_LOCK_H_

#include "absl/base/thread_annotations.h"
#include "core/mutex.h"

namespace zsock::ucx {

class ABSL_LOCKABLE WorkerMutex {
 public:
  explicit WorkerMutex(bool serialized) : serialized_(serialized) {}
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    if (!serialized_) mu_.Lock();
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    if (!serialized_) mu_.Unlock();
  }

 private:
  const bool serialized_;
  Mutex mu_;
};

class ABSL_SCOPED_LOCKABLE WorkerLock {
 public:
  explicit WorkerLock(WorkerMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~WorkerLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  WorkerLock(const WorkerLock&) = delete;
  WorkerLock& operator=(const WorkerLock&) = delete;

 private:
  WorkerMutex* mu_;
};

}  // namespace zsock::ucx

#endif  // ZSOCK_PROVIDERS_UCX_WORKER_LOCK_H_
