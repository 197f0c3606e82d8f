// Memory registration over libfabric: OfiRegion (one fi_mr_reg), the
// remote key blob a region hands to peers, and its decoding on the
// initiator's side (DecodeRemoteKey). OfiFabric::RegisterMemory and
// AccessLocal are defined in memory.cc.
//
// Remote key blob: u8 flags (kBlobRaw: raw key bytes follow; kBlobVirt:
// virtual addressing), the registration's key in the fabric's
// LocalKeyTable (LocalKeyTable::Encode, 8 bytes: a stale key never names a
// later registration), then the u64 key or the raw key. Only the target
// reads the table key (AccessLocal), in blobs it made itself; the
// initiator reads the flags and what follows the header.
#ifndef ZSOCK_PROVIDERS_OFI_MEMORY_H_
#define ZSOCK_PROVIDERS_OFI_MEMORY_H_

#include <rdma/fi_domain.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "core/local_keys.h"
#include "core/provider.h"

namespace zsock::ofi {

class OfiFabric;

inline constexpr uint8_t kBlobRaw = 1, kBlobVirt = 2;
inline constexpr size_t kBlobHeader = 1 + LocalKeyTable::kEncodedSize;

class OfiRegion final : public MemoryRegion {
 public:
  OfiRegion(OfiFabric* fabric, void* addr, size_t len, uint32_t access, fid_mr* mr,
            std::vector<uint8_t> blob, LocalKeyTable::Key key)
      : MemoryRegion(addr, len, access), fabric_(fabric), mr_(mr), blob_(std::move(blob)),
        desc_(fi_mr_desc(mr)), key_(key) {}
  ~OfiRegion() override;
  void* desc() const override { return desc_; }
  RemoteKey remote_key() const override;
  // Stops emulated access (waiting for one in progress) and closes the MR,
  // which stops native access: at once when the domain lock is free, else
  // by its next holder (DomainMutex). Safe from the memory-release hooks: no
  // blocking lock, no allocation.
  void Revoke() noexcept override;

 private:
  OfiFabric* fabric_;
  std::atomic<fid_mr*> mr_;
  std::vector<uint8_t> blob_;
  void* desc_;
  LocalKeyTable::Key key_;  // in the fabric's table until ~OfiRegion
};

// Raw keys (FI_MR_RAW) an endpoint has mapped (fi_mr_map_raw), by their bytes.
using RawKeyMap = absl::flat_hash_map<std::string, uint64_t>;

// The key and target address of an access to [remote_addr, +len) through
// `rkey`: refuses a range outside the key's region and a malformed key,
// and maps a raw key once (into `raw_keys`). Domain lock held.
absl::Status DecodeRemoteKey(fid_domain* domain, RawKeyMap* raw_keys, const RemoteKey& rkey,
                             uint64_t remote_addr, size_t len, uint64_t* key, uint64_t* addr);

}  // namespace zsock::ofi

#endif  // ZSOCK_PROVIDERS_OFI_MEMORY_H_
