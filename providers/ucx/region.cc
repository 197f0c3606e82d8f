// Registrations and the key tables: the fabric's InitTable, RegisterMemory,
// AllocateRegistered and AccessLocal, and UcxRegion.
#include "providers/ucx/region.h"

#include <sched.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/keyslot.h"
#include "core/log.h"
#include "core/status.h"
#include "providers/ucx/fabric.h"
#include "providers/ucx/ucs_error.h"

namespace zsock::ucx {

UcxRegion::~UcxRegion() {
  Revoke();
  if (memh_ != nullptr) fabric_->UnmapMemory(memh_);  // frees allocated memory
  fabric_->local_keys().Remove(key_);
}

RemoteKey UcxRegion::remote_key() const {
  RemoteKey key;
  key.addr = reinterpret_cast<uint64_t>(addr());
  key.length = length();
  key.access = access();
  EncodeBlob(flags_, key_.slot, key_.gen, &key);
  return key;
}

void UcxRegion::Revoke() noexcept {
  // The private generation decides: peers may write the shared one.
  LocalKeyTable& local = fabric_->local_keys();
  if (!local.BeginRevoke(key_)) return;  // already revoked
  entry_->gen.store(key_.gen + 1, std::memory_order_seq_cst);
  local.AwaitAccesses(key_);
  // Peers inside a native access: wait at most one second.
  const int64_t deadline = absl::GetCurrentTimeNanos() + 1000000000;
  while (entry_->active.load(std::memory_order_seq_cst) != 0 &&
         absl::GetCurrentTimeNanos() < deadline) {
    sched_yield();
  }
}

void UcxFabric::MapSharedTable(size_t bytes) {
  ucp_mem_map_params_t p{};
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  p.length = bytes;
  p.flags = UCP_MEM_MAP_ALLOCATE;
  if (ucp_mem_map(primary_ctx_->handle(), &p, &table_memh_) != UCS_OK) {
    table_memh_ = nullptr;
    return;
  }
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
  ucp_mem_query(table_memh_, &attr);
  table_ = static_cast<KeySlot*>(attr.address);
  void* buf = nullptr;
  size_t len = 0;
  if (ucp_rkey_pack(primary_ctx_->handle(), table_memh_, &buf, &len) == UCS_OK) {
    table_rkey_.assign(static_cast<const char*>(buf), len);
    ucp_rkey_buffer_release(buf);
    native_ = true;
  }
}

absl::Status UcxFabric::InitTable() {
  const size_t slots = settings_.max_registrations;
  const size_t bytes = slots * sizeof(KeySlot);
  if (primary_ctx_->rma()) {
    MutexLock lock(&ctx_mu_);
    MapSharedTable(bytes);
  }
  if (table_ == nullptr) {
    void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
      return ErrnoError(errno, "allocating the ucx key table failed",
                        "lower max_registrations or raise memory limits");
    }
    table_ = static_cast<KeySlot*>(mem);
    table_map_len_ = bytes;
  }
  for (size_t i = 0; i < slots; ++i) {
    new (&table_[i]) KeySlot{};
  }
  local_ = std::make_unique<LocalKeyTable>(static_cast<uint32_t>(slots));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<UcxRegion>> UcxFabric::RegisterSlot(
    void* addr, size_t len, uint32_t access, uint16_t flags, const std::string& rkey,
    ucp_mem_h memh) {
  if (addr == nullptr || len == 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     "cannot register an empty or null range", "register at least one byte");
  }
  std::optional<LocalKeyTable::Key> key =
      local_->Add(reinterpret_cast<uint64_t>(addr), len, access);
  if (!key.has_value()) {
    return MakeError(absl::StatusCode::kResourceExhausted, ENOSPC,
                     absl::StrCat("all ", local_->capacity(), " ucx registrations are in use"),
                     "release registrations, or raise the fabric option max_registrations "
                     "(the registration cache evicts unused ones)");
  }
  KeySlot* e = &table_[key->slot];
  e->addr = reinterpret_cast<uint64_t>(addr);
  e->len = len;
  e->access = access;
  e->flags = flags;
  e->rkey_len = static_cast<uint16_t>(rkey.size());
  if (!rkey.empty()) std::memcpy(e->rkey, rkey.data(), rkey.size());
  e->gen.store(key->gen, std::memory_order_seq_cst);
  return std::make_unique<UcxRegion>(this, addr, len, access, *key, static_cast<uint8_t>(flags), e,
                                     memh);
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> UcxFabric::RegisterMemory(void* addr, size_t len,
                                                                        uint32_t access) {
  // Ordinary memory needs no UCX registration: its one-sided operations go
  // through core emulation, which the target checks against this table.
  auto r = RegisterSlot(addr, len, access, 0, {}, nullptr);
  if (!r.ok()) return r.status();
  return std::unique_ptr<MemoryRegion>(std::move(*r));
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> UcxFabric::AllocateRegistered(size_t len,
                                                                           uint32_t access) {
  if (!native_) return Fabric::AllocateRegistered(len, access);
  if (len == 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     "cannot allocate an empty registered region", "ask for at least one byte");
  }
  ucp_mem_h memh = nullptr;
  std::string rkey;
  ucp_mem_attr_t attr{};
  {
    MutexLock lock(&ctx_mu_);
    ucp_mem_map_params_t p{};
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    p.length = len;
    p.flags = UCP_MEM_MAP_ALLOCATE;
    ucs_status_t st = ucp_mem_map(primary_ctx_->handle(), &p, &memh);
    if (st != UCS_OK) {
      return UcsError(st, absl::StrCat("UCX could not allocate ", len, " registered bytes"),
                      "check free space in /dev/shm and memory limits");
    }
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    ucp_mem_query(memh, &attr);
    void* buf = nullptr;
    size_t buf_len = 0;
    if (ucp_rkey_pack(primary_ctx_->handle(), memh, &buf, &buf_len) == UCS_OK) {
      if (buf_len <= sizeof(KeySlot::rkey)) {
        rkey.assign(static_cast<const char*>(buf), buf_len);
      } else {
        ZS_LOG(kInfo, "UCX rkey of %zu bytes does not fit the key table (%zu): remote "
               "operations on this region are emulated", buf_len, sizeof(KeySlot::rkey));
      }
      ucp_rkey_buffer_release(buf);
    }
  }
  std::memset(attr.address, 0, len);  // like the default (fresh anonymous pages)
  auto r = RegisterSlot(attr.address, len, access, rkey.empty() ? 0 : kSlotNative, rkey, memh);
  if (!r.ok()) {
    UnmapMemory(memh);
    return r.status();
  }
  return std::unique_ptr<MemoryRegion>(std::move(*r));
}

absl::Status UcxFabric::AccessLocal(const RemoteKey& rkey, uint64_t addr, size_t len,
                                    uint32_t access, absl::FunctionRef<void(void*)> fn) {
  BlobKey key;
  if (!DecodeBlob(rkey, &key)) return RemoteKeyError("the key is malformed", addr, len);
  return local_->Access({key.slot, key.gen}, addr, len, access, fn);
}

}  // namespace zsock::ucx
