// The registration (pin-down) cache shared by every provider.
//
// Get() returns a registration covering [addr, addr + len) with at least the
// requested access, reusing a cached one when it covers the range (a hit) and
// registering page-aligned ranges otherwise (a miss). The region's address
// and its remote key's address are those of what was registered (a page
// boundary at or before `addr`, or a larger cached range), not `addr`: a
// peer must be told `addr` beside the key. Unused entries are kept
// in LRU order and evicted when the byte or count limit is exceeded; entries
// still referenced by callers are never deregistered under them.
//
// Invalidation: when memory inside a cached range is released (free,
// munmap, mremap, madvise(DONTNEED), shmdt; see core/memhooks.h) the entry's
// remote key is revoked at once (MemoryRegion::Revoke) and the entry leaves
// the cache, so a later Get() of the same address registers anew and a peer
// holding the old key is refused. Invalidate() does the same on request.
// Revocation is immediate; deregistration (destroying the cache's reference
// to the region) happens at the next Get/Invalidate/Flush, because it may
// not run inside free(). An entry a caller still holds is revoked but stays
// alive, registered, until the caller drops it.
//
// A miss whose page range overlaps cached entries registers the union of
// them all (with the union of their access) and replaces them; entries
// replaced while callers hold them leave the index but are still revoked
// when their memory is released. If the merged registration fails, the
// caller's own range is registered instead.
//
// Registration runs without the cache's lock. If memory in the range being
// registered is released meanwhile, that registration is discarded and Get
// registers again (up to 8 times, then fails with Unavailable/EAGAIN).
//
// The cache must outlive the regions it hands out for them to be revoked on
// release; regions held past the cache's destruction stay registered until
// dropped.
#ifndef ZSOCK_CORE_RCACHE_H_
#define ZSOCK_CORE_RCACHE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "core/mutex.h"
#include "core/provider.h"

namespace zsock {

struct RcacheLimits {
  size_t max_bytes = size_t{1} << 30;  // config: rcache_max_bytes
  size_t max_entries = 4096;           // config: rcache_max_entries
};

struct RcacheStats {
  uint64_t hits = 0;           // Get calls served from the cache
  uint64_t misses = 0;         // Get calls that registered (or failed to)
  uint64_t evictions = 0;      // entries dropped for the limits
  uint64_t invalidations = 0;  // registrations revoked by a release/Invalidate
  size_t entries = 0;          // entries in the index now
  size_t bytes = 0;            // bytes they cover
};

class RegistrationCache {
 public:
  using RegisterFn = std::function<absl::StatusOr<std::unique_ptr<MemoryRegion>>(
      void* addr, size_t len, uint32_t access)>;

  // `reg` performs a real registration (normally Fabric::RegisterMemory).
  RegistrationCache(RegisterFn reg, RcacheLimits limits);
  ~RegistrationCache();
  RegistrationCache(const RegistrationCache&) = delete;
  RegistrationCache& operator=(const RegistrationCache&) = delete;

  absl::StatusOr<std::shared_ptr<MemoryRegion>> Get(void* addr, size_t len,
                                                    uint32_t access);
  // Revokes and drops every entry overlapping [addr, addr + len) (including
  // replaced entries callers still hold).
  void Invalidate(const void* addr, size_t len);
  // Drops (deregisters) every unreferenced entry; not counted as evictions.
  void Flush();
  RcacheStats stats() const;

 private:
  struct Entry;
  struct Pending;
  using Index = std::map<uintptr_t, std::shared_ptr<Entry>>;

  static void OnMemoryReleased(void* self, uintptr_t addr, size_t len);
  // First indexed entry overlapping [start, end), or by_addr_.end().
  Index::const_iterator FirstOverlapLocked(uintptr_t start, uintptr_t end) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Whether anything tracked (indexed, detached or being registered)
  // overlaps [start, end).
  bool OverlapsLocked(uintptr_t start, uintptr_t end) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Moves every entry overlapping [start, end) onto the `dead` chain (the
  // caller revokes them after releasing mu_: RevokeChain) and marks
  // overlapping registrations in flight stale. Allocates
  // nothing (it runs inside free()). With `heap_block` (a free of the heap
  // block [start, end), see ReleaseIsHeapBlock), only ranges that overlap
  // the whole pages inside the block or lie within the block's pages: a
  // registration whose first or last page the block merely shares stays.
  void InvalidateLocked(uintptr_t start, uintptr_t end,
                        std::shared_ptr<Entry>* dead, bool heap_block = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvictLocked(std::shared_ptr<Entry>* dead)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes an entry out of the index and the LRU list; returns the cache's
  // reference to it.
  std::shared_ptr<Entry> RemoveLocked(Index::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the graveyard and unreferenced detached entries onto `dead`.
  void CollectDeadLocked(std::shared_ptr<Entry>* dead)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateTrackedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Get's first step: the cached region covering [start, end) with
  // `access`, or nullptr after entering `pending` in the list of
  // registrations in flight (widened over overlapping entries if `merge`,
  // with their access bits in *reg_access). `count` counts a hit or miss.
  std::shared_ptr<MemoryRegion> HitOrPendLocked(uintptr_t start, uintptr_t end,
                                                uint32_t access, bool merge, bool count,
                                                Pending* pending, uint32_t* reg_access)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnlinkPendingLocked(Pending* pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Registers `pending`'s range with `access` through the provider's
  // callback, without mu_; nullptr when the callback returned no region.
  absl::StatusOr<std::shared_ptr<Entry>> Register(const Pending& pending, uint32_t access)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Indexes a new registration in place of the entries it covers (those
  // still in use are detached, the others go onto `dead`), then evicts
  // over the limits; returns the new region.
  std::shared_ptr<MemoryRegion> InstallLocked(std::shared_ptr<Entry> entry,
                                              std::shared_ptr<Entry>* dead)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  RegisterFn register_;
  RcacheLimits limits_;
  int hook_id_ = -1;
  mutable SharedMutex mu_;
  // Keyed by start address; entries never overlap each other.
  Index by_addr_ ABSL_GUARDED_BY(mu_);
  std::list<Entry*> lru_ ABSL_GUARDED_BY(mu_);  // front = most recent
  // Entries replaced in the index (by a merged registration) while callers
  // still held them: not used for hits, but still revoked on release.
  std::list<std::shared_ptr<Entry>> detached_ ABSL_GUARDED_BY(mu_);
  // Registrations in progress without mu_ (intrusive list on Get's stack).
  Pending* pending_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t num_pending_ ABSL_GUARDED_BY(mu_) = 0;
  // Entries invalidated by the release handler, which may not deregister
  // inside free(); destroyed by the next Get/Invalidate/Flush (a chain
  // through Entry::next_dead, so that pushing allocates nothing).
  std::shared_ptr<Entry> graveyard_ ABSL_GUARDED_BY(mu_);
  // by_addr_.size() + detached_.size() + num_pending_, readable without mu_:
  // the release handler returns at once when it is zero.
  std::atomic<size_t> tracked_{0};
  RcacheStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zsock

#endif  // ZSOCK_CORE_RCACHE_H_
