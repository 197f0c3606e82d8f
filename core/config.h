// zsock configuration: built-in defaults, then a config file, then ZSOCK_*
// environment variables (later wins). Every value remembers where it came
// from, for `zsock_info --config`.
//
// The file is ZSOCK_CONFIG if set, else /etc/zsock/zsock.conf if it exists.
// Format: one `key = value` per line, `#` starts a comment. The environment
// variable for key `foo_bar` is ZSOCK_FOO_BAR. Unknown keys and malformed
// values are errors that name the key, the source and the accepted values.
// The keys are documented in docs/configuration.md and by Describe().
#ifndef ZSOCK_CORE_CONFIG_H_
#define ZSOCK_CORE_CONFIG_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/adaptive_spin.h"

namespace zsock {

enum class ConfigType { kString, kInt, kSize, kBool, kEnum };

struct ConfigKeyInfo {
  absl::string_view name;
  ConfigType type;
  absl::string_view default_value;
  absl::string_view help;
  std::vector<absl::string_view> choices;  // for kEnum
  int64_t min = 0;                        // for kInt / kSize
  int64_t max = INT64_MAX;
};

// Every key zsock knows: core's own and those components registered.
const std::vector<ConfigKeyInfo>& ConfigKeys();

// Adds a component's keys (a provider's, named with its prefix: unet_...),
// from its static initializer, so that they are validated, documented by
// zsock_info --config and read with Config's getters like core's. A key
// that already exists is refused (logged) and the rest are added. Keys
// registered after the global configuration loaded (a provider module
// opened later) join it with their defaults and ZSOCK_* environment values.
// Returns true, for use as an initializer.
bool RegisterConfigKeys(std::vector<ConfigKeyInfo> keys);

struct ConfigValue {
  std::string value;
  std::string source;  // "default", "/etc/zsock/zsock.conf:3", "env ZSOCK_X"
};

class Config {
 public:
  // Loads defaults, file and environment. `env` maps variable names to
  // values (tests pass their own); `file` overrides the file choice when set.
  static absl::StatusOr<Config> Load(const std::map<std::string, std::string>& env,
                                     const std::string* file = nullptr);
  // The process-wide configuration, loaded once from the real environment.
  static const absl::StatusOr<Config>& Global();
  // Re-reads the global configuration from the environment and file, in
  // place (references from Global() stay valid). Only for a freshly forked,
  // still single-threaded child that changed its environment (benchmark
  // children inherit the parent's loaded configuration otherwise).
  static void ReloadGlobalInChild();

  // Typed getters for known keys (the value was validated at load).
  std::string GetString(absl::string_view key) const;
  int64_t GetInt(absl::string_view key) const;  // also kSize, in bytes
  bool GetBool(absl::string_view key) const;
  const ConfigValue& Get(absl::string_view key) const;
  const std::map<std::string, ConfigValue, std::less<>>& values() const { return values_; }

  // Validates `value` for `key` and parses it; used by providers for options
  // given in the fabric string (e.g. "unet?cma=off").
  static absl::StatusOr<int64_t> ParseNumber(absl::string_view key, absl::string_view value);
  static absl::StatusOr<bool> ParseBool(absl::string_view key, absl::string_view value);
  // A provider's flow_window=N option (ofi over rxm, ucx): 0 (no flow
  // control) or 4 to 1000000 messages. `provider` names it in the error,
  // `unbounded` says what buffers without bound when the window is off.
  static absl::StatusOr<uint32_t> ParseFlowWindow(absl::string_view provider,
                                                  absl::string_view value,
                                                  absl::string_view unbounded);
  static absl::Status Validate(absl::string_view key, absl::string_view value,
                               absl::string_view source);

 private:
  friend bool RegisterConfigKeys(std::vector<ConfigKeyInfo> keys);
  // A key registered after the global configuration loaded joins it.
  static void AddToGlobal(const ConfigKeyInfo& key);
  std::map<std::string, ConfigValue, std::less<>> values_;
};

// The real process environment as a map (ZSOCK_* entries only).
std::map<std::string, std::string> ZsockEnvironment();

// A blocking wait's spin (core/adaptive_spin.h) from the global
// configuration's spin_us (floor) and spin_max_us (ceiling), in
// nanoseconds; the defaults when the configuration did not load.
SpinBounds ConfiguredSpin();

}  // namespace zsock

#endif  // ZSOCK_CORE_CONFIG_H_
