// What Fabric::Open("verbs...") does here: the provider is registered, bad
// options are refused without a device, and without one Open says how to
// get one. What needs a device (connections, the data path) runs in the
// conformance suite on machines that have one (docs/verbs.md).
#include <infiniband/verbs.h>

#include <cerrno>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "core/provider.h"
#include "core/status.h"
#include "gtest/gtest.h"

namespace zsock::verbs {
namespace {

bool DeviceListEmpty() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) return true;
  ibv_free_device_list(list);
  return n == 0;
}

TEST(Provider, IsRegisteredWithItsConfiguration) {
  const ProviderInfo* verbs = nullptr;
  for (const ProviderInfo* p : RegisteredProviders()) {
    if (p->name == "verbs") verbs = p;
  }
  ASSERT_NE(verbs, nullptr);
  EXPECT_EQ(verbs->configurations, std::vector<std::string>{"verbs"});
}

TEST(Provider, BadOptionsAreInvalidEvenWithoutADevice) {
  auto f = Fabric::Open("verbs?bogus=1");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Provider, WithoutADeviceOpenIsUnavailableAndSaysHowToGetOne) {
  if (!DeviceListEmpty()) GTEST_SKIP() << "this machine has an RDMA device";
  for (const char* config : {"verbs", "verbs:mlx5_0", "verbs?port=1&gid_index=0&srq=on"}) {
    auto f = Fabric::Open(config);
    ASSERT_FALSE(f.ok()) << config;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kUnavailable) << config;
    const std::string msg(f.status().message());
    EXPECT_TRUE(absl::StrContains(msg, "no RDMA device found")) << msg;
    EXPECT_TRUE(absl::StrContains(msg, "rdma link add rxe0 type rxe netdev <if>")) << msg;
    EXPECT_TRUE(absl::StrContains(msg, "HCA")) << msg;
    EXPECT_TRUE(absl::StrContains(msg, "rdma_rxe")) << msg;
    EXPECT_EQ(StatusErrno(f.status()), ENODEV);
  }
}

TEST(Provider, ForkProtectionIsOnByDefault) {
  // Open calls ibv_fork_init before anything else touches libibverbs (or
  // finds the kernel does not need it), device or not.
  (void)Fabric::Open("verbs");
  EXPECT_NE(ibv_is_fork_initialized(), IBV_FORK_DISABLED);
}

}  // namespace
}  // namespace zsock::verbs
