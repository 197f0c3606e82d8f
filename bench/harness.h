// zsock_bench's harness: the socket-level benchmarks of the AZ-SDP paper
// ("Asynchronous Zero-copy Communication for Synchronous Sockets in the
// Sockets Direct Protocol (SDP) over InfiniBand", section 5, figures 6 to
// 10) plus message rate and connection rate, run between separate
// processes over any SockOps transport (kernel TCP or zsock).
//
// Contract:
// - ParseOptions (options.h) turns the command-line values into a
//   validated plan.
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
// - RecordToJson / FormatTable (report.h) render records; plot.h draws them.
//
// Where it lives: test_kinds (the tests), options (flags), plan (runs and
// points), runner (the parent: processes and reports), roles and the
// families pingpong, stream, fan and connect (the children's bodies, over
// child_io and pattern), report (records, JSON, table).
#ifndef ZSOCK_BENCH_HARNESS_H_
#define ZSOCK_BENCH_HARNESS_H_

#include <string>
#include <vector>

#include "bench/options.h"
#include "bench/report.h"
#include "bench/test_kinds.h"

namespace zsock::bench {

struct BenchResult {
  std::vector<Record> records;
  std::vector<std::string> failures;  // one per failed run, with its cause
};

// Runs every point of `options`. Fills vs_tcp / vs_tcp_busy when a baseline ran.
BenchResult RunBench(const Options& options);

}  // namespace zsock::bench

#endif  // ZSOCK_BENCH_HARNESS_H_
