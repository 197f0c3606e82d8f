// Registry, config-string parsing, RemoteKey encoding, Fabric and Endpoint
// base classes.
#include "core/provider.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/config.h"
#include "core/mutex.h"
#include "core/emulation.h"
#include "core/modules.h"
#include "core/rcache.h"
#include "core/status.h"

namespace zsock {

absl::string_view SupportName(Support s) {
  switch (s) {
    case Support::kNone: return "none";
    case Support::kEmulated: return "emulated";
    case Support::kNative: return "native";
  }
  return "?";
}

absl::string_view OpTypeName(OpType op) {
  switch (op) {
    case OpType::kSend: return "send";
    case OpType::kRecv: return "recv";
    case OpType::kRead: return "read";
    case OpType::kWrite: return "write";
    case OpType::kFetchAdd: return "fetch-add";
    case OpType::kCompareSwap: return "compare-swap";
  }
  return "?";
}

// ---- RemoteKey: version 1 wire form, little-endian ----
//   u8 version(1) | u8 blob_len | u16 reserved | u32 access | u64 addr | u64 length | blob
namespace {
constexpr uint8_t kRkeyVersion = 1;
constexpr size_t kRkeyHeader = 24;
}  // namespace

std::string RemoteKey::Serialize() const {
  std::string out(kRkeyHeader + blob.size(), '\0');
  out[0] = static_cast<char>(kRkeyVersion);
  out[1] = static_cast<char>(blob.size());
  std::memcpy(&out[4], &access, 4);
  std::memcpy(&out[8], &addr, 8);
  std::memcpy(&out[16], &length, 8);
  if (!blob.empty()) std::memcpy(&out[kRkeyHeader], blob.data(), blob.size());
  return out;
}

absl::StatusOr<RemoteKey> RemoteKey::Parse(absl::string_view bytes) {
  if (bytes.size() < kRkeyHeader) {
    return MakeError(absl::StatusCode::kInvalidArgument, 0,
                     absl::StrCat("remote key of ", bytes.size(), " bytes is truncated"),
                     "pass the bytes RemoteKey::Serialize produced, unchanged");
  }
  if (static_cast<uint8_t>(bytes[0]) != kRkeyVersion) {
    return MakeError(absl::StatusCode::kInvalidArgument, 0,
                     absl::StrCat("remote key version ", static_cast<int>(static_cast<uint8_t>(bytes[0])),
                                  " is not supported (this zsock reads version 1)"),
                     "use the same zsock version on both peers");
  }
  size_t blob_len = static_cast<uint8_t>(bytes[1]);
  if (blob_len > kMaxBlob || bytes.size() != kRkeyHeader + blob_len) {
    return MakeError(absl::StatusCode::kInvalidArgument, 0,
                     absl::StrCat("remote key length ", bytes.size(),
                                  " does not match its blob length ", blob_len),
                     "pass the bytes RemoteKey::Serialize produced, unchanged");
  }
  RemoteKey key;
  std::memcpy(&key.access, bytes.data() + 4, 4);
  std::memcpy(&key.addr, bytes.data() + 8, 8);
  std::memcpy(&key.length, bytes.data() + 16, 8);
  if (key.addr + key.length < key.addr) {
    return MakeError(absl::StatusCode::kInvalidArgument, 0,
                     "remote key range wraps around the address space",
                     "pass the bytes RemoteKey::Serialize produced, unchanged");
  }
  key.blob.assign(bytes.begin() + kRkeyHeader, bytes.end());
  return key;
}

// ---- config strings ----

absl::StatusOr<FabricSpec> ParseFabricSpec(absl::string_view config) {
  FabricSpec spec;
  absl::string_view head = config;
  absl::string_view query;
  if (auto q = config.find('?'); q != absl::string_view::npos) {
    head = config.substr(0, q);
    query = config.substr(q + 1);
  }
  if (auto colon = head.find(':'); colon != absl::string_view::npos) {
    spec.provider = std::string(head.substr(0, colon));
    spec.spec = std::string(head.substr(colon + 1));
  } else {
    spec.provider = std::string(head);
  }
  if (spec.provider.empty()) {
    return MakeError(absl::StatusCode::kInvalidArgument, 0,
                     absl::StrCat("fabric config '", config, "' names no provider"),
                     "write provider[:spec][?key=value&...], e.g. unet or ofi:tcp;ofi_rxm");
  }
  if (!query.empty()) {
    for (absl::string_view kv : absl::StrSplit(query, '&')) {
      auto eq = kv.find('=');
      if (eq == absl::string_view::npos || eq == 0) {
        return MakeError(absl::StatusCode::kInvalidArgument, 0,
                         absl::StrCat("fabric config '", config, "': option '", kv,
                                      "' is not key=value"),
                         "write options as ?key=value&key2=value2");
      }
      spec.options[std::string(kv.substr(0, eq))] = std::string(kv.substr(eq + 1));
    }
  }
  return spec;
}

std::string FabricSpec::ToString() const {
  std::string out = provider;
  if (!spec.empty()) absl::StrAppend(&out, ":", spec);
  if (!options.empty()) {
    absl::StrAppend(&out, "?", absl::StrJoin(options, "&", absl::PairFormatter("=")));
  }
  return out;
}

// ---- registry ----

namespace {
struct Registry {
  Mutex mu;
  std::vector<std::unique_ptr<ProviderInfo>> providers ABSL_GUARDED_BY(mu);
};
Registry& GetRegistry() {
  static auto* registry = new Registry;
  return *registry;
}
}  // namespace

bool RegisterProvider(ProviderInfo info) {
  Registry& r = GetRegistry();
  MutexLock lock(&r.mu);
  for (const auto& p : r.providers) {
    if (p->name == info.name) return false;
  }
  r.providers.push_back(std::make_unique<ProviderInfo>(std::move(info)));
  return true;
}

std::vector<const ProviderInfo*> RegisteredProviders() {
  LoadProviderModules();
  return ProvidersRegisteredSoFar();
}

std::vector<const ProviderInfo*> ProvidersRegisteredSoFar() {
  Registry& r = GetRegistry();
  MutexLock lock(&r.mu);
  std::vector<const ProviderInfo*> out;
  for (const auto& p : r.providers) out.push_back(p.get());
  return out;
}

absl::StatusOr<const ProviderInfo*> FindProvider(absl::string_view config, FabricSpec* out) {
  const auto& global = Config::Global();
  if (!global.ok()) return global.status();
  std::string text(config);
  if (text.empty()) text = global->GetString("provider");
  auto spec = ParseFabricSpec(text);
  if (!spec.ok()) return spec.status();
  std::vector<std::string> names;
  for (const ProviderInfo* p : RegisteredProviders()) {
    if (p->name == spec->provider) {
      if (out != nullptr) *out = *std::move(spec);
      return p;
    }
    names.push_back(p->name);
  }
  const ModuleScan& modules = LoadProviderModules();
  const std::string module_name = absl::StrCat("/libzsock-", spec->provider, ".so");
  for (const ProviderModule& m : modules.modules) {
    if (!m.loaded && absl::EndsWith(m.path, module_name)) {
      return MakeError(absl::StatusCode::kUnavailable, 0,
                       absl::StrCat("provider '", spec->provider, "' is in module ", m.path,
                                    ", which failed to load: ", m.error),
                       "install the library the message names (Debian: libfabric1 for ofi, "
                       "libucx0 for ucx, libibverbs1 and librdmacm1 for verbs), or choose "
                       "another provider (zsock_info lists them)");
    }
  }
  std::string where = "built into this binary";
  if (modules.enabled) {
    where = absl::StrCat("built in or found as modules in ", absl::StrJoin(modules.dirs, ":"),
                         " (", modules.dirs_source, ")");
  }
  return MakeError(absl::StatusCode::kNotFound, 0,
                   absl::StrCat("unknown provider '", spec->provider, "' in '", text, "'"),
                   absl::StrCat("use one of the providers ", where, ": ",
                                absl::StrJoin(names, ", "),
                                " (zsock_info lists them with their status)"));
}

absl::StatusOr<std::unique_ptr<Fabric>> Fabric::Open(absl::string_view config) {
  FabricSpec spec;
  auto info = FindProvider(config, &spec);
  if (!info.ok()) return info.status();
  return (*info)->open(spec);
}

Fabric::Fabric() = default;

Fabric::~Fabric() { ReleaseCache(); }

void Fabric::ReleaseCache() {
  std::unique_ptr<RegistrationCache> cache;
  {
    MutexLock lock(&rcache_mu_);
    cache = std::move(rcache_);
  }
}

RegistrationCache& Fabric::rcache() {
  MutexLock lock(&rcache_mu_);
  if (rcache_ == nullptr) {
    RcacheLimits limits;
    if (const auto& config = Config::Global(); config.ok()) {
      limits.max_bytes = static_cast<size_t>(config->GetInt("rcache_max_bytes"));
      limits.max_entries = static_cast<size_t>(config->GetInt("rcache_max_entries"));
    }
    rcache_ = std::make_unique<RegistrationCache>(
        [this](void* addr, size_t len, uint32_t access) {
          return RegisterMemory(addr, len, access);
        },
        limits);
  }
  return *rcache_;
}

namespace {

// A registration that owns anonymous memory it was allocated with.
class OwnedRegion final : public MemoryRegion {
 public:
  OwnedRegion(std::unique_ptr<MemoryRegion> inner, size_t map_len)
      : MemoryRegion(inner->addr(), inner->length(), inner->access()),
        inner_(std::move(inner)),
        map_len_(map_len) {}
  ~OwnedRegion() override {
    void* mem = inner_->addr();
    inner_.reset();  // deregister before the memory goes
    ::munmap(mem, map_len_);
  }
  void* desc() const override { return inner_->desc(); }
  RemoteKey remote_key() const override { return inner_->remote_key(); }
  void Revoke() noexcept override { inner_->Revoke(); }

 private:
  std::unique_ptr<MemoryRegion> inner_;
  size_t map_len_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryRegion>> Fabric::AllocateRegistered(size_t len,
                                                                         uint32_t access) {
  if (len == 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     "cannot allocate an empty registered region", "ask for at least one byte");
  }
  void* mem = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    return ErrnoError(errno, absl::StrCat("allocating ", len, " bytes for registration failed"),
                      "lower the size or raise memory limits");
  }
  auto mr = RegisterMemory(mem, len, access);
  if (!mr.ok()) {
    ::munmap(mem, len);
    return mr.status();
  }
  return std::unique_ptr<MemoryRegion>(new OwnedRegion(std::move(*mr), len));
}

// ---- Endpoint: defaults emulate through the control channel ----

Endpoint::Endpoint(Fabric* fabric, CompletionQueue* cq)
    : fabric_(fabric), cq_(cq), emulation_(std::make_unique<Emulation>(this)) {}

Endpoint::~Endpoint() = default;

absl::Status Endpoint::Read(void* local, size_t len, MemoryRegion* mr,
                            uint64_t remote_addr, const RemoteKey& rkey,
                            uint64_t context) {
  return emulation_->Read(local, len, remote_addr, rkey, context);
}

absl::Status Endpoint::Write(const void* local, size_t len, MemoryRegion* mr,
                             uint64_t remote_addr, const RemoteKey& rkey,
                             uint64_t context) {
  return emulation_->Write(local, len, remote_addr, rkey, context);
}

absl::Status Endpoint::FetchAdd(uint64_t* result, uint64_t remote_addr,
                                const RemoteKey& rkey, uint64_t add,
                                uint64_t context) {
  return emulation_->Atomic(OpType::kFetchAdd, result, remote_addr, rkey, add, 0,
                            context);
}

absl::Status Endpoint::CompareSwap(uint64_t* result, uint64_t remote_addr,
                                   const RemoteKey& rkey, uint64_t compare,
                                   uint64_t swap, uint64_t context) {
  return emulation_->Atomic(OpType::kCompareSwap, result, remote_addr, rkey,
                            compare, swap, context);
}

void Endpoint::DeliverControl(std::span<const uint8_t> msg) {
  emulation_->Deliver(msg);
}

void Endpoint::FailEmulated(const absl::Status& why) { emulation_->FailAll(why); }

}  // namespace zsock
