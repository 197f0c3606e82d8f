// The gnuplot figures of zsock_bench (see plot.h): the data blocks, the
// script (axes, panels, curves) and running gnuplot.
#include "bench/plot.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "core/status.h"

namespace zsock::bench {
namespace {

enum class XAxis { kSize, kCompute, kWindow, kStreams };
enum class PanelBy { kNone, kSize, kClients };

struct Layout {
  XAxis x;
  PanelBy panel;
  const char* figure;  // the AZ-SDP paper's figure it follows
  const char* title;
};

Layout LayoutOf(Test test) {
  switch (test) {
    case Test::kPingpong: return {XAxis::kSize, PanelBy::kNone, "fig. 6a", "Ping-pong latency"};
    case Test::kStream: return {XAxis::kSize, PanelBy::kNone, "fig. 6b", "Uni-directional throughput"};
    case Test::kOverlap: return {XAxis::kCompute, PanelBy::kSize, "fig. 7", "Computation and communication overlap"};
    case Test::kPagefault: return {XAxis::kWindow, PanelBy::kSize, "fig. 8", "Impact of page faults"};
    case Test::kHotspot: return {XAxis::kSize, PanelBy::kClients, "fig. 9a", "Hot-spot latency"};
    case Test::kMultistream: return {XAxis::kStreams, PanelBy::kSize, "fig. 9b", "Multi-stream throughput"};
    case Test::kFanin: return {XAxis::kSize, PanelBy::kClients, "fig. 10a", "Fan-in throughput"};
    case Test::kFanout: return {XAxis::kSize, PanelBy::kClients, "fig. 10b", "Fan-out throughput"};
    case Test::kMsgrate: return {XAxis::kSize, PanelBy::kNone, "", "Message rate"};
    case Test::kConnect: return {XAxis::kSize, PanelBy::kNone, "", "Connection rate"};
  }
  return {XAxis::kSize, PanelBy::kNone, "", ""};
}

double XOf(XAxis x, const Record& r) {
  switch (x) {
    case XAxis::kSize: return static_cast<double>(r.msg_size);
    case XAxis::kCompute: return static_cast<double>(r.compute_us.value_or(0));
    case XAxis::kWindow: return static_cast<double>(r.window.value_or(0));
    case XAxis::kStreams: return static_cast<double>(r.streams.value_or(0));
  }
  return 0;
}

int64_t PanelOf(PanelBy p, const Record& r) {
  switch (p) {
    case PanelBy::kNone: return 0;
    case PanelBy::kSize: return static_cast<int64_t>(r.msg_size);
    case PanelBy::kClients: return r.clients.value_or(0);
  }
  return 0;
}

const char* YLabel(Test test) {
  switch (TestMetric(test)) {
    case Metric::kLatency:
      return test == Test::kHotspot ? "one-way latency, p50 over all clients (us)"
                                    : "one-way latency, p50 (us)";
    case Metric::kBandwidth: return "throughput (10^9 bytes/s)";
    case Metric::kMessageRate: return "message rate (10^6 messages/s)";
    case Metric::kConnectRate: return "connections per second";
  }
  return "";
}

double YOf(Test test, const Record& r) {
  double v = PrimaryValue(test, r);
  return TestMetric(test) == Metric::kMessageRate ? v / 1e6 : v;
}

std::string Quote(absl::string_view s) {
  return absl::StrCat("\"", absl::StrReplaceAll(s, {{"\\", "\\\\"}, {"\"", "\\\""}}), "\"");
}

// "Ping-pong latency (the AZ-SDP paper's fig. 6a)"
std::string FigureTitle(const Layout& l) {
  return *l.figure ? absl::StrCat(l.title, " (the AZ-SDP paper's ", l.figure, ")")
                   : std::string(l.title);
}

// "pingpong.dat", "pingpong.gp", ...
std::string TestFile(Test test, absl::string_view ext) {
  return absl::StrCat(TestName(test), ext);
}

std::string CurveTitle(const Record& r) {
  if (r.transport == "tcp") return "kernel TCP";
  if (r.transport == "tcp-busy") return "kernel TCP busy-polled";
  return absl::StrCat(r.transport, " ", r.mode);
}

// The curves (transport x mode, in the order they ran, with their titles),
// the panels and the x values (sorted) of a figure.
struct Curves {
  std::vector<std::string> keys;
  std::map<std::string, std::string> titles;
  std::set<int64_t> panels;
  std::set<double> xs;
};

std::string CurveKey(const Record& r) { return r.transport + "\n" + r.mode; }

Curves CollectCurves(const Layout& layout, const std::vector<Record>& records) {
  Curves c;
  for (const Record& r : records) {
    std::string key = CurveKey(r);
    if (std::find(c.keys.begin(), c.keys.end(), key) == c.keys.end()) {
      c.keys.push_back(key);
      c.titles[key] = CurveTitle(r);
    }
    c.panels.insert(PanelOf(layout.panel, r));
    c.xs.insert(XOf(layout.x, r));
  }
  return c;
}

// The data blocks gnuplot's `index` selects: one per (panel, curve).
struct Blocks {
  std::map<std::pair<int64_t, std::string>, int> index;
  int count = 0;
};

// Appends one block per (panel, curve) that has points, in that order.
Blocks AppendBlocks(Test test, const Layout& layout, const Curves& c,
                    const std::vector<Record>& records, std::string* dat) {
  Blocks blocks;
  for (int64_t panel : c.panels) {
    for (const std::string& curve : c.keys) {
      std::vector<std::pair<double, const Record*>> pts;
      for (const Record& r : records) {
        if (PanelOf(layout.panel, r) == panel && CurveKey(r) == curve) {
          pts.emplace_back(XOf(layout.x, r), &r);
        }
      }
      if (pts.empty()) continue;
      std::sort(pts.begin(), pts.end(),
                [](const auto& a, const auto& b) { return a.first < b.first; });
      if (blocks.count > 0) *dat += "\n\n";
      absl::StrAppend(dat, "# index ", blocks.count, ": panel ", panel, ", ",
                      c.titles.at(curve), "\n# x y p99_us avg_us\n");
      for (const auto& [x, r] : pts) {
        absl::StrAppend(dat, absl::StrFormat("%.10g %.10g %.10g %.10g\n", x, YOf(test, *r),
                                             r->lat_us_p99.value_or(0),
                                             r->lat_us_avg.value_or(0)));
      }
      blocks.index[{panel, curve}] = blocks.count++;
    }
  }
  return blocks;
}

std::string ScriptHeader(const std::string& name, const Layout& layout, int npanels) {
  return absl::StrCat(
      "# zsock_bench ", name, ": the layout of the AZ-SDP paper's ", layout.figure,
      ". Redraw with: gnuplot ", name, ".gp\n",
      absl::StrFormat("set terminal pngcairo size %d,%d enhanced font \",10\"\n",
                      std::max(1, npanels) * 560, 440),
      "set output ", Quote(name + ".png"), "\n", "set grid\n", "set key top left\n", "");
}

// connect: one bar per curve, from a small table of its own after the
// blocks.
void AppendBars(Test test, const Curves& c, const std::vector<Record>& records, int nblocks,
                std::string* dat, std::string* gp) {
  absl::StrAppend(gp, "set title ", Quote("Connections set up, used and torn down per second"),
                  " noenhanced\n",
                  "set style data histograms\nset style fill solid 0.6 border -1\n",
                  "set boxwidth 0.7\nset yrange [0:*]\nset xtics noenhanced\nset ylabel ",
                  Quote(YLabel(test)), "\nset key off\n");
  std::string bars;
  for (const std::string& curve : c.keys) {
    for (const Record& r : records) {
      if (CurveKey(r) == curve) {
        absl::StrAppend(&bars, Quote(c.titles.at(curve)), " ",
                        absl::StrFormat("%.10g", YOf(test, r)), "\n");
        break;
      }
    }
  }
  absl::StrAppend(dat, "\n\n# bars: title value\n", bars);
  absl::StrAppend(gp, "plot ", Quote(TestFile(test, ".dat")), " index ", nblocks,
                  " using 2:xtic(1) title ", Quote("connections/s"), "\n");
}

// The x axis: label, scale, tics and range.
void AppendXAxis(const Layout& layout, const std::set<double>& xs, std::string* gp) {
  switch (layout.x) {
    case XAxis::kSize: {
      std::vector<std::string> tics;
      for (double x : xs) {
        tics.push_back(absl::StrCat(Quote(SizeLabel(static_cast<size_t>(x))), " ", x));
      }
      absl::StrAppend(gp, "set logscale x 2\nset xlabel \"message size (bytes)\"\n",
                      "set xtics (", absl::StrJoin(tics, ", "), ")\n",
                      absl::StrFormat("set xrange [%.10g:%.10g]\n", *xs.begin() / 1.4,
                                      *xs.rbegin() * 1.4));
      break;
    }
    case XAxis::kCompute:
      absl::StrAppend(gp, "set xlabel \"computation between sends (us)\"\n");
      break;
    case XAxis::kWindow:
      absl::StrAppend(gp, "set logscale x 2\nset xlabel \"window size W (transfers between "
                          "buffer touches)\"\n");
      break;
    case XAxis::kStreams:
      absl::StrAppend(gp, "set xlabel \"number of streams\"\nset xtics 1\n");
      break;
  }
  if (layout.x == XAxis::kWindow) {
    absl::StrAppend(gp, absl::StrFormat("set xrange [%.10g:%.10g]\n", *xs.begin() / 1.4,
                                        *xs.rbegin() * 1.4));
  } else if (layout.x != XAxis::kSize) {
    const double span = std::max(1.0, *xs.rbegin() - *xs.begin());
    absl::StrAppend(gp, absl::StrFormat("set xrange [%.10g:%.10g]\n",
                                        *xs.begin() - 0.05 * span,
                                        *xs.rbegin() + 0.05 * span));
  }
}

// "(a) 64Kbyte messages", "(b) 4 clients", or the figure's title alone.
std::string PanelTitle(const Layout& layout, int64_t panel, char letter) {
  switch (layout.panel) {
    case PanelBy::kNone: return FigureTitle(layout);
    case PanelBy::kSize:
      return absl::StrCat("(", std::string(1, letter), ") ",
                          SizeLabel(static_cast<size_t>(panel)), "byte messages");
    case PanelBy::kClients:
      return absl::StrCat("(", std::string(1, letter), ") ", panel, " client",
                          panel == 1 ? "" : "s");
  }
  return "";
}

// Every test but connect: the axes, then one plot per panel (side by side
// in a multiplot when there are several).
void AppendPanels(Test test, const Layout& layout, const Curves& c, const Blocks& blocks,
                  std::string* gp) {
  const int npanels = static_cast<int>(c.panels.size());
  if (npanels > 1) {
    absl::StrAppend(gp, "set multiplot layout 1,", npanels, " title ",
                    Quote(FigureTitle(layout)), "\n");
  }
  AppendXAxis(layout, c.xs, gp);
  if (TestMetric(test) == Metric::kLatency) {
    absl::StrAppend(gp, "set logscale y 10\n");
  } else {
    absl::StrAppend(gp, "set yrange [0:*]\n");
  }
  absl::StrAppend(gp, "set ylabel ", Quote(YLabel(test)), "\n");
  const std::string dat_name = Quote(TestFile(test, ".dat"));
  char letter = 'a';
  for (int64_t panel : c.panels) {
    absl::StrAppend(gp, "set title ", Quote(PanelTitle(layout, panel, letter++)),
                    " noenhanced\n");
    std::vector<std::string> plots;
    for (const std::string& curve : c.keys) {
      auto it = blocks.index.find({panel, curve});
      if (it == blocks.index.end()) continue;
      plots.push_back(absl::StrCat(dat_name, " index ", it->second,
                                   " using 1:2 with linespoints lw 2 title ",
                                   Quote(c.titles.at(curve)), " noenhanced"));
    }
    absl::StrAppend(gp, "plot ", absl::StrJoin(plots, ", \\\n     "), "\n");
  }
  if (npanels > 1) absl::StrAppend(gp, "unset multiplot\n");
}

absl::Status MakeDirs(const std::string& dir) {
  std::string path;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || (dir[i] == '/' && i > 0)) {
      path = dir.substr(0, i);
      if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
        return ErrnoError(errno, absl::StrCat("cannot create plot directory ", path),
                          "pass a writable --plot=DIR");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> WritePlotScript(const std::string& dir, Test test,
                                            const std::vector<Record>& records) {
  if (records.empty()) {
    return MakeError(absl::StatusCode::kFailedPrecondition, 0,
                     "nothing to plot: no point was measured");
  }
  if (auto s = MakeDirs(dir); !s.ok()) return s;
  const std::string name(TestName(test));
  const Layout layout = LayoutOf(test);
  const Curves c = CollectCurves(layout, records);
  std::string dat = absl::StrCat("# zsock_bench ", name, " (", layout.figure,
                                 "): one block per panel x curve\n");
  const Blocks blocks = AppendBlocks(test, layout, c, records, &dat);
  std::string gp = ScriptHeader(name, layout, static_cast<int>(c.panels.size()));
  if (test == Test::kConnect) {
    AppendBars(test, c, records, blocks.count, &dat, &gp);
  } else {
    AppendPanels(test, layout, c, blocks, &gp);
  }
  const std::string dat_path = dir + "/" + name + ".dat";
  const std::string gp_path = dir + "/" + name + ".gp";
  for (const auto& [path, text] : {std::pair{dat_path, dat}, std::pair{gp_path, gp}}) {
    std::ofstream f(path);
    f << text;
    f.close();
    if (!f) {
      return ErrnoError(errno, absl::StrCat("cannot write ", path), "pass a writable --plot=DIR");
    }
  }
  return gp_path;
}

absl::StatusOr<std::string> WritePlot(const std::string& dir, Test test,
                                      const std::vector<Record>& records) {
  auto gp = WritePlotScript(dir, test, records);
  if (!gp.ok()) return gp.status();
  const std::string script = std::string(TestName(test)) + ".gp";
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) return ErrnoError(errno, "fork for gnuplot failed");
  if (pid == 0) {
    if (chdir(dir.c_str()) != 0) _exit(126);
    execlp("gnuplot", "gnuplot", script.c_str(), static_cast<char*>(nullptr));
    _exit(errno == ENOENT ? 127 : 126);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return ErrnoError(errno, "waiting for gnuplot failed");
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
    return MakeError(absl::StatusCode::kFailedPrecondition, ENOENT,
                     "gnuplot is not installed, so no PNG was drawn (the .gp and .dat are in " +
                         dir + ")",
                     "apt-get install gnuplot-nox (tools/install_deps.sh installs it)");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return MakeError(absl::StatusCode::kInternal, 0,
                     absl::StrCat("gnuplot failed on ", *gp, " (status ", status, ")"),
                     "see gnuplot's message above");
  }
  return dir + "/" + std::string(TestName(test)) + ".png";
}

}  // namespace zsock::bench
