// zsock's error type: see status.h.
#include "core/status.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/log.h"

namespace zsock {
namespace {

constexpr char kErrnoPayload[] = "zsock.dev/errno";

absl::StatusCode CodeForErrno(int err) {
  switch (err) {
    case 0: return absl::StatusCode::kUnknown;
    case EAGAIN: return absl::StatusCode::kUnavailable;
    case ENOMEM:
    case ENOBUFS:
    case ENOSPC:
    case EMFILE:
    case ENFILE: return absl::StatusCode::kResourceExhausted;
    case EPERM:
    case EACCES: return absl::StatusCode::kPermissionDenied;
    case EINVAL:
    case EFAULT:
    case EMSGSIZE: return absl::StatusCode::kInvalidArgument;
    case ENOENT:
    case ENODEV:
    case ENXIO:
    case ECONNREFUSED: return absl::StatusCode::kUnavailable;
    case ETIMEDOUT: return absl::StatusCode::kDeadlineExceeded;
    case ECONNRESET:
    case EPIPE:
    case ESRCH:
    case ENOTCONN: return absl::StatusCode::kAborted;
    case ENOSYS:
    case EOPNOTSUPP: return absl::StatusCode::kUnimplemented;
    case EEXIST:
    case EADDRINUSE: return absl::StatusCode::kAlreadyExists;
    case ECANCELED: return absl::StatusCode::kCancelled;
    default: return absl::StatusCode::kInternal;
  }
}

int ErrnoForCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk: return 0;
    case absl::StatusCode::kUnavailable: return EAGAIN;
    case absl::StatusCode::kResourceExhausted: return ENOMEM;
    case absl::StatusCode::kPermissionDenied: return EPERM;
    case absl::StatusCode::kInvalidArgument: return EINVAL;
    case absl::StatusCode::kOutOfRange: return EINVAL;
    case absl::StatusCode::kNotFound: return ENOENT;
    case absl::StatusCode::kDeadlineExceeded: return ETIMEDOUT;
    case absl::StatusCode::kAborted: return ECONNRESET;
    case absl::StatusCode::kUnimplemented: return EOPNOTSUPP;
    case absl::StatusCode::kAlreadyExists: return EEXIST;
    case absl::StatusCode::kCancelled: return ECANCELED;
    case absl::StatusCode::kFailedPrecondition: return EINVAL;
    default: return EIO;
  }
}

// MakeError's status, not logged.
absl::Status BuildError(absl::StatusCode code, int sys_errno, absl::string_view what,
                        absl::string_view fix) {
  std::string msg(what);
  if (sys_errno != 0) absl::StrAppend(&msg, ": ", std::strerror(sys_errno));
  if (!fix.empty()) absl::StrAppend(&msg, "; fix: ", fix);
  absl::Status status(code, msg);
  if (sys_errno != 0) {
    status.SetPayload(kErrnoPayload, absl::Cord(absl::StrCat(sys_errno)));
  }
  return status;
}

}  // namespace

absl::Status MakeError(absl::StatusCode code, int sys_errno,
                       absl::string_view what, absl::string_view fix,
                       std::source_location loc) {
  absl::Status status = BuildError(code, sys_errno, what, fix);
  if (LogLevel::kDebug <= CurrentLogLevel()) {
    LogLine(LogLevel::kDebug, loc, status.ToString());
  }
  return status;
}

absl::Status ErrnoError(int sys_errno, absl::string_view what,
                        absl::string_view fix, std::source_location loc) {
  return MakeError(CodeForErrno(sys_errno), sys_errno, what, fix, loc);
}

int StatusErrno(const absl::Status& status) {
  if (status.ok()) return 0;
  if (auto payload = status.GetPayload(kErrnoPayload); payload.has_value()) {
    // A few digits: the cord holds them inline, and they fit a short
    // string's own buffer, so reading them allocates nothing.
    int err = 0;
    if (absl::SimpleAtoi(std::string(*payload), &err) && err > 0) return err;
  }
  return ErrnoForCode(status.code());
}

void PreparedError::Prepare() const {
  if (built_.load(std::memory_order_acquire) == nullptr) Build();
}

const absl::Status* PreparedError::Build() const {
  const absl::StatusCode code =
      code_ == kCodeFromErrno ? CodeForErrno(errno_) : static_cast<absl::StatusCode>(code_);
  auto* s = new absl::Status(BuildError(code, errno_, what_, fix_));
  const absl::Status* expected = nullptr;
  if (built_.compare_exchange_strong(expected, s, std::memory_order_acq_rel)) return s;
  delete s;  // another thread built it first
  return expected;
}

}  // namespace zsock
