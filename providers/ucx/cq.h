// The ucx completion queue.
//
// Its wait_fd is an epoll set holding the fabric's workers' wakeup fds, an
// eventfd for completions delivered from outside its own progress, core's
// wake eventfd, a timer (a short sleep while UCX is busy with nothing to
// progress) and a nested epoll set of its endpoints' connection sockets,
// whose only event is a peer's end. Progress drives the fabric's workers
// (the busy poll's path: Progress, Worker::ProgressLocked,
// ucp_worker_progress), looks at the sockets once per coarse clock tick
// and services endpoints that noted work (NoteService).
#ifndef ZSOCK_PROVIDERS_UCX_CQ_H_
#define ZSOCK_PROVIDERS_UCX_CQ_H_

#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/cq.h"
#include "core/fd.h"
#include "core/mutex.h"
#include "core/provider.h"

namespace zsock::ucx {

class UcxEndpoint;
class UcxFabric;
class Worker;

class UcxCq final : public CqBase {
 public:
  static absl::StatusOr<std::unique_ptr<UcxCq>> Create(UcxFabric* fabric);
  ~UcxCq() override;

  static constexpr int64_t kMinBackoffNs = 20 * 1000;
  static constexpr int64_t kMaxBackoffNs = 2 * 1000 * 1000;
  static constexpr int64_t kSocketCheckNs = 1000 * 1000;

  int wait_fd() const override { return epoll_.get(); }
  UcxFabric* fabric() const { return fabric_; }

  // Reports a completion; wakes a waiter unless this CQ is progressing on
  // this thread (its caller polls next anyway).
  void Deliver(Completion c);
  // An endpoint of this CQ has control messages or an emulation failure for
  // Service(): the next Progress looks (a busy poll with nothing noted
  // takes neither mu_ nor the endpoints' worker mutexes).
  void NoteService() { service_pending_.store(true, std::memory_order_release); }
  void WakeWaiter() {
    // Written once until Drain reads it (as core's Wake): every send that
    // finishes inside its call wakes a sleeping waiter.
    if (wake_pending_.load(std::memory_order_seq_cst)) return;
    wake_pending_.store(true, std::memory_order_seq_cst);
    uint64_t one = 1;
    ssize_t rc = ::write(event_.get(), &one, sizeof(one));
    (void)rc;  // EAGAIN: the counter is non-zero, the waiter wakes anyway
  }
  // Whether this thread is inside this CQ's Progress.
  bool IsProgressingHere() const;
  void WatchWorker(int efd) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = efd;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, efd, &ev);
  }
  // A worker whose arm failed leaves its fd readable; while it has nothing
  // to progress, the CQ waits on its timer instead (see ArmProvider).
  void MuteWorker(int efd, bool mute) {
    epoll_event ev{};
    ev.events = mute ? 0u : static_cast<uint32_t>(EPOLLIN);
    ev.data.fd = efd;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, efd, &ev);
  }
  void Attach(UcxEndpoint* ep, int sock);
  void Detach(UcxEndpoint* ep, int sock);
  void Unwatch(int sock) { ::epoll_ctl(socks_.get(), EPOLL_CTL_DEL, sock, nullptr); }

 protected:
  size_t Progress() override;
  bool ArmProvider() override;
  // Progress's cold parts: a second worker (the tcp fallback), the sockets
  // and the endpoints' service.
  [[gnu::noinline]] size_t ProgressOtherLocked(Worker* w, int64_t now);
  [[gnu::noinline]] size_t LookAtSocketsAndEndpoints(int64_t now);
  void ClearWakeup() override {
    armed_.store(false, std::memory_order_seq_cst);
    check_socks_.store(true, std::memory_order_relaxed);
    polls_.store(0, std::memory_order_relaxed);  // a fresh clock for the wakeup's poll
    Drain();
  }
  void UnmuteAll() {
    MutexLock lock(&mute_mu_);
    for (int efd : muted_) MuteWorker(efd, false);
    muted_.clear();
  }
  // Makes wait_fd readable after `ns` (0: never).
  void SetTimer(int64_t ns) {
    itimerspec t{};
    t.it_value.tv_sec = ns / 1000000000;
    t.it_value.tv_nsec = ns % 1000000000;
    ::timerfd_settime(timer_.get(), 0, &t, nullptr);
  }

 private:
  UcxCq(UcxFabric* fabric, Fd epoll, Fd socks, Fd event, Fd timer, int idle_tries)
      : fabric_(fabric), epoll_(std::move(epoll)), socks_(std::move(socks)),
        event_(std::move(event)), timer_(std::move(timer)), idle_tries_(idle_tries) {}
  // Reads, then clears wake_pending_ (core's DrainWake says why that order).
  void Drain() {
    uint64_t v;
    while (::read(event_.get(), &v, sizeof(v)) == sizeof(v)) {
    }
    wake_pending_.store(false, std::memory_order_seq_cst);
    while (::read(timer_.get(), &v, sizeof(v)) == sizeof(v)) {
    }
  }

  UcxFabric* fabric_;
  Fd epoll_;
  Fd socks_;
  Fd event_;
  Fd timer_;  // backoff while UCX is busy with nothing to progress
  std::atomic<int64_t> backoff_ns_{kMinBackoffNs};
  Mutex mute_mu_;
  std::vector<int> muted_ ABSL_GUARDED_BY(mute_mu_);  // worker fds taken out of epoll_
  std::atomic<bool> wake_pending_{false};  // event_ written, not yet drained
  std::atomic<bool> pushed_{false};  // delivered from outside Progress since it ran
  std::atomic<bool> armed_{false};   // a waiter may sleep on wait_fd
  std::atomic<bool> check_socks_{true};  // look at the sockets in the next Progress
  std::atomic<bool> service_pending_{true};  // NoteService
  std::atomic<int64_t> last_sock_check_{0};
  static constexpr uint32_t kClockPolls = 8;
  // ucp_worker_progress calls per Progress while nothing turns up, on a
  // shared-memory-only fabric. A busy poller sees a message as soon as the
  // look after its arrival, and zsock's own part of a poll (core's Poll,
  // this Progress, the worker lock) is most of an idle poll: with several
  // tries it comes once per several looks. Measured within one run: a
  // 64-byte one-way time over shared memory shorter with 4 than with 2 or
  // 8, and longer with 16. One try where tcp is in the worker: its progress
  // is an epoll_wait call, beside which zsock's part is nothing, and more
  // tries only made an idle poll several times longer.
  static constexpr int kIdleTries = 4;
  const int idle_tries_;
  std::atomic<uint32_t> polls_{0};    // Progress calls (Progress: the clock's reads)
  std::atomic<int64_t> now_ns_{0};    // the coarse clock when last read
  Mutex mu_;
  std::vector<UcxEndpoint*> endpoints_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zsock::ucx

#endif  // ZSOCK_PROVIDERS_UCX_CQ_H_
