// What the verbs provider turns into work requests (work_request.h): access
// flags, the initiator's checks of a remote key, ibv_send_wr fields, and
// completion errors.
#include "providers/verbs/work_request.h"

#include <cerrno>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "core/provider.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "providers/verbs/wire.h"

namespace zsock::verbs {
namespace {

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

// ------------------------------------------------------------ remote checks

RemoteKey Key(uint64_t addr, uint64_t len, uint32_t access) {
  RemoteKey k;
  k.addr = addr;
  k.length = len;
  k.access = access;
  k.blob = EncodeKeyBlob({0x1234, {5, 7}});
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

}  // namespace
}  // namespace zsock::verbs
