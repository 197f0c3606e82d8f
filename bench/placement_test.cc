#include "bench/placement.h"

#include <unistd.h>

#include "gtest/gtest.h"

namespace zsock::bench {
namespace {

TEST(LineTransfer, MeasuresAPlausibleTimeBetweenTwoCpus) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "one online CPU: nothing to cross";
  auto ns = LineTransferNs(0, 1, 2000);
  ASSERT_TRUE(ns.ok()) << ns.status();
  // A line crossing takes tens to hundreds of nanoseconds on hardware; a
  // preempted thread can stretch the average, but never below a few ns or
  // above a millisecond per crossing over 2000 rounds on an idle pair.
  EXPECT_GT(*ns, 1.0);
  EXPECT_LT(*ns, 1e6);
}

TEST(LineTransfer, BadCpusAreErrorsThatSayWhatToPick) {
  auto same = LineTransferNs(0, 0);
  ASSERT_FALSE(same.ok());
  EXPECT_NE(same.status().message().find("pick two CPUs"), std::string::npos);
  auto off = LineTransferNs(0, 4096);
  ASSERT_FALSE(off.ok());
  EXPECT_NE(off.status().message().find("CPU 4096 is not online"), std::string::npos)
      << off.status().message();
}

}  // namespace
}  // namespace zsock::bench
