// sdp::Connection: one SDP byte-stream connection over a provider endpoint.
//
// Contract:
//  - Send/Recv are blocking unless MSG_DONTWAIT is given (then a call that
//    cannot move a byte fails with Unavailable / errno EAGAIN), and give up
//    at `deadline` (DeadlineExceeded / EAGAIN, or the bytes moved so far).
//  - Send copies into private buffers (BCopy; it returns once the bytes are
//    queued, coalescing small writes while credits are out) or, at and above
//    the zero-copy threshold in zcopy mode, announces the caller's buffer
//    (SrcAvail) and returns once the peer has pulled it; a peer waiting in
//    Recv with a large buffer announces it (SinkAvail) and Send writes there.
//  - Recv returns the bytes available (at least 1), all requested bytes with
//    MSG_WAITALL, 0 once the peer shut down writing and everything before it
//    was read; MSG_PEEK leaves them in the stream.
//  - A dead peer, a reset (peer's Abort) or a protocol violation fails every
//    blocked and later call with Aborted (errno ECONNRESET, or EPROTO for a
//    violation); Send after Shutdown(SHUT_WR) fails with FailedPrecondition
//    (errno EPIPE).
//  - Calls may come from several threads at once (one Send and one Recv at a
//    time proceed; others wait their turn).
//  - Readiness (readable/writable/error/hup) can be queried and a callback
//    registered that fires, outside engine locks, whenever it changes: the
//    sockets layer mirrors it onto a real fd for poll/epoll.
#ifndef ZSOCK_CORE_SDP_CONNECTION_H_
#define ZSOCK_CORE_SDP_CONNECTION_H_

#include <sys/socket.h>
#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/sdp/deadline.h"
#include "core/sdp/wire.h"

namespace zsock::sdp {

class Engine;
struct ConnState;

using wire::Mode;

// AZ-SDP: what a write to a buffer still being sent does (docs/azsdp.md).
enum class AzPolicy : uint8_t {
  kCopy,   // race the receiver for the advert's lock word; if won, copy the
           // data aside and let the writer go on, else wait
  kBlock,  // wait until the receiver has pulled the data
};

// Per-connection options. Defaults come from the configuration (mode,
// zcopy_threshold; docs/configuration.md).
struct ConnectionOptions {
  size_t buf_size = 64 << 10;   // bytes per private receive buffer
  size_t rcvbuf = 1 << 20;      // receive buffers = rcvbuf / buf_size
  size_t sndbuf = 1 << 20;      // bytes Send may queue ahead of credits
  Mode mode = Mode::kBcopy;     // kZcopy: SrcAvail/SinkAvail above threshold;
                                // kAz: asynchronous SrcAvails (AZ-SDP)
  size_t zcopy_threshold = 128 << 10;  // docs/protocol.md, "Measured"
  // Pulled bcopy (docs/protocol.md): a bcopy send of at least this many
  // bytes, to a peer that reads our allocated memory with CPU copies
  // (unet), is copied into a shared buffer the peer reads straight into
  // its application's buffer; 0: never.
  size_t pull_threshold = 32 << 10;
  absl::Duration linger = absl::Seconds(10);  // Close waits this long to flush
  AzPolicy az_policy = AzPolicy::kCopy;
  uint32_t az_adverts = 16;         // asynchronous SrcAvails outstanding at most
  uint32_t az_fault_limit = 5000;   // faults per second before falling back to zcopy
  // AZ-SDP receive side: a large page-aligned receive returns before its
  // data lands, the pages inaccessible until then (docs/azsdp.md: kernel
  // reads of them, e.g. write(2) of the buffer, fail with EFAULT meanwhile).
  bool az_early_recv = false;
  // Autocork (docs/protocol.md): while the peer has not acknowledged our
  // last small Data, the next small send waits in its slot and later sends
  // append to it. Effective with an engine progress thread and a 1.1 peer.
  bool autocork = true;
  // This side's socket address, sent in the Hello / HelloAck (the peer's
  // peer_socket_address()); "" sends none.
  std::string local_sockaddr;
  // Test hook: called before each message is posted, with its id; returning
  // false holds it (and everything behind it in its queue) until
  // Connection::TestReleaseHeld. Used to force cancel races.
  std::function<bool(wire::MessageId)> test_hold;

  static ConnectionOptions FromConfig();
};

// Readiness bits.
enum Readiness : uint32_t {
  kReadable = 1u << 0,  // Recv would not block (data, EOF or error)
  kWritable = 1u << 1,  // Send would queue at least one byte
  kError = 1u << 2,     // the connection failed (Recv/Send return the error)
  kRdHup = 1u << 3,     // the peer shut down writing (DisconnReq received)
  kHup = 1u << 4,       // both directions are shut down or the connection failed
};

struct ConnectionStats {
  uint64_t bytes_sent_bcopy = 0;
  uint64_t bytes_sent_srcavail = 0;    // pulled by the peer's RDMA read
  uint64_t bytes_sent_sinkavail = 0;   // RDMA-written into the peer's buffer
  uint64_t bytes_recv_bcopy = 0;
  uint64_t bytes_recv_srcavail = 0;
  uint64_t bytes_recv_sinkavail = 0;
  uint64_t messages_sent = 0;
  uint64_t messages_received = 0;
  uint64_t coalesced_sends = 0;        // Sends appended to a queued message
  uint64_t credit_stalls = 0;          // times Data waited for credits
  uint64_t credit_updates_sent = 0;    // Data messages with no payload (ack answers too)
  uint64_t autocork_holds = 0;         // small Data tails held back (autocork)
  uint64_t ack_requests = 0;           // Data sent flagged AckReq
  uint64_t ack_answers = 0;            // empty Data sent only to answer an AckReq
  uint64_t queued_bytes = 0;           // now: bcopy bytes accepted by Send, not yet posted
                                       // (waiting for credits or held by autocork)
  uint64_t held_bytes = 0;             // now: of those, the tail autocork holds (credits
                                       // would let it go)
  uint64_t srcavail_sent = 0;
  uint64_t srcavail_cancels = 0;       // SrcAvailCancel sent
  uint64_t sendsmall = 0;              // SrcAvails finished by BCopy
  uint64_t sinkavail_sent = 0;
  uint64_t sinkavail_cancels = 0;      // SinkAvailCancel sent
  uint64_t sinkavail_void = 0;         // SinkAvails overtaken by data
  uint64_t sinkavail_received = 0;     // peer's SinkAvails seen (source side)
  uint64_t cancels_received = 0;       // SrcAvailCancel + SinkAvailCancel seen
  uint64_t rdma_fallbacks = 0;         // refused RDMA read/write, finished by bcopy
  // AZ-SDP (docs/azsdp.md).
  uint64_t az_srcavail_sent = 0;       // asynchronous SrcAvails
  uint64_t az_bytes = 0;               // bytes announced by them
  uint64_t az_hybrid_bcopy = 0;        // unaligned head/tail bytes sent by bcopy
  uint64_t az_unprotectable = 0;       // sends that could not be protected (sent synchronously)
  uint64_t az_faults = 0;              // writes to protected buffers (and receives into them)
  uint64_t az_copies = 0;              // faults resolved by copy-on-write
  uint64_t az_blocks = 0;              // faults that waited for the transfer
  uint64_t az_fallbacks = 0;           // switches to zcopy for too many faults
  uint64_t az_recv_early = 0;          // receives returned before their data landed
  // Pulled bcopy (docs/protocol.md).
  uint64_t pull_srcavail_sent = 0;     // pulled SrcAvails
  uint64_t bytes_sent_pull = 0;        // bytes the peer pulled from them
  uint64_t bytes_recv_pull = 0;        // bytes this side pulled
};

class Connection {
 public:
  ~Connection();  // Close() with the configured linger if still open
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // flags: MSG_DONTWAIT (and MSG_NOSIGNAL, ignored). `deadline`: an
  // absl::Time, or Deadline::After(timeout) (counted from the first wait).
  absl::StatusOr<size_t> Send(std::span<const iovec> iov, int flags = 0,
                              Deadline deadline = absl::InfiniteFuture());
  absl::StatusOr<size_t> Send(const void* buf, size_t len, int flags = 0,
                              Deadline deadline = absl::InfiniteFuture());
  // flags: MSG_PEEK, MSG_WAITALL, MSG_DONTWAIT.
  absl::StatusOr<size_t> Recv(std::span<const iovec> iov, int flags = 0,
                              Deadline deadline = absl::InfiniteFuture());
  absl::StatusOr<size_t> Recv(void* buf, size_t len, int flags = 0,
                              Deadline deadline = absl::InfiniteFuture());

  // SHUT_WR sends DisconnReq after the queued data (the peer's Recv returns
  // 0 after reading it all); SHUT_RD makes Recv return 0; SHUT_RDWR both.
  absl::Status Shutdown(int how);
  // Resets the connection: the peer gets ECONNRESET; queued data is dropped.
  void Abort();
  // Graceful: SHUT_WR, waits up to `linger` for queued data to leave, then
  // releases the endpoint. Idempotent.
  absl::Status Close();

  uint32_t readiness() const;
  // Called (outside engine locks, from whichever thread made progress) with
  // the new readiness each time it changes. Replaces any previous callback.
  void SetReadinessCallback(std::function<void(uint32_t)> cb);
  // The readiness bits whose changes fire the callback (every bit at
  // first; SetReadinessCallback starts a new watch of every bit). For a
  // caller that mirrors readiness and turns its mirror's bits off itself,
  // as the sockets layer does: it watches only the bits its mirror shows
  // off, so a busy connection (readable at every message) fires no callback
  // per message. A change made before a bit is watched again is not
  // reported: widen the watch first, then read readiness(). The handle
  // stays valid after the connection is closed (the callback needs no
  // reference to the connection to narrow it); null once closed.
  std::shared_ptr<std::atomic<uint32_t>> readiness_watch() const;

  ConnectionStats stats() const;
  // Whether this side may send asynchronously (AZ-SDP): both sides were in
  // azcopy mode at set-up and the provider has RDMA read and atomics.
  bool az_negotiated() const;
  // Whether this side's large bcopy sends may go pulled: the peer offered
  // it (its reads of our allocated memory are CPU copies) and
  // pull_threshold is not 0 (docs/protocol.md, "Pulled bcopy").
  bool pull_negotiated() const;
  absl::Status SetMode(Mode mode);
  absl::Status SetZcopyThreshold(size_t bytes);
  // Turns autocork on or off (ConnectionOptions::autocork); off sends a
  // held tail at once.
  void SetAutocork(bool on);
  // The time Close waits for queued data to leave (ConnectionOptions::linger).
  void SetLinger(absl::Duration linger);
  ConnectionOptions options() const;
  std::string peer_address() const;
  // The socket address the peer announced in its Hello ("" if none).
  std::string peer_socket_address() const;
  std::string local_address() const;
  // The error the connection failed with (OK while healthy).
  absl::Status error() const;

  // Test hooks: send raw bytes as one message (consumes a credit); release
  // messages held by options.test_hold.
  absl::Status TestInjectRaw(std::string bytes);
  void TestReleaseHeld();

 private:
  friend class Engine;
  friend class Listener;
  Connection(Engine* engine, ConnState* state) : engine_(engine), state_(state) {}
  // Shutdown's effect, under the engine lock (Close uses it too).
  void ShutdownLocked(ConnState* c, int how);
  // Recv into buffers this process is still sending from (AZ-SDP): waits
  // until they are writable or the stream has bytes for them (recv.cc).
  absl::Status SettleSendProtected(std::span<const iovec> iov, int flags,
                                   const Deadline& deadline);
  // state_ without the engine lock, only to return early: Close may clear
  // it from another thread at any time, so every method reads it again
  // under the lock before using it.
  ConnState* StateUnlocked() const { return __atomic_load_n(&state_, __ATOMIC_RELAXED); }
  Engine* engine_;
  ConnState* state_;  // written under the engine lock; nullptr once closed
};

}  // namespace zsock::sdp

#endif  // ZSOCK_CORE_SDP_CONNECTION_H_
