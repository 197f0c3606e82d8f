// zsock_bench's results: one Record per measured point, its JSON line, the
// aligned table, and the ratio of each point to the kernel TCP baselines'.
// plot.h draws the same records.
#ifndef ZSOCK_BENCH_REPORT_H_
#define ZSOCK_BENCH_REPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/options.h"
#include "bench/test_kinds.h"

namespace zsock::bench {

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
  // The measured value over a baseline's at the same point, oriented so
  // that > 1 is better (latency: tcp / this; rates: this / tcp): kernel TCP
  // with blocking calls, and kernel TCP busy-polled.
  std::optional<double> vs_tcp, vs_tcp_busy;
};

// The value plotted and compared for `record`'s test.
double PrimaryValue(Test test, const Record& record);

std::string RecordToJson(const Record& record);
// The aligned table (header line, one line per record).
std::string FormatTable(Test test, const std::vector<Record>& records);
// "8", "4K", "1M", or the exact number when not a power-of-1024 multiple.
std::string SizeLabel(size_t size);

namespace internal {

// The value of the parameter `param` in `record` (nullopt for kNone).
std::optional<int64_t> ParamValue(Param param, const Record& record);

// Fills vs_tcp / vs_tcp_busy of every record other than kernel TCP's that
// has a record of that baseline at the same point, when `options` ran it.
void AddBaselineRatios(const Options& options, std::vector<Record>* records);

}  // namespace internal
}  // namespace zsock::bench

#endif  // ZSOCK_BENCH_REPORT_H_
