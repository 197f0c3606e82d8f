// sdp::Deadline: when a blocking call gives up, resolved to a point in time
// only if the call has to wait.
//
// A socket timeout (SO_RCVTIMEO, SO_SNDTIMEO) is relative to the call.
// Turning it into absl::Now() + timeout on every call reads the clock for
// deadlines that a call with its data already there never looks at, and
// clock reads are dear on VMs (measured: a noticeable part of a small
// ping-pong's time). Deadline::After keeps the duration and reads the
// clock at the first wait, so the timeout counts from a moment no earlier
// than the call (it never expires early).
#pragma once

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace zsock::sdp {

class Deadline {
 public:
  // An absolute deadline, as before (InfiniteFuture: never; InfinitePast:
  // do not wait). Implicit, so callers pass an absl::Time as they did.
  Deadline(absl::Time at) : at_(at) {}  // NOLINT(google-explicit-constructor)
  // `timeout` from the first wait (InfiniteDuration: never).
  static Deadline After(absl::Duration timeout) {
    Deadline d(absl::InfiniteFuture());
    if (timeout != absl::InfiniteDuration()) {
      d.timeout_ = timeout;
      d.resolved_ = false;
    }
    return d;
  }

  // Read without the clock.
  bool never() const { return resolved_ && at_ == absl::InfiniteFuture(); }
  bool no_wait() const { return resolved_ && at_ == absl::InfinitePast(); }
  bool resolved() const { return resolved_; }
  // The point in time; the first call on a relative deadline reads the clock.
  absl::Time Get() const {
    if (!resolved_) {
      at_ = absl::Now() + timeout_;
      resolved_ = true;
    }
    return at_;
  }

 private:
  mutable absl::Time at_;
  absl::Duration timeout_;
  mutable bool resolved_ = true;
};

}  // namespace zsock::sdp
