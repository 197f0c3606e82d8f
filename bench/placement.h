// bench::LineTransferNs: how long a cache line takes to cross between two
// CPUs, measured now.
//
// Why: this VM's two vCPUs do not always sit in the same place on the host.
// Most of the time a line crosses between them in 45-60 ns; in spells of
// seconds to minutes it takes about 240 ns (the vCPUs apart: unet's 1 MiB
// stream fell from 10-13 to 4.8 GB/s with it) or 31 ns (likely two
// hardware threads of one core: the stream at 8 GB/s, the 8-byte ping-pong
// 0.67 us instead of 0.44). zsock_bench prints it before and after each run
// so that a table says which spell it ran in (docs/benchmarks.md).
//
// Two threads pinned to the two CPUs bounce one atomic word `rounds` times;
// the result is the one-way time (half a round trip) in nanoseconds.
#pragma once

#include "absl/status/statusor.h"

namespace zsock::bench {

absl::StatusOr<double> LineTransferNs(int cpu_a, int cpu_b, int rounds = 20000);

}  // namespace zsock::bench
