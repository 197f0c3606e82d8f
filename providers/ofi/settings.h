// Settings: what an ofi configuration string asks for (the provider name,
// and the options iface, mr_local, cq_wait, backstop_ms, flow_window and
// FI_* parameters), and the fi_getinfo hints built from it. LoadSettings
// refuses a bad option with the values it takes; NoProvider says why
// fi_getinfo matched nothing and what this host offers instead.
#ifndef ZSOCK_PROVIDERS_OFI_SETTINGS_H_
#define ZSOCK_PROVIDERS_OFI_SETTINGS_H_

#include <rdma/fabric.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/provider.h"

namespace zsock::ofi {

inline constexpr uint32_t kFiVersion = FI_VERSION(1, 17);

// cq_wait=sockets and cq_wait=fd: the longest sleep of the backstop timer
// unless backstop_ms says otherwise.
inline constexpr int64_t kMaxBackstopNs = 64 * 1000 * 1000;

// User sends an endpoint over rxm hands to libfabric beyond what the peer
// has reported consumed (option flow_window; 0: no limit). rxm keeps every
// message that arrives before its receive is posted in a bounce buffer of
// FI_OFI_RXM_BUFFER_SIZE bytes and never pushes back, so a sender that
// outruns its peer grows the peer's memory without bound (measured: to the
// OOM killer). With the window the peer holds at most this many such
// buffers, and later sends wait in the sender's backlog, as sends that met
// EAGAIN do.
inline constexpr size_t kDefaultFlowWindow = 1024;

// Every mr_mode bit zsock honours (FI_MR_ENDPOINT is not among them: it
// binds a registration to one endpoint, and a zsock registration serves
// every endpoint of its fabric).
inline constexpr int kMrModes =
    FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_RAW;

struct Settings {
  std::string prov;       // prov_name for hints ("" = any)
  std::string iface;      // domain name ("" = libfabric's first choice)
  bool mr_local = false;  // behave as if the provider demanded FI_MR_LOCAL
  // How a blocked wait learns of completions (option cq_wait):
  //  kFd: the fi CQs' FI_WAIT_FD objects, with fi_trywait;
  //  kNone: no wait object (FI_WAIT_NONE), as MPI libraries open CQs for
  //    busy polling; blocking waits use the timer;
  //  kSockets: no wait object, and the TCP sockets of the endpoints
  //    themselves in the wait set (connected endpoints of libfabric tcp);
  //  kAuto: kSockets for libfabric tcp's connected endpoints, else kFd.
  enum class CqWait { kAuto, kFd, kNone, kSockets };
  CqWait cq_wait = CqWait::kAuto;
  // kSockets and kFd: the longest sleep of the backstop timer (option
  // backstop_ms; 0: no timer, sleep until a socket or the wake fd says so).
  int64_t backstop_ns = kMaxBackstopNs;
  bool backstop_set = false;
  size_t flow_window = kDefaultFlowWindow;  // option flow_window (rxm only)
  absl::Duration connect_timeout;
};

// Parses `spec` (its provider name and options) and sets zsock's defaults
// for libfabric's rxm parameters in the environment, where nothing set them.
absl::StatusOr<Settings> LoadSettings(const FabricSpec& spec);

// fi_getinfo hints for endpoints of `type` with `caps`, accepting `mr_mode`
// (the caller frees them with fi_freeinfo).
fi_info* MakeHints(const Settings& s, fi_ep_type type, uint64_t caps, int mr_mode);

// The error for a configuration fi_getinfo does not match (it returned
// `rc`), saying why: no such provider, not available here, or no endpoint
// of that type, domain or registration mode.
absl::Status NoProvider(const Settings& s, fi_ep_type type, uint64_t caps, int rc);

// Core providers whose endpoints are connected (FI_EP_MSG); `ofi:tcp` and
// `ofi:verbs` use them directly, `ofi:tcp;ofi_rxm` through rxm's RDM layer.
inline bool IsMsgProvider(absl::string_view prov) { return prov == "tcp" || prov == "verbs"; }

}  // namespace zsock::ofi

#endif  // ZSOCK_PROVIDERS_OFI_SETTINGS_H_
