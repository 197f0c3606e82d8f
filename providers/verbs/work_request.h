// What the verbs provider turns into work requests, decided without a
// device: zsock Access bits as ibv_access_flags, the checks an initiator
// makes before it posts a one-sided operation, ibv_send_wr fields for one
// operation (BuildSendWr), and a failed work completion as a Status that
// says what it usually means and what to do (WcError).
#ifndef ZSOCK_PROVIDERS_VERBS_WORK_REQUEST_H_
#define ZSOCK_PROVIDERS_VERBS_WORK_REQUEST_H_

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/provider.h"

namespace zsock::verbs {

// ibv_reg_mr access flags for zsock Access bits. Remote write and remote
// atomic imply local write (the verbs rule: IBV_ACCESS_REMOTE_WRITE and
// IBV_ACCESS_REMOTE_ATOMIC require IBV_ACCESS_LOCAL_WRITE).
int AccessToIbv(uint32_t access);

// What an initiator checks before posting a one-sided operation: the
// blob decodes, [remote_addr, remote_addr + len) lies inside the key's range,
// the key grants `need` (kRemoteRead/Write/Atomic), and atomics are on an
// aligned 8-byte word. The target's HCA checks again against the real
// registration (a forged key fails there with REM_ACCESS_ERR).
absl::StatusOr<uint32_t> CheckRemote(const RemoteKey& key, uint64_t remote_addr,
                                     size_t len, uint32_t need, bool atomic);

enum class WrKind { kSend, kRdmaWrite, kRdmaRead, kFetchAdd, kCompareSwap };

struct WorkRequest {
  WrKind kind = WrKind::kSend;
  uint64_t wr_id = 0;
  uint64_t local_addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint64_t compare_add = 0;  // fetch-add: the addend; compare-swap: compare
  uint64_t swap = 0;
  bool signaled = true;
};

// Fills `wr` and `sge` (which `wr` points to) for ibv_post_send. Sends and
// RDMA writes of at most `max_inline` bytes carry IBV_SEND_INLINE (their data
// is copied at post time; lkey unused); reads and atomics never do. Atomics
// need an 8-byte local buffer and an 8-byte aligned remote address.
// `max_len` is the port's max_msg_sz.
absl::Status BuildSendWr(const WorkRequest& in, uint32_t max_inline, uint32_t max_len,
                         ibv_send_wr* wr, ibv_sge* sge);

// A failed work completion as a Status: ibv_wc_status_str, the vendor
// error, the operation, and what the status usually means. Dead-peer
// statuses are Aborted/ECONNRESET, truncation OutOfRange/EMSGSIZE, refused
// remote accesses PermissionDenied/EACCES.
absl::Status WcError(ibv_wc_status status, uint32_t vendor_err, absl::string_view op);

}  // namespace zsock::verbs

#endif  // ZSOCK_PROVIDERS_VERBS_WORK_REQUEST_H_
