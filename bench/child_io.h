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

#include "absl/base/optimization.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "bench/options.h"
#include "bench/plan.h"
#include "bench/sockops.h"
#include "core/bootstrap_io.h"

namespace zsock::bench::internal {

// One per process, set after fork.
struct ChildEnv {
  const Options* opt = nullptr;
  const Run* run = nullptr;
  const SockOps* ops = nullptr;
  // The socket calls of `ops`, and the limits of every wait (--timeout),
  // for core's exact-length I/O (SetIo).
  SocketCalls calls{};
  BootstrapIo::Options io;
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
// Sets g_child's calls and io from its ops and options (after fork).
void SetIo();
// Exact-length I/O on `fd` through the run's sockets, each wait bounded by
// --timeout (core/bootstrap_io.h).
inline BootstrapIo ChildIo(int fd) { return BootstrapIo(fd, absl::InfiniteFuture(), g_child.io); }

// Waits until `fd` is ready for `events`; dies after --timeout.
void WaitFd(int fd, short events, absl::string_view what);

// Sends all `len` bytes (waiting where the socket is full); dies on
// failure. Inline: it is on the timed path of every message.
inline void SendAll(int fd, const void* buf, size_t len, absl::string_view what) {
  if (absl::Status st = ChildIo(fd).Write(buf, len, what); ABSL_PREDICT_FALSE(!st.ok())) {
    Die(std::string(st.message()));
  }
}

// Receives exactly `len` bytes; dies if the peer closes first. Inline: it is
// on the timed path of every message.
inline void RecvAll(int fd, void* buf, size_t len, absl::string_view what) {
  if (absl::Status st = ChildIo(fd).Read(buf, len, what); ABSL_PREDICT_FALSE(!st.ok())) {
    Die(std::string(st.message()));
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
