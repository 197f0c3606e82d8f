// UcsError: the table from UCX statuses to zsock's status codes and errnos.
#include "providers/ucx/ucs_error.h"

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace zsock::ucx {
namespace {

struct Mapped {
  absl::StatusCode code;
  int err;
};

Mapped Map(ucs_status_t st) {
  switch (st) {
    case UCS_ERR_MESSAGE_TRUNCATED: return {absl::StatusCode::kOutOfRange, EMSGSIZE};
    case UCS_ERR_CANCELED: return {absl::StatusCode::kCancelled, ECANCELED};
    case UCS_ERR_NO_MEMORY: return {absl::StatusCode::kResourceExhausted, ENOMEM};
    case UCS_ERR_NO_RESOURCE: return {absl::StatusCode::kUnavailable, EAGAIN};
    case UCS_ERR_NO_DEVICE: return {absl::StatusCode::kUnavailable, ENODEV};
    case UCS_ERR_UNREACHABLE: return {absl::StatusCode::kUnavailable, EHOSTUNREACH};
    case UCS_ERR_SHMEM_SEGMENT: return {absl::StatusCode::kPermissionDenied, EACCES};
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_IO_ERROR:
      return {absl::StatusCode::kAborted, ECONNRESET};
    case UCS_ERR_TIMED_OUT: return {absl::StatusCode::kDeadlineExceeded, ETIMEDOUT};
    case UCS_ERR_INVALID_PARAM: return {absl::StatusCode::kInvalidArgument, EINVAL};
    case UCS_ERR_UNSUPPORTED: return {absl::StatusCode::kUnimplemented, EOPNOTSUPP};
    default: return {absl::StatusCode::kInternal, EIO};
  }
}

}  // namespace

absl::Status UcsError(ucs_status_t st, absl::string_view what, absl::string_view fix,
                      std::source_location loc) {
  const Mapped m = Map(st);
  return MakeError(m.code, m.err, absl::StrCat(what, " (UCX: ", ucs_status_string(st), ")"), fix,
                   loc);
}

}  // namespace zsock::ucx
