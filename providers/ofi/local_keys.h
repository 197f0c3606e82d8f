// LocalKeyTable: the fabric's private record of each live registration,
// by serial number. Core emulation's accesses to local memory on a peer's
// behalf (Fabric::AccessLocal) are checked against it, never against the
// range a key claims; revoking a registration waits for the accesses in
// progress without taking a lock.
#ifndef ZSOCK_PROVIDERS_OFI_LOCAL_KEYS_H_
#define ZSOCK_PROVIDERS_OFI_LOCAL_KEYS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/mutex.h"

namespace zsock::ofi {

// One registration's record. `active` counts accesses in progress, so
// that Revoke waits for them without taking a lock.
struct RegRecord {
  uint64_t addr = 0;
  uint64_t len = 0;
  uint32_t access = 0;
  std::atomic<bool> revoked{false};
  std::atomic<int> active{0};

  // Stops further accesses and waits for those in progress. Safe from the
  // memory-release hooks: no lock, no allocation.
  void Revoke() noexcept;
};

class LocalKeyTable {
 public:
  // Records a registration; the record stays valid until Forget(serial).
  RegRecord* Add(uint64_t serial, uint64_t addr, uint64_t len, uint32_t access);
  void Forget(uint64_t serial);

  // Runs `fn` on `addr` if the registration `serial` is live, holds
  // [addr, addr + len) and grants `access`; else refuses (RefuseAccess).
  absl::Status Access(uint64_t serial, uint64_t addr, size_t len, uint32_t access,
                      absl::FunctionRef<void(void*)> fn);

 private:
  Mutex mu_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<RegRecord>> regs_ ABSL_GUARDED_BY(mu_);
};

// The refusal of an access to [addr, +len) on a peer's behalf, saying why.
absl::Status RefuseAccess(uint64_t addr, size_t len, absl::string_view why);

}  // namespace zsock::ofi

#endif  // ZSOCK_PROVIDERS_OFI_LOCAL_KEYS_H_
