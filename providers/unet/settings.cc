// unet's fabric settings (settings.h): the fabric's options over the
// unet_* configuration keys.
#include "providers/unet/settings.h"

#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/config.h"
#include "core/status.h"

namespace zsock::unet {

absl::StatusOr<Settings> LoadSettings(const FabricSpec& spec) {
  const auto& global = Config::Global();
  if (!global.ok()) return global.status();
  static const char* kOptions[] = {"ring_entries", "buffer_size", "buffers", "cma",
                                   "max_registrations"};
  auto value = [&](const char* opt, const char* key) -> absl::StatusOr<std::string> {
    if (auto it = spec.options.find(opt); it != spec.options.end()) {
      if (auto st = Config::Validate(key, it->second, absl::StrCat("fabric option ", opt));
          !st.ok()) {
        return st;
      }
      return it->second;
    }
    return global->GetString(key);
  };
  for (const auto& [k, v] : spec.options) {
    bool known = false;
    for (const char* o : kOptions) known |= (k == o);
    if (!known) {
      return MakeError(absl::StatusCode::kInvalidArgument, 0,
                       absl::StrCat("unknown unet option '", k, "'"),
                       absl::StrCat("unet accepts: ", absl::StrJoin(kOptions, ", ")));
    }
  }
  if (!spec.spec.empty()) {
    return MakeError(absl::StatusCode::kInvalidArgument, 0,
                     absl::StrCat("unet takes no spec, got 'unet:", spec.spec, "'"),
                     "write 'unet' or 'unet?option=value'");
  }
  Settings s;
  auto num = [&](const char* opt, const char* key, uint32_t* out) -> absl::Status {
    auto v = value(opt, key);
    if (!v.ok()) return v.status();
    auto n = Config::ParseNumber(key, *v);
    if (!n.ok()) return n.status();
    *out = static_cast<uint32_t>(*n);
    return absl::OkStatus();
  };
  if (auto st = num("ring_entries", "unet_ring_entries", &s.ring_entries); !st.ok()) return st;
  if (auto st = num("buffer_size", "unet_buffer_size", &s.buffer_size); !st.ok()) return st;
  if (auto st = num("buffers", "unet_buffers", &s.nbuffers); !st.ok()) return st;
  if (auto st = num("max_registrations", "unet_max_registrations", &s.key_slots); !st.ok()) return st;
  for (auto [n, name] : {std::pair{s.ring_entries, "unet_ring_entries"},
                         std::pair{s.nbuffers, "unet_buffers"}}) {
    if ((n & (n - 1)) != 0) {
      return MakeError(absl::StatusCode::kInvalidArgument, 0,
                       absl::StrCat(name, "=", n, " is not a power of two"),
                       "use 8, 16, 32, 64, ...");
    }
  }
  auto cma = value("cma", "unet_cma");
  if (!cma.ok()) return cma.status();
  s.cma = absl::AsciiStrToLower(*cma) != "off";
  s.connect_timeout = absl::Milliseconds(global->GetInt("connect_timeout_ms"));
  return s;
}

}  // namespace zsock::unet
