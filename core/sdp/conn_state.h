// Internal: the state of one SDP connection. Every field is guarded by the
// owning Engine's mutex; the functions in connection.cc run with it held.
#ifndef ZSOCK_CORE_SDP_CONN_STATE_H_
#define ZSOCK_CORE_SDP_CONN_STATE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/provider.h"
#include "core/sdp/connection.h"
#include "core/sdp/wire.h"

namespace zsock::sdp {

// Credits Data may not use: kept for control messages (docs/protocol.md).
inline constexpr int kCreditReserve = 2;
// Autocork: most flaggable Data sent unflagged after useless requests.
inline constexpr uint32_t kCorkMaxSkip = 1024;
// Autocork: a Send appending to a held tail polls the CQ (for the peer's
// acknowledgement) once per this many calls. Polling on every call found
// the acknowledgement after 3-4 sends, and the message plus answer per 3-4
// sends cost as much as it saved (unet msgrate unchanged); every 8th gave
// the best of 1, 4, 8, 16 and never (docs/performance-notes.md, tenth
// session).
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

// Bytes in `iov`.
size_t IovBytes(std::span<const iovec> iov);

// A protocol violation by the peer, naming the message (connection.cc).
absl::Status Violation(const wire::Header& h, absl::string_view why);

struct ConnState {
  enum class Phase { kHandshake, kOpen, kClosed };

  Engine* engine = nullptr;
  uint64_t id = 0;
  std::unique_ptr<Endpoint> ep;
  ConnectionOptions opt;
  bool active = false;
  Phase phase = Phase::kHandshake;
  absl::Status error;
  bool local_abort = false;
  bool ep_closed = false;       // the provider endpoint is closed
  bool close_when_idle = false; // close it once the AbortConn has left
  bool shut_wr = false;       // DisconnReq queued
  uint32_t shut_mseq = 0;     // mseq of our DisconnReq once posted
  bool shut_rd = false;
  bool peer_shut_wr = false;  // DisconnReq received
  bool peer_aborted = false;  // AbortConn received
  std::string local_address, peer_address;
  uint8_t my_caps = 0;

  // Receive side.
  Region rx;
  size_t rx_size = 0;
  int rx_count = 0;
  std::vector<uint8_t> rx_posted_flag;
  int rx_posted = 0;
  std::map<uint32_t, std::pair<int, size_t>> rx_reorder;  // mseq -> (buf, len)
  std::deque<RxSeg> rxq;
  uint32_t rx_mseq = 0;       // last message processed
  uint64_t rx_pos = 0;        // stream bytes received (docs/protocol.md)

  // Credits.
  uint32_t tx_mseq = 0;       // last message posted
  uint32_t peer_ack = 0;      // last mseq_ack from the peer
  uint16_t peer_bufs = 0;     // last bufs from the peer
  int last_reported = 0;      // bufs in our last message
  uint32_t recv_since_report = 0;
  bool credit_update_pending = false;
  bool stalled = false;

  // Autocork (docs/protocol.md): a small Data tail waits, taking appends,
  // while the peer has not acknowledged our last AckReq-flagged Data.
  bool cork = false;              // in effect: option, peer's kExtAckReq, progress thread
  bool peer_answers = false;      // the peer announced kExtAckReq
  bool payload_posted = false;    // a Data with payload was ever posted
  uint32_t last_payload_mseq = 0; // mseq of the last one
  bool ackreq_out = false;        // a flagged Data awaits the peer's acknowledgement
  uint32_t ackreq_mseq = 0;       // its mseq
  bool answer_due = false;        // the peer flagged a Data we processed: post something
  bool flush_tail = false;        // what was queued at FlushTail goes without holding
  bool ackreq_useful = false;     // a send joined a tail held for the request
  uint32_t cork_backoff = 0;      // flaggable messages to skip after a useless request
  uint32_t cork_skip = 0;         // left to skip

  // Peer parameters (from Hello/HelloAck).
  wire::Hello peer;
  std::string peer_sockaddr;  // from the peer's kExtSocketAddress

  // Send side.
  Region hello;               // the active side's Hello, before tx exists
  Region tx;
  size_t tx_size = 0;
  std::vector<int> tx_free;
  int tx_inflight = 0;
  // Data messages of at most this many bytes (header included) go
  // injected: no send completion, the slot free again at once
  // (caps().inject_size).
  size_t inject_max = 0;
  std::deque<TxItem> ctlq, dataq;
  size_t queued_data_bytes = 0;
  uint64_t tx_pos = 0;        // stream bytes committed
  bool held = false;          // test hook

  // ZCopy source: our SrcAvail.
  struct Src {
    bool active = false, posted = false, cancel_sent = false, finished = false;
    bool send_small = false;
    uint32_t id = 0, len = 0, done = 0;
    std::shared_ptr<MemoryRegion> mr;
  } src;
  uint32_t last_src_advert = 0;   // sink: mseq of the last SrcAvail received
  // ZCopy sink: our SinkAvail.
  struct Sink {
    bool active = false, posted = false, resolved = false, cancel_sent = false;
    uint32_t id = 0, len = 0, written = 0;
    std::shared_ptr<MemoryRegion> mr;
  } sink;
  std::deque<uint32_t> sink_acks_due;  // SinkAvailCancel sent, ack not yet seen
  // Source: the peer's SinkAvail we may write into.
  struct SinkIn {
    bool valid = false, writing = false, cancel_requested = false;
    uint32_t id = 0, len = 0;
    uint64_t addr = 0;
    RemoteKey key;
  } sink_in;
  uint32_t last_sink_advert = 0;  // source: mseq of the last SinkAvail received

  // ---- AZ-SDP (docs/azsdp.md) ----
  bool az = false;                          // my SrcAvails may be asynchronous
  // My lock words (the peer's adverts): kAzMaxSlots words of an
  // engine-wide registered region (Engine::AcquireLockTable).
  MemoryRegion* az_table = nullptr;
  uint64_t* az_words = nullptr;
  int az_table_index = -1;
  uint32_t az_table_slots = 0;
  std::vector<uint64_t> az_sink_gen;        // per slot: finished uses
  RemoteKey peer_table;                     // the peer's lock words
  uint32_t peer_table_slots = 0;
  // Also a pulled bcopy advert (`pull`): no lock word, no protection; the
  // bytes sit at pull_off in the pull buffer.
  struct AzSrc {
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
  std::deque<AzSrc> az_src;                 // asynchronous SrcAvails in flight
  // Receive side: a Recv that returned before its data landed. The read
  // goes to `temp`, which replaces the protected pages at `dest` (mremap)
  // when it completes; then the RdmaRdCompl leaves.
  struct AzRx {
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
  } az_rx;
  uint32_t az_rx_serial = 0;
  std::vector<uint64_t> az_src_gen;         // per peer slot: finished uses
  std::vector<uint8_t> az_slot_busy;
  uint32_t az_serial = 0;
  int64_t az_window_start = 0;              // fault-rate window (ns)
  uint32_t az_window_faults = 0;
  // ---- Pulled bcopy (docs/protocol.md; pull.cc) ----
  bool pull_offered = false;     // sink: I announced kExtPull
  uint32_t peer_pull = 0;        // source: the peer's kExtPull count (0: not offered)
  uint32_t pull_out = 0;         // source: pulled adverts in az_src
  bool pull_failed = false;      // source: the pull buffer could not be allocated
  // Source: the pull buffer (Fabric::AllocateRegistered, so the peer reads
  // it through its own mapping), a ring: adverts take contiguous ranges
  // from pull_head on, and leave in order.
  std::shared_ptr<MemoryRegion> pull_mr;  // kPullBuffer bytes (each pulled advert holds it too)
  size_t pull_head = 0;
  int atomics_out = 0;
  absl::Status atomic_status;
  uint64_t atomic_result = 0;

  int reads_out = 0;
  absl::Status read_status;
  int writes_out = 0;
  absl::Status write_status;
  bool send_busy = false, recv_busy = false;
  // Send and Recv calls in progress (Connection's CallScope), and whether
  // Close has begun: Close waits for the calls to leave (a socket may be
  // closed by one thread while others are in calls on it).
  int calls = 0;
  bool closing = false;
  void LeaveCall();  // wakes Close after the last

  ConnectionStats stats;
  std::shared_ptr<std::function<void(uint32_t)>> callback;
  uint32_t last_readiness = 0;
  // Readiness bits whose changes fire `callback` (Connection::
  // readiness_watch); shared with the caller, who writes it without the
  // engine lock.
  std::shared_ptr<std::atomic<uint32_t>> watch = std::make_shared<std::atomic<uint32_t>>(~0u);

  // ---- protocol (connection.cc), engine mutex held ----
  absl::Status Init();
  void OnCompletion(CtxKind kind, uint32_t index, Completion& c);
  void Fail(absl::Status why);
  void ProtocolError(absl::Status why);
  void TryTransmit();
  // How many credits a report now would add to the peer's view.
  int Owed() const {
    return Reportable() + static_cast<int>(recv_since_report) - last_reported;
  }
  // The `bufs` to report with mseq_ack = rx_mseq: buffers posted, plus those
  // holding messages that completed ahead of their turn (they are past
  // mseq_ack, so the peer subtracts them again).
  int Reportable() const { return rx_posted + static_cast<int>(rx_reorder.size()); }
  int Credits() const { return static_cast<int>(peer_bufs) - static_cast<int>(tx_mseq - peer_ack); }
  uint32_t ReadinessNow() const;
  // A send of `iov` goes out by bcopy at once as one Data message.
  bool CanPostSmall(std::span<const iovec> iov) const;
  bool CanAppend() const;
  // Autocork: `item` (the head of dataq) stays queued for now.
  bool HoldTail(const TxItem& item) const;
  // Unacknowledged Data with payload is on its way.
  bool PayloadInFlight() const;
  // Largest payload that asks for an acknowledgement: half a slot (larger
  // messages gain little from coalescing).
  size_t CorkFlagMax() const { return (tx_size - wire::kHeaderSize) / 2; }
  void UpdateCork();
  void SetAutocork(bool on);
  // Payload of the tail autocork holds now (0 if none, or if it also waits
  // for credits).
  size_t HeldBytes() const;
  // The application is about to wait on this connection: send a held tail.
  void FlushTail();
  size_t AppendData(const uint8_t* p, size_t n);
  void QueueCtl(const wire::Message& m);
  void QueueData(const wire::Message& m);
  void Repost(int buf);
  void QueueShutdownWr();
  void DropReceived();
  bool PostAbort(uint32_t reason);
  // Closes the provider endpoint (once); after a local abort this is what
  // tells a peer that is not reading our AbortConn (docs/protocol.md).
  void CloseEndpoint();
  void CloseEndpointWhenIdle();
  uint8_t* SlotPtr(int slot) const { return tx.base + static_cast<size_t>(slot) * tx_size; }

  // Pulled bcopy (pull.cc).
  void SetUpPull();                        // offer it, as a sink, if my reads allow
  void AddPullHello(wire::Hello& h) const;
  void AcceptPeerPull();                   // from the peer's Hello/HelloAck
  // A bcopy send of `rem` more bytes goes pulled.
  bool PullWanted(size_t rem) const;
  bool EnsurePullBuffer();                 // allocates it at the first use
  // Bytes of the next `rem` that fit the pull buffer now, at *off (0: wait
  // for an advert to finish).
  size_t PullRoom(size_t rem, size_t* off) const;
  // Copies k bytes into the pull buffer at off and queues their SrcAvail.
  void QueuePull(const uint8_t* p, size_t k, size_t off);
  uint32_t AzOut() const { return static_cast<uint32_t>(az_src.size()) - pull_out; }
  uint8_t* PullBase() const { return static_cast<uint8_t*>(pull_mr->addr()); }
  // The serial of a new entry of az_src (never 0).
  uint32_t NextAzSerial() { return ++az_serial == 0 ? ++az_serial : az_serial; }

  // AZ-SDP.
  absl::Status SetUpAz();                  // my lock table, if I offer AZ
  void AcceptPeerAz();                     // from the peer's Hello/HelloAck
  uint32_t AzLimit() const;                // asynchronous SrcAvails I may have out
  uint32_t MyMaxAdverts() const { return az_table ? az_table_slots : 1; }
  uint64_t TxCommitted() const;            // stream bytes sent or announced
  AzSrc* FindAz(uint32_t serial);
  void AzFinish(size_t index);             // advert done: unprotect, free slot
  void AzReleaseAll();                     // connection over: unprotect all
  bool AzMove(AzSrc& s);                   // copy aside, point the advert at it
  uint64_t* LockWord(uint32_t slot) const {
    return az_words + slot;
  }
  void AzSinkDone(RxSeg& s);               // reset my lock word for reuse
  void AzSinkDone(uint32_t slot, uint64_t gen);
  // Receive side: tries to return `s`'s next bytes into [dest, dest+len)
  // (page-aligned) before they land; false: do it synchronously.
  bool AzRecvEarly(RxSeg& s, uint8_t* dest, size_t len);
  void AzRxLanded(absl::Status st);        // the early receive's read finished
  void AzRxAbandon();                      // connection over: give the pages back
  void AddAzHello(wire::Hello& h) const;   // my table in my Hello/HelloAck
  wire::Message AzAdvert(const AzSrc& s, uint8_t flags) const;
  // Fault on advert `serial` (Engine::OnFault drives these).
  enum class AzStep { kDone, kBlock, kCasPosted };
  AzStep AzFaultBegin(uint32_t serial);
  bool AzFaultCasDone(uint32_t serial);    // true: resolved; false: wait
  bool AzGuarded(uint32_t serial);         // still protected and healthy

 private:
  void PostRx(int buf);
  void OnRx(int buf, size_t len);
  void Process(int buf, size_t len);
  // Process's checks of the base header common to every message (phase,
  // sequence, credits; `hello` is the message when it is a Hello or
  // HelloAck). False when the message violated the protocol (connection
  // failed).
  bool AcceptHeader(const wire::Header& h, const wire::Message* hello);
  enum class DataOutcome { kRepost, kKeep, kFailed };
  // A Data message in receive buffer `buf`: queued for the application
  // (kKeep: the buffer is reposted once read), a credit update or discarded
  // (kRepost), or a violation (kFailed).
  DataOutcome OnData(const wire::Header& h, int buf, std::span<const uint8_t> payload);
  bool PostItem(TxItem& item);
  absl::Status SetUpTx();
  void HandleHello(const wire::Message& m);
  void VoidSinkAvail();
};

}  // namespace zsock::sdp

#endif  // ZSOCK_CORE_SDP_CONN_STATE_H_
