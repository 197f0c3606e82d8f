// zsock_bench's option parsing (see options.h): numbers, sizes, the
// test-specific lists, modes, the baseline and the transports, checked in
// that order so that the first bad flag is the one reported.
#include "bench/options.h"

#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/provider.h"
#include "core/status.h"

namespace zsock::bench {
namespace {

using internal::Invalid;
using internal::Param;

constexpr size_t kMaxSize = size_t{256} << 20;
constexpr int64_t kMaxProcs = 64;
// The data paths ("all" runs each).
constexpr const char* kModes[] = {"bcopy", "zcopy", "azcopy"};

absl::Status CheckRange(absl::string_view flag, int64_t v, int64_t min, int64_t max,
                        absl::string_view what) {
  if (v < min || v > max) {
    return Invalid(absl::StrCat("bad --", flag, "=", v, ": must be ", min, "..", max),
                   absl::StrCat("--", flag, " is ", what));
  }
  return absl::OkStatus();
}

// The numeric flags' ranges, and the cores against this machine's CPUs.
absl::Status CheckNumbers(const RawOptions& raw) {
  if (auto s = CheckRange("iters", raw.iters, 1, int64_t{1} << 32,
                          "the round trips (connections) per point at small sizes");
      !s.ok()) {
    return s;
  }
  if (auto s = CheckRange("bytes", raw.bytes, 1, int64_t{1} << 40,
                          "the payload bytes per streaming point");
      !s.ok()) {
    return s;
  }
  if (raw.warmup != -1) {
    if (auto s = CheckRange("warmup", raw.warmup, 0, int64_t{1} << 32,
                            "the untimed round trips / messages before each point");
        !s.ok()) {
      return s;
    }
  }
  if (auto s = CheckRange("inflight", raw.inflight, 1, 1 << 20,
                          "the messages msgrate sends per acknowledgement");
      !s.ok()) {
    return s;
  }
  if (auto s = CheckRange("timeout", raw.timeout_s, 1, 86400,
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
  return absl::OkStatus();
}

void CopyNumbers(const RawOptions& raw, Options* opt) {
  opt->iters = raw.iters;
  opt->bytes = raw.bytes;
  opt->warmup = raw.warmup == -1 ? 100 : raw.warmup;
  opt->inflight = raw.inflight;
  opt->timeout = absl::Seconds(raw.timeout_s);
  opt->server_core = static_cast<int>(raw.server_core);
  opt->client_core = static_cast<int>(raw.client_core);
  opt->progress = raw.progress;
  opt->stats = raw.stats;
}

absl::Status ParseSizes(const RawOptions& raw, Options* opt) {
  if (opt->test == Test::kConnect) {
    if (!raw.sizes.empty()) {
      return Invalid("--sizes does not apply to --test=connect (one byte each way per "
                     "connection)",
                     "drop --sizes");
    }
    opt->sizes = {1};
    return absl::OkStatus();
  }
  auto sizes =
      ParseSizeList("sizes", raw.sizes.empty() ? internal::DefaultSizes(opt->test) : raw.sizes);
  if (!sizes.ok()) return sizes.status();
  opt->sizes = *sizes;
  return absl::OkStatus();
}

// The test-specific lists: the one the test sweeps is parsed (or takes its
// default); any other given is an error naming the tests it applies to.
absl::Status ParseParamLists(const RawOptions& raw, Options* opt) {
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
       &opt->compute_us, 1000000},
      {"window", &raw.window, Param::kWindow, "1,2,4,8,16,32,64", 1, &opt->windows, 1000000},
      {"clients", &raw.clients, Param::kClients, "4", 1, &opt->clients, kMaxProcs},
      {"streams", &raw.streams, Param::kStreams, "1,2,4,8", 1, &opt->streams, kMaxProcs},
  };
  const Param param = internal::TestParam(opt->test);
  for (const ListFlag& l : lists) {
    if (l.param != param) {
      if (!l.text->empty()) {
        return Invalid(absl::StrCat("--", l.flag, " applies to ",
                                    absl::StrJoin(internal::TestsSweeping(l.param), ", "),
                                    ", not --test=", TestName(opt->test)),
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
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ParseModes(const std::string& mode) {
  std::vector<std::string> modes;
  if (mode == "all") {
    modes.assign(std::begin(kModes), std::end(kModes));
    return modes;
  }
  for (absl::string_view m : absl::StrSplit(mode, ',')) {
    if (std::find(std::begin(kModes), std::end(kModes), m) == std::end(kModes)) {
      return Invalid(absl::StrCat("unknown --mode='", mode, "'"),
                     "use bcopy, zcopy, azcopy, a comma list of them, or all");
    }
    if (std::find(modes.begin(), modes.end(), m) == modes.end()) modes.emplace_back(m);
  }
  return modes;
}

// The kernel TCP baselines --baseline names: "tcp" (blocking calls),
// "tcp-busy" (busy-polled), "all" (both), "" or "none".
struct Baselines {
  bool blocking = false;
  bool busy = false;
};

absl::StatusOr<Baselines> ParseBaseline(const std::string& baseline) {
  if (baseline.empty() || baseline == "none") return Baselines{};
  if (baseline == "tcp") return Baselines{.blocking = true};
  if (baseline == "tcp-busy") return Baselines{.busy = true};
  if (baseline == "all") return Baselines{.blocking = true, .busy = true};
  return Invalid(absl::StrCat("unknown --baseline='", baseline, "'"),
                 "write --baseline=tcp (kernel TCP, blocking calls), tcp-busy (kernel TCP "
                 "busy-polled: non-blocking calls in a loop, SO_BUSY_POLL), all (both), or "
                 "leave it out");
}

Transport KernelTcp(bool busy) {
  Transport t;
  t.name = busy ? "tcp-busy" : "tcp";
  t.mode = "kernel";
  t.ops = busy ? &KernelTcpBusyOps() : &KernelTcpOps();
  return t;
}

// Kernel TCP alone, or the provider in each mode; then the baselines.
absl::Status ResolveTransports(const RawOptions& raw, const std::vector<std::string>& modes,
                               Baselines baselines, Options* opt) {
  if (raw.provider.empty()) {
    return Invalid("--provider is empty",
                   "name a provider config (e.g. unet, ofi:tcp;ofi_rxm, ucx:tcp), or tcp or "
                   "tcp-busy for kernel TCP alone");
  }
  if (raw.provider == "tcp" || raw.provider == "tcp-busy") {
    const bool busy = raw.provider == "tcp-busy";
    if ((busy && baselines.busy) || (!busy && baselines.blocking)) {
      return Invalid(absl::StrCat("--provider=", raw.provider, " with --baseline=", raw.baseline,
                                  " would measure ", raw.provider, " twice"),
                     "drop --baseline, or name a zsock provider in --provider");
    }
    opt->transports.push_back(KernelTcp(busy));
  } else {
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
      opt->transports.push_back(std::move(t));
    }
  }
  for (bool busy : {false, true}) {
    if (busy ? !baselines.busy : !baselines.blocking) continue;
    Transport t = KernelTcp(busy);
    t.is_baseline = true;
    opt->transports.push_back(std::move(t));
  }
  return absl::OkStatus();
}

}  // namespace

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
  if (auto s = CheckNumbers(raw); !s.ok()) return s;
  CopyNumbers(raw, &opt);
  if (raw.inflight != 64 && opt.test != Test::kMsgrate) {
    return Invalid(absl::StrCat("--inflight applies to --test=msgrate, not --test=",
                                TestName(opt.test)),
                   "drop --inflight");
  }
  if (auto s = ParseSizes(raw, &opt); !s.ok()) return s;
  if (auto s = ParseParamLists(raw, &opt); !s.ok()) return s;
  auto modes = ParseModes(raw.mode);
  if (!modes.ok()) return modes.status();
  auto baseline = ParseBaseline(raw.baseline);
  if (!baseline.ok()) return baseline.status();
  if (auto s = ResolveTransports(raw, *modes, *baseline, &opt); !s.ok()) return s;
  return opt;
}

}  // namespace zsock::bench
