// The worker's lock and its scoped guard (core's ScopedLock). Every ucp_*
// call on a worker, and every change to the state UCX callbacks reach
// (EpCore, Op), is made under it (UCS_THREAD_MODE_SERIALIZED).
//
// With threads=serialized (Settings::serialized) the application calls
// into the fabric from one thread at a time, as UCX's
// UCS_THREAD_MODE_SERIALIZED asks, and the lock is not taken: a lock and
// an unlock on every call is measurable on small-message streams, while
// ping-pong latency does not change (docs/ucx.md, "Thread modes"). A
// CondVar never waits on it.
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

using WorkerLock = ScopedLock<WorkerMutex>;

}  // namespace zsock::ucx

#endif  // ZSOCK_PROVIDERS_UCX_WORKER_LOCK_H_
