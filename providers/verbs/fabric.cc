// The verbs fabric's registrations, completion queues, endpoints and hello
// (see fabric.h).
#include "providers/verbs/fabric.h"

#include <sys/epoll.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/cq_cast.h"
#include "core/fd.h"
#include "core/status.h"
#include "providers/verbs/cm.h"
#include "providers/verbs/cq.h"
#include "providers/verbs/endpoint.h"

namespace zsock::verbs {

VerbsFabric::~VerbsFabric() {
  ReleaseCache();
  srq_slab_.Deregister();
  if (srq_) ibv_destroy_srq(srq_);
  if (pd_) ibv_dealloc_pd(pd_);
  if (devices_) rdma_free_devices(devices_);
}

absl::StatusOr<std::unique_ptr<Fabric>> VerbsFabric::Open(const FabricSpec& spec) {
  auto f = std::unique_ptr<VerbsFabric>(new VerbsFabric());
  if (auto st = f->Setup(spec); !st.ok()) return st;
  return std::unique_ptr<Fabric>(std::move(f));
}

absl::StatusOr<std::unique_ptr<CompletionQueue>> VerbsFabric::CreateCq() {
  ibv_comp_channel* ch = ibv_create_comp_channel(ctx_);
  if (ch == nullptr) return VerbsErrno(errno, "ibv_create_comp_channel", "raise the fd limit");
  Fd ep(::epoll_create1(EPOLL_CLOEXEC));
  if (!ep) {
    int err = errno;
    ibv_destroy_comp_channel(ch);
    return VerbsErrno(err, "epoll_create1", "raise the fd limit (ulimit -n)");
  }
  return std::unique_ptr<CompletionQueue>(new VerbsCq(this, ch, std::move(ep)));
}

std::string VerbsFabric::Hello() const {
  struct Hello h;
  h.flags = static_cast<uint8_t>((srq_ ? kHelloSrq : 0) | (atomics_native_ ? kHelloAtomics : 0));
  h.credits = srq_ ? 0 : static_cast<uint32_t>(settings_.recv_depth);
  h.eager_size = static_cast<uint32_t>(settings_.eager_size);
  h.max_inline = static_cast<uint32_t>(settings_.inline_size);
  h.fabric_id = id_;
  return EncodeHello(h);
}

// Creates the CQ and QP for `id`, prepares the endpoint's buffers.
absl::StatusOr<std::unique_ptr<VerbsEndpoint>> VerbsFabric::MakeEndpoint(rdma_cm_id* id,
                                                                         rdma_event_channel* ch,
                                                                         CompletionQueue* cq) {
  auto of = CqOf<VerbsCq>(cq, "verbs", this);
  if (!of.ok()) return of.status();
  VerbsCq* vcq = *of;
  if (id->verbs != ctx_) {
    return MakeError(absl::StatusCode::kInvalidArgument, EXDEV,
                     absl::StrCat("the address is reached through RDMA device ",
                                  id->verbs ? ibv_get_device_name(id->verbs->device) : "?",
                                  ", not this fabric's ", device_name_),
                     absl::StrCat("open the fabric as verbs:",
                                  id->verbs ? ibv_get_device_name(id->verbs->device) : "DEVICE",
                                  " or use an address routed through ", device_name_));
  }
  const int depth = settings_.cq_depth != 0 ? settings_.cq_depth
                                            : settings_.sq_depth + settings_.recv_depth + 16;
  ibv_cq* icq = ibv_create_cq(ctx_, std::min(depth, dev_attr_.max_cqe), nullptr, vcq->channel(), 0);
  if (icq == nullptr) return VerbsErrno(errno, "ibv_create_cq", "lower cq_depth");
  ibv_qp_init_attr qa{};
  qa.send_cq = icq;
  qa.recv_cq = icq;
  qa.srq = srq_;
  qa.qp_type = IBV_QPT_RC;
  qa.sq_sig_all = 0;
  qa.cap.max_send_wr = static_cast<uint32_t>(settings_.sq_depth);
  qa.cap.max_recv_wr = srq_ ? 0 : static_cast<uint32_t>(settings_.recv_depth + 1);
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  qa.cap.max_inline_data = static_cast<uint32_t>(settings_.inline_size);
  if (rdma_create_qp(id, pd_, &qa) != 0) {
    // Some devices refuse large inline sizes: retry without inline data.
    qa.cap.max_inline_data = 0;
    if (rdma_create_qp(id, pd_, &qa) != 0) {
      int err = errno;
      ibv_destroy_cq(icq);
      return VerbsErrno(err, "rdma_create_qp", "lower sq_depth/recv_depth or check `ulimit -l`");
    }
  }
  auto ep = std::make_unique<VerbsEndpoint>(this, vcq, id, ch, icq, qa.cap.max_inline_data);
  if (auto st = ep->Prepare(); !st.ok()) return st;
  return ep;
}

}  // namespace zsock::verbs
