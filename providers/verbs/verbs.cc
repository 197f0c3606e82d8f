// verbs: the zsock provider interface directly over rdma-core 44
// (libibverbs + librdmacm): reliable-connected queue pairs set up with
// librdmacm, on real HCAs (InfiniBand, RoCE, iWARP) or Soft-RoCE.
//
//   verbs[:DEVICE][?port=N&gid_index=N&inline=N&srq=on&cq_depth=N&sq_depth=N&...]
//
// Per fabric: the device's librdmacm verbs context (rdma_get_devices), one
// protection domain, optionally one shared receive queue (srq=on), a
// registration table for emulated accesses. Per zsock CQ: one completion
// channel and an epoll set (channel fd, core's wake fd, each endpoint's CM
// event channel). Per endpoint: an rdma_cm id on its own event channel, its
// own ibv_cq on the CQ's completion channel, an RC QP, a slab of registered
// receive buffers (eager_size each) and of send slots.
//
// Messages (framing in verbs_core.h, docs/verbs.md): a message up to
// eager_size - 24 bytes is copied into a send slot and sent (inline when it
// fits max_inline_data); a larger one is announced by a rendezvous request
// naming the sender's buffer (registered through the pin-down cache), which
// the receiver RDMA-reads into the matched receive before it answers FIN.
// Receive buffers are credit-controlled (credits piggyback on every message,
// an explicit update goes out when half the window was refilled), so the
// receiver is never overrun; rnr_retry=7 is the backstop. RDMA read/write
// and atomics are native (atomics only where the device reports
// IBV_ATOMIC_HCA/GLOB on both sides; else core emulation). Work requests that
// find the send queue or the peer's credits exhausted wait in order in a
// backlog that completions drain (back-pressure without blocking callers).
//
// Nothing here can run on a machine without an RDMA device; what can be
// decided without one is in verbs_core.{h,cc} and unit-tested.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/epoll.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/config.h"
#include "core/fd.h"
#include "core/log.h"
#include "core/mutex.h"
#include "core/provider.h"
#include "core/rcache.h"
#include "core/status.h"
#include "providers/verbs/engine.h"
#include "providers/verbs/verbs_core.h"

namespace zsock::verbs {
namespace {

constexpr uint64_t kRecvBit = Engine::kRecvBit;
constexpr size_t kMaxMessage = Engine::kMaxMessage;

absl::Status VerbsErrno(int err, absl::string_view call, absl::string_view fix = {}) {
  return ErrnoError(err, absl::StrCat(call, " failed"), fix);
}

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

absl::StatusOr<sockaddr_storage> ToSockaddr(const HostPort& hp) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port = absl::StrCat(hp.port);
  int rc = ::getaddrinfo(hp.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("bad verbs address ", hp.host, ": ", gai_strerror(rc)),
                     "write a numeric IP:PORT");
  }
  sockaddr_storage ss{};
  std::memcpy(&ss, res->ai_addr, res->ai_addrlen);
  ::freeaddrinfo(res);
  return ss;
}

std::string AddressOf(sockaddr* sa) {
  if (sa == nullptr) return "?";
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    return FormatHostPort(buf, ntohs(a->sin6_port));
  }
  auto* a = reinterpret_cast<sockaddr_in*>(sa);
  inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
  return FormatHostPort(buf, ntohs(a->sin_port));
}

void SetNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Waits for the next CM event on `ch` until `deadline`.
absl::StatusOr<rdma_cm_event*> NextCmEvent(rdma_event_channel* ch, absl::Time deadline,
                                           absl::string_view what) {
  for (;;) {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(ch, &ev) == 0) return ev;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return VerbsErrno(errno, "rdma_get_cm_event");
    }
    int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) {
      return MakeError(absl::StatusCode::kDeadlineExceeded, ETIMEDOUT,
                       absl::StrCat("timed out waiting for ", what),
                       "check that the peer runs and that the address is reachable over RDMA");
    }
    pollfd pfd{ch->fd, POLLIN, 0};
    ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
  }
}

// Waits for a specific event; anything else is an error naming it.
absl::Status ExpectCmEvent(rdma_event_channel* ch, rdma_cm_event_type want, absl::Time deadline,
                           absl::string_view what, std::string* private_data = nullptr) {
  auto ev = NextCmEvent(ch, deadline, what);
  if (!ev.ok()) return ev.status();
  rdma_cm_event_type got = (*ev)->event;
  int status = (*ev)->status;
  if (got == want && private_data != nullptr && (*ev)->param.conn.private_data != nullptr) {
    private_data->assign(static_cast<const char*>((*ev)->param.conn.private_data),
                         (*ev)->param.conn.private_data_len);
  }
  std::string reject;
  if (got == RDMA_CM_EVENT_REJECTED && (*ev)->param.conn.private_data_len > 0) {
    reject = " (the peer refused the connection)";
  }
  rdma_ack_cm_event(*ev);
  if (got == want) return absl::OkStatus();
  const char* fix = "check the address, that the peer listens there, and the fabric (`ibstat`, `rdma link`)";
  absl::StatusCode code = absl::StatusCode::kUnavailable;
  int err = status < 0 ? -status : (status > 0 && status < 256 ? status : EHOSTUNREACH);
  if (got == RDMA_CM_EVENT_REJECTED) {
    err = ECONNREFUSED;
    fix = "start a listener at that address (rdma_cm rejects connections to a port nobody listens on)";
  }
  return MakeError(code, err,
                   absl::StrCat(what, ": got ", rdma_event_str(got), " instead of ",
                                rdma_event_str(want), reject),
                   fix);
}

class VerbsFabric;
class VerbsEndpoint;

// ------------------------------------------------------------ registration

class IbvRegistrar final : public Registrar {
 public:
  explicit IbvRegistrar(ibv_pd* pd) : pd_(pd) {}
  absl::StatusOr<Keys> Register(void* addr, size_t len, int ibv_access) override {
    ibv_mr* mr = ibv_reg_mr(pd_, addr, len, ibv_access);
    if (mr == nullptr) {
      int err = errno;
      return ErrnoError(err, absl::StrCat("ibv_reg_mr of ", len, " bytes at 0x",
                                          absl::Hex(reinterpret_cast<uintptr_t>(addr))),
                        err == ENOMEM || err == EAGAIN
                            ? "raise the locked-memory limit (ulimit -l unlimited, or memlock in "
                              "/etc/security/limits.conf) or lower rcache_max_bytes"
                            : "register mapped memory the process may access");
    }
    return Keys{mr, mr->lkey, mr->rkey};
  }
  void Deregister(void* handle) noexcept override {
    ibv_dereg_mr(static_cast<ibv_mr*>(handle));
  }

 private:
  ibv_pd* pd_;
};

// A registered slab of fixed-size buffers (receive buffers, send slots).
struct Slab {
  std::vector<uint8_t> mem;
  std::unique_ptr<MemoryRegion> mr;
  size_t slot_size = 0;
  size_t slots = 0;
  uint8_t* slot(size_t i) { return mem.data() + i * slot_size; }
  uint32_t lkey() const { return LkeyOf(mr.get()); }
};

// ------------------------------------------------------------ CQ

class VerbsCq final : public CompletionQueue {
 public:
  VerbsCq(VerbsFabric* fabric, ibv_comp_channel* channel, Fd epoll)
      : fabric_(fabric), channel_(channel), epoll_(std::move(epoll)) {
    SetNonBlocking(channel_->fd);
    Watch(channel_->fd);
    Watch(wake_fd());
  }
  ~VerbsCq() override { ibv_destroy_comp_channel(channel_); }

  int wait_fd() const override { return epoll_.get(); }
  ibv_comp_channel* channel() const { return channel_; }
  VerbsFabric* fabric() const { return fabric_; }

  void Watch(int fd) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev);
  }
  void Unwatch(int fd) { ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr); }

  void Attach(VerbsEndpoint* ep) {
    MutexLock lock(&mu_);
    endpoints_.push_back(ep);
  }
  // Detaches and runs `destroy` (which destroys the endpoint's ibv_cq) under
  // the list lock, so that no completion event is being fetched for it.
  void Detach(VerbsEndpoint* ep, absl::FunctionRef<void()> destroy) {
    MutexLock lock(&mu_);
    std::erase(endpoints_, ep);
    destroy();
  }

 protected:
  size_t Progress() override;
  bool ArmProvider() override;
  void ClearWakeup() override {
    MutexLock lock(&mu_);
    DrainEventsLocked();
  }

 private:
  // ibv_get_cq_event for everything pending, each acked at once (so that
  // ibv_destroy_cq never waits for unacked events).
  void DrainEventsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ibv_cq* cq = nullptr;
    void* ctx = nullptr;
    while (ibv_get_cq_event(channel_, &cq, &ctx) == 0) ibv_ack_cq_events(cq, 1);
  }

  VerbsFabric* fabric_;
  ibv_comp_channel* channel_;
  Fd epoll_;
  Mutex mu_;
  std::vector<VerbsEndpoint*> endpoints_ ABSL_GUARDED_BY(mu_);
};

// ------------------------------------------------------------ fabric

class VerbsFabric final : public Fabric {
 public:
  static absl::StatusOr<std::unique_ptr<Fabric>> Open(const FabricSpec& spec);
  ~VerbsFabric() override {
    ReleaseCache();
    srq_slab_.mr.reset();
    if (srq_) ibv_destroy_srq(srq_);
    if (pd_) ibv_dealloc_pd(pd_);
    if (devices_) rdma_free_devices(devices_);
  }

  const Capabilities& caps() const override { return caps_; }
  const Settings& settings() const { return settings_; }
  ibv_context* ctx() const { return ctx_; }
  ibv_pd* pd() const { return pd_; }
  ibv_srq* srq() const { return srq_; }
  Slab& srq_slab() { return srq_slab_; }
  Mutex& srq_mu() { return srq_mu_; }
  const ibv_device_attr& dev_attr() const { return dev_attr_; }
  uint32_t max_msg_sz() const { return max_msg_sz_; }
  bool atomics_native() const { return atomics_native_; }
  uint64_t id() const { return id_; }
  const std::string& local_ip() const { return local_ip_; }
  const std::string& device_name() const { return device_name_; }

  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* addr, size_t len,
                                                               uint32_t access) override {
    return Register(&registrar_, &table_, addr, len, access);
  }

  absl::Status AccessLocal(const RemoteKey& rkey, uint64_t addr, size_t len, uint32_t access,
                           absl::FunctionRef<void(void*)> fn) override {
    auto key = DecodeKeyBlob(rkey.blob);
    if (!key.ok()) return key.status();
    return table_.Access(*key, addr, len, access, fn);
  }

  absl::StatusOr<std::unique_ptr<CompletionQueue>> CreateCq() override {
    ibv_comp_channel* ch = ibv_create_comp_channel(ctx_);
    if (ch == nullptr) return VerbsErrno(errno, "ibv_create_comp_channel", "raise the fd limit");
    Fd ep(::epoll_create1(EPOLL_CLOEXEC));
    if (!ep) {
      int err = errno;
      ibv_destroy_comp_channel(ch);
      return VerbsErrno(err, "epoll_create1", "raise the fd limit (ulimit -n)");
    }
    return std::unique_ptr<CompletionQueue>(new VerbsCq(this, ch, std::move(ep)));
  }

  absl::StatusOr<std::unique_ptr<Listener>> Listen(absl::string_view address) override;
  absl::StatusOr<std::unique_ptr<Endpoint>> Connect(absl::string_view address, CompletionQueue* cq,
                                                    absl::Duration timeout) override;

  // Builds the QP and endpoint on a resolved (client) or requested (server)
  // id that has its own event channel.
  absl::StatusOr<std::unique_ptr<VerbsEndpoint>> MakeEndpoint(rdma_cm_id* id,
                                                              rdma_event_channel* ch,
                                                              CompletionQueue* cq);
  // Refills one SRQ buffer.
  void RepostSrq(size_t slot);

  std::string Hello() const;

 private:
  VerbsFabric() = default;
  absl::Status Setup(const FabricSpec& spec);

  Settings settings_;
  ibv_context** devices_ = nullptr;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_srq* srq_ = nullptr;
  Slab srq_slab_;
  Mutex srq_mu_;
  ibv_device_attr dev_attr_{};
  uint32_t max_msg_sz_ = 0;
  int port_ = 0;
  bool atomics_native_ = false;
  uint64_t id_ = 0;
  std::string local_ip_;
  std::string device_name_;
  Capabilities caps_;
  RegTable table_;
  IbvRegistrar registrar_{nullptr};
};

// ------------------------------------------------------------ endpoint

// One RC connection: the rdma_cm id (on its own event channel), its ibv_cq
// and QP, and the message engine (engine.h) that runs the protocol over them.
class VerbsEndpoint final : public Endpoint, private Transport {
 public:
  VerbsEndpoint(VerbsFabric* fabric, VerbsCq* cq, rdma_cm_id* id, rdma_event_channel* ch,
                ibv_cq* icq, uint32_t max_inline)
      : Endpoint(fabric, cq), fab_(fabric), cq_(cq), id_(id), ch_(ch), icq_(icq),
        engine_(this, this, Config(fabric, max_inline)), engine_config_inline_(max_inline) {}

  ~VerbsEndpoint() override {
    Close();
    if (attached_) cq_->Unwatch(ch_->fd);
    cq_->Detach(this, [&] {
      MutexLock lock(&mu_);
      if (id_->qp != nullptr) rdma_destroy_qp(id_);
      if (icq_ != nullptr) ibv_destroy_cq(icq_);
      icq_ = nullptr;
    });
    rdma_destroy_id(id_);
    rdma_destroy_event_channel(ch_);
  }

  // Registers the slabs and posts receives (before the peer can send).
  absl::Status Prepare() {
    MutexLock lock(&mu_);
    return engine_.Prepare();
  }

  // The connection is up and the peer's hello known.
  void Start(const struct Hello& peer, std::string local, std::string remote) {
    {
      MutexLock lock(&mu_);
      engine_.Start(peer, remote);
      native_atomics_ = fab_->atomics_native() && (peer.flags & kHelloAtomics);
      info_.local_address = std::move(local);
      info_.peer_address = std::move(remote);
      info_.peer_on_host = false;
      info_.rdma_read = Support::kNative;
      info_.rdma_write = Support::kNative;
      info_.atomics = native_atomics_ ? Support::kNative : Support::kEmulated;
      info_.notes.push_back(absl::StrCat(
          "verbs RC QP 0x", absl::Hex(id_->qp->qp_num), " on ", fab_->device_name(),
          ", max_inline_data ", engine_config_inline_, ", peer receive credits ",
          (peer.flags & kHelloSrq) ? std::string("unlimited (shared receive queue)")
                                   : absl::StrCat(peer.credits),
          ", peer buffers ", peer.eager_size, " B"));
      if (!native_atomics_) {
        info_.notes.push_back("atomics emulated: one side's HCA lacks IBV_ATOMIC_HCA/GLOB");
      }
    }
    attached_ = true;
    cq_->Watch(ch_->fd);
    cq_->Attach(this);
  }

  const EndpointInfo& info() const override { return info_; }

  absl::Status Send(const void* buf, size_t len, MemoryRegion* mr, uint64_t context) override {
    return Run([&](EngineOutput* out) { return engine_.Send(buf, len, mr, context, false, out); });
  }
  absl::Status SendControl(std::span<const uint8_t> msg) override {
    return Run([&](EngineOutput* out) {
      return engine_.Send(msg.data(), msg.size(), nullptr, 0, true, out);
    });
  }
  absl::Status PostRecv(void* buf, size_t len, MemoryRegion* mr, uint64_t context) override {
    return Run([&](EngineOutput* out) { return engine_.PostRecv(buf, len, mr, context, out); });
  }
  absl::Status Read(void* local, size_t len, MemoryRegion* mr, uint64_t remote_addr,
                    const RemoteKey& rkey, uint64_t context) override {
    return Run([&](EngineOutput* out) {
      return engine_.Rma(WrKind::kRdmaRead, local, len, mr, remote_addr, rkey, context, out);
    });
  }
  absl::Status Write(const void* local, size_t len, MemoryRegion* mr, uint64_t remote_addr,
                     const RemoteKey& rkey, uint64_t context) override {
    return Run([&](EngineOutput* out) {
      return engine_.Rma(WrKind::kRdmaWrite, const_cast<void*>(local), len, mr, remote_addr, rkey,
                         context, out);
    });
  }
  absl::Status FetchAdd(uint64_t* result, uint64_t remote_addr, const RemoteKey& rkey,
                        uint64_t add, uint64_t context) override {
    if (!native_atomics_) return Endpoint::FetchAdd(result, remote_addr, rkey, add, context);
    return Run([&](EngineOutput* out) {
      return engine_.Atomic(WrKind::kFetchAdd, result, remote_addr, rkey, add, 0, context, out);
    });
  }
  absl::Status CompareSwap(uint64_t* result, uint64_t remote_addr, const RemoteKey& rkey,
                           uint64_t compare, uint64_t swap, uint64_t context) override {
    if (!native_atomics_) {
      return Endpoint::CompareSwap(result, remote_addr, rkey, compare, swap, context);
    }
    return Run([&](EngineOutput* out) {
      return engine_.Atomic(WrKind::kCompareSwap, result, remote_addr, rkey, compare, swap,
                            context, out);
    });
  }

  // Graceful close: tells the peer how many messages we sent, lets our
  // rendezvous sends be pulled (up to one second), disconnects, and fails
  // what is left with Cancelled.
  void Close() override {
    EngineOutput first;
    {
      MutexLock lock(&mu_);
      if (engine_.closed()) return;
      engine_.QueueClose(&first);
    }
    Deliver(std::move(first));
    const int64_t deadline = absl::GetCurrentTimeNanos() + 1000000000;
    for (;;) {
      EngineOutput out;
      bool idle;
      {
        MutexLock lock(&mu_);
        engine_.Progress(&out);
        idle = engine_.Idle();
      }
      Deliver(std::move(out));
      if (idle || absl::GetCurrentTimeNanos() > deadline) break;
      sched_yield();
    }
    rdma_disconnect(id_);
    EngineOutput out;
    {
      MutexLock lock(&mu_);
      engine_.Fail(MakeError(absl::StatusCode::kCancelled, ECANCELED, "the endpoint was closed"),
                   /*closed=*/true, &out);
    }
    Deliver(std::move(out));
  }

  // ---- for VerbsCq (its list lock held)

  size_t Progress(std::vector<std::pair<VerbsEndpoint*, EngineOutput>>* outs) {
    EngineOutput out;
    size_t n;
    {
      MutexLock lock(&mu_);
      n = engine_.Progress(&out);
    }
    n += CheckCm(&out);
    outs->emplace_back(this, std::move(out));
    return n;
  }

  // Re-arms the ibv_cq; false if completions are already there (kept for
  // the next Progress).
  bool Arm() {
    MutexLock lock(&mu_);
    if (icq_ == nullptr || engine_.dead()) return true;
    if (engine_.has_stash()) return false;
    if (ibv_req_notify_cq(icq_, 0) != 0) return false;
    ibv_wc wc[16];
    int got = ibv_poll_cq(icq_, 16, wc);
    for (int i = 0; i < got; ++i) engine_.Stash(wc[i]);
    return got <= 0;
  }

  // Pushes completions and runs control messages and emulation failures,
  // without the endpoint's lock.
  void Deliver(EngineOutput out) {
    for (auto& c : out.completions) cq_->Push(std::move(c));
    for (auto& m : out.control) DeliverControl(m);
    if (out.fail_emulated) {
      absl::Status why;
      {
        MutexLock lock(&mu_);
        why = engine_.dead_status();
      }
      FailEmulated(why);
    }
  }

 private:
  static EngineConfig Config(VerbsFabric* f, uint32_t max_inline) {
    EngineConfig c;
    c.sq_depth = f->settings().sq_depth;
    c.recv_depth = f->settings().recv_depth;
    c.eager_size = f->settings().eager_size;
    c.max_inline = max_inline;
    c.max_msg_sz = f->max_msg_sz();
    c.srq = f->srq() != nullptr;
    c.srq_slot_size = f->srq_slab().slot_size;
    return c;
  }

  // Runs one operation on the engine and delivers what it produced.
  template <typename Fn>
  absl::Status Run(Fn fn) {
    EngineOutput out;
    absl::Status st;
    {
      MutexLock lock(&mu_);
      st = fn(&out);
    }
    Deliver(std::move(out));  // Push wakes an armed waiter
    return st;
  }

  // Transport (called by the engine with mu_ held).
  int PostSend(ibv_send_wr* wr) override {
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(id_->qp, wr, &bad);
  }
  int PostRecv(ibv_recv_wr* wr) override {
    ibv_recv_wr* bad = nullptr;
    return ibv_post_recv(id_->qp, wr, &bad);
  }
  int Poll(int n, ibv_wc* wc) override { return icq_ == nullptr ? 0 : ibv_poll_cq(icq_, n, wc); }
  absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(void* addr, size_t len,
                                                         uint32_t access) override {
    return fab_->RegisterMemory(addr, len, access);
  }
  absl::StatusOr<std::shared_ptr<MemoryRegion>> Pin(void* addr, size_t len,
                                                    uint32_t access) override {
    return fab_->rcache().Get(addr, len, access);
  }
  const uint8_t* SrqBuffer(size_t slot) override { return fab_->srq_slab().slot(slot); }
  void RepostSrq(size_t slot) override { fab_->RepostSrq(slot); }

  // Connection events: a disconnect (the peer closed, exited or was
  // killed: its kernel destroys the id and sends a DREQ) ends the
  // connection after everything already delivered is taken.
  size_t CheckCm(EngineOutput* out) {
    size_t n = 0;
    for (;;) {
      rdma_cm_event* ev = nullptr;
      if (rdma_get_cm_event(ch_, &ev) != 0) break;
      const rdma_cm_event_type type = ev->event;
      rdma_ack_cm_event(ev);
      ++n;
      if (type != RDMA_CM_EVENT_DISCONNECTED && type != RDMA_CM_EVENT_DEVICE_REMOVAL &&
          type != RDMA_CM_EVENT_TIMEWAIT_EXIT) {
        continue;
      }
      MutexLock lock(&mu_);
      engine_.Progress(out);
      if (engine_.dead()) continue;
      engine_.Fail(
          MakeError(absl::StatusCode::kAborted, ECONNRESET,
                    absl::StrCat("the verbs peer ", info_.peer_address,
                                 type == RDMA_CM_EVENT_DEVICE_REMOVAL ? ": the RDMA device was removed"
                                 : engine_.peer_closed()              ? " closed the connection"
                                                         : " disconnected (it exited or was killed)"),
                    "reconnect"),
          /*closed=*/false, out);
    }
    return n;
  }

  VerbsFabric* fab_;
  VerbsCq* cq_;
  rdma_cm_id* id_;
  rdma_event_channel* ch_;
  ibv_cq* icq_;
  Mutex mu_;
  Engine engine_ ABSL_GUARDED_BY(mu_);
  uint32_t engine_config_inline_ = 0;
  EndpointInfo info_;
  bool native_atomics_ = false;
  bool attached_ = false;
};


// ------------------------------------------------------------ CQ methods

size_t VerbsCq::Progress() {
  MutexLock list_lock(&mu_);
  std::vector<std::pair<VerbsEndpoint*, EngineOutput>> outs;
  size_t n = 0;
  for (VerbsEndpoint* ep : endpoints_) n += ep->Progress(&outs);
  for (auto& [ep, out] : outs) {
    n += out.completions.size();
    ep->Deliver(std::move(out));
  }
  return n;
}

bool VerbsCq::ArmProvider() {
  MutexLock lock(&mu_);
  // Consume the events that woke us, then re-arm and look once more (the
  // ibv_req_notify_cq race: completions that came before the arm).
  DrainEventsLocked();
  bool armed = true;
  for (VerbsEndpoint* ep : endpoints_) armed &= ep->Arm();
  return armed;
}

// ------------------------------------------------------------ fabric methods

void VerbsFabric::RepostSrq(size_t slot) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uint64_t>(srq_slab_.slot(slot));
  sge.length = static_cast<uint32_t>(srq_slab_.slot_size);
  sge.lkey = srq_slab_.lkey();
  ibv_recv_wr wr{};
  wr.wr_id = kRecvBit | slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  MutexLock lock(&srq_mu_);
  if (int rc = ibv_post_srq_recv(srq_, &wr, &bad); rc != 0) {
    ZS_LOG(kError, "ibv_post_srq_recv failed (%s): the shared receive queue shrinks",
           std::strerror(rc));
  }
}

std::string VerbsFabric::Hello() const {
  struct Hello h;
  h.flags = static_cast<uint8_t>((srq_ ? kHelloSrq : 0) | (atomics_native_ ? kHelloAtomics : 0));
  h.credits = srq_ ? 0 : static_cast<uint32_t>(settings_.recv_depth);
  h.eager_size = static_cast<uint32_t>(settings_.eager_size);
  h.max_inline = static_cast<uint32_t>(settings_.inline_size);
  h.fabric_id = id_;
  return EncodeHello(h);
}

absl::StatusOr<std::unique_ptr<Fabric>> VerbsFabric::Open(const FabricSpec& spec) {
  auto f = std::unique_ptr<VerbsFabric>(new VerbsFabric());
  if (auto st = f->Setup(spec); !st.ok()) return st;
  return std::unique_ptr<Fabric>(std::move(f));
}

absl::Status VerbsFabric::Setup(const FabricSpec& spec) {
  auto settings = ParseSettings(spec);
  if (!settings.ok()) return settings.status();
  settings_ = *settings;
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
  for (int i = 0; i < num; ++i) {
    DeviceDesc d;
    d.name = ibv_get_device_name(devices_[i]->device);
    ibv_device_attr attr{};
    if (ibv_query_device(devices_[i], &attr) == 0) {
      for (int p = 1; p <= attr.phys_port_cnt; ++p) {
        ibv_port_attr pa{};
        if (ibv_query_port(devices_[i], static_cast<uint8_t>(p), &pa) != 0) continue;
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
    descs.push_back(std::move(d));
  }
  auto sel = SelectDevice(settings_, descs);
  if (!sel.ok()) return sel.status();
  ctx_ = devices_[sel->device];
  port_ = sel->port;
  device_name_ = descs[sel->device].name;
  const PortDesc* port = nullptr;
  for (const auto& p : descs[sel->device].ports) {
    if (p.num == port_) port = &p;
  }
  max_msg_sz_ = port->max_msg_sz == 0 ? (1u << 30) : port->max_msg_sz;
  if (ibv_query_device(ctx_, &dev_attr_) != 0) return VerbsErrno(errno, "ibv_query_device");

  // The local IP address rdma_cm binds to: the GID's (RoCE), else the
  // device's netdev's (IPoIB).
  std::vector<std::string> candidates;
  for (int g = 0; g < port->gid_count; ++g) {
    if (settings_.gid_index >= 0 && g != settings_.gid_index) continue;
    ibv_gid gid{};
    if (ibv_query_gid(ctx_, static_cast<uint8_t>(port_), g, &gid) != 0) continue;
    auto a = GidToAddress(gid.raw);
    if (!a.has_value()) continue;
    if (a->find(':') == std::string::npos) {
      candidates.insert(candidates.begin(), *a);  // IPv4 first
    } else if (port->link_layer == "Ethernet" && a->rfind("fe80", 0) != 0) {
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
    ibv_srq_init_attr sa{};
    sa.attr.max_wr = static_cast<uint32_t>(std::min(settings_.recv_depth, dev_attr_.max_srq_wr));
    sa.attr.max_sge = 1;
    srq_ = ibv_create_srq(pd_, &sa);
    if (srq_ == nullptr) {
      return VerbsErrno(errno, "ibv_create_srq", "the device may lack SRQ support: use srq=off");
    }
    srq_slab_.slot_size = settings_.eager_size;
    srq_slab_.slots = sa.attr.max_wr;
    srq_slab_.mem.assign(srq_slab_.slot_size * srq_slab_.slots, 0);
    auto mr = RegisterMemory(srq_slab_.mem.data(), srq_slab_.mem.size(), kLocalWrite);
    if (!mr.ok()) return mr.status();
    srq_slab_.mr = std::move(*mr);
    for (size_t i = 0; i < srq_slab_.slots; ++i) RepostSrq(i);
  }

  Capabilities& c = caps_;
  c.provider = "verbs";
  c.spec = absl::StrCat(device_name_, " port ", port_, " (", port->link_layer, ", ", local_ip_, ")");
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
  return absl::OkStatus();
}

// Creates the CQ and QP for `id`, prepares the endpoint's buffers.
absl::StatusOr<std::unique_ptr<VerbsEndpoint>> VerbsFabric::MakeEndpoint(rdma_cm_id* id,
                                                                         rdma_event_channel* ch,
                                                                         CompletionQueue* cq) {
  auto* vcq = dynamic_cast<VerbsCq*>(cq);
  if (vcq == nullptr || vcq->fabric() != this) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     "the completion queue does not belong to this verbs fabric",
                     "create the CQ with the same fabric as the endpoint");
  }
  if (id->verbs != ctx_) {
    return MakeError(absl::StatusCode::kInvalidArgument, EXDEV,
                     absl::StrCat("the address is reached through RDMA device ",
                                  id->verbs ? ibv_get_device_name(id->verbs->device) : "?",
                                  ", not this fabric's ", device_name_),
                     absl::StrCat("open the fabric as verbs:",
                                  id->verbs ? ibv_get_device_name(id->verbs->device) : "DEVICE",
                                  " or use an address routed through ", device_name_));
  }
  const int depth = settings_.cq_depth != 0 ? settings_.cq_depth
                                            : settings_.sq_depth + settings_.recv_depth + 16;
  ibv_cq* icq = ibv_create_cq(ctx_, std::min(depth, dev_attr_.max_cqe), nullptr, vcq->channel(), 0);
  if (icq == nullptr) return VerbsErrno(errno, "ibv_create_cq", "lower cq_depth");
  ibv_qp_init_attr qa{};
  qa.send_cq = icq;
  qa.recv_cq = icq;
  qa.srq = srq_;
  qa.qp_type = IBV_QPT_RC;
  qa.sq_sig_all = 0;
  qa.cap.max_send_wr = static_cast<uint32_t>(settings_.sq_depth);
  qa.cap.max_recv_wr = srq_ ? 0 : static_cast<uint32_t>(settings_.recv_depth + 1);
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  qa.cap.max_inline_data = static_cast<uint32_t>(settings_.inline_size);
  if (rdma_create_qp(id, pd_, &qa) != 0) {
    // Some devices refuse large inline sizes: retry without inline data.
    qa.cap.max_inline_data = 0;
    if (rdma_create_qp(id, pd_, &qa) != 0) {
      int err = errno;
      ibv_destroy_cq(icq);
      return VerbsErrno(err, "rdma_create_qp", "lower sq_depth/recv_depth or check `ulimit -l`");
    }
  }
  auto ep = std::make_unique<VerbsEndpoint>(this, vcq, id, ch, icq, qa.cap.max_inline_data);
  if (auto st = ep->Prepare(); !st.ok()) return st;
  return ep;
}

rdma_conn_param ConnParam(const VerbsFabric* f, const std::string& hello) {
  rdma_conn_param p{};
  p.private_data = hello.data();
  p.private_data_len = static_cast<uint8_t>(hello.size());
  p.responder_resources = static_cast<uint8_t>(std::min(f->dev_attr().max_qp_rd_atom, 255));
  p.initiator_depth = static_cast<uint8_t>(std::min(f->dev_attr().max_qp_init_rd_atom, 255));
  p.flow_control = 1;
  p.retry_count = static_cast<uint8_t>(f->settings().retry_count);
  p.rnr_retry_count = static_cast<uint8_t>(f->settings().rnr_retry);
  return p;
}

class VerbsListener final : public Listener {
 public:
  VerbsListener(VerbsFabric* fabric, rdma_event_channel* ch, rdma_cm_id* id, std::string address)
      : fabric_(fabric), ch_(ch), id_(id), address_(std::move(address)) {}
  ~VerbsListener() override {
    rdma_destroy_id(id_);
    rdma_destroy_event_channel(ch_);
  }
  std::string address() const override { return address_; }
  int fd() const override { return ch_->fd; }

  absl::StatusOr<std::unique_ptr<Endpoint>> Accept(CompletionQueue* cq,
                                                   absl::Duration timeout) override {
    absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      auto ev = NextCmEvent(ch_, deadline, absl::StrCat("a connection on verbs address ", address_));
      if (!ev.ok()) return ev.status();
      if ((*ev)->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
        rdma_ack_cm_event(*ev);
        continue;
      }
      rdma_cm_id* child = (*ev)->id;
      auto peer = DecodeHello((*ev)->param.conn.private_data, (*ev)->param.conn.private_data_len);
      uint8_t peer_initiator = (*ev)->param.conn.initiator_depth;
      uint8_t peer_responder = (*ev)->param.conn.responder_resources;
      rdma_ack_cm_event(*ev);
      if (!peer.ok()) {
        ZS_LOG(kInfo, "verbs: refusing a connection: %s", peer.status().ToString());
        rdma_reject(child, nullptr, 0);
        rdma_destroy_id(child);
        continue;
      }
      // Arrived: its set-up gets the connect timeout (Listener::Accept).
      auto ep = Establish(child, *peer, peer_initiator, peer_responder, cq,
                          absl::Now() + absl::Milliseconds(fabric_->settings().connect_timeout_ms));
      if (!ep.ok()) {
        ZS_LOG(kInfo, "verbs: accepting a connection failed: %s", ep.status().ToString());
        if (absl::Now() >= deadline) return ep.status();
        continue;
      }
      return ep;
    }
  }

 private:
  absl::StatusOr<std::unique_ptr<Endpoint>> Establish(rdma_cm_id* child, const struct Hello& peer,
                                                      uint8_t peer_initiator, uint8_t peer_responder,
                                                      CompletionQueue* cq, absl::Time deadline) {
    rdma_event_channel* ch = rdma_create_event_channel();
    if (ch == nullptr) {
      rdma_reject(child, nullptr, 0);
      rdma_destroy_id(child);
      return VerbsErrno(errno, "rdma_create_event_channel", "raise the fd limit");
    }
    SetNonBlocking(ch->fd);
    if (rdma_migrate_id(child, ch) != 0) {
      int err = errno;
      rdma_reject(child, nullptr, 0);
      rdma_destroy_id(child);
      rdma_destroy_event_channel(ch);
      return VerbsErrno(err, "rdma_migrate_id");
    }
    auto ep = fabric_->MakeEndpoint(child, ch, cq);
    if (!ep.ok()) {
      rdma_reject(child, nullptr, 0);
      if (child->qp) rdma_destroy_qp(child);
      rdma_destroy_id(child);
      rdma_destroy_event_channel(ch);
      return ep.status();
    }
    // From here the endpoint owns child and ch.
    std::string hello = fabric_->Hello();
    rdma_conn_param p = ConnParam(fabric_, hello);
    p.responder_resources = std::min(p.responder_resources, peer_initiator);
    p.initiator_depth = std::min(p.initiator_depth, peer_responder);
    if (rdma_accept(child, &p) != 0) return VerbsErrno(errno, "rdma_accept");
    if (auto st = ExpectCmEvent(ch, RDMA_CM_EVENT_ESTABLISHED, deadline,
                                "the verbs connection to be established");
        !st.ok()) {
      return st;
    }
    (*ep)->Start(peer, address_, AddressOf(rdma_get_peer_addr(child)));
    return std::unique_ptr<Endpoint>(std::move(*ep));
  }

  VerbsFabric* fabric_;
  rdma_event_channel* ch_;
  rdma_cm_id* id_;
  std::string address_;
};

absl::StatusOr<std::unique_ptr<Listener>> VerbsFabric::Listen(absl::string_view address) {
  auto hp = ParseHostPort(address.empty() ? FormatHostPort(local_ip_, 0) : std::string(address));
  if (!hp.ok()) return hp.status();
  auto ss = ToSockaddr(*hp);
  if (!ss.ok()) return ss.status();
  rdma_event_channel* ch = rdma_create_event_channel();
  if (ch == nullptr) return VerbsErrno(errno, "rdma_create_event_channel", "raise the fd limit");
  SetNonBlocking(ch->fd);
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0) {
    int err = errno;
    rdma_destroy_event_channel(ch);
    return VerbsErrno(err, "rdma_create_id");
  }
  auto fail = [&](absl::Status st) {
    rdma_destroy_id(id);
    rdma_destroy_event_channel(ch);
    return st;
  };
  if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&*ss)) != 0) {
    int err = errno;
    return fail(ErrnoError(err, absl::StrCat("rdma_bind_addr to ", FormatHostPort(hp->host, hp->port)),
                           err == EADDRINUSE ? "pick another port"
                                             : "use the IP address of an RDMA interface of this host"));
  }
  if (id->verbs != nullptr && id->verbs != ctx_) {
    return fail(MakeError(absl::StatusCode::kInvalidArgument, EXDEV,
                          absl::StrCat("address ", hp->host, " belongs to RDMA device ",
                                       ibv_get_device_name(id->verbs->device), ", not ", device_name_),
                          "listen on an address of the fabric's device"));
  }
  if (rdma_listen(id, 1024) != 0) return fail(VerbsErrno(errno, "rdma_listen"));
  uint16_t port = ntohs(rdma_get_src_port(id));
  return std::unique_ptr<Listener>(new VerbsListener(this, ch, id, FormatHostPort(hp->host, port)));
}

absl::StatusOr<std::unique_ptr<Endpoint>> VerbsFabric::Connect(absl::string_view address,
                                                              CompletionQueue* cq,
                                                              absl::Duration timeout) {
  auto hp = ParseHostPort(address);
  if (!hp.ok()) return hp.status();
  if (hp->port == 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("verbs address '", address, "' has no port"),
                     "connect to the address a listener reports (IP:PORT)");
  }
  auto dst = ToSockaddr(*hp);
  if (!dst.ok()) return dst.status();
  auto src = ToSockaddr(HostPort{local_ip_, 0});
  if (!src.ok()) return src.status();
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(1);
  for (;;) {
    rdma_event_channel* ch = rdma_create_event_channel();
    if (ch == nullptr) return VerbsErrno(errno, "rdma_create_event_channel", "raise the fd limit");
    SetNonBlocking(ch->fd);
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0) {
      int err = errno;
      rdma_destroy_event_channel(ch);
      return VerbsErrno(err, "rdma_create_id");
    }
    bool owned_by_ep = false;
    auto cleanup = [&] {
      if (owned_by_ep) return;
      if (id->qp) rdma_destroy_qp(id);
      rdma_destroy_id(id);
      rdma_destroy_event_channel(ch);
    };
    const int ms = static_cast<int>(std::clamp<int64_t>(
        absl::ToInt64Milliseconds(deadline - absl::Now()), 1, settings_.connect_timeout_ms));
    absl::Status st;
    std::unique_ptr<VerbsEndpoint> ep;
    std::string peer_data;
    if (src->ss_family != dst->ss_family) {
      st = MakeError(absl::StatusCode::kInvalidArgument, EAFNOSUPPORT,
                     absl::StrCat("cannot reach ", address, " from ", local_ip_, " (address families differ)"),
                     "use an address of the same family as the device's");
    } else if (rdma_resolve_addr(id, reinterpret_cast<sockaddr*>(&*src),
                                 reinterpret_cast<sockaddr*>(&*dst), ms) != 0) {
      st = VerbsErrno(errno, "rdma_resolve_addr");
    } else if (st = ExpectCmEvent(ch, RDMA_CM_EVENT_ADDR_RESOLVED, deadline,
                                  absl::StrCat("resolving ", address));
               !st.ok()) {
    } else if (rdma_resolve_route(id, ms) != 0) {
      st = VerbsErrno(errno, "rdma_resolve_route");
    } else if (st = ExpectCmEvent(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, deadline,
                                  absl::StrCat("a route to ", address));
               !st.ok()) {
    } else {
      auto made = MakeEndpoint(id, ch, cq);
      if (!made.ok()) {
        st = made.status();
      } else {
        ep = std::move(*made);
        owned_by_ep = true;
        std::string hello = Hello();
        rdma_conn_param p = ConnParam(this, hello);
        if (rdma_connect(id, &p) != 0) {
          st = VerbsErrno(errno, "rdma_connect");
        } else {
          st = ExpectCmEvent(ch, RDMA_CM_EVENT_ESTABLISHED, deadline,
                             absl::StrCat("connecting to ", address), &peer_data);
        }
      }
    }
    if (st.ok()) {
      auto peer = DecodeHello(peer_data.data(), peer_data.size());
      if (!peer.ok()) return peer.status();  // ep's destructor disconnects
      ep->Start(*peer, AddressOf(rdma_get_local_addr(id)), std::string(address));
      return std::unique_ptr<Endpoint>(std::move(ep));
    }
    ep.reset();
    cleanup();
    // The listener may not be up yet (REJECTED for a port nobody listens on).
    if (StatusErrno(st) != ECONNREFUSED || absl::Now() + backoff > deadline) return st;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(50));
  }
}

const bool kRegistered = RegisterProvider(ProviderInfo{
    "verbs",
    "rdma-core RC queue pairs over librdmacm (InfiniBand, RoCE, iWARP, Soft-RoCE)",
    {"verbs"},
    [](const FabricSpec& spec) { return VerbsFabric::Open(spec); },
});

}  // namespace
}  // namespace zsock::verbs
