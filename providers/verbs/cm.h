// The verbs provider's helpers around librdmacm and addresses: errors of
// failed calls, numeric socket addresses, and waiting for the connection
// manager's events on an id's own (non-blocking) event channel.
#ifndef ZSOCK_PROVIDERS_VERBS_CM_H_
#define ZSOCK_PROVIDERS_VERBS_CM_H_

#include <rdma/rdma_cma.h>
#include <sys/socket.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "providers/verbs/settings.h"

namespace zsock::verbs {

// "CALL failed: <strerror>", with `fix`.
absl::Status VerbsErrno(int err, absl::string_view call, absl::string_view fix = {});

// A numeric host and port as a socket address.
absl::StatusOr<sockaddr_storage> ToSockaddr(const HostPort& hp);
// "IP:PORT" / "[IPv6]:PORT" of `sa` ("?" for none).
std::string AddressOf(sockaddr* sa);
void SetNonBlocking(int fd);

// A new rdma_cm id (TCP port space) on its own non-blocking event channel.
absl::Status NewCmId(rdma_event_channel** ch, rdma_cm_id** id);

// Waits for the next CM event on `ch` until `deadline`.
absl::StatusOr<rdma_cm_event*> NextCmEvent(rdma_event_channel* ch, absl::Time deadline,
                                           absl::string_view what);
// Waits for a specific event; anything else is an error naming it. With
// `private_data`, the event's connection private data is copied there.
absl::Status ExpectCmEvent(rdma_event_channel* ch, rdma_cm_event_type want, absl::Time deadline,
                           absl::string_view what, std::string* private_data = nullptr);

}  // namespace zsock::verbs

#endif  // ZSOCK_PROVIDERS_VERBS_CM_H_
