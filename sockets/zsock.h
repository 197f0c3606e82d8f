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
#include <stdint.h>
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
#define ZSOCK_SO_STATS 4           /* read-only struct zs_stats: the connection's counters */

/* The counters of one connected socket: getsockopt(fd, SOL_ZSOCK,
 * ZSOCK_SO_STATS, &st, &len). Fields are only ever appended: a program
 * built with a shorter struct gets its prefix, and *len says how many bytes
 * were written (as with TCP_INFO). Counters count from the connection's
 * start; queued_bytes and held_bytes are current values. docs/sockets.md
 * says what each one means. */
struct zs_stats {
  uint64_t bytes_sent_bcopy;     /* payload sent in Data messages (copied) */
  uint64_t bytes_sent_srcavail;  /* payload the peer pulled by RDMA read (zcopy, azcopy) */
  uint64_t bytes_sent_sinkavail; /* payload RDMA-written into the peer's buffer */
  uint64_t bytes_recv_bcopy;
  uint64_t bytes_recv_srcavail;
  uint64_t bytes_recv_sinkavail;
  uint64_t messages_sent;        /* SDP messages of every kind */
  uint64_t messages_received;
  uint64_t coalesced_sends;      /* sends appended to a queued Data message */
  uint64_t credit_stalls;        /* times Data waited for the peer's credits */
  uint64_t credit_updates_sent;  /* Data messages without payload */
  uint64_t autocork_holds;       /* small Data tails held back (autocork) */
  uint64_t ack_requests;         /* Data flagged AckReq (autocork) */
  uint64_t ack_answers;          /* empty Data sent only to answer an AckReq */
  uint64_t queued_bytes;         /* now: accepted by send, not yet posted */
  uint64_t held_bytes;           /* now: of those, the tail autocork holds */
  uint64_t srcavail_sent;
  uint64_t srcavail_cancels;
  uint64_t sendsmall;            /* SrcAvails finished by copying */
  uint64_t sinkavail_sent;
  uint64_t sinkavail_cancels;
  uint64_t sinkavail_void;       /* SinkAvails overtaken by data */
  uint64_t sinkavail_received;
  uint64_t cancels_received;
  uint64_t rdma_fallbacks;       /* refused RDMA read/write, finished by copying */
  uint64_t az_srcavail_sent;     /* AZ-SDP: asynchronous SrcAvails */
  uint64_t az_bytes;             /* AZ-SDP: bytes they announced */
  uint64_t az_hybrid_bcopy;      /* AZ-SDP: unaligned head and tail bytes sent by copying */
  uint64_t az_unprotectable;     /* AZ-SDP: sends that could not be protected */
  uint64_t az_faults;            /* AZ-SDP: accesses to protected buffers */
  uint64_t az_copies;            /* AZ-SDP: faults resolved by copy-on-write */
  uint64_t az_blocks;            /* AZ-SDP: faults that waited for the transfer */
  uint64_t az_fallbacks;         /* AZ-SDP: switches to zcopy after too many faults */
  uint64_t az_recv_early;        /* AZ-SDP: receives returned before their data landed */
  uint64_t pull_srcavail_sent;   /* pulled bcopy: SrcAvails of copied bytes (docs/protocol.md) */
  uint64_t bytes_sent_pull;      /* pulled bcopy: payload the peer pulled from our copy */
  uint64_t bytes_recv_pull;      /* pulled bcopy: payload this side pulled */
};

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
