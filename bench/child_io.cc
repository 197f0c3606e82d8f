// The child processes' report pipe and socket helpers (see child_io.h).
#include "bench/child_io.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bench/frames.h"
#include "bench/report.h"

namespace zsock::bench::internal {

ChildEnv g_child;

// ---- the report pipe ----

void WriteFrame(char type, const void* payload, size_t len) {
  std::string frame(1, type);
  uint32_t n = static_cast<uint32_t>(len);
  frame.append(reinterpret_cast<const char*>(&n), sizeof(n));
  frame.append(static_cast<const char*>(payload), len);
  const char* p = frame.data();
  size_t left = frame.size();
  while (left > 0) {
    ssize_t w = ::write(g_child.out_fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) _exit(3);  // the parent is gone
    p += w;
    left -= static_cast<size_t>(w);
  }
}

[[noreturn]] void Die(const std::string& what) {
  std::string msg = absl::StrCat(g_child.role, ": ", what);
  WriteFrame(kFrameError, msg.data(), msg.size());
  _exit(1);
}

std::string Errno(int err) { return std::strerror(err); }

void Report(int point, int64_t iterations, int64_t bytes, int64_t messages, double seconds,
            const std::vector<double>& samples) {
  PointWire w{};
  w.point = point;
  w.iterations = iterations;
  w.bytes = bytes;
  w.messages = messages;
  w.seconds = seconds;
  w.samples = static_cast<int64_t>(samples.size());
  std::string payload(reinterpret_cast<const char*>(&w), sizeof(w));
  payload.append(reinterpret_cast<const char*>(samples.data()),
                 samples.size() * sizeof(double));
  WriteFrame(kFrameResult, payload.data(), payload.size());
}

std::string MsgWhat(int point, int64_t k, const Point& p) {
  return absl::StrCat("message ", k, " of point ", point, " (", SizeLabel(p.size), ")");
}

void PrintStats(int fd, int pi) {
  if (!g_child.opt->stats || g_child.ops->stats == nullptr) return;
  static std::map<int, std::vector<uint64_t>> last;
  const auto now = g_child.ops->stats(fd);
  if (now.empty()) return;
  std::vector<uint64_t>& prev = last[fd];
  prev.resize(now.size());
  std::string line = absl::StrCat("stats: ", g_child.role, " connection fd ", fd, " after point ",
                                  pi, ":");
  for (size_t i = 0; i < now.size(); ++i) {
    const absl::string_view name = now[i].first;
    const bool level = name == "queued_bytes" || name == "held_bytes";
    const uint64_t v = level ? now[i].second : now[i].second - prev[i];
    if (v != 0) absl::StrAppend(&line, " ", name, "=", v);
    prev[i] = now[i].second;
  }
  line += "\n";
  (void)!::write(STDERR_FILENO, line.data(), line.size());
}

// ---- sockets ----

int TimeoutMs() {
  return static_cast<int>(
      std::min<int64_t>(absl::ToInt64Milliseconds(g_child.opt->timeout), 1 << 30));
}

void SetIo() {
  g_child.calls = {g_child.ops->send, g_child.ops->recv, g_child.ops->poll};
  g_child.io = {.peer = "the peer",
                .fix = "a peer is hung: rerun with ZSOCK_LOG_LEVEL=debug, or raise --timeout "
                       "if the machine is very loaded",
                .idle_limit = g_child.opt->timeout,
                .calls = &g_child.calls};
}

void WaitFd(int fd, short events, absl::string_view what) {
  if (absl::Status st = ChildIo(fd).Wait(events, what); !st.ok()) Die(std::string(st.message()));
}

namespace {

void SetNoDelay(int fd) {
  int one = 1;
  if (g_child.ops->setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    Die(absl::StrCat("setsockopt(TCP_NODELAY) failed: ", Errno(errno)));
  }
}

// Blocking calls give up after --timeout (the poll in WaitFd then decides).
// A transport without SO_RCVTIMEO still has the parent's watchdog.
void SetTimeouts(int fd) {
  timeval tv{};
  int64_t ms = TimeoutMs();
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  (void)g_child.ops->setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  (void)g_child.ops->setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

sockaddr_in Loopback(uint16_t port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return sa;
}

}  // namespace

void SetNonBlocking(int fd) {
  int flags = g_child.ops->fcntl(fd, F_GETFL);
  if (flags < 0 || g_child.ops->fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    Die(absl::StrCat("fcntl(O_NONBLOCK) failed: ", Errno(errno)));
  }
}

int ListenLoopback(uint16_t* port) {
  const SockOps* ops = g_child.ops;
  int fd = ops->socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) Die(absl::StrCat("socket failed: ", Errno(errno)));
  int one = 1;
  (void)ops->setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa = Loopback(0);
  if (ops->bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    Die(absl::StrCat("bind to 127.0.0.1 failed: ", Errno(errno)));
  }
  if (ops->listen(fd, 1024) != 0) Die(absl::StrCat("listen failed: ", Errno(errno)));
  socklen_t len = sizeof(sa);
  if (ops->getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    Die(absl::StrCat("getsockname failed: ", Errno(errno)));
  }
  *port = ntohs(sa.sin_port);
  SetTimeouts(fd);
  return fd;
}

int AcceptOne(int lfd, bool configure) {
  for (;;) {
    int fd = g_child.ops->accept(lfd, nullptr, nullptr);
    if (fd >= 0) {
      if (configure) {
        SetNoDelay(fd);
        SetTimeouts(fd);
      }
      return fd;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      WaitFd(lfd, POLLIN, "accept");
      continue;
    }
    Die(absl::StrCat("accept failed: ", Errno(errno)));
  }
}

int ConnectLoopback(uint16_t port, bool configure) {
  const SockOps* ops = g_child.ops;
  int fd = ops->socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) Die(absl::StrCat("socket failed: ", Errno(errno)));
  SetNoDelay(fd);
  if (configure) SetTimeouts(fd);
  sockaddr_in sa = Loopback(port);
  while (ops->connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    if (errno == EINTR) continue;
    Die(absl::StrCat("connect to 127.0.0.1:", port, " failed: ", Errno(errno)));
  }
  return fd;
}

void CloseFd(int fd) {
  if (g_child.ops->close(fd) != 0 && errno != EINTR) {
    Die(absl::StrCat("close failed: ", Errno(errno)));
  }
}

}  // namespace zsock::bench::internal
