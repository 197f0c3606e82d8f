// The CQ downcast: the unet CQ behind the CompletionQueue an endpoint is
// to report to, refused when another fabric created it.
//
// Kept apart because every provider writes this check; it is meant to be
// replaced by a shared core helper.
#ifndef ZSOCK_PROVIDERS_UNET_CQ_DOWNCAST_H_
#define ZSOCK_PROVIDERS_UNET_CQ_DOWNCAST_H_

#include <cerrno>

#include "absl/status/statusor.h"
#include "core/provider.h"
#include "core/status.h"
#include "providers/unet/cq.h"

namespace zsock::unet {

inline absl::StatusOr<UnetCq*> AsUnetCq(CompletionQueue* cq) {
  auto* ucq = dynamic_cast<UnetCq*>(cq);
  if (ucq == nullptr) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     "the completion queue does not belong to a unet fabric",
                     "create the CQ with the same fabric as the endpoint");
  }
  return ucq;
}

}  // namespace zsock::unet

#endif  // ZSOCK_PROVIDERS_UNET_CQ_DOWNCAST_H_
