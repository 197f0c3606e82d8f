// unet's fabric (fabric.h): opening, capabilities, AccessLocal, listening
// and connecting, and the provider's registration.
#include "providers/unet/fabric.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/accept.h"
#include "core/keyslot.h"
#include "core/sockaddr.h"
#include "core/status.h"
#include "providers/unet/cq.h"

namespace zsock::unet {
namespace {

// What a unet fabric with settings `s` offers.
Capabilities CapsFor(const FabricSpec& spec, const Settings& s) {
  Capabilities caps;
  caps.provider = "unet";
  caps.spec = spec.ToString();
  caps.send_recv = Support::kNative;
  caps.rdma_read = s.cma ? Support::kNative : Support::kEmulated;
  caps.rdma_write = caps.rdma_read;
  caps.atomics = Support::kEmulated;
  caps.atomics_allocated = Support::kNative;
  caps.rma_allocated = Support::kNative;
  caps.max_msg_size = kMaxMessage;
  // Emulated (cma=off, or a peer that denies cross-memory attach), a
  // read's answer carries its data and headers in one message
  // (kEmulationHeadroom).
  caps.max_rma_size = kMaxMessage - kEmulationHeadroom;
  caps.inline_size = kInline;
  caps.inject_size = kInline;
  caps.registration_required = false;
  caps.peer_on_host = true;
  caps.wait_fd = true;
  if (s.cma) {
    caps.notes.push_back(
        "rdma read/write: process_vm_readv/writev (probed per connection; "
        "falls back to copying through the segment when denied)");
  } else {
    caps.notes.push_back("rdma read/write: copied through the segment (unet_cma=off)");
  }
  caps.notes.push_back(
      "rdma read/write of memory from AllocateRegistered: a copy through this process's "
      "mapping of the peer's shared segment (no kernel, no target progress)");
  caps.notes.push_back(
      "atomics: CPU atomics on memory from AllocateRegistered (a shared segment; no "
      "target progress needed), otherwise executed by the target's progress engine");
  return caps;
}

class UnetListener final : public Listener {
 public:
  UnetListener(UnetFabric* fabric, Fd sock, std::string address, Fd reservation)
      : fabric_(fabric),
        sock_(std::move(sock)),
        address_(std::move(address)),
        reservation_(std::move(reservation)) {}

  std::string address() const override { return address_; }
  int fd() const override { return sock_.get(); }

  absl::StatusOr<std::unique_ptr<Endpoint>> Accept(CompletionQueue* cq,
                                                   absl::Duration timeout) override {
    absl::Time deadline = absl::Now() + timeout;
    auto fd = AcceptUntil(sock_.get(), deadline, absl::StrCat("unet address '", address_, "'"));
    if (!fd.ok()) return fd.status();
    // Arrived: its set-up gets the connect timeout (Listener::Accept).
    absl::Duration hs = fabric_->settings().connect_timeout;
    return fabric_->Handshake(std::move(*fd), address_, "", cq, absl::Now() + hs);
  }

 private:
  UnetFabric* fabric_;
  Fd sock_;
  std::string address_;
  Fd reservation_;  // kernel TCP socket holding the port of an IP:PORT address
};

// The unet name behind a socket address: unet reaches only this host, so
// the port alone names the listener (the IP only has to be local).
std::string PortName(uint16_t port) { return absl::StrCat("port/", port); }

// Binds a kernel TCP socket to IP:PORT address `sa` (the sockets layer's
// form), reserving the port: port 0 gets a free one, and a port in use by
// kernel TCP or another zsock listener is refused the way bind(2) refuses
// it. Sets *name to the unet name and *shown to the bound address.
absl::StatusOr<Fd> ReservePort(absl::string_view address, const SocketAddress& sa,
                               std::string* name, std::string* shown) {
  Fd reservation(::socket(sa.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!reservation) return ErrnoError(errno, "socket() to reserve a unet port failed");
  if (::bind(reservation.get(), sa.get(), sa.len) != 0) {
    int err = errno;
    return ErrnoError(err, absl::StrCat("binding unet address ", address, " failed"),
                      err == EADDRINUSE      ? "the port is in use on this host; pick another"
                      : err == EADDRNOTAVAIL ? "use an address of this host (unet is host-local)"
                                             : "");
  }
  *shown = BoundAddress(reservation.get());
  auto bound = ParseSocketAddress(*shown);
  if (!bound.ok()) return bound.status();
  *name = PortName(bound->port());
  return reservation;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Fabric>> UnetFabric::Open(const FabricSpec& spec) {
  auto settings = LoadSettings(spec);
  if (!settings.ok()) return settings.status();
  size_t table_size = sizeof(KeySlot) * settings->key_slots;
  auto fd = CreateMemfd("zsock-unet-keys", table_size);
  if (!fd.ok()) return fd.status();
  auto map = MapFd(fd->get(), table_size, "the unet key table");
  if (!map.ok()) return map.status();
  auto fabric = std::unique_ptr<UnetFabric>(
      new UnetFabric(spec, *settings, std::move(*fd), std::move(*map)));
  return std::unique_ptr<Fabric>(std::move(fabric));
}

UnetFabric::UnetFabric(const FabricSpec& spec, const Settings& s, Fd key_fd, Mapping key_map)
    : caps_(CapsFor(spec, s)),
      settings_(s),
      key_fd_(std::move(key_fd)),
      key_map_(std::move(key_map)),
      local_(s.key_slots) {}

absl::Status UnetFabric::AccessLocal(const RemoteKey& rkey, uint64_t addr, size_t len,
                                     uint32_t access, absl::FunctionRef<void(void*)> fn) {
  LocalKeyTable::Key key;
  if (!DecodeKey(rkey, &key)) return RemoteKeyError("the key is malformed", addr, len);
  return local_.Access(key, addr, len, access, fn);
}

absl::StatusOr<std::unique_ptr<CompletionQueue>> UnetFabric::CreateCq() {
  auto cq = UnetCq::Create();
  if (!cq.ok()) return cq.status();
  return std::unique_ptr<CompletionQueue>(std::move(*cq));
}

absl::StatusOr<std::unique_ptr<Listener>> UnetFabric::Listen(absl::string_view address) {
  std::string name(address);
  std::string shown;
  Fd reservation;
  if (name.empty()) {
    static std::atomic<uint32_t> counter{0};
    name = absl::StrCat("auto-", getpid(), "-", counter.fetch_add(1));
  } else if (auto sa = ParseSocketAddress(address); sa.ok()) {
    auto reserved = ReservePort(address, *sa, &name, &shown);
    if (!reserved.ok()) return reserved.status();
    reservation = std::move(*reserved);
  }
  if (shown.empty()) shown = name;
  socklen_t len;
  auto sa = MakeAddr(name, &len);
  if (!sa.ok()) return sa.status();
  int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return ErrnoError(errno, "socket(AF_UNIX) for a unet listener failed");
  Fd sock(fd);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&*sa), len) != 0) {
    return ErrnoError(errno, absl::StrCat("binding unet address '", name, "' failed"),
                      errno == EADDRINUSE ? "another process listens there; pick another name"
                                          : "");
  }
  if (::listen(fd, 1024) != 0) return ErrnoError(errno, "listen on a unet socket failed");
  return std::unique_ptr<Listener>(
      new UnetListener(this, std::move(sock), shown, std::move(reservation)));
}

absl::StatusOr<std::unique_ptr<Endpoint>> UnetFabric::Connect(absl::string_view address,
                                                             CompletionQueue* cq,
                                                             absl::Duration timeout) {
  std::string name(address);
  // A socket address with no listener is refused at once, as TCP refuses
  // it; a unet name is retried until the deadline (its listener may still be
  // starting, the usual case in tests and launchers).
  bool refuse_fast = false;
  if (auto ip = ParseSocketAddress(address); ip.ok()) {
    if (ip->port() == 0 || ip->is_wildcard() || !IsLocalAddress(*ip)) {
      return MakeError(absl::StatusCode::kUnavailable,
                       ip->port() == 0 ? EINVAL : EHOSTUNREACH,
                       absl::StrCat("unet cannot connect to ", address,
                                    ip->port() == 0 ? ": port 0"
                                                    : ": not an address of this host (unet "
                                                      "reaches processes on this host only)"),
                       "connect to a listening IP:PORT of this host, or use ofi:tcp;ofi_rxm or "
                       "ucx:tcp for other hosts");
    }
    name = PortName(ip->port());
    refuse_fast = true;
  }
  socklen_t len;
  auto sa = MakeAddr(name, &len);
  if (!sa.ok()) return sa.status();
  absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(1);
  for (;;) {
    int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return ErrnoError(errno, "socket(AF_UNIX) for a unet connection failed");
    Fd sock(fd);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&*sa), len) == 0) {
      return Handshake(std::move(sock), "", std::string(address), cq, deadline);
    }
    int err = errno;
    if ((err != ECONNREFUSED && err != ENOENT && err != EAGAIN) ||
        (refuse_fast && err != EAGAIN) || absl::Now() + backoff > deadline) {
      if (refuse_fast && err == ENOENT) err = ECONNREFUSED;
      return ErrnoError(err, absl::StrCat("connecting to unet address '", address, "' failed"),
                        err == ECONNREFUSED || err == ENOENT
                            ? "start a listener on that address first (same host and network namespace)"
                            : "");
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(50));
  }
}

const bool kRegistered = RegisterProvider(ProviderInfo{
    "unet",
    "U-Net-style user-level endpoints over shared memory (same host; embedded)",
    {"unet", "unet?cma=off"},
    [](const FabricSpec& spec) { return UnetFabric::Open(spec); },
});

}  // namespace zsock::unet
