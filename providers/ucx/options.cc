// Parsing and validation of ucx fabric strings (see options.h).
//
// How a ?UCX_NAME=value option reaches UCX: ucp_config_modify(key, value)
// stores keys it does not know itself and applies them, when the worker is
// created, to every transport and memory-domain configuration that has a
// field of that name, relative to that transport's table. So the key for a
// UCP context variable is the name without "UCX_" (UCX_RNDV_THRESH ->
// RNDV_THRESH); for a transport variable it is the name without "UCX_" and
// without the transport prefix (UCX_TCP_NODELAY -> NODELAY), or a shared
// table name (UCX_MM_FIFO_SIZE -> MM_FIFO_SIZE, for posix and sysv). We
// check each candidate against the real configurations with
// uct_config_modify, which also validates the value.
#include "providers/ucx/options.h"

#include "core/mutex.h"

#include <ucp/api/ucp.h>
#include <ucs/config/parser.h>
#include <uct/api/uct.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "core/config.h"
#include "core/status.h"

namespace zsock::ucx {
namespace {


// The variable name at the start of a printed line "UCX_NAME=value" or
// "UCX_NAME (deprecated)"; empty if the line is not one.
std::string VariableName(absl::string_view line) {
  if (!absl::StartsWith(line, "UCX_")) return {};
  size_t end = 0;
  while (end < line.size() && (std::isupper(static_cast<unsigned char>(line[end])) ||
                               std::isdigit(static_cast<unsigned char>(line[end])) ||
                               line[end] == '_')) {
    ++end;
  }
  if (end == line.size() || (line[end] != '=' && line[end] != ' ')) return {};
  return std::string(line.substr(0, end));
}

// What this UCX knows: its variables, its transports and, for checking
// transport-level keys, one configuration of every memory domain and
// transport. Built once per process.
class Catalog {
 public:
  static Catalog& Get() {
    static Catalog* catalog = new Catalog;  // never destroyed: UCX may unload late
    return *catalog;
  }

  bool IsVariable(const std::string& name) const { return variables_.count(name) > 0; }
  bool IsUcpVariable(const std::string& name) const { return ucp_variables_.count(name) > 0; }
  const std::vector<std::string>& transports() const { return transports_; }
  const std::vector<std::string>& transport_prefixes() const { return prefixes_; }

  // Whether `key` names a field of some transport or memory-domain
  // configuration. Value errors are returned as InvalidArgument.
  absl::StatusOr<bool> AppliesToTransport(const std::string& name, const std::string& key,
                                          const std::string& value) {
    MutexLock lock(&mu_);
    bool applies = false;
    for (void* config : uct_configs_) {
      ucs_status_t st = uct_config_modify(config, key.c_str(), value.c_str());
      if (st == UCS_OK) {
        applies = true;
      } else if (st != UCS_ERR_NO_ELEM) {
        return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                         absl::StrCat("UCX rejected the value '", value, "' of ", name, " (",
                                      ucs_status_string(st), ")"),
                         "ucx_info -cf shows each variable's syntax");
      }
    }
    return applies;
  }

 private:
  Catalog() {
    // Loading the transport modules registers their variables.
    uct_component_h* components = nullptr;
    unsigned num_components = 0;
    if (uct_query_components(&components, &num_components) == UCS_OK) {
      for (unsigned c = 0; c < num_components; ++c) AddComponent(components[c]);
      uct_release_component_list(components);
    }
    std::string all = CaptureOutput([](FILE* f) {
      ucs_config_parser_print_all_opts(
          f, "UCX_",
          static_cast<ucs_config_print_flags_t>(UCS_CONFIG_PRINT_CONFIG |
                                                UCS_CONFIG_PRINT_HIDDEN |
                                                UCS_CONFIG_PRINT_DOC),
          &ucs_config_global_list);
    });
    for (absl::string_view line : absl::StrSplit(all, '\n')) {
      if (std::string name = VariableName(line); !name.empty()) {
        variables_.insert(name);
      } else if (absl::StartsWith(line, "# inherits:")) {
        for (absl::string_view item : absl::StrSplit(line.substr(11), ',')) {
          std::string name(absl::StripAsciiWhitespace(item));
          if (!name.empty()) variables_.insert(name);
        }
      }
    }
    ucp_config_t* config = nullptr;
    if (ucp_config_read(nullptr, nullptr, &config) == UCS_OK) {
      std::string ucp = CaptureOutput([config](FILE* f) {
        ucp_config_print(config, f, nullptr,
                         static_cast<ucs_config_print_flags_t>(UCS_CONFIG_PRINT_CONFIG |
                                                               UCS_CONFIG_PRINT_HIDDEN));
      });
      ucp_config_release(config);
      for (absl::string_view line : absl::StrSplit(ucp, '\n')) {
        if (std::string name = VariableName(line); !name.empty()) {
          ucp_variables_.insert(name);
          variables_.insert(name);
        }
      }
    }
    for (const std::string& tl : transports_) {
      prefixes_.push_back(absl::StrCat(absl::AsciiStrToUpper(tl), "_"));
    }
  }

  void AddComponent(uct_component_h component) {
    uct_component_attr_t attr{};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    if (uct_component_query(component, &attr) != UCS_OK) return;
    std::vector<uct_md_resource_desc_t> mds(attr.md_resource_count);
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    attr.md_resources = mds.data();
    if (!mds.empty() && uct_component_query(component, &attr) != UCS_OK) return;
    for (const auto& md_desc : mds) {
      uct_md_config_t* md_config = nullptr;
      if (uct_md_config_read(component, nullptr, nullptr, &md_config) != UCS_OK) continue;
      uct_configs_.push_back(md_config);
      uct_md_h md = nullptr;
      if (uct_md_open(component, md_desc.md_name, md_config, &md) != UCS_OK) continue;
      uct_tl_resource_desc_t* tls = nullptr;
      unsigned num_tls = 0;
      if (uct_md_query_tl_resources(md, &tls, &num_tls) == UCS_OK) {
        for (unsigned i = 0; i < num_tls; ++i) {
          std::string name = absl::AsciiStrToLower(tls[i].tl_name);
          bool seen = false;
          for (const auto& t : transports_) seen |= (t == name);
          if (seen) continue;
          transports_.push_back(name);
          uct_iface_config_t* iface_config = nullptr;
          if (uct_md_iface_config_read(md, tls[i].tl_name, nullptr, nullptr, &iface_config) ==
              UCS_OK) {
            uct_configs_.push_back(iface_config);
          }
        }
        uct_release_tl_resource_list(tls);
      }
      uct_md_close(md);
    }
  }

  std::set<std::string> variables_;
  std::set<std::string> ucp_variables_;
  std::vector<std::string> transports_;
  std::vector<std::string> prefixes_;
  Mutex mu_;
  std::vector<void*> uct_configs_ ABSL_GUARDED_BY(mu_);
};

// UCX_TLS names that are not transports but aliases (UCX 1.13).
constexpr const char* kAliases[] = {"all", "sm", "shm", "mm", "ib", "rc", "rc_v", "rc_x",
                                    "ud", "ud_v", "ud_x", "dc", "dc_x", "cuda", "rocm"};
// Transports and aliases that reach only this host.
constexpr const char* kSameHost[] = {"posix", "sysv", "mm", "sm", "shm", "cma", "knem",
                                     "xpmem", "self", "cuda_ipc", "rocm_ipc"};
// Which of them are memory-mapped (uct "mm") transports.
constexpr const char* kMm[] = {"posix", "sysv", "mm", "sm", "shm", "all"};

template <size_t N>
bool In(const std::string& s, const char* const (&list)[N]) {
  for (const char* item : list) {
    if (s == item) return true;
  }
  return false;
}

constexpr const char* kZsockOptions[] = {"fallback", "native_rma", "max_registrations",
                                         "flow_window", "threads"};

absl::Status ApplyUcxOption(const std::string& name, const std::string& value,
                            Settings* s) {
  Catalog& catalog = Catalog::Get();
  const std::string key = name.substr(4);
  if (key == "TLS") {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     "UCX_TLS cannot be given as an option of a ucx fabric",
                     "write the transports after 'ucx:', e.g. ucx:posix,cma");
  }
  if (key == "RCACHE_ENABLE") {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     "UCX_RCACHE_ENABLE is fixed to 'n' by zsock",
                     "leave it out: zsock caches registrations itself, and UCP's cache "
                     "installs memory hooks and starts UCX's async thread, which breaks fork "
                     "(docs/ucx.md)");
  }
  if (!catalog.IsVariable(name)) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("unknown UCX option '", name, "'"),
                     "check the spelling; ucx_info -cf lists every UCX variable");
  }
  if (catalog.IsUcpVariable(name)) {
    // Validate the value on a scratch configuration (ucp_config_modify
    // checks the values of UCP's own variables).
    ucp_config_t* config = nullptr;
    if (ucp_config_read(nullptr, nullptr, &config) == UCS_OK) {
      ucs_status_t st = ucp_config_modify(config, key.c_str(), value.c_str());
      ucp_config_release(config);
      if (st != UCS_OK) {
        return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                         absl::StrCat("UCX rejected the value '", value, "' of ", name, " (",
                                      ucs_status_string(st), ")"),
                         "ucx_info -cf shows each variable's syntax");
      }
    }
    s->ucx_options.emplace_back(key, value);
    return absl::OkStatus();
  }
  std::vector<std::string> candidates = {key};
  for (const std::string& prefix : catalog.transport_prefixes()) {
    if (absl::StartsWith(key, prefix) && key.size() > prefix.size()) {
      candidates.push_back(key.substr(prefix.size()));
    }
  }
  for (const std::string& candidate : candidates) {
    auto applies = catalog.AppliesToTransport(name, candidate, value);
    if (!applies.ok()) return applies.status();
    if (*applies) {
      s->ucx_options.emplace_back(candidate, value);
      return absl::OkStatus();
    }
  }
  return MakeError(
      absl::StatusCode::kInvalidArgument, EINVAL,
      absl::StrCat("UCX option '", name,
                   "' cannot be set for one fabric: it is process-wide (read when UCX "
                   "loads), belongs to a component zsock does not use, or is a per-transport "
                   "name ucp_config_modify cannot address"),
      "set it in the environment instead, or use the shared name ucx_info -cf lists "
      "under 'inherits' (e.g. UCX_MM_FIFO_SIZE instead of UCX_POSIX_FIFO_SIZE)");
}

}  // namespace

const std::vector<std::string>& AvailableTransports() {
  return Catalog::Get().transports();
}

namespace {

// The transports of `spec` into s->tls, s->requested and the flags that
// follow from them.
absl::Status ParseTransports(const FabricSpec& spec, Settings* s) {
  s->tls = absl::AsciiStrToLower(spec.spec.empty() ? std::string("all") : spec.spec);
  if (s->tls.find('^') != std::string::npos) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("ucx:", s->tls,
                                  ": excluding transports with '^' is not supported"),
                     "name the transports to use, e.g. ucx:posix,cma or ucx:tcp");
  }
  const auto& available = AvailableTransports();
  s->same_host_only = true;
  for (absl::string_view item : absl::StrSplit(s->tls, ',')) {
    std::string name(absl::StripAsciiWhitespace(item));
    if (name.empty()) {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       absl::StrCat("ucx:", spec.spec, " has an empty transport name"),
                       "separate transports with single commas, e.g. ucx:posix,cma");
    }
    bool known = In(name, kAliases);
    for (const auto& t : available) known |= (t == name);
    if (!known && !In(name, kSameHost)) {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       absl::StrCat("unknown UCX transport '", name, "' in 'ucx:", spec.spec, "'"),
                       absl::StrCat("use transports this UCX has: ",
                                    absl::StrJoin(available, ","),
                                    " (or all, sm, shm, mm); ucx_info -d describes them"));
    }
    s->same_host_only &= In(name, kSameHost);
    s->has_mm |= In(name, kMm);
    s->has_cma |= (name == "cma" || name == "sm" || name == "shm" || name == "all");
    s->requested.push_back(name);
  }
  s->tls = absl::StrJoin(s->requested, ",");
  return absl::OkStatus();
}

// One of zsock's own options (kZsockOptions); false if `k` is none of them.
absl::StatusOr<bool> ApplyZsockOption(const std::string& k, const std::string& v, Settings* s) {
  if (k == "fallback") {
    if (v != "tcp" && v != "none") {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       absl::StrCat("ucx option fallback=", v, " is not tcp or none"),
                       "fallback=tcp connects peers shared memory cannot reach over tcp; "
                       "fallback=none fails such connections");
    }
    s->fallback_tcp = (v == "tcp");
  } else if (k == "native_rma") {
    auto b = Config::ParseBool("native_rma", v);
    if (!b.ok()) return b.status();
    s->native_rma = *b;
  } else if (k == "max_registrations") {
    auto n = Config::ParseNumber("max_registrations", v);
    if (!n.ok()) return n.status();
    if (*n < 1 || *n > (1 << 20)) {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       absl::StrCat("ucx option max_registrations=", v, " is out of range"),
                       "use 1 .. 1048576");
    }
    s->max_registrations = static_cast<size_t>(*n);
  } else if (k == "flow_window") {
    auto n = Config::ParseFlowWindow("ucx", v, "the peer's UCX");
    if (!n.ok()) return n.status();
    s->flow_window = *n;
  } else if (k == "threads") {
    if (v != "multi" && v != "serialized") {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       absl::StrCat("ucx option threads=", v, " is not multi or serialized"),
                       "threads=multi (the default) lets any thread call at any time; "
                       "threads=serialized promises one thread at a time and drops the "
                       "worker's lock");
    }
    s->serialized = (v == "serialized");
  } else {
    return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<Settings> LoadSettings(const FabricSpec& spec) {
  const auto& global = Config::Global();
  if (!global.ok()) return global.status();
  Settings s;
  s.connect_timeout = absl::Milliseconds(global->GetInt("connect_timeout_ms"));
  if (auto st = ParseTransports(spec, &s); !st.ok()) return st;
  std::vector<std::string> unknown;
  for (const auto& [k, v] : spec.options) {
    if (absl::StartsWith(k, "UCX_")) {
      if (auto st = ApplyUcxOption(k, v, &s); !st.ok()) return st;
      s.ucx_options_text.push_back(absl::StrCat(k, "=", v));
      continue;
    }
    auto known = ApplyZsockOption(k, v, &s);
    if (!known.ok()) return known.status();
    if (!*known) unknown.push_back(k);
  }
  if (!unknown.empty()) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("unknown ucx option '", unknown.front(), "'"),
                     absl::StrCat("ucx accepts ", absl::StrJoin(kZsockOptions, ", "),
                                  " and UCX variables written UCX_NAME=value"));
  }
  return s;
}

std::string CaptureOutput(absl::FunctionRef<void(FILE*)> fn) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  if (f == nullptr) return {};
  fn(f);
  std::fclose(f);
  std::string out(buf, len);
  std::free(buf);
  return out;
}

}  // namespace zsock::ucx
