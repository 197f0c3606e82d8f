// The verbs provider's registrations: a Registrar seam between them and
// the device (ibv_reg_mr / ibv_dereg_mr in the provider, a fake in tests),
// VerbsRegion over it, recorded in the fabric's LocalKeyTable (the record
// core's emulated accesses are checked against), and the lkey of a region
// for work requests.
#ifndef ZSOCK_PROVIDERS_VERBS_REGION_H_
#define ZSOCK_PROVIDERS_VERBS_REGION_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "core/local_keys.h"
#include "core/provider.h"

namespace zsock::verbs {

// The seam between the provider's registrations and the device: ibv_reg_mr
// and ibv_dereg_mr in production, a fake in tests.
class Registrar {
 public:
  struct Keys {
    void* handle = nullptr;  // ibv_mr*
    uint32_t lkey = 0;
    uint32_t rkey = 0;
  };
  virtual ~Registrar() = default;
  virtual absl::StatusOr<Keys> Register(void* addr, size_t len, int ibv_access) = 0;
  // Must be callable from memory-release hooks (no zsock locks).
  virtual void Deregister(void* handle) noexcept = 0;
};

// One registration, live in `table` under `key`. Revoke refuses the key
// (waiting for emulated accesses in progress) and deregisters at once (the
// HCA then refuses the rkey); the destructor revokes if Revoke did not and
// frees the key's slot.
class VerbsRegion final : public MemoryRegion {
 public:
  VerbsRegion(Registrar* registrar, LocalKeyTable* table, LocalKeyTable::Key key, void* addr,
              size_t len, uint32_t access, Registrar::Keys keys);
  ~VerbsRegion() override;
  void* desc() const override { return const_cast<uint32_t*>(&lkey_); }
  uint32_t lkey() const { return lkey_; }
  uint32_t rkey() const { return rkey_; }
  RemoteKey remote_key() const override;
  void Revoke() noexcept override;
  bool revoked() const { return handle_.load() == nullptr; }

 private:
  Registrar* registrar_;
  LocalKeyTable* table_;
  LocalKeyTable::Key key_;
  std::atomic<void*> handle_;
  uint32_t lkey_;
  uint32_t rkey_;
};

// Records the region in `table`, then registers it through `registrar`.
// ResourceExhausted when `table` is full (the fix names max_registrations).
absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(Registrar* registrar, LocalKeyTable* table,
                                                       void* addr, size_t len, uint32_t access);

// The lkey of a region this provider made (desc() points at it).
inline uint32_t LkeyOf(const MemoryRegion* mr) {
  return *static_cast<const uint32_t*>(mr->desc());
}

}  // namespace zsock::verbs

#endif  // ZSOCK_PROVIDERS_VERBS_REGION_H_
