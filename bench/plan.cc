// zsock_bench's measurement plan (see plan.h): how many round trips or
// messages each point times, so that every point takes a comparable time.
#include "bench/plan.h"

#include <algorithm>
#include <vector>

namespace zsock::bench::internal {
namespace {

// Round trips of a latency point: --iters up to 16 KiB, then fewer in
// proportion to the size (at least min(iters, 100)).
int64_t LatencyCount(const Options& o, size_t size) {
  constexpr size_t kSmall = 16 << 10;
  if (size <= kSmall) return o.iters;
  return std::max<int64_t>(std::min<int64_t>(o.iters, 100),
                           static_cast<int64_t>(static_cast<double>(o.iters) * kSmall / size));
}

// Messages of a streaming point: --bytes worth, at most 10 x --iters, at
// least 16.
int64_t StreamCount(const Options& o, size_t size) {
  int64_t n = o.bytes / static_cast<int64_t>(size);
  n = std::min(n, o.iters * 10);
  return std::max<int64_t>(n, 16);
}

// The timed count of one point of `o.test` at `size` with `procs` clients
// or streams sharing it.
int64_t PointCount(const Options& o, size_t size, int64_t procs) {
  switch (o.test) {
    case Test::kPingpong:
      return LatencyCount(o, size);
    case Test::kHotspot:
      return std::max<int64_t>(std::min<int64_t>(o.iters, 50), LatencyCount(o, size) / procs);
    case Test::kConnect:
      return std::max<int64_t>(std::min<int64_t>(o.iters, 50), o.iters / 10);
    case Test::kMultistream:
    case Test::kFanin:
    case Test::kFanout:
      return std::max<int64_t>(16, StreamCount(o, size) / procs);
    default:
      return StreamCount(o, size);
  }
}

// The points of one size: one per swept value of overlap and pagefault.
void AddPoints(const Options& o, size_t size, int64_t procs, std::vector<Point>* points) {
  Point p;
  p.size = size;
  p.count = PointCount(o, size, procs);
  p.warmup = std::min(o.warmup, std::max<int64_t>(1, p.count / 10));
  if (o.test == Test::kOverlap) {
    for (int64_t c : o.compute_us) {
      p.compute_us = c;
      points->push_back(p);
    }
  } else if (o.test == Test::kPagefault) {
    for (int64_t w : o.windows) {
      p.window = w;
      points->push_back(p);
    }
  } else {
    points->push_back(p);
  }
}

}  // namespace

std::vector<Run> Plan(const Options& o) {
  const Param param = TestParam(o.test);
  std::vector<Run> runs;
  for (const Transport& t : o.transports) {
    std::vector<int64_t> procs = {1};
    if (param == Param::kClients) procs = o.clients;
    if (param == Param::kStreams) procs = o.streams;
    for (int64_t n : procs) {
      Run run;
      run.transport = &t;
      if (param == Param::kClients) run.clients = n;
      if (param == Param::kStreams) run.streams = n;
      for (size_t size : o.sizes) AddPoints(o, size, n, &run.points);
      runs.push_back(std::move(run));
    }
  }
  return runs;
}

size_t MaxSize(const Run& run) {
  size_t m = 1;
  for (const Point& p : run.points) m = std::max(m, p.size);
  return m;
}

}  // namespace zsock::bench::internal
