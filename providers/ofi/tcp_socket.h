// FindTcpSocket: the fd of a TCP connection in this process, found by its
// addresses. For ofi:tcp's cq_wait=sockets (docs/ofi.md "Waiting"):
// libfabric 1.17 hands out no endpoint's socket (tcp's fi_control has no
// FI_GETWAIT for endpoints), so zsock finds it to put it in its wait set.
#ifndef ZSOCK_PROVIDERS_OFI_TCP_SOCKET_H_
#define ZSOCK_PROVIDERS_OFI_TCP_SOCKET_H_

#include <sys/socket.h>

#include "core/fd.h"

namespace zsock::ofi {

// A duplicate (close-on-exec, the caller's) of the fd of the socket in this
// process whose own address is `local` and whose peer is `peer` (IPv4 or
// IPv6; one TCP connection has one such socket per host, and both ends may
// be in this process, with the addresses swapped), or an invalid Fd when
// there is none or it cannot be duplicated (errno says why).
//
// A new socket took the lowest free fd number when it was made, and few
// fds came after it, so the numbers within `window` of the lowest free one
// now are probed first, outward; then every fd, listed from /proc/self/fd.
// A scan of every fd in order made setting up N connections quadratic: 400
// took 3.9 s (6 s of system time) against 1.3 s with FI_WAIT_FD, and
// listing /proc/self/fd for each one still cost 0.3 ms apiece. The match is
// checked again on the duplicate, in case another thread closed the fd and
// reused its number meanwhile.
Fd FindTcpSocket(const sockaddr_storage& local, const sockaddr_storage& peer, int window = 128);

}  // namespace zsock::ofi

#endif  // ZSOCK_PROVIDERS_OFI_TCP_SOCKET_H_
