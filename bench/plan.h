// zsock_bench's measurement plan: the runs (one transport x clients or
// streams value, each a fresh set of processes) and, in each, the points
// (one message size x swept value) with their timed and untimed counts.
#ifndef ZSOCK_BENCH_PLAN_H_
#define ZSOCK_BENCH_PLAN_H_

#include <cstdint>
#include <vector>

#include "bench/options.h"

namespace zsock::bench::internal {

struct Point {
  size_t size = 0;
  int64_t compute_us = 0;
  int64_t window = 0;
  int64_t count = 0;   // timed round trips / messages / connections per process or stream
  int64_t warmup = 0;  // untimed ones before them
};

struct Run {
  const Transport* transport = nullptr;
  int64_t clients = 1;  // client processes
  int64_t streams = 1;  // connections per client process (threads)
  std::vector<Point> points;
};

// Every run of `options`, in order: transports, then clients or streams.
std::vector<Run> Plan(const Options& options);

// The largest message of `run` (at least 1 byte): its buffers' size.
size_t MaxSize(const Run& run);

}  // namespace zsock::bench::internal

#endif  // ZSOCK_BENCH_PLAN_H_
