// unet's completion queue (cq.h): creation, bell slots, the endpoints it
// progresses, and sleeping.
#include "providers/unet/cq.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <new>
#include <utility>

#include "core/clock.h"
#include "core/status.h"
#include "providers/unet/endpoint.h"

namespace zsock::unet {

absl::StatusOr<std::unique_ptr<UnetCq>> UnetCq::Create() {
  int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (efd < 0) return ErrnoError(errno, "eventfd for a unet CQ failed", "raise the fd limit (ulimit -n)");
  Fd event(efd);
  int epfd = ::epoll_create1(EPOLL_CLOEXEC);
  if (epfd < 0) return ErrnoError(errno, "epoll_create1 for a unet CQ failed", "raise the fd limit (ulimit -n)");
  Fd ep(epfd);
  // The eventfds carry no endpoint (data 0); an endpoint's socket and
  // pidfd carry the endpoint (Attach).
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;
  if (::epoll_ctl(epfd, EPOLL_CTL_ADD, efd, &ev) != 0) {
    return ErrnoError(errno, "adding the eventfd to the unet CQ epoll set failed");
  }
  auto bell_fd = CreateMemfd("zsock-unet-bell", kBellBytes);
  if (!bell_fd.ok()) return bell_fd.status();
  auto bell_map = MapFd(bell_fd->get(), kBellBytes, "a unet CQ bell");
  if (!bell_map.ok()) return bell_map.status();
  auto* bell = new (bell_map->get()) CqBell{};
  bell->magic = kBellMagic;
  bell->version = kVersion;
  bell->slots = kBellSlots;
  auto cq = std::unique_ptr<UnetCq>(new UnetCq(std::move(event), std::move(ep),
                                               std::move(*bell_fd), std::move(*bell_map)));
  if (::epoll_ctl(epfd, EPOLL_CTL_ADD, cq->wake_fd(), &ev) != 0) {
    return ErrnoError(errno, "adding the wake eventfd to the unet CQ epoll set failed");
  }
  return cq;
}

UnetCq::~UnetCq() = default;

uint32_t UnetCq::AllocateSlot() {
  MutexLock lock(&mu_);
  if (!free_slots_.empty()) {
    uint32_t slot = free_slots_.back();
    free_slots_.pop_back();
    return slot;
  }
  if (by_slot_.size() >= kBellSlots) return kNoBellSlot;
  by_slot_.push_back(nullptr);
  return static_cast<uint32_t>(by_slot_.size() - 1);
}

void UnetCq::ReleaseSlot(uint32_t slot) {
  if (slot == kNoBellSlot) return;
  MutexLock lock(&mu_);
  by_slot_[slot] = nullptr;
  free_slots_.push_back(slot);
}

void UnetCq::Attach(UnetEndpoint* ep, uint32_t slot, int watch_fd, int pidfd) {
  MutexLock lock(&mu_);
  endpoints_.push_back(ep);
  if (slot == kNoBellSlot) {
    unslotted_.push_back(ep);
  } else {
    by_slot_[slot] = ep;
    // The peer may have published (and rung) before the slot had its
    // endpoint, and a progress in between dropped the bit: look once.
    Mark(slot);
  }
  for (int fd : {watch_fd, pidfd}) {
    if (fd < 0) continue;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.ptr = ep;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev);
  }
}

void UnetCq::Detach(UnetEndpoint* ep, uint32_t slot, int watch_fd, int pidfd) {
  Unwatch(watch_fd);
  if (pidfd >= 0) Unwatch(pidfd);
  {
    MutexLock lock(&mu_);
    endpoints_.erase(std::remove(endpoints_.begin(), endpoints_.end(), ep), endpoints_.end());
    std::erase(unslotted_, ep);
  }
  ReleaseSlot(slot);
}

void UnetCq::Unwatch(int fd) { ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr); }

void UnetCq::ClearWakeup() {
  // One read: an eventfd's read returns its whole count and zeroes it.
  uint64_t v;
  ssize_t rc = ::read(event_.get(), &v, sizeof(v));
  (void)rc;  // EAGAIN: woken by something else
  liveness_.Request();
}

template <typename Fn>
bool UnetCq::VisitBellLocked(bool clear, Fn fn) {
  const size_t words = (by_slot_.size() + 63) / 64;
  for (size_t w = 0; w < words; ++w) {
    std::atomic<uint64_t>& word = bell_->ready[w];
    if (word.load(std::memory_order_relaxed) == 0) continue;
    uint64_t bits = clear ? word.exchange(0, std::memory_order_seq_cst)
                          : word.load(std::memory_order_seq_cst);
    while (bits != 0) {
      const size_t slot = w * 64 + static_cast<size_t>(std::countr_zero(bits));
      bits &= bits - 1;
      // A bit may name a free slot (a peer's late ring, or any bit a
      // faulty peer sets): nothing to do.
      UnetEndpoint* ep = slot < by_slot_.size() ? by_slot_[slot] : nullptr;
      if (ep != nullptr && fn(ep)) return true;
    }
  }
  return false;
}

size_t UnetCq::Progress() {
  const bool check = liveness_.Due(CoarseNowNs());
  MutexLock lock(&mu_);
  // Per endpoint its socket and pidfd, then the two eventfds.
  if (check) ready_.Collect(epoll_.get(), 2 * endpoints_.size() + 2);
  size_t n = 0;
  if (!UseBellLocked()) {
    for (UnetEndpoint* ep : endpoints_) n += ep->Progress(check && ready_.contains(ep));
    return n;
  }
  // Readable sockets and pidfds are rare (a peer's end, an announcement).
  if (check && !ready_.empty()) {
    for (UnetEndpoint* ep : endpoints_) {
      if (ready_.contains(ep)) n += ep->Progress(true);
    }
  }
  VisitBellLocked(/*clear=*/true, [&](UnetEndpoint* ep) {
    n += ep->Progress(false);
    return false;
  });
  for (UnetEndpoint* ep : unslotted_) n += ep->Progress(check && ready_.contains(ep));
  return n;
}

bool UnetCq::ArmProvider() {
  // Before the look below: a peer that rings after it sees the flag.
  bell_->armed.store(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  MutexLock lock(&mu_);
  if (!UseBellLocked()) {
    for (UnetEndpoint* ep : endpoints_) {
      if (ep->ArmAndCheck()) return false;
    }
    return true;
  }
  // Only endpoints whose bits are set can have work (the bits stay set for
  // the progress that follows a wake-up).
  if (VisitBellLocked(/*clear=*/false, [](UnetEndpoint* ep) { return ep->ArmAndCheck(); })) {
    return false;
  }
  for (UnetEndpoint* ep : unslotted_) {
    if (ep->ArmAndCheck()) return false;
  }
  return true;
}

}  // namespace zsock::unet
