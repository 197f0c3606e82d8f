/* zsock.h: BSD sockets over SDP. A sockets program ports by prefixing its
 * calls with zs_: every function has the signature and errno semantics of
 * the libc call it is named after. AF_INET/AF_INET6 SOCK_STREAM sockets are
 * zsock sockets (SDP over the configured provider: ZSOCK_PROVIDER or the
 * config file; data path ZSOCK_MODE=bcopy|zcopy|azcopy or ZSOCK_SO_MODE); every
 * other fd (files, pipes, AF_UNIX, UDP, kernel TCP sockets) is passed to
 * libc unchanged, so prefixing every call is safe.
 *
 * Each zsock socket is a real file descriptor whose readiness mirrors the
 * socket: the program's own poll/select/epoll work on it (level- and
 * edge-triggered; edge-triggered watchers read until EAGAIN, as epoll(7)
 * asks). zs_poll is exact and cheaper for zsock fds. See docs/sockets.md. */
#ifndef ZSOCK_SOCKETS_ZSOCK_H_
#define ZSOCK_SOCKETS_ZSOCK_H_

#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* zsock's own socket options: setsockopt(fd, SOL_ZSOCK, ...). */
#define SOL_ZSOCK 0x7a73
#define ZSOCK_SO_MODE 1            /* int: 0 = bcopy, 1 = zcopy, 2 = azcopy (AZ-SDP) */
#define ZSOCK_SO_ZCOPY_THRESHOLD 2 /* int: bytes at and above which zcopy is used */
#define ZSOCK_SO_AUTOCORK 3        /* int: 1 = coalesce small sends while the peer owes an
                                      acknowledgement (default: config key autocork), 0 = off */

int zs_socket(int domain, int type, int protocol);
int zs_bind(int fd, const struct sockaddr* addr, socklen_t len);
int zs_listen(int fd, int backlog);
int zs_accept(int fd, struct sockaddr* addr, socklen_t* len);
int zs_accept4(int fd, struct sockaddr* addr, socklen_t* len, int flags);
int zs_connect(int fd, const struct sockaddr* addr, socklen_t len);
ssize_t zs_send(int fd, const void* buf, size_t len, int flags);
ssize_t zs_recv(int fd, void* buf, size_t len, int flags);
ssize_t zs_read(int fd, void* buf, size_t len);
ssize_t zs_write(int fd, const void* buf, size_t len);
ssize_t zs_readv(int fd, const struct iovec* iov, int iovcnt);
ssize_t zs_writev(int fd, const struct iovec* iov, int iovcnt);
ssize_t zs_sendmsg(int fd, const struct msghdr* msg, int flags);
ssize_t zs_recvmsg(int fd, struct msghdr* msg, int flags);
int zs_shutdown(int fd, int how);
int zs_close(int fd);
int zs_setsockopt(int fd, int level, int name, const void* value, socklen_t len);
int zs_getsockopt(int fd, int level, int name, void* value, socklen_t* len);
int zs_getsockname(int fd, struct sockaddr* addr, socklen_t* len);
int zs_getpeername(int fd, struct sockaddr* addr, socklen_t* len);
int zs_fcntl(int fd, int cmd, ... /* arg */);
int zs_poll(struct pollfd* fds, nfds_t nfds, int timeout);

/* 1 if fd is a zsock socket, else 0. */
int zs_is_zsock(int fd);

#ifdef __cplusplus
}
#endif

#endif /* ZSOCK_SOCKETS_ZSOCK_H_ */
