// FindTcpSocket: the fd of a TCP connection in this process, found by its
// addresses. For ofi:tcp's cq_wait=sockets (docs/ofi.md "Waiting"):
// libfabric 1.17 hands out no endpoint's socket (tcp's fi_control has no
// FI_GETWAIT for endpoints), so zsock finds it to put it in its wait set.
#ifndef ZSOCK_PROVIDERS_OFI_TCP_SOCKET_H_
#define ZSOCK_PROVIDERS_OFI_TCP_SOCKET_H_

#include <sys/socket.h>

#include <cstdint>

#include "core/fd.h"

namespace zsock::ofi {

// A duplicate (close-on-exec, the caller's) of the fd of the socket in this
// process whose own address is `local` and whose peer is `peer` (IPv4 or
// IPv6; one TCP connection has one such socket per host, and both ends may
// be in this process, with the addresses swapped), or an invalid Fd when
// there is none or it cannot be duplicated (errno says why).
//
// A new socket took the lowest free fd number when it was made, and the
// fds made since are few, so the search goes outward from the lowest free
// number now, one system call per fd: down to 0, and up until a long run
// of closed numbers (at most `window` steps each way); then, if still not
// found, every fd listed from /proc/self/fd. A scan of every fd in order
// made setting up N connections quadratic, and listing /proc/self/fd costs
// a system call's worth per fd, so the listing is the last resort
// (measured, docs/ofi.md "Waiting"). The match is checked again on the
// duplicate, in case another thread closed the fd and reused its number
// meanwhile.
Fd FindTcpSocket(const sockaddr_storage& local, const sockaddr_storage& peer, int window = 1 << 20);

// How far the owner of TCP socket `fd` has read: `*consumed`, the bytes
// received and taken from the socket (the kernel's count of bytes received,
// TCP_INFO, minus those still queued), and `*unread`, those still queued
// (FIONREAD). False if the kernel does not say. The queue is read first, so
// a byte arriving between the two calls can make `*consumed` look larger,
// never smaller.
bool TcpReadProgress(int fd, uint64_t* consumed, int* unread);

}  // namespace zsock::ofi

#endif  // ZSOCK_PROVIDERS_OFI_TCP_SOCKET_H_
