// stream, overlap, pagefault and msgrate (one connection: the client
// streams, the server acknowledges the warm-up and the end, and msgrate
// every --inflight messages), and multistream (one thread per connection
// on both sides).
#include <atomic>
#include <barrier>
#include <memory>
#include <thread>
#include <vector>

#include "bench/child_io.h"
#include "bench/clock.h"
#include "bench/families.h"
#include "bench/pattern.h"

namespace zsock::bench::internal {
namespace {

// The sending side of one point; returns the timed seconds (first timed send
// to the receiver's acknowledgement of the last byte).
double StreamSendPoint(int fd, int pi, const Point& p, uint8_t* buf) {
  const Test test = g_child.opt->test;
  const int64_t inflight = g_child.opt->inflight;
  Fill(buf, p.size, Seed(pi, 0));
  for (int64_t k = 0; k < p.warmup; ++k) SendAll(fd, buf, p.size, "warm-up send");
  uint8_t ack = 0;
  RecvAll(fd, &ack, 1, "warm-up acknowledgement");
  const int64_t t0 = NowNs();
  for (int64_t k = 0; k < p.count; ++k) {
    if (test == Test::kPagefault && k > 0 && k % p.window == 0) {
      Fill(buf, p.size, Seed(pi, k / p.window));  // touch the buffer every W sends
    }
    SendAll(fd, buf, p.size, "stream send");
    if (test == Test::kOverlap && p.compute_us > 0) Compute(p.compute_us);
    if (test == Test::kMsgrate && (k + 1) % inflight == 0 && k + 1 < p.count) {
      RecvAll(fd, &ack, 1, "message-rate acknowledgement");
    }
  }
  RecvAll(fd, &ack, 1, "end-of-stream acknowledgement");
  const double secs = static_cast<double>(NowNs() - t0) / 1e9;
  PrintStats(fd, pi);
  return secs;
}

void StreamRecvPoint(int fd, int pi, const Point& p, uint8_t* buf) {
  const Test test = g_child.opt->test;
  const int64_t inflight = g_child.opt->inflight;
  const uint8_t ack = 1;
  for (int64_t k = 0; k < p.warmup; ++k) {
    RecvAll(fd, buf, p.size, "warm-up receive");
    if (k == 0) Check(buf, p.size, Seed(pi, 0), MsgWhat(pi, k, p));
  }
  SendAll(fd, &ack, 1, "warm-up acknowledgement");
  for (int64_t k = 0; k < p.count; ++k) {
    RecvAll(fd, buf, p.size, "stream receive");
    if (test == Test::kPagefault) {
      // Read the buffer every W receptions (and the last message).
      if ((k + 1) % p.window == 0 || k == p.count - 1) {
        Check(buf, p.size, Seed(pi, k / p.window), MsgWhat(pi, p.warmup + k, p));
      }
    } else if (k == p.count - 1) {
      Check(buf, p.size, Seed(pi, 0), MsgWhat(pi, p.warmup + k, p));
    }
    if (test == Test::kMsgrate && (k + 1) % inflight == 0 && k + 1 < p.count) {
      SendAll(fd, &ack, 1, "message-rate acknowledgement");
    }
  }
  SendAll(fd, &ack, 1, "end-of-stream acknowledgement");
  PrintStats(fd, pi);
}

}  // namespace

void StreamClient(int fd) {
  const Run& run = *g_child.run;
  Buffer buf(MaxSize(run));
  for (int pi = 0; pi < static_cast<int>(run.points.size()); ++pi) {
    const Point& p = run.points[pi];
    double secs = StreamSendPoint(fd, pi, p, buf.data());
    Report(pi, p.count, p.count * static_cast<int64_t>(p.size), p.count, secs, {});
  }
}

void StreamServerConn(int fd) {
  const Run& run = *g_child.run;
  Buffer buf(MaxSize(run));
  for (int pi = 0; pi < static_cast<int>(run.points.size()); ++pi) {
    StreamRecvPoint(fd, pi, run.points[pi], buf.data());
  }
}

// The client times from the moment every stream has finished its warm-up
// until the last stream's end is acknowledged.
void MultistreamClient(const std::vector<int>& fds) {
  const Run& run = *g_child.run;
  const size_t n = fds.size();
  std::vector<std::unique_ptr<Buffer>> bufs;
  for (size_t i = 0; i < n; ++i) bufs.push_back(std::make_unique<Buffer>(MaxSize(run)));
  for (int pi = 0; pi < static_cast<int>(run.points.size()); ++pi) {
    const Point& p = run.points[pi];
    std::atomic<int64_t> t0{0};
    std::barrier start(static_cast<ptrdiff_t>(n), [&]() noexcept { t0 = NowNs(); });
    std::vector<std::thread> threads;
    for (size_t i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        uint8_t* b = bufs[i]->data();
        Fill(b, p.size, Seed(pi, 0));
        for (int64_t k = 0; k < p.warmup; ++k) SendAll(fds[i], b, p.size, "warm-up send");
        uint8_t ack = 0;
        RecvAll(fds[i], &ack, 1, "warm-up acknowledgement");
        start.arrive_and_wait();
        for (int64_t k = 0; k < p.count; ++k) SendAll(fds[i], b, p.size, "stream send");
        RecvAll(fds[i], &ack, 1, "end-of-stream acknowledgement");
      });
    }
    for (std::thread& t : threads) t.join();
    double secs = static_cast<double>(NowNs() - t0.load()) / 1e9;
    int64_t msgs = p.count * static_cast<int64_t>(n);
    Report(pi, msgs, msgs * static_cast<int64_t>(p.size), msgs, secs, {});
  }
}

void MultistreamServer(const std::vector<int>& fds) {
  std::vector<std::thread> threads;
  for (int fd : fds) threads.emplace_back([fd] { StreamServerConn(fd); });
  for (std::thread& t : threads) t.join();
}

}  // namespace zsock::bench::internal
