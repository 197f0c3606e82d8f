// The tests zsock_bench runs: their names, one-line descriptions, the
// quantity each reports, the message sizes it uses by default and the
// parameter it sweeps besides the size. The table behind these is in
// test_kinds.cc, in the order of the AZ-SDP paper's figures ("Asynchronous
// Zero-copy Communication for Synchronous Sockets in the Sockets Direct
// Protocol (SDP) over InfiniBand", section 5).
#ifndef ZSOCK_BENCH_TEST_KINDS_H_
#define ZSOCK_BENCH_TEST_KINDS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zsock::bench {

enum class Test {
  kPingpong,
  kStream,
  kOverlap,
  kPagefault,
  kHotspot,
  kMultistream,
  kFanin,
  kFanout,
  kMsgrate,
  kConnect,
};

absl::string_view TestName(Test test);
// What the test measures, one line (for --help and the docs).
absl::string_view TestDescription(Test test);
absl::StatusOr<Test> ParseTest(absl::string_view name);
// All tests, in the order of the AZ-SDP paper's figures.
const std::vector<Test>& AllTests();

// Which quantity a test reports as its result (and plots on the y axis).
enum class Metric { kLatency, kBandwidth, kMessageRate, kConnectRate };
Metric TestMetric(Test test);

// For the harness's own files.
namespace internal {

// The extra parameter a test sweeps (besides the message size), if any.
enum class Param { kNone, kCompute, kWindow, kClients, kStreams };

Param TestParam(Test test);
// The flag and column name of `param` ("compute_us", ...; "" for kNone).
const char* ParamName(Param param);
// The --sizes a test uses when the flag is not given ("" for connect).
const char* DefaultSizes(Test test);
// "--test=hotspot, --test=fanin, ..." for the tests that sweep `param`.
std::vector<std::string> TestsSweeping(Param param);

// An InvalidArgument naming what is wrong and how to fix it.
absl::Status Invalid(absl::string_view what, absl::string_view fix);

}  // namespace internal
}  // namespace zsock::bench

#endif  // ZSOCK_BENCH_TEST_KINDS_H_
