// Access flags, remote checks, work requests and completion errors (see
// work_request.h).
#include "providers/verbs/work_request.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "providers/verbs/wire.h"

namespace zsock::verbs {
namespace {

ibv_wr_opcode Opcode(WrKind kind) {
  switch (kind) {
    case WrKind::kSend: return IBV_WR_SEND;
    case WrKind::kRdmaWrite: return IBV_WR_RDMA_WRITE;
    case WrKind::kRdmaRead: return IBV_WR_RDMA_READ;
    case WrKind::kFetchAdd: return IBV_WR_ATOMIC_FETCH_AND_ADD;
    case WrKind::kCompareSwap: return IBV_WR_ATOMIC_CMP_AND_SWP;
  }
  return IBV_WR_SEND;
}

// What a failed work completion status usually means, and what to do.
struct WcMeaning {
  ibv_wc_status status;
  absl::StatusCode code;
  int err;
  const char* means;
  const char* fix;
};

constexpr WcMeaning kWcMeanings[] = {
    {IBV_WC_LOC_LEN_ERR, absl::StatusCode::kOutOfRange, EMSGSIZE,
     "a message was longer than the receive buffer it landed in",
     "post receives as large as the largest message"},
    {IBV_WC_LOC_QP_OP_ERR, absl::StatusCode::kInternal, EINVAL,
     "the work request was inconsistent with the QP (bad opcode, too many SGEs, "
     "inline data above max_inline_data)",
     "this is a zsock bug: report it with the log"},
    {IBV_WC_LOC_PROT_ERR, absl::StatusCode::kPermissionDenied, EFAULT,
     "a local buffer was not covered by the registration (lkey) it named, or the "
     "registration was released while the operation was in flight",
     "keep buffers registered (and mapped) until their operation completes"},
    {IBV_WC_WR_FLUSH_ERR, absl::StatusCode::kAborted, ECONNRESET,
     "the queue pair had already failed or was closed, so this request was flushed",
     "an earlier completion on this connection carries the real error; reconnect"},
    {IBV_WC_MW_BIND_ERR, absl::StatusCode::kInternal, EINVAL, "a memory window bind failed",
     "zsock binds no memory windows: report it"},
    {IBV_WC_BAD_RESP_ERR, absl::StatusCode::kAborted, EPROTO,
     "the responder sent an unexpected transport response",
     "check firmware versions on both sides"},
    {IBV_WC_LOC_ACCESS_ERR, absl::StatusCode::kPermissionDenied, EFAULT,
     "a local buffer lacked the access it needs (a read or atomic result needs "
     "LOCAL_WRITE)",
     "register local buffers with kLocalWrite"},
    {IBV_WC_REM_INV_REQ_ERR, absl::StatusCode::kInvalidArgument, EREMOTEIO,
     "the peer found the request invalid: a message longer than its receive buffer, "
     "an operation its QP does not allow, or a misaligned atomic",
     "check sizes against the peer's receive buffers and the remote QP's access"},
    {IBV_WC_REM_ACCESS_ERR, absl::StatusCode::kPermissionDenied, EACCES,
     "the target refused the access: the rkey is wrong or revoked, the range is "
     "outside its registration, or the registration lacks the access flags",
     "use a live key from the peer and stay inside its range and rights"},
    {IBV_WC_REM_OP_ERR, absl::StatusCode::kAborted, EREMOTEIO,
     "the peer could not complete the operation (its receive queue or memory failed)",
     "check the peer's log"},
    {IBV_WC_RETRY_EXC_ERR, absl::StatusCode::kAborted, ECONNRESET,
     "the transport retry count was exceeded: the peer is dead or unreachable "
     "(process killed, host down, link or switch lost)",
     "check the peer and the fabric (`ibstat`, `rdma link`), then reconnect"},
    {IBV_WC_RNR_RETRY_EXC_ERR, absl::StatusCode::kAborted, ENOBUFS,
     "receiver not ready: the peer had no receive buffer posted and the RNR retries "
     "ran out",
     "keep rnr_retry=7 (retry forever) or post receives sooner"},
    {IBV_WC_REM_ABORT_ERR, absl::StatusCode::kAborted, ECONNRESET,
     "the peer aborted the operation", "check the peer's log"},
    {IBV_WC_RESP_TIMEOUT_ERR, absl::StatusCode::kAborted, ETIMEDOUT,
     "the responder did not answer in time", "check the peer and the fabric"},
    {IBV_WC_FATAL_ERR, absl::StatusCode::kInternal, EIO, "the device hit a fatal error",
     "check `dmesg`; the HCA may need a reset"},
};

constexpr WcMeaning kWcOther = {IBV_WC_GENERAL_ERR, absl::StatusCode::kAborted, EIO,
                                "the device reported an error",
                                "check `dmesg` and the vendor error code"};

const WcMeaning& MeaningOf(ibv_wc_status status) {
  for (const WcMeaning& m : kWcMeanings) {
    if (m.status == status) return m;
  }
  return kWcOther;
}

}  // namespace

// ------------------------------------------------------------ access

int AccessToIbv(uint32_t access) {
  int f = 0;
  // Every region may be a local buffer for sends (always allowed) and for
  // receives / read targets / atomic results (LOCAL_WRITE).
  if (access & (kLocalWrite | kRemoteWrite | kRemoteAtomic)) f |= IBV_ACCESS_LOCAL_WRITE;
  if (access & kRemoteRead) f |= IBV_ACCESS_REMOTE_READ;
  if (access & kRemoteWrite) f |= IBV_ACCESS_REMOTE_WRITE;
  if (access & kRemoteAtomic) f |= IBV_ACCESS_REMOTE_ATOMIC;
  return f;
}

// ------------------------------------------------------------ remote keys

absl::StatusOr<uint32_t> CheckRemote(const RemoteKey& key, uint64_t remote_addr, size_t len,
                                     uint32_t need, bool atomic) {
  auto rkey = DecodeKeyBlob(key.blob);
  if (!rkey.ok()) return rkey.status();
  if (atomic && remote_addr % 8 != 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("atomic on remote address 0x", absl::Hex(remote_addr),
                                  ", which is not 8-byte aligned"),
                     "verbs atomics operate on naturally aligned 8-byte words");
  }
  if (remote_addr < key.addr || len > key.length || remote_addr - key.addr > key.length - len) {
    return MakeError(absl::StatusCode::kOutOfRange, EFAULT,
                     absl::StrCat("remote range [0x", absl::Hex(remote_addr), ", +", len,
                                  ") is outside the key's region [0x", absl::Hex(key.addr), ", +",
                                  key.length, ")"),
                     "access only inside the registered region the key names");
  }
  if ((key.access & need) != need) {
    return MakeError(absl::StatusCode::kPermissionDenied, EACCES,
                     absl::StrCat("the remote key does not grant ",
                                  need == kRemoteRead ? "remote read" : need == kRemoteWrite ? "remote write" : "remote atomics"),
                     "register the target memory with that access");
  }
  return rkey->rkey;
}

// ------------------------------------------------------------ work requests

absl::Status BuildSendWr(const WorkRequest& in, uint32_t max_inline, uint32_t max_len,
                         ibv_send_wr* wr, ibv_sge* sge) {
  std::memset(wr, 0, sizeof(*wr));
  std::memset(sge, 0, sizeof(*sge));
  wr->wr_id = in.wr_id;
  wr->next = nullptr;
  wr->send_flags = in.signaled ? IBV_SEND_SIGNALED : 0;
  sge->addr = in.local_addr;
  sge->length = in.length;
  sge->lkey = in.lkey;
  wr->sg_list = sge;
  wr->num_sge = 1;
  const bool atomic = in.kind == WrKind::kFetchAdd || in.kind == WrKind::kCompareSwap;
  if (atomic) {
    if (in.length != 8) {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       absl::StrCat("atomic with a ", in.length, "-byte local buffer"),
                       "verbs atomics return exactly 8 bytes");
    }
    if (in.remote_addr % 8 != 0) {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       absl::StrCat("atomic on remote address 0x", absl::Hex(in.remote_addr),
                                    ", which is not 8-byte aligned"),
                       "verbs atomics operate on naturally aligned 8-byte words");
    }
  } else if (in.length > max_len) {
    return MakeError(absl::StatusCode::kInvalidArgument, EMSGSIZE,
                     absl::StrCat("work request of ", in.length, " bytes exceeds the port's max_msg_sz ",
                                  max_len),
                     "split the transfer");
  }
  if (in.length == 0) {
    // A zero-length SGE list: some HCAs reject length-0 SGEs.
    wr->num_sge = 0;
    wr->sg_list = nullptr;
  }
  wr->opcode = Opcode(in.kind);
  if (in.kind == WrKind::kRdmaWrite || in.kind == WrKind::kRdmaRead) {
    wr->wr.rdma.remote_addr = in.remote_addr;
    wr->wr.rdma.rkey = in.rkey;
  } else if (atomic) {
    wr->wr.atomic.remote_addr = in.remote_addr;
    wr->wr.atomic.rkey = in.rkey;
    wr->wr.atomic.compare_add = in.compare_add;
    wr->wr.atomic.swap = in.kind == WrKind::kCompareSwap ? in.swap : 0;
  }
  if ((in.kind == WrKind::kSend || in.kind == WrKind::kRdmaWrite) && in.length > 0 &&
      in.length <= max_inline) {
    wr->send_flags |= IBV_SEND_INLINE;
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------ completions

absl::Status WcError(ibv_wc_status status, uint32_t vendor_err, absl::string_view op) {
  if (status == IBV_WC_SUCCESS) return absl::OkStatus();
  const WcMeaning& m = MeaningOf(status);
  return MakeError(m.code, m.err,
                   absl::StrCat("verbs ", op, " failed: ", ibv_wc_status_str(status), " (status ",
                                static_cast<int>(status), ", vendor error 0x", absl::Hex(vendor_err),
                                "): ", m.means),
                   m.fix);
}

}  // namespace zsock::verbs
