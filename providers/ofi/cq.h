// OfiCq: a zsock completion queue over the fi CQs of its endpoints. Each
// endpoint owns an fi CQ that is closed with it (closing one endpoint of
// an fi CQ shared with others left rxm 1.17 touching freed memory in
// fi_trywait). Progress reads the endpoints' fi CQs and hands on their
// completions and control messages; a sleeper waits on an epoll set of
// the fi CQs' wait fds (cq_wait=fd), the endpoints' TCP sockets
// (cq_wait=sockets) or a poll timer (no wait object), with each endpoint's
// liveness fds (LivenessTicker decides when they are looked at).
#ifndef ZSOCK_PROVIDERS_OFI_CQ_H_
#define ZSOCK_PROVIDERS_OFI_CQ_H_

#include <rdma/fi_domain.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "core/cq.h"
#include "core/fd.h"
#include "core/liveness.h"
#include "core/mutex.h"
#include "core/provider.h"
#include "core/ready_owners.h"
#include "providers/ofi/linger_timer.h"

namespace zsock::ofi {

class OfiFabric;
class OfiEndpoint;

// How often a CQ looks at its endpoints' peers while it is busy, and how
// often cq_wait=sockets reads every endpoint's fi CQ regardless of edges.
inline constexpr int64_t kLivenessIntervalNs = 20 * 1000 * 1000;
// The poll timer of a CQ without a wait object: from this after progress
// found work, doubling with every idle wake-up, up to the maximum.
inline constexpr int64_t kMinPollNs = 50 * 1000;
inline constexpr int64_t kMaxPollNs = 1000 * 1000;
// cq_wait=sockets: the timer is only a backstop (the sockets wake a
// sleeper), for progress that no socket announces; it backs off from this
// to Settings::backstop_ns.
inline constexpr int64_t kMinBackstopNs = 1000 * 1000;

// Completions gathered under the domain lock; a poll rarely finds more
// than a few, which then need no allocation.
using CompletionList = absl::InlinedVector<Completion, 8>;

class OfiCq final : public CqBase {
 public:
  // `fi_waits`: the fi CQs have FI_WAIT_FD objects, and the timer is a
  // backstop of a fixed `backstop_ns`; with `sockets` it is a backstop that
  // backs off from kMinBackstopNs to `backstop_ns` (either way no timer at
  // all when that is 0); without either it is the poll timer.
  OfiCq(OfiFabric* fabric, Fd timer, Fd linger_timer, Fd epoll, bool sockets, bool fi_waits,
        int64_t backstop_ns);
  ~OfiCq() override = default;

  int wait_fd() const override { return epoll_.get(); }
  // Core's wake eventfd, the timer (if any) and the linger tick join the
  // wait set.
  void WatchWake();
  // An endpoint starts (+1) or ends (-1) a linger (LingerTimer).
  void AddLinger(int d) { linger_.Add(d); }
  // `owner`: the endpoint whose liveness the fd signals (an RDM endpoint's
  // bootstrap socket), null for the others.
  void Watch(int fd, const OfiEndpoint* owner = nullptr);
  // cq_wait=sockets: one of `owner`'s TCP sockets. Edge-triggered: what
  // matters is that something arrived (or room to send appeared); the
  // socket stays readable while libfabric holds a message no receive was
  // posted for, and at end of file, and level-triggered either would keep
  // a sleeper spinning. The edges are consumed by Progress (a sleeper's
  // poll(2) on the epoll fd does not consume them), before it reads the fi
  // CQs.
  void WatchSocket(int fd, const OfiEndpoint* owner);
  void Unwatch(int fd);

  // An operation was posted (domain lock held). Without a wait object on
  // the fi CQs nothing else wakes a sleeper for what that may have done:
  // libfabric tcp completes a send inside fi_send, and a receive posted for
  // a message tcp holds (it arrived first) completes at the next progress,
  // with no new edge on any socket (conformance
  // WaitWakesForWorkFromAnotherThread). So a sleeper wakes, and a waiter
  // about to sleep polls again instead (ArmProvider).
  void PostedLocked() {
    if (fi_waits_) return;  // FI_WAIT_FD: libfabric signals its fd
    ++posts_;
    WakeSleeper();
  }

  // The endpoint list changes under mu_ and the domain lock both, so
  // either one keeps it (and its endpoints) in place: Progress's busy path
  // takes only the domain lock.
  void Attach(OfiEndpoint* ep);
  void Detach(OfiEndpoint* ep);

  // The next Progress checks every endpoint's liveness (CheckPeer), and a
  // sleeper wakes for it.
  void CheckSoon() {
    liveness_.RequestAll();
    WakeSleeper();
  }

 protected:
  size_t Progress() override;
  bool ArmProvider() override;
  void ClearWakeup() override;

 private:
  // Progress's steps: which endpoints' liveness fds are readable (true:
  // check every endpoint); then, after the reads, handing on control
  // messages and checking the peers.
  bool StartLivenessCheck();
  void DeliverControlAndCheck(bool check, bool all);
  // ArmProvider's steps: whether a poll must run before sleeping; fi_trywait
  // on the endpoints' wait objects; arming the poll or backstop timer.
  bool WorkBeforeSleep();
  bool TryWait();
  void ArmTimer();

  // How many fds the wait set holds at most (ReadyOwners::Collect's room):
  // per endpoint three (RDM: its liveness fd and its fi CQ's; MSG: its
  // event queue's and its fi CQ's or its two sockets), then the wake fd,
  // the poll timer and the linger timer. Under mu_ or the domain lock.
  size_t WatchedBoundLocked() const { return 3 * endpoints_.size() + 3; }

  OfiFabric* fabric_;
  // For providers without a CQ wait object (shm): a blocked waiter wakes
  // after poll_ns_, which starts at kMinPollNs after progress found work and
  // doubles with every idle wakeup up to kMaxPollNs: prompt while traffic
  // flows, cheap wakeups at a bounded rate when idle.
  // With cq_wait=sockets the timer is a backstop only (option backstop_ms;
  // 0: never armed). With FI_WAIT_FD it is a flat backstop_ms, and bounds
  // what a wake-up libfabric's fd misses can cost: rxm makes its
  // connections during fi_cq_read, rate-limited, and a first message among
  // many endpoints has been seen never to reach a sleeper otherwise. Flat,
  // because a sleep of sporadic traffic that starts short meets the next
  // message about when the timer fires, which made round trips with gaps
  // measurably slower (docs/ofi.md).
  Fd timer_;
  const bool fi_waits_;  // the fi CQs have FI_WAIT_FD objects (fi_trywait)
  // The endpoints have wait objects for fi_trywait: FI_WAIT_FD CQs, or MSG
  // event queues (always FI_WAIT_FD).
  const bool has_trywait_fids_;
  const int64_t min_poll_ns_, max_poll_ns_;
  std::atomic<int64_t> poll_ns_;
  // PostedLocked's count, and its value when Progress last read the fi CQs
  // (both under the domain lock).
  uint64_t posts_ = 0;
  uint64_t progressed_posts_ = 0;

  const bool on_sockets_;  // cq_wait=sockets
  // cq_wait=sockets: the endpoints whose sockets had an edge, collected
  // right before a poll's reads (domain lock); with many endpoints, and
  // when all were last read regardless (OfiCq::Progress).
  ReadyOwners hot_;
  std::atomic<int64_t> last_full_ns_{0};
  LingerTimer linger_;
  Fd epoll_;
  Mutex mu_;
  std::vector<OfiEndpoint*> endpoints_;  // see Attach
  // Progress's scratch, reused from poll to poll (under the domain lock).
  std::vector<std::vector<uint8_t>> control_;
  // Control messages drained and not yet handed on (see Progress).
  std::deque<std::pair<OfiEndpoint*, std::vector<uint8_t>>> pending_control_;
  LivenessTicker liveness_{kLivenessIntervalNs};
  // The endpoints whose liveness fd is readable: only they are checked,
  // one epoll_wait instead of a system call or two per endpoint on every
  // wake-up and liveness tick.
  ReadyOwners ready_ ABSL_GUARDED_BY(mu_);
};

// An endpoint's own fi CQ and the fd to wait on it (-1 without a wait object).
absl::Status OpenEndpointCq(fid_domain* domain, bool wait_fd, fid_cq** cq, int* fd);

}  // namespace zsock::ofi

#endif  // ZSOCK_PROVIDERS_OFI_CQ_H_
