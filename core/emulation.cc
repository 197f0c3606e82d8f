#include "core/emulation.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/base/dynamic_annotations.h"
#include "absl/strings/str_cat.h"
#include "core/copy.h"
#include "core/log.h"
#include "core/mutex.h"
#include "core/status.h"

namespace zsock {
namespace {

// Control message, version 1, little-endian (docs/provider-interface.md):
//   u8 kind | u8 op | u16 key_len | u32 err | u64 id | u64 addr | u64 len
//   | u64 a | u64 b | key bytes | payload
// kind 1 = request, 2 = response. Responses carry err (an errno, 0 = ok);
// a failed response's payload is the error text.
constexpr uint8_t kRequest = 1;
constexpr uint8_t kResponse = 2;
constexpr size_t kHeader = 48;

struct Header {
  uint8_t kind;
  uint8_t op;
  uint16_t key_len;
  uint32_t err;
  uint64_t id;
  uint64_t addr;
  uint64_t len;
  uint64_t a;
  uint64_t b;
};
static_assert(sizeof(Header) == kHeader);

std::vector<uint8_t> Build(const Header& h, absl::string_view key,
                           std::span<const uint8_t> payload) {
  std::vector<uint8_t> out(kHeader + key.size() + payload.size());
  std::memcpy(out.data(), &h, kHeader);
  if (!key.empty()) std::memcpy(out.data() + kHeader, key.data(), key.size());
  if (!payload.empty()) {
    std::memcpy(out.data() + kHeader + key.size(), payload.data(), payload.size());
  }
  return out;
}

// Around the copy Serve makes of the application's memory for the peer
// (an emulated RDMA read or write): ThreadSanitizer ignores its accesses.
// What orders them against the application's own is the SDP protocol, and
// it runs through the peer process, which TSan does not model: the
// application's writes precede its send, whose advert (SrcAvail,
// SinkAvail) precedes the peer's request; the application touches the
// buffer again only after the completion that our answer leads to, or,
// under AZ-SDP, once its write to the protected page has faulted and
// waited for the pull (TSan checks a write before it faults, so no
// annotation on that side could order it). A native RDMA or cross-memory
// access of the same memory is invisible to TSan; this copy is made
// invisible too, so both paths are checked alike. Only these accesses:
// the emulation's own state stays checked.
void PeerAccessBegin() { ABSL_ANNOTATE_IGNORE_READS_AND_WRITES_BEGIN(); }
void PeerAccessEnd() { ABSL_ANNOTATE_IGNORE_READS_AND_WRITES_END(); }

// Performs `op` on `len` bytes of our registered memory at `target` for
// the peer: a read fills `data`, a write copies `payload` there, an atomic
// (operands a, b) leaves the word's old value in `*old`.
void AccessForPeer(OpType op, void* target, size_t len, std::span<const uint8_t> payload,
                   uint64_t a, uint64_t b, std::vector<uint8_t>* data, uint64_t* old) {
  if (op == OpType::kRead) {
    PeerAccessBegin();
    data->assign(static_cast<uint8_t*>(target), static_cast<uint8_t*>(target) + len);
    PeerAccessEnd();
    return;
  }
  if (op == OpType::kWrite) {
    PeerAccessBegin();
    if (len > 0) CopyBytes(target, payload.data(), len);
    PeerAccessEnd();
    return;
  }
  auto* word = static_cast<uint64_t*>(target);
  if (op == OpType::kFetchAdd) {
    *old = __atomic_fetch_add(word, a, __ATOMIC_SEQ_CST);
  } else {
    *old = a;
    __atomic_compare_exchange_n(word, old, b, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  }
}

uint32_t AccessFor(OpType op) {
  switch (op) {
    case OpType::kRead: return kRemoteRead;
    case OpType::kWrite: return kRemoteWrite;
    default: return kRemoteAtomic;
  }
}

}  // namespace

absl::Status Emulation::Read(void* local, size_t len, uint64_t remote_addr,
                             const RemoteKey& rkey, uint64_t context) {
  return Start(OpType::kRead, local, len, remote_addr, rkey, 0, 0, {}, context);
}

absl::Status Emulation::Write(const void* local, size_t len, uint64_t remote_addr,
                              const RemoteKey& rkey, uint64_t context) {
  return Start(OpType::kWrite, nullptr, len, remote_addr, rkey, 0, 0,
               {static_cast<const uint8_t*>(local), len}, context);
}

absl::Status Emulation::Atomic(OpType op, uint64_t* result, uint64_t remote_addr,
                               const RemoteKey& rkey, uint64_t a, uint64_t b,
                               uint64_t context) {
  if (remote_addr % 8 != 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("atomic on remote address 0x", absl::Hex(remote_addr),
                                  " which is not 8-byte aligned"),
                     "atomics operate on aligned 8-byte words");
  }
  return Start(op, result, 8, remote_addr, rkey, a, b, {}, context);
}

absl::Status Emulation::Start(OpType op, void* local, size_t len,
                              uint64_t remote_addr, const RemoteKey& rkey,
                              uint64_t a, uint64_t b,
                              std::span<const uint8_t> payload, uint64_t context) {
  // The initiator checks what it can locally; the target checks again (it
  // must not trust this side) against its live registrations.
  if (remote_addr < rkey.addr || len > rkey.length ||
      remote_addr - rkey.addr > rkey.length - len) {
    return MakeError(absl::StatusCode::kOutOfRange, EFAULT,
                     absl::StrCat("remote range [0x", absl::Hex(remote_addr), ", +", len,
                                  ") is outside the remote key's [0x", absl::Hex(rkey.addr),
                                  ", +", rkey.length, ")"),
                     "access only inside the registered region the key names");
  }
  // The request and its answer each travel as one control message: the
  // data plus headers must fit the provider's largest message, and the
  // provider's max_rma_size says how much that is where its control
  // messages are smaller (ofi: 64 KiB buffers). Past it the target could
  // not send its answer, and the operation would never complete.
  const Capabilities& caps = ep_->fabric()->caps();
  const size_t limit = caps.max_msg_size;
  if (len > limit - std::min(limit, kEmulationHeadroom) ||
      (caps.max_rma_size > 0 && len > caps.max_rma_size)) {
    return MakeError(absl::StatusCode::kInvalidArgument, EMSGSIZE,
                     absl::StrCat("emulated ", OpTypeName(op), " of ", len,
                                  " bytes exceeds what one control message carries (max_rma_size ",
                                  caps.max_rma_size, ")"),
                     "split the transfer into pieces of at most caps().max_rma_size bytes");
  }
  uint64_t id;
  {
    MutexLock lock(&mu_);
    id = next_id_++;
    pending_[id] = Pending{op, local, len, context};
  }
  std::string key = rkey.Serialize();
  Header h{kRequest, static_cast<uint8_t>(op), static_cast<uint16_t>(key.size()), 0,
           id, remote_addr, len, a, b};
  absl::Status st = ep_->SendControl(Build(h, key, payload));
  if (!st.ok()) {
    MutexLock lock(&mu_);
    // FailAll may have taken (and reported) it meanwhile: then the caller
    // gets that completion and must not also get this error.
    if (pending_.erase(id) == 0) return absl::OkStatus();
  }
  return st;
}

void Emulation::Deliver(std::span<const uint8_t> msg) {
  if (msg.size() < kHeader) {
    ZS_LOG(kWarn, "dropping a %zu-byte control message: shorter than its header",
           msg.size());
    return;
  }
  if (msg[0] == kRequest) {
    Serve(msg);
  } else if (msg[0] == kResponse) {
    Finish(msg);
  } else {
    ZS_LOG(kWarn, "dropping a control message of unknown kind %d", msg[0]);
  }
}

void Emulation::Serve(std::span<const uint8_t> msg) {
  Header h;
  std::memcpy(&h, msg.data(), kHeader);
  Header resp{kResponse, h.op, 0, 0, h.id, h.addr, 0, 0, 0};
  std::vector<uint8_t> data;
  absl::Status st;
  OpType op = static_cast<OpType>(h.op);
  if (h.op > static_cast<uint8_t>(OpType::kCompareSwap) || op == OpType::kSend ||
      op == OpType::kRecv || msg.size() < kHeader + h.key_len) {
    st = MakeError(absl::StatusCode::kInvalidArgument, EPROTO,
                   "malformed emulation request", "peers must run the same zsock version");
  } else {
    auto key = RemoteKey::Parse(absl::string_view(
        reinterpret_cast<const char*>(msg.data() + kHeader), h.key_len));
    std::span<const uint8_t> payload = msg.subspan(kHeader + h.key_len);
    if (!key.ok()) {
      st = key.status();
    } else if (op == OpType::kWrite && payload.size() != h.len) {
      st = MakeError(absl::StatusCode::kInvalidArgument, EPROTO,
                     "emulated write carries a payload of the wrong length",
                     "peers must run the same zsock version");
    } else {
      size_t len = (op == OpType::kRead || op == OpType::kWrite) ? h.len : 8;
      if (op != OpType::kRead && op != OpType::kWrite && h.addr % 8 != 0) {
        st = MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       "atomic on a remote address that is not 8-byte aligned",
                       "atomics operate on aligned 8-byte words");
      } else {
        st = ep_->fabric()->AccessLocal(*key, h.addr, len, AccessFor(op), [&](void* target) {
          AccessForPeer(op, target, len, payload, h.a, h.b, &data, &resp.a);
        });
      }
    }
  }
  if (!st.ok()) {
    resp.err = static_cast<uint32_t>(StatusErrno(st));
    std::string text(st.message());
    data.assign(text.begin(), text.end());
  }
  resp.len = data.size();
  absl::Status sent = ep_->SendControl(Build(resp, {}, data));
  if (!sent.ok() && resp.err == 0 && op == OpType::kRead && StatusErrno(sent) == EMSGSIZE) {
    // The answer was too large for one control message (a read past this
    // provider's max_rma_size, from a peer that did not check it): the
    // initiator waits for it, so it gets the error instead of nothing. Only
    // for reads: a write or atomic that failed to answer for another reason
    // has already happened, and must not be reported as refused.
    ZS_LOG(kWarn, "could not answer an emulated %s of %llu bytes: %s; refusing it instead",
           OpTypeName(op), static_cast<unsigned long long>(h.len), sent.ToString());
    resp.err = EMSGSIZE;
    std::string text = absl::StrCat("the target could not send the answer: ", sent.message());
    data.assign(text.begin(), text.end());
    resp.len = data.size();
    sent = ep_->SendControl(Build(resp, {}, data));
  }
  if (!sent.ok()) {
    // The peer is gone (its end fails the operation) or the channel is.
    ZS_LOG(kDebug, "could not answer an emulated %s: %s", OpTypeName(op), sent.ToString());
  }
}

void Emulation::Finish(std::span<const uint8_t> msg) {
  Header h;
  std::memcpy(&h, msg.data(), kHeader);
  Pending p;
  {
    MutexLock lock(&mu_);
    auto it = pending_.find(h.id);
    if (it == pending_.end()) {
      ZS_LOG(kWarn, "dropping a response to unknown emulated operation %llu",
             static_cast<unsigned long long>(h.id));
      return;
    }
    p = it->second;
    pending_.erase(it);
  }
  std::span<const uint8_t> payload = msg.subspan(kHeader);
  Completion c;
  c.context = p.context;
  c.op = p.op;
  c.endpoint = ep_;
  if (h.err != 0) {
    std::string text(payload.begin(), payload.end());
    c.status = ErrnoError(static_cast<int>(h.err), absl::StrCat("remote target refused: ", text));
  } else if (p.op == OpType::kRead) {
    if (payload.size() != p.len) {
      c.status = MakeError(absl::StatusCode::kInternal, EPROTO,
                           "emulated read returned the wrong number of bytes",
                           "peers must run the same zsock version");
    } else {
      if (p.len > 0) CopyBytes(p.local, payload.data(), p.len);
      c.length = p.len;
    }
  } else if (p.op == OpType::kWrite) {
    c.length = p.len;
  } else {
    if (p.local != nullptr) *static_cast<uint64_t*>(p.local) = h.a;
    c.length = 8;
  }
  ep_->cq()->Push(std::move(c));
}

void Emulation::FailAll(const absl::Status& why) {
  absl::flat_hash_map<uint64_t, Pending> failed;
  {
    MutexLock lock(&mu_);
    failed.swap(pending_);
  }
  for (auto& [id, p] : failed) {
    Completion c;
    c.context = p.context;
    c.op = p.op;
    c.endpoint = ep_;
    c.status = why;
    ep_->cq()->Push(std::move(c));
  }
}

}  // namespace zsock
