// The registration (pin-down) cache (see rcache.h).
//
// Policies:
//  - Entries are page-aligned and never overlap. A miss whose range overlaps
//    cached entries registers their union, with the union of their access,
//    and replaces them: unreferenced ones are deregistered; referenced ones
//    leave the index but stay alive for their holders ("detached") and are
//    still revoked when their memory is released.
//  - Neither the registration callback nor deregistration (destroying a
//    region) runs under mu_. A release overlapping a registration in flight
//    marks it stale: Get discards it and registers again (bounded).
//  - The release handler runs inside free(): it only revokes, unlinks and
//    moves references onto a chain (no allocation, no deregistration, since a
//    provider's deregistration may take locks the releasing thread holds);
//    the next Get/Invalidate/Flush deregisters those entries.
//  - Every mu_-held section runs under ScopedMemoryHookBypass, so memory the
//    cache frees while holding mu_ (map and list nodes) does not re-enter
//    the handler on this thread; and since the hooks never call a handler on
//    a bypassed thread, the handler never runs on a thread holding mu_.
//    Frees skipped this way are of the cache's own small nodes, which never
//    hold registered user data.
//
// Hand-written: the caches in libfabric and UCX are internal to them.

#include "core/rcache.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <iterator>
#include <utility>

#include "absl/base/dynamic_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_format.h"
#include "core/log.h"
#include "core/memhooks.h"
#include "core/status.h"

namespace zsock {

struct RegistrationCache::Entry {
  uintptr_t start = 0;
  uintptr_t end = 0;
  uint32_t access = 0;
  std::shared_ptr<MemoryRegion> region;  // the cache's own reference
  std::list<Entry*>::iterator lru_pos;   // valid while indexed
  // Link of the graveyard / dead chains (pushing allocates nothing).
  std::shared_ptr<Entry> next_dead;

  size_t bytes() const { return end - start; }
  // Whether a caller holds the region. Callers only get copies from Get,
  // under mu_, so a count of 1 seen under mu_ stays 1 until mu_ is released.
  bool InUse() const { return region.use_count() > 1; }
};

// A registration running without mu_, linked on Get's stack.
struct RegistrationCache::Pending {
  uintptr_t start = 0;
  uintptr_t end = 0;
  bool stale = false;  // memory in [start, end) was released meanwhile
  Pending* prev = nullptr;
  Pending* next = nullptr;
};

namespace {

// How many times Get registers before giving up on memory that keeps being
// released while it is registered.
constexpr int kMaxAttempts = 8;

// Guards for the cache's SharedMutex that also bypass the memory hooks
// while the lock is held: the bypass member is constructed before locking
// and destroyed after unlocking.
class ABSL_SCOPED_LOCKABLE WriterLock {
 public:
  explicit WriterLock(SharedMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~WriterLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  ScopedMemoryHookBypass bypass_;
  SharedMutex* const mu_;
};

class ABSL_SCOPED_LOCKABLE ReaderLock {
 public:
  explicit ReaderLock(SharedMutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->ReaderLock();
  }
  ~ReaderLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  ScopedMemoryHookBypass bypass_;
  SharedMutex* const mu_;
};

uintptr_t PageSize() {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// [*start, *end): [addr, addr + len) widened to whole pages. False if it
// wraps around the address space.
bool PageRange(uintptr_t addr, size_t len, uintptr_t* start, uintptr_t* end) {
  const uintptr_t page = PageSize();
  uintptr_t last, up;
  if (__builtin_add_overflow(addr, len, &last) ||
      __builtin_add_overflow(last, page - 1, &up)) {
    return false;
  }
  *start = addr & ~(page - 1);
  *end = up & ~(page - 1);
  return true;
}

// The first entry of `index` overlapping [start, end), or index.end().
template <typename Index>
auto FirstOverlap(Index& index, uintptr_t start, uintptr_t end)
    -> decltype(index.begin()) {
  auto it = index.upper_bound(start);
  if (it != index.begin()) {
    auto prev = std::prev(it);
    if (prev->second->end > start) return prev;
  }
  if (it != index.end() && it->first < end) return it;
  return index.end();
}

template <typename EntryPtr>
void PushDead(EntryPtr e, EntryPtr* chain) {
  e->next_dead = std::move(*chain);
  *chain = std::move(e);
}

// Appends chain `more` at the end of *chain.
template <typename EntryPtr>
void AppendChain(EntryPtr* chain, EntryPtr more) {
  while (*chain != nullptr) chain = &(*chain)->next_dead;
  *chain = std::move(more);
}

// Stops remote access to every region on the chain (MemoryRegion::Revoke:
// no allocation, no blocking lock).
template <typename EntryT>
void RevokeChain(EntryT* e) {
  for (; e != nullptr; e = e->next_dead.get()) e->region->Revoke();
}

// Drops the chain's references one by one (iteratively: no deep recursion).
// Regions whose last reference this was are deregistered here.
template <typename EntryPtr>
void DestroyChain(EntryPtr head) {
  while (head != nullptr) {
    EntryPtr next = std::move(head->next_dead);
    head.reset();
    head = std::move(next);
  }
}

}  // namespace

RegistrationCache::RegistrationCache(RegisterFn reg, RcacheLimits limits)
    : register_(std::move(reg)), limits_(limits) {
  hook_id_ = AddMemoryReleaseHandler(&RegistrationCache::OnMemoryReleased, this);
  if (hook_id_ < 0) {
    ZS_LOG(kWarn,
           "rcache: the memory-release handler table is full (64), so this "
           "cache is not invalidated when memory is released; fix: create "
           "fewer caches, or call Invalidate() before releasing memory");
  } else if (!MemoryHooksActive()) {
    ZS_LOG(kInfo,
           "rcache: memory-release hooks are inactive (ZSOCK_MEMHOOKS=off, or "
           "core:memhooks not linked into the executable); callers must call "
           "Invalidate() before releasing registered memory");
  }
}

RegistrationCache::~RegistrationCache() {
  // Waits for handler calls in progress on other threads.
  if (hook_id_ >= 0) RemoveMemoryReleaseHandler(hook_id_);
  std::shared_ptr<Entry> dead;
  {
    WriterLock lock(&mu_);
    while (!by_addr_.empty()) PushDead(RemoveLocked(by_addr_.begin()), &dead);
    for (auto& d : detached_) PushDead(std::move(d), &dead);
    detached_.clear();
    CollectDeadLocked(&dead);
    UpdateTrackedLocked();
  }
  // Regions still held by callers stay alive (and registered) for them.
  DestroyChain(std::move(dead));
}

namespace {

// Get's error when every attempt's range was released while registering.
absl::Status StaleError(uintptr_t start, uintptr_t end) {
  return ErrnoError(
      EAGAIN,
      absl::StrFormat("rcache: memory in [%#x, %#x) was released while it "
                      "was being registered, %d times in a row",
                      start, end, kMaxAttempts),
      "retry; if the buffer itself was released, the caller has a "
      "use-after-free");
}

}  // namespace

std::shared_ptr<MemoryRegion> RegistrationCache::HitOrPendLocked(
    uintptr_t start, uintptr_t end, uint32_t access, bool merge, bool count,
    Pending* pending, uint32_t* reg_access) {
  auto it = by_addr_.upper_bound(start);
  if (it != by_addr_.begin()) {
    Entry* e = std::prev(it)->second.get();
    if (e->start <= start && end <= e->end && (e->access & access) == access) {
      lru_.splice(lru_.begin(), lru_, e->lru_pos);
      if (count) ++stats_.hits;
      return e->region;
    }
  }
  if (count) ++stats_.misses;
  pending->start = start;
  pending->end = end;
  *reg_access = access;
  if (merge) {
    for (auto o = FirstOverlap(by_addr_, start, end);
         o != by_addr_.end() && o->first < end; ++o) {
      pending->start = std::min(pending->start, o->second->start);
      pending->end = std::max(pending->end, o->second->end);
      *reg_access |= o->second->access;
    }
  }
  pending->next = pending_;
  if (pending_ != nullptr) pending_->prev = pending;
  pending_ = pending;
  ++num_pending_;
  UpdateTrackedLocked();
  return nullptr;
}

void RegistrationCache::UnlinkPendingLocked(Pending* pending) {
  if (pending->prev != nullptr) pending->prev->next = pending->next;
  else pending_ = pending->next;
  if (pending->next != nullptr) pending->next->prev = pending->prev;
  --num_pending_;
  UpdateTrackedLocked();
}

std::shared_ptr<MemoryRegion> RegistrationCache::InstallLocked(
    std::shared_ptr<Entry> entry, std::shared_ptr<Entry>* dead) {
  // Replace the entries the new one covers (all of them, if merged; entries
  // added meanwhile by other threads, too).
  for (auto o = FirstOverlap(by_addr_, entry->start, entry->end);
       o != by_addr_.end() && o->first < entry->end;) {
    auto next = std::next(o);
    std::shared_ptr<Entry> old = RemoveLocked(o);
    if (old->InUse()) {
      detached_.push_front(std::move(old));
    } else {
      PushDead(std::move(old), dead);
    }
    o = next;
  }
  by_addr_.emplace(entry->start, entry);
  lru_.push_front(entry.get());
  entry->lru_pos = lru_.begin();
  ++stats_.entries;
  stats_.bytes += entry->bytes();
  // Taken before eviction, which may evict this very entry (over the limits
  // on its own): the caller still gets the registration.
  std::shared_ptr<MemoryRegion> region = entry->region;
  EvictLocked(dead);
  return region;
}

absl::StatusOr<std::shared_ptr<RegistrationCache::Entry>> RegistrationCache::Register(
    const Pending& pending, uint32_t access) {
  absl::StatusOr<std::unique_ptr<MemoryRegion>> reg =
      register_(reinterpret_cast<void*>(pending.start), pending.end - pending.start, access);
  if (!reg.ok()) return reg.status();
  if (*reg == nullptr) return nullptr;
  return std::make_shared<Entry>(Entry{
      .start = pending.start, .end = pending.end, .access = access, .region = std::move(*reg)});
}

absl::StatusOr<std::shared_ptr<MemoryRegion>> RegistrationCache::Get(
    void* addr, size_t len, uint32_t access) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  if (len == 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, 0,
                     "rcache: cannot register an empty range",
                     "pass a length of at least 1 byte");
  }
  uintptr_t start, end;
  if (!PageRange(a, len, &start, &end)) {
    return MakeError(
        absl::StatusCode::kInvalidArgument, 0,
        absl::StrFormat("rcache: range at %#x of %u bytes wraps around the "
                        "address space",
                        a, len),
        "pass a valid buffer");
  }

  bool merge = true;
  for (int attempt = 0;; ++attempt) {
    std::shared_ptr<Entry> dead;
    std::shared_ptr<MemoryRegion> hit;
    Pending pending;
    uint32_t reg_access = access;
    {
      WriterLock lock(&mu_);
      CollectDeadLocked(&dead);
      hit = HitOrPendLocked(start, end, access, merge, attempt == 0, &pending,
                            &reg_access);
    }
    DestroyChain(std::move(dead));
    if (hit != nullptr) return hit;

    // `pending` lives on this stack frame: unlink it even if the callback
    // (or an allocation) throws.
    absl::Cleanup unlink_on_throw = [this, &pending] {
      WriterLock lock(&mu_);
      UnlinkPendingLocked(&pending);
    };
    // Register without mu_: it may be slow, and the provider may release
    // memory (re-entering OnMemoryReleased) while doing it.
    absl::StatusOr<std::shared_ptr<Entry>> reg = Register(pending, reg_access);
    std::shared_ptr<Entry> entry = reg.ok() ? *reg : nullptr;

    std::shared_ptr<MemoryRegion> result;
    bool stale;
    std::move(unlink_on_throw).Cancel();
    {
      WriterLock lock(&mu_);
      UnlinkPendingLocked(&pending);
      stale = pending.stale;
      if (entry != nullptr && !stale) result = InstallLocked(entry, &dead);
      UpdateTrackedLocked();
    }
    const bool was_merged = pending.start != start || pending.end != end ||
                            reg_access != access;
    if (stale) entry.reset();  // never handed out: deregister
    DestroyChain(std::move(dead));

    if (!reg.ok()) {
      // A merged range may fail where the caller's own would not (part of it
      // unmapped while hooks are off, say): retry without merging.
      if (merge && was_merged && attempt + 1 < kMaxAttempts) {
        merge = false;
        continue;
      }
      return reg.status();
    }
    if (entry == nullptr && !stale) {
      return MakeError(absl::StatusCode::kInternal, 0,
                       "rcache: the registration callback returned no region",
                       "fix the provider's RegisterMemory");
    }
    if (stale) {
      if (attempt + 1 < kMaxAttempts) continue;
      return StaleError(pending.start, pending.end);
    }
    return result;
  }
}

void RegistrationCache::Invalidate(const void* addr, size_t len) {
  if (len == 0) return;
  const uintptr_t start = reinterpret_cast<uintptr_t>(addr);
  uintptr_t end;
  if (__builtin_add_overflow(start, len, &end)) end = UINTPTR_MAX;
  std::shared_ptr<Entry> dead;
  {
    WriterLock lock(&mu_);
    InvalidateLocked(start, end, &dead);
  }
  RevokeChain(dead.get());
  {
    WriterLock lock(&mu_);
    CollectDeadLocked(&dead);
  }
  DestroyChain(std::move(dead));
}

void RegistrationCache::Flush() {
  std::shared_ptr<Entry> dead;
  {
    WriterLock lock(&mu_);
    for (auto it = by_addr_.begin(); it != by_addr_.end();) {
      auto next = std::next(it);
      if (!it->second->InUse()) PushDead(RemoveLocked(it), &dead);
      it = next;
    }
    CollectDeadLocked(&dead);
  }
  DestroyChain(std::move(dead));
}

RcacheStats RegistrationCache::stats() const {
  ReaderLock lock(&mu_);
  return stats_;
}

// Runs inside free()/munmap()/... on the releasing thread, with the hooks
// bypassed on it (so this thread holds no mu_: every mu_ holder is
// bypassed). Allocates nothing and does not deregister.
void RegistrationCache::OnMemoryReleased(void* self, uintptr_t addr,
                                         size_t len) {
  auto* cache = static_cast<RegistrationCache*>(self);
  if (len == 0 || cache->tracked_.load(std::memory_order_acquire) == 0) return;
  uintptr_t end;
  if (__builtin_add_overflow(addr, len, &end)) end = UINTPTR_MAX;
  {
    // Most releases touch no cached memory: check under the shared lock.
    ReaderLock lock(&cache->mu_);
    if (!cache->OverlapsLocked(addr, end)) return;
  }
  std::shared_ptr<Entry> invalidated;
  {
    WriterLock lock(&cache->mu_);
    cache->InvalidateLocked(addr, end, &invalidated, ReleaseIsHeapBlock());
  }
  // Outside mu_ (still before the memory goes): a provider's revocation may
  // take the provider's own locks (libfabric's fi_close), and the provider
  // may release memory while holding them, which brings its thread here,
  // to mu_ (a lock-order inversion ThreadSanitizer found in ofi_test). The
  // entries are out of the index already: nobody else can get them.
  RevokeChain(invalidated.get());
  if (invalidated == nullptr) return;
  WriterLock lock(&cache->mu_);
  // Destroyed later, not here: dropping a region deregisters it, which may
  // allocate and free.
  AppendChain(&invalidated, std::move(cache->graveyard_));
  cache->graveyard_ = std::move(invalidated);
}

RegistrationCache::Index::const_iterator RegistrationCache::FirstOverlapLocked(
    uintptr_t start, uintptr_t end) const {
  return FirstOverlap(by_addr_, start, end);
}

bool RegistrationCache::OverlapsLocked(uintptr_t start, uintptr_t end) const {
  if (FirstOverlapLocked(start, end) != by_addr_.end()) return true;
  for (const auto& d : detached_) {
    if (d->start < end && start < d->end) return true;
  }
  for (const Pending* p = pending_; p != nullptr; p = p->next) {
    if (p->start < end && start < p->end) return true;
  }
  return false;
}

void RegistrationCache::InvalidateLocked(uintptr_t start, uintptr_t end,
                                         std::shared_ptr<Entry>* dead, bool heap_block) {
  // What the release can take away from the range [s, e). The block's
  // pages [span_start, span_end); the whole pages inside it [inner_start,
  // inner_end).
  const uintptr_t page = PageSize();
  uintptr_t span_start, span_end;
  if (!PageRange(start, end - start, &span_start, &span_end)) {
    span_start = start & ~(page - 1);
    span_end = UINTPTR_MAX;
  }
  const uintptr_t inner_start = start == span_start ? start : span_start + page;
  const uintptr_t inner_end = end & ~(page - 1);
  auto hit = [&](uintptr_t s, uintptr_t e) {
    if (!heap_block) return s < end && start < e;
    return (s < inner_end && inner_start < e) || (span_start <= s && e <= span_end);
  };
  for (auto it = FirstOverlap(by_addr_, start, end);
       it != by_addr_.end() && it->first < end;) {
    auto next = std::next(it);
    if (!hit(it->second->start, it->second->end)) {
      it = next;
      continue;
    }
    PushDead(RemoveLocked(it), dead);
    ++stats_.invalidations;
    it = next;
  }
  for (auto it = detached_.begin(); it != detached_.end();) {
    if ((*it)->start < end && start < (*it)->end && hit((*it)->start, (*it)->end)) {
      PushDead(std::move(*it), dead);
      it = detached_.erase(it);
      ++stats_.invalidations;
    } else {
      ++it;
    }
  }
  for (Pending* p = pending_; p != nullptr; p = p->next) {
    if (p->start < end && start < p->end && hit(p->start, p->end)) p->stale = true;
  }
  UpdateTrackedLocked();
}

void RegistrationCache::EvictLocked(std::shared_ptr<Entry>* dead) {
  auto over = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stats_.bytes > limits_.max_bytes ||
           stats_.entries > limits_.max_entries;
  };
  // Walk from the least recently used end; `it` is the element after the
  // candidate and stays valid when the candidate is erased.
  auto it = lru_.end();
  while (over() && it != lru_.begin()) {
    auto candidate = std::prev(it);
    Entry* e = *candidate;
    if (e->InUse()) {
      it = candidate;
      continue;
    }
    PushDead(RemoveLocked(by_addr_.find(e->start)), dead);
    ++stats_.evictions;
  }
}

std::shared_ptr<RegistrationCache::Entry> RegistrationCache::RemoveLocked(
    Index::iterator it) {
  std::shared_ptr<Entry> e = std::move(it->second);
  lru_.erase(e->lru_pos);
  by_addr_.erase(it);
  --stats_.entries;
  stats_.bytes -= e->bytes();
  return e;
}

void RegistrationCache::CollectDeadLocked(std::shared_ptr<Entry>* dead) {
  if (graveyard_ != nullptr) {
    AppendChain(&graveyard_, std::move(*dead));
    *dead = std::move(graveyard_);
  }
  for (auto it = detached_.begin(); it != detached_.end();) {
    if (!(*it)->InUse()) {
      PushDead(std::move(*it), dead);
      it = detached_.erase(it);
    } else {
      ++it;
    }
  }
  UpdateTrackedLocked();
}

void RegistrationCache::UpdateTrackedLocked() {
  tracked_.store(by_addr_.size() + detached_.size() + num_pending_,
                 std::memory_order_release);
}

}  // namespace zsock
