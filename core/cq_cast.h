// The provider's own CQ behind a CompletionQueue* an application passed.
//
// Endpoints report to their provider's CQ type; a CQ created by another
// fabric (or another provider) is an application error that must be
// refused with a clear message, never a bad cast.
#ifndef ZSOCK_CORE_CQ_CAST_H_
#define ZSOCK_CORE_CQ_CAST_H_

#include <cerrno>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/provider.h"
#include "core/status.h"

namespace zsock {

// `cq` as a ProviderCq of `provider`'s fabric `owner`. When ProviderCq has
// fabric(), it must be `owner` (a CQ of another fabric of the same provider
// is refused too); pass owner = nullptr to accept any fabric's.
template <typename ProviderCq, typename FabricT = void>
absl::StatusOr<ProviderCq*> CqOf(CompletionQueue* cq, absl::string_view provider,
                                 const FabricT* owner = nullptr) {
  auto* p = dynamic_cast<ProviderCq*>(cq);
  bool ours = p != nullptr;
  if constexpr (requires(ProviderCq* q) { q->fabric(); }) {
    if (ours && owner != nullptr) ours = static_cast<const void*>(p->fabric()) == owner;
  }
  if (!ours) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("the completion queue does not belong to ",
                                  owner != nullptr ? "this " : "a ", provider, " fabric"),
                     "create the CQ with the same fabric as the endpoint");
  }
  return p;
}

}  // namespace zsock

#endif  // ZSOCK_CORE_CQ_CAST_H_
