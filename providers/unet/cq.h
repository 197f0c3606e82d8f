// unet's completion queue. Its wait fd is an epoll set holding the CQ's
// eventfd (peers write it to wake us), the wake-up eventfd of core's
// CompletionQueue, and every endpoint's connection socket and peer pidfd
// (readable when a peer announces a segment, goes away or exits).
//
// Each endpoint gets a bit in the CQ's bell (CqBell, segment.h), which its
// peer rings after publishing. A CQ with few endpoints asks each one's
// rings on every progress; beyond kSweepMax it reads the bell and asks only
// the endpoints whose bits are set. Bits are hints: a bit a faulty peer
// sets costs a look at an endpoint with nothing to do.
#ifndef ZSOCK_PROVIDERS_UNET_CQ_H_
#define ZSOCK_PROVIDERS_UNET_CQ_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "core/cq.h"
#include "core/fd.h"
#include "core/liveness.h"
#include "core/mutex.h"
#include "core/provider.h"
#include "core/ready_owners.h"
#include "providers/unet/os.h"
#include "providers/unet/segment.h"

namespace zsock::unet {

class UnetEndpoint;

class UnetCq final : public CqBase {
 public:
  static absl::StatusOr<std::unique_ptr<UnetCq>> Create();
  ~UnetCq() override;

  int wait_fd() const override { return epoll_.get(); }
  int event_fd() const { return event_.get(); }
  int bell_fd() const { return bell_fd_.get(); }

  // A bit in the bell for a new endpoint (kNoBellSlot when all kBellSlots
  // are taken: that endpoint is polled on every progress). Released by
  // Detach, or by ReleaseSlot when the handshake fails.
  uint32_t AllocateSlot();
  void ReleaseSlot(uint32_t slot);
  // The endpoint has local work (completions to hand out, queued sends, a
  // receive matching a waiting message): look at it on the next progress.
  void Mark(uint32_t slot) { RingBell(bell_, slot); }

  void Attach(UnetEndpoint* ep, uint32_t slot, int watch_fd, int pidfd);
  void Detach(UnetEndpoint* ep, uint32_t slot, int watch_fd, int pidfd);
  void Unwatch(int fd);

 protected:
  size_t Progress() override;
  bool ArmProvider() override;
  void ClearWakeup() override;

 private:
  UnetCq(Fd event, Fd epoll, Fd bell_fd, Mapping bell_map)
      : event_(std::move(event)),
        epoll_(std::move(epoll)),
        bell_fd_(std::move(bell_fd)),
        bell_map_(std::move(bell_map)),
        bell_(reinterpret_cast<CqBell*>(bell_map_.get())) {}

  // Up to this many endpoints every progress asks each endpoint's rings
  // (cheap while they stay in cache); beyond, it reads the bell and asks
  // only the endpoints whose bits are set. With the bell every message
  // costs the receiver one more cache line (the bell word), which a pair
  // of endpoints need not pay; with hundreds of endpoints the sweep's
  // rings no longer fit the caches and TLB, and latency collapses.
  static constexpr size_t kSweepMax = 16;
  bool UseBellLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return endpoints_.size() > kSweepMax;
  }

  // Calls fn(endpoint) for each endpoint whose bell bit is set, until fn
  // returns true (then returns true). `clear`: take the bits (a seq_cst
  // exchange, ordered before the reads of the rings: RingBell); otherwise
  // only read them (seq_cst: after the armed flag's store, ArmProvider).
  template <typename Fn>
  bool VisitBellLocked(bool clear, Fn fn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Fd event_;
  Fd epoll_;
  Fd bell_fd_;
  Mapping bell_map_;
  CqBell* bell_;
  Mutex mu_;
  std::vector<UnetEndpoint*> endpoints_ ABSL_GUARDED_BY(mu_);
  // Endpoints by bell slot (null: free), and those without a slot.
  std::vector<UnetEndpoint*> by_slot_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_slots_ ABSL_GUARDED_BY(mu_);
  std::vector<UnetEndpoint*> unslotted_ ABSL_GUARDED_BY(mu_);
  // Dead-peer looks: on a wake-up, and at least every 20 ms when polled
  // without sleeping (a look costs system calls).
  LivenessTicker liveness_{20 * 1000 * 1000};
  // The endpoints whose socket or pidfd is readable (a peer's message on
  // the socket, its end, or its exit): only they are looked at on a
  // wake-up or liveness tick, not every endpoint with three system calls
  // each (with hundreds of idle connections every wake-up would pay for
  // all of them).
  ReadyOwners ready_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zsock::unet

#endif  // ZSOCK_PROVIDERS_UNET_CQ_H_
