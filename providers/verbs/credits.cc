// The verbs provider's send credits (see credits.h).
#include "providers/verbs/credits.h"

#include <algorithm>
#include <cstdint>

namespace zsock::verbs {

bool Credits::Take() {
  if (available_ == kUnlimited) return true;
  if (available_ < 2) return false;
  --available_;
  return true;
}

bool Credits::TakeForUpdate() {
  if (available_ == kUnlimited || available_ == 0 || to_return_ < 2) return false;
  --available_;
  return true;
}

void Credits::Grant(uint32_t n) {
  if (available_ == kUnlimited) return;
  available_ += n;
}

bool Credits::Returned(uint32_t window) {
  ++to_return_;
  return to_return_ >= std::max<uint32_t>(1, window / 2);
}

uint16_t Credits::TakeReturn() {
  uint16_t n = static_cast<uint16_t>(std::min<uint32_t>(to_return_, UINT16_MAX));
  to_return_ -= n;
  return n;
}

}  // namespace zsock::verbs
