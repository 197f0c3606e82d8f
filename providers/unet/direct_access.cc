// unet's one-sided operations (endpoint.h). In order of preference:
//   - memory the peer allocated with AllocateRegistered lies in a shared
//     segment it announced on the connection socket: RDMA read/write copy
//     through our own mapping of it, atomics are CPU atomics on it;
//   - otherwise RDMA read/write go straight to the peer's memory with
//     process_vm_readv/writev (cross-memory attach, when the handshake's
//     probe found it allowed);
//   - otherwise the Endpoint base class emulates them through the rings,
//     and the target's progress engine executes them.
// Every direct access first pins the key in the peer's key table
// (core/keyslot.h), which holds off a revocation until it is done.
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/copy.h"
#include "core/keyslot.h"
#include "core/log.h"
#include "providers/unet/endpoint.h"
#include "providers/unet/regions.h"

namespace zsock::unet {
namespace {

// Validates (addr, len, access) against an entry of the peer's key table
// (core/keyslot.h). On success the caller is counted in entry->active and
// must UnpinKeySlot.
absl::Status PinKey(KeySlot* table, uint32_t slots, const RemoteKey& key, uint64_t addr,
                    size_t len, uint32_t access, KeySlot** pinned) {
  LocalKeyTable::Key k;
  if (!DecodeKey(key, &k) || k.slot >= slots || (k.gen & 1) == 0) {
    return RemoteKeyError("the key is malformed", addr, len);
  }
  if (absl::Status st = PinKeySlot(&table[k.slot], k.gen, addr, len, access); !st.ok()) return st;
  *pinned = &table[k.slot];
  return absl::OkStatus();
}

}  // namespace

absl::Status UnetEndpoint::Read(void* local, size_t len, MemoryRegion* mr, uint64_t remote_addr,
                                const RemoteKey& rkey, uint64_t context) {
  bool handled = false;
  absl::Status st = MappedAccess(OpType::kRead, local, len, remote_addr, rkey, context, &handled);
  if (handled) return st;
  if (!p_.cma) return Endpoint::Read(local, len, mr, remote_addr, rkey, context);
  return DirectAccess(OpType::kRead, local, len, remote_addr, rkey, context);
}

absl::Status UnetEndpoint::Write(const void* local, size_t len, MemoryRegion* mr,
                                 uint64_t remote_addr, const RemoteKey& rkey, uint64_t context) {
  bool handled = false;
  absl::Status st = MappedAccess(OpType::kWrite, const_cast<void*>(local), len, remote_addr,
                                 rkey, context, &handled);
  if (handled) return st;
  if (!p_.cma) return Endpoint::Write(local, len, mr, remote_addr, rkey, context);
  return DirectAccess(OpType::kWrite, const_cast<void*>(local), len, remote_addr, rkey, context);
}

absl::Status UnetEndpoint::FetchAdd(uint64_t* result, uint64_t remote_addr, const RemoteKey& rkey,
                                    uint64_t add, uint64_t context) {
  bool handled = false;
  absl::Status st = DirectAtomic(OpType::kFetchAdd, result, remote_addr, rkey, add, 0,
                                 context, &handled);
  if (handled) return st;
  return Endpoint::FetchAdd(result, remote_addr, rkey, add, context);
}

absl::Status UnetEndpoint::CompareSwap(uint64_t* result, uint64_t remote_addr,
                                       const RemoteKey& rkey, uint64_t compare, uint64_t swap,
                                       uint64_t context) {
  bool handled = false;
  absl::Status st = DirectAtomic(OpType::kCompareSwap, result, remote_addr, rkey, compare,
                                 swap, context, &handled);
  if (handled) return st;
  return Endpoint::CompareSwap(result, remote_addr, rkey, compare, swap, context);
}

// Reports a one-sided operation that finished at the call.
inline absl::Status UnetEndpoint::PushDone(uint64_t context, OpType op, size_t len) {
  Completion c;
  c.context = context;
  c.op = op;
  c.length = len;
  c.endpoint = this;
  cq_->Push(std::move(c));
  return absl::OkStatus();
}

// Reads what the peer sent on the connection socket (shared-segment
// announcements). Returns false once the socket reports the peer gone.
bool UnetEndpoint::ServiceSocketLocked() {
  for (;;) {
    ShmAnnounce a{};
    Fd fd;
    size_t nfds = 0;
    pid_t pid = 0;
    bool complete = false;
    ssize_t n = RecvWithFds(p_.sock.get(), &a, sizeof(a), {&fd, 1}, &nfds, &pid, &complete,
                            MSG_DONTWAIT);
    if (n == 0) return false;
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
    // Segments are whole pages, never re-announced (a replaced mapping could
    // be in use by DirectAtomic), and come from the peer itself.
    if (n != sizeof(a) || !complete || pid != p_.peer_pid || a.type != kShmAnnounce ||
        !fd || a.size < 4096 || a.size % 4096 != 0 || peer_shm_.contains(a.id) ||
        a.size > (uint64_t{1} << 40) || peer_shm_.size() >= kMaxPeerSegments ||
        !CheckPeerMemfd(fd.get(), a.size, "shared segment").ok()) {
      ZS_LOG(kWarn, "ignoring a malformed message on the unet socket of peer pid %d",
             p_.peer_pid);
      continue;
    }
    auto map = MapFd(fd.get(), a.size, "a peer's shared segment");
    if (!map.ok()) continue;  // atomics on it stay emulated
    peer_shm_[a.id] = PeerShm{std::move(*map), a.base, a.size};
  }
}

// Where [remote_addr, remote_addr + len) of the peer lies in our mapping
// of its shared segment shm_id (0: not in a shared segment), or nullptr.
uint8_t* UnetEndpoint::PeerShmLocked(uint32_t shm_id, uint64_t remote_addr, uint64_t len) {
  if (shm_id == 0) return nullptr;
  auto it = peer_shm_.find(shm_id);
  if (it == peer_shm_.end()) {
    ServiceSocketLocked();  // the announcement may still be on the socket
    it = peer_shm_.find(shm_id);
  }
  if (it == peer_shm_.end() || remote_addr < it->second.base || len > it->second.size ||
      remote_addr - it->second.base > it->second.size - len) {
    return nullptr;
  }
  return it->second.map.get() + (remote_addr - it->second.base);
}

// Performs an atomic with CPU instructions when the target word lies in a
// shared segment we hold; sets *handled = false to fall back to emulation.
inline absl::Status UnetEndpoint::DirectAtomic(OpType op, uint64_t* result, uint64_t remote_addr,
                                               const RemoteKey& rkey, uint64_t a, uint64_t b,
                                               uint64_t context, bool* handled) {
  *handled = false;
  if (remote_addr % 8 != 0) return absl::OkStatus();  // emulation reports it
  KeySlot* e;
  if (!PinKey(reinterpret_cast<KeySlot*>(p_.peer_keys.get()), p_.peer_key_slots, rkey,
              remote_addr, 8, kRemoteAtomic, &e)
           .ok()) {
    return absl::OkStatus();  // let emulation report the refusal from the target
  }
  uint64_t* word = nullptr;
  {
    MutexLock lock(&mu_);
    if (closed_ || dead_) {
      UnpinKeySlot(e);
      *handled = true;
      return closed_ ? ClosedError() : dead_status_;
    }
    word = reinterpret_cast<uint64_t*>(PeerShmLocked(e->shm_id, remote_addr, 8));
  }
  if (word == nullptr) {
    UnpinKeySlot(e);
    return absl::OkStatus();
  }
  uint64_t old;
  if (op == OpType::kFetchAdd) {
    old = __atomic_fetch_add(word, a, __ATOMIC_SEQ_CST);
  } else {
    old = a;
    __atomic_compare_exchange_n(word, &old, b, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  }
  UnpinKeySlot(e);
  if (result != nullptr) *result = old;
  *handled = true;
  return PushDone(context, op, 8);
}

// RDMA read or write of memory the peer allocated with
// AllocateRegistered: a copy through our own mapping of its segment,
// after the key-table check (rma_allocated = native). Neither the kernel
// nor the target takes part, and nothing is copied twice: this is what
// makes SDP's pulled bcopy (docs/protocol.md) one copy on each side. Sets
// *handled = false for other memory, or a refused key (the caller's path
// reports the refusal).
absl::Status UnetEndpoint::MappedAccess(OpType op, void* local, size_t len, uint64_t remote_addr,
                                        const RemoteKey& rkey, uint64_t context, bool* handled) {
  *handled = false;
  KeySlot* e;
  const uint32_t access = op == OpType::kRead ? kRemoteRead : kRemoteWrite;
  if (len == 0 || !PinKey(reinterpret_cast<KeySlot*>(p_.peer_keys.get()), p_.peer_key_slots,
                          rkey, remote_addr, len, access, &e)
                       .ok()) {
    return absl::OkStatus();
  }
  uint8_t* remote = nullptr;
  {
    MutexLock lock(&mu_);
    if (closed_ || dead_) {
      UnpinKeySlot(e);
      *handled = true;
      return closed_ ? ClosedError() : dead_status_;
    }
    remote = PeerShmLocked(e->shm_id, remote_addr, len);
  }
  if (remote == nullptr) {
    UnpinKeySlot(e);
    return absl::OkStatus();
  }
  // The pin (the slot's `active` count) holds off a revocation, so the
  // peer does not reuse the memory while we copy.
  if (op == OpType::kRead) {
    CopyBytes(local, remote, len);
  } else {
    CopyBytes(remote, local, len);
  }
  UnpinKeySlot(e);
  *handled = true;
  return PushDone(context, op, len);
}

// RDMA read or write with process_vm_readv/writev, after the key check in
// the peer's table.
absl::Status UnetEndpoint::DirectAccess(OpType op, void* local, size_t len, uint64_t remote_addr,
                                        const RemoteKey& rkey, uint64_t context) {
  {
    MutexLock lock(&mu_);
    if (closed_) return ClosedError();
    if (dead_) return dead_status_;
  }
  KeySlot* e;
  uint32_t access = op == OpType::kRead ? kRemoteRead : kRemoteWrite;
  if (auto st = PinKey(reinterpret_cast<KeySlot*>(p_.peer_keys.get()), p_.peer_key_slots, rkey,
                       remote_addr, len, access, &e);
      !st.ok()) {
    return st;
  }
  absl::Status st;
  // The pidfd guards against a recycled pid: never touch a process that
  // is not our peer.
  if (PeerGone()) {
    st = MakeError(absl::StatusCode::kAborted, ECONNRESET,
                   absl::StrCat("unet peer pid ", p_.peer_pid, " has exited"),
                   "reconnect to a live peer");
  }
  size_t done = 0;
  while (st.ok() && done < len) {
    iovec liov{static_cast<uint8_t*>(local) + done, len - done};
    iovec riov{reinterpret_cast<void*>(remote_addr + done), len - done};
    ssize_t n = op == OpType::kRead ? ::process_vm_readv(p_.peer_pid, &liov, 1, &riov, 1, 0)
                                    : ::process_vm_writev(p_.peer_pid, &liov, 1, &riov, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : EFAULT;
      st = ErrnoError(err, absl::StrCat(op == OpType::kRead ? "process_vm_readv" : "process_vm_writev",
                                        " on peer pid ", p_.peer_pid, " failed"),
                      err == EPERM ? "cross-memory attach was denied; set unet_cma=off to copy "
                                     "through the segment"
                                   : "the peer may have unmapped the memory or exited");
      break;
    }
    done += static_cast<size_t>(n);
  }
  UnpinKeySlot(e);
  if (!st.ok()) return st;
  return PushDone(context, op, len);
}

}  // namespace zsock::unet
