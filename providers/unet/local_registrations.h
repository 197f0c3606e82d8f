// The local registration table behind Fabric::AccessLocal: the fabric's own
// record of each registration, by key-table slot, and the free slots.
//
// The key table in shared memory (KeySlot, segment.h) is what peers check
// before a direct access, and a peer can write it; every decision this
// process makes about its own memory (AccessLocal, for emulated accesses)
// uses only this private record, and generations come from it.
//
// Kept apart because every provider keeps such a table; it is meant to be
// replaced by a shared core helper.
#ifndef ZSOCK_PROVIDERS_UNET_LOCAL_REGISTRATIONS_H_
#define ZSOCK_PROVIDERS_UNET_LOCAL_REGISTRATIONS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/mutex.h"

namespace zsock::unet {

// One registration's private record (core/keyslot.h's slot shape).
struct PrivateSlot {
  std::atomic<uint32_t> gen{0};     // odd while live
  std::atomic<uint32_t> active{0};  // local emulated accesses in progress
  uint64_t addr = 0;
  uint64_t len = 0;
  uint32_t access = 0;
};

class LocalRegistrations {
 public:
  explicit LocalRegistrations(uint32_t slots);

  uint32_t size() const { return size_; }
  PrivateSlot* slot(uint32_t i) { return &slots_[i]; }

  // A free slot; ResourceExhausted when all are in use.
  absl::StatusOr<uint32_t> Take();
  void Release(uint32_t slot);

  // Records a live registration of [addr, addr + len) with `access` in
  // `slot` and returns its new generation (odd).
  uint32_t Activate(uint32_t slot, uint64_t addr, uint64_t len, uint32_t access);

  // Runs fn(addr) while (slot, gen) names a live registration that covers
  // [addr, addr + len) with `access` (Revoke waits for it); otherwise
  // PermissionDenied, saying why.
  absl::Status Access(uint32_t slot, uint32_t gen, uint64_t addr, size_t len, uint32_t access,
                      absl::FunctionRef<void(void*)> fn);

 private:
  const uint32_t size_;
  std::unique_ptr<PrivateSlot[]> slots_;
  Mutex mu_;
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zsock::unet

#endif  // ZSOCK_PROVIDERS_UNET_LOCAL_REGISTRATIONS_H_
