#include "core/sdp/deadline.h"

#include "gtest/gtest.h"

namespace zsock::sdp {
namespace {

// A relative deadline starts counting when it is first needed, not when it
// is made, and then stays put.
TEST(Deadline, RelativeStartsAtFirstUseAndStaysPut) {
  Deadline d = Deadline::After(absl::Milliseconds(50));
  EXPECT_FALSE(d.resolved());
  EXPECT_FALSE(d.never());
  EXPECT_FALSE(d.no_wait());
  absl::SleepFor(absl::Milliseconds(20));
  const absl::Time before = absl::Now();
  const absl::Time at = d.Get();
  EXPECT_TRUE(d.resolved());
  EXPECT_GE(at, before + absl::Milliseconds(50)) << "counted from construction";
  absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(d.Get(), at);
}

TEST(Deadline, AbsoluteAndSpecialValues) {
  const absl::Time t = absl::Now() + absl::Seconds(3);
  Deadline abs = t;
  EXPECT_TRUE(abs.resolved());
  EXPECT_EQ(abs.Get(), t);
  EXPECT_TRUE(Deadline(absl::InfiniteFuture()).never());
  EXPECT_TRUE(Deadline(absl::InfinitePast()).no_wait());
  EXPECT_TRUE(Deadline::After(absl::InfiniteDuration()).never());
}

}  // namespace
}  // namespace zsock::sdp
