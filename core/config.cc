#include "core/config.h"

#include <unistd.h>

#include <cerrno>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/log.h"
#include "core/modules.h"
#include "core/mutex.h"
#include "core/status.h"

extern char** environ;

namespace zsock {

namespace {

// Guards registrations; they come from static initializers and module
// loads, never concurrently with a Load that reads the list.
Mutex& KeysMutex() {
  static auto* mu = new Mutex;
  return *mu;
}

std::vector<ConfigKeyInfo>* MutableKeys() {
  static auto* keys = new std::vector<ConfigKeyInfo>{
      {"provider", ConfigType::kString, "unet",
       "fabric opened by default: provider[:spec][?key=value&...], e.g. unet, "
       "ofi:tcp;ofi_rxm, ucx:posix,cma"},
      {"provider_path", ConfigType::kString, "",
       "directories searched for provider modules (libzsock-<name>.so), separated "
       "by ':'; empty: <directory of libzsock.so.1>/zsock/prov (read from "
       "ZSOCK_PROVIDER_PATH at start-up only; core/modules.h)"},
      {"log_level", ConfigType::kEnum, "warn", "logging threshold",
       {"error", "warn", "info", "debug", "trace"}},
      {"spin_us", ConfigType::kInt, "20",
       "how long a blocking wait polls before it sleeps on the CQ fd (us): where "
       "the adaptive spin starts and its floor", {}, 0, 1000000},
      {"spin_max_us", ConfigType::kInt, "-1",
       "the most a blocking wait's spin grows to when its waits keep finding their "
       "events soon after going to sleep (us); -1: five times spin_us (so spin_us=0 "
       "never spins); at or below spin_us the spin stays at spin_us "
       "(core/adaptive_spin.h)", {}, -1, 1000000},
      {"rcache_max_bytes", ConfigType::kSize, "1G",
       "registration cache: most bytes kept registered while unused", {}, 0},
      {"rcache_max_entries", ConfigType::kInt, "4096",
       "registration cache: most unused registrations kept", {}, 0, 1 << 24},
      {"data_copy", ConfigType::kEnum, "auto",
       "bulk copies of the data path whose destination is 1-31 bytes past the "
       "source modulo 64: auto (copied backwards with AVX2 on AMD processors, "
       "where glibc's rep movsb runs them at 2-3 GB/s), on (on any x86-64 with "
       "AVX2) or off (memcpy always); core/copy.h",
       {"auto", "on", "off"}},
      {"memhooks", ConfigType::kBool, "on",
       "intercept free/munmap/... to invalidate registrations (read from "
       "ZSOCK_MEMHOOKS at start-up only)"},
      {"connect_timeout_ms", ConfigType::kInt, "10000",
       "default connect/accept handshake timeout (ms)", {}, 1, 3600000},
      {"mode", ConfigType::kEnum, "bcopy",
       "SDP data path: bcopy (copy through private buffers), zcopy (SrcAvail/"
       "SinkAvail with RDMA at and above zcopy_threshold) or azcopy (AZ-SDP: "
       "send returns at once, the buffer is write-protected until pulled; "
       "docs/azsdp.md)",
       {"bcopy", "zcopy", "azcopy"}},
      {"az_policy", ConfigType::kEnum, "copy",
       "AZ-SDP: a write to a buffer still being sent copies the data aside if "
       "the receiver has not started pulling it (copy) or always waits (block)",
       {"copy", "block"}},
      {"az_adverts", ConfigType::kInt, "16",
       "AZ-SDP: asynchronous SrcAvails outstanding per connection", {}, 1, 64},
      {"az_early_recv", ConfigType::kBool, "off",
       "AZ-SDP: a large page-aligned receive returns before its data lands (the "
       "pages are inaccessible until then; kernel reads of them fail with EFAULT "
       "meanwhile)"},
      {"az_fault_limit", ConfigType::kInt, "5000",
       "AZ-SDP: faults per second on one connection above which it falls back "
       "to zcopy (see its statistics)", {}, 1, 100000000},
      {"autocork", ConfigType::kBool, "on",
       "SDP: while the peer has not acknowledged our last small message, small "
       "sends wait and coalesce into one message (as Linux's tcp_autocorking)"},
      {"zcopy_threshold", ConfigType::kSize, "128K",
       "SDP: smallest send (and receive buffer) that goes zero-copy in zcopy mode", {}, 1024,
       int64_t{1} << 30},
      {"pull_threshold", ConfigType::kSize, "32K",
       "SDP: smallest bcopy send that goes pulled (copied once into a buffer the "
       "peer reads straight into its application's buffer) where the peer's reads "
       "of our memory are CPU copies (unet); 0: never", {}, 0, int64_t{1} << 30},
  };
  return keys;
}

bool global_loaded = false;

}  // namespace

const std::vector<ConfigKeyInfo>& ConfigKeys() { return *MutableKeys(); }

bool RegisterConfigKeys(std::vector<ConfigKeyInfo> keys) {
  MutexLock lock(&KeysMutex());
  std::vector<ConfigKeyInfo>* all = MutableKeys();
  for (auto& k : keys) {
    bool exists = false;
    for (const auto& have : *all) exists |= have.name == k.name;
    if (exists) {
      ZS_LOG(kError, "config key %s is registered twice; the second is ignored", k.name);
      continue;
    }
    all->push_back(std::move(k));
    if (global_loaded) Config::AddToGlobal(all->back());
  }
  return true;
}

namespace {

const ConfigKeyInfo* FindKey(absl::string_view name) {
  for (const auto& k : ConfigKeys()) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

std::string KnownKeys() {
  std::vector<absl::string_view> names;
  for (const auto& k : ConfigKeys()) names.push_back(k.name);
  return absl::StrJoin(names, ", ");
}

}  // namespace

absl::StatusOr<int64_t> Config::ParseNumber(absl::string_view key,
                                            absl::string_view value) {
  std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  int64_t mult = 1;
  if (!v.empty()) {
    char last = v.back();
    if (last == 'k') mult = int64_t{1} << 10;
    if (last == 'm') mult = int64_t{1} << 20;
    if (last == 'g') mult = int64_t{1} << 30;
    if (mult != 1) v.pop_back();
  }
  int64_t n = 0;
  if (!absl::SimpleAtoi(v, &n) || n > INT64_MAX / mult) {
    return MakeError(absl::StatusCode::kInvalidArgument, 0,
                     absl::StrCat("config ", key, "=", value, " is not a number"),
                     "give an integer, optionally with K, M or G");
  }
  return n * mult;
}

absl::StatusOr<uint32_t> Config::ParseFlowWindow(absl::string_view provider,
                                                 absl::string_view value,
                                                 absl::string_view unbounded) {
  int n = -1;
  if (!absl::SimpleAtoi(value, &n) || (n != 0 && (n < 4 || n > 1000000))) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat(provider, " option flow_window=", value,
                                  " is not 0 or a number of messages from 4 to 1000000"),
                     absl::StrCat("write e.g. flow_window=1024 (the default), or flow_window=0 to "
                                  "send without flow control (",
                                  unbounded, " then buffers whatever the peer has not received "
                                  "yet, without bound)"));
  }
  return static_cast<uint32_t>(n);
}

absl::StatusOr<bool> Config::ParseBool(absl::string_view key, absl::string_view value) {
  std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  if (v == "1" || v == "on" || v == "yes" || v == "true") return true;
  if (v == "0" || v == "off" || v == "no" || v == "false") return false;
  return MakeError(absl::StatusCode::kInvalidArgument, 0,
                   absl::StrCat("config ", key, "=", value, " is not a boolean"),
                   "use on/off, yes/no, true/false or 1/0");
}

absl::Status Config::Validate(absl::string_view key, absl::string_view value,
                              absl::string_view source) {
  const ConfigKeyInfo* info = FindKey(key);
  if (info == nullptr) {
    return MakeError(absl::StatusCode::kInvalidArgument, 0,
                     absl::StrCat("unknown config key '", key, "' (from ", source, ")"),
                     absl::StrCat("known keys: ", KnownKeys()));
  }
  switch (info->type) {
    case ConfigType::kString:
      return absl::OkStatus();
    case ConfigType::kBool:
      return ParseBool(key, value).status();
    case ConfigType::kEnum: {
      std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
      for (auto c : info->choices) {
        if (c == v) return absl::OkStatus();
      }
      return MakeError(absl::StatusCode::kInvalidArgument, 0,
                       absl::StrCat("config ", key, "=", value, " (from ", source,
                                    ") is not accepted"),
                       absl::StrCat("use one of: ", absl::StrJoin(info->choices, ", ")));
    }
    case ConfigType::kInt:
    case ConfigType::kSize: {
      auto n = ParseNumber(key, value);
      if (!n.ok()) return n.status();
      if (*n < info->min || *n > info->max) {
        return MakeError(absl::StatusCode::kInvalidArgument, 0,
                         absl::StrCat("config ", key, "=", value, " (from ", source,
                                      ") is out of range"),
                         absl::StrCat("use a value from ", info->min, " to ", info->max));
      }
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Config> Config::Load(const std::map<std::string, std::string>& env,
                                    const std::string* file) {
  Config config;
  for (const auto& k : ConfigKeys()) {
    config.values_[std::string(k.name)] = {std::string(k.default_value), "default"};
  }
  std::string path;
  bool explicit_file = false;
  if (file != nullptr) {
    path = *file;
    explicit_file = !path.empty();
  } else if (auto it = env.find("ZSOCK_CONFIG"); it != env.end()) {
    path = it->second;
    explicit_file = true;
  } else if (access("/etc/zsock/zsock.conf", R_OK) == 0) {
    path = "/etc/zsock/zsock.conf";
  }
  if (!path.empty()) {
    std::ifstream in(path);
    if (!in) {
      if (explicit_file) {
        return ErrnoError(errno, absl::StrCat("cannot read config file ", path),
                          "point ZSOCK_CONFIG at a readable file, or unset it");
      }
    } else {
      std::string line;
      int lineno = 0;
      while (std::getline(in, line)) {
        ++lineno;
        absl::string_view text = line;
        if (auto hash = text.find('#'); hash != absl::string_view::npos) {
          text = text.substr(0, hash);
        }
        text = absl::StripAsciiWhitespace(text);
        if (text.empty()) continue;
        std::string source = absl::StrCat(path, ":", lineno);
        auto eq = text.find('=');
        if (eq == absl::string_view::npos) {
          return MakeError(absl::StatusCode::kInvalidArgument, 0,
                           absl::StrCat(source, ": expected 'key = value', got '", text, "'"),
                           "fix the line or remove it");
        }
        std::string key = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text.substr(0, eq)));
        std::string value(absl::StripAsciiWhitespace(text.substr(eq + 1)));
        if (auto st = Validate(key, value, source); !st.ok()) return st;
        config.values_[key] = {value, source};
      }
    }
  }
  for (const auto& [name, value] : env) {
    if (!absl::StartsWith(name, "ZSOCK_") || name == "ZSOCK_CONFIG") continue;
    std::string key = absl::AsciiStrToLower(name.substr(6));
    if (FindKey(key) == nullptr) {
      // Other ZSOCK_* variables may belong to tools (ZSOCK_TEST_*, ...): only
      // warn-free skip for those, reject near misses of real keys.
      if (absl::StartsWith(key, "test_") || absl::StartsWith(key, "bench_")) continue;
      return MakeError(absl::StatusCode::kInvalidArgument, 0,
                       absl::StrCat("unknown environment variable ", name),
                       absl::StrCat("unset it; known variables are ZSOCK_CONFIG and ZSOCK_<KEY> for keys: ",
                                    KnownKeys()));
    }
    std::string source = absl::StrCat("env ", name);
    if (auto st = Validate(key, value, source); !st.ok()) return st;
    config.values_[key] = {value, source};
  }
  return config;
}

std::map<std::string, std::string> ZsockEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    absl::string_view kv(*e);
    if (!absl::StartsWith(kv, "ZSOCK_")) continue;
    auto eq = kv.find('=');
    if (eq == absl::string_view::npos) continue;
    env[std::string(kv.substr(0, eq))] = std::string(kv.substr(eq + 1));
  }
  return env;
}

namespace {
absl::StatusOr<Config>* GlobalStorage() {
  static auto* global = new absl::StatusOr<Config>(
      absl::FailedPreconditionError("configuration not loaded"));
  return global;
}
void LoadGlobal() {
  absl::StatusOr<Config>* config = GlobalStorage();
  {
    MutexLock lock(&KeysMutex());
    *config = Config::Load(ZsockEnvironment());
    global_loaded = true;
  }
  // Logging sits below config and reads only ZSOCK_LOG_LEVEL; a level set
  // in the config file is applied here.
  LogLevel level;
  if (config->ok() && ParseLogLevel((*config)->GetString("log_level"), &level)) {
    SetLogLevel(level);
  }
}
}  // namespace

// Its default, or its ZSOCK_* variable when that is valid (an invalid one
// is logged and the default kept: the configuration that loaded stays
// usable).
void Config::AddToGlobal(const ConfigKeyInfo& key) {
  absl::StatusOr<Config>* config = GlobalStorage();
  if (!config->ok()) return;
  ConfigValue v{std::string(key.default_value), "default"};
  std::string var = absl::StrCat("ZSOCK_", absl::AsciiStrToUpper(key.name));
  if (const char* env = std::getenv(var.c_str()); env != nullptr) {
    std::string source = absl::StrCat("env ", var);
    if (absl::Status st = Config::Validate(key.name, env, source); st.ok()) {
      v = {env, source};
    } else {
      ZS_LOG(kError, "%s", st.message());
    }
  }
  (*config)->values_[std::string(key.name)] = std::move(v);
}

const absl::StatusOr<Config>& Config::Global() {
  static const bool loaded = [] {
    // Modules register configuration keys (ZSOCK_OFI_*, ...) as they load:
    // validating the environment before would reject them.
    LoadProviderModules();
    LoadGlobal();
    return true;
  }();
  (void)loaded;
  return *GlobalStorage();
}

void Config::ReloadGlobalInChild() {
  (void)Global();
  LoadGlobal();
}

const ConfigValue& Config::Get(absl::string_view key) const {
  auto it = values_.find(key);
  if (it == values_.end()) {
    static const ConfigValue kEmpty{"", "unknown"};
    return kEmpty;
  }
  return it->second;
}

std::string Config::GetString(absl::string_view key) const { return Get(key).value; }

int64_t Config::GetInt(absl::string_view key) const {
  auto n = ParseNumber(key, Get(key).value);
  return n.ok() ? *n : 0;
}

bool Config::GetBool(absl::string_view key) const {
  auto b = ParseBool(key, Get(key).value);
  return b.ok() && *b;
}

SpinBounds ConfiguredSpin() {
  const auto& config = Config::Global();
  if (!config.ok()) return {20'000, 100'000};
  const int64_t floor_us = config->GetInt("spin_us");
  const int64_t max_us = config->GetInt("spin_max_us");
  return {floor_us * 1000, (max_us < 0 ? 5 * floor_us : max_us) * 1000};
}

}  // namespace zsock
