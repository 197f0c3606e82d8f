// Slab (slab.h): one registration for the whole slab, slots addressed by
// index and zeroed, the pool's FIFO order, and a failed registration.
#include "core/slab.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "core/provider.h"
#include "gtest/gtest.h"

namespace zsock {
namespace {

class FakeRegion final : public MemoryRegion {
 public:
  FakeRegion(void* addr, size_t len, int* live)
      : MemoryRegion(addr, len, kLocalWrite), live_(live) {
    ++*live_;
  }
  ~FakeRegion() override { --*live_; }
  RemoteKey remote_key() const override { return RemoteKey{}; }
  void Revoke() noexcept override {}

 private:
  int* live_;
};

struct Registrations {
  std::vector<std::pair<void*, size_t>> calls;
  int live = 0;
  absl::StatusOr<std::unique_ptr<MemoryRegion>> operator()(void* addr, size_t len) {
    calls.emplace_back(addr, len);
    return std::unique_ptr<MemoryRegion>(new FakeRegion(addr, len, &live));
  }
};

// The registration function a slab takes, over `regs`.
auto Through(Registrations& regs) {
  return [&regs](void* addr, size_t len) { return regs(addr, len); };
}

TEST(Slab, OneRegistrationCoversEveryZeroedSlot) {
  Registrations regs;
  Slab slab;
  ASSERT_TRUE(slab.Init(64, 5, Through(regs)).ok());
  ASSERT_EQ(regs.calls.size(), 1u);
  EXPECT_EQ(regs.calls[0].first, slab.slot(0));
  EXPECT_EQ(regs.calls[0].second, 64u * 5);
  ASSERT_NE(slab.mr(), nullptr);
  EXPECT_EQ(slab.mr()->addr(), slab.slot(0));
  EXPECT_EQ(slab.slot_size(), 64u);
  EXPECT_EQ(slab.count(), 5u);
  for (size_t i = 0; i < slab.count(); ++i) {
    EXPECT_EQ(slab.slot(i), slab.slot(0) + 64 * i);
    for (size_t b = 0; b < 64; ++b) ASSERT_EQ(slab.slot(i)[b], 0) << i;
  }
  const Slab& view = slab;
  EXPECT_EQ(view.slot(3), slab.slot(3));
}

TEST(Slab, PoolHandsOutFreeSlotsInFifoOrder) {
  Registrations regs;
  Slab slab;
  ASSERT_TRUE(slab.Init(8, 3, Through(regs)).ok());
  std::vector<size_t> got;
  while (slab.has_free()) got.push_back(slab.Take());
  EXPECT_EQ(got, (std::vector<size_t>{0, 1, 2}));
  slab.Put(2);
  slab.Put(0);
  ASSERT_TRUE(slab.has_free());
  EXPECT_EQ(slab.Take(), 2u);
  EXPECT_EQ(slab.Take(), 0u);
  EXPECT_FALSE(slab.has_free());
}

TEST(Slab, DeregisterDropsTheRegistrationAndKeepsTheMemory) {
  Registrations regs;
  {
    Slab slab;
    ASSERT_TRUE(slab.Init(16, 2, Through(regs)).ok());
    EXPECT_EQ(regs.live, 1);
    slab.slot(1)[15] = 7;
    slab.Deregister();
    EXPECT_EQ(regs.live, 0);
    EXPECT_EQ(slab.mr(), nullptr);
    EXPECT_EQ(slab.slot(1)[15], 7);
  }
  Slab other;
  ASSERT_TRUE(other.Init(16, 2, Through(regs)).ok());
  EXPECT_EQ(regs.live, 1);
}

TEST(Slab, DestructionReleasesTheRegistration) {
  Registrations regs;
  {
    Slab slab;
    ASSERT_TRUE(slab.Init(16, 2, Through(regs)).ok());
    EXPECT_EQ(regs.live, 1);
  }
  EXPECT_EQ(regs.live, 0);
}

TEST(Slab, FailedRegistrationIsReturnedAndLeavesNoPool) {
  Slab slab;
  auto fail = [](void*, size_t) -> absl::StatusOr<std::unique_ptr<MemoryRegion>> {
    return absl::ResourceExhaustedError("no memory to lock");
  };
  absl::Status st = slab.Init(32, 4, fail);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(slab.mr(), nullptr);
  EXPECT_FALSE(slab.has_free());
}

}  // namespace
}  // namespace zsock
