// The fabric's private record of its registrations, behind
// Fabric::AccessLocal: one slot per registration, handed out and taken
// back here, holding the range, rights and generation that decide every
// emulated access to this process's memory (never what a key claims, nor
// the shared key table, which peers may write).
//
// Every provider keeps such a table; it is kept apart here so that one
// shared core toolkit can replace it.
#ifndef ZSOCK_PROVIDERS_UCX_LOCAL_KEY_TABLE_H_
#define ZSOCK_PROVIDERS_UCX_LOCAL_KEY_TABLE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "core/mutex.h"

namespace zsock::ucx {

// One registration's private record (a slot type for core/keyslot.h).
struct PrivateSlot {
  std::atomic<uint32_t> gen{0};     // odd while live
  std::atomic<uint32_t> active{0};  // local emulated accesses in progress
  uint64_t addr = 0;
  uint64_t len = 0;
  uint32_t access = 0;
};

class LocalKeyTable {
 public:
  // `slots` records, all free.
  void Init(size_t slots);
  size_t size() const { return slots_; }

  // A free slot (the lowest first), or none when all are in use.
  std::optional<uint32_t> Take();
  void Give(uint32_t slot);
  // Records a live registration in `slot`; returns its generation (odd).
  uint32_t Publish(uint32_t slot, uint64_t addr, uint64_t len, uint32_t access);
  PrivateSlot* at(uint32_t slot) { return &own_[slot]; }

  // Fabric::AccessLocal for key (slot, gen): runs fn(addr) while the
  // registration is pinned if it is live and covers [addr, addr + len)
  // with `access`; else PermissionDenied without touching memory.
  absl::Status Access(uint32_t slot, uint32_t gen, uint64_t addr, size_t len, uint32_t access,
                      absl::FunctionRef<void(void*)> fn);

 private:
  std::unique_ptr<PrivateSlot[]> own_;
  size_t slots_ = 0;
  Mutex mu_;
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zsock::ucx

#endif  // ZSOCK_PROVIDERS_UCX_LOCAL_KEY_TABLE_H_
