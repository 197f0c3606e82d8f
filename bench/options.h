// zsock_bench's command-line values and their validation into a plan of
// transports, sizes and swept parameters.
//
// ParseOptions turns the values as given into a validated Options: every
// bad value is an InvalidArgument naming the flag and what to write
// instead, an unknown provider is the provider registry's own error, and a
// transport that cannot run here is its error.
#ifndef ZSOCK_BENCH_OPTIONS_H_
#define ZSOCK_BENCH_OPTIONS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bench/sockops.h"
#include "bench/test_kinds.h"

namespace zsock::bench {

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

}  // namespace zsock::bench

#endif  // ZSOCK_BENCH_OPTIONS_H_
