// The registration (pin-down) cache shared by every provider.
//
// Get() returns a registration covering [addr, addr + len) with at least the
// requested access, reusing a cached one when it covers the range (a hit) and
// registering page-aligned ranges otherwise (a miss). Unused entries are kept
// in LRU order and evicted when the byte or count limit is exceeded; entries
// still referenced by callers are never deregistered under them.
//
// Invalidation: when memory inside a cached range is released (free,
// munmap, mremap, madvise(DONTNEED), shmdt; see core/memhooks.h) the entry's
// remote key is revoked at once (MemoryRegion::Revoke) and the entry leaves
// the cache, so a later Get() of the same address registers anew and a peer
// holding the old key is refused. Invalidate() does the same on request.
#ifndef ZSOCK_CORE_RCACHE_H_
#define ZSOCK_CORE_RCACHE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/provider.h"

namespace zsock {

struct RcacheLimits {
  size_t max_bytes = size_t{1} << 30;  // config: rcache_max_bytes
  size_t max_entries = 4096;           // config: rcache_max_entries
};

struct RcacheStats {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;
  uint64_t invalidations = 0;
  size_t entries = 0;
  size_t bytes = 0;
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
  // Revokes and drops every entry overlapping [addr, addr + len).
  void Invalidate(const void* addr, size_t len);
  // Drops every unreferenced entry.
  void Flush();
  RcacheStats stats() const;

 private:
  struct Entry;
  static void OnMemoryReleased(void* self, uintptr_t addr, size_t len);
  void EvictLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveLocked(std::map<uintptr_t, std::shared_ptr<Entry>>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  RegisterFn register_;
  RcacheLimits limits_;
  int hook_id_ = -1;
  mutable absl::Mutex mu_;
  // Keyed by start address; entries never overlap each other.
  std::map<uintptr_t, std::shared_ptr<Entry>> by_addr_ ABSL_GUARDED_BY(mu_);
  std::list<Entry*> lru_ ABSL_GUARDED_BY(mu_);  // front = most recent
  RcacheStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zsock

#endif  // ZSOCK_CORE_RCACHE_H_
