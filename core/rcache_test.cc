// Tests for the registration cache (core/rcache.h) with a fake provider
// region that records registrations, revocations and deregistrations.

#include "core/rcache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "core/memhooks.h"
#include "gtest/gtest.h"

namespace zsock {
namespace {

// What the fake provider saw. Revoke and the destructor may run inside
// free(), so they only touch atomics.
struct Tracker {
  static constexpr int kMaxRegions = 1 << 14;
  struct Call {
    uintptr_t addr;
    size_t len;
    uint32_t access;
  };

  std::atomic<int> registrations{0};
  std::atomic<int> revocations{0};
  std::atomic<int> destructions{0};
  std::atomic<bool> revoked[kMaxRegions] = {};
  std::atomic<bool> destroyed[kMaxRegions] = {};

  std::mutex mu;
  std::vector<Call> calls;  // guarded by mu

  // Optional behaviour of the next registrations.
  std::function<bool(uintptr_t addr, size_t len)> fail_if;
  std::function<void(uintptr_t addr, size_t len)> during_registration;

  Call call(int i) {
    std::lock_guard<std::mutex> lock(mu);
    return calls.at(i);
  }
};

class FakeRegion : public MemoryRegion {
 public:
  FakeRegion(void* addr, size_t len, uint32_t access, Tracker* tracker, int id)
      : MemoryRegion(addr, len, access), tracker_(tracker), id_(id) {}
  ~FakeRegion() override {
    tracker_->destroyed[id_].store(true);
    tracker_->destructions.fetch_add(1);
  }
  RemoteKey remote_key() const override {
    RemoteKey key;
    key.addr = reinterpret_cast<uint64_t>(addr());
    key.length = length();
    key.access = access();
    key.blob = {static_cast<uint8_t>(id_)};
    return key;
  }
  void Revoke() noexcept override {
    tracker_->revoked[id_].store(true);
    tracker_->revocations.fetch_add(1);
  }
  int id() const { return id_; }
  bool revoked() const { return tracker_->revoked[id_].load(); }

 private:
  Tracker* tracker_;
  int id_;
};

int IdOf(const std::shared_ptr<MemoryRegion>& r) {
  return static_cast<FakeRegion*>(r.get())->id();
}
bool Revoked(const std::shared_ptr<MemoryRegion>& r) {
  return static_cast<FakeRegion*>(r.get())->revoked();
}

RegistrationCache::RegisterFn FakeRegister(Tracker* t) {
  return [t](void* addr, size_t len,
             uint32_t access) -> absl::StatusOr<std::unique_ptr<MemoryRegion>> {
    const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
    if (t->during_registration) t->during_registration(a, len);
    if (t->fail_if && t->fail_if(a, len)) {
      return absl::ResourceExhaustedError("fake: registration refused");
    }
    const int id = t->registrations.fetch_add(1);
    if (id >= Tracker::kMaxRegions) return absl::InternalError("fake: too many");
    {
      std::lock_guard<std::mutex> lock(t->mu);
      t->calls.push_back({a, len, access});
    }
    return std::make_unique<FakeRegion>(addr, len, access, t, id);
  };
}

class RcacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Fake addresses come from a reserved, inaccessible mapping: nothing in
    // the process allocates or frees there, so no stray release can
    // invalidate the entries these tests count.
    arena_ = static_cast<char*>(mmap(nullptr, kArenaPages * page_, PROT_NONE,
                                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                                     -1, 0));
    ASSERT_NE(arena_, MAP_FAILED);
  }
  void TearDown() override {
    cache_.reset();
    if (arena_ != MAP_FAILED) munmap(arena_, kArenaPages * page_);
  }

  RegistrationCache& Cache(RcacheLimits limits = {}) {
    cache_ = std::make_unique<RegistrationCache>(FakeRegister(&tracker_), limits);
    return *cache_;
  }
  char* P(size_t page) { return arena_ + page * page_; }
  std::shared_ptr<MemoryRegion> MustGet(void* addr, size_t len,
                                        uint32_t access = kLocalRead) {
    auto r = cache_->Get(addr, len, access);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : nullptr;
  }

  static constexpr size_t kArenaPages = 256;
  const size_t page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  char* arena_ = static_cast<char*>(MAP_FAILED);
  Tracker tracker_;  // outlives the cache and the regions
  std::unique_ptr<RegistrationCache> cache_;
};

TEST_F(RcacheTest, HitOnSameAndSubRange) {
  RegistrationCache& cache = Cache();
  auto r1 = MustGet(P(0) + 100, 3 * page_);
  ASSERT_NE(r1, nullptr);
  // Registered page-aligned: [P(0), P(4)).
  ASSERT_EQ(tracker_.registrations.load(), 1);
  EXPECT_EQ(tracker_.call(0).addr, reinterpret_cast<uintptr_t>(P(0)));
  EXPECT_EQ(tracker_.call(0).len, 4 * page_);
  EXPECT_EQ(r1->addr(), P(0));
  EXPECT_EQ(r1->length(), 4 * page_);

  EXPECT_EQ(MustGet(P(0) + 100, 3 * page_), r1);  // same range
  EXPECT_EQ(MustGet(P(1), page_), r1);            // sub-range
  EXPECT_EQ(MustGet(P(3) + 5, 7), r1);            // inside the last page
  EXPECT_EQ(MustGet(P(0), 4 * page_), r1);        // the whole entry
  EXPECT_EQ(tracker_.registrations.load(), 1);

  RcacheStats s = cache.stats();
  EXPECT_EQ(s.hits, 4u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.entries, 1u);
  EXPECT_EQ(s.bytes, 4 * page_);
  EXPECT_EQ(s.evictions, 0u);
  EXPECT_EQ(s.invalidations, 0u);
}

TEST_F(RcacheTest, MissOnNewRange) {
  RegistrationCache& cache = Cache();
  auto a = MustGet(P(10), page_);
  auto b = MustGet(P(20), 2 * page_);
  auto c = MustGet(P(11), page_);  // adjacent to a: not merged
  auto d = MustGet(P(20), 3 * page_);  // extends b: a miss
  ASSERT_NE(a, nullptr);
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(b, d);
  EXPECT_EQ(tracker_.registrations.load(), 4);
  RcacheStats s = cache.stats();
  EXPECT_EQ(s.hits, 0u);
  EXPECT_EQ(s.misses, 4u);
  EXPECT_EQ(s.entries, 3u);  // d replaced b
  EXPECT_EQ(s.bytes, 5 * page_);
}

TEST_F(RcacheTest, AccessUpgradeIsAMiss) {
  RegistrationCache& cache = Cache();
  auto r1 = MustGet(P(0), 2 * page_, kLocalRead);
  auto r2 = MustGet(P(0), 2 * page_, kLocalRead | kRemoteWrite);
  ASSERT_NE(r2, nullptr);
  EXPECT_NE(r1, r2);
  EXPECT_EQ(r2->access(), kLocalRead | kRemoteWrite);
  EXPECT_EQ(tracker_.call(1).access, kLocalRead | kRemoteWrite);
  // Either subset of access now hits the upgraded registration.
  EXPECT_EQ(MustGet(P(0), page_, kLocalRead), r2);
  EXPECT_EQ(MustGet(P(1), page_, kRemoteWrite), r2);
  // Access is merged too: a new right on an overlapping range keeps the old.
  auto r3 = MustGet(P(1), 2 * page_, kRemoteRead);
  EXPECT_EQ(r3->access(), kLocalRead | kRemoteWrite | kRemoteRead);
  EXPECT_EQ(r3->addr(), P(0));
  EXPECT_EQ(r3->length(), 3 * page_);
  RcacheStats s = cache.stats();
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.misses, 3u);
  EXPECT_EQ(s.entries, 1u);
  // The replaced registrations are still held here, so still alive.
  EXPECT_FALSE(tracker_.destroyed[IdOf(r1)].load());
  EXPECT_FALSE(tracker_.destroyed[IdOf(r2)].load());
  // Once the holder lets go, the next cache operation deregisters it.
  const int id1 = IdOf(r1);
  r1.reset();
  cache.Flush();
  EXPECT_TRUE(tracker_.destroyed[id1].load());
  EXPECT_FALSE(tracker_.destroyed[IdOf(r2)].load());
  EXPECT_FALSE(tracker_.destroyed[IdOf(r3)].load());
}

TEST_F(RcacheTest, OverlappingMissMergesAndDropsUnreferencedEntries) {
  RegistrationCache& cache = Cache();
  int a_id = IdOf(MustGet(P(0), 2 * page_));  // not held
  auto b = MustGet(P(4), 2 * page_);          // held
  // [P(1), P(5)) overlaps both: one registration of [P(0), P(6)).
  auto m = MustGet(P(1), 4 * page_);
  ASSERT_EQ(tracker_.registrations.load(), 3);
  EXPECT_EQ(tracker_.call(2).addr, reinterpret_cast<uintptr_t>(P(0)));
  EXPECT_EQ(tracker_.call(2).len, 6 * page_);
  EXPECT_TRUE(tracker_.destroyed[a_id].load());   // unreferenced: dropped
  EXPECT_FALSE(tracker_.destroyed[IdOf(b)].load());  // held: alive
  EXPECT_FALSE(Revoked(b));
  EXPECT_EQ(MustGet(P(0), 6 * page_), m);
  EXPECT_EQ(MustGet(P(5), page_), m);
  RcacheStats s = cache.stats();
  EXPECT_EQ(s.entries, 1u);
  EXPECT_EQ(s.bytes, 6 * page_);
  EXPECT_EQ(s.evictions, 0u);

  // The replaced entry b is still revoked when its memory is released.
  cache.Invalidate(P(5), 1);
  EXPECT_TRUE(Revoked(b));
  EXPECT_TRUE(Revoked(m));
  EXPECT_EQ(cache.stats().invalidations, 2u);
  EXPECT_EQ(cache.stats().entries, 0u);
}

TEST_F(RcacheTest, LruEvictionByCountSkipsReferencedEntries) {
  RcacheLimits limits;
  limits.max_entries = 3;
  RegistrationCache& cache = Cache(limits);
  auto held = MustGet(P(0), page_);  // least recently used, but held
  const int id2 = IdOf(MustGet(P(2), page_));
  const int id4 = IdOf(MustGet(P(4), page_));
  const int id6 = IdOf(MustGet(P(6), page_));  // 4 entries > 3: evict one
  EXPECT_FALSE(tracker_.destroyed[IdOf(held)].load());
  EXPECT_TRUE(tracker_.destroyed[id2].load());
  EXPECT_FALSE(tracker_.destroyed[id4].load());
  EXPECT_FALSE(tracker_.destroyed[id6].load());
  EXPECT_EQ(cache.stats().entries, 3u);

  EXPECT_EQ(IdOf(MustGet(P(4), page_)), id4);  // hit: now most recent
  const int id8 = IdOf(MustGet(P(8), page_));  // evicts P(6), not P(4)
  EXPECT_TRUE(tracker_.destroyed[id6].load());
  EXPECT_FALSE(tracker_.destroyed[id4].load());
  EXPECT_FALSE(tracker_.destroyed[id8].load());
  EXPECT_FALSE(tracker_.destroyed[IdOf(held)].load());

  // Once released, the old entry is the first to go.
  const int held_id = IdOf(held);
  held.reset();
  EXPECT_FALSE(tracker_.destroyed[held_id].load());  // still cached
  MustGet(P(10), page_);
  EXPECT_TRUE(tracker_.destroyed[held_id].load());
  EXPECT_FALSE(tracker_.destroyed[id4].load());
  EXPECT_FALSE(tracker_.destroyed[id8].load());

  RcacheStats s = cache.stats();
  EXPECT_EQ(s.evictions, 3u);
  EXPECT_EQ(s.entries, 3u);
  EXPECT_EQ(s.bytes, 3 * page_);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 6u);
  EXPECT_EQ(s.invalidations, 0u);
  EXPECT_EQ(tracker_.revocations.load(), 0);  // eviction deregisters only
}

TEST_F(RcacheTest, LruEvictionByBytes) {
  RcacheLimits limits;
  limits.max_bytes = 4 * page_;
  RegistrationCache& cache = Cache(limits);
  auto a = MustGet(P(0), 2 * page_);  // held
  const int b = IdOf(MustGet(P(4), 2 * page_));
  EXPECT_EQ(cache.stats().evictions, 0u);  // exactly at the limit
  const int c = IdOf(MustGet(P(8), 2 * page_));  // 6 pages: evict b, not a
  EXPECT_TRUE(tracker_.destroyed[b].load());
  EXPECT_FALSE(tracker_.destroyed[IdOf(a)].load());
  EXPECT_EQ(cache.stats().bytes, 4 * page_);

  // A held entry may push the cache over the limit; nothing else to evict.
  auto big = MustGet(P(20), 8 * page_);
  EXPECT_TRUE(tracker_.destroyed[c].load());
  EXPECT_FALSE(tracker_.destroyed[IdOf(a)].load());
  RcacheStats s = cache.stats();
  EXPECT_EQ(s.entries, 2u);
  EXPECT_EQ(s.bytes, 10 * page_);
  EXPECT_EQ(s.evictions, 2u);
}

TEST_F(RcacheTest, InvalidateRevokesAndNextGetRegistersAnew) {
  RegistrationCache& cache = Cache();
  auto r1 = MustGet(P(0), 2 * page_);
  auto other = MustGet(P(10), page_);
  cache.Invalidate(P(1) + 10, 1);
  EXPECT_TRUE(Revoked(r1));
  EXPECT_FALSE(Revoked(other));
  EXPECT_FALSE(tracker_.destroyed[IdOf(r1)].load());  // held by us
  RcacheStats s = cache.stats();
  EXPECT_EQ(s.invalidations, 1u);
  EXPECT_EQ(s.entries, 1u);

  auto r2 = MustGet(P(0), 2 * page_);
  EXPECT_NE(r2, r1);
  EXPECT_FALSE(Revoked(r2));
  EXPECT_EQ(tracker_.registrations.load(), 3);
  const int id1 = IdOf(r1);
  r1.reset();  // the cache let go at Invalidate: this deregisters
  EXPECT_TRUE(tracker_.destroyed[id1].load());

  // An unreferenced entry is revoked and deregistered at once.
  const int id3 = IdOf(MustGet(P(20), page_));
  cache.Invalidate(P(20), page_);
  EXPECT_TRUE(tracker_.revoked[id3].load());
  EXPECT_TRUE(tracker_.destroyed[id3].load());
  // Ranges touching no entry change nothing.
  cache.Invalidate(P(21), 5 * page_);
  cache.Invalidate(P(0), 0);
  EXPECT_FALSE(Revoked(r2));
  EXPECT_FALSE(Revoked(other));
  s = cache.stats();
  EXPECT_EQ(s.invalidations, 2u);
  EXPECT_EQ(s.entries, 2u);
  EXPECT_EQ(s.hits, 0u);
  EXPECT_EQ(s.misses, 4u);
}

TEST_F(RcacheTest, FlushDropsOnlyUnreferencedEntries) {
  RegistrationCache& cache = Cache();
  auto held = MustGet(P(0), page_);
  const int loose = IdOf(MustGet(P(2), page_));
  cache.Flush();
  EXPECT_TRUE(tracker_.destroyed[loose].load());
  EXPECT_FALSE(tracker_.destroyed[IdOf(held)].load());
  EXPECT_FALSE(Revoked(held));
  EXPECT_EQ(MustGet(P(0), page_), held);  // still cached
  RcacheStats s = cache.stats();
  EXPECT_EQ(s.entries, 1u);
  EXPECT_EQ(s.evictions, 0u);
}

TEST_F(RcacheTest, DestroyingTheCacheLeavesHeldRegionsToTheirHolders) {
  Cache();
  auto held = MustGet(P(0), page_);
  const int loose = IdOf(MustGet(P(2), page_));
  cache_.reset();
  EXPECT_TRUE(tracker_.destroyed[loose].load());
  EXPECT_FALSE(tracker_.destroyed[IdOf(held)].load());
  EXPECT_FALSE(Revoked(held));
  const int id = IdOf(held);
  held.reset();
  EXPECT_TRUE(tracker_.destroyed[id].load());
}

TEST_F(RcacheTest, RegistrationErrorsPropagate) {
  RegistrationCache& cache = Cache();
  tracker_.fail_if = [this](uintptr_t addr, size_t) {
    return addr == reinterpret_cast<uintptr_t>(P(30));
  };
  auto r = cache.Get(P(30), page_, kLocalRead);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  RcacheStats s = cache.stats();
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.entries, 0u);

  auto empty = cache.Get(P(0), 0, kLocalRead);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  auto wraps = cache.Get(reinterpret_cast<void*>(~uintptr_t{0} - 10), 100,
                         kLocalRead);
  EXPECT_EQ(wraps.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(RcacheTest, FailedMergeFallsBackToTheRequestedRange) {
  RegistrationCache& cache = Cache();
  tracker_.fail_if = [this](uintptr_t, size_t len) { return len > 2 * page_; };
  auto a = MustGet(P(0), 2 * page_);
  auto b = MustGet(P(1), 2 * page_);  // merged [P(0), P(3)) fails
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->addr(), P(1));
  EXPECT_EQ(b->length(), 2 * page_);
  EXPECT_EQ(tracker_.registrations.load(), 2);
  RcacheStats s = cache.stats();
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.entries, 1u);  // b replaced a in the index
  // a (held, detached) is still revoked by a release of its memory.
  cache.Invalidate(P(0), 1);
  EXPECT_TRUE(Revoked(a));
  EXPECT_FALSE(Revoked(b));
}

TEST_F(RcacheTest, ReleaseDuringRegistrationRegistersAgain) {
  RegistrationCache& cache = Cache();
  std::atomic<int> calls{0};
  // The first registration races with a release of the same memory.
  tracker_.during_registration = [&calls](uintptr_t addr, size_t len) {
    if (calls.fetch_add(1) == 0) NotifyMemoryReleased(reinterpret_cast<void*>(addr), len);
  };
  auto r = MustGet(P(0), page_);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(tracker_.registrations.load(), 2);
  EXPECT_EQ(IdOf(r), 1);
  EXPECT_TRUE(tracker_.destroyed[0].load());  // the stale one, discarded
  EXPECT_FALSE(Revoked(r));
  RcacheStats s = cache.stats();
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.entries, 1u);
  EXPECT_EQ(MustGet(P(0), page_), r);

  // Memory that keeps being released while registered: give up.
  tracker_.during_registration = [](uintptr_t addr, size_t len) {
    NotifyMemoryReleased(reinterpret_cast<void*>(addr), len);
  };
  auto failed = cache.Get(P(50), page_, kLocalRead);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(tracker_.registrations.load(), 2 + 8);
  EXPECT_EQ(tracker_.destructions.load(), 1 + 8);
  EXPECT_EQ(cache.stats().entries, 1u);
}

TEST_F(RcacheTest, ThrowingCallbackLeavesNothingBehind) {
  RegistrationCache& cache = Cache();
  tracker_.during_registration = [this](uintptr_t addr, size_t) {
    if (addr == reinterpret_cast<uintptr_t>(P(40))) throw std::runtime_error("boom");
  };
  EXPECT_THROW((void)cache.Get(P(40), page_, kLocalRead), std::runtime_error);
  // Releases walking the in-flight list, and later Gets, still work.
  NotifyMemoryReleased(P(40), page_);
  auto r = MustGet(P(41), page_);
  ASSERT_NE(r, nullptr);
  NotifyMemoryReleased(P(41), page_);
  EXPECT_TRUE(Revoked(r));
  EXPECT_EQ(cache.stats().entries, 0u);
}

// ---- automatic invalidation through the memory hooks ----

TEST_F(RcacheTest, FreeInvalidates) {
  ASSERT_TRUE(MemoryHooksActive());
  RegistrationCache& cache = Cache();
  constexpr size_t kSize = 8 << 20;  // its own mapping in every allocator
  char* buf = static_cast<char*>(std::malloc(kSize));
  char* other = static_cast<char*>(std::malloc(kSize));
  ASSERT_NE(buf, nullptr);
  ASSERT_NE(other, nullptr);
  std::memset(buf, 0, kSize);
  auto r = MustGet(buf + 4096, 1 << 20, kLocalWrite | kRemoteWrite);
  ASSERT_NE(r, nullptr);
  std::free(other);  // unrelated memory
  EXPECT_FALSE(Revoked(r));
  std::free(buf);
  EXPECT_TRUE(Revoked(r));
  RcacheStats s = cache.stats();
  EXPECT_EQ(s.invalidations, 1u);
  EXPECT_EQ(s.entries, 0u);
  EXPECT_EQ(s.bytes, 0u);
  // Deregistration happens outside free(): at the next cache operation.
  const int id = IdOf(r);
  r.reset();
  cache.Flush();
  EXPECT_TRUE(tracker_.destroyed[id].load());
}

// A free() returns at most the whole pages inside the block to the system:
// a registration that merely shares its first page with a small block (a
// heap buffer and its neighbour) stays valid when the neighbour is freed.
// (Until 2026-11-22 it was revoked: a peer's RDMA write into the buffer,
// announced by a SinkAvail, then hit an unknown key, and libfabric's tcp
// provider ended the connection.) A registration within the freed block's
// pages is still revoked.
TEST_F(RcacheTest, FreeOfANeighbourSharingAPageKeepsTheRegistration) {
  ASSERT_TRUE(MemoryHooksActive());
  RegistrationCache& cache = Cache();
  // First, alone in the cache: a registered sub-page block is revoked by
  // its own free.
  char* small = static_cast<char*>(std::malloc(300));
  ASSERT_NE(small, nullptr);
  auto s = MustGet(small, 300, kLocalWrite | kRemoteWrite);
  ASSERT_NE(s, nullptr);
  std::free(small);
  EXPECT_TRUE(Revoked(s)) << "the free of a registered sub-page block must revoke it";
  EXPECT_EQ(cache.stats().entries, 0u);

  char* neighbour = static_cast<char*>(std::malloc(200));
  ASSERT_NE(neighbour, nullptr);
  // The registered range starts right after the neighbour, in its page, and
  // runs 16 pages on (fake regions never touch the memory).
  auto r = MustGet(neighbour + 256, 16 * page_, kLocalWrite | kRemoteWrite);
  ASSERT_NE(r, nullptr);
  const uint64_t before = cache.stats().invalidations;
  std::free(neighbour);
  EXPECT_FALSE(Revoked(r)) << "a neighbour's free revoked a live registration";
  EXPECT_EQ(cache.stats().invalidations, before);
}

TEST_F(RcacheTest, DeleteInvalidates) {
  ASSERT_TRUE(MemoryHooksActive());
  RegistrationCache& cache = Cache();
  auto* v = new std::vector<char>(4 << 20);
  auto r = MustGet(v->data(), v->size());
  ASSERT_NE(r, nullptr);
  EXPECT_FALSE(Revoked(r));
  delete v;  // the vector's buffer goes through operator delete
  EXPECT_TRUE(Revoked(r));
  EXPECT_EQ(cache.stats().invalidations, 1u);
}

TEST_F(RcacheTest, MunmapInvalidatesAndANewMappingRegistersAnew) {
  ASSERT_TRUE(MemoryHooksActive());
  RegistrationCache& cache = Cache();
  char* p = static_cast<char*>(mmap(nullptr, 4 * page_, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  auto r1 = MustGet(p + page_, 2 * page_);
  ASSERT_EQ(munmap(p + 3 * page_, page_), 0);  // outside the entry
  EXPECT_FALSE(Revoked(r1));
  ASSERT_EQ(munmap(p, 3 * page_), 0);
  EXPECT_TRUE(Revoked(r1));
  EXPECT_EQ(cache.stats().entries, 0u);

  // Map again at the same address: the old registration must not be reused.
  char* q = static_cast<char*>(mmap(p, 4 * page_, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                                    -1, 0));
  if (q == MAP_FAILED) {
    GTEST_SKIP() << "could not map at the old address again: " << std::strerror(errno);
  }
  ASSERT_EQ(q, p);
  const int before = tracker_.registrations.load();
  auto r2 = MustGet(q + page_, 2 * page_);
  ASSERT_NE(r2, nullptr);
  EXPECT_NE(r2, r1);
  EXPECT_EQ(tracker_.registrations.load(), before + 1);
  EXPECT_FALSE(Revoked(r2));
  EXPECT_TRUE(Revoked(r1));
  RcacheStats s = cache.stats();
  EXPECT_EQ(s.hits, 0u);
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.invalidations, 1u);
  ASSERT_EQ(munmap(q, 4 * page_), 0);
  EXPECT_TRUE(Revoked(r2));
}

TEST_F(RcacheTest, MadviseDontneedInvalidates) {
  ASSERT_TRUE(MemoryHooksActive());
  RegistrationCache& cache = Cache();
  char* p = static_cast<char*>(mmap(nullptr, 4 * page_, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  auto r = MustGet(p, 2 * page_);
  ASSERT_EQ(madvise(p + 3 * page_, page_, MADV_DONTNEED), 0);  // elsewhere
  ASSERT_EQ(madvise(p, 2 * page_, MADV_WILLNEED), 0);           // not a release
  EXPECT_FALSE(Revoked(r));
  ASSERT_EQ(madvise(p + page_, page_, MADV_DONTNEED), 0);
  EXPECT_TRUE(Revoked(r));
  EXPECT_EQ(cache.stats().invalidations, 1u);
  ASSERT_EQ(munmap(p, 4 * page_), 0);
}

TEST_F(RcacheTest, MremapInvalidates) {
  ASSERT_TRUE(MemoryHooksActive());
  RegistrationCache& cache = Cache();
  char* p = static_cast<char*>(mmap(nullptr, 2 * page_, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  auto r = MustGet(p, 2 * page_);
  EXPECT_FALSE(Revoked(r));
  void* q = mremap(p, 2 * page_, 64 * page_, MREMAP_MAYMOVE);
  ASSERT_NE(q, MAP_FAILED);
  EXPECT_TRUE(Revoked(r));
  EXPECT_EQ(cache.stats().entries, 0u);
  ASSERT_EQ(munmap(q, 64 * page_), 0);
}

// Two threads register and free buffers concurrently (their page-widened
// ranges may share pages), with limits small enough to evict all the time.
TEST_F(RcacheTest, ConcurrentGetAndFreeDoNotDeadlock) {
  ASSERT_TRUE(MemoryHooksActive());
  RcacheLimits limits;
  limits.max_entries = 4;
  limits.max_bytes = 1 << 20;
  RegistrationCache& cache = Cache(limits);
  constexpr int kIterations = 300;
  std::atomic<int> failures{0};
  std::atomic<int> not_revoked{0};
  auto worker = [&](int seed) {
    for (int i = 0; i < kIterations; ++i) {
      const size_t size = 4096 + static_cast<size_t>((seed * 7919 + i * 104729) % 300000);
      char* buf = static_cast<char*>(std::malloc(size));
      buf[0] = 1;
      auto r = cache.Get(buf, size, kLocalWrite);
      if (!r.ok()) {
        failures.fetch_add(1);
        std::free(buf);
        continue;
      }
      if (i % 3 == 0) {
        auto again = cache.Get(buf, size / 2 + 1, kLocalWrite);  // often a hit
        if (!again.ok()) failures.fetch_add(1);
      }
      std::shared_ptr<MemoryRegion> region = *r;
      std::free(buf);
      // Whoever registered it, the region covering buf is revoked now.
      if (!Revoked(region)) not_revoked.fetch_add(1);
    }
  };
  std::thread t1(worker, 1);
  std::thread t2(worker, 2);
  t1.join();
  t2.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(not_revoked.load(), 0);
  RcacheStats s = cache.stats();
  EXPECT_EQ(s.hits + s.misses, 2u * (kIterations + kIterations / 3));
  EXPECT_LE(s.entries, 4u);
  cache_.reset();
  // Every registration was deregistered once nobody held it.
  EXPECT_EQ(tracker_.destructions.load(), tracker_.registrations.load());
}

}  // namespace
}  // namespace zsock
