// The verbs provider's configuration and where it runs: the config string
// `verbs[:DEVICE][?port=N&gid_index=N&...]` parsed and validated
// (ParseSettings), matched against the devices ibv_get_device_list found
// (SelectDevice, over plain DeviceDesc records), and the numeric addresses
// rdma_cm uses. All of it decided without a device, so unit-tested.
#ifndef ZSOCK_PROVIDERS_VERBS_SETTINGS_H_
#define ZSOCK_PROVIDERS_VERBS_SETTINGS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/provider.h"

namespace zsock::verbs {

struct Settings {
  std::string device;       // "" = the first device with an active port
  int port = 0;             // 0 = the first active port of the device
  int gid_index = -1;       // -1 = the first GID that carries an IP address
  size_t inline_size = 256; // requested max_inline_data (the device may cap it)
  bool srq = false;         // one shared receive queue per fabric
  int cq_depth = 0;         // 0 = sq_depth + recv_depth + 16 per endpoint
  int sq_depth = 256;       // send work requests in flight per endpoint
  int recv_depth = 128;     // receive buffers per endpoint (or SRQ size)
  size_t eager_size = 8192; // receive buffer size; larger messages use RDMA read
  int rnr_retry = 7;        // 7 = retry forever on receiver-not-ready
  int retry_count = 7;      // transport retries before RETRY_EXC_ERR
  bool fork = true;         // call ibv_fork_init (see docs/verbs.md)
  int connect_timeout_ms = 10000;
  // Live registrations the fabric's key table holds (slots are allocated
  // as registrations arrive, so a large limit costs little).
  uint32_t max_registrations = 1u << 20;
};

// Syntax and ranges only (no device needed). Unknown options are errors
// that list the accepted ones. `spec` is what follows "verbs:".
absl::StatusOr<Settings> ParseSettings(const FabricSpec& spec);

// What the provider learns about one device, as plain data.
struct PortDesc {
  int num = 0;                 // 1-based
  bool active = false;         // IBV_PORT_ACTIVE
  std::string state;           // "ACTIVE", "DOWN", ... (ibv_port_state_str)
  std::string link_layer;      // "InfiniBand", "Ethernet"
  uint32_t max_msg_sz = 0;
  int gid_count = 0;           // gid_tbl_len
};
struct DeviceDesc {
  std::string name;            // ibv_get_device_name: "mlx5_0", "rxe0"
  std::vector<PortDesc> ports;
};

struct Selection {
  size_t device = 0;           // index into the list
  int port = 0;
};

// Picks the device and port the settings name; errors list what exists.
// An empty list is NoDeviceError.
absl::StatusOr<Selection> SelectDevice(const Settings& s,
                                       const std::vector<DeviceDesc>& devices);

// Unavailable: no RDMA device found (`detail` says what was looked at), and
// how to get one (an HCA, or Soft-RoCE / soft-iWARP on a kernel with them).
absl::Status NoDeviceError(absl::string_view detail);

// The IP address a GID carries: an IPv4-mapped GID (::ffff:a.b.c.d, RoCE v2
// over IPv4) gives "a.b.c.d"; any other non-zero GID gives its IPv6 text;
// the zero GID gives nullopt.
std::optional<std::string> GidToAddress(const uint8_t gid[16]);

// "IP:PORT" / "[IPv6]:PORT" / "IP" (port 0) -> parts, numeric only.
struct HostPort {
  std::string host;
  uint16_t port = 0;
};
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address);
std::string FormatHostPort(absl::string_view host, uint16_t port);

}  // namespace zsock::verbs

#endif  // ZSOCK_PROVIDERS_VERBS_SETTINGS_H_
