// The verbs completion queue's progress and arming (see cq.h).
#include "providers/verbs/cq.h"

#include <utility>
#include <vector>

#include "providers/verbs/endpoint.h"

namespace zsock::verbs {

size_t VerbsCq::Progress() {
  MutexLock list_lock(&mu_);
  std::vector<std::pair<VerbsEndpoint*, EngineOutput>> outs;
  size_t n = 0;
  for (VerbsEndpoint* ep : endpoints_) n += ep->Progress(&outs);
  for (auto& [ep, out] : outs) {
    n += out.completions.size();
    ep->Deliver(std::move(out));
  }
  return n;
}

bool VerbsCq::ArmProvider() {
  MutexLock lock(&mu_);
  // Consume the events that woke us, then re-arm and look once more (the
  // ibv_req_notify_cq race: completions that came before the arm).
  DrainEventsLocked();
  bool armed = true;
  for (VerbsEndpoint* ep : endpoints_) armed &= ep->Arm();
  return armed;
}

}  // namespace zsock::verbs
