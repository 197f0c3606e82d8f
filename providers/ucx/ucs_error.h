// UCX status codes as zsock errors: UcsError maps a ucs_status_t to the
// absl status code and errno the sockets layer hands to applications, and
// names UCX's own text for it in the message.
#ifndef ZSOCK_PROVIDERS_UCX_UCS_ERROR_H_
#define ZSOCK_PROVIDERS_UCX_UCS_ERROR_H_

#include <ucp/api/ucp.h>

#include <source_location>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace zsock::ucx {

// `what` failed with UCX status `st`; `fix` says what to do about it.
absl::Status UcsError(ucs_status_t st, absl::string_view what, absl::string_view fix = {},
                      std::source_location loc = std::source_location::current());

}  // namespace zsock::ucx

#endif  // ZSOCK_PROVIDERS_UCX_UCS_ERROR_H_
