// LocalKeyTable: live registrations by serial, checked on every emulated
// access.
#include "providers/ofi/local_keys.h"

#include <sched.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace zsock::ofi {

void RegRecord::Revoke() noexcept {
  if (!revoked.exchange(true, std::memory_order_seq_cst)) {
    while (active.load(std::memory_order_seq_cst) != 0) sched_yield();
  }
}

RegRecord* LocalKeyTable::Add(uint64_t serial, uint64_t addr, uint64_t len, uint32_t access) {
  auto record = std::make_unique<RegRecord>();
  record->addr = addr;
  record->len = len;
  record->access = access;
  RegRecord* rec = record.get();
  MutexLock lock(&mu_);
  regs_[serial] = std::move(record);
  return rec;
}

void LocalKeyTable::Forget(uint64_t serial) {
  MutexLock lock(&mu_);
  regs_.erase(serial);
}

absl::Status LocalKeyTable::Access(uint64_t serial, uint64_t addr, size_t len, uint32_t access,
                                   absl::FunctionRef<void(void*)> fn) {
  MutexLock lock(&mu_);
  auto it = regs_.find(serial);
  if (it == regs_.end()) return RefuseAccess(addr, len, "no live registration has that key");
  RegRecord& r = *it->second;
  r.active.fetch_add(1, std::memory_order_seq_cst);
  absl::Status st;
  if (r.revoked.load(std::memory_order_seq_cst)) {
    st = RefuseAccess(addr, len, "the registration was revoked (its memory was released)");
  } else if (addr < r.addr || len > r.len || addr - r.addr > r.len - len) {
    st = RefuseAccess(addr, len, "the range lies outside the registered region");
  } else if ((r.access & access) != access) {
    st = RefuseAccess(addr, len, "the registration does not grant that access");
  } else {
    fn(reinterpret_cast<void*>(addr));
  }
  r.active.fetch_sub(1, std::memory_order_seq_cst);
  return st;
}

absl::Status RefuseAccess(uint64_t addr, size_t len, absl::string_view why) {
  return MakeError(absl::StatusCode::kPermissionDenied, EACCES,
                   absl::StrCat("remote access to [0x", absl::Hex(addr), ", +", len,
                                ") refused: ", why),
                   "use a key from a live registration and stay inside its range and rights");
}

}  // namespace zsock::ofi
