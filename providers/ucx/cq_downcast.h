// The ucx CQ behind a CompletionQueue* an application passes to Connect or
// Accept, checked to belong to the fabric. Every provider writes this
// downcast; it is kept apart here so that one shared core helper can
// replace it.
#ifndef ZSOCK_PROVIDERS_UCX_CQ_DOWNCAST_H_
#define ZSOCK_PROVIDERS_UCX_CQ_DOWNCAST_H_

#include <cerrno>

#include "absl/status/statusor.h"
#include "core/provider.h"
#include "core/status.h"
#include "providers/ucx/cq.h"

namespace zsock::ucx {

// `cq` as a UcxCq of `fabric`; InvalidArgument if it is not one.
inline absl::StatusOr<UcxCq*> UcxCqOf(CompletionQueue* cq, const UcxFabric* fabric) {
  auto* ucq = dynamic_cast<UcxCq*>(cq);
  if (ucq == nullptr || ucq->fabric() != fabric) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     "the completion queue does not belong to this ucx fabric",
                     "create the CQ with the same fabric as the endpoint");
  }
  return ucq;
}

}  // namespace zsock::ucx

#endif  // ZSOCK_PROVIDERS_UCX_CQ_DOWNCAST_H_
