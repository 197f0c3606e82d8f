// OfiEndpoint's one-sided operations: RDMA read and write (fi_read,
// fi_writemsg with delivery completion) and 8-byte atomics
// (fi_fetch_atomic, fi_compare_atomic), or core emulation where the
// fabric has no native support.
#include <rdma/fi_atomic.h>
#include <rdma/fi_rma.h>
#include <sys/uio.h>

#include <cerrno>

#include "core/status.h"
#include "providers/ofi/endpoint.h"

namespace zsock::ofi {

absl::Status OfiEndpoint::Read(void* local, size_t len, MemoryRegion* mr, uint64_t remote_addr,
                               const RemoteKey& rkey, uint64_t context) {
  if (!fab_->rma_native()) return Endpoint::Read(local, len, mr, remote_addr, rkey, context);
  return Rma(OpType::kRead, local, len, mr, remote_addr, rkey, context);
}

absl::Status OfiEndpoint::Write(const void* local, size_t len, MemoryRegion* mr,
                                uint64_t remote_addr, const RemoteKey& rkey, uint64_t context) {
  if (!fab_->rma_native()) return Endpoint::Write(local, len, mr, remote_addr, rkey, context);
  return Rma(OpType::kWrite, const_cast<void*>(local), len, mr, remote_addr, rkey, context);
}

absl::Status OfiEndpoint::FetchAdd(uint64_t* result, uint64_t remote_addr, const RemoteKey& rkey,
                                   uint64_t add, uint64_t context) {
  if (!fab_->atomics_native()) return Endpoint::FetchAdd(result, remote_addr, rkey, add, context);
  return Atomic(OpType::kFetchAdd, result, remote_addr, rkey, add, 0, context);
}

absl::Status OfiEndpoint::CompareSwap(uint64_t* result, uint64_t remote_addr, const RemoteKey& rkey,
                                      uint64_t compare, uint64_t swap, uint64_t context) {
  if (!fab_->atomics_native()) {
    return Endpoint::CompareSwap(result, remote_addr, rkey, compare, swap, context);
  }
  return Atomic(OpType::kCompareSwap, result, remote_addr, rkey, compare, swap, context);
}

absl::Status OfiEndpoint::Rma(OpType op, void* local, size_t len, MemoryRegion* mr,
                              uint64_t remote_addr, const RemoteKey& rkey, uint64_t context) {
  uint64_t key = 0, addr = 0;
  {
    DomLock lock(&fab_->dom_mu());
    if (auto st = DecodeRemoteKey(fab_->domain(), &raw_keys_, rkey, remote_addr, len, &key, &addr);
        !st.ok()) {
      return st;
    }
  }
  auto* r = NewRequest(op, context, len);
  return SubmitWithDesc(r, mr, local, len, [=, this](Request* req, void* desc) {
    return op == OpType::kRead ? fi_read(ep_, local, len, desc, peer_, addr, key, &req->fi_ctx)
                               : WriteDelivered(local, len, desc, addr, key, req);
  });
}

// RMA write completing only once the target has accepted it, so a write
// through a bad key reports the target's refusal (as an RC QP would)
// instead of completing locally.
int OfiEndpoint::WriteDelivered(void* local, size_t len, void* desc, uint64_t addr, uint64_t key,
                                Request* req) {
  iovec iov{local, len};
  fi_rma_iov rma{addr, len, key};
  fi_msg_rma msg{};
  msg.msg_iov = &iov;
  msg.desc = &desc;
  msg.iov_count = 1;
  msg.addr = peer_;
  msg.rma_iov = &rma;
  msg.rma_iov_count = 1;
  msg.context = &req->fi_ctx;
  return static_cast<int>(fi_writemsg(ep_, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE));
}

absl::Status OfiEndpoint::Atomic(OpType op, uint64_t* result, uint64_t remote_addr,
                                 const RemoteKey& rkey, uint64_t a, uint64_t b, uint64_t context) {
  if (remote_addr % 8 != 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     "atomic on a remote address that is not 8-byte aligned",
                     "atomics operate on aligned 8-byte words");
  }
  uint64_t key = 0, addr = 0;
  {
    DomLock lock(&fab_->dom_mu());
    if (auto st = DecodeRemoteKey(fab_->domain(), &raw_keys_, rkey, remote_addr, 8, &key, &addr);
        !st.ok()) {
      return st;
    }
  }
  auto* r = NewRequest(op, context, 8);
  r->user_result = result;
  if (op == OpType::kFetchAdd) {
    r->operand[0] = a;
  } else {
    r->operand[0] = b;  // swap value
    r->operand[1] = a;  // compare value
  }
  return Submit(r, [=, this](Request* req) {
    if (op == OpType::kFetchAdd) {
      return static_cast<int>(fi_fetch_atomic(ep_, &req->operand[0], 1, nullptr, &req->result, nullptr,
                                              peer_, addr, key, FI_UINT64, FI_SUM, &req->fi_ctx));
    }
    return static_cast<int>(fi_compare_atomic(ep_, &req->operand[0], 1, nullptr, &req->operand[1],
                                              nullptr, &req->result, nullptr, peer_, addr, key,
                                              FI_UINT64, FI_CSWAP, &req->fi_ctx));
  });
}

}  // namespace zsock::ofi
