// The SDP engine's progress (engine.h): the poll token, the leader's spin
// and sleep on the CQ, the progress thread's standing aside, dispatching
// completions to their connections, and readiness callbacks. Every send
// and receive passes through here: its hot parts stay in this file.
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/mutex.h"
#include "core/sdp/conn_state.h"
#include "core/sdp/engine.h"

namespace zsock::sdp {

void Engine::ProgressThread() {
  // SCHED_BATCH: the thread is for progress while the application is away
  // from the engine, and often shares the application's (pinned) core. A
  // normal thread's wake-up (a peer's completion arrived) preempted an
  // application computing between sends; a batch thread never preempts on
  // wake-up (it runs at the next tick or when the core idles), yet keeps
  // its fair share under load, unlike a high nice value. Completions that
  // arrive meanwhile wait for the application's next call, which dispatches
  // them first (ProgressLocked).
  sched_param param{};
  if (int err = pthread_setschedparam(pthread_self(), SCHED_BATCH, &param); err != 0) {
    ZS_LOG(kDebug, "sdp: could not make the progress thread SCHED_BATCH: %s",
           std::strerror(err));
  }
  MutexLock lock(&mu_);
  while (!stop_) {
    WaitLocked([&] { return stop_; }, absl::Now() + absl::Seconds(1), /*background=*/true);
  }
}

namespace {
void Signal(const Fd& fd) {
  if (!fd) return;
  uint64_t one = 1;
  ssize_t rc = ::write(fd.get(), &one, sizeof(one));
  (void)rc;  // EAGAIN: already signalled
}
}  // namespace

void Engine::NotifyLocked() {
  SignalWaitersLocked();
  if (leader_) Signal(notify_fd_);
  // The progress thread waits for nothing but stop; waking it for every
  // local change would preempt the application on a shared core.
  if (stop_ && bg_leading_) Signal(bg_notify_fd_);
}

// The leader's wait: like CompletionQueue::Wait (spin, then sleep on the
// CQ's fd; the spin adapts between spin_us and spin_max_us to how soon the
// sleeps end, core/adaptive_spin.h), but also woken by NotifyLocked through
// the engine's own eventfd, so a local state change another thread makes (a
// shutdown, a release) ends the sleep at once. The progress thread does not
// spin: it works while the application is away, often on the application's
// own (pinned) core, where every spin is time taken from the application.
size_t Engine::LeadWait(std::span<Completion> out, absl::Time deadline, bool background) {
  int64_t start = 0;  // when the spin first read the clock (0: it did not)
  if (!background) {
    if (size_t n = SpinForCompletions(out, deadline, &start); n > 0) return n;
  } else if (size_t n = TakeCq(out); n > 0) {
    return n;
  }
  return SleepForCompletions(out, deadline, background, start);
}

size_t Engine::SpinForCompletions(std::span<Completion> out, absl::Time deadline,
                                  int64_t* start) {
  const int64_t spin_ns = spin_.budget_ns();
  // The clock is first read after 32 empty polls, then every 32nd: a
  // ping-pong's reply usually comes sooner, and a clock read costs about as
  // much as a few empty polls (measured: clock reads were a noticeable
  // part of a small ping-pong's time). The spin lasts its budget from that
  // read, or until the caller's deadline (spin_max_us may be long).
  const int64_t deadline_ns =
      deadline == absl::InfiniteFuture() ? INT64_MAX : absl::ToUnixNanos(deadline);
  for (uint32_t polls = 1;; ++polls) {
    if (size_t n = TakeCq(out); n > 0) return n;
    if ((polls & 31) != 0) continue;
    const int64_t now = absl::GetCurrentTimeNanos();
    if (*start == 0) *start = now;
    if (now - *start >= spin_ns || now >= deadline_ns) return 0;
    SpinYield(now - *start);
  }
}

size_t Engine::SleepForCompletions(std::span<Completion> out, absl::Time deadline,
                                   bool background, int64_t start) {
  const Fd& notify = background ? bg_notify_fd_ : notify_fd_;
  // Asleep, wake at least every second to let the caller re-check (a lost
  // wake-up never hangs). An application thread's sleep tells the spin
  // whether a longer one would have caught its event: found (a completion,
  // or a notification, which is mostly the progress thread handing one
  // over) or not (a second or the deadline passed).
  if (!background) leader_sleeps_.fetch_add(1, std::memory_order_relaxed);
  auto adapt = [&](bool found) {
    if (!background && start != 0) spin_.Slept(absl::GetCurrentTimeNanos() - start, found);
  };
  const absl::Time until = std::min(deadline, absl::Now() + absl::Seconds(1));
  for (;;) {
    absl::Time now = absl::Now();
    if (now >= until) {
      adapt(false);
      return 0;
    }
    if (background && StandAsideForApp(until)) return 0;
    std::optional<bool> try_arm = TryArmCq();
    if (!try_arm) {  // another thread is polling right now; let it finish
      sched_yield();
      continue;
    }
    const bool armed = *try_arm;
    // Arming cleared the wake-up state the progress thread sleeps on; when
    // it finds work pending, this thread handles that work and the
    // providers may stay disarmed (unet arms endpoints only up to the first
    // with work): have the progress thread re-arm for itself.
    if (!armed && !background && bg_notify_fd_) Signal(bg_notify_fd_);
    if (!armed) {
      if (size_t n = TakeCq(out); n > 0) {
        adapt(true);
        return n;
      }
      continue;
    }
    const WakeOutcome woke = SleepOnCq(notify, until - now, background);
    if (woke.stand_aside) continue;
    if (size_t n = TakeCq(out); n > 0) {
      adapt(true);
      return n;
    }
    if (woke.notified) {
      adapt(true);
      return 0;  // let the caller re-check its condition
    }
  }
}

Engine::WakeOutcome Engine::SleepOnCq(const Fd& notify, absl::Duration left, bool background) {
  pollfd pfd[2] = {{cq_->wait_fd(), POLLIN, 0}, {notify.get(), POLLIN, 0}};
  int ms = static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1000));
  int rc = ::poll(pfd, notify ? 2 : 1, ms);
  if (rc < 0 && errno != EINTR) {
    ZS_LOG(kWarn, "sdp: poll on the completion queue fd failed: %s", std::strerror(errno));
  }
  WakeOutcome woke;
  woke.notified = notify && (pfd[1].revents & POLLIN);
  if (background && (pfd[0].revents & POLLIN)) {
    background_wakes_.fetch_add(1, std::memory_order_relaxed);
  }
  if (woke.notified) {
    uint64_t v;
    while (::read(notify.get(), &v, sizeof(v)) == sizeof(v)) {}
  }
  // Both woke for this event: the application thread takes it, and
  // this one stands aside (at the top of the loop).
  woke.stand_aside =
      background && !woke.notified && app_leading_.load(std::memory_order_relaxed);
  return woke;
}

bool Engine::AppActiveRecently() const {
  return app_leading_.load(std::memory_order_relaxed) ||
         CoarseNowNs() - app_left_ns_.load(std::memory_order_relaxed) < kStandAsideNs;
}

bool Engine::StandAsideForApp(absl::Time until) {
  if (!AppActiveRecently()) return false;
  // No signal brings this thread back: an application thread leaving the
  // engine would pay one on every call, and a busy ping-pong leaves it on
  // every message. The thread looks again every kStandAsideNs, and returns
  // once no application thread has led for that long, at `until`, or when
  // its fd wakes it (stop).
  do {
    const absl::Time now = absl::Now();
    if (now >= until) break;
    pollfd pfd{bg_notify_fd_.get(), POLLIN, 0};
    int ms = static_cast<int>(std::min<int64_t>(
        {absl::ToInt64Milliseconds(until - now) + 1, kStandAsideNs / 1000000, 1000}));
    if (::poll(&pfd, 1, ms) > 0) {
      uint64_t v;
      while (::read(bg_notify_fd_.get(), &v, sizeof(v)) == sizeof(v)) {}
      break;
    }
  } while (AppActiveRecently());
  return true;
}

size_t Engine::TakeCq(std::span<Completion> out) {
  // A plain load first: a spinning thread does not take the token's line
  // exclusive while another thread holds it.
  if (polling_.load(std::memory_order_relaxed) ||
      polling_.exchange(true, std::memory_order_acquire)) {
    return 0;
  }
  size_t n = cq_->Poll(out);
  if (n == 0) ReleaseCq();
  return n;
}

std::optional<bool> Engine::TryArmCq() {
  // Arming drives the provider too: it needs the token.
  if (polling_.exchange(true, std::memory_order_acquire)) return std::nullopt;
  const bool armed = cq_->Arm();
  ReleaseCq();
  return armed;
}

void Engine::DispatchTakenLocked(std::span<Completion> comps) {
  for (Completion& c : comps) DispatchLocked(c);
  if (!comps.empty()) ReleaseCq();
  SignalWaitersLocked();
}

bool Engine::ProgressLocked() {
  // An application thread leading dispatches promptly itself (it spins or
  // sleeps on the CQ); polling beside it would only add hand-overs.
  if (leader_) return false;
  size_t n = TakeCq(taken_);
  if (n == 0) return false;
  DispatchTakenLocked(std::span<Completion>(taken_, n));
  return true;
}

void Engine::NoteReadinessLocked(ConnState* c) {
  const uint32_t r = c->ReadinessNow();
  const uint32_t last = c->readiness.last;
  if (r == last) return;
  c->readiness.last = r;
  // seq_cst: a watch widened before the widener reads readiness() (under
  // mu_) is seen here, or that read sees this change.
  if (c->readiness.callback && ((r ^ last) & c->readiness.watch->load(std::memory_order_seq_cst)) != 0) {
    callbacks_.push_back({c->readiness.callback, r});
    callbacks_pending_.store(true, std::memory_order_relaxed);
  }
}

void Engine::RunCallbacks(bool sync) {
  // Every send and receive ends here; most changed no readiness. A thread
  // that queued callbacks sees its own store; one that queued none has
  // nothing of its own to run. `sync` callers (a callback replaced, a
  // connection closed) also wait out a batch another thread is running:
  // once they return, no old callback runs any more.
  if (!sync && !callbacks_pending_.load(std::memory_order_relaxed)) return;
  MutexLock order(&callback_mu_);
  {
    MutexLock lock(&mu_);
    running_.swap(callbacks_);  // callbacks_ gets the emptied vector back: no allocation
    callbacks_pending_.store(false, std::memory_order_relaxed);
  }
  absl::Cleanup clear = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { running_.clear(); };
  for (auto& p : running_) (*p.cb)(p.readiness);
}

void Engine::DispatchLocked(Completion& c) {
  stats_.completions++;
  uint64_t id = c.context >> 24;
  auto kind = static_cast<CtxKind>((c.context >> 20) & 0xf);
  uint32_t index = static_cast<uint32_t>(c.context & 0xfffff);
  auto it = conns_.find(id);
  if (it == conns_.end()) return;  // a connection already closed
  ConnState* s = it->second.get();
  s->OnCompletion(kind, index, c);
  NoteReadinessLocked(s);
}

// Two leaders may sleep on the CQ at once: the progress thread (in the
// background, without spinning) and one application thread, which leads
// rather than waiting for the progress thread to hand completions over (a
// hand-over costs a wake-up on a core the two often share). The poll token
// keeps their polls in order.
bool Engine::WaitLocked(absl::FunctionRef<bool()> pred, const Deadline& deadline,
                        bool background) {
  for (;;) {
    if (pred()) return true;
    // InfinitePast: do not wait (MSG_DONTWAIT), without reading the clock;
    // InfiniteFuture: no clock read before the first wait either; a
    // relative deadline (Deadline::After) starts counting here.
    if (deadline.no_wait()) return false;
    if (!deadline.never()) {
      if (!deadline.resolved()) {
        deadline.Get();  // counts from now: cannot have passed yet
      } else if (absl::Now() >= deadline.Get()) {
        return false;
      }
    }
    bool& leading = background ? bg_leading_ : leader_;
    if (!leading) {
      leading = true;
      stats_.leader_waits++;
      if (!background) app_leading_.store(true, std::memory_order_relaxed);
      mu_.Unlock();
      size_t n = LeadWait(taken_, deadline.Get(), background);
      mu_.Lock();
      leading = false;
      if (!background) {
        app_left_ns_.store(CoarseNowNs(), std::memory_order_relaxed);
        app_leading_.store(false, std::memory_order_relaxed);
      }
      DispatchTakenLocked(std::span<Completion>(taken_, n));
      // The other leader may be waiting for what this dispatched.
      if (n > 0 && background && leader_) Signal(notify_fd_);
    } else {
      // The leader hands over; wake at least every second to re-check.
      ++cv_waiters_;
      cv_.WaitWithDeadline(&mu_, std::min(deadline.Get(), absl::Now() + absl::Seconds(1)));
      --cv_waiters_;
      continue;
    }
    if (!callbacks_.empty()) {
      mu_.Unlock();
      RunCallbacks();
      mu_.Lock();
    }
  }
}

void Engine::Poll() {
  {
    MutexLock lock(&mu_);
    ProgressLocked();
    // The caller goes back to its event loop to wait on wait_fd(): arm the
    // CQ for it; with work already pending, make the fd readable instead.
    std::optional<bool> armed = TryArmCq();  // nullopt: a poller holds it
    if (armed.has_value() && !*armed) cq_->Wake();
  }
  RunCallbacks();
}

}  // namespace zsock::sdp
