// pingpong and hotspot: one message bounced between a client and the
// server; the client times each round trip and reports half of it.
#include <poll.h>

#include <cerrno>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bench/child_io.h"
#include "bench/clock.h"
#include "bench/families.h"
#include "bench/pattern.h"
#include "bench/samples.h"

namespace zsock::bench::internal {

void PingpongClient(int fd) {
  const Run& run = *g_child.run;
  Buffer out(MaxSize(run)), in(MaxSize(run));
  for (int pi = 0; pi < static_cast<int>(run.points.size()); ++pi) {
    const Point& p = run.points[pi];
    const uint64_t seed = Seed(pi, 0);
    Fill(out.data(), p.size, seed);
    std::vector<double> samples;
    ReserveTouched(&samples, p.count);
    const int64_t total = p.warmup + p.count;
    int64_t t_start = 0;
    for (int64_t k = 0; k < total; ++k) {
      if (k == p.warmup) t_start = NowNs();
      int64_t t0 = NowNs();
      SendAll(fd, out.data(), p.size, "ping");
      RecvAll(fd, in.data(), p.size, "pong");
      int64_t t1 = NowNs();
      if (k >= p.warmup) samples.push_back(static_cast<double>(t1 - t0) / 2000.0);
      if (k == 0 || k == total - 1) Check(in.data(), p.size, seed, MsgWhat(pi, k, p));
    }
    double secs = static_cast<double>(NowNs() - t_start) / 1e9;
    Report(pi, p.count, 2 * p.count * static_cast<int64_t>(p.size), 2 * p.count, secs, samples);
    PrintStats(fd, pi);
  }
}

namespace {

// One client connection of the server: where it is in the points.
struct PingpongConn {
  int fd;
  int point = 0;
  int64_t k = 0;
};

// Echoes one message of `c` (checking the first and last of each point).
void Serve(PingpongConn& c, Buffer& buf) {
  const Point& p = g_child.run->points[c.point];
  const int64_t total = p.warmup + p.count;
  RecvAll(c.fd, buf.data(), p.size, "ping");
  if (c.k == 0 || c.k == total - 1) {
    Check(buf.data(), p.size, Seed(c.point, 0), MsgWhat(c.point, c.k, p));
  }
  SendAll(c.fd, buf.data(), p.size, "pong");
  if (++c.k == total) {
    PrintStats(c.fd, c.point);
    c.k = 0;
    ++c.point;
  }
}

}  // namespace

void PingpongServer(const std::vector<int>& fds) {
  const Run& run = *g_child.run;
  std::vector<PingpongConn> conns;
  for (int fd : fds) conns.push_back(PingpongConn{fd});
  Buffer buf(MaxSize(run));
  const int npoints = static_cast<int>(run.points.size());
  if (conns.size() == 1) {
    while (conns[0].point < npoints) Serve(conns[0], buf);
    return;
  }
  std::vector<pollfd> pfds;
  for (;;) {
    pfds.clear();
    for (const PingpongConn& c : conns) {
      if (c.point < npoints) pfds.push_back(pollfd{c.fd, POLLIN, 0});
    }
    if (pfds.empty()) return;
    int n = g_child.ops->poll(pfds.data(), pfds.size(), TimeoutMs());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) Die(absl::StrCat("poll failed: ", Errno(errno)));
    if (n == 0) {
      Die(absl::StrCat("no client sent anything for ",
                       absl::FormatDuration(g_child.opt->timeout)));
    }
    for (const pollfd& pfd : pfds) {
      if (pfd.revents == 0) continue;
      for (PingpongConn& c : conns) {
        if (c.fd == pfd.fd) Serve(c, buf);
      }
    }
  }
}

}  // namespace zsock::bench::internal
