// bench::NowNs: the benchmarks' per-iteration timestamp, monotonic
// nanoseconds.
//
// Why not absl::GetCurrentTimeNanos or clock_gettime: on this class of VM
// a read of either is slow (measured: Debian's absl reads CLOCK_REALTIME
// and converts; the vDSO's CLOCK_MONOTONIC on a kvm guest is slow), and a
// ping-pong reads one per round trip, inside the time it measures: against
// a small one-way over shared memory the clock alone was a visible share.
// The peer tools read the TSC (ucx_perftest's ucs_get_time; fi_pingpong
// reads the clock only at the start and the end).
// Neither absl nor Google Benchmark exports a cycle clock (theirs are
// internal), so this is written here.
//
// Where the TSC is invariant (x86-64 with constant_tsc and nonstop_tsc in
// /proc/cpuinfo) NowNs is rdtsc scaled by a rate calibrated against
// CLOCK_MONOTONIC over 20 ms at first use; elsewhere it is
// clock_gettime(CLOCK_MONOTONIC). Call Calibrate() before fork so that the
// children share the calibration instead of each paying for it.
#pragma once

#include <cstdint>
#include <string>

namespace zsock::bench {

int64_t NowNs();
// Calibrates now (idempotent; NowNs calls it on first use).
void Calibrate();
// clock_gettime(CLOCK_MONOTONIC) in ns: the reference NowNs is scaled to.
int64_t MonotonicNs();
// "tsc (2.100 GHz)" or "clock_gettime(CLOCK_MONOTONIC)", for reports.
std::string ClockSource();

}  // namespace zsock::bench
