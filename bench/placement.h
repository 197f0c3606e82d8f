// bench::LineTransferNs: how long a cache line takes to cross between two
// CPUs, measured now.
//
// Why: a VM's vCPUs do not always sit in the same place on the host. In
// spells of seconds to minutes a line takes several times longer to cross
// (the vCPUs apart), or less (likely two hardware threads of one core), and
// streams and ping-pongs move with it (measured: docs/benchmarks.md).
// zsock_bench prints it before and after each run so that a table says
// which spell it ran in.
//
// Two threads pinned to the two CPUs bounce one atomic word `rounds` times;
// the result is the one-way time (half a round trip) in nanoseconds.
#pragma once

#include "absl/status/statusor.h"

namespace zsock::bench {

absl::StatusOr<double> LineTransferNs(int cpu_a, int cpu_b, int rounds = 20000);

}  // namespace zsock::bench
