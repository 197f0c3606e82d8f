// Settings of a ucx fabric, parsed and validated from its config string
// before UCX is initialised:
//
//   ucx[:TRANSPORTS][?UCX_NAME=value&...&zsock_option=value]
//
// TRANSPORTS becomes UCX_TLS of the fabric's UCP context ("tcp",
// "posix,cma", "all"; empty means "all"); it is checked against the
// transports this UCX knows. ?UCX_NAME=value options are UCX configuration
// variables applied to this fabric's context with ucp_config_modify (never
// the process environment). UCX's own ucp_config_modify accepts any name
// and only warns later, so each name is checked here against UCX's table of
// variables and translated to the key ucp_config_modify understands: an
// unknown name, a process-wide one (read when UCX loads) or one UCX cannot
// set per context is an error naming it. zsock's own options (fallback,
// native_rma, max_registrations, flow_window, threads) are documented in docs/ucx.md.
#ifndef ZSOCK_PROVIDERS_UCX_OPTIONS_H_
#define ZSOCK_PROVIDERS_UCX_OPTIONS_H_

#include <cstddef>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/provider.h"

namespace zsock::ucx {

struct Settings {
  std::string tls;                     // UCX_TLS of the primary context
  std::vector<std::string> requested;  // the items of `tls`, lower case
  // Every requested transport reaches only processes on this host
  // (posix, sysv, cma, ...): peers need a fallback to be reached otherwise.
  bool same_host_only = false;
  // The list names shared-memory transports (posix, sysv, or an alias
  // covering them): their error handling must be switched on.
  bool has_mm = false;
  bool has_cma = false;
  // Peers the primary transports cannot reach are connected over tcp
  // (option fallback=tcp|none; only meaningful when same_host_only).
  bool fallback_tcp = true;
  // UCP RMA/atomics on memory from AllocateRegistered (option native_rma).
  bool native_rma = true;
  size_t max_registrations = 4096;
  // User sends beyond what the peer has reported consumed wait on the
  // sender's side (option flow_window; 0: no flow control). Checked in
  // LoadSettings: 0, or 4 to 1000000.
  uint32_t flow_window = 1024;
  // Option threads=serialized: the application calls into the fabric (its
  // CQs, endpoints, listeners, registrations) from one thread at a time, as
  // UCX's UCS_THREAD_MODE_SERIALIZED asks, and zsock takes no worker lock.
  // threads=multi (the default): any thread, any time.
  bool serialized = false;
  absl::Duration connect_timeout = absl::Seconds(10);
  // ucp_config_modify(key, value) pairs from ?UCX_...= options, in order.
  std::vector<std::pair<std::string, std::string>> ucx_options;
  // The options as the user wrote them ("UCX_RNDV_THRESH=8k"), for notes.
  std::vector<std::string> ucx_options_text;
};

absl::StatusOr<Settings> LoadSettings(const FabricSpec& spec);

// Transport names UCX reports on this host (from its components), lower case.
const std::vector<std::string>& AvailableTransports();

// What a UCX print function (ucp_context_print_info, ...) writes, as a string.
std::string CaptureOutput(absl::FunctionRef<void(FILE*)> fn);

}  // namespace zsock::ucx

#endif  // ZSOCK_PROVIDERS_UCX_OPTIONS_H_
