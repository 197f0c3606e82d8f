// Internal: the pieces an SDP connection's state is made of (conn_state.h):
// protocol constants, completion contexts, private buffer regions, receive
// stream segments, queued messages, AZ-SDP adverts, the results of Send and
// Recv steps, and the errors a connection reports.
#ifndef ZSOCK_CORE_SDP_CONN_TYPES_H_
#define ZSOCK_CORE_SDP_CONN_TYPES_H_

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/provider.h"
#include "core/sdp/wire.h"

namespace zsock::sdp {

// Credits Data may not use: kept for control messages (docs/protocol.md).
inline constexpr int kCreditReserve = 2;
// Autocork: most flaggable Data sent unflagged after useless requests.
inline constexpr uint32_t kCorkMaxSkip = 1024;
// Autocork: a Send appending to a held tail polls the CQ (for the peer's
// acknowledgement) once per this many calls. Polling on every call finds
// the acknowledgement only a few sends later, and the extra message plus
// answer cost as much as they saved; measured, every 8th call did best.
inline constexpr uint32_t kCorkPollEvery = 8;
// Send slots kept free for control messages.
inline constexpr size_t kCtlSlots = 8;
// Largest single SrcAvail/SinkAvail (the wire length field is 32 bits).
inline constexpr size_t kMaxAdvert = size_t{1} << 30;
// AZ-SDP (docs/azsdp.md): most lock words (outstanding asynchronous
// SrcAvails) a side offers.
inline constexpr uint32_t kAzMaxSlots = 64;
// Lock word = generation << 2 | state. The generation counts the finished
// uses of the slot (both sides count them), so a compare-and-swap for an
// advert that has finished fails instead of locking the next one.
enum AzLockState : uint64_t { kAzFree = 0, kAzSinkReading = 1, kAzSourceMoved = 2 };
inline uint64_t AzWord(uint64_t gen, AzLockState s) { return (gen << 2) | s; }

// Pulled bcopy (docs/protocol.md): pulled SrcAvails a sink accepts
// outstanding, and the most bytes one advert announces.
inline constexpr uint32_t kPullMaxAdverts = 64;
inline constexpr size_t kPullAdvert = 256 << 10;
inline constexpr size_t kPullBuffer = 1 << 20;  // a connection's pull buffer

// Completion context: conn id << 24 | kind << 20 | index.
enum CtxKind : uint64_t {
  kCtxRx = 1, kCtxTx = 2, kCtxHello = 3, kCtxRead = 4, kCtxWrite = 5, kCtxAtomic = 6,
  kCtxAzRead = 7
};
// Fault cookies of receive ranges have this serial bit.
inline constexpr uint32_t kAzRecvSerial = 0x80000000u;
inline uint64_t MakeCtx(uint64_t id, CtxKind kind, uint64_t index) {
  return (id << 24) | (static_cast<uint64_t>(kind) << 20) | (index & 0xfffff);
}

// A block of memory for private buffers, registered when the fabric needs it.
struct Region {
  uint8_t* base = nullptr;
  size_t len = 0;
  std::unique_ptr<MemoryRegion> mr;
  ~Region();
  absl::Status Allocate(Fabric* fabric, size_t bytes);
};

// One piece of the receive stream.
struct RxSeg {
  enum Kind { kData, kSrcAvail } kind = kData;
  int buf = -1;               // kData: receive buffer index
  const uint8_t* data = nullptr;  // kData: payload
  size_t off = 0;             // bytes consumed
  size_t len = 0;             // bytes in the segment
  // kSrcAvail
  uint32_t advert = 0;
  uint64_t addr = 0;
  RemoteKey key;
  bool reading = false;
  bool cancel_requested = false;
  // AZ-SDP SrcAvail: its lock word, and whether this side locked it or the
  // source moved the data to a copy (AzUpdate received).
  uint32_t slot = wire::kNoSlot;
  uint64_t gen = 0;
  uint64_t stream_pos = 0;
  bool locked = false, moved = false;
  bool pulled = false;        // flagged kFlagPull: the source already returned
};

// A message waiting to be posted.
struct TxItem {
  wire::MessageId mid = wire::MessageId::kData;
  int slot = -1;           // Data: send slot holding the payload at offset 16
  size_t payload = 0;      // Data payload bytes
  std::string encoded;     // other messages: the whole encoded message
  uint32_t az_serial = 0;  // an asynchronous SrcAvail (not its update)
  bool held = false;       // Data: autocork held it back at least once (then, if
                           // last in the queue and not flushed, it asks for an
                           // acknowledgement when it goes, back-off permitting)
  uint32_t appends = 0;    // Sends that found it held (kCorkPollEvery)
};

// A private copy of data moved out of a protected user buffer.
struct AzCopyBuf {
  void* base = nullptr;
  std::unique_ptr<MemoryRegion> mr;
  ~AzCopyBuf();
};

// An asynchronous SrcAvail of this side (AZ-SDP), or a pulled bcopy advert
// (`pull`: no lock word, no protection; the bytes sit at pull_off in the
// pull buffer). It stays until the sink has read all of it.
struct AzSrcAvail {
  bool pull = false;
  size_t pull_off = 0;
  uint32_t serial = 0, id = 0, slot = 0, len = 0, done = 0;
  uint64_t gen = 0, stream_pos = 0;
  uintptr_t addr = 0;
  bool posted = false, moved = false;
  int guard = -1;                          // az::Guard handle while protected
  std::shared_ptr<MemoryRegion> mr;
  std::unique_ptr<AzCopyBuf> copy;
};

// AZ-SDP receive side: a Recv that returned before its data landed. The
// read goes to `temp`, which replaces the protected pages at `dest`
// (mremap) when it completes; then the RdmaRdCompl leaves.
struct AzEarlyRecv {
  bool active = false, seg_done = false;
  uint32_t serial = 0, advert = 0, bytes = 0, slot = 0;
  uint64_t gen = 0;
  uintptr_t dest = 0;
  size_t len = 0;
  void* temp = nullptr;
  std::unique_ptr<MemoryRegion> mr;
  int guard = -1;
  int pending = 0;           // reads in flight (max_rma_size pieces)
  absl::Status status;       // the first read error
};

// How one step of a Send or Recv (send.cc, recv.cc) ended.
enum class Step {
  kPass,  // not taken: the next way of moving the bytes applies
  kNext,  // moved bytes or waited: the call's loop goes on
  kEnd,   // the call returns (the call's `end` says what)
};

// How a step on one segment of the receive queue ended (recv.cc): as
// Step, and where the copy goes on.
enum class SegStep {
  kPass,     // not taken: the next way of reading the segment applies
  kNextSeg,  // go on with the next segment
  kSameSeg,  // go on with this segment
  kRestart,  // the queue changed: start over from its head (a peek ends)
  kStop,     // stop copying for now
  kEnd,      // the call returns (RecvCall::Result)
};

// Bytes in `iov`.
inline size_t IovBytes(std::span<const iovec> iov) {
  size_t n = 0;
  for (const iovec& v : iov) n += v.iov_len;
  return n;
}

// Removes the first message `mid` from `q` (an advert that never left;
// transmit.cc).
void Withdraw(std::deque<TxItem>& q, wire::MessageId mid);

// Errors (control.cc).
// A protocol violation by the peer, naming the message.
absl::Status Violation(const wire::Header& h, absl::string_view why);
absl::Status ResetError(absl::string_view what);
absl::Status PipeError();
absl::Status WouldBlock();
absl::Status TimedOut();
absl::Status Closed();

}  // namespace zsock::sdp

#endif  // ZSOCK_CORE_SDP_CONN_TYPES_H_
