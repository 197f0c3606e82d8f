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

#include <atomic>
#include <source_location>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

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
// its code (Unavailable -> EAGAIN, ...); 0 for OK. Allocates nothing and
// takes no lock (async-signal-safe).
int StatusErrno(const absl::Status& status);

// An error built once and then shared, for paths that must stay
// async-signal-safe (zs_send may run in a signal handler, as send(2) may):
// Get() returns a copy, which only counts a reference; building one
// allocates. Prepare() must run first, where allocating is fine (Get()
// builds it otherwise). The error is what MakeError(code, sys_errno, what,
// fix) makes, with ErrnoError's code when none is given; it is not logged
// (its caller logs, if it may). Constant-initialized, so it can be a
// namespace-scope `constinit` object.
class PreparedError {
 public:
  constexpr PreparedError(int sys_errno, const char* what)
      : code_(kCodeFromErrno), errno_(sys_errno), what_(what), fix_("") {}
  constexpr PreparedError(absl::StatusCode code, int sys_errno, const char* what,
                          const char* fix)
      : code_(static_cast<int>(code)), errno_(sys_errno), what_(what), fix_(fix) {}
  PreparedError(const PreparedError&) = delete;
  PreparedError& operator=(const PreparedError&) = delete;

  void Prepare() const;
  absl::Status Get() const {
    const absl::Status* s = built_.load(std::memory_order_acquire);
    return s != nullptr ? *s : *Build();
  }

 private:
  static constexpr int kCodeFromErrno = -1;
  const absl::Status* Build() const;

  const int code_;
  const int errno_;
  const char* const what_;
  const char* const fix_;
  // Never freed: a copy may be in flight at exit.
  mutable std::atomic<const absl::Status*> built_{nullptr};
};

}  // namespace zsock

#endif  // ZSOCK_CORE_STATUS_H_
