// zsock error type: absl::Status carrying the provider's own errno.
//
// Every error zsock returns is an absl::Status whose message names the cause
// and, where one exists, the fix ("... ; fix: ..."). The errno the failing
// system or provider call reported travels as a payload, so the sockets layer
// can hand it to applications unchanged. The function that first detects an
// error builds it with one of these helpers, which also logs it (debug level)
// with its source location; callers above pass it on without logging again.
#ifndef ZSOCK_CORE_STATUS_H_
#define ZSOCK_CORE_STATUS_H_

#include <source_location>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zsock {

// Builds an error with `code`, a message "what[: strerror(sys_errno)][; fix: fix]"
// and `sys_errno` attached (0 = none).
absl::Status MakeError(absl::StatusCode code, int sys_errno,
                       absl::string_view what, absl::string_view fix = {},
                       std::source_location loc = std::source_location::current());

// Like MakeError, with the status code derived from `sys_errno`
// (EAGAIN -> Unavailable, ENOMEM -> ResourceExhausted, EPERM -> PermissionDenied, ...).
absl::Status ErrnoError(int sys_errno, absl::string_view what,
                        absl::string_view fix = {},
                        std::source_location loc = std::source_location::current());

// The errno carried by `status`; for statuses without one, a best mapping of
// its code (Unavailable -> EAGAIN, ...); 0 for OK.
int StatusErrno(const absl::Status& status);

}  // namespace zsock

#endif  // ZSOCK_CORE_STATUS_H_
