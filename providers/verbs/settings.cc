// The verbs provider's settings, device selection and addresses (see
// settings.h).
#include "providers/verbs/settings.h"

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/config.h"
#include "core/status.h"

namespace zsock::verbs {
namespace {

absl::Status BadOption(absl::string_view key, absl::string_view value, absl::string_view want) {
  return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                   absl::StrCat("verbs option ", key, "=", value, " is invalid"),
                   absl::StrCat("write ", key, "=", want));
}

absl::StatusOr<int64_t> Number(absl::string_view key, absl::string_view value, int64_t min,
                               int64_t max) {
  int64_t v = 0;
  std::string lower = absl::AsciiStrToLower(value);
  int64_t mult = 1;
  absl::string_view digits = lower;
  if (!digits.empty() && (digits.back() == 'k' || digits.back() == 'm')) {
    mult = digits.back() == 'k' ? 1024 : 1024 * 1024;
    digits.remove_suffix(1);
  }
  if (!absl::SimpleAtoi(digits, &v) || v < 0 || v > max / mult || v * mult < min) {
    return BadOption(key, value, absl::StrCat("a number from ", min, " to ", max));
  }
  return v * mult;
}

absl::StatusOr<bool> OnOff(absl::string_view key, absl::string_view value) {
  std::string v = absl::AsciiStrToLower(value);
  if (v == "on" || v == "1" || v == "true" || v == "yes") return true;
  if (v == "off" || v == "0" || v == "false" || v == "no") return false;
  return BadOption(key, value, "on or off");
}

// Applies one `key=value` option to `s`; unknown keys are errors that list
// the accepted ones.
absl::Status ApplyOption(const std::string& k, const std::string& v, Settings* s) {
  auto number = [&](int64_t min, int64_t max, auto* out) -> absl::Status {
    auto n = Number(k, v, min, max);
    if (!n.ok()) return n.status();
    *out = static_cast<std::remove_pointer_t<decltype(out)>>(*n);
    return absl::OkStatus();
  };
  auto on_off = [&](bool* out) -> absl::Status {
    auto b = OnOff(k, v);
    if (!b.ok()) return b.status();
    *out = *b;
    return absl::OkStatus();
  };
  if (k == "port") return number(1, 255, &s->port);
  if (k == "gid_index") return number(0, 65535, &s->gid_index);
  if (k == "inline") return number(0, 4096, &s->inline_size);
  if (k == "srq") return on_off(&s->srq);
  if (k == "cq_depth") return number(16, 1 << 22, &s->cq_depth);
  if (k == "sq_depth") return number(4, 1 << 16, &s->sq_depth);
  if (k == "recv_depth") return number(4, 1 << 16, &s->recv_depth);
  if (k == "eager") return number(256, 1 << 20, &s->eager_size);
  if (k == "rnr_retry") return number(0, 7, &s->rnr_retry);
  if (k == "retry_count") return number(0, 7, &s->retry_count);
  if (k == "fork") return on_off(&s->fork);
  if (k == "connect_timeout_ms") return number(1, 3600 * 1000, &s->connect_timeout_ms);
  if (k == "max_registrations") return number(1, 1 << 24, &s->max_registrations);
  return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                   absl::StrCat("unknown verbs option '", k, "'"),
                   "verbs accepts port, gid_index, inline, srq, cq_depth, sq_depth, "
                   "recv_depth, eager, rnr_retry, retry_count, fork, connect_timeout_ms, "
                   "max_registrations (docs/verbs.md)");
}

// "mlx5_0 (ports: 1 DOWN, 2 ACTIVE); rxe0 (ports: 1 ACTIVE)", for errors.
std::string DevicesFound(const std::vector<DeviceDesc>& devices) {
  std::vector<std::string> names;
  for (const auto& d : devices) {
    std::vector<std::string> ports;
    for (const auto& p : d.ports) ports.push_back(absl::StrCat(p.num, " ", p.state));
    names.push_back(absl::StrCat(d.name, " (ports: ", ports.empty() ? "none" : absl::StrJoin(ports, ", "), ")"));
  }
  return absl::StrJoin(names, "; ");
}

// The port `s.port` of device `i`, which must be active and hold the GID
// index asked for.
absl::StatusOr<Selection> NamedPort(const Settings& s, const std::vector<DeviceDesc>& devices,
                                    size_t i, const std::string& found) {
  const DeviceDesc& d = devices[i];
  for (const auto& p : d.ports) {
    if (p.num != s.port) continue;
    if (!p.active) {
      return MakeError(absl::StatusCode::kUnavailable, ENETDOWN,
                       absl::StrCat("port ", s.port, " of RDMA device ", d.name, " is ", p.state),
                       "connect the cable / bring the link up (`ibstat`, `rdma link`), or pick "
                       "an active port");
    }
    if (s.gid_index >= 0 && s.gid_index >= p.gid_count) {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       absl::StrCat("gid_index=", s.gid_index, " is outside the GID table of ",
                                    d.name, " port ", p.num, " (", p.gid_count, " entries)"),
                       "list GIDs with `ibv_devinfo -v` or `show_gids`");
    }
    return Selection{i, p.num};
  }
  return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                   absl::StrCat("RDMA device ", d.name, " has no port ", s.port, " (it has ",
                                d.ports.size(), ")"),
                   absl::StrCat("ports are numbered from 1; found: ", found));
}

// The port of device `i` the settings ask for: `s.port`, or the first
// active one that holds the GID index asked for.
absl::StatusOr<Selection> PickPort(const Settings& s, const std::vector<DeviceDesc>& devices,
                                   size_t i, const std::string& found) {
  if (s.port != 0) return NamedPort(s, devices, i, found);
  const DeviceDesc& d = devices[i];
  for (const auto& p : d.ports) {
    if (!p.active) continue;
    if (s.gid_index >= 0 && s.gid_index >= p.gid_count) continue;
    return Selection{i, p.num};
  }
  return MakeError(absl::StatusCode::kUnavailable, ENETDOWN,
                   absl::StrCat("RDMA device ", d.name, " has no active port",
                                s.gid_index >= 0 ? absl::StrCat(" with GID index ", s.gid_index) : ""),
                   absl::StrCat("bring a link up (`rdma link`, `ibstat`); found: ", found));
}

}  // namespace

absl::StatusOr<Settings> ParseSettings(const FabricSpec& spec) {
  Settings s;
  if (const auto& global = Config::Global(); global.ok()) {
    s.connect_timeout_ms = static_cast<int>(global->GetInt("connect_timeout_ms"));
  }
  s.device = spec.spec;
  for (char c : s.device) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       absl::StrCat("'", s.device, "' is not an RDMA device name"),
                       "write verbs:DEVICE with a name from `ibv_devices` (e.g. verbs:mlx5_0)");
    }
  }
  for (const auto& [k, v] : spec.options) {
    if (auto st = ApplyOption(k, v, &s); !st.ok()) return st;
  }
  if (s.cq_depth != 0 && s.cq_depth < s.sq_depth + s.recv_depth + 1) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("verbs cq_depth=", s.cq_depth, " is below sq_depth + recv_depth + 1 = ",
                                  s.sq_depth + s.recv_depth + 1, ": the CQ would overrun"),
                     "raise cq_depth or lower sq_depth/recv_depth");
  }
  return s;
}

absl::Status NoDeviceError(absl::string_view detail) {
  return MakeError(
      absl::StatusCode::kUnavailable, ENODEV,
      absl::StrCat("no RDMA device found", detail.empty() ? "" : absl::StrCat(" (", detail, ")")),
      "verbs needs an RDMA device: an InfiniBand, RoCE or iWARP HCA with its kernel driver, or "
      "Soft-RoCE on a kernel with rdma_rxe (`modprobe rdma_rxe && rdma link add rxe0 type rxe "
      "netdev <if>`; soft-iWARP: `rdma link add siw0 type siw netdev <if>`); check with "
      "`ibv_devices` (this kernel may lack rxe/siw: then use the ofi, ucx or unet provider)");
}

absl::StatusOr<Selection> SelectDevice(const Settings& s, const std::vector<DeviceDesc>& devices) {
  if (devices.empty()) {
    return NoDeviceError("ibv_get_device_list is empty");
  }
  const std::string found = DevicesFound(devices);
  if (!s.device.empty()) {
    for (size_t i = 0; i < devices.size(); ++i) {
      if (devices[i].name == s.device) return PickPort(s, devices, i, found);
    }
    return MakeError(absl::StatusCode::kNotFound, ENODEV,
                     absl::StrCat("RDMA device '", s.device, "' not found"),
                     absl::StrCat("use one of the devices found: ", found));
  }
  for (size_t i = 0; i < devices.size(); ++i) {
    auto sel = PickPort(s, devices, i, found);
    if (sel.ok()) return sel;
  }
  return MakeError(absl::StatusCode::kUnavailable, ENETDOWN,
                   "no RDMA device has an active port",
                   absl::StrCat("bring a link up (`rdma link`, `ibstat`); found: ", found));
}

std::optional<std::string> GidToAddress(const uint8_t gid[16]) {
  static constexpr uint8_t kZero[16] = {};
  if (std::memcmp(gid, kZero, 16) == 0) return std::nullopt;
  static constexpr uint8_t kV4Mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  char buf[INET6_ADDRSTRLEN] = {};
  if (std::memcmp(gid, kV4Mapped, 12) == 0) {
    inet_ntop(AF_INET, gid + 12, buf, sizeof(buf));
  } else {
    inet_ntop(AF_INET6, gid, buf, sizeof(buf));
  }
  return std::string(buf);
}

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address) {
  HostPort hp;
  absl::string_view port;
  if (!address.empty() && address[0] == '[') {
    auto close = address.find(']');
    if (close == absl::string_view::npos) {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       absl::StrCat("bad verbs address '", address, "'"), "write IP:PORT or [IPv6]:PORT");
    }
    hp.host = std::string(address.substr(1, close - 1));
    if (close + 1 < address.size()) {
      if (address[close + 1] != ':') {
        return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                         absl::StrCat("bad verbs address '", address, "'"), "write [IPv6]:PORT");
      }
      port = address.substr(close + 2);
    }
  } else if (auto colon = address.find(':'); colon != absl::string_view::npos) {
    if (address.find(':', colon + 1) != absl::string_view::npos) {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       absl::StrCat("bad verbs address '", address, "'"),
                       "write IPv6 addresses in brackets: [fe80::1%ib0]:7471");
    }
    hp.host = std::string(address.substr(0, colon));
    port = address.substr(colon + 1);
  } else {
    hp.host = std::string(address);
  }
  unsigned char probe[sizeof(in6_addr)];
  std::string host_only = hp.host.substr(0, hp.host.find('%'));
  if (inet_pton(AF_INET, host_only.c_str(), probe) != 1 &&
      inet_pton(AF_INET6, host_only.c_str(), probe) != 1) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("bad verbs address '", address, "': '", hp.host,
                                  "' is not a numeric IP address"),
                     "write the IP address of the peer's RDMA interface (IPoIB or RoCE netdev), "
                     "e.g. 192.168.1.5:7471");
  }
  if (!port.empty()) {
    uint32_t p = 0;
    if (!absl::SimpleAtoi(port, &p) || p > 65535) {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       absl::StrCat("bad verbs address '", address, "': port '", port, "'"),
                       "ports are 0..65535");
    }
    hp.port = static_cast<uint16_t>(p);
  }
  return hp;
}

std::string FormatHostPort(absl::string_view host, uint16_t port) {
  if (host.find(':') != absl::string_view::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

}  // namespace zsock::verbs
