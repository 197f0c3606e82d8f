// AdaptiveSpin's rule (core/adaptive_spin.h), step by step, and what it
// does to a CompletionQueue's Wait.
#include "core/adaptive_spin.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "core/cq.h"
#include "core/provider.h"
#include "gtest/gtest.h"

namespace zsock {
namespace {

constexpr int64_t kUs = 1000;

TEST(AdaptiveSpin, StartsAtTheFloorAndGrowsWhenASleepEndedWithinTheCeiling) {
  AdaptiveSpin spin({20 * kUs, 100 * kUs});
  EXPECT_EQ(spin.budget_ns(), 20 * kUs);
  // A reply found 26 us into the wait (it slept after 20): a 33 us spin
  // would have caught it; doubling gives 40.
  spin.Slept(26 * kUs, true);
  EXPECT_EQ(spin.budget_ns(), 40 * kUs);
  // 70 us: 5/4 of it (87.5) is more than doubling (80).
  spin.Slept(70 * kUs, true);
  EXPECT_EQ(spin.budget_ns(), 87'500);
  // Never past the ceiling.
  spin.Slept(90 * kUs, true);
  EXPECT_EQ(spin.budget_ns(), 100 * kUs);
}

TEST(AdaptiveSpin, ShrinksOnTimeoutsAndSlowlyOnLongSleeps) {
  AdaptiveSpin spin({20 * kUs, 100 * kUs});
  spin.Slept(90 * kUs, true);
  ASSERT_EQ(spin.budget_ns(), 100 * kUs);
  // Between the ceiling and twice it: the wake-up may have taken that long.
  spin.Slept(150 * kUs, true);
  EXPECT_EQ(spin.budget_ns(), 100 * kUs);
  // A sleep past twice the ceiling that found its event: an eighth less.
  spin.Slept(5000 * kUs, true);
  EXPECT_EQ(spin.budget_ns(), 87'500);
  // Steady sporadic traffic reaches the floor and stays there.
  for (int i = 0; i < 30; ++i) spin.Slept(5000 * kUs, true);
  EXPECT_EQ(spin.budget_ns(), 20 * kUs);
  // A timeout halves.
  spin.Slept(90 * kUs, true);
  ASSERT_EQ(spin.budget_ns(), 100 * kUs);
  spin.Slept(1000 * kUs, false);
  EXPECT_EQ(spin.budget_ns(), 50 * kUs);
  spin.Slept(1000 * kUs, false);
  spin.Slept(1000 * kUs, false);
  EXPECT_EQ(spin.budget_ns(), 20 * kUs) << "shrank below the floor";
}

TEST(AdaptiveSpin, ACeilingAtTheFloorKeepsTheSpinFixed) {
  AdaptiveSpin fixed({20 * kUs, 20 * kUs});
  fixed.Slept(25 * kUs, true);
  fixed.Slept(10 * kUs, false);
  EXPECT_EQ(fixed.budget_ns(), 20 * kUs);
  // A ceiling below the floor is the floor (spin_max_us < spin_us).
  AdaptiveSpin below({20 * kUs, 5 * kUs});
  EXPECT_EQ(below.ceiling_ns(), 20 * kUs);
  below.Slept(25 * kUs, true);
  EXPECT_EQ(below.budget_ns(), 20 * kUs);
  // spin_us = 0 with its default ceiling (five times it): never spins.
  AdaptiveSpin none({0, 0});
  none.Slept(5 * kUs, true);
  EXPECT_EQ(none.budget_ns(), 0);
  // A zero floor with a ceiling grows from 10 us.
  AdaptiveSpin zero({0, 100 * kUs});
  zero.Slept(1 * kUs, true);
  EXPECT_EQ(zero.budget_ns(), 10 * kUs);
}

// A CQ with a wake eventfd only: a completion comes from Push.
class PushCq final : public CqBase {
 public:
  explicit PushCq(SpinBounds spin) : CqBase(spin) {}
  int wait_fd() const override { return wake_fd(); }

 protected:
  size_t Progress() override { return 0; }
  bool ArmProvider() override { return true; }
};

// Completions that come about 5 ms into each wait, with a 1 ms floor and a
// 50 ms ceiling (milliseconds, so that a loaded machine's wake-ups stay
// well inside the bands): a wait that sleeps grows the spin; waits that
// time out bring it back to the floor. (A wait whose 1 ms spin was
// preempted past 5 ms finds the completion spinning, and one that a loaded
// machine woke past the ceiling finds it too late; neither teaches
// anything, and the test repeats until the spin grew.)
TEST(AdaptiveSpin, ACompletionQueuesWaitLearnsHowSoonItsCompletionsCome) {
  PushCq cq({1'000'000, 50'000'000});
  ASSERT_EQ(cq.spin_budget_ns(), 1'000'000);
  Completion out[1];
  for (int attempt = 0; attempt < 20 && cq.spin_budget_ns() == 1'000'000; ++attempt) {
    std::thread pusher([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      Completion c;
      c.context = 42;
      cq.Push(c);
    });
    auto n = cq.Wait(out, absl::Seconds(10));
    pusher.join();
    ASSERT_TRUE(n.ok()) << n.status();
    ASSERT_EQ(*n, 1u);
    EXPECT_EQ(out[0].context, 42u);
  }
  ASSERT_GE(cq.wait_sleeps(), 1u) << "no wait slept in 20: the 1 ms spin always ran 5 ms";
  // At least doubled (the completion came within the ceiling); by how much
  // more depends on when the pusher's 5 ms began against the wait, which a
  // loaded machine moves (the rule itself is checked above).
  EXPECT_GE(cq.spin_budget_ns(), 2'000'000)
      << "a completion found about 5 ms into a wait that slept after 1 ms did not grow the "
         "spin";
  const int64_t grown = cq.spin_budget_ns();
  // Waits that find nothing: each halves the spin.
  auto n = cq.Wait(out, absl::Milliseconds(1));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 0u);
  EXPECT_LE(cq.spin_budget_ns(), grown / 2);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(cq.Wait(out, absl::Milliseconds(1)).ok());
  EXPECT_EQ(cq.spin_budget_ns(), 1'000'000) << "timeouts did not bring the spin back to the floor";
}

}  // namespace
}  // namespace zsock
