// Checking a remote access against a registration's key-table slot.
//
// unet's key protocol, which ucx reuses for native access to shared
// segments: a slot holds the registration's generation (odd while it is
// live), its range and its access rights, and counts the initiators inside
// an access (`active`), so that revoking it (gen made even) can wait until
// none is. A slot type needs the members gen, active (std::atomic<uint32_t>),
// addr, len (uint64_t) and access (uint32_t).
#ifndef ZSOCK_CORE_KEYSLOT_H_
#define ZSOCK_CORE_KEYSLOT_H_

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace zsock {

// A refused remote access to [addr, addr + len): `why` names the reason.
inline absl::Status RemoteKeyError(const char* why, uint64_t addr, size_t len) {
  return MakeError(absl::StatusCode::kPermissionDenied, EACCES,
                   absl::StrCat("remote access to [0x", absl::Hex(addr), ", +", len,
                                ") refused: ", why),
                   "use a key from a live registration and stay inside its range "
                   "with the access it grants");
}

// Counts the caller into `e` for an access of `access` to [addr, addr +
// len) under key generation `gen`; on success the caller must UnpinKeySlot
// when done, on failure it is not counted.
template <typename Slot>
absl::Status PinKeySlot(Slot* e, uint32_t gen, uint64_t addr, size_t len, uint32_t access) {
  // seq_cst: the revoker makes gen even, then waits for active == 0; an
  // initiator counts itself, then reads gen. One of the two sees the other.
  e->active.fetch_add(1, std::memory_order_seq_cst);
  const char* why = nullptr;
  if (e->gen.load(std::memory_order_seq_cst) != gen) {
    why = "the registration was released or revoked (stale key)";
  } else {
    // One read of each field (the table may be mapped by peers), after the
    // generation says the registration is the key's.
    const uint64_t base = e->addr, size = e->len;
    if (addr < base || len > size || addr - base > size - len) {
      why = "the range lies outside the registered region";
    } else if ((e->access & access) != access) {
      why = "the registration does not grant this access";
    }
  }
  if (why == nullptr) return absl::OkStatus();
  e->active.fetch_sub(1, std::memory_order_seq_cst);
  return RemoteKeyError(why, addr, len);
}

template <typename Slot>
void UnpinKeySlot(Slot* e) {
  e->active.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace zsock

#endif  // ZSOCK_CORE_KEYSLOT_H_
