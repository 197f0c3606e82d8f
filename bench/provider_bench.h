// What provider_bench's files share (provider_bench.cc says what the
// binary measures and how to run it): the per-size counts, the summary of
// a size's round trips, the flags the provider side reads, and the
// completion reader of the timed loops (inline: it runs once per message).
//
// provider_bench.cc holds the flags, the process pairs and the printing;
// provider_bench_fabric.cc the provider's server and client;
// provider_bench_tcp.cc the kernel TCP baseline.
#ifndef ZSOCK_BENCH_PROVIDER_BENCH_H_
#define ZSOCK_BENCH_PROVIDER_BENCH_H_

#include <unistd.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/provider.h"

ABSL_DECLARE_FLAG(std::string, address);
ABSL_DECLARE_FLAG(int, idle);
ABSL_DECLARE_FLAG(bool, rma_read);

namespace zsock::provider_bench {

struct Result {
  double p50 = 0, p99 = 0, avg = 0;  // one-way latency, us
  double pp_mbps = 0;                // ping-pong: size / avg one-way, 10^6 B/s
  double gbps = 0;                   // stream, 10^9 bytes per second
  double read_gbps = -1;             // RDMA read stream, 10^9 B/s (-1: not measured)
};

// Prints "provider_bench: WHAT" and exits 1.
[[noreturn]] void Die(const std::string& what);

// Ping-pong round trips at `size` (fewer for large sizes), and the untimed
// ones before them.
int Iters(size_t size);
int Warmup(size_t size);
// Messages of the stream at `size`.
int64_t StreamCount(size_t size);
// The latency of round trips `rtt_us` (sorted here) and the stream's rate.
Result Summarize(std::vector<double>& rtt_us, size_t size, double gbps);
// --wait=spin (else adaptive).
bool Spin();

// --idle: connections that carry nothing, each with a receive posted (as a
// server's idle clients have), on the CQ the measured connection uses.
constexpr uint64_t kIdleContext = 0x1d1e;

class IdleConnections {
 public:
  void Add(std::unique_ptr<Endpoint> ep) {
    if (auto st = ep->PostRecv(buf_.data(), buf_.size(), nullptr, kIdleContext); !st.ok()) {
      Die(st.ToString());
    }
    eps_.push_back(std::move(ep));
  }

 private:
  std::array<uint8_t, 64> buf_{};  // never written: nothing is sent on them
  std::vector<std::unique_ptr<Endpoint>> eps_;
};

// Takes completions off a CQ one at a time. kSpin polls without ever
// sleeping, as fi_pingpong (FI_WAIT_NONE + fi_cq_read) and ucx_perftest
// (ucp_worker_progress) do; kAdaptive uses CompletionQueue::Wait (spin, from
// spin_us adapting up to spin_max_us, then sleep on the CQ fd), the
// library's default.
class Completions {
 public:
  Completions(CompletionQueue* cq, bool spin) : cq_(cq), spin_(spin) {}

  // The next completion, read in place (as an application reads what Poll
  // wrote into its array, and as the peer tools read theirs): valid until
  // the next call. Measured: a copy per completion showed in the small
  // one-way latency over shared memory.
  const Completion& Next() {
    for (;;) {
      if (head_ == n_) Refill();
      const Completion& c = buf_[head_++];
      // An idle connection's receive ends only when the peer has gone.
      if (c.context == kIdleContext) continue;
      if (!c.status.ok()) Die(c.status.ToString());
      return c;
    }
  }

 private:
  void Refill() {
    head_ = n_ = 0;
    if (spin_) {
      // The clock is read only once the poll has gone on for a while: a
      // clock read per completion would be the benchmark's own overhead
      // (fi_pingpong and ucx_perftest read none).
      int64_t give_up = 0;
      for (uint32_t tries = 1; (n_ = cq_->Poll(buf_)) == 0; ++tries) {
        if ((tries & 0xffff) != 0) continue;
        const int64_t now = absl::GetCurrentTimeNanos();
        if (give_up == 0) give_up = now + int64_t{30} * 1000000000;
        if (now > give_up) Die("timed out waiting for a completion");
      }
      return;
    }
    auto n = cq_->Wait(buf_, absl::Seconds(30));
    if (!n.ok()) Die(n.status().ToString());
    if (*n == 0) Die("timed out waiting for a completion");
    n_ = *n;
  }

  CompletionQueue* cq_;
  bool spin_;
  std::array<Completion, 16> buf_;
  size_t head_ = 0, n_ = 0;
};

// The provider's side (provider_bench_fabric.cc). The server opens its own
// fabric after the fork and reports its listener's address on
// `report_fd`; the client returns one Result per size.
void ProviderServer(const std::string& config, int report_fd, const std::vector<size_t>& sizes,
                    int window);
std::vector<Result> ProviderClient(const std::string& config, const std::string& address,
                                   const std::vector<size_t>& sizes, int window);

// Kernel TCP over loopback with the same sizes (provider_bench_tcp.cc).
void TcpServer(int lfd, const std::vector<size_t>& sizes);
std::vector<Result> TcpClient(int port, const std::vector<size_t>& sizes);

}  // namespace zsock::provider_bench

#endif  // ZSOCK_BENCH_PROVIDER_BENCH_H_
