// VerbsCq: the verbs provider's zsock completion queue. One completion
// channel and an epoll set (the channel's fd, core's wake fd, and each
// endpoint's CM event channel) make its wait fd; each endpoint has its own
// ibv_cq on the channel, and Progress polls every attached endpoint.
#ifndef ZSOCK_PROVIDERS_VERBS_CQ_H_
#define ZSOCK_PROVIDERS_VERBS_CQ_H_

#include <infiniband/verbs.h>
#include <sys/epoll.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "core/cq.h"
#include "core/fd.h"
#include "core/mutex.h"
#include "core/provider.h"
#include "providers/verbs/cm.h"

namespace zsock::verbs {

class VerbsFabric;
class VerbsEndpoint;

class VerbsCq final : public CqBase {
 public:
  VerbsCq(VerbsFabric* fabric, ibv_comp_channel* channel, Fd epoll)
      : fabric_(fabric), channel_(channel), epoll_(std::move(epoll)) {
    SetNonBlocking(channel_->fd);
    Watch(channel_->fd);
    Watch(wake_fd());
  }
  ~VerbsCq() override { ibv_destroy_comp_channel(channel_); }

  int wait_fd() const override { return epoll_.get(); }
  ibv_comp_channel* channel() const { return channel_; }
  VerbsFabric* fabric() const { return fabric_; }

  void Watch(int fd) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev);
  }
  void Unwatch(int fd) { ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr); }

  void Attach(VerbsEndpoint* ep) {
    MutexLock lock(&mu_);
    endpoints_.push_back(ep);
  }
  // Detaches and runs `destroy` (which destroys the endpoint's ibv_cq) under
  // the list lock, so that no completion event is being fetched for it.
  void Detach(VerbsEndpoint* ep, absl::FunctionRef<void()> destroy) {
    MutexLock lock(&mu_);
    std::erase(endpoints_, ep);
    destroy();
  }

 protected:
  size_t Progress() override;
  bool ArmProvider() override;
  void ClearWakeup() override {
    MutexLock lock(&mu_);
    DrainEventsLocked();
  }

 private:
  // ibv_get_cq_event for everything pending, each acked at once (so that
  // ibv_destroy_cq never waits for unacked events).
  void DrainEventsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ibv_cq* cq = nullptr;
    void* ctx = nullptr;
    while (ibv_get_cq_event(channel_, &cq, &ctx) == 0) ibv_ack_cq_events(cq, 1);
  }

  VerbsFabric* fabric_;
  ibv_comp_channel* channel_;
  Fd epoll_;
  Mutex mu_;
  std::vector<VerbsEndpoint*> endpoints_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zsock::verbs

#endif  // ZSOCK_PROVIDERS_VERBS_CQ_H_
