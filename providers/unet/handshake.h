// unet's hello exchange. Each side of a new connection sends one Hello
// (segment.h) on the connection's Unix socket with four fds (SCM_RIGHTS: its
// segment, its CQ's eventfd, its key table, its CQ's bell) and its
// credentials (SCM_CREDENTIALS), from which the peer learns its pid.
// RecvHello refuses a hello with another version, missing fds or
// parameters ValidHelloParams rejects, before anything is mapped.
// UnetFabric::Handshake (handshake.cc) builds the endpoint from the two.
#ifndef ZSOCK_PROVIDERS_UNET_HANDSHAKE_H_
#define ZSOCK_PROVIDERS_UNET_HANDSHAKE_H_

#include <sys/types.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/fd.h"
#include "providers/unet/os.h"
#include "providers/unet/segment.h"

namespace zsock::unet {

// The hello's fds: segment, CQ eventfd, key table, CQ bell.
inline constexpr size_t kHelloFds = 4;
static_assert(kHelloFds <= kMaxPassedFds);

// Sends our hello with `fds` and our credentials.
absl::Status SendHello(int sock, const Hello& hello, const int fds[kHelloFds]);

// Waits until `deadline` for the peer's hello; on success `hello`, `fds`
// and `peer_pid` hold what it sent, checked.
absl::Status RecvHello(int sock, absl::Time deadline, Hello* hello, Fd fds[kHelloFds],
                       pid_t* peer_pid);

}  // namespace zsock::unet

#endif  // ZSOCK_PROVIDERS_UNET_HANDSHAKE_H_
