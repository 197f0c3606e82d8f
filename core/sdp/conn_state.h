// Internal: the state of one SDP connection (ConnState), grouped by data
// path (the types it is made of are in conn_types.h).
//
// Locking: every field of a ConnState is guarded by the owning Engine's
// mutex (Engine::mu_) unless its comment says otherwise, and every
// ConnState function runs with that mutex held. Blocking waits go through
// Engine::WaitLocked, which releases it while it waits: anything read
// before a wait (an RxSeg reference, an index into a queue) must be looked
// up again after it. The thread-safety annotations are not on the fields:
// the analysis cannot tie a ConnState to its engine's mutex (Connection
// holds `engine_->mu_` and reaches the state through `state_`).
//
// Where each path's code lives: control.cc (set-up, Hello, half-close,
// failure), receive.cc (completions, sequencing, dispatch of incoming
// messages), transmit.cc (the send queues), autocork.cc, bcopy.cc,
// zcopy_source.cc, zcopy_sink.cc, az.cc (AZ-SDP source and faults),
// az_sink.cc, pull.cc, send.cc and recv.cc (Connection::Send, Recv).
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
#include "core/sdp/conn_types.h"
#include "core/sdp/connection.h"
#include "core/sdp/wire.h"

namespace zsock::sdp {

struct SendCall;
struct RecvCall;

// ---- The state groups of a ConnState (all guarded by Engine::mu_) ----

// Failure. `error` goes from OK to the first failure once and never back
// (Fail keeps the first reason); every later call reports it.
struct FailureState {
  absl::Status error;
  bool local_abort = false;      // Connection::Abort was called
  bool peer_aborted = false;     // AbortConn received
  bool ep_closed = false;        // the provider endpoint is closed
  bool close_when_idle = false;  // close it once the AbortConn has left
};

// Half-close (docs/protocol.md). Each flag only ever turns on.
struct ShutdownState {
  bool wr = false;         // DisconnReq queued: Send fails with EPIPE
  uint32_t wr_mseq = 0;    // mseq of our DisconnReq once posted (Close waits for its ack)
  bool rd = false;         // SHUT_RD: what arrives is dropped
  bool peer_wr = false;    // DisconnReq received: no data may follow it
};

// Sequence numbers and credits (docs/protocol.md, "Credits"): the peer has
// room for peer_bufs - (tx_mseq - peer_ack) more messages (Credits()).
// Sequence numbers only grow (mod 2^32); peer_ack <= tx_mseq.
struct CreditState {
  uint32_t tx_mseq = 0;           // last message posted
  uint32_t rx_mseq = 0;           // last message processed
  uint32_t peer_ack = 0;          // last mseq_ack from the peer
  uint16_t peer_bufs = 0;         // last bufs from the peer
  int last_reported = 0;          // bufs in our last message
  uint32_t recv_since_report = 0; // messages processed since our last message
  bool update_pending = false;    // a credit update should go (Repost)
  bool stalled = false;           // Data waits for credits (counted once per stall)
};

// The private receive buffers and the receive stream. Buffer i is posted
// iff posted_flag[i]; otherwise it holds a message not yet processed
// (`reorder`) or a kData segment of `queue` not yet read (reposted then).
struct ReceiveState {
  Region region;
  size_t size = 0;    // bytes per buffer
  int count = 0;
  std::vector<uint8_t> posted_flag;
  int posted = 0;
  std::map<uint32_t, std::pair<int, size_t>> reorder;  // mseq -> (buf, len)
  std::deque<RxSeg> queue;  // what Recv returns next, in stream order
  uint64_t pos = 0;         // stream bytes received (docs/protocol.md)
};

// The private send slots and the queues of messages waiting for them. A
// slot is free, in flight (its send completion pending) or held by a
// queued Data item (TxItem::slot); kCtlSlots are kept for control
// messages, which go ahead of the data queue.
struct TransmitState {
  Region hello;         // the active side's Hello, before the slots exist
  Region region;
  size_t size = 0;      // bytes per slot (the peer's buffer size, at most 1 MiB)
  std::vector<int> free;
  int inflight = 0;     // sends whose completion is pending
  // Data messages of at most this many bytes (header included) go
  // injected: no send completion, the slot free again at once
  // (caps().inject_size).
  size_t inject_max = 0;
  std::deque<TxItem> ctlq, dataq;
  uint64_t pos = 0;     // stream bytes committed
  bool held = false;    // test hook (ConnectionOptions::test_hold)
};

// Bcopy: Data messages, and autocork (docs/protocol.md, "Autocork"): a
// small Data tail waits, taking appends, while the peer has not
// acknowledged our last AckReq-flagged Data.
struct BcopyState {
  size_t queued_bytes = 0;        // accepted by Send, not yet posted
  bool cork = false;              // autocork in effect: option, peer's kExtAckReq, progress thread
  bool peer_answers = false;      // the peer announced kExtAckReq
  bool payload_posted = false;    // a Data with payload is unacknowledged
  uint32_t last_payload_mseq = 0; // mseq of the last one
  bool ackreq_out = false;        // a flagged Data awaits the peer's acknowledgement
  uint32_t ackreq_mseq = 0;       // its mseq
  bool answer_due = false;        // the peer flagged a Data we processed: post something
  bool flush_tail = false;        // what was queued at FlushTail goes without holding
  bool ackreq_useful = false;     // a send joined a tail held for the request
  uint32_t cork_backoff = 0;      // flaggable messages to skip after a useless request
  uint32_t cork_skip = 0;         // left to skip
};

// ZCopy source: this side's synchronous SrcAvail (one at a time: the Send
// waits for it), and the peer's SinkAvail this side may RDMA-write into.
struct ZcopySourceState {
  struct SrcAvail {
    bool active = false, posted = false, cancel_sent = false, finished = false;
    bool send_small = false;
    uint32_t id = 0, len = 0, done = 0;
    std::shared_ptr<MemoryRegion> mr;
  } advert;
  // Valid until data sent by other means voids it, or it is written.
  struct PeerSinkAvail {
    bool valid = false, writing = false, cancel_requested = false;
    uint32_t id = 0, len = 0;
    uint64_t addr = 0;
    RemoteKey key;
  } peer_sink;
  uint32_t last_sink_advert = 0;  // mseq of the last SinkAvail received
  int writes_out = 0;             // RDMA writes in flight
  absl::Status write_status;      // the first failed one's
};

// ZCopy sink: this side's SinkAvail (one at a time: the Recv waits for
// it), and the RDMA reads Recv makes of the peer's SrcAvails (of any kind).
struct ZcopySinkState {
  struct SinkAvail {
    bool active = false, posted = false, resolved = false, cancel_sent = false;
    uint32_t id = 0, len = 0, written = 0;
    std::shared_ptr<MemoryRegion> mr;
  } advert;
  std::deque<uint32_t> acks_due;  // SinkAvailCancel sent, ack not yet seen
  uint32_t last_src_advert = 0;   // mseq of the last SrcAvail received
  int reads_out = 0;              // RDMA reads in flight
  absl::Status read_status;       // the first failed one's
};

// AZ-SDP (docs/azsdp.md). A lock word's generation advances once per
// finished use on both sides (sink_gen, src_gen), in step.
struct AzState {
  bool enabled = false;  // my SrcAvails may be asynchronous (negotiated)
  // Sink side: my lock words (the peer's adverts), kAzMaxSlots words of
  // an engine-wide registered region (Engine::AcquireLockTable). The peer
  // changes them by remote atomics: read and write them atomically.
  MemoryRegion* table = nullptr;
  uint64_t* words = nullptr;
  int table_index = -1;
  uint32_t table_slots = 0;
  std::vector<uint64_t> sink_gen;  // per slot: finished uses
  AzEarlyRecv rx;                  // a receive that returned early
  uint32_t rx_serial = 0;
  // Source side: the peer's lock words and my adverts.
  RemoteKey peer_table;
  uint32_t peer_table_slots = 0;
  std::deque<AzSrcAvail> src;      // in flight, in order (pulled ones too)
  std::vector<uint64_t> src_gen;   // per peer slot: finished uses
  std::vector<uint8_t> slot_busy;
  uint32_t serial = 0;             // of the last entry of `src` (NextAzSerial)
  int64_t window_start = 0;        // fault-rate window (ns)
  uint32_t window_faults = 0;
  int atomics_out = 0;             // the copy-on-write compare-and-swap
  absl::Status atomic_status;
  uint64_t atomic_result = 0;
};

// Pulled bcopy (docs/protocol.md; pull.cc). Its adverts are AzSrcAvails
// in AzState::src, flagged `pull`.
struct PullState {
  bool offered = false;    // sink: I announced kExtPull
  uint32_t peer_count = 0; // source: the peer's kExtPull count (0: not offered)
  uint32_t out = 0;        // source: pulled adverts in AzState::src
  bool failed = false;     // source: the pull buffer could not be allocated
  // Source: the pull buffer (Fabric::AllocateRegistered, so the peer reads
  // it through its own mapping), a ring: adverts take contiguous ranges
  // from `head` on, and leave in order. kPullBuffer bytes; each pulled
  // advert holds it too.
  std::shared_ptr<MemoryRegion> mr;
  size_t head = 0;
};

// Send and Recv calls on the connection (Connection's CallScope). One Send
// and one Recv proceed at a time (`send_busy`, `recv_busy`); Close waits
// for `active` calls to leave (a socket may be closed by one thread while
// others are in calls on it).
struct CallState {
  bool send_busy = false, recv_busy = false;
  int active = 0;
  bool closing = false;  // Close has begun
};

// Readiness reporting (Engine::NoteReadinessLocked).
struct ReadinessState {
  std::shared_ptr<std::function<void(uint32_t)>> callback;
  uint32_t last = 0;  // what the callback was last given
  // Bits whose changes fire `callback` (Connection::readiness_watch);
  // shared with the caller, who writes it without the engine lock.
  std::shared_ptr<std::atomic<uint32_t>> watch = std::make_shared<std::atomic<uint32_t>>(~0u);
};

struct ConnState {
  enum class Phase { kHandshake, kOpen, kClosed };

  Engine* engine = nullptr;
  uint64_t id = 0;
  std::unique_ptr<Endpoint> ep;
  ConnectionOptions opt;
  bool active = false;  // this side connected (sends the Hello)
  Phase phase = Phase::kHandshake;
  std::string local_address, peer_address;
  uint8_t my_caps = 0;
  wire::Hello peer;           // the peer's Hello/HelloAck
  std::string peer_sockaddr;  // from the peer's kExtSocketAddress

  FailureState failure;
  ShutdownState shut;
  CreditState credit;
  ReceiveState rx;
  TransmitState tx;
  BcopyState bcopy;
  ZcopySourceState source;
  ZcopySinkState sink;
  AzState az;
  PullState pull;
  CallState calls;
  ReadinessState readiness;
  ConnectionStats stats;

  // ---- Set-up, control messages and failure (control.cc) ----
  absl::Status Init();
  void Fail(absl::Status why);
  void ProtocolError(absl::Status why);
  bool PostAbort(uint32_t reason);
  // Closes the provider endpoint (once); after a local abort this is what
  // tells a peer that is not reading our AbortConn (docs/protocol.md).
  void CloseEndpoint();
  void CloseEndpointWhenIdle();
  void QueueShutdownWr();
  void DropReceived();
  void LeaveCall();  // wakes Close after the last
  uint32_t ReadinessNow() const;  // (connection.cc)

  // ---- Receive path (receive.cc) ----
  void OnCompletion(CtxKind kind, uint32_t index, Completion& c);
  void Repost(int buf);
  // How many credits a report now would add to the peer's view.
  int Owed() const {
    return Reportable() + static_cast<int>(credit.recv_since_report) - credit.last_reported;
  }
  // The `bufs` to report with mseq_ack = rx_mseq: buffers posted, plus those
  // holding messages that completed ahead of their turn (they are past
  // mseq_ack, so the peer subtracts them again).
  int Reportable() const { return rx.posted + static_cast<int>(rx.reorder.size()); }
  int Credits() const {
    return static_cast<int>(credit.peer_bufs) -
           static_cast<int>(credit.tx_mseq - credit.peer_ack);
  }

  // ---- Transmit path (transmit.cc) ----
  // Posts what the queues hold as far as credits and slots allow.
  void TryTransmit();
  void QueueCtl(const wire::Message& m);
  void QueueData(const wire::Message& m);
  uint8_t* SlotPtr(int slot) const {
    return tx.region.base + static_cast<size_t>(slot) * tx.size;
  }

  // ---- Send and Recv (send.cc, recv.cc) ----
  // Whether a Send of `iov` polls the CQ first (autocork counts the sends
  // that join a held tail here).
  [[gnu::always_inline]] inline bool PollBeforeSend(std::span<const iovec> iov);
  // Moves the next bytes of the call's piece, the first way that applies.
  [[gnu::always_inline]] inline Step SendNext(SendCall& call);
  [[gnu::always_inline]] inline Step SendPulled(SendCall& call);
  [[gnu::always_inline]] inline Step SendBcopy(SendCall& call);
  // Recv's loop: copies, announces, waits, until the call returns.
  absl::StatusOr<size_t> RecvLoop(RecvCall& call);
  // Copies what the receive queue holds (kNext: as far as it went).
  Step CopyQueued(RecvCall& call);

  // ---- Bcopy (bcopy.cc) ----
  // A send of `iov` goes out by bcopy at once as one Data message.
  bool CanPostSmall(std::span<const iovec> iov) const;
  // Send would queue at least one byte by bcopy now.
  bool CanAppend() const {
    if (!tx.dataq.empty()) {
      const TxItem& tail = tx.dataq.back();
      if (tail.mid == wire::MessageId::kData && tail.slot >= 0 &&
          tail.payload < tx.size - wire::kHeaderSize) {
        return true;
      }
    }
    return bcopy.queued_bytes < opt.sndbuf && tx.free.size() > kCtlSlots;
  }
  size_t AppendData(const uint8_t* p, size_t n);

  // ---- Autocork (autocork.cc) ----
  // Autocork: `item` (the head of dataq) stays queued for now.
  bool HoldTail(const TxItem& item) const;
  // Unacknowledged Data with payload is on its way.
  bool PayloadInFlight() const {
    return bcopy.payload_posted &&
           static_cast<int32_t>(credit.peer_ack - bcopy.last_payload_mseq) < 0;
  }
  // Largest payload that asks for an acknowledgement: half a slot (larger
  // messages gain little from coalescing).
  size_t CorkFlagMax() const { return (tx.size - wire::kHeaderSize) / 2; }
  // Payload of the tail autocork holds now (0 if none, or if it also waits
  // for credits).
  size_t HeldBytes() const {
    if (tx.dataq.empty() || phase != Phase::kOpen || !failure.error.ok()) return 0;
    const TxItem& t = tx.dataq.front();
    if (t.mid != wire::MessageId::kData || t.payload == 0 || Credits() < kCreditReserve + 1) {
      return 0;
    }
    return HoldTail(t) ? t.payload : 0;
  }
  void UpdateCork();
  void SetAutocork(bool on);
  // The application is about to wait on this connection: send a held tail.
  void FlushTail();

  // ---- ZCopy source (zcopy_source.cc) ----
  // Writes the next bytes into the peer's SinkAvail.
  Step SendToPeerSink(SendCall& call);
  absl::Status WritePeerSink(const uint8_t* q, size_t k, MemoryRegion* mr);
  // Announces the next bytes in a SrcAvail and waits until they are read.
  Step SendSrcAvail(SendCall& call);
  // False: the deadline passed before the SrcAvail left (it is withdrawn);
  // true: it finished, by the sink's reads or a cancel.
  bool AwaitSrcAvail(const Deadline& deadline);

  // ---- ZCopy sink (zcopy_sink.cc) ----
  // Reads from the SrcAvail segment `si` of the receive queue (`avail`
  // bytes from `start` are the call's).
  SegStep RecvFromSrcAvail(RecvCall& call, size_t si, size_t start, size_t avail);
  absl::Status ReadSrcAvail(RxSeg& s, size_t start, uint8_t* dest, size_t k);
  SegStep SrcAvailReadFailed(RecvCall& call, size_t idx, const absl::Status& st);
  // Announces the call's buffer in a SinkAvail and waits for the write.
  Step RecvIntoSinkAvail(RecvCall& call);

  // ---- Pulled bcopy (pull.cc) ----
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
  uint8_t* PullBase() const { return static_cast<uint8_t*>(pull.mr->addr()); }

  // ---- AZ-SDP source side and faults (az.cc) ----
  absl::Status SetUpAz();                  // my lock table, if I offer AZ
  void AcceptPeerAz();                     // from the peer's Hello/HelloAck
  void AddAzHello(wire::Hello& h) const;   // my table in my Hello/HelloAck
  uint32_t AzLimit() const;                // asynchronous SrcAvails I may have out
  uint32_t AzOut() const { return static_cast<uint32_t>(az.src.size()) - pull.out; }
  // The serial of a new entry of az.src (never 0).
  uint32_t NextAzSerial() { return ++az.serial == 0 ? ++az.serial : az.serial; }
  uint64_t TxCommitted() const;            // stream bytes sent or announced
  AzSrcAvail* FindAz(uint32_t serial);
  void AzFinish(size_t index);             // advert done: unprotect, free slot
  void AzReleaseAll();                     // connection over: unprotect all
  bool AzMove(AzSrcAvail& s);              // copy aside, point the advert at it
  wire::Message AzAdvert(const AzSrcAvail& s, uint8_t flags) const;
  // Announces the page-aligned middle of the next bytes asynchronously.
  Step SendAsync(SendCall& call);
  Step QueueAsync(SendCall& call, size_t len);
  // Fault on advert `serial` (Engine::OnFault drives these).
  enum class AzStep { kDone, kBlock, kCasPosted };
  AzStep AzFaultBegin(uint32_t serial);
  bool AzFaultCasDone(uint32_t serial);    // true: resolved; false: wait
  bool AzGuarded(uint32_t serial);         // still protected and healthy

  // ---- AZ-SDP sink side (az_sink.cc) ----
  uint32_t MyMaxAdverts() const { return az.table ? az.table_slots : 1; }
  uint64_t* LockWord(uint32_t slot) const { return az.words + slot; }
  void AzSinkDone(RxSeg& s);               // reset my lock word for reuse
  void AzSinkDone(uint32_t slot, uint64_t gen);
  // Takes the lock word of `s` before it is read.
  SegStep LockAzAdvert(RecvCall& call, RxSeg& s);
  // Returns the next bytes of segment `si` before they land, if it can.
  SegStep RecvEarly(RecvCall& call, size_t si, RxSeg& s, size_t avail);
  // Receive side: tries to return `s`'s next bytes into [dest, dest+len)
  // (page-aligned) before they land; false: do it synchronously.
  bool AzRecvEarly(RxSeg& s, uint8_t* dest, size_t len);
  void AzRxLanded(absl::Status st);        // the early receive's read finished
  void AzRxAbandon();                      // connection over: give the pages back

 private:
  // Set-up (control.cc).
  absl::Status SetUpTx();
  wire::Hello MyHello() const;             // the body of my Hello/HelloAck
  absl::Status SendHello();

  // Receiving (receive.cc).
  void PostRx(int buf);
  void OnRx(int buf, size_t len);
  void Process(int buf, size_t len);
  void ProcessMessage(int buf, std::span<const uint8_t> bytes);
  // Process's checks of the base header common to every message (phase,
  // sequence, credits; `hello` is the message when it is a Hello or
  // HelloAck). False when the message violated the protocol (connection
  // failed).
  bool AcceptHeader(const wire::Header& h, const wire::Message* hello);
  // Autocork's part of a message's header: acknowledgements (autocork.cc).
  void OnPeerAck();

  // Incoming messages other than Data, one handler per message id. Each
  // returns false when the connection failed (the receive buffer then
  // stays unposted), true when the buffer goes back to the peer.
  bool Dispatch(wire::Message& m);
  // Control (control.cc).
  void OnHello(const wire::Message& m);  // Hello and HelloAck (from AcceptHeader)
  bool OnModeChange(const wire::ModeChange& m);
  bool OnDisconnReq(const wire::Header& h);
  bool OnAbortConn(const wire::Abort& a);
  bool OnUnhandled(const wire::Header& h);
  // Bcopy (bcopy.cc).
  enum class DataOutcome { kRepost, kKeep, kFailed };
  // A Data message in receive buffer `buf`: queued for the application
  // (kKeep: the buffer is reposted once read), a credit update or discarded
  // (kRepost), or a violation (kFailed).
  DataOutcome OnData(const wire::Header& h, int buf, std::span<const uint8_t> payload);
  // ZCopy source (zcopy_source.cc).
  bool OnSinkAvail(const wire::Header& h, wire::Advert& a);
  bool OnRdmaRdCompl(const wire::Header& h, const wire::Completed& c);
  bool OnSinkAvailCancel(const wire::Header& h, const wire::AdvertRef& r);
  // ZCopy sink (zcopy_sink.cc).
  bool OnSrcAvail(const wire::Header& h, wire::Advert& a);
  bool SrcAvailFlagsValid(const wire::Header& h, const wire::Advert& a);
  bool SrcAvailPositionValid(const wire::Header& h, const wire::Advert& a, bool pulled,
                             bool az_msg);
  bool OnRdmaWrCompl(const wire::Header& h, const wire::Completed& c);
  bool OnSrcAvailCancel(const wire::Header& h, const wire::AdvertRef& r);
  bool OnSinkCancelAck(const wire::Header& h, const wire::AdvertRef& r);
  void VoidSinkAvail();
  // AZ-SDP (az.cc, az_sink.cc): RdmaRdCompl of the asynchronous or pulled
  // advert az.src[index], and SrcAvail flagged AzUpdate.
  bool OnAzRdmaRdCompl(const wire::Header& h, const wire::Completed& c, size_t index);
  bool OnAzUpdate(const wire::Header& h, wire::Advert& a);

  // Sending (transmit.cc).
  bool PostItem(TxItem& item);
  // Where the head of the queues went.
  enum class HeadOutcome { kPosted, kWaits, kStop };
  [[gnu::always_inline]] inline HeadOutcome PostHead(int credits, int owed);
  // PostItem's bookkeeping: the advert it posted, and after the post.
  [[gnu::always_inline]] inline void NoteAdvertPosted(const TxItem& item, const wire::Header& h);
  [[gnu::always_inline]] inline void NotePosted(const TxItem& item, uint32_t mseq, bool ackreq);
  // Autocork's part of posting `item` (autocork.cc): whether it asks for
  // an acknowledgement.
  bool WantAckReq(const TxItem& item);
};

}  // namespace zsock::sdp

#endif  // ZSOCK_CORE_SDP_CONN_STATE_H_
