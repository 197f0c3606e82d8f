// libfabric failures as zsock statuses: a return code of an fi_* call
// (FiError) and an error entry read from a completion queue (CqError),
// each with the errno a caller can test and a hint a user can act on.
#ifndef ZSOCK_PROVIDERS_OFI_ERRORS_H_
#define ZSOCK_PROVIDERS_OFI_ERRORS_H_

#include <rdma/fi_eq.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace zsock::ofi {

// `call` returned `rc` (negative or positive FI_E* value); `fix` says what
// to do about it.
absl::Status FiError(int rc, absl::string_view call, absl::string_view fix = {});

// The status of CQ error entry `err` read from `cq`. `cq` is null once the
// endpoint bound to the CQ is closed: rxm 1.17's fi_cq_strerror reads the
// first endpoint on the CQ's endpoint list, and with none left it
// dereferences the list head, so then only fi_strerror describes it.
absl::Status CqError(fid_cq* cq, const fi_cq_err_entry* err);

}  // namespace zsock::ofi

#endif  // ZSOCK_PROVIDERS_OFI_ERRORS_H_
