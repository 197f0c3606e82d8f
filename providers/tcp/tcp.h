// The tcp provider: reliable, connected, in-order messaging over kernel TCP
// sockets, written to be read (docs/writing-a-provider.md walks through it).
//
// One endpoint is one TCP connection. After a hello each way (magic and
// version, so that a peer that is not a zsock tcp endpoint fails clearly)
// it carries frames: an 8-byte header (payload length, kind) and the
// payload. A user frame is a Send, matched in order to the peer's posted
// receives; a control frame is core emulation traffic (RDMA read and
// write and atomics, core/emulation.h). A CQ's wait fd is an epoll set of
// its endpoints' sockets and core's wake fd: nothing needs a spinning
// thread.
#ifndef ZSOCK_PROVIDERS_TCP_TCP_H_
#define ZSOCK_PROVIDERS_TCP_TCP_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/cq.h"
#include "core/fd.h"
#include "core/local_keys.h"
#include "core/mutex.h"
#include "core/provider.h"
#include "core/sockaddr.h"

namespace zsock::tcp {

// ---- wire format, version kVersion ----
// Headers go out as the host lays them out: built for little-endian hosts
// only, so both ends agree.
static_assert(std::endian::native == std::endian::little, "the tcp wire format is little-endian");

// The hello: one BootstrapIo frame each way at connect, type kHelloMagic,
// payload kVersion as a u32. Each side sends its own, then reads the
// other's.
inline constexpr uint32_t kHelloMagic = 0x5054535a;  // "ZSTP"
inline constexpr uint32_t kVersion = 1;

enum FrameKind : uint8_t { kUserFrame = 1, kControlFrame = 2 };
struct FrameHeader {
  uint32_t length;  // payload bytes, at most kMaxMessage
  uint8_t kind;     // FrameKind; 0 never goes on the wire
  uint8_t reserved[3];
};
inline constexpr size_t kHeaderSize = sizeof(FrameHeader);
static_assert(kHeaderSize == 8);

// ---- limits ----
inline constexpr size_t kMaxMessage = size_t{1} << 30;
// An emulated read or write travels as one control frame, assembled in
// memory on arrival: a bound keeps one request from holding gigabytes.
inline constexpr size_t kMaxRma = size_t{4} << 20;
// Injected sends (kInjectContext) are copied when the kernel does not
// take them at once, so they are kept small.
inline constexpr size_t kInjectSize = 4096;

struct Settings {
  bool nodelay = true;  // TCP_NODELAY: option nodelay, config key tcp_nodelay
  absl::Duration connect_timeout;
};

class TcpCq;

class TcpFabric final : public Fabric {
 public:
  static absl::StatusOr<std::unique_ptr<Fabric>> Open(const FabricSpec& spec);
  ~TcpFabric() override { ReleaseCache(); }  // cached regions still use keys_

  const Capabilities& caps() const override { return caps_; }
  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* addr, size_t len,
                                                               uint32_t access) override;
  absl::StatusOr<std::unique_ptr<CompletionQueue>> CreateCq() override;
  absl::StatusOr<std::unique_ptr<Listener>> Listen(absl::string_view address) override;
  absl::StatusOr<std::unique_ptr<Endpoint>> Connect(absl::string_view address, CompletionQueue* cq,
                                                    absl::Duration timeout) override;
  absl::Status AccessLocal(const RemoteKey& rkey, uint64_t addr, size_t len, uint32_t access,
                           absl::FunctionRef<void(void*)> fn) override;

  const Settings& settings() const { return settings_; }
  // A connected socket's set-up: the hello both ways before `deadline`,
  // then the endpoint on `cq`. `active`: we connected (errors advise on
  // the address we connected to).
  absl::StatusOr<std::unique_ptr<Endpoint>> Handshake(Fd sock, const SocketAddress& peer, TcpCq* cq,
                                                      absl::Time deadline, bool active);

 private:
  explicit TcpFabric(Settings settings);

  const Settings settings_;
  Capabilities caps_;
  LocalKeyTable keys_;  // the live registrations, all that AccessLocal trusts
};

class TcpEndpoint;  // endpoint.cc

// The CQ: an epoll set of its endpoints' sockets (data.ptr: the endpoint)
// and core's wake fd (data.ptr: null).
class TcpCq final : public CqBase {
 public:
  static absl::StatusOr<std::unique_ptr<TcpCq>> Create(TcpFabric* fabric);

  int wait_fd() const override { return epoll_.get(); }
  const TcpFabric* fabric() const { return fabric_; }  // CqOf checks it

  // epoll_ctl on the set: EPOLL_CTL_ADD when an endpoint starts (events
  // EPOLLIN), MOD to add EPOLLOUT while it has bytes the kernel did not
  // take, DEL when it fails or closes (its socket may stay readable for
  // good, which would wake every sleeper at once).
  int Control(int op, int fd, uint32_t events, TcpEndpoint* ep);
  // Returns once no Progress runs that may have seen an endpoint which
  // has left the set, so that the endpoint may be destroyed.
  void WaitForProgress() { MutexLock lock(&mu_); }

 protected:
  size_t Progress() override;
  // Nothing waits outside the set: every completion is pushed when it
  // happens, and every socket with work is readable (or writable with a
  // queue) in wait_fd.
  bool ArmProvider() override { return true; }

 private:
  TcpCq(TcpFabric* fabric, Fd epoll) : fabric_(fabric), epoll_(std::move(epoll)) {}

  TcpFabric* const fabric_;
  const Fd epoll_;
  // One Progress at a time, so an endpoint's control messages reach core
  // in the order they arrived (a write, then a read of it).
  Mutex mu_;
};

// endpoint.cc: a connected socket's endpoint, watched by `cq`.
absl::StatusOr<std::unique_ptr<Endpoint>> NewEndpoint(TcpFabric* fabric, TcpCq* cq, Fd sock,
                                                      EndpointInfo info);
// Its share of Progress, for `events` from epoll. Returns the events handled.
size_t OnReady(TcpEndpoint* ep, uint32_t events);

}  // namespace zsock::tcp

#endif  // ZSOCK_PROVIDERS_TCP_TCP_H_
