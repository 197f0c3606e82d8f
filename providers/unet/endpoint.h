// unet's endpoint: one connection to a peer process on this host.
//
// Each side owns one communication segment (segment.h) that the other maps
// and writes into: we publish our messages into the peer's rings and
// buffers (tx) and consume what the peer published into ours (rx). The
// connection socket stays open as the liveness signal, beside the peer's
// pidfd; both sit in the CQ's epoll set.
//
// The methods live by responsibility:
//   rings.cc          sends and receives through the rings, Progress
//   direct_access.cc  RDMA read/write (cross-memory attach, mapped shared
//                     segments) and CPU atomics on shared segments
//   endpoint.cc       construction, close, failure
// Everything the peer wrote is validated before use (descriptor.h).
#ifndef ZSOCK_PROVIDERS_UNET_ENDPOINT_H_
#define ZSOCK_PROVIDERS_UNET_ENDPOINT_H_

#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "core/fd.h"
#include "core/mutex.h"
#include "core/provider.h"
#include "core/status.h"
#include "providers/unet/cq.h"
#include "providers/unet/descriptor.h"
#include "providers/unet/os.h"
#include "providers/unet/segment.h"

namespace zsock::unet {

class UnetFabric;

// Completions gathered under a lock and pushed after it; inline storage
// keeps the per-message path free of heap allocations.
using Completions = absl::InlinedVector<Completion, 4>;

class UnetEndpoint final : public Endpoint {
 public:
  // What the handshake hands over.
  struct Parts {
    Fd sock;
    Fd pidfd;
    pid_t peer_pid = 0;
    Fd rx_fd;          // my segment
    Mapping rx;
    SegmentLayout rx_layout;
    Mapping tx;        // peer's segment
    SegmentLayout tx_layout;
    Fd peer_event;     // peer CQ's eventfd
    Mapping peer_bell;  // peer CQ's bell
    uint32_t peer_bell_slot = kNoBellSlot;  // the peer endpoint's bit in it
    uint32_t bell_slot = kNoBellSlot;       // this endpoint's bit in our CQ's bell
    Mapping peer_keys;
    uint32_t peer_key_slots = 0;
    bool cma = false;
    EndpointInfo info;
  };

  UnetEndpoint(UnetFabric* fabric, UnetCq* cq, Parts parts);
  ~UnetEndpoint() override;

  const EndpointInfo& info() const override { return p_.info; }

  // rings.cc
  absl::Status Send(const void* buf, size_t len, MemoryRegion*, uint64_t context) override;
  absl::Status SendControl(std::span<const uint8_t> msg) override;
  absl::Status PostRecv(void* buf, size_t len, MemoryRegion*, uint64_t context) override;

  // direct_access.cc
  absl::Status Read(void* local, size_t len, MemoryRegion* mr, uint64_t remote_addr,
                    const RemoteKey& rkey, uint64_t context) override;
  absl::Status Write(const void* local, size_t len, MemoryRegion* mr, uint64_t remote_addr,
                     const RemoteKey& rkey, uint64_t context) override;
  absl::Status FetchAdd(uint64_t* result, uint64_t remote_addr, const RemoteKey& rkey,
                        uint64_t add, uint64_t context) override;
  absl::Status CompareSwap(uint64_t* result, uint64_t remote_addr, const RemoteKey& rkey,
                           uint64_t compare, uint64_t swap, uint64_t context) override;

  // endpoint.cc
  void Close() override;

  // Called by UnetCq::Progress. check_liveness: the socket or pidfd is
  // readable (UnetCq::Progress collects them): read the socket's messages,
  // look for the peer's end.
  size_t Progress(bool check_liveness);
  // Whether Progress would find work (the CQ has armed its bell).
  bool ArmAndCheck();

 private:
  struct PendingSend {
    uint8_t type;
    const uint8_t* data;
    std::vector<uint8_t> owned;  // control messages and queued injected sends keep their bytes here
    size_t len;
    size_t offset;
    bool started;
    uint64_t context;
  };
  struct PostedRecv {
    uint8_t* buf;
    size_t len;
    uint64_t context;
  };
  struct PeerShm {
    Mapping map;
    uint64_t base;
    uint64_t size;
  };

  absl::Status ClosedError() const {
    return MakeError(absl::StatusCode::kFailedPrecondition, ENOTCONN,
                     "operation on a closed unet endpoint", "connect a new endpoint");
  }
  bool rx_pending_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return rx_user_.Peek() != nullptr || rx_ctl_.Peek() != nullptr;
  }
  // Our CQ looks at this endpoint on its next progress (UnetCq::Mark).
  void MarkSelf() { cq_->Mark(p_.bell_slot); }
  // Whether the peer has exited (its pidfd is readable) or closed the
  // connection socket. Here, inline: every direct access asks first.
  bool PeerGone() {
    if (p_.pidfd) {
      pollfd pfd{p_.pidfd.get(), POLLIN, 0};
      if (::poll(&pfd, 1, 0) > 0) return true;
    }
    char c;
    ssize_t n = ::recv(p_.sock.get(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }

  // ---- rings.cc: the rings and the queues in front of them. The helpers
  // declared inline are defined there, their only user.
  absl::Status Enqueue(uint8_t type, const uint8_t* data, size_t len,
                       std::vector<uint8_t> owned, uint64_t context);
  template <typename List>
  inline bool PushSendsLocked(List* done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  template <typename List>
  bool PushQueueLocked(std::deque<PendingSend>* queue, List* done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  inline void Notify();
  inline void ReturnBuffer(bool ctl, uint32_t idx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Called once each, from Progress, which runs them for every message:
  // always folded into it.
  ABSL_ATTRIBUTE_ALWAYS_INLINE inline size_t DrainControlLocked(
      std::vector<std::vector<uint8_t>>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ABSL_ATTRIBUTE_ALWAYS_INLINE inline size_t DrainUserLocked(Completions* done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  inline void FailOnDeathLocked(Completions* done, absl::Status* emulated_failure)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  inline void UpdateHintsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  inline bool MayHaveWork() const ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // ---- endpoint.cc: failure.
  absl::Status ProtocolError(const char* what);
  void MarkDeadLocked(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Completion Failed(uint64_t context, OpType op, const absl::Status& why);
  void FailSendsLocked(const absl::Status& why, Completions* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FlushLocked(const absl::Status& why, Completions* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- direct_access.cc: one-sided operations and the peer's shared
  // segments. The helpers declared inline are defined there, their only user.
  bool ServiceSocketLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  inline absl::Status DirectAtomic(OpType op, uint64_t* result, uint64_t remote_addr,
                                   const RemoteKey& rkey, uint64_t a, uint64_t b,
                                   uint64_t context, bool* handled);
  uint8_t* PeerShmLocked(uint32_t shm_id, uint64_t remote_addr, uint64_t len)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status MappedAccess(OpType op, void* local, size_t len, uint64_t remote_addr,
                            const RemoteKey& rkey, uint64_t context, bool* handled);
  inline absl::Status PushDone(uint64_t context, OpType op, size_t len);
  absl::Status DirectAccess(OpType op, void* local, size_t len, uint64_t remote_addr,
                            const RemoteKey& rkey, uint64_t context);

  UnetFabric* fabric_;
  UnetCq* cq_;
  Parts p_;
  absl::flat_hash_map<uint32_t, PeerShm> peer_shm_ ABSL_GUARDED_BY(mu_);
  CqBell* peer_bell_;
  Mutex mu_;
  RingConsumer<Desc> rx_user_ ABSL_GUARDED_BY(mu_);
  RingConsumer<Desc> rx_ctl_ ABSL_GUARDED_BY(mu_);
  RingProducer<FreeSlot> rx_user_free_ ABSL_GUARDED_BY(mu_);
  RingProducer<FreeSlot> rx_ctl_free_ ABSL_GUARDED_BY(mu_);
  RingProducer<Desc> tx_user_ ABSL_GUARDED_BY(mu_);
  RingProducer<Desc> tx_ctl_ ABSL_GUARDED_BY(mu_);
  RingConsumer<FreeSlot> tx_user_free_ ABSL_GUARDED_BY(mu_);
  RingConsumer<FreeSlot> tx_ctl_free_ ABSL_GUARDED_BY(mu_);
  // Control messages have their own queue: a user message waiting for ring
  // space or buffers must never hold back emulation traffic.
  std::deque<PendingSend> sendq_ ABSL_GUARDED_BY(mu_);
  std::deque<PendingSend> ctlq_ ABSL_GUARDED_BY(mu_);
  std::deque<PostedRecv> posted_ ABSL_GUARDED_BY(mu_);
  Incoming user_in_ ABSL_GUARDED_BY(mu_);
  Incoming ctl_in_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool dead_ ABSL_GUARDED_BY(mu_) = false;
  bool dead_sends_failed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Completion> sent_done_ ABSL_GUARDED_BY(mu_);  // Enqueue's completions, for Progress
  bool rx_abandoned_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status dead_status_ ABSL_GUARDED_BY(mu_);
  // Hints read without mu_ by Progress's fast path (an empty poll takes no
  // lock); written under mu_ by UpdateHintsLocked.
  std::atomic<bool> hint_busy_{false};    // queued sends, or dead
  std::atomic<bool> hint_posted_{false};  // receives are posted
};

}  // namespace zsock::unet

#endif  // ZSOCK_PROVIDERS_UNET_ENDPOINT_H_
