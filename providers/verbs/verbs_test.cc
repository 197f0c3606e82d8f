// Unit tests of the verbs provider's device-independent parts (verbs_core.h)
// and of what Fabric::Open("verbs...") does on a machine without an RDMA
// device. What needs a device (connections, the data path) runs in the
// conformance suite on machines that have one (docs/verbs.md).
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <set>

#include "absl/strings/match.h"
#include "core/provider.h"
#include "core/rcache.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "providers/verbs/verbs_core.h"

namespace zsock::verbs {
namespace {

FabricSpec Spec(const std::string& config) {
  auto s = ParseFabricSpec(config);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

bool DeviceListEmpty() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) return true;
  ibv_free_device_list(list);
  return n == 0;
}

// ------------------------------------------------------------ settings

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
}

TEST(Settings, DeviceAndOptions) {
  auto s = ParseSettings(Spec(
      "verbs:mlx5_0?port=2&gid_index=3&inline=128&srq=on&cq_depth=4096&sq_depth=512&"
      "recv_depth=64&eager=16k&rnr_retry=3&retry_count=5&fork=off&connect_timeout_ms=2500"));
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
}

TEST(Settings, UnknownOptionListsTheAcceptedOnes) {
  auto s = ParseSettings(Spec("verbs?ports=1"));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.status().message(), "unknown verbs option 'ports'"));
  for (const char* key : {"port", "gid_index", "inline", "srq", "cq_depth", "sq_depth"}) {
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

// ------------------------------------------------------------ access

TEST(Access, FlagsFollowTheVerbsRules) {
  EXPECT_EQ(AccessToIbv(kLocalRead), 0);
  EXPECT_EQ(AccessToIbv(kLocalWrite), IBV_ACCESS_LOCAL_WRITE);
  EXPECT_EQ(AccessToIbv(kRemoteRead), IBV_ACCESS_REMOTE_READ);
  // REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE (ibv_reg_mr fails
  // with EINVAL otherwise).
  EXPECT_EQ(AccessToIbv(kRemoteWrite), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  EXPECT_EQ(AccessToIbv(kRemoteAtomic), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  EXPECT_EQ(AccessToIbv(kAccessAll), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
                                         IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  for (uint32_t a = 0; a <= kAccessAll; ++a) {
    int f = AccessToIbv(a);
    if (f & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) {
      EXPECT_TRUE(f & IBV_ACCESS_LOCAL_WRITE) << a;
    }
    EXPECT_EQ((f & IBV_ACCESS_REMOTE_READ) != 0, (a & kRemoteRead) != 0) << a;
  }
}

// ------------------------------------------------------------ remote keys

TEST(RemoteKeys, BlobRoundTripThroughSerialize) {
  RemoteKey k;
  k.addr = 0x7f0012345000;
  k.length = 65536;
  k.access = kRemoteRead | kRemoteWrite;
  k.blob = EncodeKeyBlob(0xdeadbeef);
  auto parsed = RemoteKey::Parse(k.Serialize());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->addr, k.addr);
  EXPECT_EQ(parsed->length, k.length);
  EXPECT_EQ(parsed->access, k.access);
  auto rkey = DecodeKeyBlob(parsed->blob);
  ASSERT_TRUE(rkey.ok());
  EXPECT_EQ(*rkey, 0xdeadbeefu);
}

TEST(RemoteKeys, HostileBlobsAreRefused) {
  std::vector<uint8_t> good = EncodeKeyBlob(7);
  EXPECT_FALSE(DecodeKeyBlob({}).ok());
  EXPECT_FALSE(DecodeKeyBlob(std::vector<uint8_t>(good.begin(), good.end() - 1)).ok());
  auto longer = good;
  longer.push_back(0);
  EXPECT_FALSE(DecodeKeyBlob(longer).ok());
  for (size_t i = 0; i < 4; ++i) {
    auto bad = good;
    bad[i] ^= 0x40;
    EXPECT_FALSE(DecodeKeyBlob(bad).ok()) << "byte " << i;
  }
  // Random bytes never crash; they decode only when they look like a key.
  std::mt19937 rng(1);
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> b(rng() % 12);
    for (auto& x : b) x = static_cast<uint8_t>(rng() % 3 == 0 ? 0 : rng());
    auto r = DecodeKeyBlob(b);
    EXPECT_EQ(r.ok(), b.size() == 8 && b[0] == 1 && b[1] == 0 && b[2] == 0 && b[3] == 0);
    std::string s(reinterpret_cast<const char*>(b.data()), b.size());
    (void)RemoteKey::Parse(s);
  }
}

RemoteKey Key(uint64_t addr, uint64_t len, uint32_t access) {
  RemoteKey k;
  k.addr = addr;
  k.length = len;
  k.access = access;
  k.blob = EncodeKeyBlob(0x1234);
  return k;
}

TEST(RemoteKeys, CheckRemoteRangeRightsAndAlignment) {
  RemoteKey k = Key(0x10000, 4096, kRemoteRead | kRemoteAtomic);
  auto ok = CheckRemote(k, 0x10000, 4096, kRemoteRead, false);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, 0x1234u);
  EXPECT_TRUE(CheckRemote(k, 0x10fff, 1, kRemoteRead, false).ok());
  EXPECT_TRUE(CheckRemote(k, 0x11000, 0, kRemoteRead, false).ok());  // empty at the end
  EXPECT_EQ(CheckRemote(k, 0x10fff, 2, kRemoteRead, false).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(CheckRemote(k, 0xfff8, 8, kRemoteRead, false).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(CheckRemote(k, 0x10000, 4097, kRemoteRead, false).status().code(),
            absl::StatusCode::kOutOfRange);
  // No wrap-around: an address near the top with a length that overflows.
  EXPECT_FALSE(CheckRemote(k, UINT64_MAX - 3, 8, kRemoteRead, false).ok());
  EXPECT_FALSE(CheckRemote(k, 0x10008, SIZE_MAX, kRemoteRead, false).ok());
  auto denied = CheckRemote(k, 0x10000, 8, kRemoteWrite, false);
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(denied.status().message(), "remote write"));
  EXPECT_TRUE(CheckRemote(k, 0x10008, 8, kRemoteAtomic, true).ok());
  auto misaligned = CheckRemote(k, 0x10004, 8, kRemoteAtomic, true);
  EXPECT_EQ(misaligned.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(misaligned.status().message(), "8-byte aligned"));
  RemoteKey foreign = k;
  foreign.blob = {1, 2, 3};
  EXPECT_EQ(CheckRemote(foreign, 0x10000, 8, kRemoteRead, false).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ------------------------------------------------------------ work requests

TEST(WorkRequests, SendInlineBelowTheLimitOnly) {
  WorkRequest in;
  in.kind = WrKind::kSend;
  in.wr_id = 42;
  in.local_addr = 0x1000;
  in.length = 64;
  in.lkey = 0x77;
  ibv_send_wr wr;
  ibv_sge sge;
  ASSERT_TRUE(BuildSendWr(in, 64, 1u << 30, &wr, &sge).ok());
  EXPECT_EQ(wr.opcode, IBV_WR_SEND);
  EXPECT_EQ(wr.wr_id, 42u);
  EXPECT_EQ(wr.send_flags, static_cast<unsigned>(IBV_SEND_SIGNALED | IBV_SEND_INLINE));
  EXPECT_EQ(wr.num_sge, 1);
  EXPECT_EQ(wr.sg_list, &sge);
  EXPECT_EQ(wr.next, nullptr);
  EXPECT_EQ(sge.addr, 0x1000u);
  EXPECT_EQ(sge.length, 64u);
  EXPECT_EQ(sge.lkey, 0x77u);
  in.length = 65;
  ASSERT_TRUE(BuildSendWr(in, 64, 1u << 30, &wr, &sge).ok());
  EXPECT_EQ(wr.send_flags, static_cast<unsigned>(IBV_SEND_SIGNALED));
  in.signaled = false;
  ASSERT_TRUE(BuildSendWr(in, 0, 1u << 30, &wr, &sge).ok());
  EXPECT_EQ(wr.send_flags, 0u);
}

TEST(WorkRequests, ZeroLengthHasNoSge) {
  WorkRequest in;
  in.length = 0;
  ibv_send_wr wr;
  ibv_sge sge;
  ASSERT_TRUE(BuildSendWr(in, 64, 1u << 30, &wr, &sge).ok());
  EXPECT_EQ(wr.num_sge, 0);
  EXPECT_EQ(wr.sg_list, nullptr);
  EXPECT_FALSE(wr.send_flags & IBV_SEND_INLINE);
}

TEST(WorkRequests, RdmaReadAndWrite) {
  WorkRequest in;
  in.kind = WrKind::kRdmaRead;
  in.local_addr = 0x2000;
  in.length = 16;
  in.lkey = 5;
  in.remote_addr = 0xabc0;
  in.rkey = 0x99;
  ibv_send_wr wr;
  ibv_sge sge;
  ASSERT_TRUE(BuildSendWr(in, 256, 1u << 30, &wr, &sge).ok());
  EXPECT_EQ(wr.opcode, IBV_WR_RDMA_READ);
  EXPECT_EQ(wr.wr.rdma.remote_addr, 0xabc0u);
  EXPECT_EQ(wr.wr.rdma.rkey, 0x99u);
  EXPECT_FALSE(wr.send_flags & IBV_SEND_INLINE) << "reads are never inline";
  in.kind = WrKind::kRdmaWrite;
  ASSERT_TRUE(BuildSendWr(in, 256, 1u << 30, &wr, &sge).ok());
  EXPECT_EQ(wr.opcode, IBV_WR_RDMA_WRITE);
  EXPECT_TRUE(wr.send_flags & IBV_SEND_INLINE);
  in.length = 4096;
  ASSERT_TRUE(BuildSendWr(in, 256, 1u << 30, &wr, &sge).ok());
  EXPECT_FALSE(wr.send_flags & IBV_SEND_INLINE);
  auto too_long = BuildSendWr(in, 256, 1024, &wr, &sge);
  EXPECT_EQ(too_long.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(too_long.message(), "max_msg_sz 1024"));
}

TEST(WorkRequests, Atomics) {
  WorkRequest in;
  in.kind = WrKind::kFetchAdd;
  in.local_addr = 0x3000;
  in.length = 8;
  in.lkey = 1;
  in.remote_addr = 0x8008;
  in.rkey = 2;
  in.compare_add = 5;
  in.swap = 77;  // ignored for fetch-add
  ibv_send_wr wr;
  ibv_sge sge;
  ASSERT_TRUE(BuildSendWr(in, 256, 1u << 30, &wr, &sge).ok());
  EXPECT_EQ(wr.opcode, IBV_WR_ATOMIC_FETCH_AND_ADD);
  EXPECT_EQ(wr.wr.atomic.remote_addr, 0x8008u);
  EXPECT_EQ(wr.wr.atomic.rkey, 2u);
  EXPECT_EQ(wr.wr.atomic.compare_add, 5u);
  EXPECT_EQ(wr.wr.atomic.swap, 0u);
  EXPECT_FALSE(wr.send_flags & IBV_SEND_INLINE);
  EXPECT_EQ(sge.length, 8u);
  in.kind = WrKind::kCompareSwap;
  ASSERT_TRUE(BuildSendWr(in, 256, 1u << 30, &wr, &sge).ok());
  EXPECT_EQ(wr.opcode, IBV_WR_ATOMIC_CMP_AND_SWP);
  EXPECT_EQ(wr.wr.atomic.compare_add, 5u);
  EXPECT_EQ(wr.wr.atomic.swap, 77u);
  for (uint64_t off = 1; off < 8; ++off) {
    in.remote_addr = 0x8000 + off;
    auto st = BuildSendWr(in, 256, 1u << 30, &wr, &sge);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << off;
    EXPECT_TRUE(absl::StrContains(st.message(), "8-byte aligned"));
  }
  in.remote_addr = 0x8000;
  in.length = 4;
  EXPECT_FALSE(BuildSendWr(in, 256, 1u << 30, &wr, &sge).ok());
}

// ------------------------------------------------------------ completions

TEST(WcErrors, CommonStatusesSayWhatTheyMean) {
  auto access = WcError(IBV_WC_REM_ACCESS_ERR, 0x88, "RDMA read");
  EXPECT_EQ(access.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(StatusErrno(access), EACCES);
  EXPECT_TRUE(absl::StrContains(access.message(), ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR)));
  EXPECT_TRUE(absl::StrContains(access.message(), "RDMA read"));
  EXPECT_TRUE(absl::StrContains(access.message(), "rkey"));
  EXPECT_TRUE(absl::StrContains(access.message(), "0x88"));

  auto retry = WcError(IBV_WC_RETRY_EXC_ERR, 0, "send");
  EXPECT_EQ(retry.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(StatusErrno(retry), ECONNRESET);
  EXPECT_TRUE(absl::StrContains(retry.message(), "dead or unreachable"));

  auto rnr = WcError(IBV_WC_RNR_RETRY_EXC_ERR, 0, "send");
  EXPECT_TRUE(absl::StrContains(rnr.message(), "no receive buffer posted"));
  EXPECT_TRUE(absl::StrContains(rnr.message(), "rnr_retry=7"));

  auto len = WcError(IBV_WC_LOC_LEN_ERR, 0, "receive");
  EXPECT_EQ(len.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(StatusErrno(len), EMSGSIZE);

  auto flush = WcError(IBV_WC_WR_FLUSH_ERR, 0, "send");
  EXPECT_EQ(flush.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(absl::StrContains(flush.message(), "earlier completion"));

  EXPECT_TRUE(WcError(IBV_WC_SUCCESS, 0, "send").ok());
}

TEST(WcErrors, EveryStatusIsAnErrorWithItsName) {
  for (int s = IBV_WC_LOC_LEN_ERR; s <= IBV_WC_TM_RNDV_INCOMPLETE; ++s) {
    auto st = WcError(static_cast<ibv_wc_status>(s), 0, "op");
    EXPECT_FALSE(st.ok()) << s;
    EXPECT_TRUE(absl::StrContains(st.message(), ibv_wc_status_str(static_cast<ibv_wc_status>(s))))
        << st.message();
    EXPECT_TRUE(absl::StrContains(st.message(), "fix:")) << st.message();
    EXPECT_NE(StatusErrno(st), 0);
  }
  auto unknown = WcError(static_cast<ibv_wc_status>(200), 0, "op");
  EXPECT_FALSE(unknown.ok());
}

// ------------------------------------------------------------ private data

TEST(Hello, RoundTripAndPadding) {
  Hello h;
  h.flags = kHelloAtomics;
  h.credits = 128;
  h.eager_size = 8192;
  h.max_inline = 220;
  h.fabric_id = 0x0123456789abcdefULL;
  std::string bytes = EncodeHello(h);
  EXPECT_EQ(bytes.size(), Hello::kSize);
  EXPECT_LE(bytes.size(), 56u) << "must fit an InfiniBand connect request's private data";
  bytes.resize(56, '\0');  // rdma_cm pads what it delivers
  auto d = DecodeHello(bytes.data(), bytes.size());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->flags, h.flags);
  EXPECT_EQ(d->credits, 128u);
  EXPECT_EQ(d->eager_size, 8192u);
  EXPECT_EQ(d->max_inline, 220u);
  EXPECT_EQ(d->fabric_id, h.fabric_id);
  Hello srq;
  srq.flags = kHelloSrq;
  srq.credits = 0;  // unlimited with a shared receive queue
  srq.eager_size = 4096;
  std::string b = EncodeHello(srq);
  EXPECT_TRUE(DecodeHello(b.data(), b.size()).ok());
}

TEST(Hello, HostileInputIsRefused) {
  Hello h;
  h.credits = 16;
  h.eager_size = 4096;
  const std::string good = EncodeHello(h);
  EXPECT_FALSE(DecodeHello(nullptr, 0).ok());
  EXPECT_FALSE(DecodeHello(good.data(), good.size() - 1).ok());
  auto mutate = [&](size_t at, uint8_t v) {
    std::string b = good;
    b[at] = static_cast<char>(v);
    return DecodeHello(b.data(), b.size());
  };
  EXPECT_FALSE(mutate(0, 'x').ok());    // magic
  auto version = mutate(4, 2);
  ASSERT_FALSE(version.ok());
  EXPECT_EQ(version.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(version.status().message(), "version 2"));
  EXPECT_FALSE(mutate(5, 0x80).ok());   // unknown flag
  EXPECT_FALSE(mutate(6, 40).ok());     // length field
  EXPECT_FALSE(mutate(20, 1).ok());     // reserved
  Hello zero = h;
  zero.credits = 0;  // no credits without SRQ: the peer could never send
  std::string z = EncodeHello(zero);
  EXPECT_FALSE(DecodeHello(z.data(), z.size()).ok());
  Hello huge = h;
  huge.eager_size = 64u << 20;
  std::string g = EncodeHello(huge);
  EXPECT_FALSE(DecodeHello(g.data(), g.size()).ok());
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::string b = good;
    for (int j = 0; j < 3; ++j) b[rng() % b.size()] = static_cast<char>(rng());
    auto d = DecodeHello(b.data(), b.size());
    if (d.ok()) {
      EXPECT_GE(d->eager_size, 256u);
      EXPECT_LE(d->eager_size, 1u << 20);
    }
  }
}

// ------------------------------------------------------------ framing

TEST(Framing, HeaderRoundTripAndValidation) {
  uint8_t buf[kHeaderSize + kRtsBodySize + 16] = {};
  Header h;
  h.type = MsgType::kEager;
  h.flags = kMsgControl;
  h.credits = 17;
  h.length = 16;
  h.cookie = 0x1122334455667788ULL;
  h.aux = 9;
  EncodeHeader(h, buf);
  auto d = DecodeHeader(buf, kHeaderSize + 16, 8192);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->type, MsgType::kEager);
  EXPECT_EQ(d->flags, kMsgControl);
  EXPECT_EQ(d->credits, 17);
  EXPECT_EQ(d->length, 16u);
  EXPECT_EQ(d->cookie, h.cookie);
  EXPECT_EQ(d->aux, 9u);
  // The announced length must match what arrived.
  EXPECT_FALSE(DecodeHeader(buf, kHeaderSize + 15, 8192).ok());
  EXPECT_FALSE(DecodeHeader(buf, kHeaderSize - 1, 8192).ok());
  EXPECT_FALSE(DecodeHeader(buf, kHeaderSize + 16, 32).ok());  // above the buffer size

  h.type = MsgType::kRts;
  h.length = 0;
  EncodeHeader(h, buf);
  RtsBody r{0x7fff0000, 16u << 20, 0xabcdef};
  EncodeRts(r, buf + kHeaderSize);
  ASSERT_TRUE(DecodeHeader(buf, kHeaderSize + kRtsBodySize, 8192).ok());
  RtsBody back = DecodeRts(buf + kHeaderSize);
  EXPECT_EQ(back.addr, r.addr);
  EXPECT_EQ(back.length, r.length);
  EXPECT_EQ(back.rkey, r.rkey);
  EXPECT_FALSE(DecodeHeader(buf, kHeaderSize, 8192).ok());

  for (MsgType t : {MsgType::kFin, MsgType::kCredit, MsgType::kClose}) {
    h.type = t;
    h.length = 0;
    EncodeHeader(h, buf);
    EXPECT_TRUE(DecodeHeader(buf, kHeaderSize, 8192).ok());
    EXPECT_FALSE(DecodeHeader(buf, kHeaderSize + 1, 8192).ok());
  }
  buf[0] = 0;
  EXPECT_EQ(DecodeHeader(buf, kHeaderSize, 8192).status().code(), absl::StatusCode::kDataLoss);
  buf[0] = 99;
  EXPECT_FALSE(DecodeHeader(buf, kHeaderSize, 8192).ok());
  buf[0] = static_cast<uint8_t>(MsgType::kFin);
  buf[1] = 0x80;
  EXPECT_FALSE(DecodeHeader(buf, kHeaderSize, 8192).ok());
}

TEST(Framing, RandomBytesNeverCrash) {
  std::mt19937 rng(3);
  std::vector<uint8_t> b(kHeaderSize + 64);
  for (int i = 0; i < 50000; ++i) {
    size_t len = rng() % b.size();
    for (auto& x : b) x = static_cast<uint8_t>(rng() % 4 == 0 ? rng() % 6 : rng());
    auto h = DecodeHeader(b.data(), len, 8192);
    if (h.ok() && h->type == MsgType::kEager) {
      EXPECT_EQ(h->length + kHeaderSize, len);
    }
  }
}

// ------------------------------------------------------------ matching

Arrival Eager(const std::string& s) {
  Arrival a;
  a.data.assign(s.begin(), s.end());
  return a;
}

TEST(Matcher, InOrderBothWays) {
  Matcher m;
  char b1[16], b2[16], b3[4];
  EXPECT_FALSE(m.Post({b1, sizeof(b1), nullptr, 1}).has_value());
  EXPECT_FALSE(m.Post({b2, sizeof(b2), nullptr, 2}).has_value());
  auto first = m.Arrive(Eager("one"));
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->recv.context, 1u);
  EXPECT_FALSE(first->truncated);
  // Messages that come early wait for receives, in order.
  auto second = m.Arrive(Eager("two"));
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->recv.context, 2u);
  EXPECT_FALSE(m.Arrive(Eager("three")).has_value());
  Arrival rts;
  rts.rendezvous = true;
  rts.rts.length = 100;
  rts.cookie = 5;
  EXPECT_FALSE(m.Arrive(rts).has_value());
  EXPECT_EQ(m.waiting_messages(), 2u);
  auto third = m.Post({b1, sizeof(b1), nullptr, 3});
  ASSERT_TRUE(third.has_value());
  EXPECT_EQ(std::string(third->msg.data.begin(), third->msg.data.end()), "three");
  // A message longer than the receive it meets truncates only that one.
  auto fourth = m.Post({b3, sizeof(b3), nullptr, 4});
  ASSERT_TRUE(fourth.has_value());
  EXPECT_TRUE(fourth->truncated);
  EXPECT_TRUE(fourth->msg.rendezvous);
  EXPECT_EQ(fourth->msg.cookie, 5u);
  EXPECT_FALSE(m.Post({b3, sizeof(b3), nullptr, 5}).has_value());
  auto fits = m.Arrive(Eager("abcd"));
  ASSERT_TRUE(fits.has_value());
  EXPECT_FALSE(fits->truncated);
  EXPECT_EQ(m.waiting_recvs(), 0u);
  EXPECT_FALSE(m.Post({b3, sizeof(b3), nullptr, 6}).has_value());
  EXPECT_EQ(m.TakeRecvs().size(), 1u);
  EXPECT_EQ(m.waiting_recvs(), 0u);
}

TEST(Credits, WindowAndReturns) {
  Credits c(4);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(c.Take());
  EXPECT_FALSE(c.Take()) << "the last credit is kept for a credit update";
  EXPECT_FALSE(c.TakeForUpdate()) << "nothing owed: no update";
  c.Returned(8);
  EXPECT_FALSE(c.TakeForUpdate()) << "an update returning one gains the peer nothing";
  c.Returned(8);
  EXPECT_TRUE(c.TakeForUpdate());
  EXPECT_EQ(c.available(), 0u);
  EXPECT_FALSE(c.TakeForUpdate());
  EXPECT_EQ(c.TakeReturn(), 2);
  c.Grant(2);
  EXPECT_EQ(c.available(), 2u);
  EXPECT_FALSE(c.Returned(8));
  EXPECT_FALSE(c.Returned(8));
  EXPECT_FALSE(c.Returned(8));
  EXPECT_TRUE(c.Returned(8));  // half of the window refilled: tell the peer
  EXPECT_EQ(c.TakeReturn(), 4);
  EXPECT_EQ(c.pending_return(), 0u);
  EXPECT_EQ(c.TakeReturn(), 0);
  Credits unlimited(Credits::kUnlimited);
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(unlimited.Take());
  EXPECT_TRUE(unlimited.unlimited());
}

// ------------------------------------------------------------ registrations

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

TEST(Registrations, RegionKeysAccessAndDeregistration) {
  FakeRegistrar reg;
  RegTable table;
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
  auto rkey = DecodeKeyBlob(key.blob);
  ASSERT_TRUE(rkey.ok());
  EXPECT_EQ(*rkey, 1u);

  // Emulated accesses go through the table: range, rights, liveness.
  uint64_t base = key.addr;
  int touched = 0;
  EXPECT_TRUE(table.Access(1, base + 8, 8, kRemoteRead, [&](void* p) {
                EXPECT_EQ(p, mem.data() + 8);
                ++touched;
              }).ok());
  EXPECT_EQ(touched, 1);
  EXPECT_FALSE(table.Access(1, base + 4090, 8, kRemoteRead, [&](void*) { ++touched; }).ok());
  EXPECT_FALSE(table.Access(1, base - 8, 8, kRemoteRead, [&](void*) { ++touched; }).ok());
  EXPECT_FALSE(table.Access(1, base, 8, kRemoteAtomic, [&](void*) { ++touched; }).ok());
  EXPECT_FALSE(table.Access(2, base, 8, kRemoteRead, [&](void*) { ++touched; }).ok());
  EXPECT_EQ(touched, 1);

  (*mr)->Revoke();
  EXPECT_EQ(reg.deregistrations, 1);
  auto refused = table.Access(1, base, 8, kRemoteRead, [&](void*) { ++touched; });
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
  RegTable table;
  reg.reuse_key = 77;
  std::vector<uint8_t> a(64), b(64);
  auto old_mr = Register(&reg, &table, a.data(), a.size(), kRemoteRead);
  ASSERT_TRUE(old_mr.ok());
  (*old_mr)->Revoke();
  // The HCA hands out the same rkey again for a new registration.
  auto new_mr = Register(&reg, &table, b.data(), b.size(), kRemoteRead);
  ASSERT_TRUE(new_mr.ok());
  old_mr->reset();
  int touched = 0;
  EXPECT_TRUE(table.Access(77, reinterpret_cast<uint64_t>(b.data()), 8, kRemoteRead,
                           [&](void*) { ++touched; }).ok());
  EXPECT_FALSE(table.Access(77, reinterpret_cast<uint64_t>(a.data()), 8, kRemoteRead,
                            [&](void*) { ++touched; }).ok());
  EXPECT_EQ(touched, 1);
}

// The registration cache over verbs regions: hits reuse the ibv_mr, and
// unmapping the memory deregisters it at once and the target refuses the key.
TEST(Registrations, ThroughTheRegistrationCache) {
  FakeRegistrar reg;
  RegTable table;
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
  auto rkey = DecodeKeyBlob((*r3)->remote_key().blob);
  ASSERT_TRUE(rkey.ok());
  uint64_t addr = reinterpret_cast<uint64_t>(mem);
  int touched = 0;
  EXPECT_TRUE(table.Access(*rkey, addr, 8, kRemoteWrite, [&](void*) { ++touched; }).ok());
  r1->reset();
  r2->reset();
  const int before = reg.deregistrations;
  ASSERT_EQ(munmap(mem, len), 0);
  // Revoked inside munmap: deregistered, and the key is refused.
  EXPECT_GT(reg.deregistrations, before);
  EXPECT_TRUE((*r3)->remote_key().blob == EncodeKeyBlob(*rkey));
  EXPECT_FALSE(table.Access(*rkey, addr, 8, kRemoteWrite, [&](void*) { ++touched; }).ok());
  EXPECT_EQ(touched, 1);
  EXPECT_GE(cache.stats().invalidations, 1u);
  r3->reset();
  cache.Flush();
  EXPECT_EQ(reg.double_deregistrations, 0);
  EXPECT_TRUE(reg.live.empty());
}

// ------------------------------------------------------------ the provider here

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
