// The key table: one slot per registration, as the target and (through
// shared memory) its peers see it, and the RemoteKey blob naming a slot.
//
// When the fabric has native RMA the table lives in UCX posix shared
// memory and peers map it (ucp_rkey_ptr): before a native access the
// initiator pins the target's slot, checking the key against the target's
// own record (unet's protocol, core/keyslot.h). Emulated accesses never
// trust this table, which peers can write: the target checks them against
// its private copy (core/local_keys.h).
#ifndef ZSOCK_PROVIDERS_UCX_KEY_TABLE_H_
#define ZSOCK_PROVIDERS_UCX_KEY_TABLE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "core/keyslot.h"
#include "core/provider.h"

namespace zsock::ucx {

// One registration. gen is odd while the registration is live; an
// initiator doing a native access counts itself in `active` first.
struct alignas(64) KeySlot {
  std::atomic<uint32_t> gen;
  std::atomic<uint32_t> active;
  uint32_t access;
  uint16_t flags;     // kSlotNative
  uint16_t rkey_len;  // packed UCP rkey of a native region
  uint64_t addr;
  uint64_t len;
  uint8_t rkey[96];
};
static_assert(sizeof(KeySlot) == 128);
inline constexpr uint16_t kSlotNative = 1;

// RemoteKey blob: u8 version(1) | u8 flags (kSlotNative) | u16 0 | u32 slot | u32 gen.
inline constexpr size_t kBlobSize = 12;

struct BlobKey {
  uint8_t flags = 0;
  uint32_t slot = 0;
  uint32_t gen = 0;
};

inline bool DecodeBlob(const RemoteKey& key, BlobKey* out) {
  if (key.blob.size() != kBlobSize || key.blob[0] != 1) return false;
  out->flags = key.blob[1];
  std::memcpy(&out->slot, key.blob.data() + 4, 4);
  std::memcpy(&out->gen, key.blob.data() + 8, 4);
  return true;
}

inline void EncodeBlob(uint8_t flags, uint32_t slot, uint32_t gen, RemoteKey* key) {
  key->blob.assign(kBlobSize, 0);
  key->blob[0] = 1;
  key->blob[1] = flags;
  std::memcpy(key->blob.data() + 4, &slot, 4);
  std::memcpy(key->blob.data() + 8, &gen, 4);
}

// Checks (addr, len, access) against the registration's own record in a
// peer's `table` of `slots`. On success the caller is counted in the
// slot's `active` and must Unpin.
inline absl::Status PinKey(KeySlot* table, size_t slots, const BlobKey& key, uint64_t addr,
                           size_t len, uint32_t access, KeySlot** pinned) {
  if (key.slot >= slots || (key.gen & 1) == 0) {
    return RemoteKeyError("the key is malformed", addr, len);
  }
  if (absl::Status st = PinKeySlot(&table[key.slot], key.gen, addr, len, access); !st.ok()) {
    return st;
  }
  *pinned = &table[key.slot];
  return absl::OkStatus();
}

inline void Unpin(KeySlot* e) { UnpinKeySlot(e); }

// The access right a one-sided operation needs.
inline uint32_t AccessFor(OpType op) {
  switch (op) {
    case OpType::kRead: return kRemoteRead;
    case OpType::kWrite: return kRemoteWrite;
    default: return kRemoteAtomic;
  }
}

}  // namespace zsock::ucx

#endif  // ZSOCK_PROVIDERS_UCX_KEY_TABLE_H_
