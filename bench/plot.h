// Plots zsock_bench records with gnuplot in the layout of the AZ-SDP
// paper's figures 6 to 10 ("Asynchronous Zero-copy Communication for
// Synchronous Sockets in the Sockets Direct Protocol (SDP) over
// InfiniBand"): one PNG per test, one panel per message size (overlap,
// pagefault, multistream: figs. 7, 8, 9b, whose x axis is the swept
// parameter) or per client count (hotspot, fanin, fanout: figs. 9a, 10),
// one curve per transport x mode. Beside each PNG it leaves the gnuplot
// script (.gp) and its data (.dat, one block per curve), so a figure can be
// restyled and redrawn with `cd DIR && gnuplot TEST.gp`.
#ifndef ZSOCK_BENCH_PLOT_H_
#define ZSOCK_BENCH_PLOT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/report.h"
#include "bench/test_kinds.h"

namespace zsock::bench {

// Writes DIR/TEST.dat and DIR/TEST.gp (creating DIR) and returns the script's
// path; does not need gnuplot.
absl::StatusOr<std::string> WritePlotScript(const std::string& dir, Test test,
                                            const std::vector<Record>& records);

// WritePlotScript, then runs gnuplot on it; returns the PNG's path.
absl::StatusOr<std::string> WritePlot(const std::string& dir, Test test,
                                      const std::vector<Record>& records);

}  // namespace zsock::bench

#endif  // ZSOCK_BENCH_PLOT_H_
