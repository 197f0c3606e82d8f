// Opening event queues and reading connection events with a deadline.
#include "providers/ofi/event_queue.h"

#include <poll.h>
#include <rdma/fi_errno.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status.h"
#include "providers/ofi/errors.h"

namespace zsock::ofi {
namespace {

// The status of an error entry of an event queue.
absl::Status EqError(const fi_eq_err_entry& err, absl::string_view what) {
  int e = err.err < 0 ? -err.err : err.err;
  return MakeError(e == ECONNREFUSED ? absl::StatusCode::kUnavailable : absl::StatusCode::kAborted,
                   e < 256 ? e : EIO,
                   absl::StrCat(what, ": the event queue reported ", fi_strerror(e),
                                " (fi_eq_readerr)"),
                   e == ECONNREFUSED ? "start a listener there first"
                                     : "check that the peer runs zsock with the same ofi provider");
}

}  // namespace

absl::Status OpenEq(fid_fabric* fabric, fid_eq** eq, int* fd) {
  fi_eq_attr attr{};
  attr.size = 64;
  attr.wait_obj = FI_WAIT_FD;
  int rc = fi_eq_open(fabric, &attr, eq, nullptr);
  if (rc != 0) return FiError(rc, "fi_eq_open", "raise the fd limit (ulimit -n)");
  if ((rc = fi_control(&(*eq)->fid, FI_GETWAIT, fd)) != 0) {
    fi_close(&(*eq)->fid);
    *eq = nullptr;
    return FiError(rc, "fi_control(FI_GETWAIT) on an event queue");
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> EqNext(DomainMutex* dom_mu, fid_eq* eq, int fd, CmEvent* ev, size_t* len,
                                absl::Time deadline, absl::string_view what, bool* error_entry) {
  for (;;) {
    uint32_t event = 0;
    ssize_t n;
    {
      DomLock lock(dom_mu);
      n = fi_eq_read(eq, &event, ev->raw, sizeof(ev->raw), 0);
      if (n == -FI_EAVAIL) {
        fi_eq_err_entry err{};
        if (fi_eq_readerr(eq, &err, 0) > 0) {
          if (error_entry != nullptr) *error_entry = true;
          return EqError(err, what);
        }
        continue;
      }
    }
    if (n > 0) {
      *len = static_cast<size_t>(n);
      return event;
    }
    if (n != -FI_EAGAIN) return FiError(static_cast<int>(n), absl::StrCat(what, ": fi_eq_read"));
    int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) {
      return MakeError(absl::StatusCode::kDeadlineExceeded, ETIMEDOUT,
                       absl::StrCat(what, ": no connection event in time"),
                       "check that the peer runs zsock with the same ofi provider");
    }
    // The provider may need fi_eq_read itself to progress connections:
    // sleep on the fd in bounded steps.
    pollfd pfd{fd, POLLIN, 0};
    ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 10)));
  }
}

}  // namespace zsock::ofi
