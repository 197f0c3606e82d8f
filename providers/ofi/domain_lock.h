// DomainMutex: the lock that serializes every call on an ofi domain and
// its objects (domains are opened FI_THREAD_DOMAIN), and DomLock, its
// scoped holder (core's ScopedLock). A memory registration may be revoked
// from any thread without blocking on it (CloseMr). Inline: every
// operation takes it.
#ifndef ZSOCK_PROVIDERS_OFI_DOMAIN_LOCK_H_
#define ZSOCK_PROVIDERS_OFI_DOMAIN_LOCK_H_

#include <pthread.h>
#include <rdma/fi_domain.h>

#include <array>
#include <atomic>

#include "absl/base/thread_annotations.h"
#include "core/mutex.h"

namespace zsock::ofi {

// Registrations are revoked inside free() and munmap() (core's release
// hooks) on any thread: one already inside libfabric under this lock, or
// one holding locks that a holder of this lock may wait for. Revoking
// therefore never blocks on it: the MR is closed at once if the lock is
// free (TryLock), else parked here and closed by the next holder, before it
// makes its own call. Hand-written: std::mutex has no owner query and no
// hook at acquisition.
class ABSL_LOCKABLE DomainMutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mu_.Lock();
    owner_.store(pthread_self(), std::memory_order_relaxed);
    ClosePending();
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    ClosePending();
    owner_.store(pthread_t{}, std::memory_order_relaxed);
    mu_.Unlock();
  }
  // Closes `mr` now if the lock is free, else parks it for the next holder.
  // Async-signal-safe in spirit: no allocation, no blocking.
  void CloseMr(fid_mr* mr) noexcept {
    if (!pthread_equal(owner_.load(std::memory_order_relaxed), pthread_self()) && mu_.TryLock()) {
      owner_.store(pthread_self(), std::memory_order_relaxed);
      fi_close(&mr->fid);
      Unlock();
      return;
    }
    for (auto& slot : pending_) {
      fid_mr* expected = nullptr;
      if (slot.compare_exchange_strong(expected, mr, std::memory_order_acq_rel)) {
        npending_.fetch_add(1, std::memory_order_release);
        return;
      }
    }
    // Every slot taken by revocations parked at once: leave this MR open
    // (the provider keeps its record; the memory itself is the caller's).
  }

 private:
  void ClosePending() {
    while (npending_.load(std::memory_order_acquire) > 0) {
      for (auto& slot : pending_) {
        if (fid_mr* mr = slot.exchange(nullptr, std::memory_order_acq_rel)) {
          npending_.fetch_sub(1, std::memory_order_acq_rel);
          fi_close(&mr->fid);  // may park more (release hooks): the loop takes them
        }
      }
    }
  }

  Mutex mu_;
  std::atomic<pthread_t> owner_{};
  std::atomic<int> npending_{0};
  std::array<std::atomic<fid_mr*>, 4096> pending_{};
};

using DomLock = ScopedLock<DomainMutex>;

}  // namespace zsock::ofi

#endif  // ZSOCK_PROVIDERS_OFI_DOMAIN_LOCK_H_
