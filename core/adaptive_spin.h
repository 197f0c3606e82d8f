// AdaptiveSpin: how long a spin-then-sleep wait spins before it sleeps,
// adapted to what the waits find.
//
// A fixed spin (spin_us) is a guess at how soon the event comes. When the
// reply to a message takes a little longer than the spin (a round trip over
// loopback TCP takes tens of microseconds), every wait sleeps and pays a
// wake-up, which on a VM costs tens to hundreds of microseconds
// (docs/decisions/0002-adaptive-spin.md).
//
// The rule is KVM's halt polling (halt_poll_ns, grown and shrunk per vCPU),
// applied to a completion queue or an SDP engine:
//   - a wait that slept and found its event within the ceiling, counted
//     from the start of the wait, would have caught it by spinning that
//     long: the budget grows (to twice itself, and at least to 5/4 of that
//     wait), up to the ceiling;
//   - a wait that timed out shows that the traffic is sporadic and
//     spinning wastes the core: the budget halves, down to the floor;
//   - a wait that slept past twice the ceiling and then found its event
//     says the same, unless the wake-up itself took that long (a VM's
//     wake-ups take hundreds of microseconds in its slow spells, while the
//     spin was catching the other events): the budget loses an eighth, so
//     that steady sporadic traffic brings it down within some fifteen
//     waits, and one slow wake-up among quick replies costs little;
//   - a wait the spin satisfied, or one that slept and found its event
//     between the ceiling and twice it (the wake-up itself may have taken
//     that long), changes nothing.
// The floor is where the budget starts. A ceiling at or below the floor
// gives the old fixed spin.
//
// Written here: it is twenty lines of arithmetic on one atomic, and no
// library in Debian offers the policy (liburcu and folly's spin helpers spin
// for a fixed count).
//
// Thread-safe: the waits of several threads update one budget with relaxed
// loads and stores; a lost update only delays the adaptation by one wait.
#ifndef ZSOCK_CORE_ADAPTIVE_SPIN_H_
#define ZSOCK_CORE_ADAPTIVE_SPIN_H_

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace zsock {

// A spin's floor (where it starts) and ceiling, in nanoseconds;
// ConfiguredSpin (core/config.h) reads them from spin_us and spin_max_us.
struct SpinBounds {
  int64_t floor_ns;
  int64_t ceiling_ns;
};

// A spin that has found nothing for this long yields the CPU at each of
// its clock reads (SpinYield).
constexpr int64_t kSpinYieldAfterNs = 5'000;

// Called by a spinning wait at its clock reads with how long it has spun.
// A message this thread sent may have woken its peer, and the scheduler
// often puts the woken thread on the waker's CPU: a spin that keeps that
// CPU delays the very reply it waits for, up to its whole budget. Only
// after 5 us, so that a busy ping-pong, whose replies come sooner, never
// yields (docs/decisions/0003-spin-yields.md). Where no other thread is
// runnable the call returns at once.
inline void SpinYield(int64_t spun_ns) {
  if (spun_ns >= kSpinYieldAfterNs) sched_yield();
}

class AdaptiveSpin {
 public:
  explicit AdaptiveSpin(SpinBounds bounds)
      : floor_(std::max<int64_t>(bounds.floor_ns, 0)),
        ceiling_(std::max(bounds.ceiling_ns, floor_)),
        budget_(floor_) {}

  // How long the next wait spins.
  int64_t budget_ns() const { return budget_.load(std::memory_order_relaxed); }
  int64_t floor_ns() const { return floor_; }
  int64_t ceiling_ns() const { return ceiling_; }

  // After a wait that went to sleep: `waited_ns` from the start of the wait
  // (its spin included) to when it found its event, or to when it gave up
  // (found = false: the deadline passed).
  void Slept(int64_t waited_ns, bool found) {
    if (ceiling_ == floor_) return;
    const int64_t budget = budget_.load(std::memory_order_relaxed);
    int64_t next = budget;
    if (found && waited_ns <= ceiling_) {
      next = std::min(ceiling_, std::max({budget * 2, waited_ns + waited_ns / 4, kGrowStartNs}));
    } else if (!found) {
      next = std::max(floor_, budget / 2);
    } else if (waited_ns > 2 * ceiling_) {
      next = std::max(floor_, budget - budget / 8);
    }
    if (next != budget) budget_.store(next, std::memory_order_relaxed);
  }

 private:
  // The first growth from a zero floor.
  static constexpr int64_t kGrowStartNs = 10'000;

  const int64_t floor_;
  const int64_t ceiling_;
  std::atomic<int64_t> budget_;
};

}  // namespace zsock

#endif  // ZSOCK_CORE_ADAPTIVE_SPIN_H_
