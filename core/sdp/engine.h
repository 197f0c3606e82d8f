// sdp::Engine: owns one Fabric and one CompletionQueue and drives every SDP
// connection made through it.
//
// Progress needs no spinning thread: a thread blocked in a Connection call
// becomes the progress leader (it waits on the CQ, which spins briefly and
// then sleeps on its fd) and dispatches completions for every connection;
// other blocked threads sleep on a condition variable until the leader
// hands over. Every send and receive first
// dispatches what arrived meanwhile. With EngineOptions::progress_thread, a
// background thread also sleeps on the CQ (without spinning), so
// connections progress (credits return, peers' RDMA reads of emulated
// providers are served, readiness callbacks fire) while the application
// sleeps in its own epoll or computes; an application thread that blocks
// still leads itself, and the progress thread stands aside meanwhile
// (StandAsideForApp). One poll token orders all polling (TakeCq). Without a
// progress thread, Poll() makes progress without blocking (for an event
// loop watching wait_fd()).
//
// The engine uses only core/provider.h; the provider comes from the fabric
// config string (or the `provider` configuration key).
#ifndef ZSOCK_CORE_SDP_ENGINE_H_
#define ZSOCK_CORE_SDP_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/mutex.h"
#include "absl/time/time.h"
#include "core/adaptive_spin.h"
#include "core/fd.h"
#include "core/sdp/deadline.h"
#include "core/provider.h"
#include "core/sdp/az_guard.h"
#include "core/sdp/connection.h"

namespace zsock::sdp {

struct EngineOptions {
  std::string fabric;            // "" = the configured provider
  bool progress_thread = false;  // see above
  // The application threads' spin before they sleep (core/adaptive_spin.h);
  // unset: spin_us and spin_max_us from the configuration.
  std::optional<SpinBounds> spin;
};

class Listener {
 public:
  ~Listener();
  std::string address() const;
  // Readable when a provider-level connection is waiting.
  int fd() const;
  // Waits until `deadline` for a connection to arrive (DeadlineExceeded if
  // none did), then completes its set-up and the SDP handshake
  // (Hello/HelloAck) within connect_timeout_ms (or `deadline`, if later).
  absl::StatusOr<std::unique_ptr<Connection>> Accept(
      absl::Time deadline = absl::InfiniteFuture());

 private:
  friend class Engine;
  Listener(Engine* engine, std::unique_ptr<zsock::Listener> l, ConnectionOptions o)
      : engine_(engine), listener_(std::move(l)), options_(std::move(o)) {}
  Engine* engine_;
  std::unique_ptr<zsock::Listener> listener_;
  ConnectionOptions options_;
};

struct EngineStats {
  uint64_t completions = 0;
  uint64_t leader_waits = 0;     // CQ waits by a caller thread
  uint64_t leader_sleeps = 0;    // ... that spun out and slept on the CQ's fd
  uint64_t background_wakes = 0;  // the progress thread woke from the CQ's fd
  int64_t spin_ns = 0;           // how long the next one spins (adaptive)
  uint64_t protocol_aborts = 0;  // connections aborted for a malformed message
};

class Engine : private az::FaultClient {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(EngineOptions options = {});
  ~Engine();  // every Connection and Listener must be gone first
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  Fabric* fabric() const { return fabric_.get(); }
  absl::StatusOr<std::unique_ptr<Listener>> Listen(
      absl::string_view address, ConnectionOptions options = ConnectionOptions::FromConfig());
  absl::StatusOr<std::unique_ptr<Connection>> Connect(
      absl::string_view address, ConnectionOptions options = ConnectionOptions::FromConfig(),
      absl::Time deadline = absl::InfiniteFuture());

  // Non-blocking progress for event loops: dispatches what the CQ has and
  // arms wait_fd() for the loop's next wait (readable at once if work is
  // already pending).
  void Poll();
  // The CQ's fd (readable when Poll may have work; see CompletionQueue::Arm).
  int wait_fd() const { return cq_->wait_fd(); }
  EngineStats stats() const;

 private:
  friend class Connection;
  friend class Listener;
  friend struct ConnState;

  explicit Engine(SpinBounds spin);  // (in engine.cc, where ConnState is complete)
  absl::StatusOr<std::unique_ptr<Connection>> Start(std::unique_ptr<Endpoint> ep,
                                                    ConnectionOptions options, bool active,
                                                    absl::Time deadline);
  // Blocks (leading progress or following) until pred() or deadline;
  // returns pred(). Requires mu_. absl::InfinitePast() does not wait
  // (MSG_DONTWAIT callers pass it rather than absl::Now()).
  // `background`: the caller is the progress thread.
  bool WaitLocked(absl::FunctionRef<bool()> pred, const Deadline& deadline, bool background = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DispatchLocked(Completion& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool has_progress_thread() const { return progress_thread_.joinable(); }
  // Wakes followers and the leader after a local state change.
  void NotifyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes the threads waiting on cv_; none waiting (the usual case: one
  // application thread leads) costs no futex word access.
  void SignalWaitersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (cv_waiters_ > 0) cv_.SignalAll();
  }
  // Queues readiness callbacks for connections whose readiness changed.
  void NoteReadinessLocked(ConnState* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs queued callbacks; call without mu_. With `sync`, also returns only
  // after a batch another thread took has run.
  void RunCallbacks(bool sync = false) ABSL_LOCKS_EXCLUDED(mu_);
  void ProgressThread();
  size_t LeadWait(std::span<Completion> out, absl::Time deadline, bool background);
  // LeadWait's steps: an application thread's spin on the CQ (0: it spun
  // out; *start is when it first read the clock, 0 if it did not), then
  // the sleep on the CQ's fd (and the notify fd) until `deadline`, at most
  // a second.
  size_t SpinForCompletions(std::span<Completion> out, absl::Time deadline, int64_t* start);
  size_t SleepForCompletions(std::span<Completion> out, absl::Time deadline, bool background,
                             int64_t start);
  // One poll(2) on the CQ's fd and `notify`, at most `left`.
  struct WakeOutcome {
    bool notified = false;     // `notify` woke it
    bool stand_aside = false;  // the progress thread leaves this event to the application
  };
  WakeOutcome SleepOnCq(const Fd& notify, absl::Duration left, bool background);
  // The progress thread, about to sleep on the CQ or woken there while an
  // application thread leads: while application threads lead, or did
  // within kStandAsideNs, it sleeps on its own fd instead, looking again
  // every kStandAsideNs, until `until` (at most a second: LeadWait then
  // polls the CQ once before it stands aside again). True if it stood
  // aside. An application thread that leads wakes for every completion and
  // dispatches for every connection; with two sleepers on the CQ's fd both
  // woke for every message, and the progress thread took vCPU time and the
  // poll token at the moment the application's reply was due (measured
  // with wakeup_bench: sporadic round trips through the sockets layer were
  // markedly slower than without the progress thread).
  bool StandAsideForApp(absl::Time until);
  bool AppActiveRecently() const;
  // See StandAsideForApp: how long after an application thread last led
  // the progress thread keeps off the CQ, and how often it looks again.
  static constexpr int64_t kStandAsideNs = 2'000'000;
  // The poll token: one thread at a time polls (or arms) the CQ and keeps
  // the token until what it polled is dispatched, so completions reach their
  // connections in order although the leader polls without mu_. TakeCq
  // returns how many completions it got; with n > 0 the token stays held
  // (ReleaseCq after dispatching), with 0 it is released (also when another
  // thread holds it: that thread dispatches).
  size_t TakeCq(std::span<Completion> out);
  void ReleaseCq() { polling_.store(false, std::memory_order_release); }
  // Arms the CQ under the token: nullopt if another thread holds it, else
  // what CompletionQueue::Arm returned.
  std::optional<bool> TryArmCq();
  // Dispatches completions TakeCq returned, gives the token back and wakes
  // the threads waiting on the condition variable.
  void DispatchTakenLocked(std::span<Completion> comps) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Non-blocking progress by the calling thread unless another application
  // thread leads: an application thread entering send/recv handles what
  // arrived meanwhile itself (the progress thread shares the caller's core
  // as a batch thread and does not preempt an application computing; it
  // would otherwise hold back credits, RdmaRdCompl and AZ-SDP's
  // unprotects). True if it dispatched anything.
  bool ProgressLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // AZ-SDP: a thread touched a buffer one of our connections is sending
  // (az.cc); on the guard's service thread, without mu_.
  void OnFault(uint64_t cookie) override ABSL_LOCKS_EXCLUDED(mu_);
  az::FaultClient* fault_client() { return this; }
  // AZ-SDP lock tables: kAzMaxSlots words per connection, carved from
  // registered regions shared by the engine's connections (one region per
  // connection would cost unet a shared segment announced to every peer).
  absl::StatusOr<int> AcquireLockTable() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  MemoryRegion* LockTableRegion(int index, uint64_t** words) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseLockTable(int index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::unique_ptr<Fabric> fabric_;
  std::unique_ptr<CompletionQueue> cq_;
  Fd notify_fd_;     // wakes the leader's sleep on local state changes
  Fd bg_notify_fd_;  // the same for the progress thread
  mutable Mutex mu_;
  CondVar cv_;
  int cv_waiters_ ABSL_GUARDED_BY(mu_) = 0;  // threads in cv_.WaitWithDeadline
  bool leader_ ABSL_GUARDED_BY(mu_) = false;
  bool bg_leading_ ABSL_GUARDED_BY(mu_) = false;  // the progress thread sleeps on the CQ
  // leader_, readable without mu_, and when an application thread last
  // stopped leading (CoarseNowNs): StandAsideForApp.
  std::atomic<bool> app_leading_{false};
  std::atomic<int64_t> app_left_ns_{INT64_MIN / 2};
  std::atomic<bool> polling_{false};  // the poll token (TakeCq)
  // The application threads' spin (LeadWait), and how often they slept.
  AdaptiveSpin spin_;
  std::atomic<uint64_t> leader_sleeps_{0};
  std::atomic<uint64_t> background_wakes_{0};
  // Where the token's holder polls into, until it has dispatched them. One
  // array for the engine, not one on the stack per poll: constructing and
  // destroying 32 completions (an absl::Status each) was, measured, a
  // noticeable part of the CPU time of a small send.
  Completion taken_[32];
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::unique_ptr<ConnState>> conns_ ABSL_GUARDED_BY(mu_);
  struct PendingCallback {
    std::shared_ptr<std::function<void(uint32_t)>> cb;
    uint32_t readiness;
  };
  std::vector<PendingCallback> callbacks_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> callbacks_pending_{false};  // callbacks_ is not empty (a hint)
  Mutex callback_mu_;  // runs callbacks in order, one batch at a time
  std::vector<PendingCallback> running_ ABSL_GUARDED_BY(callback_mu_);  // the batch running
  EngineStats stats_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> az_used_{false};  // a connection protected a buffer
  std::vector<std::unique_ptr<MemoryRegion>> lock_regions_ ABSL_GUARDED_BY(mu_);
  std::vector<int> free_lock_tables_ ABSL_GUARDED_BY(mu_);
  std::thread progress_thread_;
};

}  // namespace zsock::sdp

#endif  // ZSOCK_CORE_SDP_ENGINE_H_
