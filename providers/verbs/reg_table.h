// RegTable: the target's record of its live registrations, keyed by rkey,
// behind Fabric::AccessLocal (the emulated accesses core performs for a
// peer) and the refusal of keys after Revoke.
//
// Revoke is lock-free (it runs from memory-release hooks) and waits for the
// accesses in progress, so once it returns no access touches the memory.
#ifndef ZSOCK_PROVIDERS_VERBS_REG_TABLE_H_
#define ZSOCK_PROVIDERS_VERBS_REG_TABLE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "core/mutex.h"

namespace zsock::verbs {

class RegTable {
 public:
  struct Entry {
    uint64_t addr = 0;
    uint64_t len = 0;
    uint32_t access = 0;
    std::atomic<bool> revoked{false};
    std::atomic<int> active{0};  // accesses in progress
  };
  std::shared_ptr<Entry> Add(uint32_t rkey, uint64_t addr, uint64_t len, uint32_t access);
  // Removes `entry` (not a newer registration that reused its rkey).
  void Remove(uint32_t rkey, const Entry* entry);
  // Runs fn on addr if a live registration with `rkey` covers the range
  // with the rights; else PermissionDenied without touching memory.
  absl::Status Access(uint32_t rkey, uint64_t addr, size_t len, uint32_t access,
                      absl::FunctionRef<void(void*)> fn);
  // Lock-free (memory-release hooks): refuses the key from now on and waits
  // for accesses in progress.
  static void Revoke(Entry* e) noexcept;

 private:
  Mutex mu_;
  std::map<uint32_t, std::shared_ptr<Entry>> by_rkey_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zsock::verbs

#endif  // ZSOCK_PROVIDERS_VERBS_REG_TABLE_H_
