// Device-independent parts of the verbs provider (see verbs_core.h).
#include "providers/verbs/verbs_core.h"

#include <arpa/inet.h>
#include <sched.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/config.h"
#include "core/mutex.h"
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

void PutU16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
void PutU32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
void PutU64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint16_t GetU16(const uint8_t* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
uint32_t GetU32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
uint64_t GetU64(const uint8_t* p) { uint64_t v; std::memcpy(&v, p, 8); return v; }

}  // namespace

// ------------------------------------------------------------ settings

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
    if (k == "port") {
      auto n = Number(k, v, 1, 255);
      if (!n.ok()) return n.status();
      s.port = static_cast<int>(*n);
    } else if (k == "gid_index") {
      auto n = Number(k, v, 0, 65535);
      if (!n.ok()) return n.status();
      s.gid_index = static_cast<int>(*n);
    } else if (k == "inline") {
      auto n = Number(k, v, 0, 4096);
      if (!n.ok()) return n.status();
      s.inline_size = static_cast<size_t>(*n);
    } else if (k == "srq") {
      auto b = OnOff(k, v);
      if (!b.ok()) return b.status();
      s.srq = *b;
    } else if (k == "cq_depth") {
      auto n = Number(k, v, 16, 1 << 22);
      if (!n.ok()) return n.status();
      s.cq_depth = static_cast<int>(*n);
    } else if (k == "sq_depth") {
      auto n = Number(k, v, 4, 1 << 16);
      if (!n.ok()) return n.status();
      s.sq_depth = static_cast<int>(*n);
    } else if (k == "recv_depth") {
      auto n = Number(k, v, 4, 1 << 16);
      if (!n.ok()) return n.status();
      s.recv_depth = static_cast<int>(*n);
    } else if (k == "eager") {
      auto n = Number(k, v, 256, 1 << 20);
      if (!n.ok()) return n.status();
      s.eager_size = static_cast<size_t>(*n);
    } else if (k == "rnr_retry") {
      auto n = Number(k, v, 0, 7);
      if (!n.ok()) return n.status();
      s.rnr_retry = static_cast<int>(*n);
    } else if (k == "retry_count") {
      auto n = Number(k, v, 0, 7);
      if (!n.ok()) return n.status();
      s.retry_count = static_cast<int>(*n);
    } else if (k == "fork") {
      auto b = OnOff(k, v);
      if (!b.ok()) return b.status();
      s.fork = *b;
    } else if (k == "connect_timeout_ms") {
      auto n = Number(k, v, 1, 3600 * 1000);
      if (!n.ok()) return n.status();
      s.connect_timeout_ms = static_cast<int>(*n);
    } else {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       absl::StrCat("unknown verbs option '", k, "'"),
                       "verbs accepts port, gid_index, inline, srq, cq_depth, sq_depth, "
                       "recv_depth, eager, rnr_retry, retry_count, fork, connect_timeout_ms "
                       "(docs/verbs.md)");
    }
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
  std::vector<std::string> names;
  for (const auto& d : devices) {
    std::vector<std::string> ports;
    for (const auto& p : d.ports) ports.push_back(absl::StrCat(p.num, " ", p.state));
    names.push_back(absl::StrCat(d.name, " (ports: ", ports.empty() ? "none" : absl::StrJoin(ports, ", "), ")"));
  }
  const std::string found = absl::StrJoin(names, "; ");
  auto pick_port = [&](size_t i) -> absl::StatusOr<Selection> {
    const DeviceDesc& d = devices[i];
    if (s.port != 0) {
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
    for (const auto& p : d.ports) {
      if (!p.active) continue;
      if (s.gid_index >= 0 && s.gid_index >= p.gid_count) continue;
      return Selection{i, p.num};
    }
    return MakeError(absl::StatusCode::kUnavailable, ENETDOWN,
                     absl::StrCat("RDMA device ", d.name, " has no active port",
                                  s.gid_index >= 0 ? absl::StrCat(" with GID index ", s.gid_index) : ""),
                     absl::StrCat("bring a link up (`rdma link`, `ibstat`); found: ", found));
  };
  if (!s.device.empty()) {
    for (size_t i = 0; i < devices.size(); ++i) {
      if (devices[i].name == s.device) return pick_port(i);
    }
    return MakeError(absl::StatusCode::kNotFound, ENODEV,
                     absl::StrCat("RDMA device '", s.device, "' not found"),
                     absl::StrCat("use one of the devices found: ", found));
  }
  absl::Status first_error;
  for (size_t i = 0; i < devices.size(); ++i) {
    auto sel = pick_port(i);
    if (sel.ok()) return sel;
    if (first_error.ok()) first_error = sel.status();
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

// ------------------------------------------------------------ access

int AccessToIbv(uint32_t access) {
  int f = 0;
  // Every region may be a local buffer for sends (always allowed) and for
  // receives / read targets / atomic results (LOCAL_WRITE).
  if (access & (kLocalWrite | kRemoteWrite | kRemoteAtomic)) f |= IBV_ACCESS_LOCAL_WRITE;
  if (access & kRemoteRead) f |= IBV_ACCESS_REMOTE_READ;
  if (access & kRemoteWrite) f |= IBV_ACCESS_REMOTE_WRITE;
  if (access & kRemoteAtomic) f |= IBV_ACCESS_REMOTE_ATOMIC;
  return f;
}

// ------------------------------------------------------------ remote keys

std::vector<uint8_t> EncodeKeyBlob(uint32_t rkey) {
  std::vector<uint8_t> b(kKeyBlobSize, 0);
  b[0] = kKeyBlobVersion;
  PutU32(b.data() + 4, rkey);
  return b;
}

absl::StatusOr<uint32_t> DecodeKeyBlob(const std::vector<uint8_t>& blob) {
  if (blob.size() != kKeyBlobSize || blob[0] != kKeyBlobVersion || blob[1] != 0 || blob[2] != 0 ||
      blob[3] != 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("remote key blob of ", blob.size(),
                                  " bytes is not a verbs key (version 1, 8 bytes)"),
                     "pass the key a verbs fabric's registration produced, unchanged");
  }
  return GetU32(blob.data() + 4);
}

absl::StatusOr<uint32_t> CheckRemote(const RemoteKey& key, uint64_t remote_addr, size_t len,
                                     uint32_t need, bool atomic) {
  auto rkey = DecodeKeyBlob(key.blob);
  if (!rkey.ok()) return rkey.status();
  if (atomic && remote_addr % 8 != 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("atomic on remote address 0x", absl::Hex(remote_addr),
                                  ", which is not 8-byte aligned"),
                     "verbs atomics operate on naturally aligned 8-byte words");
  }
  if (remote_addr < key.addr || len > key.length || remote_addr - key.addr > key.length - len) {
    return MakeError(absl::StatusCode::kOutOfRange, EFAULT,
                     absl::StrCat("remote range [0x", absl::Hex(remote_addr), ", +", len,
                                  ") is outside the key's region [0x", absl::Hex(key.addr), ", +",
                                  key.length, ")"),
                     "access only inside the registered region the key names");
  }
  if ((key.access & need) != need) {
    return MakeError(absl::StatusCode::kPermissionDenied, EACCES,
                     absl::StrCat("the remote key does not grant ",
                                  need == kRemoteRead ? "remote read" : need == kRemoteWrite ? "remote write" : "remote atomics"),
                     "register the target memory with that access");
  }
  return *rkey;
}

// ------------------------------------------------------------ work requests

absl::Status BuildSendWr(const WorkRequest& in, uint32_t max_inline, uint32_t max_len,
                         ibv_send_wr* wr, ibv_sge* sge) {
  std::memset(wr, 0, sizeof(*wr));
  std::memset(sge, 0, sizeof(*sge));
  wr->wr_id = in.wr_id;
  wr->next = nullptr;
  wr->send_flags = in.signaled ? IBV_SEND_SIGNALED : 0;
  sge->addr = in.local_addr;
  sge->length = in.length;
  sge->lkey = in.lkey;
  wr->sg_list = sge;
  wr->num_sge = 1;
  const bool atomic = in.kind == WrKind::kFetchAdd || in.kind == WrKind::kCompareSwap;
  if (atomic) {
    if (in.length != 8) {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       absl::StrCat("atomic with a ", in.length, "-byte local buffer"),
                       "verbs atomics return exactly 8 bytes");
    }
    if (in.remote_addr % 8 != 0) {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       absl::StrCat("atomic on remote address 0x", absl::Hex(in.remote_addr),
                                    ", which is not 8-byte aligned"),
                       "verbs atomics operate on naturally aligned 8-byte words");
    }
  } else if (in.length > max_len) {
    return MakeError(absl::StatusCode::kInvalidArgument, EMSGSIZE,
                     absl::StrCat("work request of ", in.length, " bytes exceeds the port's max_msg_sz ",
                                  max_len),
                     "split the transfer");
  }
  if (in.length == 0) {
    // A zero-length SGE list: some HCAs reject length-0 SGEs.
    wr->num_sge = 0;
    wr->sg_list = nullptr;
  }
  switch (in.kind) {
    case WrKind::kSend:
      wr->opcode = IBV_WR_SEND;
      break;
    case WrKind::kRdmaWrite:
      wr->opcode = IBV_WR_RDMA_WRITE;
      break;
    case WrKind::kRdmaRead:
      wr->opcode = IBV_WR_RDMA_READ;
      break;
    case WrKind::kFetchAdd:
      wr->opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
      break;
    case WrKind::kCompareSwap:
      wr->opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
      break;
  }
  if (in.kind == WrKind::kRdmaWrite || in.kind == WrKind::kRdmaRead) {
    wr->wr.rdma.remote_addr = in.remote_addr;
    wr->wr.rdma.rkey = in.rkey;
  } else if (atomic) {
    wr->wr.atomic.remote_addr = in.remote_addr;
    wr->wr.atomic.rkey = in.rkey;
    wr->wr.atomic.compare_add = in.compare_add;
    wr->wr.atomic.swap = in.kind == WrKind::kCompareSwap ? in.swap : 0;
  }
  if ((in.kind == WrKind::kSend || in.kind == WrKind::kRdmaWrite) && in.length > 0 &&
      in.length <= max_inline) {
    wr->send_flags |= IBV_SEND_INLINE;
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------ completions

absl::Status WcError(ibv_wc_status status, uint32_t vendor_err, absl::string_view op) {
  absl::StatusCode code = absl::StatusCode::kAborted;
  int err = EIO;
  const char* means = "";
  const char* fix = "";
  switch (status) {
    case IBV_WC_SUCCESS:
      return absl::OkStatus();
    case IBV_WC_LOC_LEN_ERR:
      code = absl::StatusCode::kOutOfRange;
      err = EMSGSIZE;
      means = "a message was longer than the receive buffer it landed in";
      fix = "post receives as large as the largest message";
      break;
    case IBV_WC_LOC_QP_OP_ERR:
      code = absl::StatusCode::kInternal;
      err = EINVAL;
      means = "the work request was inconsistent with the QP (bad opcode, too many SGEs, "
              "inline data above max_inline_data)";
      fix = "this is a zsock bug: report it with the log";
      break;
    case IBV_WC_LOC_PROT_ERR:
      code = absl::StatusCode::kPermissionDenied;
      err = EFAULT;
      means = "a local buffer was not covered by the registration (lkey) it named, or the "
              "registration was released while the operation was in flight";
      fix = "keep buffers registered (and mapped) until their operation completes";
      break;
    case IBV_WC_WR_FLUSH_ERR:
      code = absl::StatusCode::kAborted;
      err = ECONNRESET;
      means = "the queue pair had already failed or was closed, so this request was flushed";
      fix = "an earlier completion on this connection carries the real error; reconnect";
      break;
    case IBV_WC_MW_BIND_ERR:
      code = absl::StatusCode::kInternal;
      err = EINVAL;
      means = "a memory window bind failed";
      fix = "zsock binds no memory windows: report it";
      break;
    case IBV_WC_BAD_RESP_ERR:
      err = EPROTO;
      means = "the responder sent an unexpected transport response";
      fix = "check firmware versions on both sides";
      break;
    case IBV_WC_LOC_ACCESS_ERR:
      code = absl::StatusCode::kPermissionDenied;
      err = EFAULT;
      means = "a local buffer lacked the access it needs (a read or atomic result needs "
              "LOCAL_WRITE)";
      fix = "register local buffers with kLocalWrite";
      break;
    case IBV_WC_REM_INV_REQ_ERR:
      code = absl::StatusCode::kInvalidArgument;
      err = EREMOTEIO;
      means = "the peer found the request invalid: a message longer than its receive buffer, "
              "an operation its QP does not allow, or a misaligned atomic";
      fix = "check sizes against the peer's receive buffers and the remote QP's access";
      break;
    case IBV_WC_REM_ACCESS_ERR:
      code = absl::StatusCode::kPermissionDenied;
      err = EACCES;
      means = "the target refused the access: the rkey is wrong or revoked, the range is "
              "outside its registration, or the registration lacks the access flags";
      fix = "use a live key from the peer and stay inside its range and rights";
      break;
    case IBV_WC_REM_OP_ERR:
      err = EREMOTEIO;
      means = "the peer could not complete the operation (its receive queue or memory failed)";
      fix = "check the peer's log";
      break;
    case IBV_WC_RETRY_EXC_ERR:
      err = ECONNRESET;
      means = "the transport retry count was exceeded: the peer is dead or unreachable "
              "(process killed, host down, link or switch lost)";
      fix = "check the peer and the fabric (`ibstat`, `rdma link`), then reconnect";
      break;
    case IBV_WC_RNR_RETRY_EXC_ERR:
      err = ENOBUFS;
      means = "receiver not ready: the peer had no receive buffer posted and the RNR retries "
              "ran out";
      fix = "keep rnr_retry=7 (retry forever) or post receives sooner";
      break;
    case IBV_WC_REM_ABORT_ERR:
      err = ECONNRESET;
      means = "the peer aborted the operation";
      fix = "check the peer's log";
      break;
    case IBV_WC_RESP_TIMEOUT_ERR:
      err = ETIMEDOUT;
      means = "the responder did not answer in time";
      fix = "check the peer and the fabric";
      break;
    case IBV_WC_FATAL_ERR:
      code = absl::StatusCode::kInternal;
      err = EIO;
      means = "the device hit a fatal error";
      fix = "check `dmesg`; the HCA may need a reset";
      break;
    default:
      err = EIO;
      means = "the device reported an error";
      fix = "check `dmesg` and the vendor error code";
      break;
  }
  return MakeError(code, err,
                   absl::StrCat("verbs ", op, " failed: ", ibv_wc_status_str(status), " (status ",
                                static_cast<int>(status), ", vendor error 0x", absl::Hex(vendor_err),
                                "): ", means),
                   fix);
}

// ------------------------------------------------------------ private data

std::string EncodeHello(const Hello& h) {
  std::string out(Hello::kSize, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  PutU32(p, Hello::kMagic);
  p[4] = Hello::kVersion;
  p[5] = h.flags;
  PutU16(p + 6, static_cast<uint16_t>(Hello::kSize));
  PutU32(p + 8, h.credits);
  PutU32(p + 12, h.eager_size);
  PutU32(p + 16, h.max_inline);
  PutU64(p + 24, h.fabric_id);
  return out;
}

absl::StatusOr<Hello> DecodeHello(const void* bytes, size_t len) {
  auto bad = [](absl::string_view why) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO,
                     absl::StrCat("the peer's connection private data is not a zsock verbs hello: ",
                                  why),
                     "connect zsock verbs endpoints of the same version to each other");
  };
  if (bytes == nullptr || len < Hello::kSize) {
    return bad(absl::StrCat(len, " bytes, need ", Hello::kSize));
  }
  const auto* p = static_cast<const uint8_t*>(bytes);
  if (GetU32(p) != Hello::kMagic) return bad("wrong magic");
  if (p[4] != Hello::kVersion) {
    return bad(absl::StrCat("version ", static_cast<int>(p[4]), ", this zsock speaks ",
                            static_cast<int>(Hello::kVersion)));
  }
  if (GetU16(p + 6) != Hello::kSize) return bad("wrong length field");
  Hello h;
  h.flags = p[5];
  if (h.flags & ~(kHelloSrq | kHelloAtomics)) return bad("unknown flags");
  h.credits = GetU32(p + 8);
  h.eager_size = GetU32(p + 12);
  h.max_inline = GetU32(p + 16);
  h.fabric_id = GetU64(p + 24);
  if (GetU32(p + 20) != 0) return bad("reserved bytes set");
  if (!(h.flags & kHelloSrq) && (h.credits == 0 || h.credits > (1u << 16))) {
    return bad(absl::StrCat("receive credits ", h.credits, " outside 1..65536"));
  }
  if (h.eager_size < 256 || h.eager_size > (1u << 20)) {
    return bad(absl::StrCat("receive buffer size ", h.eager_size, " outside 256..1 MiB"));
  }
  return h;
}

// ------------------------------------------------------------ framing

void EncodeHeader(const Header& h, uint8_t* out) {
  out[0] = static_cast<uint8_t>(h.type);
  out[1] = h.flags;
  PutU16(out + 2, h.credits);
  PutU32(out + 4, h.length);
  PutU64(out + 8, h.cookie);
  PutU64(out + 16, h.aux);
}

absl::StatusOr<Header> DecodeHeader(const uint8_t* in, size_t len, size_t eager_size) {
  auto bad = [&](absl::string_view why) {
    return MakeError(absl::StatusCode::kDataLoss, EPROTO,
                     absl::StrCat("malformed verbs message from the peer (", len, " bytes): ", why),
                     "the peer is not a compatible zsock verbs endpoint; the connection is closed");
  };
  if (len < kHeaderSize || len > eager_size) return bad("bad size");
  Header h;
  h.type = static_cast<MsgType>(in[0]);
  h.flags = in[1];
  h.credits = GetU16(in + 2);
  h.length = GetU32(in + 4);
  h.cookie = GetU64(in + 8);
  h.aux = GetU64(in + 16);
  if (h.flags & ~kMsgControl) return bad("unknown flags");
  switch (h.type) {
    case MsgType::kEager:
      if (h.length != len - kHeaderSize) return bad("payload length does not match");
      break;
    case MsgType::kRts:
      if (len != kHeaderSize + kRtsBodySize) return bad("rendezvous request size");
      break;
    case MsgType::kFin:
    case MsgType::kCredit:
    case MsgType::kClose:
      if (len != kHeaderSize || h.length != 0) return bad("control size");
      break;
    default:
      return bad(absl::StrCat("unknown type ", static_cast<int>(in[0])));
  }
  return h;
}

void EncodeRts(const RtsBody& r, uint8_t* out) {
  PutU64(out, r.addr);
  PutU64(out + 8, r.length);
  PutU32(out + 16, r.rkey);
}

RtsBody DecodeRts(const uint8_t* in) {
  RtsBody r;
  r.addr = GetU64(in);
  r.length = GetU64(in + 8);
  r.rkey = GetU32(in + 16);
  return r;
}

// ------------------------------------------------------------ matching

Match Matcher::Pair(PostedRecv r, Arrival m) {
  Match out;
  size_t len = m.rendezvous ? m.rts.length : m.data.size();
  out.truncated = len > r.len;
  out.recv = r;
  out.msg = std::move(m);
  return out;
}

std::optional<Match> Matcher::Arrive(Arrival msg) {
  if (recvs_.empty()) {
    messages_.push_back(std::move(msg));
    return std::nullopt;
  }
  PostedRecv r = recvs_.front();
  recvs_.pop_front();
  return Pair(r, std::move(msg));
}

std::optional<Match> Matcher::Post(PostedRecv recv) {
  if (messages_.empty()) {
    recvs_.push_back(recv);
    return std::nullopt;
  }
  Arrival m = std::move(messages_.front());
  messages_.pop_front();
  return Pair(recv, std::move(m));
}

std::deque<PostedRecv> Matcher::TakeRecvs() { return std::exchange(recvs_, {}); }
std::deque<Arrival> Matcher::TakeMessages() { return std::exchange(messages_, {}); }

bool Credits::Take() {
  if (available_ == kUnlimited) return true;
  if (available_ < 2) return false;
  --available_;
  return true;
}

bool Credits::TakeForUpdate() {
  if (available_ == kUnlimited || available_ == 0 || to_return_ < 2) return false;
  --available_;
  return true;
}

void Credits::Grant(uint32_t n) {
  if (available_ == kUnlimited) return;
  available_ += n;
}

bool Credits::Returned(uint32_t window) {
  ++to_return_;
  return to_return_ >= std::max<uint32_t>(1, window / 2);
}

uint16_t Credits::TakeReturn() {
  uint16_t n = static_cast<uint16_t>(std::min<uint32_t>(to_return_, UINT16_MAX));
  to_return_ -= n;
  return n;
}

// ------------------------------------------------------------ registrations

std::shared_ptr<RegTable::Entry> RegTable::Add(uint32_t rkey, uint64_t addr, uint64_t len,
                                               uint32_t access) {
  auto e = std::make_shared<Entry>();
  e->addr = addr;
  e->len = len;
  e->access = access;
  MutexLock lock(&mu_);
  by_rkey_[rkey] = e;
  return e;
}

void RegTable::Remove(uint32_t rkey, const Entry* entry) {
  std::shared_ptr<Entry> gone;
  MutexLock lock(&mu_);
  auto it = by_rkey_.find(rkey);
  if (it == by_rkey_.end() || it->second.get() != entry) return;
  gone = std::move(it->second);
  by_rkey_.erase(it);
}

absl::Status RegTable::Access(uint32_t rkey, uint64_t addr, size_t len, uint32_t access,
                              absl::FunctionRef<void(void*)> fn) {
  std::shared_ptr<Entry> e;
  {
    MutexLock lock(&mu_);
    auto it = by_rkey_.find(rkey);
    if (it != by_rkey_.end()) e = it->second;
  }
  if (e != nullptr && addr >= e->addr && len <= e->len && addr - e->addr <= e->len - len &&
      (e->access & access) == access) {
    e->active.fetch_add(1, std::memory_order_seq_cst);
    if (!e->revoked.load(std::memory_order_seq_cst)) {
      fn(reinterpret_cast<void*>(addr));
      e->active.fetch_sub(1, std::memory_order_seq_cst);
      return absl::OkStatus();
    }
    e->active.fetch_sub(1, std::memory_order_seq_cst);
  }
  return MakeError(absl::StatusCode::kPermissionDenied, EACCES,
                   absl::StrCat("remote access to [0x", absl::Hex(addr), ", +", len,
                                ") refused: no live registration with that key covers it with "
                                "the rights asked for"),
                   "use a key from a live registration and stay inside its range and rights");
}

void RegTable::Revoke(Entry* e) noexcept {
  e->revoked.store(true, std::memory_order_seq_cst);
  while (e->active.load(std::memory_order_seq_cst) != 0) sched_yield();
}

VerbsRegion::VerbsRegion(Registrar* registrar, RegTable* table, void* addr, size_t len,
                         uint32_t access, Registrar::Keys keys)
    : MemoryRegion(addr, len, access),
      registrar_(registrar),
      table_(table),
      handle_(keys.handle),
      lkey_(keys.lkey),
      rkey_(keys.rkey) {
  entry_ = table_->Add(rkey_, reinterpret_cast<uint64_t>(addr), len, access);
}

VerbsRegion::~VerbsRegion() {
  Revoke();
  table_->Remove(rkey_, entry_.get());
}

RemoteKey VerbsRegion::remote_key() const {
  RemoteKey k;
  k.addr = reinterpret_cast<uint64_t>(addr());
  k.length = length();
  k.access = access();
  k.blob = EncodeKeyBlob(rkey_);
  return k;
}

void VerbsRegion::Revoke() noexcept {
  void* h = handle_.exchange(nullptr);
  if (h == nullptr) return;
  RegTable::Revoke(entry_.get());
  registrar_->Deregister(h);
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(Registrar* registrar, RegTable* table,
                                                       void* addr, size_t len, uint32_t access) {
  if (addr == nullptr || len == 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     "cannot register an empty or null range", "register at least one byte");
  }
  auto keys = registrar->Register(addr, len, AccessToIbv(access));
  if (!keys.ok()) return keys.status();
  return std::unique_ptr<MemoryRegion>(new VerbsRegion(registrar, table, addr, len, access, *keys));
}

}  // namespace zsock::verbs
