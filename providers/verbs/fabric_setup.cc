// Opening a verbs fabric (VerbsFabric::Setup, fabric.h): fork protection,
// the device list, the device and port the settings select, the local IP
// address rdma_cm binds to, the protection domain, the shared receive
// queue, and the capabilities the fabric reports.
#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "providers/verbs/cm.h"
#include "providers/verbs/engine.h"
#include "providers/verbs/fabric.h"

namespace zsock::verbs {
namespace {

constexpr size_t kMaxMessage = Engine::kMaxMessage;

// Whether this kernel can have any RDMA device at all (for the no-device
// message): the class directory and the rxe/siw modules.
std::string KernelNote() {
  utsname u{};
  ::uname(&u);
  bool has_class = ::access("/sys/class/infiniband", F_OK) == 0;
  bool rxe = ::access("/sys/module/rdma_rxe", F_OK) == 0 ||
             ::access(absl::StrCat("/lib/modules/", u.release, "/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko").c_str(), F_OK) == 0 ||
             ::access(absl::StrCat("/lib/modules/", u.release, "/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko.xz").c_str(), F_OK) == 0;
  return absl::StrCat(has_class ? "" : "no /sys/class/infiniband; ", "kernel ", u.release,
                      rxe ? " has the rdma_rxe module" : " has no rdma_rxe module (Soft-RoCE unavailable)");
}

// IPv4 addresses of the network interfaces that belong to an RDMA device
// (IPoIB or the RoCE netdev), from sysfs.
std::vector<std::string> NetdevAddresses(const std::string& dev) {
  std::vector<std::string> names;
  std::string dir = absl::StrCat("/sys/class/infiniband/", dev, "/device/net");
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') names.emplace_back(e->d_name);
    }
    ::closedir(d);
  }
  std::vector<std::string> out;
  ifaddrs* ifs = nullptr;
  if (names.empty() || ::getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if (std::find(names.begin(), names.end(), i->ifa_name) == names.end()) continue;
    char buf[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof(buf));
    out.emplace_back(buf);
  }
  ::freeifaddrs(ifs);
  return out;
}

// One device's ports, as plain data for SelectDevice.
DeviceDesc DescribeDevice(ibv_context* dev) {
  DeviceDesc d;
  d.name = ibv_get_device_name(dev->device);
  ibv_device_attr attr{};
  if (ibv_query_device(dev, &attr) == 0) {
    for (int p = 1; p <= attr.phys_port_cnt; ++p) {
      ibv_port_attr pa{};
      if (ibv_query_port(dev, static_cast<uint8_t>(p), &pa) != 0) continue;
      PortDesc pd;
      pd.num = p;
      pd.active = pa.state == IBV_PORT_ACTIVE;
      pd.state = ibv_port_state_str(pa.state);
      pd.link_layer = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand";
      pd.max_msg_sz = pa.max_msg_sz;
      pd.gid_count = pa.gid_tbl_len;
      d.ports.push_back(pd);
    }
  }
  return d;
}

}  // namespace

absl::Status VerbsFabric::Setup(const FabricSpec& spec) {
  auto settings = ParseSettings(spec);
  if (!settings.ok()) return settings.status();
  settings_ = *settings;
  local_keys_ = std::make_unique<LocalKeyTable>(settings_.max_registrations);
  if (auto st = InitFork(); !st.ok()) return st;
  auto descs = OpenDevices();
  if (!descs.ok()) return descs.status();
  const PortDesc* port = nullptr;
  if (auto st = ChoosePort(*descs, &port); !st.ok()) return st;
  if (auto st = ChooseLocalIp(*port); !st.ok()) return st;

  pd_ = ibv_alloc_pd(ctx_);
  if (pd_ == nullptr) return VerbsErrno(errno, "ibv_alloc_pd");
  registrar_ = IbvRegistrar(pd_);
  atomics_native_ = dev_attr_.atomic_cap == IBV_ATOMIC_HCA || dev_attr_.atomic_cap == IBV_ATOMIC_GLOB;
  // Depths within what the device allows.
  settings_.sq_depth = std::min(settings_.sq_depth, dev_attr_.max_qp_wr);
  settings_.recv_depth = std::min(settings_.recv_depth, dev_attr_.max_qp_wr - 1);
  std::random_device rd;
  id_ = (uint64_t{rd()} << 32) | rd();

  if (settings_.srq) {
    if (auto st = CreateSrq(); !st.ok()) return st;
  }
  DescribeCaps(*port);
  return absl::OkStatus();
}

absl::Status VerbsFabric::InitFork() {
  // Fork rule (docs/verbs.md): ibv_fork_init must precede every other verbs
  // call; it makes registered pages MADV_DONTFORK so a child's copy-on-write
  // never moves pages under the HCA. Kernels with copy-on-fork for pinned
  // pages (5.13+) make it unneeded.
  if (settings_.fork && ibv_is_fork_initialized() == IBV_FORK_DISABLED) {
    if (int rc = ibv_fork_init(); rc != 0) {
      // EINVAL: memory was registered before (another RDMA user in this
      // process, e.g. libfabric's or UCX's verbs transport).
      return ErrnoError(rc, "ibv_fork_init (fork protection for registered memory)",
                        "set RDMAV_FORK_SAFE=1 in the environment (libibverbs then enables it "
                        "at its first use), or open the verbs fabric before other RDMA users in "
                        "this process, or set fork=off and never touch registered memory in a "
                        "forked child");
    }
  }
  return absl::OkStatus();
}

// The devices librdmacm opened (devices_), described; NoDeviceError (with
// what this kernel could have) when there are none.
absl::StatusOr<std::vector<DeviceDesc>> VerbsFabric::OpenDevices() {
  int num = 0;
  ibv_device** list = ibv_get_device_list(&num);
  if (list == nullptr) {
    int err = errno;
    return NoDeviceError(absl::StrCat("ibv_get_device_list: ", std::strerror(err), "; ", KernelNote()));
  }
  std::vector<std::string> ibv_names;
  for (int i = 0; i < num; ++i) ibv_names.emplace_back(ibv_get_device_name(list[i]));
  ibv_free_device_list(list);
  if (num == 0) return NoDeviceError(absl::StrCat("ibv_get_device_list is empty; ", KernelNote()));

  // librdmacm's contexts: QPs for rdma_cm ids must use their PDs.
  devices_ = rdma_get_devices(&num);
  if (devices_ == nullptr || num == 0) {
    return NoDeviceError(absl::StrCat("rdma_get_devices found none of ", absl::StrJoin(ibv_names, ", "),
                                      ": is the rdma_ucm module loaded (/dev/infiniband/rdma_cm)?"));
  }
  std::vector<DeviceDesc> descs;
  for (int i = 0; i < num; ++i) descs.push_back(DescribeDevice(devices_[i]));
  return descs;
}

// The device and port the settings select (*port points into `descs`).
absl::Status VerbsFabric::ChoosePort(const std::vector<DeviceDesc>& descs, const PortDesc** port) {
  auto sel = SelectDevice(settings_, descs);
  if (!sel.ok()) return sel.status();
  ctx_ = devices_[sel->device];
  port_ = sel->port;
  device_name_ = descs[sel->device].name;
  *port = nullptr;
  for (const auto& p : descs[sel->device].ports) {
    if (p.num == port_) *port = &p;
  }
  max_msg_sz_ = (*port)->max_msg_sz == 0 ? (1u << 30) : (*port)->max_msg_sz;
  if (ibv_query_device(ctx_, &dev_attr_) != 0) return VerbsErrno(errno, "ibv_query_device");
  return absl::OkStatus();
}

absl::Status VerbsFabric::ChooseLocalIp(const PortDesc& port) {
  // The local IP address rdma_cm binds to: the GID's (RoCE), else the
  // device's netdev's (IPoIB).
  std::vector<std::string> candidates;
  for (int g = 0; g < port.gid_count; ++g) {
    if (settings_.gid_index >= 0 && g != settings_.gid_index) continue;
    ibv_gid gid{};
    if (ibv_query_gid(ctx_, static_cast<uint8_t>(port_), g, &gid) != 0) continue;
    auto a = GidToAddress(gid.raw);
    if (!a.has_value()) continue;
    if (a->find(':') == std::string::npos) {
      candidates.insert(candidates.begin(), *a);  // IPv4 first
    } else if (port.link_layer == "Ethernet" && a->rfind("fe80", 0) != 0) {
      candidates.push_back(*a);
    }
  }
  for (const auto& a : NetdevAddresses(device_name_)) candidates.push_back(a);
  if (candidates.empty()) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EADDRNOTAVAIL,
                     absl::StrCat("RDMA device ", device_name_, " port ", port_,
                                  " has no IP address for rdma_cm",
                                  settings_.gid_index >= 0 ? absl::StrCat(" at GID index ", settings_.gid_index) : ""),
                     "configure an address on its network interface (IPoIB: `ip addr add "
                     "10.0.0.1/24 dev ib0`; RoCE: on the Ethernet netdev)");
  }
  local_ip_ = candidates.front();
  return absl::OkStatus();
}

absl::Status VerbsFabric::CreateSrq() {
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = static_cast<uint32_t>(std::min(settings_.recv_depth, dev_attr_.max_srq_wr));
  sa.attr.max_sge = 1;
  srq_ = ibv_create_srq(pd_, &sa);
  if (srq_ == nullptr) {
    return VerbsErrno(errno, "ibv_create_srq", "the device may lack SRQ support: use srq=off");
  }
  if (auto st = srq_slab_.Init(
          settings_.eager_size, sa.attr.max_wr,
          [&](void* addr, size_t len) { return RegisterMemory(addr, len, kLocalWrite); });
      !st.ok()) {
    return st;
  }
  for (size_t i = 0; i < srq_slab_.count(); ++i) RepostSrq(i);
  return absl::OkStatus();
}

void VerbsFabric::DescribeCaps(const PortDesc& port) {
  Capabilities& c = caps_;
  c.provider = "verbs";
  c.spec = absl::StrCat(device_name_, " port ", port_, " (", port.link_layer, ", ", local_ip_, ")");
  c.send_recv = Support::kNative;
  c.rdma_read = Support::kNative;
  c.rdma_write = Support::kNative;
  c.atomics = atomics_native_ ? Support::kNative : Support::kEmulated;
  c.atomics_allocated = c.atomics;
  c.max_msg_size = kMaxMessage;
  c.max_rma_size = max_msg_sz_;
  c.inline_size = settings_.inline_size > kHeaderSize ? settings_.inline_size - kHeaderSize : 0;
  c.registration_required = false;
  c.peer_on_host = false;
  c.wait_fd = true;
  c.notes.push_back(absl::StrCat("rdma-core RC QPs via librdmacm on ", device_name_, " (fw ",
                                 dev_attr_.fw_ver, "), addresses IP:PORT on ", local_ip_));
  c.notes.push_back(absl::StrCat("messages up to ", settings_.eager_size - kHeaderSize,
                                 " B are copied (eager), larger ones are RDMA-read by the receiver; "
                                 "unregistered buffers go through the pin-down cache"));
  if (!atomics_native_) {
    c.notes.push_back("atomics emulated: the device reports no IBV_ATOMIC_HCA/GLOB");
  } else if (dev_attr_.atomic_cap == IBV_ATOMIC_HCA) {
    c.notes.push_back("atomics are atomic among HCA operations only, not against CPU atomics on the target");
  }
  if (srq_) c.notes.push_back("receives from one shared receive queue (srq=on); flow control by RNR retry");
  ibv_fork_status fs = ibv_is_fork_initialized();
  c.notes.push_back(fs == IBV_FORK_UNNEEDED ? "fork: the kernel keeps registered pages across fork"
                    : fs == IBV_FORK_ENABLED ? "fork: ibv_fork_init is in effect (registered pages are not inherited)"
                                             : "fork: not protected (fork=off): children must not touch registered memory");
}

}  // namespace zsock::verbs
