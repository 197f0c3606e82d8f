// The verbs provider's registrations (see region.h).
#include "providers/verbs/region.h"

#include <cerrno>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "providers/verbs/wire.h"
#include "providers/verbs/work_request.h"

namespace zsock::verbs {

VerbsRegion::VerbsRegion(Registrar* registrar, LocalKeyTable* table, LocalKeyTable::Key key,
                         void* addr, size_t len, uint32_t access, Registrar::Keys keys)
    : MemoryRegion(addr, len, access),
      registrar_(registrar),
      table_(table),
      key_(key),
      handle_(keys.handle),
      lkey_(keys.lkey),
      rkey_(keys.rkey) {}

VerbsRegion::~VerbsRegion() {
  Revoke();
  table_->Remove(key_);
}

RemoteKey VerbsRegion::remote_key() const {
  RemoteKey k;
  k.addr = reinterpret_cast<uint64_t>(addr());
  k.length = length();
  k.access = access();
  k.blob = EncodeKeyBlob({rkey_, key_});
  return k;
}

void VerbsRegion::Revoke() noexcept {
  void* h = handle_.exchange(nullptr);
  if (h == nullptr) return;
  table_->Revoke(key_);
  registrar_->Deregister(h);
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(Registrar* registrar, LocalKeyTable* table,
                                                       void* addr, size_t len, uint32_t access) {
  if (addr == nullptr || len == 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     "cannot register an empty or null range", "register at least one byte");
  }
  std::optional<LocalKeyTable::Key> key =
      table->Add(reinterpret_cast<uint64_t>(addr), len, access);
  if (!key.has_value()) {
    return MakeError(absl::StatusCode::kResourceExhausted, ENOSPC,
                     absl::StrCat("all ", table->capacity(), " verbs registrations are in use"),
                     "release registrations, or raise the verbs option max_registrations "
                     "(the registration cache evicts unused ones)");
  }
  auto keys = registrar->Register(addr, len, AccessToIbv(access));
  if (!keys.ok()) {
    table->Remove(*key);
    return keys.status();
  }
  return std::unique_ptr<MemoryRegion>(
      new VerbsRegion(registrar, table, *key, addr, len, access, *keys));
}

}  // namespace zsock::verbs
