// The table of zsock_bench's tests (see test_kinds.h).
#include "bench/test_kinds.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"

namespace zsock::bench {
namespace {

using internal::Invalid;

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
     "(the AZ-SDP paper's fig. 6a)",
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

namespace internal {

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

const char* DefaultSizes(Test test) { return Info(test).default_sizes; }

std::vector<std::string> TestsSweeping(Param param) {
  std::vector<std::string> users;
  for (const TestInfo& info : kTests) {
    if (TestParam(info.test) == param) users.push_back(absl::StrCat("--test=", info.name));
  }
  return users;
}

absl::Status Invalid(absl::string_view what, absl::string_view fix) {
  return MakeError(absl::StatusCode::kInvalidArgument, 0, what, fix);
}

}  // namespace internal
}  // namespace zsock::bench
