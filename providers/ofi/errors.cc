// libfabric return codes and CQ error entries as zsock statuses.
#include "providers/ofi/errors.h"

#include <rdma/fi_errno.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace zsock::ofi {

absl::Status FiError(int rc, absl::string_view call, absl::string_view fix) {
  int err = rc < 0 ? -rc : rc;
  // FI_E* values below 256 are errno values.
  int sys = err < 256 ? err : EIO;
  return MakeError(sys == EAGAIN ? absl::StatusCode::kUnavailable
                                 : (sys == ENODATA || sys == ENOSYS || sys == EOPNOTSUPP)
                                       ? absl::StatusCode::kUnavailable
                                       : absl::StatusCode::kInternal,
                   sys, absl::StrCat(call, " failed: ", fi_strerror(err)), fix);
}

absl::Status CqError(fid_cq* cq, const fi_cq_err_entry* err) {
  char buf[256] = {};
  const char* text =
      cq != nullptr ? fi_cq_strerror(cq, err->prov_errno, err->err_data, buf, sizeof(buf)) : nullptr;
  // Providers disagree on the sign (shm 1.17 reports -FI_ETRUNC).
  int e = err->err < 0 ? -err->err : err->err;
  if (e == FI_ETRUNC) {
    return MakeError(absl::StatusCode::kOutOfRange, EMSGSIZE,
                     absl::StrCat("a message of ", err->len + err->olen,
                                  " bytes met a smaller receive and was discarded"),
                     "post receive buffers as large as the largest message");
  }
  if (e == FI_ECANCELED) {
    return MakeError(absl::StatusCode::kCancelled, ECANCELED, "the operation was cancelled");
  }
  return MakeError(absl::StatusCode::kAborted, e < 256 ? e : EIO,
                   absl::StrCat("ofi operation failed: ", fi_strerror(e), " (provider: ",
                                text ? text : "?", ")"),
                   e == FI_EACCES || e == FI_EINVAL
                       ? "the target refused the access: check the remote key, range and rights"
                       : "the peer may have gone away; reconnect");
}

}  // namespace zsock::ofi
