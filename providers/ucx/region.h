// A ucx registration: a slot of the fabric's key tables (the shared
// KeySlot peers may read, the private record emulated accesses check) and,
// for memory from AllocateRegistered, the UCX mapping that owns the memory.
// Revoke makes both generations even and waits for accesses in progress:
// local emulated ones without bound, peers' native ones for at most a
// second (a peer killed mid-access would otherwise hold us forever).
#ifndef ZSOCK_PROVIDERS_UCX_REGION_H_
#define ZSOCK_PROVIDERS_UCX_REGION_H_

#include <ucp/api/ucp.h>

#include <cstddef>
#include <cstdint>

#include "core/provider.h"
#include "providers/ucx/key_table.h"
#include "core/local_keys.h"

namespace zsock::ucx {

class UcxFabric;

class UcxRegion final : public MemoryRegion {
 public:
  UcxRegion(UcxFabric* fabric, void* addr, size_t len, uint32_t access, LocalKeyTable::Key key,
            uint8_t flags, KeySlot* entry, ucp_mem_h memh)
      : MemoryRegion(addr, len, access), fabric_(fabric), key_(key), flags_(flags),
        entry_(entry), memh_(memh) {}
  ~UcxRegion() override;

  RemoteKey remote_key() const override;
  void Revoke() noexcept override;

 private:
  UcxFabric* fabric_;
  LocalKeyTable::Key key_;
  uint8_t flags_;
  KeySlot* entry_;
  ucp_mem_h memh_;  // allocated regions only: owns the memory
};

}  // namespace zsock::ucx

#endif  // ZSOCK_PROVIDERS_UCX_REGION_H_
