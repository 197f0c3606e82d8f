// zsock_bench: socket-level benchmarks (the AZ-SDP paper's figures 6 to 10,
// message rate, connection rate) over zsock sockets in every mode, beside
// kernel TCP.
//
//   bazel run -c opt //bench:zsock_bench -- --test=pingpong --provider=unet
//       --mode=all --sizes=8,64K,1M --baseline=all --json=out.json --plot=plots
//
// docs/benchmarks.md describes every test, the JSON schema and the plots.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/harness.h"
#include "bench/placement.h"
#include "bench/plot.h"

ABSL_FLAG(std::string, test, "",
          "pingpong | stream | overlap | pagefault | hotspot | multistream | fanin | fanout | "
          "msgrate | connect");
ABSL_FLAG(std::string, provider, "tcp",
          "zsock provider config string (unet, ofi:tcp;ofi_rxm, ucx:tcp, ...), or tcp / "
          "tcp-busy for kernel TCP alone");
ABSL_FLAG(std::string, mode, "all",
          "zsock data path: bcopy | zcopy | azcopy | all (or a comma list); ignored for tcp");
ABSL_FLAG(std::string, sizes, "",
          "message sizes, e.g. 8,64,4K,1M (default: the test's, see docs/benchmarks.md)");
ABSL_FLAG(std::string, baseline, "",
          "also run the identical test over kernel TCP: tcp (blocking calls), tcp-busy "
          "(busy-polled), all (both)");
ABSL_FLAG(std::string, json, "", "write one JSON object per measured point to this file");
ABSL_FLAG(std::string, plot, "", "draw PNG figures (gnuplot) into this directory");
ABSL_FLAG(std::string, compute_us, "", "overlap: busy computation between sends, us (list)");
ABSL_FLAG(std::string, window, "", "pagefault: transfers between buffer touches (list)");
ABSL_FLAG(std::string, clients, "", "hotspot, fanin, fanout: client processes (list)");
ABSL_FLAG(std::string, streams, "", "multistream: concurrent streams (list)");
ABSL_FLAG(int64_t, iters, 10000,
          "round trips per latency point at sizes <= 16K (fewer above); streaming points "
          "send at most 10x this many messages");
ABSL_FLAG(int64_t, bytes, int64_t{1} << 30, "payload bytes per streaming point (capped)");
ABSL_FLAG(int64_t, warmup, -1, "untimed round trips / messages per point (default 100, "
                               "at most a tenth of the point)");
ABSL_FLAG(int64_t, inflight, 64, "msgrate: messages sent per acknowledgement");
ABSL_FLAG(int64_t, timeout, 60, "seconds without progress after which a run is killed");
ABSL_FLAG(int64_t, server_core, 0, "CPU the server process is pinned to");
ABSL_FLAG(int64_t, client_core, 1, "CPU the client processes are pinned to");
ABSL_FLAG(bool, progress, true, "report each point on stderr as it completes");
ABSL_FLAG(bool, stats, false,
          "print each zsock connection's SDP counters (ZSOCK_SO_STATS) on stderr after every "
          "point of pingpong, stream, overlap, pagefault and msgrate, both ends");

namespace zsock::bench {
namespace {

void SetUsage() {
  std::string usage =
      "socket benchmarks over zsock and kernel TCP.\n"
      "  zsock_bench --test=T [--provider=P] [--mode=M] [--sizes=LIST]\n"
      "              [--baseline=tcp|tcp-busy|all]"
      " [--json=FILE] [--plot=DIR]\ntests:\n";
  for (Test t : AllTests()) {
    absl::StrAppend(&usage, "  ", TestName(t), ": ", TestDescription(t), "\n");
  }
  absl::SetProgramUsageMessage(usage);
}

RawOptions RawFromFlags() {
  RawOptions raw;
  raw.test = absl::GetFlag(FLAGS_test);
  raw.provider = absl::GetFlag(FLAGS_provider);
  raw.mode = absl::GetFlag(FLAGS_mode);
  raw.sizes = absl::GetFlag(FLAGS_sizes);
  raw.baseline = absl::GetFlag(FLAGS_baseline);
  raw.compute_us = absl::GetFlag(FLAGS_compute_us);
  raw.window = absl::GetFlag(FLAGS_window);
  raw.clients = absl::GetFlag(FLAGS_clients);
  raw.streams = absl::GetFlag(FLAGS_streams);
  raw.iters = absl::GetFlag(FLAGS_iters);
  raw.bytes = absl::GetFlag(FLAGS_bytes);
  raw.warmup = absl::GetFlag(FLAGS_warmup);
  raw.inflight = absl::GetFlag(FLAGS_inflight);
  raw.timeout_s = absl::GetFlag(FLAGS_timeout);
  raw.server_core = absl::GetFlag(FLAGS_server_core);
  raw.client_core = absl::GetFlag(FLAGS_client_core);
  raw.progress = absl::GetFlag(FLAGS_progress);
  raw.stats = absl::GetFlag(FLAGS_stats);
  return raw;
}

// The '#' lines before the table: the test, the transports, the cores.
void PrintHeader(const Options& options) {
  std::vector<std::string> names;
  for (const Transport& t : options.transports) {
    if (t.name == "tcp") {
      names.push_back("kernel TCP (TCP_NODELAY, blocking calls)");
    } else if (t.name == "tcp-busy") {
      names.push_back("kernel TCP busy-polled (TCP_NODELAY, non-blocking calls in a loop, "
                      "SO_BUSY_POLL where permitted)");
    } else {
      names.push_back(absl::StrCat(t.name, " ", t.mode));
    }
  }
  const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  std::printf("# zsock_bench --test=%s: %s\n", std::string(TestName(options.test)).c_str(),
              std::string(TestDescription(options.test)).c_str());
  std::printf("# transports: %s; 127.0.0.1; server pinned to core %d, client%s to core %d "
              "(%ld online CPUs)\n",
              absl::StrJoin(names, ", ").c_str(), options.server_core,
              options.test == Test::kHotspot || options.test == Test::kFanin ||
                      options.test == Test::kFanout
                  ? "s"
                  : "",
              options.client_core, ncpu);
  if (options.server_core == options.client_core) {
    std::printf("# note: server and clients share core %d: expect inflated latencies\n",
                options.server_core);
  }
}

// Where the VM's vCPUs sit now (bench/placement.h), before and after.
void PrintCrossing(const Options& options, const char* when) {
  if (options.server_core == options.client_core) return;
  auto ns = LineTransferNs(options.server_core, options.client_core);
  if (ns.ok()) {
    std::printf("# %s the run: a cache line crosses between cores %d and %d in %.0f ns\n",
                when, options.server_core, options.client_core, *ns);
  } else {
    std::printf("# %s the run: %s\n", when, std::string(ns.status().message()).c_str());
  }
}

// The table and the '#' lines after it.
void PrintResults(const Options& options, const BenchResult& result) {
  std::printf("%s", FormatTable(options.test, result.records).c_str());
  PrintCrossing(options, "after");
  if (TestMetric(options.test) == Metric::kLatency) {
    std::printf("# latency = one-way (round trip / 2) for pingpong and hotspot, whole "
                "connection cycle for connect; GB/s = 10^9 payload bytes/s\n");
  } else {
    std::printf("# GB/s = 10^9 payload bytes/s, aggregate over all streams/clients\n");
  }
}

// --plot: the figure; false (after saying why) if it could not be drawn.
bool Plot(const Options& options, const BenchResult& result) {
  const std::string plot_dir = absl::GetFlag(FLAGS_plot);
  if (plot_dir.empty() || result.records.empty()) return true;
  auto png = WritePlot(plot_dir, options.test, result.records);
  if (png.ok()) {
    std::printf("# plot: %s\n", png->c_str());
    return true;
  }
  std::fprintf(stderr, "zsock_bench: %s\n", std::string(png.status().message()).c_str());
  return false;
}

int Main(int argc, char** argv) {
  SetUsage();
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::fprintf(stderr, "zsock_bench: unexpected argument '%s'; every option is a --flag\n",
                 rest[1]);
    return 2;
  }
  auto options = ParseOptions(RawFromFlags());
  if (!options.ok()) {
    std::fprintf(stderr, "zsock_bench: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  const std::string json_path = absl::GetFlag(FLAGS_json);
  std::ofstream json;
  if (!json_path.empty()) {
    json.open(json_path, std::ios::out | std::ios::trunc);
    if (!json) {
      std::fprintf(stderr, "zsock_bench: cannot write --json=%s\n", json_path.c_str());
      return 2;
    }
  }
  PrintHeader(*options);
  PrintCrossing(*options, "before");
  std::fflush(stdout);

  BenchResult result = RunBench(*options);
  PrintResults(*options, result);
  for (const Record& r : result.records) {
    if (json.is_open()) json << RecordToJson(r) << "\n";
  }
  if (json.is_open()) {
    json.close();
    if (!json) std::fprintf(stderr, "zsock_bench: writing %s failed\n", json_path.c_str());
  }
  int rc = result.failures.empty() ? 0 : 1;
  if (!Plot(*options, result)) rc = 1;
  for (const std::string& f : result.failures) {
    std::fprintf(stderr, "zsock_bench: FAILED: %s\n", f.c_str());
  }
  return rc;
}

}  // namespace
}  // namespace zsock::bench

int main(int argc, char** argv) { return zsock::bench::Main(argc, argv); }
