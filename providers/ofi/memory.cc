// Registration (OfiFabric::RegisterMemory), the remote key blob, emulated
// access checks (OfiFabric::AccessLocal) and the initiator's key decoding.
#include "providers/ofi/memory.h"

#include <rdma/fi_errno.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/keyslot.h"
#include "core/status.h"
#include "providers/ofi/domain_lock.h"
#include "providers/ofi/errors.h"
#include "providers/ofi/fabric.h"

namespace zsock::ofi {
namespace {

// The fi access flags for zsock access bits `access`.
uint64_t FiAccess(uint32_t access, bool rma_native) {
  uint64_t fi_access = 0;
  if (access & kLocalRead) fi_access |= FI_SEND | FI_WRITE;
  if (access & kLocalWrite) fi_access |= FI_RECV | FI_READ;
  if (access & kRemoteRead) fi_access |= FI_REMOTE_READ;
  if (access & kRemoteWrite) fi_access |= FI_REMOTE_WRITE;
  if (access & kRemoteAtomic) fi_access |= FI_REMOTE_READ | FI_REMOTE_WRITE;
  // Emulated one-sided access never reaches the provider's RMA path.
  if (!rma_native) fi_access &= ~(FI_REMOTE_READ | FI_REMOTE_WRITE);
  fi_access |= FI_SEND | FI_RECV | FI_READ | FI_WRITE;  // usable as a local buffer too
  return fi_access;
}

// The remote key blob of `mr` (see memory.h); `rc` gets fi_mr_raw_attr's
// failure.
std::vector<uint8_t> KeyBlob(fid_mr* mr, LocalKeyTable::Key table_key, bool virt_addr,
                             bool raw_keys, int* rc) {
  std::vector<uint8_t> blob;
  uint8_t flags = virt_addr ? kBlobVirt : 0;
  blob.resize(kBlobHeader);
  LocalKeyTable::Encode(table_key, blob.data() + 1);
  *rc = 0;
  if (raw_keys) {
    size_t key_size = RemoteKey::kMaxBlob - kBlobHeader;
    std::vector<uint8_t> raw(key_size);
    uint64_t base = 0;
    *rc = fi_mr_raw_attr(mr, &base, raw.data(), &key_size, 0);
    if (*rc != 0) return {};
    blob[0] = flags | kBlobRaw;
    blob.insert(blob.end(), raw.begin(), raw.begin() + key_size);
  } else {
    uint64_t key = fi_mr_key(mr);
    blob[0] = flags;
    blob.resize(kBlobHeader + 8);
    std::memcpy(blob.data() + kBlobHeader, &key, 8);
  }
  return blob;
}

absl::Status MalformedKey() {
  return MakeError(absl::StatusCode::kInvalidArgument, EINVAL, "malformed ofi remote key",
                   "pass the key the peer's registration produced");
}

}  // namespace

RemoteKey OfiRegion::remote_key() const {
  RemoteKey k;
  k.addr = reinterpret_cast<uint64_t>(addr());
  k.length = length();
  k.access = access();
  k.blob = blob_;
  return k;
}

void OfiRegion::Revoke() noexcept {
  fabric_->keys().Revoke(key_);
  fid_mr* mr = mr_.exchange(nullptr);
  if (mr != nullptr) fabric_->dom_mu().CloseMr(mr);
}

OfiRegion::~OfiRegion() {
  Revoke();
  fabric_->keys().Remove(key_);
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> OfiFabric::RegisterMemory(void* addr, size_t len,
                                                                        uint32_t access) {
  if (addr == nullptr || len == 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     "cannot register an empty or null range", "register at least one byte");
  }
  std::optional<LocalKeyTable::Key> key = keys_.Add(reinterpret_cast<uint64_t>(addr), len, access);
  if (!key.has_value()) {
    return MakeError(absl::StatusCode::kResourceExhausted, ENOSPC,
                     absl::StrCat("all ", keys_.capacity(), " ofi registrations are in use"),
                     "release registrations (the registration cache evicts unused ones)");
  }
  const uint64_t fi_access = FiAccess(access, rma_native_);
  fid_mr* mr = nullptr;
  uint64_t requested_key = next_key_.fetch_add(1);  // ignored with FI_MR_PROV_KEY
  int rc;
  {
    DomLock lock(&dom_mu_);
    rc = fi_mr_reg(domain_, addr, len, fi_access, 0, requested_key, 0, &mr, nullptr);
  }
  if (rc != 0) {
    keys_.Remove(*key);
    return FiError(rc, absl::StrCat("fi_mr_reg of ", len, " bytes"),
                   "check the locked-memory limit (ulimit -l) and the provider's MR limits");
  }
  std::vector<uint8_t> blob = KeyBlob(mr, *key, virt_addr(), raw_keys(), &rc);
  if (rc != 0) {
    keys_.Remove(*key);
    dom_mu_.CloseMr(mr);
    return FiError(rc, "fi_mr_raw_attr", "the provider's raw keys exceed 119 bytes");
  }
  return std::unique_ptr<MemoryRegion>(
      new OfiRegion(this, addr, len, access, mr, std::move(blob), *key));
}

// Emulated operations arrive with our own key: its table key names our
// private record, which decides range, rights and liveness.
absl::Status OfiFabric::AccessLocal(const RemoteKey& rkey, uint64_t addr, size_t len,
                                    uint32_t access, absl::FunctionRef<void(void*)> fn) {
  if (rkey.blob.size() < kBlobHeader) {
    return RemoteKeyError("the key is malformed (shorter than an ofi key's header)", addr, len);
  }
  return keys_.Access(LocalKeyTable::Decode(rkey.blob.data() + 1), addr, len, access, fn);
}

absl::Status DecodeRemoteKey(fid_domain* domain, RawKeyMap* raw_keys, const RemoteKey& rkey,
                             uint64_t remote_addr, size_t len, uint64_t* key, uint64_t* addr) {
  if (rkey.blob.size() < kBlobHeader || remote_addr < rkey.addr || len > rkey.length ||
      remote_addr - rkey.addr > rkey.length - len) {
    return MakeError(absl::StatusCode::kOutOfRange, EFAULT,
                     absl::StrCat("remote range [0x", absl::Hex(remote_addr), ", +", len,
                                  ") is outside the remote key's region or the key is malformed"),
                     "access only inside the registered region the key names");
  }
  uint8_t flags = rkey.blob[0];
  *addr = (flags & kBlobVirt) ? remote_addr : remote_addr - rkey.addr;
  if (rkey.blob.size() <= kBlobHeader) return MalformedKey();
  if (flags & kBlobRaw) {
    std::string raw(rkey.blob.begin() + kBlobHeader, rkey.blob.end());
    auto it = raw_keys->find(raw);
    if (it == raw_keys->end()) {
      uint64_t mapped = 0;
      int rc = fi_mr_map_raw(domain, rkey.addr, reinterpret_cast<uint8_t*>(raw.data()), raw.size(),
                             &mapped, 0);
      if (rc != 0) return FiError(rc, "fi_mr_map_raw", "pass the key the peer's registration produced");
      it = raw_keys->emplace(raw, mapped).first;
    }
    *key = it->second;
  } else {
    if (rkey.blob.size() != kBlobHeader + 8) return MalformedKey();
    std::memcpy(key, rkey.blob.data() + kBlobHeader, 8);
  }
  return absl::OkStatus();
}

}  // namespace zsock::ofi
