#include "bench/harness.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/clock.h"
#include "bench/samples.h"
#include "core/config.h"
#include "core/provider.h"
#include "core/status.h"

namespace zsock::bench {
namespace {

// ---------------------------------------------------------------------------
// Tests and their parameters.

struct TestInfo {
  Test test;
  const char* name;
  const char* description;
  Metric metric;
  const char* default_sizes;
};

constexpr char kSweep[] = "8,64,512,4K,16K,64K,256K,1M";

const TestInfo kTests[] = {
    {Test::kPingpong, "pingpong",
     "one-way latency (round trip / 2) of one message bounced between client and server "
     "(seed 003 fig. 6a)",
     Metric::kLatency, kSweep},
    {Test::kStream, "stream",
     "uni-directional throughput, ttcp-like: the client streams, the server acks the end "
     "(fig. 6b)",
     Metric::kBandwidth, kSweep},
    {Test::kOverlap, "overlap",
     "stream throughput with --compute_us of busy computation between sends (fig. 7)",
     Metric::kBandwidth, "64K,1M"},
    {Test::kPagefault, "pagefault",
     "stream throughput when the sender rewrites its buffer and the receiver reads it every "
     "--window transfers (fig. 8)",
     Metric::kBandwidth, "64K,1M"},
    {Test::kHotspot, "hotspot",
     "one-way latency when --clients processes ping-pong with one server at once (fig. 9a)",
     Metric::kLatency, kSweep},
    {Test::kMultistream, "multistream",
     "aggregate throughput of --streams concurrent streams (threads) between one pair of "
     "processes (fig. 9b)",
     Metric::kBandwidth, "64K"},
    {Test::kFanin, "fanin",
     "aggregate throughput the server receives from --clients streaming processes (fig. 10a)",
     Metric::kBandwidth, kSweep},
    {Test::kFanout, "fanout",
     "aggregate throughput the server sends to --clients receiving processes (fig. 10b)",
     Metric::kBandwidth, kSweep},
    {Test::kMsgrate, "msgrate",
     "small messages per second in one direction, --inflight outstanding per acknowledgement",
     Metric::kMessageRate, "8"},
    {Test::kConnect, "connect",
     "connections set up, used for one byte each way, and torn down per second",
     Metric::kConnectRate, ""},
};

const TestInfo& Info(Test test) {
  for (const TestInfo& info : kTests) {
    if (info.test == test) return info;
  }
  return kTests[0];
}

// The extra parameter a test sweeps (besides the message size), if any.
enum class Param { kNone, kCompute, kWindow, kClients, kStreams };

Param TestParam(Test test) {
  switch (test) {
    case Test::kOverlap: return Param::kCompute;
    case Test::kPagefault: return Param::kWindow;
    case Test::kHotspot:
    case Test::kFanin:
    case Test::kFanout: return Param::kClients;
    case Test::kMultistream: return Param::kStreams;
    default: return Param::kNone;
  }
}

const char* ParamName(Param param) {
  switch (param) {
    case Param::kCompute: return "compute_us";
    case Param::kWindow: return "window";
    case Param::kClients: return "clients";
    case Param::kStreams: return "streams";
    case Param::kNone: break;
  }
  return "";
}

std::optional<int64_t> ParamValue(Param param, const Record& r) {
  switch (param) {
    case Param::kCompute: return r.compute_us;
    case Param::kWindow: return r.window;
    case Param::kClients: return r.clients;
    case Param::kStreams: return r.streams;
    case Param::kNone: break;
  }
  return std::nullopt;
}

constexpr size_t kMaxSize = size_t{256} << 20;
constexpr int64_t kMaxProcs = 64;
// The data paths ("all" runs each).
constexpr const char* kModes[] = {"bcopy", "zcopy", "azcopy"};

absl::Status Invalid(absl::string_view what, absl::string_view fix) {
  return MakeError(absl::StatusCode::kInvalidArgument, 0, what, fix);
}

}  // namespace

absl::string_view TestName(Test test) { return Info(test).name; }
absl::string_view TestDescription(Test test) { return Info(test).description; }
Metric TestMetric(Test test) { return Info(test).metric; }

const std::vector<Test>& AllTests() {
  static const auto* all = [] {
    auto* v = new std::vector<Test>;
    for (const TestInfo& info : kTests) v->push_back(info.test);
    return v;
  }();
  return *all;
}

absl::StatusOr<Test> ParseTest(absl::string_view name) {
  std::vector<std::string> names;
  for (const TestInfo& info : kTests) {
    if (name == info.name) return info.test;
    names.push_back(info.name);
  }
  return Invalid(name.empty() ? std::string("--test is required")
                              : absl::StrCat("unknown --test='", name, "'"),
                 absl::StrCat("use one of ", absl::StrJoin(names, ", ")));
}

absl::StatusOr<std::vector<size_t>> ParseSizeList(absl::string_view flag,
                                                  absl::string_view text) {
  std::vector<size_t> out;
  const std::string fix = absl::StrCat("write --", flag,
                                       "=LIST of sizes in bytes, e.g. 8,64,4K,1M (K, M, G "
                                       "= 1024, 1024^2, 1024^3; at most 256M each)");
  if (absl::StripAsciiWhitespace(text).empty()) {
    return Invalid(absl::StrCat("--", flag, " is empty"), fix);
  }
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    absl::string_view s = absl::StripAsciiWhitespace(item);
    uint64_t mult = 1;
    if (!s.empty()) {
      switch (absl::ascii_toupper(s.back())) {
        case 'K': mult = uint64_t{1} << 10; break;
        case 'M': mult = uint64_t{1} << 20; break;
        case 'G': mult = uint64_t{1} << 30; break;
        default: break;
      }
      if (mult != 1) s.remove_suffix(1);
    }
    uint64_t v = 0;
    if (s.empty() || !absl::ascii_isdigit(static_cast<unsigned char>(s[0])) ||
        !absl::SimpleAtoi(s, &v) || v == 0 || v > kMaxSize / mult) {
      return Invalid(absl::StrCat("bad --", flag, "='", text, "': '", item,
                                  "' is not a size between 1 byte and 256M"),
                     fix);
    }
    out.push_back(static_cast<size_t>(v * mult));
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> ParseIntList(absl::string_view flag,
                                                  absl::string_view text, int64_t min) {
  std::vector<int64_t> out;
  const std::string fix =
      absl::StrCat("write --", flag, "=LIST of integers >= ", min, ", e.g. --", flag, "=",
                   min, ",", min + 1, ",", min + 4);
  if (absl::StripAsciiWhitespace(text).empty()) {
    return Invalid(absl::StrCat("--", flag, " is empty"), fix);
  }
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    absl::string_view s = absl::StripAsciiWhitespace(item);
    if (!absl::SimpleAtoi(s, &v) || v < min || v > 1000000) {
      return Invalid(absl::StrCat("bad --", flag, "='", text, "': '", item,
                                  "' is not an integer between ", min, " and 1000000"),
                     fix);
    }
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<Options> ParseOptions(const RawOptions& raw) {
  Options opt;
  auto test = ParseTest(raw.test);
  if (!test.ok()) return test.status();
  opt.test = *test;
  const Param param = TestParam(opt.test);
  const std::string tname(TestName(opt.test));

  // Numbers.
  auto positive = [](absl::string_view flag, int64_t v, int64_t min, int64_t max,
                     absl::string_view what) -> absl::Status {
    if (v < min || v > max) {
      return Invalid(absl::StrCat("bad --", flag, "=", v, ": must be ", min, "..", max),
                     absl::StrCat("--", flag, " is ", what));
    }
    return absl::OkStatus();
  };
  if (auto s = positive("iters", raw.iters, 1, int64_t{1} << 32,
                        "the round trips (connections) per point at small sizes");
      !s.ok()) {
    return s;
  }
  if (auto s = positive("bytes", raw.bytes, 1, int64_t{1} << 40,
                        "the payload bytes per streaming point");
      !s.ok()) {
    return s;
  }
  if (raw.warmup != -1) {
    if (auto s = positive("warmup", raw.warmup, 0, int64_t{1} << 32,
                          "the untimed round trips / messages before each point");
        !s.ok()) {
      return s;
    }
  }
  if (auto s = positive("inflight", raw.inflight, 1, 1 << 20,
                        "the messages msgrate sends per acknowledgement");
      !s.ok()) {
    return s;
  }
  if (auto s = positive("timeout", raw.timeout_s, 1, 86400,
                        "the seconds without progress after which a run is killed");
      !s.ok()) {
    return s;
  }
  const int64_t ncpu = std::max<int64_t>(1, sysconf(_SC_NPROCESSORS_ONLN));
  for (auto [flag, v] : {std::pair<const char*, int64_t>{"server_core", raw.server_core},
                         std::pair<const char*, int64_t>{"client_core", raw.client_core}}) {
    if (v < 0 || v >= ncpu) {
      return Invalid(absl::StrCat("bad --", flag, "=", v, ": this machine has ", ncpu,
                                  " online CPUs (0..", ncpu - 1, ")"),
                     absl::StrCat("pick a core in 0..", ncpu - 1));
    }
  }
  opt.iters = raw.iters;
  opt.bytes = raw.bytes;
  opt.warmup = raw.warmup == -1 ? 100 : raw.warmup;
  opt.inflight = raw.inflight;
  opt.timeout = absl::Seconds(raw.timeout_s);
  opt.server_core = static_cast<int>(raw.server_core);
  opt.client_core = static_cast<int>(raw.client_core);
  opt.progress = raw.progress;
  opt.stats = raw.stats;
  if (raw.inflight != 64 && opt.test != Test::kMsgrate) {
    return Invalid(absl::StrCat("--inflight applies to --test=msgrate, not --test=", tname),
                   "drop --inflight");
  }

  // Sizes.
  if (opt.test == Test::kConnect) {
    if (!raw.sizes.empty()) {
      return Invalid("--sizes does not apply to --test=connect (one byte each way per "
                     "connection)",
                     "drop --sizes");
    }
    opt.sizes = {1};
  } else {
    auto sizes = ParseSizeList("sizes", raw.sizes.empty() ? Info(opt.test).default_sizes
                                                          : raw.sizes);
    if (!sizes.ok()) return sizes.status();
    opt.sizes = *sizes;
  }

  // Test-specific lists.
  struct ListFlag {
    const char* flag;
    const std::string* text;
    Param param;
    const char* def;
    int64_t min;
    std::vector<int64_t>* out;
    int64_t max;
  };
  const ListFlag lists[] = {
      {"compute_us", &raw.compute_us, Param::kCompute, "0,10,20,50,100,200", 0,
       &opt.compute_us, 1000000},
      {"window", &raw.window, Param::kWindow, "1,2,4,8,16,32,64", 1, &opt.windows, 1000000},
      {"clients", &raw.clients, Param::kClients, "4", 1, &opt.clients, kMaxProcs},
      {"streams", &raw.streams, Param::kStreams, "1,2,4,8", 1, &opt.streams, kMaxProcs},
  };
  for (const ListFlag& l : lists) {
    if (l.param != param) {
      if (!l.text->empty()) {
        std::vector<std::string> users;
        for (const TestInfo& info : kTests) {
          if (TestParam(info.test) == l.param) users.push_back(absl::StrCat("--test=", info.name));
        }
        return Invalid(absl::StrCat("--", l.flag, " applies to ", absl::StrJoin(users, ", "),
                                    ", not --test=", tname),
                       absl::StrCat("drop --", l.flag));
      }
      continue;
    }
    auto v = ParseIntList(l.flag, l.text->empty() ? l.def : *l.text, l.min);
    if (!v.ok()) return v.status();
    for (int64_t x : *v) {
      if (x > l.max) {
        return Invalid(absl::StrCat("bad --", l.flag, "=", x, ": at most ", l.max),
                       absl::StrCat("use --", l.flag, " values up to ", l.max));
      }
    }
    *l.out = *v;
  }

  // Modes.
  std::vector<std::string> modes;
  if (raw.mode == "all") {
    modes.assign(std::begin(kModes), std::end(kModes));
  } else {
    for (absl::string_view m : absl::StrSplit(raw.mode, ',')) {
      if (std::find(std::begin(kModes), std::end(kModes), m) == std::end(kModes)) {
        return Invalid(absl::StrCat("unknown --mode='", raw.mode, "'"),
                       "use bcopy, zcopy, azcopy, a comma list of them, or all");
      }
      if (std::find(modes.begin(), modes.end(), m) == modes.end()) modes.emplace_back(m);
    }
  }

  // Baseline.
  bool baseline = false;
  if (raw.baseline == "tcp") {
    baseline = true;
  } else if (!raw.baseline.empty() && raw.baseline != "none") {
    return Invalid(absl::StrCat("unknown --baseline='", raw.baseline, "'"),
                   "the baseline is kernel TCP: write --baseline=tcp, or leave it out");
  }

  // Transports.
  Transport tcp;
  tcp.name = "tcp";
  tcp.mode = "kernel";
  tcp.ops = &KernelTcpOps();
  if (raw.provider.empty()) {
    return Invalid("--provider is empty",
                   "name a provider config (e.g. unet, ofi:tcp;ofi_rxm, ucx:tcp) or tcp for "
                   "kernel TCP alone");
  }
  if (raw.provider == "tcp") {
    if (baseline) {
      return Invalid("--provider=tcp with --baseline=tcp would measure kernel TCP twice",
                     "drop --baseline, or name a zsock provider in --provider");
    }
    opt.transports.push_back(tcp);
    return opt;
  }
  // The registry's own error for a name no provider answers to.
  FabricSpec spec;
  auto provider = FindProvider(raw.provider, &spec);
  if (!provider.ok()) {
    return absl::Status(provider.status().code(),
                        absl::StrCat(provider.status().message(),
                                     "; or --provider=tcp for kernel TCP alone"));
  }
  auto ops = ZsockOps();
  if (!ops.ok()) return ops.status();
  for (const std::string& m : modes) {
    Transport t;
    t.name = raw.provider;
    t.mode = m;
    t.ops = *ops;
    t.env = {{"ZSOCK_PROVIDER", raw.provider}, {"ZSOCK_MODE", m}};
    opt.transports.push_back(std::move(t));
  }
  if (baseline) {
    tcp.is_baseline = true;
    opt.transports.push_back(tcp);
  }
  return opt;
}

// ---------------------------------------------------------------------------
// The measurement plan.

namespace {

struct Point {
  size_t size = 0;
  int64_t compute_us = 0;
  int64_t window = 0;
  int64_t count = 0;   // timed round trips / messages / connections per process or stream
  int64_t warmup = 0;  // untimed ones before them
};

struct Run {
  const Transport* transport = nullptr;
  int64_t clients = 1;  // client processes
  int64_t streams = 1;  // connections per client process (threads)
  std::vector<Point> points;
};

int64_t LatencyCount(const Options& o, size_t size) {
  constexpr size_t kSmall = 16 << 10;
  if (size <= kSmall) return o.iters;
  return std::max<int64_t>(std::min<int64_t>(o.iters, 100),
                           static_cast<int64_t>(static_cast<double>(o.iters) * kSmall / size));
}

int64_t StreamCount(const Options& o, size_t size) {
  int64_t n = o.bytes / static_cast<int64_t>(size);
  n = std::min(n, o.iters * 10);
  return std::max<int64_t>(n, 16);
}

std::vector<Run> Plan(const Options& o) {
  std::vector<Run> runs;
  for (const Transport& t : o.transports) {
    std::vector<int64_t> procs = {1};
    if (TestParam(o.test) == Param::kClients) procs = o.clients;
    if (TestParam(o.test) == Param::kStreams) procs = o.streams;
    for (int64_t n : procs) {
      Run run;
      run.transport = &t;
      if (TestParam(o.test) == Param::kClients) run.clients = n;
      if (TestParam(o.test) == Param::kStreams) run.streams = n;
      for (size_t size : o.sizes) {
        std::vector<Point> base;
        Point p;
        p.size = size;
        switch (o.test) {
          case Test::kPingpong:
            p.count = LatencyCount(o, size);
            break;
          case Test::kHotspot:
            p.count = std::max<int64_t>(std::min<int64_t>(o.iters, 50),
                                        LatencyCount(o, size) / n);
            break;
          case Test::kConnect:
            p.count = std::max<int64_t>(std::min<int64_t>(o.iters, 50), o.iters / 10);
            break;
          case Test::kMultistream:
          case Test::kFanin:
          case Test::kFanout:
            p.count = std::max<int64_t>(16, StreamCount(o, size) / n);
            break;
          default:
            p.count = StreamCount(o, size);
            break;
        }
        p.warmup = std::min(o.warmup, std::max<int64_t>(1, p.count / 10));
        if (o.test == Test::kOverlap) {
          for (int64_t c : o.compute_us) {
            p.compute_us = c;
            run.points.push_back(p);
          }
        } else if (o.test == Test::kPagefault) {
          for (int64_t w : o.windows) {
            p.window = w;
            run.points.push_back(p);
          }
        } else {
          run.points.push_back(p);
        }
      }
      runs.push_back(std::move(run));
    }
  }
  return runs;
}

// ---------------------------------------------------------------------------
// Child side: everything below runs in forked processes, which report to the
// parent through a pipe in frames [type u8][length u32][payload] and end with
// _exit. A failure writes an 'E' frame with its cause and exits 1.

constexpr char kFramePort = 'P';
constexpr char kFrameResult = 'R';
constexpr char kFrameError = 'E';

struct PointWire {
  int32_t point;
  int32_t pad;
  int64_t iterations;
  int64_t bytes;
  int64_t messages;
  double seconds;
  int64_t samples;
};

struct ChildEnv {
  const Options* opt = nullptr;
  const Run* run = nullptr;
  const SockOps* ops = nullptr;
  int out_fd = -1;
  std::string role;
  int index = 0;  // client index
  uint16_t port = 0;
};

ChildEnv g_child;  // one per process (set after fork)

// --stats: the counters of connection `fd` that moved since the previous
// call for it (and the current values of the two that are levels), one line
// on stderr. Nothing for transports without counters (kernel TCP).
void PrintStats(int fd, int pi) {
  if (!g_child.opt->stats || g_child.ops->stats == nullptr) return;
  static std::map<int, std::vector<uint64_t>> last;
  const auto now = g_child.ops->stats(fd);
  if (now.empty()) return;
  std::vector<uint64_t>& prev = last[fd];
  prev.resize(now.size());
  std::string line = absl::StrCat("stats: ", g_child.role, " connection fd ", fd, " after point ",
                                  pi, ":");
  for (size_t i = 0; i < now.size(); ++i) {
    const absl::string_view name = now[i].first;
    const bool level = name == "queued_bytes" || name == "held_bytes";
    const uint64_t v = level ? now[i].second : now[i].second - prev[i];
    if (v != 0) absl::StrAppend(&line, " ", name, "=", v);
    prev[i] = now[i].second;
  }
  line += "\n";
  (void)!::write(STDERR_FILENO, line.data(), line.size());
}

void WriteFrame(char type, const void* payload, size_t len) {
  std::string frame(1, type);
  uint32_t n = static_cast<uint32_t>(len);
  frame.append(reinterpret_cast<const char*>(&n), sizeof(n));
  frame.append(static_cast<const char*>(payload), len);
  const char* p = frame.data();
  size_t left = frame.size();
  while (left > 0) {
    ssize_t w = ::write(g_child.out_fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) _exit(3);  // the parent is gone
    p += w;
    left -= static_cast<size_t>(w);
  }
}

[[noreturn]] void Die(const std::string& what) {
  std::string msg = absl::StrCat(g_child.role, ": ", what);
  WriteFrame(kFrameError, msg.data(), msg.size());
  _exit(1);
}

std::string Errno(int err) { return std::strerror(err); }

// Timestamps: NowNs from bench/clock.h (the TSC where invariant; the same
// clock for zsock and the kernel TCP baseline).

int TimeoutMs() {
  return static_cast<int>(
      std::min<int64_t>(absl::ToInt64Milliseconds(g_child.opt->timeout), 1 << 30));
}

// Busy computation for `us` microseconds (overlap test).
void Compute(int64_t us) {
  const int64_t end = NowNs() + us * 1000;
  volatile uint64_t x = 1;
  while (NowNs() < end) x = x * 6364136223846793005ULL + 1;
}

// ---- data pattern ----

uint64_t Seed(int point, int64_t epoch) {
  return (static_cast<uint64_t>(point + 1) << 40) ^
         (static_cast<uint64_t>(epoch + 1) * 0xD6E8FEB86659FD93ULL);
}

inline uint64_t PatternWord(size_t i, uint64_t seed) {
  return (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ULL ^ seed;
}

void Fill(uint8_t* p, size_t n, uint64_t seed) {
  size_t words = n / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w = PatternWord(i, seed);
    std::memcpy(p + 8 * i, &w, 8);
  }
  if (n % 8 != 0) {
    uint64_t w = PatternWord(words, seed);
    std::memcpy(p + 8 * words, &w, n % 8);
  }
}

[[noreturn]] void Mismatch(const uint8_t* p, size_t n, uint64_t seed, size_t word,
                           absl::string_view what) {
  uint64_t w = PatternWord(word, seed);
  const auto* e = reinterpret_cast<const uint8_t*>(&w);
  size_t off = 8 * word;
  while (off + 1 < n && off + 1 < 8 * word + 8 && p[off] == e[off - 8 * word]) ++off;
  Die(absl::StrFormat(
      "data corrupted: %s (%zu bytes) differs from what was sent at byte %zu "
      "(expected 0x%02x, got 0x%02x); the transport lost, reordered or damaged data",
      what, n, off, e[off - 8 * word], p[off]));
}

void Check(const uint8_t* p, size_t n, uint64_t seed, absl::string_view what) {
  const size_t words = n / 8;
  uint64_t diff = 0;
  for (size_t i = 0; i < words; ++i) {  // branch-free, so it vectorizes
    uint64_t got;
    std::memcpy(&got, p + 8 * i, 8);
    diff |= got ^ PatternWord(i, seed);
  }
  if (diff != 0) {
    for (size_t i = 0; i < words; ++i) {
      uint64_t got;
      std::memcpy(&got, p + 8 * i, 8);
      if (got != PatternWord(i, seed)) Mismatch(p, n, seed, i, what);
    }
  }
  if (n % 8 != 0) {
    uint64_t w = PatternWord(words, seed);
    if (std::memcmp(p + 8 * words, &w, n % 8) != 0) Mismatch(p, n, seed, words, what);
  }
}

// A page-aligned buffer (zero-copy paths and AZ-SDP work on whole pages).
class Buffer {
 public:
  explicit Buffer(size_t len) : len_(std::max<size_t>(len, 8)) {
    void* p = mmap(nullptr, len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) Die(absl::StrCat("mmap of ", len_, " bytes failed: ", Errno(errno)));
    p_ = static_cast<uint8_t*>(p);
  }
  ~Buffer() { munmap(p_, len_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* data() { return p_; }

 private:
  size_t len_;
  uint8_t* p_;
};

// ---- socket helpers (every wait is bounded by --timeout) ----

void WaitFd(int fd, short events, absl::string_view what) {
  pollfd pfd{fd, events, 0};
  for (;;) {
    int n = g_child.ops->poll(&pfd, 1, TimeoutMs());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) Die(absl::StrCat("poll during ", what, " failed: ", Errno(errno)));
    if (n == 0) {
      Die(absl::StrCat("the peer made no progress for ",
                       absl::FormatDuration(g_child.opt->timeout), " during ", what));
    }
    return;
  }
}

void SendAll(int fd, const void* buf, size_t len, absl::string_view what) {
  const auto* p = static_cast<const uint8_t*>(buf);
  while (len > 0) {
    ssize_t n = g_child.ops->send(fd, p, len, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      WaitFd(fd, POLLOUT, what);
      continue;
    }
    Die(absl::StrCat("send during ", what, " failed: ",
                     n == 0 ? std::string("sent 0 bytes") : Errno(errno)));
  }
}

void RecvAll(int fd, void* buf, size_t len, absl::string_view what) {
  auto* p = static_cast<uint8_t*>(buf);
  while (len > 0) {
    ssize_t n = g_child.ops->recv(fd, p, len, 0);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) Die(absl::StrCat("the peer closed the connection during ", what));
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      WaitFd(fd, POLLIN, what);
      continue;
    }
    Die(absl::StrCat("recv during ", what, " failed: ", Errno(errno)));
  }
}

void SetNoDelay(int fd) {
  int one = 1;
  if (g_child.ops->setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    Die(absl::StrCat("setsockopt(TCP_NODELAY) failed: ", Errno(errno)));
  }
}

// Blocking calls give up after --timeout (the poll in WaitFd then decides).
// A transport without SO_RCVTIMEO still has the parent's watchdog.
void SetTimeouts(int fd) {
  timeval tv{};
  int64_t ms = TimeoutMs();
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  (void)g_child.ops->setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  (void)g_child.ops->setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

void SetNonBlocking(int fd) {
  int flags = g_child.ops->fcntl(fd, F_GETFL);
  if (flags < 0 || g_child.ops->fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    Die(absl::StrCat("fcntl(O_NONBLOCK) failed: ", Errno(errno)));
  }
}

sockaddr_in Loopback(uint16_t port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return sa;
}

int ListenLoopback(uint16_t* port) {
  const SockOps* ops = g_child.ops;
  int fd = ops->socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) Die(absl::StrCat("socket failed: ", Errno(errno)));
  int one = 1;
  (void)ops->setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa = Loopback(0);
  if (ops->bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    Die(absl::StrCat("bind to 127.0.0.1 failed: ", Errno(errno)));
  }
  if (ops->listen(fd, 1024) != 0) Die(absl::StrCat("listen failed: ", Errno(errno)));
  socklen_t len = sizeof(sa);
  if (ops->getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    Die(absl::StrCat("getsockname failed: ", Errno(errno)));
  }
  *port = ntohs(sa.sin_port);
  SetTimeouts(fd);
  return fd;
}

int AcceptOne(int lfd, bool configure) {
  for (;;) {
    int fd = g_child.ops->accept(lfd, nullptr, nullptr);
    if (fd >= 0) {
      if (configure) {
        SetNoDelay(fd);
        SetTimeouts(fd);
      }
      return fd;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      WaitFd(lfd, POLLIN, "accept");
      continue;
    }
    Die(absl::StrCat("accept failed: ", Errno(errno)));
  }
}

int ConnectLoopback(uint16_t port, bool configure) {
  const SockOps* ops = g_child.ops;
  int fd = ops->socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) Die(absl::StrCat("socket failed: ", Errno(errno)));
  SetNoDelay(fd);
  if (configure) SetTimeouts(fd);
  sockaddr_in sa = Loopback(port);
  while (ops->connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    if (errno == EINTR) continue;
    Die(absl::StrCat("connect to 127.0.0.1:", port, " failed: ", Errno(errno)));
  }
  return fd;
}

void CloseFd(int fd) {
  if (g_child.ops->close(fd) != 0 && errno != EINTR) {
    Die(absl::StrCat("close failed: ", Errno(errno)));
  }
}

// ---- reporting ----

void Report(int point, int64_t iterations, int64_t bytes, int64_t messages, double seconds,
            const std::vector<double>& samples) {
  PointWire w{};
  w.point = point;
  w.iterations = iterations;
  w.bytes = bytes;
  w.messages = messages;
  w.seconds = seconds;
  w.samples = static_cast<int64_t>(samples.size());
  std::string payload(reinterpret_cast<const char*>(&w), sizeof(w));
  payload.append(reinterpret_cast<const char*>(samples.data()),
                 samples.size() * sizeof(double));
  WriteFrame(kFrameResult, payload.data(), payload.size());
}

std::string MsgWhat(int point, int64_t k, const Point& p) {
  return absl::StrCat("message ", k, " of point ", point, " (", SizeLabel(p.size), ")");
}

// ---- pingpong / hotspot ----

size_t MaxSize(const Run& run) {
  size_t m = 1;
  for (const Point& p : run.points) m = std::max(m, p.size);
  return m;
}

void PingpongClient(int fd) {
  const Run& run = *g_child.run;
  Buffer out(MaxSize(run)), in(MaxSize(run));
  for (int pi = 0; pi < static_cast<int>(run.points.size()); ++pi) {
    const Point& p = run.points[pi];
    const uint64_t seed = Seed(pi, 0);
    Fill(out.data(), p.size, seed);
    std::vector<double> samples;
    ReserveTouched(&samples, p.count);
    const int64_t total = p.warmup + p.count;
    int64_t t_start = 0;
    for (int64_t k = 0; k < total; ++k) {
      if (k == p.warmup) t_start = NowNs();
      int64_t t0 = NowNs();
      SendAll(fd, out.data(), p.size, "ping");
      RecvAll(fd, in.data(), p.size, "pong");
      int64_t t1 = NowNs();
      if (k >= p.warmup) samples.push_back(static_cast<double>(t1 - t0) / 2000.0);
      if (k == 0 || k == total - 1) Check(in.data(), p.size, seed, MsgWhat(pi, k, p));
    }
    double secs = static_cast<double>(NowNs() - t_start) / 1e9;
    Report(pi, p.count, 2 * p.count * static_cast<int64_t>(p.size), 2 * p.count, secs, samples);
    PrintStats(fd, pi);
  }
}

// Echoes every message on every connection; with several connections
// (hotspot) it serves whichever client is ready.
void PingpongServer(const std::vector<int>& fds) {
  const Run& run = *g_child.run;
  struct Conn {
    int fd;
    int point = 0;
    int64_t k = 0;
  };
  std::vector<Conn> conns;
  for (int fd : fds) conns.push_back(Conn{fd});
  Buffer buf(MaxSize(run));
  const int npoints = static_cast<int>(run.points.size());
  auto serve = [&](Conn& c) {
    const Point& p = run.points[c.point];
    const int64_t total = p.warmup + p.count;
    RecvAll(c.fd, buf.data(), p.size, "ping");
    if (c.k == 0 || c.k == total - 1) {
      Check(buf.data(), p.size, Seed(c.point, 0), MsgWhat(c.point, c.k, p));
    }
    SendAll(c.fd, buf.data(), p.size, "pong");
    if (++c.k == total) {
      PrintStats(c.fd, c.point);
      c.k = 0;
      ++c.point;
    }
  };
  if (conns.size() == 1) {
    while (conns[0].point < npoints) serve(conns[0]);
    return;
  }
  std::vector<pollfd> pfds;
  for (;;) {
    pfds.clear();
    for (const Conn& c : conns) {
      if (c.point < npoints) pfds.push_back(pollfd{c.fd, POLLIN, 0});
    }
    if (pfds.empty()) return;
    int n = g_child.ops->poll(pfds.data(), pfds.size(), TimeoutMs());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) Die(absl::StrCat("poll failed: ", Errno(errno)));
    if (n == 0) {
      Die(absl::StrCat("no client sent anything for ",
                       absl::FormatDuration(g_child.opt->timeout)));
    }
    for (const pollfd& pfd : pfds) {
      if (pfd.revents == 0) continue;
      for (Conn& c : conns) {
        if (c.fd == pfd.fd) serve(c);
      }
    }
  }
}

// ---- streams (stream, overlap, pagefault, msgrate, multistream) ----

// The sending side of one point; returns the timed seconds (first timed send
// to the receiver's acknowledgement of the last byte).
double StreamSendPoint(int fd, int pi, const Point& p, uint8_t* buf) {
  const Test test = g_child.opt->test;
  const int64_t inflight = g_child.opt->inflight;
  Fill(buf, p.size, Seed(pi, 0));
  for (int64_t k = 0; k < p.warmup; ++k) SendAll(fd, buf, p.size, "warm-up send");
  uint8_t ack = 0;
  RecvAll(fd, &ack, 1, "warm-up acknowledgement");
  const int64_t t0 = NowNs();
  for (int64_t k = 0; k < p.count; ++k) {
    if (test == Test::kPagefault && k > 0 && k % p.window == 0) {
      Fill(buf, p.size, Seed(pi, k / p.window));  // touch the buffer every W sends
    }
    SendAll(fd, buf, p.size, "stream send");
    if (test == Test::kOverlap && p.compute_us > 0) Compute(p.compute_us);
    if (test == Test::kMsgrate && (k + 1) % inflight == 0 && k + 1 < p.count) {
      RecvAll(fd, &ack, 1, "message-rate acknowledgement");
    }
  }
  RecvAll(fd, &ack, 1, "end-of-stream acknowledgement");
  const double secs = static_cast<double>(NowNs() - t0) / 1e9;
  PrintStats(fd, pi);
  return secs;
}

void StreamRecvPoint(int fd, int pi, const Point& p, uint8_t* buf) {
  const Test test = g_child.opt->test;
  const int64_t inflight = g_child.opt->inflight;
  const uint8_t ack = 1;
  for (int64_t k = 0; k < p.warmup; ++k) {
    RecvAll(fd, buf, p.size, "warm-up receive");
    if (k == 0) Check(buf, p.size, Seed(pi, 0), MsgWhat(pi, k, p));
  }
  SendAll(fd, &ack, 1, "warm-up acknowledgement");
  for (int64_t k = 0; k < p.count; ++k) {
    RecvAll(fd, buf, p.size, "stream receive");
    if (test == Test::kPagefault) {
      // Read the buffer every W receptions (and the last message).
      if ((k + 1) % p.window == 0 || k == p.count - 1) {
        Check(buf, p.size, Seed(pi, k / p.window), MsgWhat(pi, p.warmup + k, p));
      }
    } else if (k == p.count - 1) {
      Check(buf, p.size, Seed(pi, 0), MsgWhat(pi, p.warmup + k, p));
    }
    if (test == Test::kMsgrate && (k + 1) % inflight == 0 && k + 1 < p.count) {
      SendAll(fd, &ack, 1, "message-rate acknowledgement");
    }
  }
  SendAll(fd, &ack, 1, "end-of-stream acknowledgement");
  PrintStats(fd, pi);
}

void StreamClient(int fd) {
  const Run& run = *g_child.run;
  Buffer buf(MaxSize(run));
  for (int pi = 0; pi < static_cast<int>(run.points.size()); ++pi) {
    const Point& p = run.points[pi];
    double secs = StreamSendPoint(fd, pi, p, buf.data());
    Report(pi, p.count, p.count * static_cast<int64_t>(p.size), p.count, secs, {});
  }
}

void StreamServerConn(int fd) {
  const Run& run = *g_child.run;
  Buffer buf(MaxSize(run));
  for (int pi = 0; pi < static_cast<int>(run.points.size()); ++pi) {
    StreamRecvPoint(fd, pi, run.points[pi], buf.data());
  }
}

// Multistream: one thread per connection on both sides; the client times
// from the moment every stream has finished its warm-up until the last
// stream's end is acknowledged.
void MultistreamClient(const std::vector<int>& fds) {
  const Run& run = *g_child.run;
  const size_t n = fds.size();
  std::vector<std::unique_ptr<Buffer>> bufs;
  for (size_t i = 0; i < n; ++i) bufs.push_back(std::make_unique<Buffer>(MaxSize(run)));
  for (int pi = 0; pi < static_cast<int>(run.points.size()); ++pi) {
    const Point& p = run.points[pi];
    std::atomic<int64_t> t0{0};
    std::barrier start(static_cast<ptrdiff_t>(n), [&]() noexcept { t0 = NowNs(); });
    std::vector<std::thread> threads;
    for (size_t i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        uint8_t* b = bufs[i]->data();
        Fill(b, p.size, Seed(pi, 0));
        for (int64_t k = 0; k < p.warmup; ++k) SendAll(fds[i], b, p.size, "warm-up send");
        uint8_t ack = 0;
        RecvAll(fds[i], &ack, 1, "warm-up acknowledgement");
        start.arrive_and_wait();
        for (int64_t k = 0; k < p.count; ++k) SendAll(fds[i], b, p.size, "stream send");
        RecvAll(fds[i], &ack, 1, "end-of-stream acknowledgement");
      });
    }
    for (std::thread& t : threads) t.join();
    double secs = static_cast<double>(NowNs() - t0.load()) / 1e9;
    int64_t msgs = p.count * static_cast<int64_t>(n);
    Report(pi, msgs, msgs * static_cast<int64_t>(p.size), msgs, secs, {});
  }
}

void MultistreamServer(const std::vector<int>& fds) {
  std::vector<std::thread> threads;
  for (int fd : fds) threads.emplace_back([fd] { StreamServerConn(fd); });
  for (std::thread& t : threads) t.join();
}

// ---- fan-in / fan-out: one server, non-blocking connections, poll ----

// Moves `count` messages of `size` bytes on every connection, in the
// direction `sending`, serving whichever connection is ready. `check` is
// called for each received message with its connection and index.
template <typename CheckFn>
void MultiTransfer(const std::vector<int>& fds, bool sending, size_t size, int64_t count,
                   const std::vector<uint8_t*>& bufs, CheckFn check, absl::string_view what) {
  struct State {
    int64_t done = 0;
    size_t off = 0;
  };
  std::vector<State> st(fds.size());
  std::vector<pollfd> pfds;
  std::vector<size_t> idx;
  const short ev = sending ? POLLOUT : POLLIN;
  for (;;) {
    pfds.clear();
    idx.clear();
    for (size_t i = 0; i < fds.size(); ++i) {
      if (st[i].done < count) {
        pfds.push_back(pollfd{fds[i], ev, 0});
        idx.push_back(i);
      }
    }
    if (pfds.empty()) return;
    int n = g_child.ops->poll(pfds.data(), pfds.size(), TimeoutMs());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) Die(absl::StrCat("poll during ", what, " failed: ", Errno(errno)));
    if (n == 0) {
      Die(absl::StrCat("no client made progress for ",
                       absl::FormatDuration(g_child.opt->timeout), " during ", what));
    }
    for (size_t j = 0; j < pfds.size(); ++j) {
      if (pfds[j].revents == 0) continue;
      const size_t i = idx[j];
      State& s = st[i];
      // At most 16 messages per connection per round, for fairness.
      for (int budget = 16; budget > 0 && s.done < count;) {
        ssize_t r = sending
                        ? g_child.ops->send(fds[i], bufs[i] + s.off, size - s.off, MSG_NOSIGNAL)
                        : g_child.ops->recv(fds[i], bufs[i] + s.off, size - s.off, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (r == 0 && !sending) {
          Die(absl::StrCat("client ", i, " closed the connection during ", what));
        }
        if (r <= 0) {
          Die(absl::StrCat(sending ? "send" : "recv", " to client ", i, " during ", what,
                           " failed: ", r == 0 ? std::string("0 bytes") : Errno(errno)));
        }
        s.off += static_cast<size_t>(r);
        if (s.off == size) {
          if (!sending) check(i, s.done, bufs[i]);
          s.off = 0;
          ++s.done;
          --budget;
        }
      }
    }
  }
}

void FanServer(const std::vector<int>& fds) {
  const Run& run = *g_child.run;
  const bool fanin = g_child.opt->test == Test::kFanin;
  for (int fd : fds) SetNonBlocking(fd);
  std::vector<std::unique_ptr<Buffer>> owned;
  std::vector<uint8_t*> bufs;
  for (size_t i = 0; i < fds.size(); ++i) {
    owned.push_back(std::make_unique<Buffer>(MaxSize(run)));
    bufs.push_back(owned.back()->data());
  }
  const uint8_t go = 1;
  uint8_t ack = 0;
  for (int pi = 0; pi < static_cast<int>(run.points.size()); ++pi) {
    const Point& p = run.points[pi];
    auto check_first = [&](size_t, int64_t k, const uint8_t* b) {
      if (k == 0) Check(b, p.size, Seed(pi, 0), MsgWhat(pi, k, p));
    };
    auto check_last = [&](size_t, int64_t k, const uint8_t* b) {
      if (k == p.count - 1) Check(b, p.size, Seed(pi, 0), MsgWhat(pi, p.warmup + k, p));
    };
    int64_t t0 = 0;
    if (fanin) {
      MultiTransfer(fds, false, p.size, p.warmup, bufs, check_first, "fan-in warm-up");
      t0 = NowNs();
      for (int fd : fds) SendAll(fd, &go, 1, "fan-in start");
      MultiTransfer(fds, false, p.size, p.count, bufs, check_last, "fan-in");
    } else {
      for (uint8_t* b : bufs) Fill(b, p.size, Seed(pi, 0));
      MultiTransfer(fds, true, p.size, p.warmup, bufs, check_first, "fan-out warm-up");
      for (int fd : fds) RecvAll(fd, &ack, 1, "fan-out warm-up acknowledgement");
      t0 = NowNs();
      MultiTransfer(fds, true, p.size, p.count, bufs, check_first, "fan-out");
    }
    for (int fd : fds) {
      if (fanin) {
        SendAll(fd, &go, 1, "fan-in acknowledgement");
      } else {
        RecvAll(fd, &ack, 1, "fan-out acknowledgement");
      }
    }
    double secs = static_cast<double>(NowNs() - t0) / 1e9;
    int64_t msgs = p.count * static_cast<int64_t>(fds.size());
    Report(pi, msgs, msgs * static_cast<int64_t>(p.size), msgs, secs, {});
  }
}

void FanClient(int fd) {
  const Run& run = *g_child.run;
  const bool fanin = g_child.opt->test == Test::kFanin;
  Buffer buf(MaxSize(run));
  const uint8_t ack = 1;
  uint8_t go = 0;
  for (int pi = 0; pi < static_cast<int>(run.points.size()); ++pi) {
    const Point& p = run.points[pi];
    if (fanin) {
      Fill(buf.data(), p.size, Seed(pi, 0));
      for (int64_t k = 0; k < p.warmup; ++k) SendAll(fd, buf.data(), p.size, "warm-up send");
      RecvAll(fd, &go, 1, "fan-in start");
      for (int64_t k = 0; k < p.count; ++k) SendAll(fd, buf.data(), p.size, "fan-in send");
      RecvAll(fd, &go, 1, "fan-in acknowledgement");
    } else {
      for (int64_t k = 0; k < p.warmup; ++k) {
        RecvAll(fd, buf.data(), p.size, "warm-up receive");
        if (k == 0) Check(buf.data(), p.size, Seed(pi, 0), MsgWhat(pi, k, p));
      }
      SendAll(fd, &ack, 1, "fan-out warm-up acknowledgement");
      for (int64_t k = 0; k < p.count; ++k) {
        RecvAll(fd, buf.data(), p.size, "fan-out receive");
        if (k == p.count - 1) {
          Check(buf.data(), p.size, Seed(pi, 0), MsgWhat(pi, p.warmup + k, p));
        }
      }
      SendAll(fd, &ack, 1, "fan-out acknowledgement");
    }
  }
}

// ---- connect ----

void ConnectServer(int lfd) {
  const Run& run = *g_child.run;
  for (int pi = 0; pi < static_cast<int>(run.points.size()); ++pi) {
    const Point& p = run.points[pi];
    for (int64_t k = 0; k < p.warmup + p.count; ++k) {
      int fd = AcceptOne(lfd, false);
      uint8_t b = 0;
      RecvAll(fd, &b, 1, "connection's byte");
      Check(&b, 1, Seed(pi, k), absl::StrCat("the byte of connection ", k));
      SendAll(fd, &b, 1, "connection's reply");
      CloseFd(fd);
    }
  }
}

void ConnectClient(uint16_t port) {
  const Run& run = *g_child.run;
  for (int pi = 0; pi < static_cast<int>(run.points.size()); ++pi) {
    const Point& p = run.points[pi];
    std::vector<double> samples;
    ReserveTouched(&samples, p.count);
    int64_t t_start = 0;
    for (int64_t k = 0; k < p.warmup + p.count; ++k) {
      if (k == p.warmup) t_start = NowNs();
      int64_t t0 = NowNs();
      int fd = ConnectLoopback(port, false);
      uint8_t b = 0;
      Fill(&b, 1, Seed(pi, k));
      SendAll(fd, &b, 1, "connection's byte");
      uint8_t r = 0;
      RecvAll(fd, &r, 1, "connection's reply");
      CloseFd(fd);
      if (k >= p.warmup) samples.push_back(static_cast<double>(NowNs() - t0) / 1000.0);
      if (r != b) Check(&r, 1, Seed(pi, k), absl::StrCat("the reply of connection ", k));
    }
    double secs = static_cast<double>(NowNs() - t_start) / 1e9;
    Report(pi, p.count, 2 * p.count, p.count, secs, samples);
  }
}

// ---- roles ----

void ServerMain() {
  uint16_t port = 0;
  int lfd = ListenLoopback(&port);
  WriteFrame(kFramePort, &port, sizeof(port));
  const Run& run = *g_child.run;
  const Test test = g_child.opt->test;
  if (test == Test::kConnect) {
    ConnectServer(lfd);
    CloseFd(lfd);
    return;
  }
  std::vector<int> fds;
  for (int64_t i = 0; i < run.clients * run.streams; ++i) fds.push_back(AcceptOne(lfd, true));
  CloseFd(lfd);
  switch (test) {
    case Test::kPingpong:
    case Test::kHotspot: PingpongServer(fds); break;
    case Test::kMultistream: MultistreamServer(fds); break;
    case Test::kFanin:
    case Test::kFanout: FanServer(fds); break;
    default: StreamServerConn(fds[0]); break;
  }
  for (int fd : fds) CloseFd(fd);
}

void ClientMain() {
  const Run& run = *g_child.run;
  const Test test = g_child.opt->test;
  if (test == Test::kConnect) {
    ConnectClient(g_child.port);
    return;
  }
  std::vector<int> fds;
  for (int64_t i = 0; i < run.streams; ++i) fds.push_back(ConnectLoopback(g_child.port, true));
  switch (test) {
    case Test::kPingpong:
    case Test::kHotspot: PingpongClient(fds[0]); break;
    case Test::kMultistream: MultistreamClient(fds); break;
    case Test::kFanin:
    case Test::kFanout: FanClient(fds[0]); break;
    default: StreamClient(fds[0]); break;
  }
  for (int fd : fds) CloseFd(fd);
}

// ---------------------------------------------------------------------------
// Parent side.

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

void Pin(int core) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  (void)sched_setaffinity(0, sizeof(set), &set);
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
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    signal(SIGPIPE, SIG_IGN);
    g_child.opt = &opt;
    g_child.run = &run;
    g_child.ops = run.transport->ops;
    g_child.out_fd = p[1];
    g_child.role = role;
    g_child.index = index;
    g_child.port = port;
    for (const auto& [k, v] : run.transport->env) setenv(k.c_str(), v.c_str(), 1);
    // The parent may have loaded the configuration already (logging does):
    // this child's ZSOCK_MODE/ZSOCK_PROVIDER must take effect.
    zsock::Config::ReloadGlobalInChild();
    Pin(core);
    body();
    std::fflush(nullptr);
    _exit(0);
  }
  ::close(p[1]);
  Child c;
  c.pid = pid;
  c.fd = p[0];
  c.role = std::move(role);
  return c;
}

struct PointAgg {
  int reports = 0;
  int64_t iterations = 0;
  int64_t bytes = 0;
  int64_t messages = 0;
  double seconds = 0;
  std::vector<double> samples;
};

std::string DescribeExit(const Child& c) {
  if (!c.error.empty()) return c.error;
  if (WIFSIGNALED(c.status)) {
    return absl::StrCat(c.role, " (pid ", c.pid, ") was killed by signal ",
                        WTERMSIG(c.status), " (", strsignal(WTERMSIG(c.status)), ")");
  }
  return absl::StrCat(c.role, " (pid ", c.pid, ") exited with status ", WEXITSTATUS(c.status));
}

// Parses complete frames in c.buf.
void ParseFrames(Child& c, std::vector<PointAgg>& agg, const std::function<void(int)>& done,
                 int expected_reports) {
  for (;;) {
    if (c.buf.size() < 5) return;
    uint32_t len = 0;
    std::memcpy(&len, c.buf.data() + 1, 4);
    if (c.buf.size() < 5 + len) return;
    const char type = c.buf[0];
    const char* payload = c.buf.data() + 5;
    if (type == kFramePort && len == sizeof(uint16_t)) {
      std::memcpy(&c.port, payload, sizeof(uint16_t));
      c.got_port = true;
    } else if (type == kFrameError) {
      c.error.assign(payload, len);
    } else if (type == kFrameResult && len >= sizeof(PointWire)) {
      PointWire w;
      std::memcpy(&w, payload, sizeof(w));
      if (w.point >= 0 && w.point < static_cast<int>(agg.size()) &&
          len == sizeof(PointWire) + w.samples * sizeof(double)) {
        PointAgg& a = agg[w.point];
        a.reports++;
        a.iterations += w.iterations;
        a.bytes += w.bytes;
        a.messages += w.messages;
        a.seconds = std::max(a.seconds, w.seconds);
        if (w.samples > 0) {  // an empty vector's data() may be null
          const size_t at = a.samples.size();
          a.samples.resize(at + w.samples);
          std::memcpy(a.samples.data() + at, payload + sizeof(PointWire),
                      w.samples * sizeof(double));
        }
        if (a.reports == expected_reports) done(w.point);
      }
    }
    c.buf.erase(0, 5 + len);
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

// Reads reports and reaps children until all exited, one failed, or nothing
// happened for opt.timeout. `until_port`: return once children[0] sent its port.
// On a failure it keeps reading for a moment, so that the root cause (the
// first process to report) and its consequences (its peers losing the
// connection) are all in the message, root cause first.
absl::Status Pump(const Options& opt, std::vector<Child>& children, std::vector<PointAgg>& agg,
                  const std::function<void(int)>& done, int expected_reports,
                  bool until_port) {
  absl::Time last = absl::Now();
  std::optional<absl::Time> failed_at;
  std::vector<std::string> errors;
  std::vector<pollfd> pfds;
  std::vector<size_t> which;
  auto note_error = [&](const std::string& e) {
    if (std::find(errors.begin(), errors.end(), e) == errors.end()) errors.push_back(e);
    if (!failed_at) failed_at = absl::Now();
  };
  for (;;) {
    bool all_done = true;
    for (Child& c : children) {
      if (!c.exited && waitpid(c.pid, &c.status, WNOHANG) == c.pid) c.exited = true;
      if (c.exited && c.eof && !(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0)) {
        note_error(DescribeExit(c));
      }
      all_done &= c.exited && c.eof;
    }
    if (failed_at && (all_done || absl::Now() - *failed_at > absl::Milliseconds(300))) {
      return MakeError(absl::StatusCode::kAborted, 0, absl::StrJoin(errors, "; then "));
    }
    if (!failed_at && until_port && children[0].got_port) return absl::OkStatus();
    if (all_done) return absl::OkStatus();
    if (!failed_at && absl::Now() - last > opt.timeout) {
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
    pfds.clear();
    which.clear();
    for (size_t i = 0; i < children.size(); ++i) {
      if (!children[i].eof) {
        pfds.push_back(pollfd{children[i].fd, POLLIN, 0});
        which.push_back(i);
      }
    }
    if (pfds.empty()) {
      usleep(2000);  // every pipe closed: waiting for the exits
      continue;
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
        last = absl::Now();
        if (!c.error.empty()) note_error(c.error);
      } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
        c.eof = true;
      }
    }
  }
}

double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}

absl::StatusOr<std::vector<Record>> RunOne(const Options& opt, const Run& run, int* point_no,
                                           int total_points) {
  const Transport& t = *run.transport;
  std::vector<PointAgg> agg(run.points.size());
  std::vector<Record> out;
  const int expected = opt.test == Test::kHotspot ? static_cast<int>(run.clients) : 1;
  const absl::Time start = absl::Now();

  auto make_record = [&](int pi) {
    const Point& p = run.points[pi];
    PointAgg& a = agg[pi];
    Record r;
    r.test = std::string(TestName(opt.test));
    r.transport = t.name;
    r.mode = t.mode;
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
    switch (TestParam(opt.test)) {
      case Param::kCompute: r.compute_us = p.compute_us; break;
      case Param::kWindow: r.window = p.window; break;
      case Param::kClients: r.clients = run.clients; break;
      case Param::kStreams: r.streams = run.streams; break;
      case Param::kNone: break;
    }
    return r;
  };
  auto done = [&](int pi) {
    Record r = make_record(pi);
    ++*point_no;
    if (opt.progress) {
      std::string what;
      if (r.lat_us_p50) {
        what = absl::StrFormat("p50 %.2f us", *r.lat_us_p50);
      } else if (TestMetric(opt.test) == Metric::kMessageRate) {
        what = absl::StrFormat("%.3f Mmsg/s", r.msg_rate / 1e6);
      } else {
        what = absl::StrFormat("%.3f GB/s", r.bw_gbps);
      }
      std::string param;
      if (auto v = ParamValue(TestParam(opt.test), r)) {
        param = absl::StrCat(" ", ParamName(TestParam(opt.test)), "=", *v);
      }
      std::fprintf(stderr, "zsock_bench: [%d/%d] %s %s/%s %s%s: %s (%.1f s)\n", *point_no,
                   total_points, r.test.c_str(), t.name.c_str(), t.mode.c_str(),
                   SizeLabel(r.msg_size).c_str(), param.c_str(), what.c_str(),
                   absl::ToDoubleSeconds(absl::Now() - start));
    }
    out.push_back(std::move(r));
  };

  std::vector<Child> children;
  auto fail = [&](absl::Status s) {
    KillAll(children);
    return absl::Status(s.code(), absl::StrCat(TestName(opt.test), " over ", t.name, "/",
                                               t.mode, ": ", s.message()));
  };
  auto server = Spawn(opt, run, "server", opt.server_core, 0, 0, {}, ServerMain);
  if (!server.ok()) return fail(server.status());
  children.push_back(std::move(*server));
  if (auto s = Pump(opt, children, agg, done, expected, /*until_port=*/true); !s.ok()) {
    return fail(s);
  }
  if (!children[0].got_port) {
    return fail(MakeError(absl::StatusCode::kInternal, 0,
                          "the server exited before it listened"));
  }
  const uint16_t port = children[0].port;
  for (int64_t i = 0; i < run.clients; ++i) {
    std::vector<int> parent_fds;
    for (const Child& c : children) parent_fds.push_back(c.fd);
    std::string role = run.clients > 1 ? absl::StrCat("client ", i) : "client";
    auto client = Spawn(opt, run, role, opt.client_core, static_cast<int>(i), port,
                        parent_fds, ClientMain);
    if (!client.ok()) return fail(client.status());
    children.push_back(std::move(*client));
  }
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

struct PointKey {
  size_t size;
  std::optional<int64_t> compute_us, window, clients, streams;
  auto Tie() const { return std::tie(size, compute_us, window, clients, streams); }
  bool operator<(const PointKey& o) const { return Tie() < o.Tie(); }
};

PointKey KeyOf(const Record& r) {
  return PointKey{r.msg_size, r.compute_us, r.window, r.clients, r.streams};
}

}  // namespace

double PrimaryValue(Test test, const Record& r) {
  switch (TestMetric(test)) {
    case Metric::kLatency: return r.lat_us_p50.value_or(0);
    case Metric::kBandwidth: return r.bw_gbps;
    case Metric::kMessageRate:
    case Metric::kConnectRate: return r.msg_rate;
  }
  return 0;
}

BenchResult RunBench(const Options& options) {
  BenchResult result;
  std::vector<Run> runs = Plan(options);
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
  // Ratios to the baseline at the same point.
  std::map<PointKey, const Record*> base;
  for (const Record& r : result.records) {
    if (r.transport == "tcp") base[KeyOf(r)] = &r;
  }
  bool have_baseline = false;
  for (const Transport& t : options.transports) have_baseline |= t.is_baseline;
  if (have_baseline) {
    for (Record& r : result.records) {
      if (r.transport == "tcp") continue;
      auto it = base.find(KeyOf(r));
      if (it == base.end()) continue;
      double mine = PrimaryValue(options.test, r);
      double theirs = PrimaryValue(options.test, *it->second);
      if (mine <= 0 || theirs <= 0) continue;
      r.vs_tcp = TestMetric(options.test) == Metric::kLatency ? theirs / mine : mine / theirs;
    }
  }
  return result;
}

// ---------------------------------------------------------------------------
// Rendering.

std::string SizeLabel(size_t size) {
  if (size >= (size_t{1} << 30) && size % (size_t{1} << 30) == 0) {
    return absl::StrCat(size >> 30, "G");
  }
  if (size >= (size_t{1} << 20) && size % (size_t{1} << 20) == 0) {
    return absl::StrCat(size >> 20, "M");
  }
  if (size >= (size_t{1} << 10) && size % (size_t{1} << 10) == 0) {
    return absl::StrCat(size >> 10, "K");
  }
  return absl::StrCat(size);
}

namespace {

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(ch));
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  return absl::StrFormat("%.6g", v);
}

std::string JsonOpt(const std::optional<double>& v) {
  return v ? JsonNumber(*v) : std::string("null");
}

}  // namespace

std::string RecordToJson(const Record& r) {
  std::string out = absl::StrCat(
      "{\"test\":", JsonString(r.test), ",\"transport\":", JsonString(r.transport),
      ",\"mode\":", JsonString(r.mode), ",\"msg_size\":", r.msg_size,
      ",\"iterations\":", r.iterations, ",\"lat_us_p50\":", JsonOpt(r.lat_us_p50),
      ",\"lat_us_p99\":", JsonOpt(r.lat_us_p99), ",\"lat_us_avg\":", JsonOpt(r.lat_us_avg),
      ",\"bw_gbps\":", JsonNumber(r.bw_gbps), ",\"msg_rate\":", JsonNumber(r.msg_rate),
      ",\"seconds\":", JsonNumber(r.seconds));
  if (r.compute_us) absl::StrAppend(&out, ",\"compute_us\":", *r.compute_us);
  if (r.window) absl::StrAppend(&out, ",\"window\":", *r.window);
  if (r.clients) absl::StrAppend(&out, ",\"clients\":", *r.clients);
  if (r.streams) absl::StrAppend(&out, ",\"streams\":", *r.streams);
  if (r.vs_tcp) absl::StrAppend(&out, ",\"vs_tcp\":", JsonNumber(*r.vs_tcp));
  return out + "}";
}

std::string FormatTable(Test test, const std::vector<Record>& records) {
  const Param param = TestParam(test);
  // Order: parameter, size, then transports in the order they ran.
  std::vector<std::string> order;
  for (const Record& r : records) {
    std::string k = r.transport + "\n" + r.mode;
    if (std::find(order.begin(), order.end(), k) == order.end()) order.push_back(k);
  }
  std::vector<const Record*> rows;
  for (const Record& r : records) rows.push_back(&r);
  auto rank = [&](const Record* r) {
    return std::find(order.begin(), order.end(), r->transport + "\n" + r->mode) - order.begin();
  };
  // Grouped like the figures' panels: by size where the parameter is the x
  // axis (overlap, pagefault, multistream), else by the parameter.
  const bool size_first = param == Param::kCompute || param == Param::kWindow ||
                          param == Param::kStreams;
  auto key = [&](const Record* r) {
    const int64_t p = ParamValue(param, *r).value_or(0);
    const int64_t size = static_cast<int64_t>(r->msg_size);
    return size_first ? std::tuple(size, p, rank(r)) : std::tuple(p, size, rank(r));
  };
  std::stable_sort(rows.begin(), rows.end(),
                   [&](const Record* a, const Record* b) { return key(a) < key(b); });
  bool any_ratio = false;
  for (const Record* r : rows) any_ratio |= r->vs_tcp.has_value();

  std::vector<std::string> header = {"test", "transport", "mode", "size"};
  if (param != Param::kNone) header.push_back(ParamName(param));
  for (const char* h : {"iters", "p50_us", "p99_us", "avg_us", "GB/s", "Mmsg/s"}) {
    header.push_back(h);
  }
  if (any_ratio) header.push_back("vs_tcp");
  std::vector<std::vector<std::string>> cells = {header};
  auto num = [](const std::optional<double>& v) {
    return v ? absl::StrFormat("%.2f", *v) : std::string("-");
  };
  for (const Record* r : rows) {
    std::vector<std::string> row = {r->test, r->transport, r->mode, SizeLabel(r->msg_size)};
    if (param != Param::kNone) row.push_back(absl::StrCat(ParamValue(param, *r).value_or(0)));
    row.push_back(absl::StrCat(r->iterations));
    row.push_back(num(r->lat_us_p50));
    row.push_back(num(r->lat_us_p99));
    row.push_back(num(r->lat_us_avg));
    row.push_back(absl::StrFormat("%.3f", r->bw_gbps));
    row.push_back(absl::StrFormat("%.3f", r->msg_rate / 1e6));
    if (any_ratio) row.push_back(r->vs_tcp ? absl::StrFormat("%.2fx", *r->vs_tcp) : "-");
    cells.push_back(std::move(row));
  }
  std::vector<size_t> width(header.size(), 0);
  for (const auto& row : cells) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : cells) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      // Text columns left-aligned, numbers right-aligned.
      bool left = i < 3;
      std::string pad(width[i] - row[i].size(), ' ');
      if (i > 0) line += "  ";
      line += left ? row[i] + pad : pad + row[i];
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

}  // namespace zsock::bench
