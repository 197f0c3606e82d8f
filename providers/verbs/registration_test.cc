// The verbs registrations (region.h) over a fake Registrar: keys, access
// flags, deregistration, the target's key table (core/local_keys.h), and
// the registration cache over them.
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <unistd.h>

#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "core/local_keys.h"
#include "core/provider.h"
#include "core/rcache.h"
#include "gtest/gtest.h"
#include "providers/verbs/region.h"
#include "providers/verbs/wire.h"

namespace zsock::verbs {
namespace {

class FakeRegistrar : public Registrar {
 public:
  absl::StatusOr<Keys> Register(void* addr, size_t len, int ibv_access) override {
    if (fail_next) {
      fail_next = false;
      return absl::ResourceExhaustedError("ibv_reg_mr: Cannot allocate memory");
    }
    calls.push_back({addr, len, ibv_access});
    auto* h = new int(next);
    live.insert(h);
    uint32_t key = reuse_key != 0 ? reuse_key : static_cast<uint32_t>(next);
    ++next;
    return Keys{h, key + 0x1000, key};
  }
  void Deregister(void* handle) noexcept override {
    auto* h = static_cast<int*>(handle);
    if (live.erase(h) == 0) ++double_deregistrations;
    ++deregistrations;
    delete h;
  }
  struct Call {
    void* addr;
    size_t len;
    int access;
  };
  std::vector<Call> calls;
  std::set<int*> live;
  int next = 1;
  int deregistrations = 0;
  int double_deregistrations = 0;
  uint32_t reuse_key = 0;
  bool fail_next = false;
};

// The table key a region's remote key names.
LocalKeyTable::Key TableKey(const MemoryRegion& mr) {
  auto blob = DecodeKeyBlob(mr.remote_key().blob);
  EXPECT_TRUE(blob.ok()) << blob.status();
  return blob.ok() ? blob->key : LocalKeyTable::Key{};
}

TEST(Registrations, RegionKeysAccessAndDeregistration) {
  FakeRegistrar reg;
  LocalKeyTable table(1 << 10);
  std::vector<uint8_t> mem(4096, 1);
  auto mr = Register(&reg, &table, mem.data(), mem.size(), kRemoteRead | kRemoteWrite);
  ASSERT_TRUE(mr.ok()) << mr.status();
  ASSERT_EQ(reg.calls.size(), 1u);
  EXPECT_EQ(reg.calls[0].addr, mem.data());
  EXPECT_EQ(reg.calls[0].len, mem.size());
  EXPECT_EQ(reg.calls[0].access,
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
  EXPECT_EQ(LkeyOf(mr->get()), 0x1001u);
  RemoteKey key = (*mr)->remote_key();
  EXPECT_EQ(key.addr, reinterpret_cast<uint64_t>(mem.data()));
  EXPECT_EQ(key.length, 4096u);
  EXPECT_EQ(key.access, kRemoteRead | kRemoteWrite);
  auto blob = DecodeKeyBlob(key.blob);
  ASSERT_TRUE(blob.ok());
  EXPECT_EQ(blob->rkey, 1u);
  const LocalKeyTable::Key k = blob->key;

  // Emulated accesses go through the table: range, rights, liveness.
  uint64_t base = key.addr;
  int touched = 0;
  EXPECT_TRUE(table.Access(k, base + 8, 8, kRemoteRead, [&](void* p) {
                EXPECT_EQ(p, mem.data() + 8);
                ++touched;
              }).ok());
  EXPECT_EQ(touched, 1);
  EXPECT_FALSE(table.Access(k, base + 4090, 8, kRemoteRead, [&](void*) { ++touched; }).ok());
  EXPECT_FALSE(table.Access(k, base - 8, 8, kRemoteRead, [&](void*) { ++touched; }).ok());
  EXPECT_FALSE(table.Access(k, base, 8, kRemoteAtomic, [&](void*) { ++touched; }).ok());
  // Keys of no live registration: another slot, another generation.
  EXPECT_FALSE(
      table.Access({k.slot + 1, 1}, base, 8, kRemoteRead, [&](void*) { ++touched; }).ok());
  EXPECT_FALSE(
      table.Access({k.slot, k.gen + 2}, base, 8, kRemoteRead, [&](void*) { ++touched; }).ok());
  EXPECT_EQ(touched, 1);

  (*mr)->Revoke();
  EXPECT_EQ(reg.deregistrations, 1);
  auto refused = table.Access(k, base, 8, kRemoteRead, [&](void*) { ++touched; });
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(touched, 1);
  (*mr)->Revoke();  // idempotent
  mr->reset();      // destroying a revoked region does not deregister again
  EXPECT_EQ(reg.deregistrations, 1);
  EXPECT_EQ(reg.double_deregistrations, 0);
  EXPECT_TRUE(reg.live.empty());

  reg.fail_next = true;
  auto failed = Register(&reg, &table, mem.data(), mem.size(), kLocalWrite);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(Register(&reg, &table, nullptr, 8, kLocalWrite).ok());
  EXPECT_FALSE(Register(&reg, &table, mem.data(), 0, kLocalWrite).ok());
}

TEST(Registrations, ReusedRkeyIsNotDroppedByTheOldRegion) {
  FakeRegistrar reg;
  LocalKeyTable table(1 << 10);
  reg.reuse_key = 77;
  std::vector<uint8_t> a(64), b(64);
  auto old_mr = Register(&reg, &table, a.data(), a.size(), kRemoteRead);
  ASSERT_TRUE(old_mr.ok());
  (*old_mr)->Revoke();
  // The HCA hands out the same rkey again for a new registration.
  auto new_mr = Register(&reg, &table, b.data(), b.size(), kRemoteRead);
  ASSERT_TRUE(new_mr.ok());
  auto old_blob = DecodeKeyBlob((*old_mr)->remote_key().blob);
  auto new_blob = DecodeKeyBlob((*new_mr)->remote_key().blob);
  ASSERT_TRUE(old_blob.ok());
  ASSERT_TRUE(new_blob.ok());
  EXPECT_EQ(old_blob->rkey, 77u);
  EXPECT_EQ(new_blob->rkey, 77u);
  old_mr->reset();
  int touched = 0;
  EXPECT_TRUE(table.Access(new_blob->key, reinterpret_cast<uint64_t>(b.data()), 8, kRemoteRead,
                           [&](void*) { ++touched; }).ok());
  EXPECT_FALSE(table.Access(new_blob->key, reinterpret_cast<uint64_t>(a.data()), 8, kRemoteRead,
                            [&](void*) { ++touched; }).ok());
  EXPECT_FALSE(table.Access(old_blob->key, reinterpret_cast<uint64_t>(a.data()), 8, kRemoteRead,
                            [&](void*) { ++touched; }).ok());
  EXPECT_EQ(touched, 1);
  // A later registration that reuses the old slot does not revive the old key.
  auto later = Register(&reg, &table, a.data(), a.size(), kRemoteRead);
  ASSERT_TRUE(later.ok());
  EXPECT_FALSE(table.Access(old_blob->key, reinterpret_cast<uint64_t>(a.data()), 8, kRemoteRead,
                            [&](void*) { ++touched; }).ok());
  EXPECT_TRUE(table.Access(TableKey(**later), reinterpret_cast<uint64_t>(a.data()), 8,
                           kRemoteRead, [&](void*) { ++touched; }).ok());
  EXPECT_EQ(touched, 2);
}

// A full table refuses the registration before the device sees it, and
// names the setting that raises the limit; slots come back on release and
// on a failed device registration.
TEST(Registrations, FullTableIsAClearError) {
  FakeRegistrar reg;
  LocalKeyTable table(2);
  std::vector<uint8_t> mem(64);
  auto r1 = Register(&reg, &table, mem.data(), 8, kRemoteRead);
  auto r2 = Register(&reg, &table, mem.data() + 8, 8, kRemoteRead);
  ASSERT_TRUE(r1.ok());
  ASSERT_TRUE(r2.ok());
  auto full = Register(&reg, &table, mem.data() + 16, 8, kRemoteRead);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(full.status().message(), "max_registrations"))
      << full.status().message();
  EXPECT_EQ(reg.calls.size(), 2u);
  r1->reset();
  reg.fail_next = true;
  EXPECT_FALSE(Register(&reg, &table, mem.data() + 16, 8, kRemoteRead).ok());
  auto r3 = Register(&reg, &table, mem.data() + 16, 8, kRemoteRead);
  ASSERT_TRUE(r3.ok()) << r3.status();
  int touched = 0;
  EXPECT_TRUE(table.Access(TableKey(**r3), reinterpret_cast<uint64_t>(mem.data() + 16), 8,
                           kRemoteRead, [&](void*) { ++touched; }).ok());
  EXPECT_EQ(touched, 1);
}

// The registration cache over verbs regions: hits reuse the ibv_mr, and
// unmapping the memory deregisters it at once and the target refuses the key.
TEST(Registrations, ThroughTheRegistrationCache) {
  FakeRegistrar reg;
  LocalKeyTable table(1 << 10);
  RegistrationCache cache(
      [&](void* addr, size_t len, uint32_t access) {
        return Register(&reg, &table, addr, len, access);
      },
      RcacheLimits{});
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t len = 16 * page;
  void* mem = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto r1 = cache.Get(static_cast<char*>(mem) + 100, 1000, kLocalRead | kRemoteRead);
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_EQ(reg.calls.size(), 1u);
  EXPECT_EQ(reg.calls[0].addr, mem) << "the cache registers whole pages";
  EXPECT_EQ(reg.calls[0].access, IBV_ACCESS_REMOTE_READ);
  auto r2 = cache.Get(static_cast<char*>(mem) + 200, 100, kRemoteRead);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r1->get(), r2->get());
  EXPECT_EQ(reg.calls.size(), 1u);
  EXPECT_EQ(cache.stats().hits, 1u);
  // More access than cached: a new registration covering both, with the
  // union of the rights (REMOTE_WRITE brings LOCAL_WRITE).
  auto r3 = cache.Get(mem, page, kRemoteWrite);
  ASSERT_TRUE(r3.ok()) << r3.status();
  ASSERT_EQ(reg.calls.size(), 2u);
  EXPECT_EQ(reg.calls[1].access,
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
  auto blob = DecodeKeyBlob((*r3)->remote_key().blob);
  ASSERT_TRUE(blob.ok());
  uint64_t addr = reinterpret_cast<uint64_t>(mem);
  int touched = 0;
  EXPECT_TRUE(table.Access(blob->key, addr, 8, kRemoteWrite, [&](void*) { ++touched; }).ok());
  r1->reset();
  r2->reset();
  const int before = reg.deregistrations;
  ASSERT_EQ(munmap(mem, len), 0);
  // Revoked inside munmap: deregistered, and the key is refused.
  EXPECT_GT(reg.deregistrations, before);
  EXPECT_TRUE((*r3)->remote_key().blob == EncodeKeyBlob(*blob));
  EXPECT_FALSE(table.Access(blob->key, addr, 8, kRemoteWrite, [&](void*) { ++touched; }).ok());
  EXPECT_EQ(touched, 1);
  EXPECT_GE(cache.stats().invalidations, 1u);
  r3->reset();
  cache.Flush();
  EXPECT_EQ(reg.double_deregistrations, 0);
  EXPECT_TRUE(reg.live.empty());
}

}  // namespace
}  // namespace zsock::verbs
