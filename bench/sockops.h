// SockOps: the BSD socket calls zsock_bench drives, as a table of function
// pointers, so one harness measures kernel TCP and zsock sockets through the
// identical code path.
//
// Every entry has the libc signature and errno semantics. KernelTcpOps() is
// libc itself, KernelTcpBusyOps() libc in loops that never sleep.
// ZsockOps() is the zsock sockets API (sockets/zsock.h). The provider and
// the data path of a zsock socket are chosen by ZSOCK_PROVIDER and
// ZSOCK_MODE, which the harness sets in each forked child before its first
// call through the table.
#ifndef ZSOCK_BENCH_SOCKOPS_H_
#define ZSOCK_BENCH_SOCKOPS_H_

#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace zsock::bench {

struct SockOps {
  const char* name;
  int (*socket)(int domain, int type, int protocol);
  int (*bind)(int fd, const struct sockaddr* addr, socklen_t len);
  int (*listen)(int fd, int backlog);
  int (*accept)(int fd, struct sockaddr* addr, socklen_t* len);
  int (*connect)(int fd, const struct sockaddr* addr, socklen_t len);
  ssize_t (*send)(int fd, const void* buf, size_t len, int flags);
  ssize_t (*recv)(int fd, void* buf, size_t len, int flags);
  int (*close)(int fd);
  int (*setsockopt)(int fd, int level, int name, const void* value, socklen_t len);
  int (*getsockname)(int fd, struct sockaddr* addr, socklen_t* len);
  int (*poll)(struct pollfd* fds, nfds_t nfds, int timeout_ms);
  int (*fcntl)(int fd, int cmd, ...);
  // The connection's counters, cumulative, by name (zsock: ZSOCK_SO_STATS);
  // nullptr where the transport has none (kernel TCP). Empty on error.
  std::vector<std::pair<const char*, uint64_t>> (*stats)(int fd);
};

// Kernel TCP: the libc calls.
const SockOps& KernelTcpOps();

// Kernel TCP busy-polled (bench/sockops_busy.cc): send, recv and poll spin
// on non-blocking calls instead of sleeping, with SO_BUSY_POLL set where
// the kernel permits it. What a latency-minded user of kernel TCP runs.
const SockOps& KernelTcpBusyOps();

// The zsock sockets API (bench/zsock_ops.cc). A StatusOr so that a build
// of the harness without the sockets layer can say so; this one has it.
absl::StatusOr<const SockOps*> ZsockOps();

}  // namespace zsock::bench

#endif  // ZSOCK_BENCH_SOCKOPS_H_
