// AsOfiCq: the OfiCq behind a CompletionQueue a caller passed to Connect or
// Accept, or the error for one that another fabric created.
#ifndef ZSOCK_PROVIDERS_OFI_CQ_CAST_H_
#define ZSOCK_PROVIDERS_OFI_CQ_CAST_H_

#include <cerrno>

#include "absl/status/statusor.h"
#include "core/provider.h"
#include "core/status.h"
#include "providers/ofi/cq.h"

namespace zsock::ofi {

inline absl::StatusOr<OfiCq*> AsOfiCq(CompletionQueue* cq) {
  auto* ocq = dynamic_cast<OfiCq*>(cq);
  if (ocq == nullptr) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     "the completion queue does not belong to an ofi fabric",
                     "create the CQ with the same fabric as the endpoint");
  }
  return ocq;
}

}  // namespace zsock::ofi

#endif  // ZSOCK_PROVIDERS_OFI_CQ_CAST_H_
