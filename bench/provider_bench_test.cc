// provider_bench end to end: short runs of the real binary (its runfile),
// checking the RDMA read stream's column where a provider reads natively
// (unet) and where reads larger than max_rma_size go in pieces (ofi:shm,
// emulated, 65024 bytes per read). The benchmark checks the bytes it read
// and exits non-zero on any error, so exit 0 with a rate is a real result.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace {

struct BenchRun {
  int status = -1;
  std::string out;
};

// The benchmark binary: a runfile of this test (bazel test sets
// TEST_SRCDIR and TEST_WORKSPACE; run by hand, from the runfiles directory).
std::string Binary() {
  const char* dir = getenv("TEST_SRCDIR");
  const char* ws = getenv("TEST_WORKSPACE");
  if (dir != nullptr && ws != nullptr) return std::string(dir) + "/" + ws + "/bench/provider_bench";
  return "bench/provider_bench";
}

BenchRun RunBench(const std::string& args) {
  BenchRun r;
  const std::string cmd =
      Binary() + " --tsv --baseline_tcp=false --iters=200 " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  r.status = pclose(p);
  return r;
}

// The tab-separated result lines (size p50 p99 avg pp_MBps stream_MBps read_MBps).
std::vector<std::vector<std::string>> Rows(const std::string& out) {
  std::vector<std::vector<std::string>> rows;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (line.find('\t') == absl::string_view::npos) continue;
    rows.push_back(absl::StrSplit(line, '\t'));
  }
  return rows;
}

// The one result row of a one-size run; empty (with the failure recorded)
// when the run failed or printed something else.
std::vector<std::string> OneRow(const BenchRun& r) {
  auto rows = Rows(r.out);
  if (r.status != 0 || rows.size() != 1 || rows[0].size() != 7) {
    ADD_FAILURE() << "status " << r.status << ", want one row of 7 columns: " << r.out;
    return {};
  }
  return rows[0];
}

double Num(const std::string& s) {
  double v = -1;
  return absl::SimpleAtod(s, &v) ? v : -1;
}

TEST(ProviderBench, ReadStreamOnUnet) {
  BenchRun r = RunBench("--provider=unet --sizes=8,65536 --stream_bytes=1048576");
  ASSERT_EQ(r.status, 0) << r.out;
  auto rows = Rows(r.out);
  ASSERT_EQ(rows.size(), 2u) << r.out;
  for (const auto& row : rows) {
    ASSERT_EQ(row.size(), 7u) << r.out;
    EXPECT_GT(Num(row[5]), 0) << "stream column: " << r.out;
    EXPECT_GT(Num(row[6]), 0) << "read column: " << r.out;
  }
}

TEST(ProviderBench, ReadsLargerThanMaxRmaSizeGoInPieces) {
  BenchRun r = RunBench("--provider=ofi:shm --sizes=131072 --stream_bytes=2097152");
  if (r.status != 0 && r.out.find("fi_getinfo") != std::string::npos) {
    GTEST_SKIP() << "ofi:shm cannot run here: " << r.out;
  }
  auto row = OneRow(r);
  ASSERT_FALSE(row.empty());
  EXPECT_GT(Num(row[6]), 0) << r.out;
}

TEST(ProviderBench, ReadStreamOffLeavesTheColumnEmpty) {
  BenchRun r = RunBench("--provider=unet --sizes=4096 --stream_bytes=1048576 --rma_read=false");
  auto row = OneRow(r);
  ASSERT_FALSE(row.empty());
  EXPECT_EQ(row[6], "-") << r.out;
}

// --idle: the measured pair runs beside idle connections on both CQs (more
// than unet sweeps, so its CQ bell is what finds the measured endpoint).
TEST(ProviderBench, IdleConnectionsBesideTheMeasuredPair) {
  BenchRun r = RunBench("--provider=unet --sizes=64 --stream_bytes=1048576 --idle=40");
  auto row = OneRow(r);
  ASSERT_FALSE(row.empty());
  EXPECT_GT(Num(row[1]), 0) << "p50: " << r.out;
  EXPECT_GT(Num(row[5]), 0) << "stream column: " << r.out;
}

}  // namespace
