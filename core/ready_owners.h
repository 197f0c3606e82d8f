// ReadyOwners: which owners' fds in an epoll set are readable now, in one
// epoll_wait with a zero timeout. For providers that look at an endpoint's
// liveness fds (its connection socket, its peer's pidfd) only once they
// turned readable, instead of probing every endpoint with system calls on
// every wake-up (unet and ofi; docs/unet.md "Peer failure").
#ifndef ZSOCK_CORE_READY_OWNERS_H_
#define ZSOCK_CORE_READY_OWNERS_H_

#include <sys/epoll.h>

#include <cstddef>
#include <vector>

#include "absl/container/flat_hash_set.h"

namespace zsock {

class ReadyOwners {
 public:
  // Collects the owners (epoll_event::data.ptr; null entries are ignored)
  // of the readable fds of `epfd`, which watches at most `watched` fds. Room
  // for all of them in one call: a loop of smaller calls never ends while
  // fds stay readable (level-triggered epoll re-queues what it returns).
  void Collect(int epfd, size_t watched) {
    owners_.clear();
    events_.resize(watched);
    int k = ::epoll_wait(epfd, events_.data(), static_cast<int>(events_.size()), 0);
    for (int i = 0; i < k; ++i) {
      if (events_[i].data.ptr != nullptr) owners_.insert(events_[i].data.ptr);
    }
  }
  // Compare only, never follow: an event may name an owner already gone.
  bool contains(const void* owner) const { return owners_.contains(owner); }
  bool empty() const { return owners_.empty(); }

 private:
  std::vector<epoll_event> events_;
  absl::flat_hash_set<const void*> owners_;
};

}  // namespace zsock

#endif  // ZSOCK_CORE_READY_OWNERS_H_
