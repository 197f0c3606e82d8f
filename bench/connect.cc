// connect: each message its own connection (set up, one byte each way,
// torn down); the client times each connection cycle.
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/child_io.h"
#include "bench/clock.h"
#include "bench/families.h"
#include "bench/pattern.h"
#include "bench/samples.h"

namespace zsock::bench::internal {

void ConnectServer(int lfd) {
  const Run& run = *g_child.run;
  for (int pi = 0; pi < static_cast<int>(run.points.size()); ++pi) {
    const Point& p = run.points[pi];
    for (int64_t k = 0; k < p.warmup + p.count; ++k) {
      int fd = AcceptOne(lfd, false);
      uint8_t b = 0;
      RecvAll(fd, &b, 1, "connection's byte");
      Check(&b, 1, Seed(pi, k), absl::StrCat("the byte of connection ", k));
      SendAll(fd, &b, 1, "connection's reply");
      CloseFd(fd);
    }
  }
}

void ConnectClient(uint16_t port) {
  const Run& run = *g_child.run;
  for (int pi = 0; pi < static_cast<int>(run.points.size()); ++pi) {
    const Point& p = run.points[pi];
    std::vector<double> samples;
    ReserveTouched(&samples, p.count);
    int64_t t_start = 0;
    for (int64_t k = 0; k < p.warmup + p.count; ++k) {
      if (k == p.warmup) t_start = NowNs();
      int64_t t0 = NowNs();
      int fd = ConnectLoopback(port, false);
      uint8_t b = 0;
      Fill(&b, 1, Seed(pi, k));
      SendAll(fd, &b, 1, "connection's byte");
      uint8_t r = 0;
      RecvAll(fd, &r, 1, "connection's reply");
      CloseFd(fd);
      if (k >= p.warmup) samples.push_back(static_cast<double>(NowNs() - t0) / 1000.0);
      if (r != b) Check(&r, 1, Seed(pi, k), absl::StrCat("the reply of connection ", k));
    }
    double secs = static_cast<double>(NowNs() - t_start) / 1e9;
    Report(pi, p.count, 2 * p.count, p.count, secs, samples);
  }
}

}  // namespace zsock::bench::internal
