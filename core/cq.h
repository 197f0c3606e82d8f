// CqBase: the part of every provider's completion queue that is the same
// for all of them. It keeps the ready list, Poll's fast path (completions a
// provider reports while Poll runs its progress go straight into Poll's
// output), the adaptive spin-then-block Wait and the Arm/wake-up protocol
// on an eventfd; a provider derives from it and supplies Progress,
// ArmProvider, ClearWakeup and wait_fd.
#ifndef ZSOCK_CORE_CQ_H_
#define ZSOCK_CORE_CQ_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/adaptive_spin.h"
#include "core/mutex.h"
#include "core/provider.h"

namespace zsock {

class CqBase : public CompletionQueue {
 public:
  CqBase();
  // With its own spin bounds instead of spin_us / spin_max_us.
  explicit CqBase(SpinBounds spin);
  ~CqBase() override;
  CqBase(const CqBase&) = delete;
  CqBase& operator=(const CqBase&) = delete;

  size_t Poll(std::span<Completion> out) final;
  // The spin starts at spin_us and adapts between it and spin_max_us to how
  // soon this CQ's waits find their completions (core/adaptive_spin.h).
  absl::StatusOr<size_t> Wait(std::span<Completion> out, absl::Duration timeout) final;
  // Clears the previous wake-up first (ClearWakeup, the eventfd), so that
  // an idle armed CQ's fd is not readable.
  bool Arm() final;
  void Push(Completion c) final;
  void Wake() final;

  // How long the next Wait spins, and how many Waits spun out without
  // finding anything (and slept, unless Arm found work already pending),
  // for tests and statistics.
  int64_t spin_budget_ns() const { return spin_.budget_ns(); }
  uint64_t wait_sleeps() const { return wait_sleeps_.load(std::memory_order_relaxed); }

  // ---- for the provider ----
  // Push for a batch, under one lock (moves from `cs`).
  void PushAll(std::span<Completion> cs);
  // Push without building and moving a Completion, for a provider's
  // Progress that reports an operation while Poll runs it on this thread
  // with nothing queued ahead: the next slot of Poll's output, which the
  // caller must fill completely (it holds an old value). Null otherwise;
  // then Push.
  Completion* DirectSlot();
  // The slot for a provider's next completion while its progress gathers
  // completions in `pending` to push later (PushAll, once its locks are
  // released): DirectSlot() while `pending` is empty, else a new element of
  // `pending`. Either way in order; the caller sets every field. Saves a
  // Completion built, moved into `pending`, moved again by the push and
  // destroyed, for each one a polling caller takes at once.
  template <typename List>
  Completion& EmitSlot(List* pending) {
    if (pending->empty()) {
      if (Completion* slot = DirectSlot(); slot != nullptr) return *slot;
    }
    return pending->emplace_back();
  }
  // Wake, only if a thread armed the CQ (Arm) and may sleep on wait_fd().
  // The caller must hold the lock its ArmProvider's check takes, so that an
  // Arm racing with it either sees the caller's work or is seen here.
  void WakeSleeper() {
    if (armed_.load(std::memory_order_acquire)) Wake();
  }

 protected:
  // An eventfd that Push and Wake signal; providers must include it in the
  // set wait_fd() reports (e.g. add it to their epoll set).
  int wake_fd() const { return wake_fd_; }

  // Drives the provider: moves incoming messages, finishes operations and
  // calls Push for each. Returns the number of events handled.
  virtual size_t Progress() = 0;
  // Provider part of Arm(): enable notification for new events; false if
  // events are already pending.
  virtual bool ArmProvider() = 0;
  // Clears the notification (drains the eventfd, ...) after a wakeup.
  virtual void ClearWakeup() {}

 private:
  void DrainWake();
  // Push's fast path: into the output of a Poll running on this thread.
  bool PushDirect(Completion& c);

  Mutex mu_;
  std::deque<Completion> ready_ ABSL_GUARDED_BY(mu_);
  std::atomic<size_t> ready_size_{0};  // ready_.size(), readable without mu_
  // A waiter may sleep on wait_fd. Written under mu_; WakeSleeper reads it
  // without.
  std::atomic<bool> armed_{false};
  int wake_fd_ = -1;
  std::atomic<bool> wake_pending_{false};
  AdaptiveSpin spin_;
  std::atomic<uint64_t> wait_sleeps_{0};
};

}  // namespace zsock

#endif  // ZSOCK_CORE_CQ_H_
