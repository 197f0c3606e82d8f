// What zsock_bench's forked client and server processes share: their
// settings (g_child), the report pipe to the parent (frames.h), and socket
// helpers over the run's SockOps whose every wait is bounded by --timeout.
//
// A child never returns an error: Die writes the cause as an error frame
// (prefixed with the child's role) and exits with status 1, and the parent
// reports it as the run's failure.
#ifndef ZSOCK_BENCH_CHILD_IO_H_
#define ZSOCK_BENCH_CHILD_IO_H_

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "bench/options.h"
#include "bench/plan.h"
#include "bench/sockops.h"

namespace zsock::bench::internal {

// One per process, set after fork.
struct ChildEnv {
  const Options* opt = nullptr;
  const Run* run = nullptr;
  const SockOps* ops = nullptr;
  int out_fd = -1;
  std::string role;
  int index = 0;  // client index
  uint16_t port = 0;
};
extern ChildEnv g_child;

// ---- the report pipe ----

void WriteFrame(char type, const void* payload, size_t len);
[[noreturn]] void Die(const std::string& what);
std::string Errno(int err);
// One point's measurement (latency samples in us, may be empty).
void Report(int point, int64_t iterations, int64_t bytes, int64_t messages, double seconds,
            const std::vector<double>& samples);
// "message K of point P (SIZE)", for data-check failures.
std::string MsgWhat(int point, int64_t k, const Point& p);
// --stats: the counters of connection `fd` that moved since the previous
// call for it (and the current values of the two that are levels), one line
// on stderr. Nothing for transports without counters (kernel TCP).
void PrintStats(int fd, int point);

// ---- sockets ----

// --timeout in milliseconds, for poll.
int TimeoutMs();
// Waits until `fd` is ready for `events`; dies after --timeout.
void WaitFd(int fd, short events, absl::string_view what);

// Sends all `len` bytes (waiting where the socket is full). Inline: it is
// on the timed path of every message.
inline void SendAll(int fd, const void* buf, size_t len, absl::string_view what) {
  const auto* p = static_cast<const uint8_t*>(buf);
  while (len > 0) {
    ssize_t n = g_child.ops->send(fd, p, len, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      WaitFd(fd, POLLOUT, what);
      continue;
    }
    Die(absl::StrCat("send during ", what, " failed: ",
                     n == 0 ? std::string("sent 0 bytes") : Errno(errno)));
  }
}

// Receives exactly `len` bytes; dies if the peer closes first. Inline: it is
// on the timed path of every message.
inline void RecvAll(int fd, void* buf, size_t len, absl::string_view what) {
  auto* p = static_cast<uint8_t*>(buf);
  while (len > 0) {
    ssize_t n = g_child.ops->recv(fd, p, len, 0);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) Die(absl::StrCat("the peer closed the connection during ", what));
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      WaitFd(fd, POLLIN, what);
      continue;
    }
    Die(absl::StrCat("recv during ", what, " failed: ", Errno(errno)));
  }
}

void SetNonBlocking(int fd);
// A listening socket on 127.0.0.1, an ephemeral port (returned in *port).
int ListenLoopback(uint16_t* port);
// `configure`: TCP_NODELAY and the --timeout send/receive timeouts.
int AcceptOne(int lfd, bool configure);
int ConnectLoopback(uint16_t port, bool configure);
void CloseFd(int fd);

}  // namespace zsock::bench::internal

#endif  // ZSOCK_BENCH_CHILD_IO_H_
