// ofi provider specifics the conformance suite does not cover, about
// configuration strings: how one resolves to a libfabric provider, its
// options, and the errors for one that does not exist or cannot run here.
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/provider.h"
#include "gtest/gtest.h"
#include "tests/child_process.h"

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

bool HasNote(const Capabilities& caps, absl::string_view text) {
  for (const std::string& note : caps.notes) {
    if (absl::StrContains(note, text)) return true;
  }
  return false;
}

// cq_wait=none opens the CQs without a wait object, says so, and still
// waits (OfiPair.BlockedWaitDoesNotSpin runs it); ofi:tcp waits on its
// sockets unless told otherwise, which no other configuration can; a wrong
// value is refused with the values it takes.
TEST(OfiOpen, CqWaitChoosesTheCqWaitObject) {
  auto fd = Fabric::Open("ofi:tcp?iface=lo&cq_wait=fd");
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_TRUE((*fd)->caps().wait_fd);
  EXPECT_TRUE(HasNote((*fd)->caps(), "cq_wait=fd")) << "cq_wait=fd is not what the notes say";
  EXPECT_FALSE(HasNote((*fd)->caps(), "cq_wait=sockets"));
  EXPECT_FALSE(HasNote((*fd)->caps(), "cq_wait=none"));
  auto none = Fabric::Open("ofi:tcp?iface=lo&cq_wait=none");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE((*none)->caps().wait_fd);
  EXPECT_TRUE(HasNote((*none)->caps(), "FI_WAIT_NONE"))
      << "the capabilities do not say the CQs have no wait object";
  for (const char* config : {"ofi:tcp?iface=lo", "ofi:tcp?iface=lo&cq_wait=sockets"}) {
    auto sockets = Fabric::Open(config);
    ASSERT_TRUE(sockets.ok()) << sockets.status();
    EXPECT_TRUE((*sockets)->caps().wait_fd) << config;
    EXPECT_TRUE(HasNote((*sockets)->caps(), "cq_wait=sockets")) << config;
  }
  auto rxm = Fabric::Open("ofi:tcp;ofi_rxm?iface=lo");
  ASSERT_TRUE(rxm.ok()) << rxm.status();
  EXPECT_FALSE(HasNote((*rxm)->caps(), "cq_wait=sockets")) << "rxm has no sockets of its own to wait on";
  auto rxm_sockets = Fabric::Open("ofi:tcp;ofi_rxm?iface=lo&cq_wait=sockets");
  ASSERT_FALSE(rxm_sockets.ok());
  EXPECT_EQ(rxm_sockets.status().code(), absl::StatusCode::kInvalidArgument) << rxm_sockets.status();
  EXPECT_TRUE(absl::StrContains(rxm_sockets.status().message(), "ofi:tcp")) << rxm_sockets.status();
  // The backstop belongs to the CQs with a wait object: cq_wait=sockets
  // and cq_wait=fd. Without one the timer is the poll timer.
  for (const char* config : {"ofi:tcp?iface=lo&backstop_ms=0", "ofi:tcp?iface=lo&cq_wait=fd&backstop_ms=2",
                             "ofi:tcp;ofi_rxm?iface=lo&backstop_ms=0"}) {
    auto backstop = Fabric::Open(config);
    EXPECT_TRUE(backstop.ok()) << config << ": " << backstop.status();
  }
  EXPECT_TRUE(HasNote((*rxm)->caps(), "backstop_ms=64")) << "rxm's FI_WAIT_FD CQs have the backstop";
  auto rxm_bare = Fabric::Open("ofi:tcp;ofi_rxm?iface=lo&backstop_ms=0");
  ASSERT_TRUE(rxm_bare.ok()) << rxm_bare.status();
  EXPECT_FALSE(HasNote((*rxm_bare)->caps(), "backstop timer"));
  for (const char* config : {"ofi:tcp?iface=lo&cq_wait=none&backstop_ms=2", "ofi:tcp?iface=lo&backstop_ms=soon",
                             "ofi:shm?backstop_ms=8"}) {
    auto refused = Fabric::Open(config);
    ASSERT_FALSE(refused.ok()) << config;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
    EXPECT_TRUE(absl::StrContains(refused.status().message(), "backstop_ms")) << refused.status();
  }
  auto bad = Fabric::Open("ofi:tcp?iface=lo&cq_wait=sometimes");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "cq_wait=sometimes")) << bad.status();
}

// zsock's rxm defaults (docs/ofi.md: memory per connection, connection
// set-up time) apply when nothing set them, and yield to the environment.
// In a child: libfabric reads them once per process, and the test must not
// change the environment of the others.
TEST(OfiOpen, RxmDefaultsApplyUnlessTheEnvironmentSetsThem) {
  auto run = [](const char* preset) -> int {
    pid_t pid = testutil::SpawnChild(
        [preset]() -> int {
          ::unsetenv("FI_OFI_RXM_MSG_RX_SIZE");
          ::unsetenv("FI_OFI_RXM_CM_PROGRESS_INTERVAL");
          if (preset != nullptr) ::setenv("FI_OFI_RXM_CM_PROGRESS_INTERVAL", preset, 1);
          // The defaults come with the configuration, whether or not the
          // provider then opens.
          (void)Fabric::Open("ofi:tcp;ofi_rxm?iface=lo");
          const char* rx = std::getenv("FI_OFI_RXM_MSG_RX_SIZE");
          const char* cm = std::getenv("FI_OFI_RXM_CM_PROGRESS_INTERVAL");
          if (rx == nullptr || std::string(rx) != "128") return 11;
          if (cm == nullptr || std::string(cm) != (preset != nullptr ? preset : "1000")) return 12;
          return 0;
        },
        absl::Seconds(60));
    return testutil::ReapChild(pid, absl::Seconds(60));
  };
  EXPECT_EQ(run(nullptr), 0) << "11: MSG_RX_SIZE, 12: CM_PROGRESS_INTERVAL, <0: the child hung or died";
  EXPECT_EQ(run("5000"), 0) << "the environment's value must win";
}

// Connecting where nobody listens fails at once saying so, on both
// connection paths (conformance checks the errno for every provider).
TEST(OfiConnect, NoListenerIsRefusedAtOnceWithAHint) {
  for (const char* config : {"ofi:tcp?iface=lo", "ofi:tcp;ofi_rxm?iface=lo"}) {
    auto fabric = Fabric::Open(config);
    ASSERT_TRUE(fabric.ok()) << fabric.status();
    auto cq = (*fabric)->CreateCq();
    ASSERT_TRUE(cq.ok());
    std::string address;
    {
      auto listener = (*fabric)->Listen("");
      ASSERT_TRUE(listener.ok()) << listener.status();
      address = (*listener)->address();
    }  // closed: nothing listens there now
    const absl::Time start = absl::Now();
    auto ep = (*fabric)->Connect(address, cq->get(), absl::Seconds(30));
    ASSERT_FALSE(ep.ok()) << config;
    EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << config << ": waited for the timeout";
    EXPECT_TRUE(absl::StrContains(ep.status().message(), "listener")) << config << ": " << ep.status();
  }
}

TEST(OfiFlow, ABadWindowIsRefusedWithTheRange) {
  for (const char* v : {"2", "-1", "many", "2000000"}) {
    auto f = Fabric::Open(absl::StrCat("ofi:tcp;ofi_rxm?flow_window=", v));
    ASSERT_FALSE(f.ok()) << v;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
    EXPECT_TRUE(absl::StrContains(f.status().message(), "flow_window")) << f.status();
    EXPECT_TRUE(absl::StrContains(f.status().message(), "4 to 1000000")) << f.status();
  }
}

}  // namespace
}  // namespace zsock
