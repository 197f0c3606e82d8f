// The verbs target's registration table (see reg_table.h).
#include "providers/verbs/reg_table.h"

#include <sched.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/mutex.h"
#include "core/status.h"

namespace zsock::verbs {

std::shared_ptr<RegTable::Entry> RegTable::Add(uint32_t rkey, uint64_t addr, uint64_t len,
                                               uint32_t access) {
  auto e = std::make_shared<Entry>();
  e->addr = addr;
  e->len = len;
  e->access = access;
  MutexLock lock(&mu_);
  by_rkey_[rkey] = e;
  return e;
}

void RegTable::Remove(uint32_t rkey, const Entry* entry) {
  std::shared_ptr<Entry> gone;
  MutexLock lock(&mu_);
  auto it = by_rkey_.find(rkey);
  if (it == by_rkey_.end() || it->second.get() != entry) return;
  gone = std::move(it->second);
  by_rkey_.erase(it);
}

absl::Status RegTable::Access(uint32_t rkey, uint64_t addr, size_t len, uint32_t access,
                              absl::FunctionRef<void(void*)> fn) {
  std::shared_ptr<Entry> e;
  {
    MutexLock lock(&mu_);
    auto it = by_rkey_.find(rkey);
    if (it != by_rkey_.end()) e = it->second;
  }
  if (e != nullptr && addr >= e->addr && len <= e->len && addr - e->addr <= e->len - len &&
      (e->access & access) == access) {
    e->active.fetch_add(1, std::memory_order_seq_cst);
    if (!e->revoked.load(std::memory_order_seq_cst)) {
      fn(reinterpret_cast<void*>(addr));
      e->active.fetch_sub(1, std::memory_order_seq_cst);
      return absl::OkStatus();
    }
    e->active.fetch_sub(1, std::memory_order_seq_cst);
  }
  return MakeError(absl::StatusCode::kPermissionDenied, EACCES,
                   absl::StrCat("remote access to [0x", absl::Hex(addr), ", +", len,
                                ") refused: no live registration with that key covers it with "
                                "the rights asked for"),
                   "use a key from a live registration and stay inside its range and rights");
}

void RegTable::Revoke(Entry* e) noexcept {
  e->revoked.store(true, std::memory_order_seq_cst);
  while (e->active.load(std::memory_order_seq_cst) != 0) sched_yield();
}

}  // namespace zsock::verbs
