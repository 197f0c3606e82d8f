// The verbs settings (the config string's syntax and ranges), device and
// port selection over described devices, and the address helpers
// (settings.h). No device is needed.
#include "providers/verbs/settings.h"

#include <cerrno>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "core/provider.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "providers/verbs/wire.h"

namespace zsock::verbs {
namespace {

// ------------------------------------------------------------ settings

FabricSpec Spec(const std::string& config) {
  auto s = ParseFabricSpec(config);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

TEST(Settings, Defaults) {
  auto s = ParseSettings(Spec("verbs"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->device, "");
  EXPECT_EQ(s->port, 0);
  EXPECT_EQ(s->gid_index, -1);
  EXPECT_FALSE(s->srq);
  EXPECT_TRUE(s->fork);
  EXPECT_EQ(s->rnr_retry, 7);
  EXPECT_GT(s->eager_size, kHeaderSize);
  EXPECT_EQ(s->max_registrations, 1u << 20);
}

TEST(Settings, DeviceAndOptions) {
  auto s = ParseSettings(Spec(
      "verbs:mlx5_0?port=2&gid_index=3&inline=128&srq=on&cq_depth=4096&sq_depth=512&"
      "recv_depth=64&eager=16k&rnr_retry=3&retry_count=5&fork=off&connect_timeout_ms=2500&"
      "max_registrations=4k"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->device, "mlx5_0");
  EXPECT_EQ(s->port, 2);
  EXPECT_EQ(s->gid_index, 3);
  EXPECT_EQ(s->inline_size, 128u);
  EXPECT_TRUE(s->srq);
  EXPECT_EQ(s->cq_depth, 4096);
  EXPECT_EQ(s->sq_depth, 512);
  EXPECT_EQ(s->recv_depth, 64);
  EXPECT_EQ(s->eager_size, 16384u);
  EXPECT_EQ(s->rnr_retry, 3);
  EXPECT_EQ(s->retry_count, 5);
  EXPECT_FALSE(s->fork);
  EXPECT_EQ(s->connect_timeout_ms, 2500);
  EXPECT_EQ(s->max_registrations, 4096u);
}

TEST(Settings, UnknownOptionListsTheAcceptedOnes) {
  auto s = ParseSettings(Spec("verbs?ports=1"));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.status().message(), "unknown verbs option 'ports'"));
  for (const char* key :
       {"port", "gid_index", "inline", "srq", "cq_depth", "sq_depth", "max_registrations"}) {
    EXPECT_TRUE(absl::StrContains(s.status().message(), key)) << key;
  }
}

TEST(Settings, BadValuesAreRefusedWithTheRange) {
  struct Case {
    const char* config;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {"verbs?port=0", "port=0"},
           {"verbs?port=abc", "port=abc"},
           {"verbs?port=256", "1 to 255"},
           {"verbs?gid_index=-1", "gid_index=-1"},
           {"verbs?inline=99999", "inline=99999"},
           {"verbs?srq=maybe", "on or off"},
           {"verbs?rnr_retry=8", "0 to 7"},
           {"verbs?sq_depth=1", "sq_depth=1"},
           {"verbs?eager=1", "eager=1"},
           {"verbs?eager=4m", "eager=4m"},
           {"verbs?cq_depth=100", "cq_depth=100"},  // below sq + recv depth
           {"verbs?max_registrations=0", "1 to 16777216"},
           {"verbs?max_registrations=17m", "max_registrations=17m"},
           {"verbs:mlx5 0", "not an RDMA device name"},
           {"verbs:../etc", "not an RDMA device name"},
       }) {
    auto s = ParseSettings(Spec(c.config));
    ASSERT_FALSE(s.ok()) << c.config;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << c.config;
    EXPECT_TRUE(absl::StrContains(s.status().message(), c.says))
        << c.config << ": " << s.status().message();
    EXPECT_EQ(StatusErrno(s.status()), EINVAL) << c.config;
  }
}

std::vector<DeviceDesc> TwoDevices() {
  DeviceDesc a;
  a.name = "mlx5_0";
  a.ports = {{1, false, "DOWN", "InfiniBand", 1u << 30, 128},
             {2, true, "ACTIVE", "InfiniBand", 1u << 30, 128}};
  DeviceDesc b;
  b.name = "rxe0";
  b.ports = {{1, true, "ACTIVE", "Ethernet", 1u << 31, 4}};
  return {a, b};
}

TEST(SelectDevice, NoDeviceSaysHowToGetOne) {
  auto sel = SelectDevice(Settings{}, {});
  ASSERT_FALSE(sel.ok());
  EXPECT_EQ(sel.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(sel.status().message(), "no RDMA device found"));
  EXPECT_TRUE(absl::StrContains(sel.status().message(), "rdma link add rxe0 type rxe netdev"));
  EXPECT_TRUE(absl::StrContains(sel.status().message(), "HCA"));
  EXPECT_EQ(StatusErrno(sel.status()), ENODEV);
}

TEST(SelectDevice, FirstActivePortByDefault) {
  auto sel = SelectDevice(Settings{}, TwoDevices());
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_EQ(sel->device, 0u);
  EXPECT_EQ(sel->port, 2);  // port 1 is down
}

TEST(SelectDevice, ByName) {
  Settings s;
  s.device = "rxe0";
  auto sel = SelectDevice(s, TwoDevices());
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_EQ(sel->device, 1u);
  EXPECT_EQ(sel->port, 1);
}

TEST(SelectDevice, UnknownDeviceListsTheDevicesFound) {
  Settings s;
  s.device = "mlx4_0";
  auto sel = SelectDevice(s, TwoDevices());
  ASSERT_FALSE(sel.ok());
  EXPECT_EQ(sel.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(sel.status().message(), "'mlx4_0' not found"));
  EXPECT_TRUE(absl::StrContains(sel.status().message(), "mlx5_0 (ports: 1 DOWN, 2 ACTIVE)"));
  EXPECT_TRUE(absl::StrContains(sel.status().message(), "rxe0 (ports: 1 ACTIVE)"));
}

TEST(SelectDevice, BadPorts) {
  Settings s;
  s.device = "mlx5_0";
  s.port = 3;
  auto sel = SelectDevice(s, TwoDevices());
  ASSERT_FALSE(sel.ok());
  EXPECT_EQ(sel.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(sel.status().message(), "has no port 3 (it has 2)"));

  s.port = 1;
  sel = SelectDevice(s, TwoDevices());
  ASSERT_FALSE(sel.ok());
  EXPECT_EQ(sel.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(sel.status().message(), "port 1 of RDMA device mlx5_0 is DOWN"));

  s.port = 2;
  s.gid_index = 128;
  sel = SelectDevice(s, TwoDevices());
  ASSERT_FALSE(sel.ok());
  EXPECT_TRUE(absl::StrContains(sel.status().message(), "gid_index=128 is outside the GID table"));
  s.gid_index = 127;
  sel = SelectDevice(s, TwoDevices());
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_EQ(sel->port, 2);
}

TEST(SelectDevice, GidIndexSkipsPortsWithoutIt) {
  Settings s;
  s.gid_index = 10;  // rxe0 has 4 GIDs, mlx5_0 port 2 has 128
  auto sel = SelectDevice(s, TwoDevices());
  ASSERT_TRUE(sel.ok());
  EXPECT_EQ(sel->device, 0u);
  s.gid_index = 200;
  sel = SelectDevice(s, TwoDevices());
  ASSERT_FALSE(sel.ok());
  EXPECT_EQ(sel.status().code(), absl::StatusCode::kUnavailable);
}

TEST(SelectDevice, NoActivePort) {
  auto devices = TwoDevices();
  devices[0].ports[1].active = false;
  devices[0].ports[1].state = "INIT";
  devices[1].ports[0].active = false;
  devices[1].ports[0].state = "DOWN";
  auto sel = SelectDevice(Settings{}, devices);
  ASSERT_FALSE(sel.ok());
  EXPECT_EQ(sel.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(sel.status().message(), "no RDMA device has an active port"));
  EXPECT_TRUE(absl::StrContains(sel.status().message(), "2 INIT"));
}

TEST(Addresses, GidToAddress) {
  uint8_t gid[16] = {};
  EXPECT_FALSE(GidToAddress(gid).has_value());
  uint8_t v4[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 7, 9};
  EXPECT_EQ(GidToAddress(v4), "192.168.7.9");
  uint8_t link_local[16] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55};
  EXPECT_EQ(GidToAddress(link_local), "fe80::211:22ff:fe33:4455");
}

TEST(Addresses, HostPort) {
  auto hp = ParseHostPort("10.0.0.1:7471");
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->host, "10.0.0.1");
  EXPECT_EQ(hp->port, 7471);
  hp = ParseHostPort("[fe80::1%ib0]:18515");
  ASSERT_TRUE(hp.ok()) << hp.status();
  EXPECT_EQ(hp->host, "fe80::1%ib0");
  EXPECT_EQ(hp->port, 18515);
  hp = ParseHostPort("10.0.0.1");
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->port, 0);
  EXPECT_EQ(FormatHostPort("10.0.0.1", 5), "10.0.0.1:5");
  EXPECT_EQ(FormatHostPort("::1", 5), "[::1]:5");
  for (const char* bad : {"host.example:1", "10.0.0.1:99999", "10.0.0.1:x", "[::1", "[::1]x",
                          "::1:5", "", ":5"}) {
    auto r = ParseHostPort(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    }
  }
}

}  // namespace
}  // namespace zsock::verbs
