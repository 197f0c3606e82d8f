// CompletionQueue: the ready list, Poll, and adaptive spin-then-block Wait.
#include <poll.h>

#include <cerrno>

#include "absl/time/clock.h"
#include "core/config.h"
#include "core/provider.h"
#include "core/status.h"

namespace zsock {

CompletionQueue::CompletionQueue() = default;
CompletionQueue::~CompletionQueue() = default;

void CompletionQueue::Push(Completion c) {
  absl::MutexLock lock(&mu_);
  ready_.push_back(std::move(c));
}

size_t CompletionQueue::Poll(std::span<Completion> out) {
  Progress();
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  while (n < out.size() && ready_head_ < ready_.size()) {
    out[n++] = std::move(ready_[ready_head_++]);
  }
  if (ready_head_ == ready_.size()) {
    ready_.clear();
    ready_head_ = 0;
  }
  return n;
}

bool CompletionQueue::Arm() {
  {
    absl::MutexLock lock(&mu_);
    if (ready_head_ < ready_.size()) return false;
  }
  return ArmProvider();
}

absl::StatusOr<size_t> CompletionQueue::Wait(std::span<Completion> out,
                                             absl::Duration timeout) {
  static const int64_t spin_ns = [] {
    const auto& config = Config::Global();
    return config.ok() ? config->GetInt("spin_us") * 1000 : int64_t{20000};
  }();
  const int64_t start = absl::GetCurrentTimeNanos();
  const int64_t deadline = timeout == absl::InfiniteDuration()
                               ? INT64_MAX
                               : start + absl::ToInt64Nanoseconds(timeout);
  // Phase 1: spin.
  for (;;) {
    if (size_t n = Poll(out); n > 0) return n;
    int64_t now = absl::GetCurrentTimeNanos();
    if (now - start >= spin_ns || now >= deadline) break;
  }
  // Phase 2: block on the wait fd.
  for (;;) {
    int64_t now = absl::GetCurrentTimeNanos();
    if (Arm()) {
      int timeout_ms = -1;
      if (deadline != INT64_MAX) {
        int64_t left = deadline - now;
        if (left <= 0) return size_t{0};
        timeout_ms = static_cast<int>((left + 999999) / 1000000);
      }
      pollfd pfd{wait_fd(), POLLIN, 0};
      int rc = ::poll(&pfd, 1, timeout_ms);
      if (rc < 0 && errno != EINTR) {
        return ErrnoError(errno, "poll on completion queue fd failed");
      }
      ClearWakeup();
    }
    if (size_t n = Poll(out); n > 0) return n;
    if (absl::GetCurrentTimeNanos() >= deadline) return size_t{0};
  }
}

}  // namespace zsock
