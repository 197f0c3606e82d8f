// The verbs endpoint's set-up, start and graceful close (see endpoint.h).
#include "providers/verbs/endpoint.h"

#include <sched.h>

#include <cerrno>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status.h"

namespace zsock::verbs {

VerbsEndpoint::VerbsEndpoint(VerbsFabric* fabric, VerbsCq* cq, rdma_cm_id* id,
                             rdma_event_channel* ch, ibv_cq* icq, uint32_t max_inline)
    : Endpoint(fabric, cq), fab_(fabric), cq_(cq), id_(id), ch_(ch), icq_(icq),
      engine_(this, this, Config(fabric, max_inline)), engine_config_inline_(max_inline) {}

VerbsEndpoint::~VerbsEndpoint() {
  Close();
  if (attached_) cq_->Unwatch(ch_->fd);
  cq_->Detach(this, [&] {
    MutexLock lock(&mu_);
    if (id_->qp != nullptr) rdma_destroy_qp(id_);
    if (icq_ != nullptr) ibv_destroy_cq(icq_);
    icq_ = nullptr;
  });
  rdma_destroy_id(id_);
  rdma_destroy_event_channel(ch_);
}

void VerbsEndpoint::Start(const struct Hello& peer, std::string local, std::string remote) {
  {
    MutexLock lock(&mu_);
    engine_.Start(peer, remote);
    native_atomics_ = fab_->atomics_native() && (peer.flags & kHelloAtomics);
    info_.local_address = std::move(local);
    info_.peer_address = std::move(remote);
    info_.peer_on_host = false;
    info_.rdma_read = Support::kNative;
    info_.rdma_write = Support::kNative;
    info_.atomics = native_atomics_ ? Support::kNative : Support::kEmulated;
    info_.notes.push_back(absl::StrCat(
        "verbs RC QP 0x", absl::Hex(id_->qp->qp_num), " on ", fab_->device_name(),
        ", max_inline_data ", engine_config_inline_, ", peer receive credits ",
        (peer.flags & kHelloSrq) ? std::string("unlimited (shared receive queue)")
                                 : absl::StrCat(peer.credits),
        ", peer buffers ", peer.eager_size, " B"));
    if (!native_atomics_) {
      info_.notes.push_back("atomics emulated: one side's HCA lacks IBV_ATOMIC_HCA/GLOB");
    }
  }
  attached_ = true;
  cq_->Watch(ch_->fd);
  cq_->Attach(this);
}

void VerbsEndpoint::Close() {
  EngineOutput first;
  {
    MutexLock lock(&mu_);
    if (engine_.closed()) return;
    engine_.QueueClose(&first);
  }
  Deliver(std::move(first));
  const int64_t deadline = absl::GetCurrentTimeNanos() + 1000000000;
  for (;;) {
    EngineOutput out;
    bool idle;
    {
      MutexLock lock(&mu_);
      engine_.Progress(&out);
      idle = engine_.Idle();
    }
    Deliver(std::move(out));
    if (idle || absl::GetCurrentTimeNanos() > deadline) break;
    sched_yield();
  }
  rdma_disconnect(id_);
  EngineOutput out;
  {
    MutexLock lock(&mu_);
    engine_.Fail(MakeError(absl::StatusCode::kCancelled, ECANCELED, "the endpoint was closed"),
                 /*closed=*/true, &out);
  }
  Deliver(std::move(out));
}

EngineConfig VerbsEndpoint::Config(VerbsFabric* f, uint32_t max_inline) {
  EngineConfig c;
  c.sq_depth = f->settings().sq_depth;
  c.recv_depth = f->settings().recv_depth;
  c.eager_size = f->settings().eager_size;
  c.max_inline = max_inline;
  c.max_msg_sz = f->max_msg_sz();
  c.srq = f->srq() != nullptr;
  c.srq_slot_size = f->srq_slab().slot_size();
  return c;
}

}  // namespace zsock::verbs
