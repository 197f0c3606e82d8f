// The local registration table behind Fabric::AccessLocal
// (local_registrations.h).
#include "providers/unet/local_registrations.h"

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "core/keyslot.h"
#include "core/status.h"

namespace zsock::unet {

LocalRegistrations::LocalRegistrations(uint32_t slots)
    : size_(slots), slots_(std::make_unique<PrivateSlot[]>(slots)) {
  for (uint32_t i = slots; i > 0; --i) free_.push_back(i - 1);
}

absl::StatusOr<uint32_t> LocalRegistrations::Take() {
  MutexLock lock(&mu_);
  if (free_.empty()) {
    return MakeError(absl::StatusCode::kResourceExhausted, ENOSPC,
                     absl::StrCat("all ", size_, " unet registrations are in use"),
                     "release registrations, or raise unet_max_registrations "
                     "(the registration cache evicts unused ones)");
  }
  uint32_t slot = free_.back();
  free_.pop_back();
  return slot;
}

void LocalRegistrations::Release(uint32_t slot) {
  MutexLock lock(&mu_);
  free_.push_back(slot);
}

uint32_t LocalRegistrations::Activate(uint32_t slot, uint64_t addr, uint64_t len,
                                      uint32_t access) {
  PrivateSlot* own = &slots_[slot];
  own->addr = addr;
  own->len = len;
  own->access = access;
  uint32_t gen = own->gen.load(std::memory_order_relaxed) + 1;  // even -> odd: live
  own->gen.store(gen, std::memory_order_release);
  return gen;
}

absl::Status LocalRegistrations::Access(uint32_t slot, uint32_t gen, uint64_t addr, size_t len,
                                        uint32_t access, absl::FunctionRef<void(void*)> fn) {
  if (slot >= size_ || (gen & 1) == 0) return RemoteKeyError("the key is malformed", addr, len);
  PrivateSlot& p = slots_[slot];
  if (absl::Status st = PinKeySlot(&p, gen, addr, len, access); !st.ok()) return st;
  fn(reinterpret_cast<void*>(addr));
  UnpinKeySlot(&p);
  return absl::OkStatus();
}

}  // namespace zsock::unet
