#include "core/local_keys.h"

#include <sched.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/keyslot.h"

namespace zsock {

void LocalKeyTable::Encode(Key key, uint8_t out[kEncodedSize]) {
  std::memcpy(out, &key.slot, 4);
  std::memcpy(out + 4, &key.gen, 4);
}

LocalKeyTable::Key LocalKeyTable::Decode(const uint8_t in[kEncodedSize]) {
  Key key;
  std::memcpy(&key.slot, in, 4);
  std::memcpy(&key.gen, in + 4, 4);
  return key;
}

LocalKeyTable::LocalKeyTable(uint32_t capacity)
    : capacity_(std::clamp<uint32_t>(capacity, 1, 1u << 24)),
      chunks_(std::make_unique<std::atomic<Slot*>[]>((capacity_ + kChunkSlots - 1) / kChunkSlots)) {}

LocalKeyTable::~LocalKeyTable() {
  for (uint32_t c = 0; c * kChunkSlots < capacity_; ++c) {
    delete[] chunks_[c].load(std::memory_order_relaxed);
  }
}

LocalKeyTable::Slot* LocalKeyTable::At(uint32_t slot) const {
  if (slot >= capacity_) return nullptr;
  Slot* chunk = chunks_[slot / kChunkSlots].load(std::memory_order_acquire);
  return chunk == nullptr ? nullptr : &chunk[slot % kChunkSlots];
}

std::optional<LocalKeyTable::Key> LocalKeyTable::Add(uint64_t addr, uint64_t len,
                                                     uint32_t access) {
  uint32_t slot;
  {
    MutexLock lock(&mu_);
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else if (used_ < capacity_) {
      slot = used_++;
      auto& chunk = chunks_[slot / kChunkSlots];
      if (chunk.load(std::memory_order_relaxed) == nullptr) {
        chunk.store(new Slot[kChunkSlots], std::memory_order_release);
      }
    } else {
      return std::nullopt;
    }
  }
  // The slot is ours alone until its generation turns odd.
  Slot* s = At(slot);
  s->addr = addr;
  s->len = len;
  s->access = access;
  uint32_t gen = s->gen.load(std::memory_order_relaxed) + 1;
  if ((gen & 1) == 0) ++gen;
  s->gen.store(gen, std::memory_order_seq_cst);
  return Key{slot, gen};
}

bool LocalKeyTable::BeginRevoke(Key key) noexcept {
  Slot* s = At(key.slot);
  if (s == nullptr || (key.gen & 1) == 0) return false;
  uint32_t expected = key.gen;
  // seq_cst pairs with PinKeySlot: the revoker makes gen even, then reads
  // active; an accessor counts itself, then reads gen. One sees the other.
  return s->gen.compare_exchange_strong(expected, key.gen + 1, std::memory_order_seq_cst);
}

void LocalKeyTable::AwaitAccesses(Key key) noexcept {
  // Accesses are short copies by this process's own threads.
  if (Slot* s = At(key.slot); s != nullptr) {
    while (s->active.load(std::memory_order_seq_cst) != 0) sched_yield();
  }
}

bool LocalKeyTable::Revoke(Key key) noexcept {
  if (!BeginRevoke(key)) return false;
  AwaitAccesses(key);
  return true;
}

void LocalKeyTable::Remove(Key key) {
  Slot* s = At(key.slot);
  if (s == nullptr || (key.gen & 1) == 0) return;
  Revoke(key);
  // A slot already reused under a later generation is not `key`'s to free.
  if (s->gen.load(std::memory_order_seq_cst) != key.gen + 1) return;
  MutexLock lock(&mu_);
  free_.push_back(key.slot);
}

absl::Status LocalKeyTable::Access(Key key, uint64_t addr, size_t len, uint32_t access,
                                   absl::FunctionRef<void(void*)> fn) {
  Slot* s = At(key.slot);
  if (s == nullptr || (key.gen & 1) == 0) {
    return RemoteKeyError("the key is malformed", addr, len);
  }
  if (absl::Status st = PinKeySlot(s, key.gen, addr, len, access); !st.ok()) return st;
  fn(reinterpret_cast<void*>(addr));
  UnpinKeySlot(s);
  return absl::OkStatus();
}

}  // namespace zsock
