// CqBase: the ready list, Poll, and adaptive spin-then-block Wait.
#include <poll.h>

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/time/clock.h"
#include "core/config.h"
#include "core/mutex.h"
#include "core/log.h"
#include "core/cq.h"
#include "core/status.h"

namespace zsock {

namespace {

// Where Push puts completions that a provider reports while Poll runs its
// Progress on this thread: straight into Poll's output, when nothing is
// queued ahead of them (then no lock, no queue). Nested polls (a provider
// polling another CQ inside Progress) save and restore it.
struct DirectSink {
  const CqBase* cq;
  Completion* out;
  size_t cap;
  size_t n;
};
thread_local DirectSink* t_sink = nullptr;

}  // namespace

CqBase::CqBase() : CqBase(ConfiguredSpin()) {}

CqBase::CqBase(SpinBounds spin)
    : wake_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)), spin_(spin) {
  if (wake_fd_ < 0) {
    ZS_LOG(kError, "eventfd for a completion queue failed (%s): cross-thread wakeups are lost",
           std::strerror(errno));
  }
}

CqBase::~CqBase() {
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

bool CqBase::PushDirect(Completion& c) {
  DirectSink* sink = t_sink;
  if (sink == nullptr || sink->cq != this || sink->n == sink->cap ||
      ready_size_.load(std::memory_order_acquire) != 0) {
    return false;
  }
  sink->out[sink->n++] = std::move(c);
  return true;
}

Completion* CqBase::DirectSlot() {
  DirectSink* sink = t_sink;
  if (sink == nullptr || sink->cq != this || sink->n == sink->cap ||
      ready_size_.load(std::memory_order_acquire) != 0) {
    return nullptr;
  }
  return &sink->out[sink->n++];
}

void CqBase::Push(Completion c) { PushAll(std::span<Completion>(&c, 1)); }

void CqBase::PushAll(std::span<Completion> cs) {
  size_t i = 0;
  while (i < cs.size() && PushDirect(cs[i])) ++i;
  if (i == cs.size()) return;
  bool wake = false;
  {
    MutexLock lock(&mu_);
    for (; i < cs.size(); ++i) ready_.push_back(std::move(cs[i]));
    ready_size_.store(ready_.size(), std::memory_order_release);
    wake = armed_;
    armed_ = false;
  }
  if (wake) Wake();
}

void CqBase::Wake() {
  if (wake_fd_ < 0) return;
  // A wake-up not yet drained (DrainWake, in Arm) keeps wait_fd readable:
  // no second write(2). Providers call WakeSleeper for every operation
  // they finish outside Progress while a thread sleeps; one system call
  // each was a message stream's main cost beside a sleeping progress
  // thread. Safe: DrainWake clears the flag only after reading the fd, so
  // a set flag always has a write after the last drain's read; and a
  // wake-up skipped here while that drain runs is followed by the
  // drainer's look at the queue (Arm) and the provider (ArmProvider),
  // under the locks our caller published its work with.
  if (wake_pending_.load(std::memory_order_seq_cst)) return;
  wake_pending_.store(true, std::memory_order_seq_cst);
  uint64_t one = 1;
  ssize_t rc = ::write(wake_fd_, &one, sizeof(one));
  (void)rc;  // EAGAIN: the counter is already non-zero
}

void CqBase::DrainWake() {
  // Read first, then clear (Wake). Always read: a Wake that set the flag
  // between our read and our clear writes after it, and a drain that
  // trusted the cleared flag would leave wait_fd readable for good (every
  // sleep returning at once until the next Wake).
  uint64_t v;
  while (::read(wake_fd_, &v, sizeof(v)) == sizeof(v)) {}
  wake_pending_.store(false, std::memory_order_seq_cst);
}

size_t CqBase::Poll(std::span<Completion> out) {
  // No DrainWake here: the wake-up belongs to whoever sleeps on wait_fd. A
  // thread polling beside a sleeper (the SDP engine's application threads
  // beside its progress thread) would otherwise swallow the sleeper's
  // wake-up, and the sleeper's poll(2) would go back to sleep. Arm drains.
  size_t n = 0;
  if (ready_size_.load(std::memory_order_acquire) == 0 && !out.empty()) {
    // Nothing queued: what Progress finds goes straight into `out`.
    DirectSink sink{this, out.data(), out.size(), 0};
    DirectSink* outer = t_sink;
    t_sink = &sink;
    Progress();
    t_sink = outer;
    n = sink.n;
  } else {
    Progress();
  }
  // An empty queue takes no lock (a stale zero costs one poll; Push
  // publishes the size after appending).
  if (n == out.size() || ready_size_.load(std::memory_order_acquire) == 0) return n;
  MutexLock lock(&mu_);
  while (n < out.size() && !ready_.empty()) {
    out[n++] = std::move(ready_.front());
    ready_.pop_front();
  }
  ready_size_.store(ready_.size(), std::memory_order_release);
  return n;
}

bool CqBase::Arm() {
  // A notification from before this call has done its job (the caller
  // polls after every wakeup, and ArmProvider checks the real state below):
  // left in place it keeps wait_fd readable, and every later sleep on it
  // returns at once, a hidden busy loop.
  ClearWakeup();
  DrainWake();
  bool was_armed;
  {
    MutexLock lock(&mu_);
    if (!ready_.empty()) return false;
    was_armed = armed_;
    armed_ = true;  // from here on, Push wakes the sleeper
  }
  if (ArmProvider()) return true;
  // Work is pending: this caller polls instead of sleeping. Another thread
  // that armed before may still sleep on wait_fd (the SDP engine's progress
  // thread beside an application thread): leave the flag for its wake-ups
  // (WakeSleeper).
  MutexLock lock(&mu_);
  if (!was_armed) armed_ = false;
  return false;
}

absl::StatusOr<size_t> CqBase::Wait(std::span<Completion> out, absl::Duration timeout) {
  const int64_t spin_ns = spin_.budget_ns();
  const int64_t start = absl::GetCurrentTimeNanos();
  const int64_t deadline = timeout == absl::InfiniteDuration()
                               ? INT64_MAX
                               : start + absl::ToInt64Nanoseconds(timeout);
  // Phase 1: spin.
  for (;;) {
    if (size_t n = Poll(out); n > 0) return n;
    int64_t now = absl::GetCurrentTimeNanos();
    if (now - start >= spin_ns || now >= deadline) break;
    SpinYield(now - start);
  }
  // Phase 2: block on the wait fd. How long it took to find something
  // tells the spin whether a longer one would have (AdaptiveSpin).
  wait_sleeps_.fetch_add(1, std::memory_order_relaxed);
  for (;;) {
    int64_t now = absl::GetCurrentTimeNanos();
    if (Arm()) {
      int timeout_ms = -1;
      if (deadline != INT64_MAX) {
        int64_t left = deadline - now;
        if (left <= 0) {
          spin_.Slept(now - start, /*found=*/false);
          return size_t{0};
        }
        timeout_ms = static_cast<int>(std::min<int64_t>((left + 999999) / 1000000, INT32_MAX));
      }
      pollfd pfd{wait_fd(), POLLIN, 0};
      int rc = ::poll(&pfd, 1, timeout_ms);
      if (rc < 0 && errno != EINTR) {
        return ErrnoError(errno, "poll on completion queue fd failed");
      }
      ClearWakeup();
    }
    if (size_t n = Poll(out); n > 0) {
      spin_.Slept(absl::GetCurrentTimeNanos() - start, /*found=*/true);
      return n;
    }
    if (int64_t t = absl::GetCurrentTimeNanos(); t >= deadline) {
      spin_.Slept(t - start, /*found=*/false);
      return size_t{0};
    }
  }
}

}  // namespace zsock
