#include "core/local_keys.h"

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "core/provider.h"
#include "gtest/gtest.h"

namespace zsock {
namespace {

uint64_t Addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

TEST(LocalKeyTable, AccessRunsOnlyInsideALiveRegistrationWithItsRights) {
  LocalKeyTable table(16);
  char buf[64] = {};
  auto key = table.Add(Addr(buf), sizeof(buf), kRemoteRead);
  ASSERT_TRUE(key.has_value());
  EXPECT_EQ(key->gen & 1, 1u);
  int calls = 0;
  auto count = [&](void* p) {
    EXPECT_EQ(p, buf + 8);
    ++calls;
  };
  EXPECT_TRUE(table.Access(*key, Addr(buf + 8), 8, kRemoteRead, count).ok());
  EXPECT_EQ(calls, 1);
  absl::Status wrong_right = table.Access(*key, Addr(buf), 8, kRemoteWrite, count);
  EXPECT_EQ(wrong_right.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(wrong_right.message().find("does not grant"), absl::string_view::npos);
  absl::Status past_end = table.Access(*key, Addr(buf + 60), 8, kRemoteRead, count);
  EXPECT_NE(past_end.message().find("outside the registered region"), absl::string_view::npos);
  // A length that would wrap the address space is outside too.
  EXPECT_FALSE(table.Access(*key, Addr(buf + 8), ~size_t{0} - 4, kRemoteRead, count).ok());
  EXPECT_FALSE(table.Access({key->slot + 1, key->gen}, Addr(buf), 8, kRemoteRead, count).ok());
  EXPECT_FALSE(table.Access({1u << 30, 1}, Addr(buf), 8, kRemoteRead, count).ok());
  EXPECT_EQ(calls, 1);
}

TEST(LocalKeyTable, ARevokedKeyStaysRefusedAfterItsSlotIsReused) {
  LocalKeyTable table(1);
  char a[16], b[16];
  auto first = table.Add(Addr(a), sizeof(a), kAccessAll);
  ASSERT_TRUE(first.has_value());
  EXPECT_FALSE(table.Add(Addr(b), sizeof(b), kAccessAll).has_value()) << "capacity is 1";
  EXPECT_TRUE(table.Revoke(*first));
  EXPECT_FALSE(table.Revoke(*first)) << "only the first revocation acts";
  auto noop = [](void*) { FAIL() << "a revoked key reached memory"; };
  absl::Status stale = table.Access(*first, Addr(a), 8, kRemoteRead, noop);
  EXPECT_NE(stale.message().find("stale key"), absl::string_view::npos);
  table.Remove(*first);
  auto second = table.Add(Addr(b), sizeof(b), kAccessAll);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->slot, first->slot);
  EXPECT_NE(second->gen, first->gen);
  EXPECT_FALSE(table.Access(*first, Addr(b), 8, kRemoteRead, noop).ok());
  int calls = 0;
  EXPECT_TRUE(table.Access(*second, Addr(b), 8, kRemoteRead, [&](void*) { ++calls; }).ok());
  EXPECT_EQ(calls, 1);
}

TEST(LocalKeyTable, GrowsPastOneChunkUpToItsCapacity) {
  LocalKeyTable table(1000);
  std::vector<char> mem(1000);
  std::vector<LocalKeyTable::Key> keys;
  for (int i = 0; i < 1000; ++i) {
    auto k = table.Add(Addr(&mem[i]), 1, kRemoteWrite);
    ASSERT_TRUE(k.has_value()) << i;
    keys.push_back(*k);
  }
  EXPECT_FALSE(table.Add(Addr(mem.data()), 1, kRemoteWrite).has_value());
  for (int i = 0; i < 1000; i += 97) {
    EXPECT_TRUE(table.Access(keys[i], Addr(&mem[i]), 1, kRemoteWrite, [](void* p) {
      *static_cast<char*>(p) = 'x';
    }).ok());
    EXPECT_EQ(mem[i], 'x');
  }
}

TEST(LocalKeyTable, EncodedKeysRoundTrip) {
  uint8_t bytes[LocalKeyTable::kEncodedSize];
  LocalKeyTable::Encode({0x01020304, 0x0a0b0c0d}, bytes);
  LocalKeyTable::Key k = LocalKeyTable::Decode(bytes);
  EXPECT_EQ(k.slot, 0x01020304u);
  EXPECT_EQ(k.gen, 0x0a0b0c0du);
}

TEST(LocalKeyTable, RevokeWaitsForAnAccessInProgress) {
  LocalKeyTable table(4);
  char buf[8] = {};
  auto key = table.Add(Addr(buf), sizeof(buf), kRemoteWrite);
  ASSERT_TRUE(key.has_value());
  std::atomic<bool> inside{false}, release{false}, revoked{false};
  std::thread accessor([&] {
    EXPECT_TRUE(table.Access(*key, Addr(buf), 8, kRemoteWrite, [&](void* p) {
      inside = true;
      while (!release) std::this_thread::yield();
      std::memset(p, 1, 8);
    }).ok());
  });
  while (!inside) std::this_thread::yield();
  std::thread revoker([&] {
    table.Revoke(*key);
    revoked = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(revoked) << "Revoke returned while an access was inside";
  release = true;
  accessor.join();
  revoker.join();
  EXPECT_TRUE(revoked);
  EXPECT_EQ(buf[7], 1);
}

}  // namespace
}  // namespace zsock
