// zsock_bench's harness: the socket-level benchmarks of seed 003 section 5
// (figures 6 to 10) plus message rate and connection rate, run between
// separate processes over any SockOps transport (kernel TCP or zsock).
//
// Contract:
// - ParseOptions turns the command-line values into a validated plan; every
//   bad value is an InvalidArgument naming the flag and what to write
//   instead, an unknown provider is the provider registry's own error, and a
//   transport that cannot run here (zsock before issue 6) is its error.
// - RunBench forks one server process pinned to `server_core` and one or
//   more client processes pinned to `client_core` per run (a run = one
//   transport x mode x clients/streams value, over every size and parameter
//   value), sets ZSOCK_PROVIDER / ZSOCK_MODE in the children, and collects
//   one Record per measured point. Children that fail, die or make no
//   progress for `timeout` are killed by PID and the run fails with their
//   message; the other runs still go.
// - The receiver of every test checks the data of at least one message per
//   point against a pattern (pagefault: every W messages), so a transport
//   that drops, reorders or corrupts bytes fails the run.
// - RecordToJson / FormatTable render records; plot.h draws them.
#ifndef ZSOCK_BENCH_HARNESS_H_
#define ZSOCK_BENCH_HARNESS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bench/sockops.h"

namespace zsock::bench {

enum class Test {
  kPingpong,
  kStream,
  kOverlap,
  kPagefault,
  kHotspot,
  kMultistream,
  kFanin,
  kFanout,
  kMsgrate,
  kConnect,
};

absl::string_view TestName(Test test);
// What the test measures, one line (for --help and the docs).
absl::string_view TestDescription(Test test);
absl::StatusOr<Test> ParseTest(absl::string_view name);
// All tests, in the order of seed 003's figures.
const std::vector<Test>& AllTests();

// Which quantity a test reports as its result (and plots on the y axis).
enum class Metric { kLatency, kBandwidth, kMessageRate, kConnectRate };
Metric TestMetric(Test test);

// Command-line values as given (strings "" = flag not given: the test's
// default applies; a test-specific flag given to another test is an error).
struct RawOptions {
  std::string test;
  std::string provider = "tcp";
  std::string mode = "all";
  std::string sizes;
  std::string baseline;
  std::string compute_us;
  std::string window;
  std::string clients;
  std::string streams;
  int64_t iters = 10000;
  int64_t bytes = int64_t{256} << 20;
  int64_t warmup = -1;  // -1: test's default
  int64_t inflight = 64;
  int64_t timeout_s = 60;
  int64_t server_core = 0;
  int64_t client_core = 1;
  bool progress = true;
  bool stats = false;
};

// One way to carry a test: kernel TCP or zsock sockets in one mode.
struct Transport {
  std::string name;  // "tcp", or the provider config string
  std::string mode;  // "kernel" for tcp, else bcopy | zcopy | azcopy
  const SockOps* ops = nullptr;
  // Set in every child before its first socket call.
  std::vector<std::pair<std::string, std::string>> env;
  bool is_baseline = false;
};

struct Options {
  Test test = Test::kPingpong;
  std::vector<Transport> transports;  // measured ones first, baseline last
  std::vector<size_t> sizes;
  std::vector<int64_t> compute_us;  // overlap
  std::vector<int64_t> windows;     // pagefault
  std::vector<int64_t> clients;     // hotspot, fanin, fanout
  std::vector<int64_t> streams;     // multistream
  int64_t iters = 10000;  // latency-type tests: round trips at sizes <= 16 KiB
  int64_t bytes = int64_t{256} << 20;  // streaming tests: bytes per point (capped)
  int64_t warmup = 100;
  int64_t inflight = 64;  // msgrate: messages in flight per acknowledgement
  absl::Duration timeout = absl::Seconds(60);  // without progress
  int server_core = 0;
  int client_core = 1;
  bool progress = true;
  bool stats = false;  // print the connections' counters (SockOps::stats) per point
};

// Validates everything, resolves the transports (the provider registry for
// the provider name, then ZsockOps()).
absl::StatusOr<Options> ParseOptions(const RawOptions& raw);

// Parses "8,64,4K,1M" (suffixes K, M, G are powers of 1024).
absl::StatusOr<std::vector<size_t>> ParseSizeList(absl::string_view flag,
                                                  absl::string_view text);
// Parses "0,10,200" (non-negative integers, or >= `min`).
absl::StatusOr<std::vector<int64_t>> ParseIntList(absl::string_view flag,
                                                  absl::string_view text, int64_t min);

// One measured point.
struct Record {
  std::string test;
  std::string transport;
  std::string mode;
  size_t msg_size = 0;
  int64_t iterations = 0;  // timed round trips / messages / connections
  std::optional<double> lat_us_p50, lat_us_p99, lat_us_avg;  // one-way (pingpong,
                                                             // hotspot) or per
                                                             // connection (connect)
  double bw_gbps = 0;   // 10^9 bytes per second (payload, aggregate)
  double msg_rate = 0;  // messages (connect: connections) per second
  double seconds = 0;   // timed interval
  std::optional<int64_t> compute_us, window, clients, streams;
  // The measured value over the baseline's at the same point, oriented so
  // that > 1 is better (latency: tcp / this; rates: this / tcp).
  std::optional<double> vs_tcp;
};

// The value plotted and compared for `record`'s test.
double PrimaryValue(Test test, const Record& record);

struct BenchResult {
  std::vector<Record> records;
  std::vector<std::string> failures;  // one per failed run, with its cause
};

// Runs every point of `options`. Fills vs_tcp when a baseline ran.
BenchResult RunBench(const Options& options);

std::string RecordToJson(const Record& record);
// The aligned table (header line, one line per record).
std::string FormatTable(Test test, const std::vector<Record>& records);
// "8", "4K", "1M", or the exact number when not a power-of-1024 multiple.
std::string SizeLabel(size_t size);

}  // namespace zsock::bench

#endif  // ZSOCK_BENCH_HARNESS_H_
