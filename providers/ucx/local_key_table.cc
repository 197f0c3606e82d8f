// The private registration table behind Fabric::AccessLocal.
#include "providers/ucx/local_key_table.h"

#include "core/keyslot.h"

namespace zsock::ucx {

void LocalKeyTable::Init(size_t slots) {
  slots_ = slots;
  own_ = std::make_unique<PrivateSlot[]>(slots_);
  MutexLock lock(&mu_);
  for (size_t i = slots_; i > 0; --i) free_.push_back(static_cast<uint32_t>(i - 1));
}

std::optional<uint32_t> LocalKeyTable::Take() {
  MutexLock lock(&mu_);
  if (free_.empty()) return std::nullopt;
  uint32_t slot = free_.back();
  free_.pop_back();
  return slot;
}

void LocalKeyTable::Give(uint32_t slot) {
  MutexLock lock(&mu_);
  free_.push_back(slot);
}

uint32_t LocalKeyTable::Publish(uint32_t slot, uint64_t addr, uint64_t len, uint32_t access) {
  PrivateSlot* own = &own_[slot];
  own->addr = addr;
  own->len = len;
  own->access = access;
  uint32_t gen = own->gen.load(std::memory_order_relaxed) + 1;  // even -> odd: live
  if ((gen & 1) == 0) ++gen;
  own->gen.store(gen, std::memory_order_seq_cst);
  return gen;
}

absl::Status LocalKeyTable::Access(uint32_t slot, uint32_t gen, uint64_t addr, size_t len,
                                   uint32_t access, absl::FunctionRef<void(void*)> fn) {
  if (slot >= slots_ || (gen & 1) == 0) {
    return RemoteKeyError("the key is malformed", addr, len);
  }
  PrivateSlot& p = own_[slot];
  if (absl::Status st = PinKeySlot(&p, gen, addr, len, access); !st.ok()) return st;
  fn(reinterpret_cast<void*>(addr));
  UnpinKeySlot(&p);
  return absl::OkStatus();
}

}  // namespace zsock::ucx
