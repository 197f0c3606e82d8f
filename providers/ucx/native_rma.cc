// The ucx endpoint's one-sided operations: native UCP RMA and atomics on a
// peer's AllocateRegistered memory (checked against the peer's key table,
// which the handshake mapped), core emulation on everything else.
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "providers/ucx/endpoint.h"
#include "providers/ucx/key_table.h"
#include "providers/ucx/ucs_error.h"
#include "providers/ucx/worker.h"

namespace zsock::ucx {
namespace {

bool IsAtomic(OpType type) { return type == OpType::kFetchAdd || type == OpType::kCompareSwap; }

// The UCX key for the peer's region in `slot` (generation `gen`, packed
// in the peer's slot `e`), unpacked once per generation and cached.
absl::StatusOr<ucp_rkey_h> PeerRkeyLocked(EpCore* c, const BlobKey& key, const KeySlot* e) {
  auto it = c->rkeys.find(key.slot);
  if (it != c->rkeys.end() && it->second.first == key.gen) return it->second.second;
  if (it != c->rkeys.end()) {
    ucp_rkey_destroy(it->second.second);
    c->rkeys.erase(it);
  }
  uint8_t packed[sizeof(e->rkey)];
  std::memcpy(packed, e->rkey, e->rkey_len);  // the target's record, not the key's
  ucp_rkey_h rk = nullptr;
  ucs_status_t st = ucp_ep_rkey_unpack(c->uep, packed, &rk);
  if (st != UCS_OK) return UcsError(st, "UCX could not unpack the peer's key");
  c->rkeys[key.slot] = {key.gen, rk};
  return rk;
}

// The arguments of one native operation.
struct NativeArgs {
  OpType type;
  void* local;
  size_t len;
  uint64_t raddr;
  uint64_t a;  // atomics: addend, or compare value
  uint64_t b;  // compare-and-swap: swap value
  uint64_t* result;
  uint64_t context;
};

// Starts the native operation on the pinned slot `e` with key `rk`; the
// Op unpins it when it settles.
absl::Status StartNativeLocked(EpCore* c, std::shared_ptr<EpCore> keep, const NativeArgs& x,
                               KeySlot* e, ucp_rkey_h rk) {
  auto* op = new Op{Op::Kind::kNative};
  op->core = c;
  op->keep = std::move(keep);
  op->op = x.type;
  op->context = x.context;
  op->length = x.len;
  op->pinned = e;
  op->result = x.result;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = OnSend;
  p.user_data = op;
  if (IsAtomic(x.type)) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER;
    p.datatype = ucp_dt_make_contig(8);
    p.reply_buffer = &op->reply;
    // ADD: buffer = addend. CSWAP: buffer = compare value, reply_buffer =
    // swap value in, old value out (ucp.h's atomic_ops table).
    op->value = x.a;
    if (x.type == OpType::kCompareSwap) op->reply = x.b;
  }
  c->others.insert(op);
  ucs_status_t st = Submit(op, [&]() -> void* {
    switch (x.type) {
      case OpType::kRead: return ucp_get_nbx(c->uep, x.local, x.len, x.raddr, rk, &p);
      case OpType::kWrite: return ucp_put_nbx(c->uep, x.local, x.len, x.raddr, rk, &p);
      case OpType::kFetchAdd:
        return ucp_atomic_op_nbx(c->uep, UCP_ATOMIC_OP_ADD, &op->value, 1, x.raddr, rk, &p);
      default:
        return ucp_atomic_op_nbx(c->uep, UCP_ATOMIC_OP_CSWAP, &op->value, 1, x.raddr, rk, &p);
    }
  });
  if (st != UCS_OK) {
    Unpin(e);
    c->others.erase(op);
    delete op;
    return UcsError(st, absl::StrCat("ucx ", OpTypeName(x.type), " failed"));
  }
  if (op->completed) SettleLocked(op);
  return absl::OkStatus();
}

}  // namespace

absl::Status UcxEndpoint::Native(OpType type, void* local, size_t len, uint64_t raddr,
                                 const RemoteKey& rkey, uint64_t a, uint64_t b,
                                 uint64_t* result, uint64_t context, bool* handled) {
  BlobKey key;
  if (!DecodeBlob(rkey, &key) || (key.flags & kSlotNative) == 0) return absl::OkStatus();
  EpCore* c = core_.get();
  Worker* w = c->worker;
  WorkerLock lock(&w->mu);
  if (!c->native) return absl::OkStatus();
  *handled = true;
  if (c->closed) return ClosedError();
  if (c->dead) return c->dead_status;
  if (IsAtomic(type) && raddr % 8 != 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("atomic on remote address 0x", absl::Hex(raddr),
                                  " which is not 8-byte aligned"),
                     "atomics operate on aligned 8-byte words");
  }
  KeySlot* e = nullptr;
  if (auto st = PinKey(c->peer_table, c->peer_slots, key, raddr, len, AccessFor(type), &e);
      !st.ok()) {
    return st;
  }
  if ((e->flags & kSlotNative) == 0 || e->rkey_len == 0 || e->rkey_len > sizeof(e->rkey)) {
    Unpin(e);
    *handled = false;  // emulate: the peer could not publish a UCX key for it
    return absl::OkStatus();
  }
  auto rk = PeerRkeyLocked(c, key, e);
  if (!rk.ok()) {
    Unpin(e);
    return rk.status();
  }
  return StartNativeLocked(c, core_, {type, local, len, raddr, a, b, result, context}, e, *rk);
}

absl::Status UcxEndpoint::Read(void* local, size_t len, MemoryRegion* mr, uint64_t remote_addr,
                               const RemoteKey& rkey, uint64_t context) {
  bool handled = false;
  absl::Status st = Native(OpType::kRead, local, len, remote_addr, rkey, 0, 0, nullptr, context,
                           &handled);
  if (handled) return st;
  return Endpoint::Read(local, len, mr, remote_addr, rkey, context);
}

absl::Status UcxEndpoint::Write(const void* local, size_t len, MemoryRegion* mr,
                                uint64_t remote_addr, const RemoteKey& rkey, uint64_t context) {
  bool handled = false;
  absl::Status st = Native(OpType::kWrite, const_cast<void*>(local), len, remote_addr, rkey, 0,
                           0, nullptr, context, &handled);
  if (handled) return st;
  return Endpoint::Write(local, len, mr, remote_addr, rkey, context);
}

absl::Status UcxEndpoint::FetchAdd(uint64_t* result, uint64_t remote_addr, const RemoteKey& rkey,
                                   uint64_t add, uint64_t context) {
  bool handled = false;
  absl::Status st = Native(OpType::kFetchAdd, nullptr, 8, remote_addr, rkey, add, 0, result,
                           context, &handled);
  if (handled) return st;
  return Endpoint::FetchAdd(result, remote_addr, rkey, add, context);
}

absl::Status UcxEndpoint::CompareSwap(uint64_t* result, uint64_t remote_addr,
                                      const RemoteKey& rkey, uint64_t compare, uint64_t swap,
                                      uint64_t context) {
  bool handled = false;
  absl::Status st = Native(OpType::kCompareSwap, nullptr, 8, remote_addr, rkey, compare, swap,
                           result, context, &handled);
  if (handled) return st;
  return Endpoint::CompareSwap(result, remote_addr, rkey, compare, swap, context);
}

}  // namespace zsock::ucx
