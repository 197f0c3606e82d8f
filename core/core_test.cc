// Unit tests for core pieces that need no provider: config loading and
// validation, config strings, remote-key encoding, status/errno mapping,
// the completion queue's wake-ups.
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <span>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "core/config.h"
#include "core/cq.h"
#include "core/flow_window.h"
#include "core/provider.h"
#include "core/status.h"
#include "gtest/gtest.h"

namespace zsock {
namespace {

std::string TempFile(const std::string& text) {
  char path[] = "/tmp/zsock_conf_XXXXXX";
  int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << text;
  return path;
}

TEST(Config, DefaultsFileThenEnvironmentWithSources) {
  std::string file = TempFile("# comment\nprovider = unet?cma=off\nspin_us=50 # trailing\n");
  auto config = Config::Load({{"ZSOCK_SPIN_US", "7"}}, &file);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->GetString("provider"), "unet?cma=off");
  EXPECT_EQ(config->Get("provider").source, file + ":2");
  EXPECT_EQ(config->GetInt("spin_us"), 7);
  EXPECT_EQ(config->Get("spin_us").source, "env ZSOCK_SPIN_US");
  EXPECT_EQ(config->Get("log_level").source, "default");
  std::remove(file.c_str());
}

TEST(Config, SizesAndBooleans) {
  auto config = Config::Load({{"ZSOCK_RCACHE_MAX_BYTES", "3M"}, {"ZSOCK_MEMHOOKS", "off"}}, nullptr);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->GetInt("rcache_max_bytes"), 3 << 20);
  EXPECT_FALSE(config->GetBool("memhooks"));
}

TEST(Config, UnknownKeyNamesKeyAndSourceAndListsKnownOnes) {
  std::string file = TempFile("provder = unet\n");
  auto config = Config::Load({}, &file);
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("provder"), absl::string_view::npos);
  EXPECT_NE(config.status().message().find(file + ":1"), absl::string_view::npos);
  EXPECT_NE(config.status().message().find("known keys: provider"), absl::string_view::npos);
  std::remove(file.c_str());
}

TEST(Config, BadValuesAreRejectedWithTheFix) {
  auto bad_enum = Config::Load({{"ZSOCK_LOG_LEVEL", "loud"}}, nullptr);
  ASSERT_FALSE(bad_enum.ok());
  EXPECT_NE(bad_enum.status().message().find("use one of: error, warn"), absl::string_view::npos);
  auto bad_number = Config::Load({{"ZSOCK_SPIN_US", "fast"}}, nullptr);
  ASSERT_FALSE(bad_number.ok());
  EXPECT_NE(bad_number.status().message().find("not a number"), absl::string_view::npos);
  auto out_of_range = Config::Load({{"ZSOCK_AZ_ADVERTS", "65"}}, nullptr);
  ASSERT_FALSE(out_of_range.ok());
  EXPECT_NE(out_of_range.status().message().find("out of range"), absl::string_view::npos);
  auto unknown_env = Config::Load({{"ZSOCK_PROVDER", "unet"}}, nullptr);
  ASSERT_FALSE(unknown_env.ok());
  EXPECT_NE(unknown_env.status().message().find("ZSOCK_PROVDER"), absl::string_view::npos);
  std::string line = TempFile("just words\n");
  auto no_equals = Config::Load({}, &line);
  ASSERT_FALSE(no_equals.ok());
  EXPECT_NE(no_equals.status().message().find("expected 'key = value'"), absl::string_view::npos);
  std::remove(line.c_str());
  std::string missing = "/nonexistent/zsock.conf";
  EXPECT_FALSE(Config::Load({}, &missing).ok());
}

// Providers register their own keys; they are validated like core's, and
// one registered after the global configuration loaded joins it.
TEST(Config, RegisteredKeysAreValidatedAndJoinTheGlobalConfiguration) {
  ASSERT_TRUE(Config::Global().ok());
  ::setenv("ZSOCK_REGTEST_DEPTH", "12", 1);
  RegisterConfigKeys({{"regtest_depth", ConfigType::kInt, "8", "test key", {}, 4, 64},
                      {"provider", ConfigType::kString, "x", "a duplicate, ignored"}});
  ::unsetenv("ZSOCK_REGTEST_DEPTH");
  EXPECT_EQ(Config::Global()->GetInt("regtest_depth"), 12);
  EXPECT_EQ(Config::Global()->Get("regtest_depth").source, "env ZSOCK_REGTEST_DEPTH");
  int providers = 0;
  for (const auto& k : ConfigKeys()) providers += k.name == "provider";
  EXPECT_EQ(providers, 1);
  auto too_big = Config::Load({{"ZSOCK_REGTEST_DEPTH", "65"}}, nullptr);
  ASSERT_FALSE(too_big.ok());
  EXPECT_NE(too_big.status().message().find("use a value from 4 to 64"), absl::string_view::npos);
  auto fine = Config::Load({}, nullptr);
  ASSERT_TRUE(fine.ok());
  EXPECT_EQ(fine->GetInt("regtest_depth"), 8);
}

TEST(FabricSpec, ParsesProviderSpecAndOptions) {
  auto s = ParseFabricSpec("ofi:tcp;ofi_rxm?iface=lo&FI_TCP_IFACE=lo");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->provider, "ofi");
  EXPECT_EQ(s->spec, "tcp;ofi_rxm");
  EXPECT_EQ(s->options.at("iface"), "lo");
  EXPECT_EQ(s->options.at("FI_TCP_IFACE"), "lo");
  EXPECT_EQ(s->ToString(), "ofi:tcp;ofi_rxm?FI_TCP_IFACE=lo&iface=lo");
  auto u = ParseFabricSpec("ucx:posix,cma");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->spec, "posix,cma");
  EXPECT_TRUE(u->options.empty());
  EXPECT_FALSE(ParseFabricSpec("").ok());
  EXPECT_FALSE(ParseFabricSpec(":tcp").ok());
  EXPECT_FALSE(ParseFabricSpec("unet?novalue").ok());
  EXPECT_FALSE(ParseFabricSpec("unet?=1").ok());
}

TEST(Fabric, UnknownProviderListsTheBuiltOnes) {
  auto f = Fabric::Open("nosuch:thing");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(f.status().message().find("unknown provider 'nosuch'"), absl::string_view::npos);
}

TEST(RemoteKey, RoundTripsAndRejectsMalformedBytes) {
  RemoteKey k;
  k.addr = 0x7f0012345678;
  k.length = 4096;
  k.access = kRemoteRead | kRemoteWrite;
  k.blob = {1, 2, 3, 4, 5, 6, 7, 8};
  std::string bytes = k.Serialize();
  auto back = RemoteKey::Parse(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->addr, k.addr);
  EXPECT_EQ(back->length, k.length);
  EXPECT_EQ(back->access, k.access);
  EXPECT_EQ(back->blob, k.blob);
  EXPECT_FALSE(RemoteKey::Parse(bytes.substr(0, 10)).ok());          // truncated
  EXPECT_FALSE(RemoteKey::Parse(bytes + "x").ok());                  // trailing byte
  std::string wrong_version = bytes;
  wrong_version[0] = 9;
  EXPECT_FALSE(RemoteKey::Parse(wrong_version).ok());
  RemoteKey wrap = k;
  wrap.addr = ~uint64_t{0} - 10;
  EXPECT_FALSE(RemoteKey::Parse(wrap.Serialize()).ok());             // range wraps
  std::string big_blob = bytes;
  big_blob[1] = static_cast<char>(200);
  EXPECT_FALSE(RemoteKey::Parse(big_blob).ok());
}

TEST(Status, CarriesErrnoCauseAndFix) {
  absl::Status st = ErrnoError(EPERM, "process_vm_readv failed", "set unet_cma=off");
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(StatusErrno(st), EPERM);
  EXPECT_NE(st.message().find("Operation not permitted"), absl::string_view::npos);
  EXPECT_NE(st.message().find("fix: set unet_cma=off"), absl::string_view::npos);
  EXPECT_EQ(StatusErrno(absl::UnavailableError("x")), EAGAIN);
  EXPECT_EQ(StatusErrno(absl::OkStatus()), 0);
  EXPECT_EQ(ErrnoError(ECONNRESET, "x").code(), absl::StatusCode::kAborted);
}

// A CompletionQueue whose provider never has anything: wait_fd is core's
// wake eventfd alone, so what it shows is what Wake/Arm/Push did.
class BareCq final : public CqBase {
 public:
  int wait_fd() const override { return wake_fd(); }
  bool Readable() const {
    pollfd p{wait_fd(), POLLIN, 0};
    return ::poll(&p, 1, 0) == 1;
  }
  // Reads the eventfd's counter (and so resets it).
  uint64_t TakeCount() const {
    uint64_t v = 0;
    return ::read(wait_fd(), &v, sizeof(v)) == sizeof(v) ? v : 0;
  }

 protected:
  size_t Progress() override { return 0; }
  bool ArmProvider() override { return true; }
};

// Providers call WakeSleeper for everything they finish outside Progress;
// while a wake-up is pending (not yet drained by Arm) another costs no
// write(2), and one after Arm's drain is not lost.
TEST(CompletionQueue, WakeUpsAreWrittenOncePerSleepAndNeverLost) {
  BareCq cq;
  ASSERT_TRUE(cq.Arm());
  EXPECT_FALSE(cq.Readable());
  cq.WakeSleeper();
  cq.WakeSleeper();
  cq.WakeSleeper();
  EXPECT_TRUE(cq.Readable());
  EXPECT_EQ(cq.TakeCount(), 1u) << "three wake-ups of one sleep wrote more than once";
  // Re-arm (drains), then wake again: that one must show.
  ASSERT_TRUE(cq.Arm());
  EXPECT_FALSE(cq.Readable());
  cq.WakeSleeper();
  EXPECT_TRUE(cq.Readable());
  ASSERT_TRUE(cq.Arm());
  EXPECT_FALSE(cq.Readable()) << "Arm left a drained wake-up readable";
  // A completion pushed to an armed queue wakes it, and Poll returns it.
  Completion c;
  c.context = 7;
  cq.Push(c);
  EXPECT_TRUE(cq.Readable());
  Completion out[2];
  ASSERT_EQ(cq.Poll(out), 1u);
  EXPECT_EQ(out[0].context, 7u);
  EXPECT_TRUE(cq.Arm()) << "the queue is empty, yet Arm said pending";
}

// A provider CQ whose Progress reports `contexts` through DirectSlot when it
// can and Push when it cannot (as ucx reports a finished receive).
class SlotCq final : public CqBase {
 public:
  int wait_fd() const override { return wake_fd(); }
  std::vector<uint64_t> contexts;
  int direct = 0;

 protected:
  size_t Progress() override {
    for (uint64_t ctx : contexts) {
      if (Completion* slot = DirectSlot()) {
        ++direct;
        slot->context = ctx;
        slot->op = OpType::kRecv;
        slot->length = 1;
        slot->endpoint = nullptr;
        slot->status = absl::OkStatus();
      } else {
        Completion c;
        c.context = ctx;
        c.op = OpType::kRecv;
        Push(std::move(c));
      }
    }
    size_t n = contexts.size();
    contexts.clear();
    return n;
  }
  bool ArmProvider() override { return true; }
};

// DirectSlot hands out the slots of the Poll running Progress on this
// thread, in order and no more than it holds; completions queued before
// (a Push from outside Progress) come first; outside Poll there is none.
TEST(CompletionQueue, DirectSlotsFillPollsOutputInOrder) {
  SlotCq cq;
  EXPECT_EQ(cq.DirectSlot(), nullptr) << "a slot outside any Poll";
  Completion out[2];
  out[0].status = absl::InternalError("stale");  // a slot holds an old value
  cq.contexts = {1, 2, 3};
  ASSERT_EQ(cq.Poll(out), 2u);
  EXPECT_EQ(cq.direct, 2) << "only the two slots Poll offers";
  EXPECT_EQ(out[0].context, 1u);
  EXPECT_TRUE(out[0].status.ok()) << out[0].status;
  EXPECT_EQ(out[1].context, 2u);
  // The third was queued; it comes before anything a later Progress finds,
  // which must then not take a slot ahead of it.
  cq.contexts = {4};
  ASSERT_EQ(cq.Poll(std::span<Completion>(out, 1)), 1u);
  EXPECT_EQ(out[0].context, 3u);
  EXPECT_EQ(cq.direct, 2) << "a slot was given out while a completion waited in the queue";
  ASSERT_EQ(cq.Poll(std::span<Completion>(out, 1)), 1u);
  EXPECT_EQ(out[0].context, 4u);
  EXPECT_EQ(cq.Poll(std::span<Completion>(out, 1)), 0u);
}

// A provider CQ whose Progress gathers completions as ofi and unet do: each
// through EmitSlot into a list it pushes afterwards (PushAll).
class GatherCq final : public CqBase {
 public:
  int wait_fd() const override { return wake_fd(); }
  std::vector<uint64_t> contexts;
  std::vector<uint64_t> listed;  // appended to the list first, not by EmitSlot

 protected:
  size_t Progress() override {
    absl::InlinedVector<Completion, 2> pending;
    for (uint64_t ctx : listed) {
      Completion c;
      c.context = ctx;
      pending.push_back(std::move(c));
    }
    listed.clear();
    for (uint64_t ctx : contexts) {
      Completion& c = EmitSlot(&pending);
      c.context = ctx;
      c.op = OpType::kRecv;
      c.length = ctx;
      c.endpoint = nullptr;
      c.status = absl::OkStatus();
    }
    const size_t n = contexts.size();
    contexts.clear();
    PushAll(std::span<Completion>(pending.data(), pending.size()));
    return n;
  }
  bool ArmProvider() override { return true; }
};

// EmitSlot fills Poll's output while nothing waits in the provider's list,
// then appends to the list (pushed after, into the queue): the order holds
// across the two, a stale slot is overwritten, and outside Poll everything
// goes to the list.
TEST(CompletionQueue, EmitSlotKeepsOrderBehindTheList) {
  GatherCq cq;
  Completion out[2];
  out[1].status = absl::InternalError("stale");
  cq.contexts = {1, 2, 3, 4, 5};
  ASSERT_EQ(cq.Poll(out), 2u);
  EXPECT_EQ(out[0].context, 1u);
  EXPECT_EQ(out[1].context, 2u);
  EXPECT_EQ(out[1].length, 2u);
  EXPECT_TRUE(out[1].status.ok()) << out[1].status;
  // 3, 4 and 5 went to the list and then the queue; a later Progress's
  // completion must come after them, not into a direct slot ahead.
  cq.contexts = {6};
  std::vector<uint64_t> got;
  for (int i = 0; i < 10 && got.size() < 4; ++i) {
    size_t n = cq.Poll(out);
    for (size_t k = 0; k < n; ++k) got.push_back(out[k].context);
  }
  EXPECT_EQ(got, (std::vector<uint64_t>{3, 4, 5, 6}));
  // A list that already holds a completion (a provider's failure path
  // appends directly) keeps the next one behind it, though Poll has slots.
  cq.listed = {7};
  cq.contexts = {8};
  ASSERT_EQ(cq.Poll(out), 2u);
  EXPECT_EQ(out[0].context, 7u);
  EXPECT_EQ(out[1].context, 8u) << "EmitSlot took a slot ahead of the list";
  absl::InlinedVector<Completion, 2> outside;
  Completion& c = cq.EmitSlot(&outside);
  c.context = 9;
  EXPECT_EQ(outside.size(), 1u) << "outside Poll there is no direct slot";
}

// ---- core emulation against a fake provider ----
//
// Two endpoints wired back to back in one thread: SendControl hands the
// bytes straight to the peer's DeliverControl, and refuses messages longer
// than `control_max` with EMSGSIZE, as ofi's 64 KiB control buffers do.

class FakeEmRegion final : public MemoryRegion {
 public:
  FakeEmRegion(void* addr, size_t len) : MemoryRegion(addr, len, kAccessAll) {}
  RemoteKey remote_key() const override {
    RemoteKey k;
    k.addr = reinterpret_cast<uint64_t>(addr());
    k.length = length();
    k.access = access();
    k.blob = {1};
    return k;
  }
  void Revoke() noexcept override {}
};

class FakeEmFabric final : public Fabric {
 public:
  explicit FakeEmFabric(size_t max_rma) {
    caps_.provider = "fake";
    caps_.rdma_read = Support::kEmulated;
    caps_.rdma_write = Support::kEmulated;
    caps_.max_msg_size = size_t{1} << 30;
    caps_.max_rma_size = max_rma;
  }
  ~FakeEmFabric() override { ReleaseCache(); }
  const Capabilities& caps() const override { return caps_; }
  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* addr, size_t len,
                                                               uint32_t) override {
    region_ = {addr, len};
    return std::unique_ptr<MemoryRegion>(new FakeEmRegion(addr, len));
  }
  absl::StatusOr<std::unique_ptr<CompletionQueue>> CreateCq() override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<std::unique_ptr<Listener>> Listen(absl::string_view) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<std::unique_ptr<Endpoint>> Connect(absl::string_view, CompletionQueue*,
                                                    absl::Duration) override {
    return absl::UnimplementedError("fake");
  }
  absl::Status AccessLocal(const RemoteKey&, uint64_t addr, size_t len, uint32_t,
                           absl::FunctionRef<void(void*)> fn) override {
    const uint64_t base = reinterpret_cast<uint64_t>(region_.first);
    if (addr < base || len > region_.second || addr - base > region_.second - len) {
      return absl::OutOfRangeError("outside the fake region");
    }
    fn(reinterpret_cast<void*>(addr));
    return absl::OkStatus();
  }

 private:
  Capabilities caps_;
  std::pair<void*, size_t> region_{nullptr, 0};
};

class FakeEmEndpoint final : public Endpoint {
 public:
  FakeEmEndpoint(Fabric* f, CompletionQueue* cq, size_t control_max)
      : Endpoint(f, cq), control_max_(control_max) {}
  FakeEmEndpoint* peer = nullptr;
  const EndpointInfo& info() const override { return info_; }
  absl::Status Send(const void*, size_t, MemoryRegion*, uint64_t) override {
    return absl::UnimplementedError("fake");
  }
  absl::Status PostRecv(void*, size_t, MemoryRegion*, uint64_t) override {
    return absl::UnimplementedError("fake");
  }
  void Close() override {}
  absl::Status SendControl(std::span<const uint8_t> msg) override {
    if (msg.size() > control_max_) {
      return MakeError(absl::StatusCode::kInvalidArgument, EMSGSIZE, "control message too long",
                       "send less");
    }
    peer->DeliverControl(msg);
    return absl::OkStatus();
  }

 private:
  size_t control_max_;
  EndpointInfo info_;
};

// A target whose control messages cannot carry a read's answer (the
// initiator's max_rma_size claims more than the target can send, as a peer
// that does not check it would) answers with the error: the read fails with
// EMSGSIZE instead of never completing. Reads that fit, and writes, work.
// The flow-control rules ofi and ucx share (core/flow_window.h).
TEST(FlowWindow, OnlyWhenBothSidesWindow) {
  for (auto [mine, theirs] : {std::pair<uint64_t, uint64_t>{0, 8}, {8, 0}, {0, 0}}) {
    FlowWindow f;
    f.Start(mine, theirs);
    EXPECT_FALSE(f.on());
    for (int i = 0; i < 100; ++i) f.Posted();
    EXPECT_TRUE(f.open());
    EXPECT_FALSE(f.ReportDue(100));
  }
}

TEST(FlowWindow, SendsStopAtTheWindowAndReportsOpenIt) {
  FlowWindow f;
  f.Start(4, 16);
  ASSERT_TRUE(f.on());
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(f.open()) << i;
    f.Posted();
  }
  EXPECT_FALSE(f.open());
  f.PeerReported(1);
  EXPECT_TRUE(f.open());
  f.Posted();
  EXPECT_FALSE(f.open());
  f.PeerReported(0);  // an older report overtaken by a newer one: no effect
  EXPECT_FALSE(f.open());
  f.PeerReported(1000);  // more than we sent: capped, the window is at most 4
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(f.open()) << i;
    f.Posted();
  }
  EXPECT_FALSE(f.open());
}

TEST(FlowWindow, ReportsEveryQuarterOfThePeersWindow) {
  FlowWindow f;
  f.Start(8, 16);  // the peer's window of 16: a report every 4 consumed
  EXPECT_FALSE(f.ReportDue(3));
  EXPECT_TRUE(f.ReportDue(4));
  f.Reported(4);
  EXPECT_FALSE(f.ReportDue(7));
  EXPECT_TRUE(f.ReportDue(8));
  FlowWindow tiny;
  tiny.Start(8, 2);  // never less than every message
  EXPECT_TRUE(tiny.ReportDue(1));
}

TEST(FlowWindow, RecordsRoundTripAndRejectOthers) {
  const auto rec = EncodeRecord(kFlowReportMarker, 0x0102030405060708ull);
  uint64_t n = 0;
  ASSERT_TRUE(DecodeRecord(rec, kFlowReportMarker, &n));
  EXPECT_EQ(n, 0x0102030405060708ull);
  EXPECT_FALSE(DecodeRecord(rec, 0xf1, &n));
  EXPECT_FALSE(DecodeRecord(std::span<const uint8_t>(rec.data(), kRecordSize - 1),
                            kFlowReportMarker, &n));
}

TEST(Emulation, AnAnswerTooLargeToSendFailsTheRead) {
  constexpr size_t kControlMax = 64 << 10;
  FakeEmFabric initiator_fabric(size_t{1} << 20), target_fabric(kControlMax - 512);
  BareCq initiator_cq, target_cq;
  FakeEmEndpoint initiator(&initiator_fabric, &initiator_cq, kControlMax);
  FakeEmEndpoint target(&target_fabric, &target_cq, kControlMax);
  initiator.peer = &target;
  target.peer = &initiator;
  std::vector<uint8_t> memory(2 << 20);
  for (size_t i = 0; i < memory.size(); ++i) memory[i] = static_cast<uint8_t>(i * 7);
  auto mr = target_fabric.RegisterMemory(memory.data(), memory.size(), kAccessAll);
  ASSERT_TRUE(mr.ok());
  const RemoteKey key = (*mr)->remote_key();
  std::vector<uint8_t> local(memory.size());
  Completion c[2];

  // Fits: 32 KiB.
  ASSERT_TRUE(initiator.Read(local.data(), 32 << 10, nullptr, key.addr, key, 1).ok());
  ASSERT_EQ(initiator_cq.Poll(c), 1u);
  EXPECT_TRUE(c[0].status.ok()) << c[0].status;
  EXPECT_EQ(c[0].length, size_t{32} << 10);
  EXPECT_EQ(std::memcmp(local.data(), memory.data(), 32 << 10), 0);

  // Too large for the target's answer: 128 KiB.
  ASSERT_TRUE(initiator.Read(local.data(), 128 << 10, nullptr, key.addr, key, 2).ok())
      << "the initiator's own max_rma_size (1 MiB) lets it go";
  ASSERT_EQ(initiator_cq.Poll(c), 1u) << "the read got no completion (the answer was dropped)";
  EXPECT_EQ(c[0].context, 2u);
  EXPECT_EQ(StatusErrno(c[0].status), EMSGSIZE) << c[0].status;
  EXPECT_NE(c[0].status.message().find("could not send the answer"), absl::string_view::npos)
      << c[0].status;

  // The initiator's own limit refuses at the call (EMSGSIZE), nothing sent.
  auto st = initiator.Read(local.data(), (1 << 20) + 1, nullptr, key.addr, key, 3);
  EXPECT_EQ(StatusErrno(st), EMSGSIZE) << st;
  EXPECT_EQ(initiator_cq.Poll(c), 0u);

  // A write whose request fits still works (its answer is small).
  std::vector<uint8_t> data(16 << 10, 0xab);
  ASSERT_TRUE(initiator.Write(data.data(), data.size(), nullptr, key.addr + 4096, key, 4).ok());
  ASSERT_EQ(initiator_cq.Poll(c), 1u);
  EXPECT_TRUE(c[0].status.ok()) << c[0].status;
  EXPECT_EQ(memory[4096], 0xab);
  EXPECT_EQ(memory[4096 + (16 << 10) - 1], 0xab);
}

}  // namespace
}  // namespace zsock
