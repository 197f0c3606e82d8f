// provider_bench: provider-level ping-pong latency and streaming bandwidth
// between two processes pinned to different cores, beside kernel TCP over
// loopback with the same sizes, in one run.
//
//   bazel run -c opt //bench:provider_bench -- --provider=unet --sizes=8,4096,1048576
//
// Timestamps come from bench::NowNs (the TSC where it is invariant, as
// ucx_perftest's; bench/clock.h says why not absl's clock).
// One-way latency = round trip / 2 (p50, p99, average), after a tenth as
// many untimed warm-up round trips. Stream bandwidth is bytes delivered per
// second with `window` sends outstanding, 10^9 B/s. --wait=spin busy-polls
// the CQ as fi_pingpong and ucx_perftest do (bench/compare_providers.sh runs
// the three side by side); the default waits adaptively (spin, then sleep).
// The server process opens its own fabric after the fork (providers such
// as verbs do not survive fork: docs/provider-interface.md, "Fork").
//
// Two hosts (e.g. verbs over a real fabric; docs/verbs.md):
//   host A: provider_bench --provider=verbs:mlx5_0 --role=server --address=10.0.0.1:7471
//   host B: provider_bench --provider=verbs:mlx5_0 --role=client --address=10.0.0.1:7471
// The full benchmark suite (SDP modes, the AZ-SDP paper's figures, JSON,
// plots) is bench/zsock_bench.
//
// This file holds the flags, the process pairs and the printing;
// provider_bench.h says where the rest is.
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/clock.h"
#include "bench/provider_bench.h"

ABSL_FLAG(std::string, provider, "unet", "fabric config string");
ABSL_FLAG(std::string, sizes, "8,64,1024,4096,65536,1048576", "message sizes in bytes");
ABSL_FLAG(int, iters, 20000, "ping-pong round trips per size (fewer for large sizes)");
ABSL_FLAG(int64_t, stream_bytes, int64_t{1} << 30, "bytes streamed per size");
ABSL_FLAG(int, window, 32, "stream: sends outstanding");
ABSL_FLAG(int64_t, stream_max_msgs, int64_t{1} << 40,
          "stream: at most this many messages per size (bounds the time small sizes take)");
ABSL_FLAG(std::string, cores, "0,1", "cores to pin the server and the client to");
ABSL_FLAG(bool, baseline_tcp, true, "also run kernel TCP over loopback");
ABSL_FLAG(std::string, role, "both",
          "both: server and client on this host; server / client: one side of a two-host run");
ABSL_FLAG(std::string, address, "",
          "server: address to listen on (\"\" = the provider's choice); client: the server's address");
ABSL_FLAG(std::string, wait, "adaptive",
          "how to wait for completions: adaptive (CompletionQueue::Wait: spin, from spin_us "
          "adapting up to spin_max_us, then sleep on the CQ fd) or spin (poll without sleeping, "
          "like fi_pingpong and ucx_perftest)");
ABSL_FLAG(bool, tsv, false,
          "print one tab-separated line per size (size p50 p99 avg pp_MBps stream_MBps "
          "read_MBps) for the provider only, for scripts");
ABSL_FLAG(bool, rma_read, true,
          "also stream RDMA reads of each size (window sends outstanding) where the provider "
          "offers RDMA read, native or emulated: the ceiling of what zero-copy and AZ-SDP can "
          "pull");
ABSL_FLAG(int, idle, 0,
          "more connections, each with one receive posted on both sides, that stay idle on the "
          "measured connection's CQs (how a poll scales with the endpoints a CQ holds)");

namespace zsock::provider_bench {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "provider_bench: %s\n", what.c_str());
  _exit(1);
}

int Iters(size_t size) {
  int it = absl::GetFlag(FLAGS_iters);
  if (size >= (1 << 20)) return std::max(50, it / 100);
  if (size >= (64 << 10)) return std::max(200, it / 10);
  return it;
}

int64_t StreamCount(size_t size) {
  int64_t n = absl::GetFlag(FLAGS_stream_bytes) / static_cast<int64_t>(std::max<size_t>(size, 1));
  return std::max<int64_t>(64, std::min(n, absl::GetFlag(FLAGS_stream_max_msgs)));
}

bool Spin() {
  const std::string w = absl::GetFlag(FLAGS_wait);
  if (w != "spin" && w != "adaptive") Die(absl::StrCat("--wait must be spin or adaptive, not '", w, "'"));
  return w == "spin";
}

int Warmup(size_t size) { return std::max(10, Iters(size) / 10); }

Result Summarize(std::vector<double>& rtt_us, size_t size, double gbps) {
  Result r;
  std::sort(rtt_us.begin(), rtt_us.end());
  double sum = 0;
  for (double v : rtt_us) sum += v;
  r.p50 = rtt_us[rtt_us.size() / 2] / 2;
  r.p99 = rtt_us[std::min(rtt_us.size() - 1, rtt_us.size() * 99 / 100)] / 2;
  r.avg = sum / rtt_us.size() / 2;
  r.pp_mbps = static_cast<double>(size) / r.avg;  // bytes per us = 10^6 B/s
  r.gbps = gbps;
  return r;
}

namespace {

void Pin(int core) {
  int ncpu = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core % std::max(ncpu, 1), &set);
  sched_setaffinity(0, sizeof(set), &set);
}

// "-" where the read stream did not run, else the rate in `scale` units.
std::string ReadCell(const Result& r, double scale, const char* fmt) {
  if (r.read_gbps < 0) return "-";
  char b[32];
  std::snprintf(b, sizeof(b), fmt, r.read_gbps * scale);
  return b;
}

// Runs `server` in a child pinned to the first of --cores and `client` here
// on the second.
template <typename ServerFn, typename ClientFn>
std::vector<Result> RunPair(ServerFn server, ClientFn client) {
  std::vector<std::string> cores = absl::StrSplit(absl::GetFlag(FLAGS_cores), ',');
  int server_core = 0, client_core = 1;
  if (cores.size() != 2 || !absl::SimpleAtoi(cores[0], &server_core) ||
      !absl::SimpleAtoi(cores[1], &client_core)) {
    Die("--cores must be two core numbers, e.g. 0,1");
  }
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    Pin(server_core);
    server();
    std::fflush(nullptr);
    _exit(0);
  }
  Pin(client_core);
  std::vector<Result> r = client();
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Die("server process failed");
  return r;
}

std::vector<size_t> SizesFromFlag() {
  std::vector<size_t> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    size_t v;
    if (!absl::SimpleAtoi(s, &v) || v == 0) Die(absl::StrCat("bad size '", s, "'"));
    sizes.push_back(v);
  }
  return sizes;
}

void PrintTableHeader() {
  std::printf("%-10s %-10s %10s %10s %10s %12s %12s\n", "transport", "size", "lat_p50us",
              "lat_p99us", "lat_avgus", "bw_GB/s", "read_GB/s");
}

void PrintTableRow(const char* transport, size_t size, const Result& r, const std::string& read) {
  std::printf("%-10s %-10zu %10.2f %10.2f %10.2f %12.3f %12s\n", transport, size, r.p50, r.p99,
              r.avg, r.gbps, read.c_str());
}

// --role=both: the provider's server in a child, its client here.
std::vector<Result> RunProviderPair(const std::string& config, const std::vector<size_t>& sizes,
                                    int window) {
  std::fprintf(stderr, "running %s ...\n", config.c_str());
  int report[2];
  if (::pipe(report) != 0) Die("pipe");
  return RunPair(
      [&] {
        ::close(report[0]);
        ProviderServer(config, report[1], sizes, window);
      },
      [&] {
        ::close(report[1]);
        std::string address;
        char ch;
        while (::read(report[0], &ch, 1) == 1 && ch != '\n') address += ch;
        ::close(report[0]);
        if (address.empty()) Die("the server process could not listen (its error is above)");
        return ProviderClient(config, address, sizes, window);
      });
}

// Kernel TCP over loopback with the same sizes.
std::vector<Result> RunTcpPair(const std::vector<size_t>& sizes) {
  std::fprintf(stderr, "running kernel TCP (loopback, TCP_NODELAY) ...\n");
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t sl = sizeof(sa);
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&sa), sl) != 0 || ::listen(lfd, 1) != 0) {
    Die("tcp listen");
  }
  getsockname(lfd, reinterpret_cast<sockaddr*>(&sa), &sl);
  int port = ntohs(sa.sin_port);
  auto tcp = RunPair([&] { TcpServer(lfd, sizes); }, [&] { return TcpClient(port, sizes); });
  ::close(lfd);
  return tcp;
}

// The provider's rows, kernel TCP's beside them, and the ratios.
void PrintComparison(const std::string& config, const std::vector<size_t>& sizes,
                     const std::vector<Result>& zs, const std::vector<Result>& tcp) {
  PrintTableHeader();
  for (size_t i = 0; i < sizes.size(); ++i) {
    PrintTableRow(config.c_str(), sizes[i], zs[i], ReadCell(zs[i], 1, "%.3f"));
    if (!tcp.empty()) PrintTableRow("tcp", sizes[i], tcp[i], "-");
  }
  if (!tcp.empty()) {
    std::printf("\n%-10s %16s %16s\n", "size", "latency tcp/zs", "bandwidth zs/tcp");
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::printf("%-10zu %15.1fx %15.1fx\n", sizes[i], tcp[i].p50 / zs[i].p50,
                  zs[i].gbps / tcp[i].gbps);
    }
  }
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  bench::Calibrate();  // before the forks: the children inherit it
  const std::vector<size_t> sizes = SizesFromFlag();
  const std::string config = absl::GetFlag(FLAGS_provider);
  const int window = absl::GetFlag(FLAGS_window);
  const std::string role = absl::GetFlag(FLAGS_role);
  if (role == "server") {
    std::fprintf(stderr, "serving %s; run the client with --address=", config.c_str());
    ProviderServer(config, ::dup(STDERR_FILENO), sizes, window);
    return 0;
  }
  if (role == "client") {
    if (absl::GetFlag(FLAGS_address).empty()) Die("--role=client needs --address=<server address>");
    auto results = ProviderClient(config, absl::GetFlag(FLAGS_address), sizes, window);
    PrintTableHeader();
    for (size_t i = 0; i < sizes.size(); ++i) {
      PrintTableRow(config.c_str(), sizes[i], results[i], ReadCell(results[i], 1, "%.3f"));
    }
    return 0;
  }
  if (role != "both") Die("--role is both, server or client");
  auto zs = RunProviderPair(config, sizes, window);
  if (absl::GetFlag(FLAGS_tsv)) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::printf("%zu\t%.3f\t%.3f\t%.3f\t%.1f\t%.1f\t%s\n", sizes[i], zs[i].p50, zs[i].p99,
                  zs[i].avg, zs[i].pp_mbps, zs[i].gbps * 1000,
                  ReadCell(zs[i], 1000, "%.1f").c_str());
    }
    return 0;
  }
  std::vector<Result> tcp;
  if (absl::GetFlag(FLAGS_baseline_tcp)) tcp = RunTcpPair(sizes);
  PrintComparison(config, sizes, zs, tcp);
  return 0;
}

}  // namespace
}  // namespace zsock::provider_bench

int main(int argc, char** argv) { return zsock::provider_bench::Main(argc, argv); }
