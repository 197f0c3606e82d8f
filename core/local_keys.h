// LocalKeyTable: a fabric's private record of its live registrations, the
// one thing Fabric::AccessLocal trusts.
//
// Core emulation performs a peer's read, write or atomic on this process's
// memory only when the key it names is live here and covers the range with
// the rights asked for; the range a RemoteKey claims is never trusted. A key
// is (slot, generation): the generation is odd while the registration is
// live and is bumped when it is revoked, so a stale key never names a later
// registration that reuses its slot. Revoking is lock-free and
// allocation-free (the registration cache revokes from free/munmap hooks):
// it makes the generation even, then waits for accesses already inside.
//
// Slots are allocated in chunks as registrations arrive, up to `capacity`;
// a chunk never moves, so accesses read it without a lock.
#ifndef ZSOCK_CORE_LOCAL_KEYS_H_
#define ZSOCK_CORE_LOCAL_KEYS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "core/mutex.h"

namespace zsock {

class LocalKeyTable {
 public:
  struct Key {
    uint32_t slot = 0;
    uint32_t gen = 0;  // odd while the registration is live
  };
  // The bytes of a Key inside a provider's RemoteKey blob.
  static constexpr size_t kEncodedSize = 8;
  static void Encode(Key key, uint8_t out[kEncodedSize]);
  static Key Decode(const uint8_t in[kEncodedSize]);

  // Holds at most `capacity` live registrations (1 to 2^24).
  explicit LocalKeyTable(uint32_t capacity);
  ~LocalKeyTable();
  LocalKeyTable(const LocalKeyTable&) = delete;
  LocalKeyTable& operator=(const LocalKeyTable&) = delete;

  uint32_t capacity() const { return capacity_; }

  // Records a live registration of [addr, addr + len) with `access`;
  // nullopt when `capacity` registrations are live (the provider's error
  // says which setting raises it).
  std::optional<Key> Add(uint64_t addr, uint64_t len, uint32_t access);

  // Refuses `key` from now on: true for the call that did it, false when it
  // was revoked already (or never live). Lock-free, no allocation.
  bool BeginRevoke(Key key) noexcept;
  // Waits until no access under `key`'s slot is in progress. Lock-free.
  void AwaitAccesses(Key key) noexcept;
  // BeginRevoke, then AwaitAccesses when this call revoked.
  bool Revoke(Key key) noexcept;
  // Revokes `key` if still live and returns its slot for reuse.
  void Remove(Key key);

  // Runs fn(addr) while `key` is held live, if it is live and covers
  // [addr, addr + len) granting `access`; else PermissionDenied naming the
  // reason, without touching memory.
  absl::Status Access(Key key, uint64_t addr, size_t len, uint32_t access,
                      absl::FunctionRef<void(void*)> fn);

 private:
  // Field names as core/keyslot.h's PinKeySlot expects.
  struct Slot {
    std::atomic<uint32_t> gen{0};
    std::atomic<uint32_t> active{0};  // accesses in progress
    uint64_t addr = 0;
    uint64_t len = 0;
    uint32_t access = 0;
  };
  static constexpr uint32_t kChunkSlots = 256;

  // Null when `slot` was never handed out.
  Slot* At(uint32_t slot) const;

  const uint32_t capacity_;
  // One pointer per chunk; a chunk is written once, under mu_.
  std::unique_ptr<std::atomic<Slot*>[]> chunks_;
  Mutex mu_;
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);
  uint32_t used_ ABSL_GUARDED_BY(mu_) = 0;  // slots handed out so far
};

}  // namespace zsock

#endif  // ZSOCK_CORE_LOCAL_KEYS_H_
