// The tcp fabric: its options and configuration key, its capabilities,
// memory registration (a LocalKeyTable entry per region) and registration
// with the provider registry. Connections are set up in connect.cc.
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/status.h"
#include "providers/tcp/tcp.h"

namespace zsock::tcp {
namespace {

// Live registrations one fabric holds at most (the registration cache,
// rcache_max_entries, keeps far fewer).
constexpr uint32_t kMaxRegistrations = 1 << 20;

// Linking the library is what makes "tcp" available (alwayslink).
const bool kRegistered = RegisterProvider(ProviderInfo{
    "tcp",
    "reliable messaging over kernel TCP sockets (any host; RMA and atomics emulated)",
    {"tcp"},  // the configurations zsock_info lists and the conformance suite runs
    [](const FabricSpec& spec) { return TcpFabric::Open(spec); },
});

// The key gives the default; the option of the same name without the
// prefix overrides it for one fabric ("tcp?nodelay=off").
const bool kKeysRegistered = RegisterConfigKeys({
    {"tcp_nodelay", ConfigType::kBool, "on",
     "tcp: TCP_NODELAY on connections (off: the kernel may hold small messages back to "
     "coalesce them, Nagle's algorithm)"},
});

absl::StatusOr<Settings> LoadSettings(const FabricSpec& spec) {
  if (!spec.spec.empty()) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("tcp takes no spec, got 'tcp:", spec.spec, "'"),
                     "write 'tcp', with options after '?': tcp?nodelay=off");
  }
  const auto& global = Config::Global();
  if (!global.ok()) return global.status();
  Settings s;
  s.nodelay = global->GetBool("tcp_nodelay");
  s.connect_timeout = absl::Milliseconds(global->GetInt("connect_timeout_ms"));
  for (const auto& [key, value] : spec.options) {
    if (key != "nodelay") {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       absl::StrCat("unknown tcp option '", key, "'"),
                       "the tcp options are: nodelay=on|off");
    }
    auto on = Config::ParseBool("tcp option nodelay", value);
    if (!on.ok()) return on.status();
    s.nodelay = *on;
  }
  return s;
}

// A registration: its key lives in the fabric's table until destroyed.
class TcpRegion final : public MemoryRegion {
 public:
  TcpRegion(void* addr, size_t len, uint32_t access, LocalKeyTable* keys, LocalKeyTable::Key key)
      : MemoryRegion(addr, len, access), keys_(keys), key_(key) {}
  ~TcpRegion() override { keys_->Remove(key_); }

  RemoteKey remote_key() const override {
    RemoteKey k{reinterpret_cast<uint64_t>(addr()), length(), access(), {}};
    k.blob.resize(LocalKeyTable::kEncodedSize);
    LocalKeyTable::Encode(key_, k.blob.data());
    return k;
  }
  // Lock-free and allocation-free, as the memory-release hooks need.
  void Revoke() noexcept override { keys_->Revoke(key_); }

 private:
  LocalKeyTable* const keys_;
  const LocalKeyTable::Key key_;
};

}  // namespace

TcpFabric::TcpFabric(Settings settings) : settings_(std::move(settings)), keys_(kMaxRegistrations) {
  caps_.provider = "tcp";  // send_recv kNative, registration_required false, wait_fd true
  caps_.rdma_read = caps_.rdma_write = caps_.atomics = Support::kEmulated;
  caps_.atomics_allocated = caps_.rma_allocated = Support::kEmulated;
  caps_.max_msg_size = kMaxMessage;
  caps_.max_rma_size = kMaxRma;
  caps_.inject_size = kInjectSize;
  caps_.notes = {
      "RDMA read/write and atomics: emulated by core over the connection (the target's "
      "progress serves them)",
      "messages that arrive before their receive is posted are buffered without bound: "
      "the caller's own flow control (SDP's credits) bounds them",
  };
}

absl::StatusOr<std::unique_ptr<Fabric>> TcpFabric::Open(const FabricSpec& spec) {
  auto settings = LoadSettings(spec);
  if (!settings.ok()) return settings.status();
  return std::unique_ptr<Fabric>(new TcpFabric(std::move(*settings)));
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> TcpFabric::RegisterMemory(void* addr, size_t len,
                                                                        uint32_t access) {
  auto key = keys_.Add(reinterpret_cast<uint64_t>(addr), len, access);
  if (!key) {
    return MakeError(absl::StatusCode::kResourceExhausted, ENOMEM,
                     absl::StrCat("tcp holds ", keys_.capacity(), " live registrations already"),
                     "release registrations (or lower rcache_max_entries)");
  }
  return std::unique_ptr<MemoryRegion>(new TcpRegion(addr, len, access, &keys_, *key));
}

absl::Status TcpFabric::AccessLocal(const RemoteKey& rkey, uint64_t addr, size_t len,
                                    uint32_t access, absl::FunctionRef<void(void*)> fn) {
  if (rkey.blob.size() != LocalKeyTable::kEncodedSize) {
    return MakeError(
        absl::StatusCode::kPermissionDenied, EACCES,
        absl::StrCat("a remote key with ", rkey.blob.size(), " key bytes is not a tcp key"),
        "pass keys from remote_key() of this fabric's regions");
  }
  return keys_.Access(LocalKeyTable::Decode(rkey.blob.data()), addr, len, access, fn);
}

}  // namespace zsock::tcp
