// AcceptUntil: one connection from a non-blocking listening socket, waiting
// (in poll, not spinning) until a deadline. Shared by the providers whose
// listeners are sockets (unet's Unix socket, ofi's and ucx's TCP bootstrap).
#ifndef ZSOCK_CORE_ACCEPT_H_
#define ZSOCK_CORE_ACCEPT_H_

#include <sys/socket.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/fd.h"

namespace zsock {

// Accepts on `listen_fd` with accept4(SOCK_CLOEXEC | extra_flags), retrying
// interrupted and aborted attempts, until `deadline` (then DeadlineExceeded).
// `what` names the listener in errors ("unet address 'x'"). Fills *peer
// with the peer's address when given.
absl::StatusOr<Fd> AcceptUntil(int listen_fd, absl::Time deadline, absl::string_view what,
                               int extra_flags = 0, sockaddr_storage* peer = nullptr);

}  // namespace zsock

#endif  // ZSOCK_CORE_ACCEPT_H_
