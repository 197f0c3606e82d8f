// Internal: one Connection::Send or Recv call in progress, as send.cc and
// recv.cc drive it and the data paths' steps (bcopy, zcopy, AZ-SDP,
// pulled) advance it. Everything here is used with the engine mutex held.
#ifndef ZSOCK_CORE_SDP_CALLS_H_
#define ZSOCK_CORE_SDP_CALLS_H_

#include <sys/socket.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/sdp/conn_state.h"
#include "core/sdp/deadline.h"

namespace zsock::sdp {

// MSG_DONTWAIT's deadline, an lvalue so that `dontwait ? kNoWait :
// deadline` refers to the caller's Deadline instead of copying it (a copy
// would start a relative timeout afresh).
inline const Deadline kNoWait{absl::InfinitePast()};

// A Send or Recv in progress on a connection, from the first engine lock
// taken on it to the last one released (a scope inside the lock): Close
// lets such calls leave before the state goes.
class CallScope {
 public:
  explicit CallScope(ConnState* c) : c_(c) { ++c_->calls.active; }
  ~CallScope() { c_->LeaveCall(); }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  ConnState* c_;
};

// Walks an iovec array.
struct IovCursor {
  std::span<const iovec> iov;
  size_t i = 0, off = 0;
  explicit IovCursor(std::span<const iovec> v) : iov(v) { Skip(); }
  void Skip() {
    while (i < iov.size() && off >= iov[i].iov_len) {
      ++i;
      off = 0;
    }
  }
  bool done() const { return i >= iov.size(); }
  uint8_t* ptr() const { return static_cast<uint8_t*>(iov[i].iov_base) + off; }
  size_t space() const { return iov[i].iov_len - off; }
  void Advance(size_t n) {
    off += n;
    Skip();
  }
};

// A Send: the piece of the caller's buffers it is at, and what it took.
// The caller's iovecs are sent one at a time, each as a piece [p, p + n).
struct SendCall {
  SendCall(const Deadline& d, bool dw, size_t th) : deadline(d), dontwait(dw), threshold(th) {}
  const Deadline& deadline;  // the caller's (a wait uses it only if !dontwait)
  const bool dontwait;
  const size_t threshold;    // zcopy_threshold, at least 1
  size_t total = 0;          // bytes taken (sent, queued or announced)
  absl::Status end;          // why the call ends (Step::kEnd)
  const uint8_t* p = nullptr;
  size_t n = 0, off = 0;     // of the piece: its length, bytes taken
  size_t force_bcopy = 0;    // the next bytes of the piece that go by bcopy
  bool az_sync = false;      // AZ-SDP could not protect this piece: send it synchronously

  void Start(const iovec& v) {
    p = static_cast<const uint8_t*>(v.iov_base);
    n = v.iov_len;
    off = 0;
    force_bcopy = 0;
    az_sync = false;
  }
  const uint8_t* q() const { return p + off; }  // the next byte
  size_t rem() const { return n - off; }        // bytes of the piece left
  void Took(size_t k) {
    off += k;
    total += k;
  }
  Step End(absl::Status st) {
    end = std::move(st);
    return Step::kEnd;
  }
  // What the call returns when it ends early: the bytes taken, if any.
  absl::StatusOr<size_t> Partial(absl::Status st) const {
    if (total > 0) return total;
    return st;
  }
};

// A Recv: where it is in the caller's buffers and what it copied.
struct RecvCall {
  RecvCall(std::span<const iovec> iov, int flags, const Deadline& d, size_t rma)
      : cur(iov),
        deadline(d),
        dontwait(flags & MSG_DONTWAIT),
        peek(flags & MSG_PEEK),
        waitall((flags & MSG_WAITALL) && !peek),
        max_rma(rma) {}
  IovCursor cur;
  const Deadline& deadline;
  const bool dontwait, peek, waitall;
  const size_t max_rma;      // bytes one RDMA read moves at most
  size_t copied = 0;
  absl::Status end;          // why the call ends (kEnd)

  void Took(size_t k) {
    cur.Advance(k);
    copied += k;
  }
  Step End(absl::Status st) {
    end = std::move(st);
    return Step::kEnd;
  }
  SegStep EndSeg(absl::Status st) {
    end = std::move(st);
    return SegStep::kEnd;
  }
  // What the call returns when it ends early: the bytes copied, if any.
  absl::StatusOr<size_t> Result() const {
    if (copied > 0) return copied;
    return end;
  }
};

}  // namespace zsock::sdp

#endif  // ZSOCK_CORE_SDP_CALLS_H_
