// ofi provider specifics the conformance suite does not cover: how a
// configuration string resolves to a libfabric provider, and the errors for
// one that does not exist or cannot run here.
#include <unistd.h>

#include "absl/strings/match.h"
#include "core/provider.h"
#include "gtest/gtest.h"

namespace zsock {
namespace {

TEST(OfiOpen, EmptySpecPicksWhatFiGetinfoOffersFirst) {
  auto f = Fabric::Open("ofi:");
  ASSERT_TRUE(f.ok()) << f.status();
  // The resolved provider is reported, e.g. "tcp;ofi_rxm (FI_EP_RDM, domain eth0)".
  EXPECT_TRUE(absl::StrContains((*f)->caps().spec, "FI_EP_")) << (*f)->caps().spec;
  EXPECT_FALSE((*f)->caps().notes.empty());
}

TEST(OfiOpen, UnknownProviderListsWhatIsOffered) {
  auto f = Fabric::Open("ofi:nosuchfabric");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  EXPECT_TRUE(absl::StrContains(f.status().message(), "fi_getinfo")) << f.status();
  EXPECT_TRUE(absl::StrContains(f.status().message(), "libfabric offers: ")) << f.status();
  EXPECT_TRUE(absl::StrContains(f.status().message(), "tcp")) << f.status();
}

TEST(OfiOpen, VerbsWithoutDeviceIsUnavailableWithTheReason) {
  if (access("/sys/class/infiniband", F_OK) == 0) GTEST_SKIP() << "this host has RDMA devices";
  for (const char* config : {"ofi:verbs", "ofi:verbs;ofi_rxm"}) {
    auto f = Fabric::Open(config);
    ASSERT_FALSE(f.ok()) << config;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kUnavailable) << f.status();
    EXPECT_TRUE(absl::StrContains(f.status().message(), "no RDMA device")) << f.status();
  }
}

TEST(OfiOpen, UnknownOptionIsRefused) {
  auto f = Fabric::Open("ofi:tcp?colour=blue");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  EXPECT_TRUE(absl::StrContains(f.status().message(), "iface=")) << f.status();
}

TEST(OfiOpen, ConfigurationsResolveToTheirEndpointTypes) {
  auto msg = Fabric::Open("ofi:tcp?iface=lo");
  ASSERT_TRUE(msg.ok()) << msg.status();
  EXPECT_TRUE(absl::StrContains((*msg)->caps().spec, "FI_EP_MSG")) << (*msg)->caps().spec;
  EXPECT_EQ((*msg)->caps().atomics, Support::kEmulated);  // tcp has no FI_ATOMIC
  auto shm = Fabric::Open("ofi:shm");
  ASSERT_TRUE(shm.ok()) << shm.status();
  EXPECT_TRUE(absl::StrContains((*shm)->caps().spec, "FI_EP_RDM")) << (*shm)->caps().spec;
  EXPECT_EQ((*shm)->caps().rdma_read, Support::kEmulated);
  EXPECT_FALSE((*shm)->caps().wait_fd);
}

}  // namespace
}  // namespace zsock
