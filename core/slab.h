// Slab: a pool of fixed-size slots in one zeroed allocation, registered
// with the fabric once as a whole and addressed by index: a provider's
// send slots, receive buffers or shared receive queue, whose work requests
// name a slot by its index and its bytes by the one registration.
//
// The slots also form a pool: every slot starts free, Take hands out the
// free ones in FIFO order and Put returns one. A slab whose slots are all
// permanently in use (receive buffers, each always posted) never takes.
//
// Generic over the provider: registration is the caller's function, and
// the slab keeps the MemoryRegion it returns. Not thread-safe.
#ifndef ZSOCK_CORE_SLAB_H_
#define ZSOCK_CORE_SLAB_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/provider.h"

namespace zsock {

class Slab {
 public:
  // Registers [addr, addr + len) and returns the registration.
  using RegisterFn =
      absl::FunctionRef<absl::StatusOr<std::unique_ptr<MemoryRegion>>(void* addr, size_t len)>;

  Slab() = default;
  Slab(const Slab&) = delete;
  Slab& operator=(const Slab&) = delete;

  // Allocates `count` zeroed slots of `slot_size` bytes and registers them
  // through `reg`; every slot is free. On error the slab holds no
  // registration. Call once.
  absl::Status Init(size_t slot_size, size_t count, RegisterFn reg) {
    slot_size_ = slot_size;
    count_ = count;
    mem_.assign(slot_size * count, 0);
    auto mr = reg(mem_.data(), mem_.size());
    if (!mr.ok()) return mr.status();
    mr_ = std::move(*mr);
    for (size_t i = 0; i < count; ++i) free_.push_back(i);
    return absl::OkStatus();
  }

  uint8_t* slot(size_t i) { return mem_.data() + i * slot_size_; }
  const uint8_t* slot(size_t i) const { return mem_.data() + i * slot_size_; }
  size_t slot_size() const { return slot_size_; }
  size_t count() const { return count_; }
  // The registration of the whole slab (nullptr before Init).
  MemoryRegion* mr() const { return mr_.get(); }

  // Drops the registration now (before what it was made with goes away);
  // the memory stays until the slab is destroyed.
  void Deregister() { mr_.reset(); }

  // The pool.
  bool has_free() const { return !free_.empty(); }
  // The free slot that has been free longest. Requires has_free().
  size_t Take() {
    const size_t i = free_.front();
    free_.pop_front();
    return i;
  }
  // Returns slot `i` (taken before) to the pool.
  void Put(size_t i) { free_.push_back(i); }

 private:
  std::vector<uint8_t> mem_;
  std::unique_ptr<MemoryRegion> mr_;
  size_t slot_size_ = 0;
  size_t count_ = 0;
  std::deque<size_t> free_;
};

}  // namespace zsock

#endif  // ZSOCK_CORE_SLAB_H_
