// The parent side of zsock_bench (RunBench in harness.h): forks the server
// and client processes of each run, reads their reports through pipes
// (frames.h), watches them for failure and for a lack of progress, and
// turns the reports into records.
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "bench/child_io.h"
#include "bench/clock.h"
#include "bench/families.h"
#include "bench/frames.h"
#include "bench/harness.h"
#include "bench/plan.h"
#include "core/config.h"
#include "core/status.h"

namespace zsock::bench {
namespace {

using internal::Param;
using internal::Point;
using internal::PointWire;
using internal::Run;

// One forked process, as the parent sees it.
struct Child {
  pid_t pid = -1;
  int fd = -1;  // read end of its report pipe
  std::string role;
  std::string buf;  // unparsed bytes
  bool eof = false;
  bool exited = false;
  int status = 0;
  std::string error;  // from an 'E' frame
  bool got_port = false;
  uint16_t port = 0;
};

// What the processes reported for one point, summed.
struct PointAgg {
  int reports = 0;
  int64_t iterations = 0;
  int64_t bytes = 0;
  int64_t messages = 0;
  double seconds = 0;
  std::vector<double> samples;
};

// Called with a point's index once every process expected has reported it.
using PointDone = std::function<void(int)>;

void Pin(int core) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  (void)sched_setaffinity(0, sizeof(set), &set);
}

// The forked child: closes what belongs to the parent and to earlier
// children, dies with the parent, takes the run's environment, runs `body`
// pinned to `core`, and exits.
[[noreturn]] void ChildMain(const Options& opt, const Run& run, const std::string& role,
                            int core, int index, uint16_t port, int out_fd, pid_t parent,
                            void (*body)()) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);
  signal(SIGPIPE, SIG_IGN);
  internal::ChildEnv& env = internal::g_child;
  env.opt = &opt;
  env.run = &run;
  env.ops = run.transport->ops;
  env.out_fd = out_fd;
  env.role = role;
  env.index = index;
  env.port = port;
  internal::SetIo();
  for (const auto& [k, v] : run.transport->env) setenv(k.c_str(), v.c_str(), 1);
  // The parent may have loaded the configuration already (logging does):
  // this child's ZSOCK_MODE/ZSOCK_PROVIDER must take effect.
  zsock::Config::ReloadGlobalInChild();
  Pin(core);
  body();
  std::fflush(nullptr);
  _exit(0);
}

absl::StatusOr<Child> Spawn(const Options& opt, const Run& run, std::string role, int core,
                            int index, uint16_t port, const std::vector<int>& close_in_child,
                            void (*body)()) {
  int p[2];
  if (pipe(p) != 0) return ErrnoError(errno, "pipe for a benchmark process failed");
  bench::Calibrate();  // once, in the parent: every child inherits it
  std::fflush(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    ::close(p[0]);
    ::close(p[1]);
    return ErrnoError(err, "fork of a benchmark process failed");
  }
  if (pid == 0) {
    ::close(p[0]);
    for (int fd : close_in_child) ::close(fd);
    ChildMain(opt, run, role, core, index, port, p[1], parent, body);
  }
  ::close(p[1]);
  Child c;
  c.pid = pid;
  c.fd = p[0];
  c.role = std::move(role);
  return c;
}

std::string DescribeExit(const Child& c) {
  if (!c.error.empty()) return c.error;
  if (WIFSIGNALED(c.status)) {
    return absl::StrCat(c.role, " (pid ", c.pid, ") was killed by signal ",
                        WTERMSIG(c.status), " (", strsignal(WTERMSIG(c.status)), ")");
  }
  return absl::StrCat(c.role, " (pid ", c.pid, ") exited with status ", WEXITSTATUS(c.status));
}

// Adds one result frame's payload to its point.
void AddResult(const char* payload, uint32_t len, std::vector<PointAgg>& agg,
               const PointDone& done, int expected_reports) {
  PointWire w;
  std::memcpy(&w, payload, sizeof(w));
  if (w.point < 0 || w.point >= static_cast<int>(agg.size()) ||
      len != sizeof(PointWire) + w.samples * sizeof(double)) {
    return;
  }
  PointAgg& a = agg[w.point];
  a.reports++;
  a.iterations += w.iterations;
  a.bytes += w.bytes;
  a.messages += w.messages;
  a.seconds = std::max(a.seconds, w.seconds);
  if (w.samples > 0) {  // an empty vector's data() may be null
    const size_t at = a.samples.size();
    a.samples.resize(at + w.samples);
    std::memcpy(a.samples.data() + at, payload + sizeof(PointWire), w.samples * sizeof(double));
  }
  if (a.reports == expected_reports) done(w.point);
}

// Parses the complete frames in c.buf.
void ParseFrames(Child& c, std::vector<PointAgg>& agg, const PointDone& done,
                 int expected_reports) {
  constexpr size_t kHeader = internal::kFrameHeaderSize;
  for (;;) {
    if (c.buf.size() < kHeader) return;
    uint32_t len = 0;
    std::memcpy(&len, c.buf.data() + 1, 4);
    if (c.buf.size() < kHeader + len) return;
    const char type = c.buf[0];
    const char* payload = c.buf.data() + kHeader;
    if (type == internal::kFramePort && len == sizeof(uint16_t)) {
      std::memcpy(&c.port, payload, sizeof(uint16_t));
      c.got_port = true;
    } else if (type == internal::kFrameError) {
      c.error.assign(payload, len);
    } else if (type == internal::kFrameResult && len >= sizeof(PointWire)) {
      AddResult(payload, len, agg, done, expected_reports);
    }
    c.buf.erase(0, kHeader + len);
  }
}

void KillAll(std::vector<Child>& children) {
  for (Child& c : children) {
    if (c.pid > 0 && !c.exited) kill(c.pid, SIGKILL);
  }
  for (Child& c : children) {
    if (c.pid > 0 && !c.exited) {
      while (waitpid(c.pid, &c.status, 0) < 0 && errno == EINTR) {
      }
      c.exited = true;
    }
    if (c.fd >= 0) ::close(c.fd);
    c.fd = -1;
  }
}

// The failures Pump has seen, root cause first.
struct Failures {
  std::optional<absl::Time> first_at;
  std::vector<std::string> errors;
  void Note(const std::string& e) {
    if (std::find(errors.begin(), errors.end(), e) == errors.end()) errors.push_back(e);
    if (!first_at) first_at = absl::Now();
  }
};

// Reaps the children that exited and notes those that failed; true when
// every child has exited and closed its pipe.
bool Reap(std::vector<Child>& children, Failures& failures) {
  bool all_done = true;
  for (Child& c : children) {
    if (!c.exited && waitpid(c.pid, &c.status, WNOHANG) == c.pid) c.exited = true;
    if (c.exited && c.eof && !(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0)) {
      failures.Note(DescribeExit(c));
    }
    all_done &= c.exited && c.eof;
  }
  return all_done;
}

absl::Status NoProgress(const Options& opt, const std::vector<Child>& children) {
  std::vector<std::string> stuck;
  for (const Child& c : children) {
    if (!c.exited) stuck.push_back(absl::StrCat(c.role, " (pid ", c.pid, ")"));
  }
  return MakeError(absl::StatusCode::kDeadlineExceeded, 0,
                   absl::StrCat("no progress for ", absl::FormatDuration(opt.timeout),
                                "; killing ", absl::StrJoin(stuck, ", ")),
                   "a peer is hung: rerun with ZSOCK_LOG_LEVEL=debug, or raise --timeout "
                   "if the machine is very loaded");
}

// Waits up to 50 ms for reports and parses what came; *progress is set
// when any arrived. Sleeps briefly when every pipe is closed already.
absl::Status ReadReports(std::vector<Child>& children, std::vector<PointAgg>& agg,
                         const PointDone& done, int expected_reports, Failures& failures,
                         bool* progress) {
  std::vector<pollfd> pfds;
  std::vector<size_t> which;
  for (size_t i = 0; i < children.size(); ++i) {
    if (!children[i].eof) {
      pfds.push_back(pollfd{children[i].fd, POLLIN, 0});
      which.push_back(i);
    }
  }
  if (pfds.empty()) {
    usleep(2000);  // every pipe closed: waiting for the exits
    return absl::OkStatus();
  }
  int n = poll(pfds.data(), pfds.size(), 50);
  if (n < 0 && errno != EINTR) return ErrnoError(errno, "poll on report pipes failed");
  for (size_t j = 0; n > 0 && j < pfds.size(); ++j) {
    if (pfds[j].revents == 0) continue;
    Child& c = children[which[j]];
    char tmp[65536];
    ssize_t r = read(c.fd, tmp, sizeof(tmp));
    if (r > 0) {
      c.buf.append(tmp, static_cast<size_t>(r));
      ParseFrames(c, agg, done, expected_reports);
      *progress = true;
      if (!c.error.empty()) failures.Note(c.error);
    } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
      c.eof = true;
    }
  }
  return absl::OkStatus();
}

// Reads reports and reaps children until all exited, one failed, or nothing
// happened for opt.timeout. `until_port`: return once children[0] sent its port.
// On a failure it keeps reading for a moment, so that the root cause (the
// first process to report) and its consequences (its peers losing the
// connection) are all in the message, root cause first.
absl::Status Pump(const Options& opt, std::vector<Child>& children, std::vector<PointAgg>& agg,
                  const PointDone& done, int expected_reports, bool until_port) {
  absl::Time last = absl::Now();
  Failures failures;
  for (;;) {
    const bool all_done = Reap(children, failures);
    if (failures.first_at &&
        (all_done || absl::Now() - *failures.first_at > absl::Milliseconds(300))) {
      return MakeError(absl::StatusCode::kAborted, 0, absl::StrJoin(failures.errors, "; then "));
    }
    if (!failures.first_at && until_port && children[0].got_port) return absl::OkStatus();
    if (all_done) return absl::OkStatus();
    if (!failures.first_at && absl::Now() - last > opt.timeout) {
      return NoProgress(opt, children);
    }
    bool progress = false;
    if (auto s = ReadReports(children, agg, done, expected_reports, failures, &progress);
        !s.ok()) {
      return s;
    }
    if (progress) last = absl::Now();
  }
}

double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}

// The record of point `pi` from what its processes reported (sorts the
// samples).
Record MakeRecord(const Options& opt, const Run& run, int pi, PointAgg& a) {
  const Point& p = run.points[pi];
  Record r;
  r.test = std::string(TestName(opt.test));
  r.transport = run.transport->name;
  r.mode = run.transport->mode;
  r.msg_size = p.size;
  r.iterations = a.iterations;
  r.seconds = a.seconds;
  if (!a.samples.empty()) {
    std::sort(a.samples.begin(), a.samples.end());
    double sum = 0;
    for (double v : a.samples) sum += v;
    r.lat_us_p50 = Percentile(a.samples, 0.50);
    r.lat_us_p99 = Percentile(a.samples, 0.99);
    r.lat_us_avg = sum / static_cast<double>(a.samples.size());
  }
  if (a.seconds > 0) {
    r.bw_gbps = static_cast<double>(a.bytes) / a.seconds / 1e9;
    r.msg_rate = static_cast<double>(a.messages) / a.seconds;
  }
  switch (internal::TestParam(opt.test)) {
    case Param::kCompute: r.compute_us = p.compute_us; break;
    case Param::kWindow: r.window = p.window; break;
    case Param::kClients: r.clients = run.clients; break;
    case Param::kStreams: r.streams = run.streams; break;
    case Param::kNone: break;
  }
  return r;
}

// --progress: one line on stderr per completed point.
void PrintProgress(const Options& opt, const Record& r, int point_no, int total_points,
                   absl::Time start) {
  std::string what;
  if (r.lat_us_p50) {
    what = absl::StrFormat("p50 %.2f us", *r.lat_us_p50);
  } else if (TestMetric(opt.test) == Metric::kMessageRate) {
    what = absl::StrFormat("%.3f Mmsg/s", r.msg_rate / 1e6);
  } else {
    what = absl::StrFormat("%.3f GB/s", r.bw_gbps);
  }
  std::string param;
  const Param p = internal::TestParam(opt.test);
  if (auto v = internal::ParamValue(p, r)) {
    param = absl::StrCat(" ", internal::ParamName(p), "=", *v);
  }
  std::fprintf(stderr, "zsock_bench: [%d/%d] %s %s/%s %s%s: %s (%.1f s)\n", point_no,
               total_points, r.test.c_str(), r.transport.c_str(), r.mode.c_str(),
               SizeLabel(r.msg_size).c_str(), param.c_str(), what.c_str(),
               absl::ToDoubleSeconds(absl::Now() - start));
}

// Forks the clients of `run` (each closes the pipes of the processes before
// it) and adds them to `children`.
absl::Status SpawnClients(const Options& opt, const Run& run, uint16_t port,
                          std::vector<Child>& children) {
  for (int64_t i = 0; i < run.clients; ++i) {
    std::vector<int> parent_fds;
    for (const Child& c : children) parent_fds.push_back(c.fd);
    std::string role = run.clients > 1 ? absl::StrCat("client ", i) : "client";
    auto client = Spawn(opt, run, role, opt.client_core, static_cast<int>(i), port,
                        parent_fds, internal::ClientMain);
    if (!client.ok()) return client.status();
    children.push_back(std::move(*client));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Record>> RunOne(const Options& opt, const Run& run, int* point_no,
                                           int total_points) {
  const Transport& t = *run.transport;
  std::vector<PointAgg> agg(run.points.size());
  std::vector<Record> out;
  const int expected = opt.test == Test::kHotspot ? static_cast<int>(run.clients) : 1;
  const absl::Time start = absl::Now();
  auto done = [&](int pi) {
    Record r = MakeRecord(opt, run, pi, agg[pi]);
    ++*point_no;
    if (opt.progress) PrintProgress(opt, r, *point_no, total_points, start);
    out.push_back(std::move(r));
  };
  std::vector<Child> children;
  auto fail = [&](absl::Status s) {
    KillAll(children);
    return absl::Status(s.code(), absl::StrCat(TestName(opt.test), " over ", t.name, "/",
                                               t.mode, ": ", s.message()));
  };
  auto server = Spawn(opt, run, "server", opt.server_core, 0, 0, {}, internal::ServerMain);
  if (!server.ok()) return fail(server.status());
  children.push_back(std::move(*server));
  if (auto s = Pump(opt, children, agg, done, expected, /*until_port=*/true); !s.ok()) {
    return fail(s);
  }
  if (!children[0].got_port) {
    return fail(MakeError(absl::StatusCode::kInternal, 0,
                          "the server exited before it listened"));
  }
  if (auto s = SpawnClients(opt, run, children[0].port, children); !s.ok()) return fail(s);
  if (auto s = Pump(opt, children, agg, done, expected, /*until_port=*/false); !s.ok()) {
    return fail(s);
  }
  KillAll(children);  // all exited: closes the pipes
  if (out.size() != run.points.size()) {
    return fail(MakeError(absl::StatusCode::kInternal, 0,
                          absl::StrCat("the processes exited after reporting ", out.size(),
                                       " of ", run.points.size(), " points")));
  }
  return out;
}

}  // namespace

BenchResult RunBench(const Options& options) {
  BenchResult result;
  std::vector<Run> runs = internal::Plan(options);
  int total = 0;
  for (const Run& r : runs) total += static_cast<int>(r.points.size());
  int point_no = 0;
  for (const Run& run : runs) {
    const int before = point_no;
    auto records = RunOne(options, run, &point_no, total);
    if (!records.ok()) {
      point_no = before + static_cast<int>(run.points.size());
      result.failures.emplace_back(records.status().message());
      if (options.progress) {
        std::fprintf(stderr, "zsock_bench: FAILED: %s\n",
                     std::string(records.status().message()).c_str());
      }
      continue;
    }
    for (Record& r : *records) result.records.push_back(std::move(r));
  }
  internal::AddBaselineRatios(options, &result.records);
  return result;
}

}  // namespace zsock::bench
