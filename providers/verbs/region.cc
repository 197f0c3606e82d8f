// The verbs provider's registrations (see region.h).
#include "providers/verbs/region.h"

#include <cerrno>

#include "core/status.h"
#include "providers/verbs/wire.h"
#include "providers/verbs/work_request.h"

namespace zsock::verbs {

VerbsRegion::VerbsRegion(Registrar* registrar, RegTable* table, void* addr, size_t len,
                         uint32_t access, Registrar::Keys keys)
    : MemoryRegion(addr, len, access),
      registrar_(registrar),
      table_(table),
      handle_(keys.handle),
      lkey_(keys.lkey),
      rkey_(keys.rkey) {
  entry_ = table_->Add(rkey_, reinterpret_cast<uint64_t>(addr), len, access);
}

VerbsRegion::~VerbsRegion() {
  Revoke();
  table_->Remove(rkey_, entry_.get());
}

RemoteKey VerbsRegion::remote_key() const {
  RemoteKey k;
  k.addr = reinterpret_cast<uint64_t>(addr());
  k.length = length();
  k.access = access();
  k.blob = EncodeKeyBlob(rkey_);
  return k;
}

void VerbsRegion::Revoke() noexcept {
  void* h = handle_.exchange(nullptr);
  if (h == nullptr) return;
  RegTable::Revoke(entry_.get());
  registrar_->Deregister(h);
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(Registrar* registrar, RegTable* table,
                                                       void* addr, size_t len, uint32_t access) {
  if (addr == nullptr || len == 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     "cannot register an empty or null range", "register at least one byte");
  }
  auto keys = registrar->Register(addr, len, AccessToIbv(access));
  if (!keys.ok()) return keys.status();
  return std::unique_ptr<MemoryRegion>(new VerbsRegion(registrar, table, addr, len, access, *keys));
}

}  // namespace zsock::verbs
