// ofi: the zsock provider interface over libfabric (1.17, Debian's
// libfabric-dev). Configurations: `ofi:tcp;ofi_rxm` (the CI default),
// `ofi:shm`, `ofi:verbs;ofi_rxm` (reliable-datagram, FI_EP_RDM), `ofi:tcp`
// and `ofi:verbs` (connected, FI_EP_MSG), or `ofi:` for whatever fi_getinfo
// offers first.
//
// RDM connections: each zsock endpoint owns one FI_EP_RDM endpoint and an
// address vector holding its one peer. The peers exchange their fi_getname
// addresses over an out-of-band TCP socket (the listener's address is that
// socket's "IP:PORT"), which then stays open as the liveness signal and
// carries the graceful-close FIN.
//
// MSG connections: a passive endpoint listens (fi_listen, its event queue
// waited on through FI_WAIT_FD); a zsock connection is two FI_EP_MSG
// endpoints, one for user messages and RMA, one for core's control
// messages (untagged providers cannot keep them apart otherwise), paired by
// a nonce in the connection data. FI_SHUTDOWN on the endpoint's event queue
// reports the peer's end.
//
// RDM messages use the tagged interface: user messages and core's control
// messages carry different tags, so a user message waiting for a posted
// receive never blocks control traffic. RMA uses fi_read/fi_write, atomics
// fi_fetch_atomic/fi_compare_atomic where fi_query_atomic allows (else core
// emulation); shm's one-sided operations are emulated (it does not refuse
// bad keys). Registration follows every mr_mode bit the provider demands
// (FI_MR_LOCAL, VIRT_ADDR, ALLOCATED, PROV_KEY, RAW; a provider that
// requires FI_MR_ENDPOINT is refused with that reason). Completion queues
// wait on FI_WAIT_FD with fi_trywait; ofi:tcp's on its connections' own TCP
// sockets, with FI_WAIT_NONE fi CQs (cq_wait=sockets, its default); a
// provider without a wait object (shm), or CQs opened without one (option
// cq_wait=none, for busy pollers), are waited on with a timer backing off
// from 50 us to 1 ms.
// Design notes and limits: docs/ofi.md.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/clock.h"
#include "core/fd.h"
#include "core/accept.h"
#include "core/config.h"
#include "core/flow_window.h"
#include "core/log.h"
#include "core/mutex.h"
#include "core/provider.h"
#include "core/ready_owners.h"
#include "core/rcache.h"
#include "core/sockaddr.h"
#include "core/status.h"
#include "providers/ofi/bootstrap_io.h"
#include "providers/ofi/domain_lock.h"
#include "providers/ofi/errors.h"
#include "providers/ofi/handshake.h"
#include "providers/ofi/host_port.h"
#include "providers/ofi/settings.h"
#include "providers/ofi/tcp_socket.h"

namespace zsock::ofi {
namespace {

constexpr uint64_t kUserTag = 0x1;
constexpr uint64_t kControlTag = 0x2;
// Capabilities::inject_size at most (the provider's own tx inject size is
// often larger: rxm's eager buffer, shm's 4 KiB).
constexpr size_t kMaxInject = 512;
constexpr size_t kControlBuf = 64 * 1024;
constexpr int kControlRecvs = 8;
// Room for core's emulation header and a serialized key in a control message.
constexpr size_t kControlOverhead = 512;
constexpr int64_t kLivenessIntervalNs = 20 * 1000 * 1000;
constexpr int64_t kMinPollNs = 50 * 1000;     // CQ poll timer without a wait object
constexpr int64_t kMaxPollNs = 1000 * 1000;
// cq_wait=sockets: the timer is only a backstop (the sockets wake a
// sleeper), for progress that no socket announces.
constexpr int64_t kMinBackstopNs = 1000 * 1000;
// cq_wait=sockets: from this many endpoints on a CQ on, a poll reads only
// the fi CQs of endpoints with something to find (OfiCq::Progress).
constexpr size_t kSelectiveMin = 8;
// How often a sleeper wakes while an endpoint of its CQ lingers.
constexpr int64_t kLingerTickNs = 5 * 1000 * 1000;
// After a graceful close, how long a posted receive waits for the rest of
// what the peer announced before the connection is reported lost.
constexpr int64_t kLingerNs = 1000 * 1000 * 1000;
// Control message: graceful close, a record (core/flow_window.h) of the
// user messages sent; the flow report (RDM over rxm, SetFlow) is the other.
constexpr uint8_t kFinMarker = 0xf1;



class OfiFabric;
class OfiEndpoint;
class OfiCq;

// One operation in flight. fi_context2 first: libfabric may use it (FI_CONTEXT2).
struct Request {
  fi_context2 fi_ctx;
  OpType op = OpType::kSend;
  uint64_t context = 0;
  OfiEndpoint* ep = nullptr;
  size_t len = 0;
  bool control = false;
  bool orphaned = false;          // its endpoint has gone; drop its completion
  std::vector<uint8_t> owned;     // control message bytes / control receive buffer
  uint64_t operand[2] = {0, 0};   // atomic operands
  uint64_t result = 0;            // atomic result lands here
  uint64_t* user_result = nullptr;
  std::shared_ptr<MemoryRegion> pin;  // FI_MR_LOCAL: a cached registration of the buffer
  // In its endpoint's list of operations handed to libfabric (RequestList).
  Request* prev = nullptr;
  Request* next = nullptr;
  bool listed = false;
};

// The operations an endpoint has handed to libfabric and not yet completed:
// an intrusive list, so that posting and completing one costs no allocation
// and no hashing (a hash set was a twentieth of a small message's cost).
class RequestList {
 public:
  void insert(Request* r) {
    r->prev = nullptr;
    r->next = head_;
    if (head_ != nullptr) head_->prev = r;
    head_ = r;
    r->listed = true;
  }
  void erase(Request* r) {
    if (!r->listed) return;
    if (r->prev != nullptr) r->prev->next = r->next;
    else head_ = r->next;
    if (r->next != nullptr) r->next->prev = r->prev;
    r->prev = r->next = nullptr;
    r->listed = false;
  }
  // `r` must be a live request (e.g. one named by a CQ entry).
  static bool contains(const Request* r) { return r->listed; }
  Request* front() const { return head_; }
  bool empty() const { return head_ == nullptr; }

 private:
  Request* head_ = nullptr;
};

// Requests are recycled through a small per-thread cache: a ping-pong posts
// and completes two per round trip, and malloc plus free (core's release
// hooks included) cost more than the rest of a post. Written here because
// no library allocator recycles whole objects with their buffers' capacity.
class RequestCache {
 public:
  static Request* Get() {
    if (!t_gone && t_cache.head_ != nullptr) {
      Request* r = t_cache.head_;
      t_cache.head_ = r->next;
      --t_cache.count_;
      r->next = nullptr;
      return r;
    }
    return new Request();
  }
  static void Put(Request* r) {
    if (t_gone || t_cache.count_ >= kMax) {
      delete r;
      return;
    }
    Reset(r);
    r->next = t_cache.head_;
    t_cache.head_ = r;
    ++t_cache.count_;
  }

 private:
  static constexpr int kMax = 32;
  ~RequestCache() {
    t_gone = true;  // a request completed later on this thread is deleted
    while (head_ != nullptr) {
      Request* r = head_;
      head_ = r->next;
      delete r;
    }
  }
  // Fresh, but for a small buffer's capacity (control receive buffers,
  // 64 KiB each, are not kept); the pin goes back to the cache now. Field
  // by field: `*r = Request()` built a whole request and moved it in, about
  // 70 instructions on every message (a quarter of what an empty poll
  // costs). A field added to Request changes its size, and the
  // static_assert then asks for it to be reset here too.
  static void Reset(Request* r) {
    static_assert(sizeof(Request) == 200, "a new Request field: reset it in RequestCache::Reset");
    r->fi_ctx = {};
    r->op = OpType::kSend;
    r->context = 0;
    r->ep = nullptr;
    r->len = 0;
    r->control = false;
    r->orphaned = false;
    if (r->owned.capacity() <= 64) {
      r->owned.clear();
    } else {
      std::vector<uint8_t>().swap(r->owned);
    }
    r->operand[0] = r->operand[1] = 0;
    r->result = 0;
    r->user_result = nullptr;
    r->pin.reset();
    r->prev = r->next = nullptr;
    r->listed = false;
  }

  Request* head_ = nullptr;
  int count_ = 0;
  static thread_local RequestCache t_cache;
  // Trivially destructible, so readable after t_cache's destructor ran
  // (thread exit, static destruction on the main thread).
  static thread_local bool t_gone;
};
thread_local RequestCache RequestCache::t_cache;
thread_local bool RequestCache::t_gone = false;

// ------------------------------------------------------------ memory


// The fabric's private record of one registration: what AccessLocal checks
// (never the range a key claims). `active` counts accesses in progress, so
// that Revoke waits for them without taking a lock.
struct RegRecord {
  uint64_t addr = 0;
  uint64_t len = 0;
  uint32_t access = 0;
  std::atomic<bool> revoked{false};
  std::atomic<int> active{0};
};

class OfiRegion final : public MemoryRegion {
 public:
  OfiRegion(OfiFabric* fabric, void* addr, size_t len, uint32_t access, fid_mr* mr,
            std::vector<uint8_t> blob, uint64_t serial, RegRecord* record)
      : MemoryRegion(addr, len, access), fabric_(fabric), mr_(mr), blob_(std::move(blob)),
        desc_(fi_mr_desc(mr)), serial_(serial), record_(record) {}
  ~OfiRegion() override;
  void* desc() const override { return desc_; }
  RemoteKey remote_key() const override {
    RemoteKey k;
    k.addr = reinterpret_cast<uint64_t>(addr());
    k.length = length();
    k.access = access();
    k.blob = blob_;
    return k;
  }
  // Stops emulated access (waiting for one in progress) and closes the MR,
  // which stops native access: at once when the domain lock is free, else
  // by its next holder (DomainMutex). Safe from the memory-release hooks: no
  // blocking lock, no allocation.
  void Revoke() noexcept override {
    if (!record_->revoked.exchange(true, std::memory_order_seq_cst)) {
      while (record_->active.load(std::memory_order_seq_cst) != 0) sched_yield();
    }
    fid_mr* mr = mr_.exchange(nullptr);
    if (mr != nullptr) CloseMr(mr);
  }
  void CloseMr(fid_mr* mr) noexcept;

 private:
  OfiFabric* fabric_;
  std::atomic<fid_mr*> mr_;
  std::vector<uint8_t> blob_;
  void* desc_;
  uint64_t serial_;     // names the record in the fabric's table
  RegRecord* record_;   // owned by the fabric's table until ~OfiRegion
};

// Remote key blob: u8 flags (1 = raw key follows, 2 = virtual addressing),
// u64 registration serial (unique per fabric: a stale key never names a
// later registration), then the u64 key or the raw key bytes.
constexpr uint8_t kBlobRaw = 1, kBlobVirt = 2;
constexpr size_t kBlobHeader = 9;

// ------------------------------------------------------------ completion queue

// A zsock CQ over the fi CQs of its endpoints. Each endpoint owns an fi CQ
// that is closed with it: closing one endpoint of an fi CQ shared with
// others left rxm (1.17) touching freed memory in fi_trywait.
class OfiCq final : public CompletionQueue {
 public:
  // `fi_waits`: the fi CQs have FI_WAIT_FD objects, and the timer is a
  // backstop of a fixed `backstop_ns`; with `sockets` it is a backstop that
  // backs off from 1 ms to `backstop_ns` (either way no timer at all when
  // that is 0); without either it is the poll timer.
  OfiCq(OfiFabric* fabric, Fd timer, Fd linger_timer, Fd epoll, bool sockets, bool fi_waits,
        int64_t backstop_ns)
      : fabric_(fabric), timer_(std::move(timer)), fi_waits_(fi_waits),
        min_poll_ns_(fi_waits ? backstop_ns
                     : sockets ? std::min(kMinBackstopNs, backstop_ns) : kMinPollNs),
        max_poll_ns_(sockets || fi_waits ? backstop_ns : kMaxPollNs), poll_ns_(min_poll_ns_),
        on_sockets_(sockets), linger_timer_(std::move(linger_timer)), epoll_(std::move(epoll)) {}
  ~OfiCq() override = default;

  int wait_fd() const override { return epoll_.get(); }
  // Core's wake eventfd (and the timer, for providers without a wait
  // object) join the wait set.
  void WatchWake() {
    Watch(wake_fd());
    if (timer_) Watch(timer_.get());
    Watch(linger_timer_.get());
  }
  // An endpoint starts (+1) or ends (-1) a linger: its liveness and CQ fds
  // leave the wait set (at end of file they would keep it readable, every
  // sleep a spin), and a sleeper wakes every kLingerTickNs instead to see
  // whether the linger is over.
  void AddLinger(int d) { lingering_.fetch_add(d, std::memory_order_relaxed); }
  // `owner`: the endpoint whose liveness the fd signals (an RDM endpoint's
  // bootstrap socket), null for the others.
  void Watch(int fd, const OfiEndpoint* owner = nullptr) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.ptr = const_cast<OfiEndpoint*>(owner);
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev);
  }
  // cq_wait=sockets: one of `owner`'s TCP sockets. Edge-triggered: what
  // matters is that something arrived (or room to send appeared); the
  // socket stays readable while libfabric holds a message no receive was
  // posted for, and at end of file, and level-triggered either would keep
  // a sleeper spinning. The edges are consumed by Progress's Collect (a
  // sleeper's poll(2) on the epoll fd does not consume them), before it
  // reads the fi CQs.
  void WatchSocket(int fd, const OfiEndpoint* owner) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.ptr = const_cast<OfiEndpoint*>(owner);
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev);
  }
  void Unwatch(int fd) { ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr); }

  // An operation was posted (domain lock held). Without a wait object on
  // the fi CQs nothing else wakes a sleeper for what that may have done:
  // libfabric tcp completes a send inside fi_send, and a receive posted for
  // a message tcp holds (it arrived first) completes at the next progress,
  // with no new edge on any socket (conformance
  // WaitWakesForWorkFromAnotherThread). So a sleeper wakes, and a waiter
  // about to sleep polls again instead (ArmProvider).
  void PostedLocked() {  // domain lock held
    if (fi_waits_) return;  // FI_WAIT_FD: libfabric signals its fd
    ++posts_;
    WakeSleeper();
  }

  // The endpoint list changes under mu_ and the domain lock both, so
  // either one keeps it (and its endpoints) in place: Progress's busy path
  // takes only the domain lock.
  void Attach(OfiEndpoint* ep);
  void Detach(OfiEndpoint* ep);

 protected:
  size_t Progress() override;
  bool ArmProvider() override;
  void ClearWakeup() override {
    uint64_t v;
    if (timer_) {
      while (::read(timer_.get(), &v, sizeof(v)) == sizeof(v)) {}
    }
    // While the linger timer is in use (ArmProvider): it may be what woke us.
    if (linger_armed_.load(std::memory_order_relaxed)) {
      ssize_t rc = ::read(linger_timer_.get(), &v, sizeof(v));
      (void)rc;  // EAGAIN: not what woke us
    }
    check_liveness_.store(true, std::memory_order_relaxed);
  }

 public:
  // The next Progress checks the endpoints' liveness (CheckPeer), and a
  // sleeper wakes for it.
  void CheckSoon() {
    check_all_.store(true, std::memory_order_relaxed);
    check_liveness_.store(true, std::memory_order_relaxed);
    WakeSleeper();
  }

 private:
  OfiFabric* fabric_;
  // For providers without a CQ wait object (shm): a blocked waiter wakes
  // after poll_ns_, which starts at 50 us after progress found work and
  // doubles with every idle wakeup up to 1 ms: prompt while traffic flows,
  // about a thousand cheap wakeups a second at most when idle.
  // With cq_wait=sockets the timer is a backstop only: 1 to 64 ms by
  // default (option backstop_ms; 0: never armed). With FI_WAIT_FD it is
  // 64 ms flat (backstop_ms), and bounds what a wake-up libfabric's fd
  // misses can cost: rxm makes its connections during fi_cq_read,
  // rate-limited, and one CI run (of about 150) saw a first message among
  // 40 endpoints never reach a sleeper. Flat, because a sleep of sporadic
  // traffic that starts at 1 ms meets the next message about when the
  // timer fires: 1 ms gaps over rxm cost 18% more per round trip
  // (wakeup_bench p50 184-189 us against 158-161 without the timer).
  Fd timer_;
  const bool fi_waits_;  // the fi CQs have FI_WAIT_FD objects (fi_trywait)
  const int64_t min_poll_ns_, max_poll_ns_;
  std::atomic<int64_t> poll_ns_;
  // PostedLocked's count, and its value when Progress last read the fi CQs
  // (both under the domain lock).
  uint64_t posts_ = 0;
  uint64_t progressed_posts_ = 0;
  // How many fds the wait set holds at most (ReadyOwners::Collect's room):
  // per endpoint three (RDM: its liveness fd and its fi CQ's; MSG: its
  // event queue's and its fi CQ's or its two sockets), then the wake fd,
  // the poll timer and the linger timer. Under mu_ or the domain lock.
  size_t WatchedBoundLocked() const { return 3 * endpoints_.size() + 3; }

  const bool on_sockets_;  // cq_wait=sockets
  // cq_wait=sockets: the endpoints whose sockets had an edge, collected
  // right before a poll's reads (domain lock); with many endpoints, and
  // when all were last read regardless (OfiCq::Progress).
  ReadyOwners hot_;
  std::atomic<int64_t> last_full_ns_{0};
  Fd linger_timer_;
  Mutex linger_mu_;  // arming and disarming linger_timer_ (ArmProvider)
  std::atomic<bool> linger_armed_{false};  // the timer is in use: ClearWakeup reads it
  std::atomic<int> lingering_{0};  // endpoints lingering (AddLinger)
  Fd epoll_;
  Mutex mu_;
  std::vector<OfiEndpoint*> endpoints_;  // see Attach
  // Progress's scratch, reused from poll to poll (under the domain lock).
  std::vector<std::vector<uint8_t>> control_;
  // Control messages drained and not yet handed on (see Progress).
  std::deque<std::pair<OfiEndpoint*, std::vector<uint8_t>>> pending_control_;
  std::atomic<bool> check_liveness_{false};
  std::atomic<bool> check_all_{false};  // CheckSoon: every endpoint, readable or not
  std::atomic<int64_t> last_liveness_ns_{0};
  // The endpoints whose liveness fd is readable: only they are checked,
  // one epoll_wait instead of a system call or two per endpoint on every
  // wake-up and liveness tick.
  ReadyOwners ready_ ABSL_GUARDED_BY(mu_);
};

// ------------------------------------------------------------ fabric

class OfiFabric final : public Fabric {
 public:
  static absl::StatusOr<std::unique_ptr<Fabric>> Open(const FabricSpec& spec);
  ~OfiFabric() override {
    ReleaseCache();
    { DomLock lock(&dom_mu_); }  // closes registrations parked by revocations
    if (domain_) fi_close(&domain_->fid);
    if (fabric_) fi_close(&fabric_->fid);
    if (info_) fi_freeinfo(info_);
  }

  const Capabilities& caps() const override { return caps_; }
  fi_info* info() const { return info_; }
  fid_domain* domain() const { return domain_; }
  fid_fabric* fabric() const { return fabric_; }
  DomainMutex& dom_mu() { return dom_mu_; }
  bool atomics_native() const { return atomics_native_; }
  bool rma_native() const { return rma_native_; }
  // Sends up to this size go by fi_tinject and complete at once (0: none).
  size_t inject_size() const { return inject_size_; }
  bool msg() const { return msg_; }
  // RDM endpoints over rxm window their user sends (kDefaultFlowWindow);
  // 0 where the provider pushes back itself (shm's queues, MSG endpoints'
  // sockets) or flow_window=0.
  size_t flow_window() const {
    if (msg_ || settings_.flow_window == 0) return 0;
    return absl::StrContains(info_->fabric_attr->prov_name, "ofi_rxm") ? settings_.flow_window : 0;
  }
  bool fi_wait_fd() const { return fi_wait_fd_; }
  bool wait_sockets() const { return wait_sockets_; }
  fi_info* MsgHints() const;
  // Remote addresses are virtual addresses when the provider reports
  // FI_MR_VIRT_ADDR, offsets into the registration otherwise (fi_mr(3)).
  bool virt_addr() const { return (info_->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0; }
  bool raw_keys() const { return (info_->domain_attr->mr_mode & FI_MR_RAW) != 0; }
  bool local_mr() const {
    return (info_->domain_attr->mr_mode & FI_MR_LOCAL) != 0 || settings_.mr_local;
  }
  const Settings& settings() const { return settings_; }

  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* addr, size_t len,
                                                               uint32_t access) override {
    if (addr == nullptr || len == 0) {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       "cannot register an empty or null range", "register at least one byte");
    }
    uint64_t fi_access = 0;
    if (access & kLocalRead) fi_access |= FI_SEND | FI_WRITE;
    if (access & kLocalWrite) fi_access |= FI_RECV | FI_READ;
    if (access & kRemoteRead) fi_access |= FI_REMOTE_READ;
    if (access & kRemoteWrite) fi_access |= FI_REMOTE_WRITE;
    if (access & kRemoteAtomic) fi_access |= FI_REMOTE_READ | FI_REMOTE_WRITE;
    // Emulated one-sided access never reaches the provider's RMA path.
    if (!rma_native_) fi_access &= ~(FI_REMOTE_READ | FI_REMOTE_WRITE);
    fi_access |= FI_SEND | FI_RECV | FI_READ | FI_WRITE;  // usable as a local buffer too
    fid_mr* mr = nullptr;
    uint64_t requested_key = next_key_.fetch_add(1);  // ignored with FI_MR_PROV_KEY
    int rc;
    {
      DomLock lock(&dom_mu_);
      rc = fi_mr_reg(domain_, addr, len, fi_access, 0, requested_key, 0, &mr, nullptr);
    }
    if (rc != 0) {
      return FiError(rc, absl::StrCat("fi_mr_reg of ", len, " bytes"),
                     "check the locked-memory limit (ulimit -l) and the provider's MR limits");
    }
    std::vector<uint8_t> blob;
    uint8_t flags = virt_addr() ? kBlobVirt : 0;
    const uint64_t serial = next_serial_.fetch_add(1);
    blob.resize(kBlobHeader);
    std::memcpy(blob.data() + 1, &serial, 8);
    if (raw_keys()) {
      size_t key_size = RemoteKey::kMaxBlob - kBlobHeader;
      std::vector<uint8_t> raw(key_size);
      uint64_t base = 0;
      rc = fi_mr_raw_attr(mr, &base, raw.data(), &key_size, 0);
      if (rc != 0) {
        dom_mu_.CloseMr(mr);
        return FiError(rc, "fi_mr_raw_attr", "the provider's raw keys exceed 119 bytes");
      }
      blob[0] = flags | kBlobRaw;
      blob.insert(blob.end(), raw.begin(), raw.begin() + key_size);
    } else {
      uint64_t key = fi_mr_key(mr);
      blob[0] = flags;
      blob.resize(kBlobHeader + 8);
      std::memcpy(blob.data() + kBlobHeader, &key, 8);
    }
    auto record = std::make_unique<RegRecord>();
    record->addr = reinterpret_cast<uint64_t>(addr);
    record->len = len;
    record->access = access;
    RegRecord* rec = record.get();
    {
      MutexLock lock(&regs_mu_);
      regs_[serial] = std::move(record);
    }
    return std::unique_ptr<MemoryRegion>(
        new OfiRegion(this, addr, len, access, mr, std::move(blob), serial, rec));
  }

  void Forget(uint64_t serial) {
    MutexLock lock(&regs_mu_);
    regs_.erase(serial);
  }

  // Emulated operations arrive with our own key: its serial names our
  // private record, which decides range, rights and liveness. The access
  // runs while the record is held (Revoke waits for it).
  absl::Status AccessLocal(const RemoteKey& rkey, uint64_t addr, size_t len, uint32_t access,
                           absl::FunctionRef<void(void*)> fn) override {
    auto refuse = [&](absl::string_view why) {
      return MakeError(absl::StatusCode::kPermissionDenied, EACCES,
                       absl::StrCat("remote access to [0x", absl::Hex(addr), ", +", len,
                                    ") refused: ", why),
                       "use a key from a live registration and stay inside its range and rights");
    };
    if (rkey.blob.size() < kBlobHeader) return refuse("the key is malformed");
    uint64_t serial;
    std::memcpy(&serial, rkey.blob.data() + 1, 8);
    MutexLock lock(&regs_mu_);
    auto it = regs_.find(serial);
    if (it == regs_.end()) return refuse("no live registration has that key");
    RegRecord& r = *it->second;
    r.active.fetch_add(1, std::memory_order_seq_cst);
    absl::Status st;
    if (r.revoked.load(std::memory_order_seq_cst)) {
      st = refuse("the registration was revoked (its memory was released)");
    } else if (addr < r.addr || len > r.len || addr - r.addr > r.len - len) {
      st = refuse("the range lies outside the registered region");
    } else if ((r.access & access) != access) {
      st = refuse("the registration does not grant that access");
    } else {
      fn(reinterpret_cast<void*>(addr));
    }
    r.active.fetch_sub(1, std::memory_order_seq_cst);
    return st;
  }

  absl::StatusOr<std::unique_ptr<CompletionQueue>> CreateCq() override;
  absl::StatusOr<std::unique_ptr<Listener>> Listen(absl::string_view address) override;
  absl::StatusOr<std::unique_ptr<Endpoint>> Connect(absl::string_view address, CompletionQueue* cq,
                                                    absl::Duration timeout) override;
  absl::StatusOr<std::unique_ptr<Listener>> ListenRdm(absl::string_view address);
  absl::StatusOr<std::unique_ptr<Endpoint>> ConnectRdm(absl::string_view address, CompletionQueue* cq,
                                                       absl::Duration timeout);
  absl::StatusOr<std::unique_ptr<Listener>> ListenMsg(absl::string_view address);
  absl::StatusOr<std::unique_ptr<Endpoint>> ConnectMsg(absl::string_view address, CompletionQueue* cq,
                                                       absl::Duration timeout);
  // MSG: makes an endpoint of a data and a control fi endpoint and connects
  // them: fi_connect to `dest` (active side) or fi_accept of the two
  // connection requests (passive side); waits for FI_CONNECTED on both.
  absl::StatusOr<std::unique_ptr<Endpoint>> EstablishMsg(fi_info* data_info, fi_info* ctrl_info,
                                                         const void* dest, uint64_t nonce,
                                                         CompletionQueue* cq, absl::Time deadline);
  absl::StatusOr<std::unique_ptr<Endpoint>> Establish(Fd oob, std::string local, std::string peer,
                                                      CompletionQueue* cq, absl::Time deadline);

 private:
  OfiFabric() = default;

  Settings settings_;
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  DomainMutex dom_mu_;
  bool atomics_native_ = false;
  bool rma_native_ = false;
  size_t inject_size_ = 0;
  bool msg_ = false;  // FI_EP_MSG endpoints (else FI_EP_RDM)
  bool fi_wait_fd_ = false;   // fi CQs with FI_WAIT_FD (else FI_WAIT_NONE)
  bool wait_sockets_ = false; // cq_wait=sockets (Settings::CqWait)
  Capabilities caps_;
  std::atomic<uint64_t> next_key_{1};
  std::atomic<uint64_t> next_serial_{1};
  std::atomic<uint64_t> next_nonce_{1};
  Mutex regs_mu_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<RegRecord>> regs_ ABSL_GUARDED_BY(regs_mu_);
};

void OfiRegion::CloseMr(fid_mr* mr) noexcept { fabric_->dom_mu().CloseMr(mr); }

OfiRegion::~OfiRegion() {
  Revoke();
  fabric_->Forget(serial_);
}

absl::StatusOr<std::unique_ptr<Fabric>> OfiFabric::Open(const FabricSpec& spec) {
  auto settings = LoadSettings(spec);
  if (!settings.ok()) return settings.status();
  auto f = std::unique_ptr<OfiFabric>(new OfiFabric());
  f->settings_ = *settings;
  const std::string& prov = settings->prov;
  const fi_ep_type type = IsMsgProvider(prov) ? FI_EP_MSG : FI_EP_RDM;
  // shm 1.17 neither refuses a forged or read-only key on its RMA path nor
  // reports the refusal to the initiator (docs/ofi.md): its one-sided
  // operations go through core emulation, which checks our own record.
  const bool rma_wanted = prov != "shm";
  // Atomics first; a provider without them (tcp) or whose atomic variant
  // cannot open a domain (shm 1.17 wants legacy FI_MR_BASIC for it) serves
  // without, and core emulates atomics.
  int rc = 0;
  for (bool atomics : {true, false}) {
    if (atomics && !rma_wanted) continue;
    const uint64_t requested_caps = (type == FI_EP_RDM ? FI_MSG | FI_TAGGED : FI_MSG) |
                                    (rma_wanted ? FI_RMA : 0) | (atomics ? FI_ATOMIC : 0);
    fi_info* hints = MakeHints(*settings, type, requested_caps, kMrModes);
    fi_info* info = nullptr;
    rc = fi_getinfo(kFiVersion, nullptr, nullptr, 0, hints, &info);
    fi_freeinfo(hints);
    if (rc == -FI_ENODATA && atomics) continue;
    if (rc != 0) return NoProvider(*settings, type, requested_caps, rc);
    if (f->info_) fi_freeinfo(f->info_);
    f->info_ = fi_dupinfo(info);
    fi_freeinfo(info);
    // fi_getinfo may offer more primary capabilities than asked for: ask the
    // domain for exactly what was requested.
    f->info_->caps &= requested_caps | FI_READ | FI_WRITE | FI_SEND | FI_RECV | FI_REMOTE_READ |
                      FI_REMOTE_WRITE;
    // zsock honours ALLOCATED and PROV_KEY anyway; with VIRT_ADDR they make
    // the legacy FI_MR_BASIC some provider variants still insist on.
    if (f->info_->domain_attr->mr_mode & FI_MR_VIRT_ADDR) {
      f->info_->domain_attr->mr_mode |= FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    }
    if (f->fabric_ == nullptr && (rc = fi_fabric(f->info_->fabric_attr, &f->fabric_, nullptr)) != 0) {
      return FiError(rc, "fi_fabric", "check the FI_* options of the config string");
    }
    ZS_LOG(kDebug, "ofi: fi_domain for %s (api %u.%u, caps 0x%llx, mr_mode 0x%x, atomics %d)",
           f->info_->fabric_attr->prov_name, FI_MAJOR(f->info_->fabric_attr->api_version),
           FI_MINOR(f->info_->fabric_attr->api_version),
           static_cast<unsigned long long>(f->info_->caps), f->info_->domain_attr->mr_mode, atomics);
    rc = fi_domain(f->fabric_, f->info_, &f->domain_, nullptr);
    if (rc == 0) break;
    if (!atomics) {
      return FiError(rc, absl::StrCat("fi_domain for ", f->info_->fabric_attr->prov_name),
                     "the provider offered a domain it cannot open; try another iface=");
    }
  }
  f->msg_ = type == FI_EP_MSG;
  f->rma_native_ = (f->info_->caps & FI_RMA) != 0;
  f->atomics_native_ = (f->info_->caps & FI_ATOMIC) && !f->local_mr() &&
                       fi_query_atomic(f->domain_, FI_UINT64, FI_SUM, nullptr, FI_FETCH_ATOMIC) == 0 &&
                       fi_query_atomic(f->domain_, FI_UINT64, FI_CSWAP, nullptr, FI_COMPARE_ATOMIC) == 0;
  const std::string prov_name = f->info_->fabric_attr->prov_name;
  Capabilities& c = f->caps_;
  c.provider = "ofi";
  c.spec = absl::StrCat(prov_name, " (", f->msg_ ? "FI_EP_MSG" : "FI_EP_RDM", ", domain ",
                        f->info_->domain_attr->name, ")");
  c.send_recv = Support::kNative;
  c.rdma_read = f->rma_native_ ? Support::kNative : Support::kEmulated;
  c.rdma_write = c.rdma_read;
  c.atomics = f->atomics_native_ ? Support::kNative : Support::kEmulated;
  // One-sided only where the provider progresses data by itself; with
  // manual progress (tcp;ofi_rxm emulates atomics over messages) the
  // target must poll.
  c.atomics_allocated = (f->atomics_native_ && f->info_->domain_attr->data_progress == FI_PROGRESS_AUTO)
                            ? Support::kNative
                            : Support::kEmulated;
  c.max_msg_size = std::min<size_t>(f->info_->ep_attr->max_msg_size, size_t{1} << 30);
  // Emulated transfers travel in one control message each.
  c.max_rma_size = f->rma_native_ ? c.max_msg_size : kControlBuf - kControlOverhead;
  // fi_tinject only where an injected message is with the peer when the
  // call returns: shm copies it into the peer's queue (or says EAGAIN).
  // tcp (under rxm) may keep it in its own send queue, which fi_close
  // drops: a send reported complete would be lost by a close right after.
  f->inject_size_ = (!f->msg_ && prov_name == "shm") ? f->info_->tx_attr->inject_size : 0;
  // No inline promise even so: shm refuses an injection (EAGAIN, and the
  // send is posted instead) until the peer's progress has mapped the
  // connection, so an early small send completes only once the peer polls
  // (conformance InlineSendsCompleteWithoutThePeer).
  c.inline_size = 0;
  // Injected sends (kInjectContext) for every configuration: no completion
  // is reported, so nothing is promised about a close right after (see
  // OfiEndpoint::Inject). Capped: past it the caller's ordinary sends are
  // as cheap, and the copy Inject may make stays small.
  c.inject_size = std::min<size_t>(f->info_->tx_attr->inject_size, kMaxInject);
  c.registration_required = f->local_mr();
  c.peer_on_host = prov_name == "shm";
  using CqWait = Settings::CqWait;
  // Connected endpoints of libfabric tcp wait on their own sockets. The
  // FI_WAIT_FD object costs every arriving message: its fd is an epoll set
  // of libfabric's over tcp's own (which holds the sockets), and every
  // arrival wakes through both and through zsock's epoll set (ofi:tcp 64 B
  // ping-pong 6.93 -> 6.17 us one-way without it, medians of 9 interleaved
  // runs; fi_pingpong, which opens FI_WAIT_NONE CQs, 5.92 beside them).
  // With the sockets in zsock's set directly, a blocked wait still wakes
  // when data arrives (docs/ofi.md "Waiting").
  const bool tcp_msg = f->msg_ && prov_name == "tcp";
  CqWait wait = f->settings_.cq_wait;
  if (wait == CqWait::kSockets && !tcp_msg) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("ofi option cq_wait=sockets needs connected endpoints of libfabric "
                                  "tcp, not ", c.spec),
                     "use it with ofi:tcp only, or write cq_wait=fd or cq_wait=none");
  }
  if (wait == CqWait::kAuto) wait = tcp_msg && ::access("/proc/self/fd", R_OK) == 0 ? CqWait::kSockets : CqWait::kFd;
  if (wait == CqWait::kSockets && ::access("/proc/self/fd", R_OK) != 0) {
    return ErrnoError(errno, "ofi option cq_wait=sockets: /proc/self/fd cannot be read",
                      "mount /proc, or write cq_wait=fd");
  }
  if (wait == CqWait::kFd) {
    fid_cq* probe = nullptr;
    fi_cq_attr attr{};
    attr.format = f->msg_ ? FI_CQ_FORMAT_DATA : FI_CQ_FORMAT_TAGGED;
    attr.wait_obj = FI_WAIT_FD;
    attr.size = 64;
    if (fi_cq_open(f->domain_, &attr, &probe, nullptr) != 0) wait = CqWait::kNone;
    if (probe) fi_close(&probe->fid);
  }
  f->fi_wait_fd_ = wait == CqWait::kFd;
  f->wait_sockets_ = wait == CqWait::kSockets;
  if (f->settings_.backstop_set && wait == CqWait::kNone) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("ofi option backstop_ms applies to cq_wait=sockets and cq_wait=fd, "
                                  "not to CQs without a wait object",
                                  f->settings_.cq_wait == CqWait::kNone
                                      ? ""
                                      : " (this provider offers no FI_WAIT_FD CQ)"),
                     "leave it out: without a wait object a sleeper polls on a timer of 50 us to 1 ms");
  }
  c.wait_fd = wait != CqWait::kNone;
  c.notes.push_back(absl::StrCat(
      "libfabric ", FI_MAJOR(fi_version()), ".", FI_MINOR(fi_version()), ", mr_mode 0x",
      absl::Hex(f->info_->domain_attr->mr_mode), ", ",
      f->info_->domain_attr->data_progress == FI_PROGRESS_AUTO ? "auto" : "manual",
      " data progress, ",
      f->msg_ ? "connected endpoints (fi_listen/fi_connect/fi_accept, address IP:PORT)"
              : "connections bootstrap over TCP (address IP:PORT)"));
  if (f->msg_) {
    c.notes.push_back(
        "each connection is two FI_EP_MSG endpoints (user messages; control messages), "
        "FI_SHUTDOWN on the event queue reports a dead peer");
  }
  if (f->wait_sockets_) {
    c.notes.push_back(
        "cq_wait=sockets: CQs without a wait object (FI_WAIT_NONE); blocking waits sleep on the "
        "endpoints' TCP sockets (found in /proc/self/fd by their addresses)");
  } else if (f->settings_.cq_wait == CqWait::kNone) {
    c.notes.push_back(
        "cq_wait=none: CQs without a wait object (FI_WAIT_NONE), for busy polling: blocking "
        "waits poll with a timer backing off from 50 us to 1 ms");
  } else if (!c.wait_fd) {
    c.notes.push_back(
        "the provider has no CQ wait object: blocking waits poll with a timer backing off "
        "from 50 us to 1 ms (never a busy core)");
  } else if (f->settings_.backstop_ns > 0) {
    c.notes.push_back(absl::StrCat(
        "cq_wait=fd: blocking waits sleep on the fi CQs' FI_WAIT_FD objects (fi_trywait), with a "
        "backstop timer that re-polls a sleeping CQ every backstop_ms=",
        f->settings_.backstop_ns / 1000000));
  }
  if (!rma_wanted) {
    c.notes.push_back(
        "RDMA read/write and atomics: emulated by the target's progress engine, checked against "
        "its own registration record (shm 1.17 does not refuse out-of-bounds or read-only keys "
        "on its RMA path); at most 64 KiB per operation; peers must run as the same user "
        "(shm regions are private to a user)");
  } else if (!f->atomics_native_) {
    c.notes.push_back(absl::StrCat("atomics: emulated by the target's progress engine (",
                                   (f->info_->caps & FI_ATOMIC) ? "fi_query_atomic refused FI_UINT64 FI_SUM/FI_CSWAP"
                                                                 : "the provider has no FI_ATOMIC",
                                   ")"));
  }
  return std::unique_ptr<Fabric>(std::move(f));
}

// ------------------------------------------------------------ CQ methods

// 64 random bits from the kernel (names that must not repeat on a host).
uint64_t RandomU64() {
  uint64_t v = 0;
  if (::getrandom(&v, sizeof(v), 0) != sizeof(v)) {
    v = static_cast<uint64_t>(absl::GetCurrentTimeNanos()) ^ (static_cast<uint64_t>(::getpid()) << 40);
  }
  return v;
}


// Reads the completions now in `cq` (domain lock held by the caller) until a
// read finds fewer than it asked for, handing each to `done(Request*, len,
// absl::Status)` as it is read (`len`: what a receive got); returns how many
// entries it read (0: it was empty). `ep_open` says whether the endpoint
// bound to it is still open. The entries of one read are copied out before
// the first is handed on, so `done` may post again.
template <typename Done>
size_t DrainCq(fid_cq* cq_, bool ep_open, Done&& done) {
  size_t n = 0;
  for (;;) {
    fi_cq_tagged_entry entries[16];
    ssize_t got = fi_cq_read(cq_, entries, 16);
    if (got > 0) {
      for (ssize_t i = 0; i < got; ++i) {
        auto* r = reinterpret_cast<Request*>(entries[i].op_context);
        if (r == nullptr) continue;  // an event that is not one of our operations
        done(r, r->op == OpType::kRecv ? entries[i].len : r->len, absl::OkStatus());
      }
      n += static_cast<size_t>(got);
      // Fewer than asked for: the CQ is empty (an error entry makes the
      // next call say so, and the next poll reads it). Reading again to
      // hear EAGAIN would put a second fi_cq_read on every message's path.
      if (got < 16) return n;
      continue;
    }
    if (got == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(cq_, &err, 0) > 0) {
        absl::Status st = CqError(ep_open ? cq_ : nullptr, &err);
        if (err.op_context == nullptr) {
          // Not tied to an operation of ours (e.g. a failed connection
          // inside the provider): report it, keep going.
          ZS_LOG(kInfo, "ofi CQ error without an operation: %s", st.ToString());
        } else {
          auto* r = reinterpret_cast<Request*>(err.op_context);
          done(r, r->len, std::move(st));
        }
        ++n;
        continue;
      }
    }
    return n;
  }
}

// ------------------------------------------------------------ endpoint

// Completions gathered under the domain lock; a poll rarely finds more
// than a few, which then need no allocation.
using CompletionList = absl::InlinedVector<Completion, 8>;

class OfiEndpoint final : public Endpoint {
 public:
  // An RDM endpoint: `ep` reaches `peer` through `av`; `oob` is the
  // bootstrap socket, kept as the liveness signal and the FIN's carrier.
  OfiEndpoint(OfiFabric* fabric, OfiCq* cq, fid_ep* ep, fid_av* av, fid_cq* fcq, int fcq_fd,
              fi_addr_t peer, Fd oob, EndpointInfo info)
      : Endpoint(fabric, cq), fab_(fabric), cq_(cq), ep_(ep), av_(av), fcq_(fcq), fcq_fd_(fcq_fd),
        peer_(peer), oob_(std::move(oob)), info_(std::move(info)) {
    liveness_by_readiness_ = oob_.get() >= 0;
    cq_->Attach(this);
    cq_->Watch(oob_.get(), this);
    if (fcq_fd_ >= 0) cq_->Watch(fcq_fd_);
  }
  // A connected (FI_EP_MSG) endpoint: `ep` carries user messages and RMA,
  // `cep` core's control messages; `eq` (wait fd `eq_fd`) reports their
  // FI_SHUTDOWN.
  OfiEndpoint(OfiFabric* fabric, OfiCq* cq, fid_ep* ep, fid_ep* cep, fid_eq* eq, int eq_fd,
              fid_cq* fcq, int fcq_fd, EndpointInfo info)
      : Endpoint(fabric, cq), fab_(fabric), cq_(cq), ep_(ep), cep_(cep), eq_(eq), eq_fd_(eq_fd),
        av_(nullptr), fcq_(fcq), fcq_fd_(fcq_fd), peer_(0), info_(std::move(info)) {
    connected_ = false;  // joins the CQ in Connected()
  }

  // MSG: both halves are connected; the endpoint joins its CQ. Fails only
  // when cq_wait=sockets cannot find or duplicate one of its sockets.
  absl::Status Connected() {
    std::array<sockaddr_storage, 2> local{}, peer{};
    std::array<bool, 2> named{};
    {
      DomLock lock(&fab_->dom_mu());
      sockaddr_storage ss{};
      size_t len = sizeof(ss);
      if (fi_getname(&ep_->fid, &ss, &len) == 0) info_.local_address = FormatHostPort(ss);
      len = sizeof(ss);
      if (fi_getpeer(ep_, &ss, &len) == 0) info_.peer_address = FormatHostPort(ss);
      if (fab_->wait_sockets()) {
        for (int i = 0; i < 2; ++i) {
          fid_ep* e = i == 0 ? ep_ : cep_;
          size_t ll = sizeof(local[i]), pl = sizeof(peer[i]);
          named[i] = fi_getname(&e->fid, &local[i], &ll) == 0 && fi_getpeer(e, &peer[i], &pl) == 0;
        }
      }
    }
    // The search outside the domain lock: it may list every fd.
    if (fab_->wait_sockets()) {
      for (int i = 0; i < 2; ++i) {
        if (!named[i]) {
          return MakeError(absl::StatusCode::kUnavailable, ECONNRESET,
                           absl::StrCat("the ofi connection to ", info_.peer_address,
                                        " ended while it was set up (no peer address)"),
                           "check the peer's log");
        }
        sockets_[i] = FindTcpSocket(local[i], peer[i]);
        if (!sockets_[i]) {
          // Without it a blocked wait would not wake for this connection.
          const int err = errno;
          return ErrnoError(err, absl::StrCat("cq_wait=sockets: the TCP socket of the ofi connection to ",
                                              info_.peer_address, " was not found in /proc/self/fd or "
                                              "could not be duplicated"),
                            err == EMFILE || err == ENFILE ? "raise the fd limit (ulimit -n), or write cq_wait=fd"
                                                           : "write cq_wait=fd");
        }
      }
    }
    // Not by readiness: libfabric tcp queues FI_SHUTDOWN (and signals the
    // event queue's fd) only from its own progress, which fi_eq_read
    // drives, so CheckPeer reads the queue at every wake-up and tick.
    liveness_by_readiness_ = false;
    {
      // Watched before Attach publishes the endpoint, under the lock its
      // Shutdown takes.
      DomLock lock(&fab_->dom_mu());
      connected_ = true;
      if (eq_fd_ >= 0) cq_->Watch(eq_fd_);
      if (fcq_fd_ >= 0) cq_->Watch(fcq_fd_);
      for (const Fd& sock : sockets_) {
        if (sock) cq_->WatchSocket(sock.get(), this);
      }
    }
    cq_->Attach(this);
    // A sleeper may have taken the edges of the watches above before the
    // endpoint was in the list: it polls again (and reads this endpoint,
    // whose first read is due).
    cq_->Wake();
    return absl::OkStatus();
  }

  // Whether a readable fd (OfiCq::Watch's owner) announces everything
  // CheckPeer looks for: the bootstrap socket (RDM: the peer's FIN and
  // end), until the end is known and only the linger is left.
  bool Lingering() const { return lingering_.load(std::memory_order_relaxed); }
  // Set before Attach publishes the endpoint (under the CQ's mutex).
  bool LivenessByReadiness() const {
    return liveness_by_readiness_ && !lingering_.load(std::memory_order_relaxed);
  }

  ~OfiEndpoint() override {
    Close();
    cq_->Detach(this);
  }

  // This endpoint's fi CQ, while open (domain lock held: Shutdown closes it
  // under that lock alone).
  fid_cq* cq_fid() const { return fcq_; }
  // MSG: its event queue, while open; fi_trywait covers it too (libfabric
  // tcp signals the EQ's fd for its own progress: trywait resets it).
  fid_eq* eq_fid() const { return eq_; }

  // Reads this endpoint's completions and retries what met EAGAIN; returns
  // how many events it took (fi CQ entries and injected sends).
  size_t ProgressLocked(CompletionList* out, std::vector<std::vector<uint8_t>>* control)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    // Injected sends first (a send posted ahead of them by fi_tsend still
    // reports when libfabric completes it, as before).
    size_t n = TakeInjectedLocked(out);
    if (fcq_ == nullptr) return n;
    read_since_look_ = true;
    n += DrainCq(fcq_, /*ep_open=*/ep_ != nullptr, [&](Request* r, size_t len, absl::Status st) {
      CompleteLocked(r, std::move(st), len, out, control);
    });
    if (peer_closed_ && user_received_ >= fin_count_) cq_->Wake();  // CheckPeer finishes it
    RetryLocked(out);
    return n;
  }

  // Posts the control receives; called once after construction.
  absl::Status Start() {
    DomLock lock(&fab_->dom_mu());
    for (int i = 0; i < kControlRecvs; ++i) {
      if (auto st = PostControlRecvLocked(); !st.ok()) return st;
    }
    return absl::OkStatus();
  }

  // Flow control (RDM over rxm, both sides agreeing in the hello): at most
  // `window` of our user sends are with libfabric beyond what the peer has
  // reported consumed; we report our consumption every quarter of the
  // peer's window (`peer_window`), so that neither side can stall the other.
  void SetFlow(uint32_t window, uint32_t peer_window) {
    DomLock lock(&fab_->dom_mu());
    flow_.Start(window, peer_window);
  }

  const EndpointInfo& info() const override { return info_; }

  absl::Status Send(const void* buf, size_t len, MemoryRegion* mr, uint64_t context) override {
    if (context == kInjectContext && fab_->caps().inject_size > 0) return Inject(buf, len);
    if (len <= fab_->inject_size() && fab_->inject_size() > 0) {
      bool injected = false;
      if (absl::Status st = TryInject(buf, len, context, &injected); !st.ok() || injected) return st;
    }
    auto* r = NewRequest(OpType::kSend, context, len);
    auto d = Desc(mr, buf, len, r);
    if (!d.ok()) return d.status();
    void* desc = *d;
    // By value: an operation that meets EAGAIN is posted again later.
    return Submit(r, [=, this](Request* req) {
      return cep_ ? fi_send(ep_, buf, len, desc, 0, &req->fi_ctx)
                  : fi_tsend(ep_, buf, len, desc, peer_, kUserTag, &req->fi_ctx);
    });
  }

  // An injected send (Capabilities::inject_size, kInjectContext): by
  // fi_inject / fi_tinject, which copy the bytes and report nothing; when
  // the provider says EAGAIN (or sends wait in the backlog, to stay behind
  // them), a copy goes as an ordinary send whose completion is dropped
  // (CompleteLocked). Either way it counts toward the FIN's message count
  // once it is handed over. libfabric's tcp may still hold an injected
  // message in its own queue when the call returns, and fi_close drops that
  // queue: an endpoint closed right after an injected send may lose it (no
  // completion was promised; an ordinary send after it completes only once
  // it has gone, docs/ofi.md).
  absl::Status Inject(const void* buf, size_t len) {
    if (len > fab_->caps().inject_size) {
      return MakeError(absl::StatusCode::kInvalidArgument, EMSGSIZE,
                       absl::StrCat("an injected send of ", len, " bytes exceeds ofi's inject_size ",
                                    fab_->caps().inject_size),
                       "inject at most caps().inject_size bytes, or send with a context");
    }
    {
      DomLock lock(&fab_->dom_mu());
      if (closed_ || dead_) return DownStatusLocked();
      if (backlog_.empty() && FlowOpenLocked()) {
        ssize_t rc = cep_ ? fi_inject(ep_, buf, len, 0) : fi_tinject(ep_, buf, len, peer_, kUserTag);
        if (rc == 0) {
          ++user_sent_ok_;
          flow_.Posted();
          return absl::OkStatus();
        }
        if (rc != -FI_EAGAIN) {
          return FiError(static_cast<int>(rc), cep_ ? "fi_inject" : "fi_tinject",
                         "the provider refused the operation; check sizes");
        }
      }
    }
    auto* r = NewRequest(OpType::kSend, kInjectContext, len);
    r->owned.assign(static_cast<const uint8_t*>(buf), static_cast<const uint8_t*>(buf) + len);
    auto d = Desc(nullptr, r->owned.data(), len, r);
    if (!d.ok()) return d.status();
    void* desc = *d;
    return Submit(r, [=, this](Request* req) {
      return cep_ ? fi_send(ep_, req->owned.data(), req->len, desc, 0, &req->fi_ctx)
                  : fi_tsend(ep_, req->owned.data(), req->len, desc, peer_, kUserTag, &req->fi_ctx);
    });
  }

  // A send of at most inject_size bytes (RDM), injected: the provider
  // copies it out at once, needs no descriptor and reports no completion.
  // Its one Completion waits in injected_, under the domain lock held here
  // anyway, for the next progress of the CQ (ProgressLocked), which hands
  // it straight to a polling caller: pushed from here it took the CQ's own
  // lock and queue, and the poll that took it a second lock. ArmProvider
  // looks at injected_ under the same lock, so WakeSleeper here wakes a
  // sleeper that missed it. *injected = false when it cannot go now (a
  // backlog to stay behind, or EAGAIN): the caller posts it normally.
  absl::Status TryInject(const void* buf, size_t len, uint64_t context, bool* injected) {
    DomLock lock(&fab_->dom_mu());
    if (closed_ || dead_) return DownStatusLocked();
    if (!backlog_.empty() || !FlowOpenLocked()) return absl::OkStatus();
    ssize_t rc = fi_tinject(ep_, buf, len, peer_, kUserTag);
    if (rc == -FI_EAGAIN) return absl::OkStatus();
    if (rc != 0) {
      return FiError(static_cast<int>(rc), "fi_tinject",
                     "the provider refused the operation; check sizes");
    }
    ++user_sent_ok_;
    flow_.Posted();
    *injected = true;
    Completion& c = injected_.emplace_back();
    c.context = context;
    c.op = OpType::kSend;
    c.endpoint = this;
    c.length = len;
    cq_->WakeSleeper();
    return absl::OkStatus();
  }

  // Whether injected sends wait for ProgressLocked (ArmProvider).
  bool HasInjectedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    return !injected_.empty();
  }
  // cq_wait=sockets, many endpoints (OfiCq::Progress): whether reading this
  // endpoint's fi CQ may find anything. Only its sockets' edges (`ready`),
  // its own posts, and what the last read left can give it work:
  // libfabric tcp progresses an fi CQ's own endpoints when it is read.
  bool MayHaveWorkLocked(const ReadyOwners& ready) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    return poll_hint_ || ready.contains(this) || !injected_.empty() || !backlog_.empty() ||
           peer_closed_ || lingering_.load(std::memory_order_relaxed);
  }
  void SetPollHintLocked(bool hint) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) { poll_hint_ = hint; }
  // cq_wait=sockets, before a sleep: whether another read may find work
  // that no edge will announce. The last read found something; or libfabric
  // tcp took bytes from a socket since the last look and left some there:
  // it serves one request per progress and leaves the next ones in the
  // socket (a pipeline of RMA requests completes nothing on the target:
  // OfiSockets.PipelinedRmaToASleepingTargetCompletes stalled). Bytes it
  // does not take are a message it holds until a receive is posted
  // (sleeping on that is right; a post wakes us). Only endpoints read since
  // the last look can have moved (new bytes bring an edge), which keeps a
  // sleep's cost to them when many connections share a CQ.
  bool MayNeedReadBeforeSleepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    if (poll_hint_) return true;
    if (!read_since_look_) return false;
    read_since_look_ = false;
    if (SocketsMovedLocked()) poll_hint_ = true;
    return poll_hint_;
  }
  // Whether tcp took bytes from a socket since the last look and left some
  // (TcpReadProgress, exact where a count of unread bytes alone could
  // come out the same by coincidence).
  bool SocketsMovedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    bool moved = false;
    for (int i = 0; i < 2; ++i) {
      if (!sockets_[i]) continue;
      uint64_t consumed = 0;
      int unread = 0;
      if (!TcpReadProgress(sockets_[i].get(), &consumed, &unread)) continue;
      moved |= unread > 0 && consumed != last_consumed_[i];
      last_consumed_[i] = consumed;
    }
    return moved;
  }

  // Hands on the injected sends' completions; returns how many.
  size_t TakeInjectedLocked(CompletionList* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    const size_t n = injected_.size();
    if (n == 0) return 0;
    for (Completion& c : injected_) cq_->EmitSlot(out) = std::move(c);
    injected_.clear();
    return n;
  }

  absl::Status PostRecv(void* buf, size_t len, MemoryRegion* mr, uint64_t context) override {
    auto* r = NewRequest(OpType::kRecv, context, len);
    auto d = Desc(mr, buf, len, r);
    if (!d.ok()) return d.status();
    void* desc = *d;
    return Submit(r, [=, this](Request* req) {
      return cep_ ? fi_recv(ep_, buf, len, desc, 0, &req->fi_ctx)
                  : fi_trecv(ep_, buf, len, desc, peer_, kUserTag, 0, &req->fi_ctx);
    });
  }

  absl::Status SendControl(std::span<const uint8_t> msg) override {
    if (msg.size() > kControlBuf) {
      return MakeError(absl::StatusCode::kInvalidArgument, EMSGSIZE,
                       absl::StrCat("control message of ", msg.size(), " bytes exceeds ", kControlBuf),
                       "emulated transfers over ofi are limited to 64 KiB per operation");
    }
    return Submit(NewControlSend(msg), [this](Request* req) { return PostControlSend(req); });
  }

  absl::Status Read(void* local, size_t len, MemoryRegion* mr, uint64_t remote_addr,
                    const RemoteKey& rkey, uint64_t context) override {
    if (!fab_->rma_native()) return Endpoint::Read(local, len, mr, remote_addr, rkey, context);
    return Rma(OpType::kRead, local, len, mr, remote_addr, rkey, context);
  }
  absl::Status Write(const void* local, size_t len, MemoryRegion* mr, uint64_t remote_addr,
                     const RemoteKey& rkey, uint64_t context) override {
    if (!fab_->rma_native()) return Endpoint::Write(local, len, mr, remote_addr, rkey, context);
    return Rma(OpType::kWrite, const_cast<void*>(local), len, mr, remote_addr, rkey, context);
  }

  absl::Status FetchAdd(uint64_t* result, uint64_t remote_addr, const RemoteKey& rkey,
                        uint64_t add, uint64_t context) override {
    if (!fab_->atomics_native()) return Endpoint::FetchAdd(result, remote_addr, rkey, add, context);
    return Atomic(OpType::kFetchAdd, result, remote_addr, rkey, add, 0, context);
  }
  absl::Status CompareSwap(uint64_t* result, uint64_t remote_addr, const RemoteKey& rkey,
                           uint64_t compare, uint64_t swap, uint64_t context) override {
    if (!fab_->atomics_native()) {
      return Endpoint::CompareSwap(result, remote_addr, rkey, compare, swap, context);
    }
    return Atomic(OpType::kCompareSwap, result, remote_addr, rkey, compare, swap, context);
  }

  void Close() override {
    SendFin();
    absl::Status why = MakeError(absl::StatusCode::kCancelled, ECANCELED, "the endpoint was closed");
    Shutdown(why, /*closed=*/true);
  }

  // Tells the peer how many user messages it will get from us, so that it
  // delivers all of them before it reports the close (like SDP's
  // DisconnReq): the sends that completed, counted after reading our CQ.
  // RDM: 9 bytes on the bootstrap socket, which TCP delivers before the
  // socket's end (no wait for the peer). MSG: a control message, waited for
  // (locally, at most one second) until it is in the provider's socket.
  void SendFin() {
    CompletionList out;
    {
      DomLock lock(&fab_->dom_mu());
      if (dead_ || ep_ == nullptr || !connected_) return;
      ProgressLocked(&out, nullptr);
      const auto fin = EncodeRecord(kFinMarker, user_sent_ok_);
      if (!cep_) {
        (void)::send(oob_.get(), fin.data(), fin.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      } else {
        auto* r = NewControlSend(fin);
        outstanding_.insert(r);
        const int64_t deadline = absl::GetCurrentTimeNanos() + 1000000000;
        int rc;
        while ((rc = PostControlSend(r)) == -FI_EAGAIN && absl::GetCurrentTimeNanos() < deadline) {
          ProgressLocked(&out, nullptr);
        }
        if (rc != 0) {
          outstanding_.erase(r);
          RequestCache::Put(r);
        } else {
          // CompleteLocked clears fin_req_ (the request itself is recycled).
          fin_req_ = r;
          while (fin_req_ != nullptr && absl::GetCurrentTimeNanos() < deadline) {
            ProgressLocked(&out, nullptr);
            if (fin_req_ != nullptr) sched_yield();
          }
          fin_req_ = nullptr;
        }
      }
    }
    cq_->PushAll(std::span<Completion>(out.data(), out.size()));
  }

  int PostControlSend(Request* req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    return static_cast<int>(
        cep_ ? fi_send(cep_, req->owned.data(), req->owned.size(), nullptr, 0, &req->fi_ctx)
             : fi_tsend(ep_, req->owned.data(), req->owned.size(), nullptr, peer_, kControlTag,
                        &req->fi_ctx));
  }
  int PostControlRecv(Request* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    return static_cast<int>(
        cep_ ? fi_recv(cep_, r->owned.data(), r->owned.size(), nullptr, 0, &r->fi_ctx)
             : fi_trecv(ep_, r->owned.data(), r->owned.size(), nullptr, peer_, kControlTag, 0,
                        &r->fi_ctx));
  }

  // Called by OfiCq::Progress with the domain lock held.
  void CompleteLocked(Request* r, absl::Status st, size_t len, CompletionList* out,
                      std::vector<std::vector<uint8_t>>* control) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    outstanding_.erase(r);
    if (r == fin_req_) fin_req_ = nullptr;
    if (r->control) {
      if (r->op == OpType::kRecv && st.ok() && !dead_) {
        const std::span<const uint8_t> msg(r->owned.data(), len);
        uint64_t consumed;
        if (DecodeRecord(msg, kFinMarker, &fin_count_)) {
          fin_ = true;
        } else if (DecodeRecord(msg, kFlowReportMarker, &consumed)) {
          flow_.PeerReported(consumed);
        } else if (control != nullptr) {
          control->emplace_back(r->owned.begin(), r->owned.begin() + len);
        }
        // Reuse the buffer for the next control message.
        r->fi_ctx = {};
        outstanding_.insert(r);
        int rc = PostControlRecv(r);
        if (rc != 0) {
          outstanding_.erase(r);
          RequestCache::Put(r);
        }
        return;
      }
      RequestCache::Put(r);
      return;
    }
    if (r->op == OpType::kSend && r->context == kInjectContext) {
      // The copy of an injected send (Inject): nothing is reported. A
      // failed one would leave a gap in what the peer gets while later
      // messages still arrive: the endpoint goes down instead (CheckPeer,
      // at the next progress).
      if (st.ok()) {
        ++user_sent_ok_;
      } else if (!closed_ && !dead_ && inject_failed_.ok()) {
        ZS_LOG(kDebug, "an injected ofi send failed: %s", st.ToString().c_str());
        inject_failed_ = MakeError(st.code(), ECONNRESET,
                                   absl::StrCat("an injected send to ", info_.peer_address,
                                                " failed: ", st.message()),
                                   "reconnect; messages after it were not delivered");
        cq_->CheckSoon();
      }
      RequestCache::Put(r);
      return;
    }
    if (r->op == OpType::kRecv &&
        (st.ok() || st.code() == absl::StatusCode::kOutOfRange)) {
      ++user_received_;  // a message was consumed, truncated or not
      ReportConsumedLocked();
    }
    if (r->op == OpType::kSend && st.ok()) ++user_sent_ok_;
    if (st.ok() && r->user_result != nullptr) *r->user_result = r->result;
    // Last: nothing may append to `out` while `c` refers into it.
    Completion& c = cq_->EmitSlot(out);
    c.context = r->context;
    c.op = r->op;
    c.endpoint = this;
    c.length = st.ok() ? (r->op == OpType::kRecv ? len : r->len) : 0;
    c.status = std::move(st);
    RequestCache::Put(r);
  }

  // Periodic liveness check; returns true once the peer is gone. RDM: the
  // bootstrap socket's end (after the FIN record, if the peer closed
  // gracefully). MSG: FI_SHUTDOWN (or an error) on the event queue.
  bool CheckPeer() {
    {
      absl::Status failed;
      {
        DomLock lock(&fab_->dom_mu());
        failed = inject_failed_;
      }
      if (!failed.ok()) {
        Shutdown(failed, /*closed=*/false);
        return true;
      }
    }
    bool gone = false;
    if (!cep_) {
      uint8_t fin[kRecordSize];
      ssize_t n = ::recv(oob_.get(), fin, sizeof(fin), MSG_PEEK | MSG_DONTWAIT);
      uint64_t count = 0;
      if (n == static_cast<ssize_t>(sizeof(fin)) && DecodeRecord(fin, kFinMarker, &count)) {
        (void)::recv(oob_.get(), fin, sizeof(fin), MSG_DONTWAIT);
        DomLock lock(&fab_->dom_mu());
        fin_ = true;
        fin_count_ = count;
        n = ::recv(oob_.get(), fin, 1, MSG_PEEK | MSG_DONTWAIT);
      }
      gone = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) ||
             (n > 0 && fin[0] != kFinMarker);  // not a zsock ofi peer any more
    } else {
      gone = ReadEq();
    }
    if (gone) {
      CompletionList out;
      bool wait_for_data = false;
      {
        DomLock lock(&fab_->dom_mu());
        // Take what the provider finished before it saw the end (the FIN
        // among it, on MSG endpoints).
        if (!dead_) ProgressLocked(&out, nullptr);
        // A peer that closed gracefully told us how much it sent: deliver
        // all of it first (receives posted later still match it).
        wait_for_data = fin_ && user_received_ < fin_count_ && !dead_ && !data_gone_;
        const int64_t now = CoarseNowNs();
        if (wait_for_data && !peer_closed_) {
          peer_closed_ = true;
          lingering_.store(true, std::memory_order_relaxed);
          // At end of file these keep the wait set readable: out, and the
          // CQ's linger tick instead (OfiCq::AddLinger).
          if (oob_) cq_->Unwatch(oob_.get());
          if (eq_fd_ >= 0) cq_->Unwatch(eq_fd_);
          if (fcq_fd_ >= 0) cq_->Unwatch(fcq_fd_);
          for (const Fd& sock : sockets_) {
            if (sock) cq_->Unwatch(sock.get());
          }
          cq_->AddLinger(1);
          // A thread that armed before this saw no linger (no tick) and may
          // be about to sleep on a set that no longer has the fd that would
          // have woken it.
          cq_->Wake();
          last_delivery_ns_ = now;
          received_at_look_ = user_received_;
        }
        // Deliveries are noticed here, at the liveness and linger ticks,
        // not timed as they complete (a clock read per received message).
        if (user_received_ != received_at_look_) {
          received_at_look_ = user_received_;
          last_delivery_ns_ = now;
        }
        // What the peer sent is here or in flight: a receive that stays
        // posted for a second after the peer's end without meeting anything
        // means the rest was lost (libfabric tcp ends its connection on a
        // truncation, dropping what followed).
        if (wait_for_data && UserRecvPostedLocked() && now - last_delivery_ns_ > kLingerNs) {
          wait_for_data = false;
        }
      }
      cq_->PushAll(std::span<Completion>(out.data(), out.size()));
      if (wait_for_data) return false;
      Shutdown(MakeError(absl::StatusCode::kAborted, ECONNRESET,
                         absl::StrCat("the ofi peer ", info_.peer_address,
                                      " closed the connection (it exited, was killed or closed the endpoint)"),
                         "reconnect"),
               /*closed=*/false);
    }
    return gone;
  }

  // MSG: reads the event queue; true once the control connection is shut
  // down (its end follows the FIN in its byte stream) or failed.
  bool ReadEq() {
    DomLock lock(&fab_->dom_mu());
    if (eq_ == nullptr) return eq_gone_;
    for (;;) {
      uint32_t event = 0;
      fi_eq_cm_entry entry{};
      ssize_t n = fi_eq_read(eq_, &event, &entry, sizeof(entry), 0);
      if (n == -FI_EAVAIL) {
        fi_eq_err_entry err{};
        if (fi_eq_readerr(eq_, &err, 0) > 0) {
          ZS_LOG(kInfo, "ofi connection to %s: event queue error: %s", info_.peer_address,
                 fi_strerror(err.err < 0 ? -err.err : err.err));
          eq_gone_ = true;
        }
        continue;
      }
      if (n <= 0) break;
      if (event == FI_SHUTDOWN) {
        eq_gone_ = true;
        // The data connection's end: the provider reads a connection's
        // bytes only into posted receives, so everything sent before it is
        // in our CQ by now; nothing more can come (a truncation ends it too).
        if (entry.fid == &ep_->fid) data_gone_ = true;
      }
    }
    return eq_gone_;
  }

  bool UserRecvPostedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    for (Request* r = outstanding_.front(); r != nullptr; r = r->next) {
      if (!r->control && r->op == OpType::kRecv) return true;
    }
    return false;
  }

  // Whether another user send may go to libfabric now (SetFlow).
  bool FlowOpenLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    return flow_.open();
  }
  static bool IsUserSend(const Request* r) { return r->op == OpType::kSend && !r->control; }

  // Tells the peer how many of its messages our receives consumed, when a
  // quarter of its window has been consumed since the last report (or a
  // report met EAGAIN). Posted at once, never behind the backlog: a backlog
  // held up by our own window must not hold up the report the peer's
  // window waits for.
  void ReportConsumedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    if (!flow_.on() || dead_ || closed_ || ep_ == nullptr) return;
    if (!credit_due_ && !flow_.ReportDue(user_received_)) return;
    auto* r = NewControlSend(EncodeRecord(kFlowReportMarker, user_received_));
    outstanding_.insert(r);
    const int rc = PostControlSend(r);
    if (rc != 0) {
      outstanding_.erase(r);
      RequestCache::Put(r);
      if (rc != -FI_EAGAIN) {
        ZS_LOG(kDebug, "ofi: a flow-control report failed (%s)", fi_strerror(-rc));
      }
      credit_due_ = true;  // again at the next progress
      return;
    }
    flow_.Reported(user_received_);
    credit_due_ = false;
    poll_hint_ = true;
  }

  // Retries operations that met EAGAIN, or that waited for the window.
  void RetryLocked(CompletionList* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    if (credit_due_) ReportConsumedLocked();
    while (!backlog_.empty() && !dead_) {
      auto& [r, post] = backlog_.front();
      const bool user_send = IsUserSend(r);
      if (user_send && !FlowOpenLocked()) return;  // until the peer reports
      int rc = post(r);
      if (rc == -FI_EAGAIN) return;
      Request* req = r;
      backlog_.pop_front();
      if (rc == 0 && user_send) flow_.Posted();
      if (rc != 0) {
        outstanding_.erase(req);
        CompleteLocked(req, FiError(rc, CallName(req), "the provider refused the operation"), 0, out, nullptr);
      } else {
        poll_hint_ = true;  // it may have completed inside the call (cq_wait=sockets)
      }
    }
  }

 private:
  using PostFn = std::function<int(Request*)>;

  // A control send carrying a copy of `bytes`.
  Request* NewControlSend(std::span<const uint8_t> bytes) {
    auto* r = NewRequest(OpType::kSend, 0, bytes.size());
    r->control = true;
    r->owned.assign(bytes.begin(), bytes.end());
    return r;
  }

  Request* NewRequest(OpType op, uint64_t context, size_t len) {
    auto* r = RequestCache::Get();
    r->op = op;
    r->context = context;
    r->ep = this;
    r->len = len;
    return r;
  }

  // The descriptor for a local buffer. FI_MR_LOCAL: a buffer passed without
  // its region gets one from the registration cache, held by the request
  // until it completes. On failure, `r` is deleted.
  absl::StatusOr<void*> Desc(MemoryRegion* mr, const void* buf, size_t len, Request* r) {
    if (mr != nullptr) return mr->desc();
    if (!fab_->local_mr() || len == 0) return nullptr;
    auto reg = fab_->rcache().Get(const_cast<void*>(buf), len, kLocalRead | kLocalWrite);
    if (reg.ok()) {
      r->pin = *reg;
      return r->pin->desc();
    }
    if (reg.status().code() == absl::StatusCode::kUnavailable) {
      // The cache registers whole pages, and a heap buffer shares its page
      // with memory that other code (the provider's own registration among
      // it) frees meanwhile, which invalidates the registration in flight.
      // The buffer itself is live: register exactly it for this operation.
      auto direct = fab_->RegisterMemory(const_cast<void*>(buf), len, kLocalRead | kLocalWrite);
      if (direct.ok()) {
        r->pin = std::shared_ptr<MemoryRegion>(std::move(*direct));
        return r->pin->desc();
      }
      reg = direct.status();
    }
    RequestCache::Put(r);
    return reg.status();
  }

  // Why an operation cannot start on a closed or dead endpoint.
  absl::Status DownStatusLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    return closed_ ? MakeError(absl::StatusCode::kFailedPrecondition, ENOTCONN,
                               "operation on a closed ofi endpoint", "connect a new endpoint")
                   : dead_status_;
  }

  // The libfabric call that posts `r`, for error messages.
  const char* CallName(const Request* r) const {
    switch (r->op) {
      case OpType::kSend: return cep_ ? "fi_send" : "fi_tsend";
      case OpType::kRecv: return cep_ ? "fi_recv" : "fi_trecv";
      case OpType::kRead: return "fi_read";
      case OpType::kWrite: return "fi_writemsg(FI_DELIVERY_COMPLETE)";
      case OpType::kFetchAdd: return "fi_fetch_atomic(FI_SUM)";
      case OpType::kCompareSwap: return "fi_compare_atomic(FI_CSWAP)";
    }
    return "posting an ofi operation";
  }

  // `post` is any callable int(Request*); it becomes a PostFn (a heap
  // allocation) only when the operation must wait in the backlog.
  template <typename Post>
  absl::Status Submit(Request* r, const Post& post) {
    DomLock lock(&fab_->dom_mu());
    if (closed_ || dead_) {
      RequestCache::Put(r);
      return DownStatusLocked();
    }
    outstanding_.insert(r);
    const bool user_send = IsUserSend(r);
    if (!backlog_.empty() || (user_send && !FlowOpenLocked())) {
      backlog_.emplace_back(r, post);  // the window opens when the peer reports
      return absl::OkStatus();
    }
    int rc = post(r);
    if (rc == -FI_EAGAIN) {
      backlog_.emplace_back(r, post);  // retried by progress
      return absl::OkStatus();
    }
    if (rc == 0 && user_send) flow_.Posted();
    if (rc != 0) {
      const char* call = CallName(r);
      outstanding_.erase(r);
      RequestCache::Put(r);
      return FiError(rc, call, "the provider refused the operation; check sizes and registrations");
    }
    poll_hint_ = true;
    cq_->PostedLocked();
    return absl::OkStatus();
  }

  absl::Status DecodeKey(const RemoteKey& rkey, uint64_t remote_addr, size_t len, bool atomic,
                         uint64_t* key, uint64_t* addr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    if (rkey.blob.size() < kBlobHeader || remote_addr < rkey.addr || len > rkey.length ||
        remote_addr - rkey.addr > rkey.length - len) {
      return MakeError(absl::StatusCode::kOutOfRange, EFAULT,
                       absl::StrCat("remote range [0x", absl::Hex(remote_addr), ", +", len,
                                    ") is outside the remote key's region or the key is malformed"),
                       "access only inside the registered region the key names");
    }
    uint8_t flags = rkey.blob[0];
    *addr = (flags & kBlobVirt) ? remote_addr : remote_addr - rkey.addr;
    (void)atomic;
    if (rkey.blob.size() <= kBlobHeader) {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL, "malformed ofi remote key",
                       "pass the key the peer's registration produced");
    }
    if (flags & kBlobRaw) {
      std::string raw(rkey.blob.begin() + kBlobHeader, rkey.blob.end());
      auto it = raw_keys_.find(raw);
      if (it == raw_keys_.end()) {
        uint64_t mapped = 0;
        int rc = fi_mr_map_raw(fab_->domain(), rkey.addr, reinterpret_cast<uint8_t*>(raw.data()),
                               raw.size(), &mapped, 0);
        if (rc != 0) return FiError(rc, "fi_mr_map_raw", "pass the key the peer's registration produced");
        it = raw_keys_.emplace(raw, mapped).first;
      }
      *key = it->second;
    } else {
      if (rkey.blob.size() != kBlobHeader + 8) {
        return MakeError(absl::StatusCode::kInvalidArgument, EINVAL, "malformed ofi remote key",
                         "pass the key the peer's registration produced");
      }
      std::memcpy(key, rkey.blob.data() + kBlobHeader, 8);
    }
    return absl::OkStatus();
  }

  absl::Status Rma(OpType op, void* local, size_t len, MemoryRegion* mr, uint64_t remote_addr,
                   const RemoteKey& rkey, uint64_t context) {
    uint64_t key = 0, addr = 0;
    {
      DomLock lock(&fab_->dom_mu());
      if (auto st = DecodeKey(rkey, remote_addr, len, /*atomic=*/false, &key, &addr); !st.ok()) return st;
    }
    auto* r = NewRequest(op, context, len);
    auto d = Desc(mr, local, len, r);
    if (!d.ok()) return d.status();
    void* desc = *d;
    return Submit(r, [=, this](Request* req) {
      return op == OpType::kRead
                 ? fi_read(ep_, local, len, desc, peer_, addr, key, &req->fi_ctx)
                 : WriteDelivered(local, len, desc, addr, key, req);
    });
  }

  // RMA write completing only once the target has accepted it, so a write
  // through a bad key reports the target's refusal (as an RC QP would)
  // instead of completing locally.
  int WriteDelivered(void* local, size_t len, void* desc, uint64_t addr, uint64_t key, Request* req) {
    iovec iov{local, len};
    fi_rma_iov rma{addr, len, key};
    fi_msg_rma msg{};
    msg.msg_iov = &iov;
    msg.desc = &desc;
    msg.iov_count = 1;
    msg.addr = peer_;
    msg.rma_iov = &rma;
    msg.rma_iov_count = 1;
    msg.context = &req->fi_ctx;
    return static_cast<int>(fi_writemsg(ep_, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE));
  }

  absl::Status Atomic(OpType op, uint64_t* result, uint64_t remote_addr, const RemoteKey& rkey,
                      uint64_t a, uint64_t b, uint64_t context) {
    if (remote_addr % 8 != 0) {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       "atomic on a remote address that is not 8-byte aligned",
                       "atomics operate on aligned 8-byte words");
    }
    uint64_t key = 0, addr = 0;
    {
      DomLock lock(&fab_->dom_mu());
      if (auto st = DecodeKey(rkey, remote_addr, 8, /*atomic=*/true, &key, &addr); !st.ok()) return st;
    }
    auto* r = NewRequest(op, context, 8);
    r->user_result = result;
    if (op == OpType::kFetchAdd) {
      r->operand[0] = a;
    } else {
      r->operand[0] = b;  // swap value
      r->operand[1] = a;  // compare value
    }
    return Submit(r, [=, this](Request* req) {
      if (op == OpType::kFetchAdd) {
        return static_cast<int>(fi_fetch_atomic(ep_, &req->operand[0], 1, nullptr, &req->result, nullptr,
                                                peer_, addr, key, FI_UINT64, FI_SUM, &req->fi_ctx));
      }
      return static_cast<int>(fi_compare_atomic(ep_, &req->operand[0], 1, nullptr, &req->operand[1],
                                                nullptr, &req->result, nullptr, peer_, addr, key,
                                                FI_UINT64, FI_CSWAP, &req->fi_ctx));
    });
  }

  absl::Status PostControlRecvLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    auto* r = NewRequest(OpType::kRecv, 0, kControlBuf);
    r->control = true;
    r->owned.resize(kControlBuf);
    outstanding_.insert(r);
    int rc = PostControlRecv(r);
    if (rc != 0) {
      outstanding_.erase(r);
      RequestCache::Put(r);
      return FiError(rc, "posting an ofi control receive");
    }
    return absl::OkStatus();
  }

  // Ends the endpoint: the fi endpoint is closed (the provider touches no
  // user buffer afterwards), the CQ is drained of its completions, and every
  // operation still outstanding completes with `why`.
  void Shutdown(const absl::Status& why, bool closed) {
    CompletionList out;
    bool fail_emulated = false;
    {
      DomLock lock(&fab_->dom_mu());
      if (closed) closed_ = true;
      if (dead_) return;  // nothing injected since: TryInject checks dead_
      TakeInjectedLocked(&out);  // sent before the end: reported as sent
      dead_ = true;
      dead_status_ = why;
      if (lingering_.exchange(false, std::memory_order_relaxed)) cq_->AddLinger(-1);
      ZS_LOG(kInfo, "ofi endpoint to %s is down: %s", info_.peer_address, why.ToString());
      fail_emulated = true;
      if (oob_) {
        ::shutdown(oob_.get(), SHUT_RDWR);
        cq_->Unwatch(oob_.get());
      }
      if (eq_fd_ >= 0) cq_->Unwatch(eq_fd_);
      // Our duplicates go first: the fi_close below closes the sockets.
      for (Fd& sock : sockets_) {
        if (sock) cq_->Unwatch(sock.get());
        sock.reset();
      }
      if (cep_) {
        fi_shutdown(cep_, 0);
        fi_close(&cep_->fid);
        cep_ = nullptr;
      }
      if (ep_) {
        if (msg_ep_) fi_shutdown(ep_, 0);
        fi_close(&ep_->fid);
        ep_ = nullptr;
      }
      // Completions already in our CQ name our requests: take them now, so
      // nothing refers to a request once it is freed below; then the CQ goes.
      if (fcq_) {
        auto finished = [&](Request* r, size_t len, absl::Status st) {
          // Finished before the close: report what really happened.
          if (outstanding_.contains(r)) CompleteLocked(r, std::move(st), len, &out, nullptr);
        };
        while (DrainCq(fcq_, /*ep_open=*/false, finished) > 0) {}
        if (fcq_fd_ >= 0) cq_->Unwatch(fcq_fd_);
        fi_close(&fcq_->fid);
        fcq_ = nullptr;
        fcq_fd_ = -1;
      }
      backlog_.clear();
      while (Request* r = outstanding_.front()) CompleteLocked(r, why, 0, &out, nullptr);
      if (av_) {
        fi_close(&av_->fid);
        av_ = nullptr;
      }
      if (eq_) {
        fi_close(&eq_->fid);
        eq_ = nullptr;
        eq_fd_ = -1;
      }
    }
    cq_->PushAll(std::span<Completion>(out.data(), out.size()));
    if (fail_emulated) FailEmulated(why);
  }

 private:
  OfiFabric* fab_;
  OfiCq* cq_;
  fid_ep* ep_;
  fid_ep* cep_ = nullptr;  // MSG: the control connection
  fid_eq* eq_ = nullptr;   // MSG: connection events of ep_ and cep_
  int eq_fd_ = -1;
  // MSG, cq_wait=sockets: duplicates of the TCP sockets of ep_ and cep_
  // (FindTcpSocket), watched in the CQ's wait set.
  std::array<Fd, 2> sockets_;
  bool poll_hint_ = true;  // see MayHaveWorkLocked (domain lock)
  std::array<uint64_t, 2> last_consumed_{};  // see SocketsMovedLocked
  bool read_since_look_ = false;      // ... ProgressLocked ran since
  bool liveness_by_readiness_ = false;  // see LivenessByReadiness
  bool eq_gone_ = false;   // MSG: FI_SHUTDOWN seen
  bool data_gone_ = false; // MSG: ... on the data connection
  const bool msg_ep_ = cep_ != nullptr;
  fid_av* av_;
  fid_cq* fcq_;  // this endpoint's own fi CQ
  int fcq_fd_;   // its wait fd, or -1
  uint64_t user_sent_ok_ = 0;   // user sends completed successfully
  FlowWindow flow_;            // flow control (SetFlow): our user sends against the window
  bool credit_due_ = false;         // a report met EAGAIN: again at the next progress
  CompletionList injected_;     // TryInject's completions, for ProgressLocked (domain lock)
  uint64_t user_received_ = 0;  // user messages consumed by receives
  bool fin_ = false;            // the peer announced its close
  uint64_t fin_count_ = 0;      // ... after sending this many messages
  bool peer_closed_ = false;    // its socket closed; delivering what it sent
  // peer_closed_, for OfiCq::Progress: the end is known and CheckPeer
  // finishes it later (the last data arrives, or the linger runs out),
  // which no fd announces: checked at every wake-up and tick.
  std::atomic<bool> lingering_{false};
  int64_t last_delivery_ns_ = 0;  // when CheckPeer last saw user_received_ move (or the close)
  uint64_t received_at_look_ = 0;  // user_received_ then
  fi_addr_t peer_;
  Fd oob_;
  EndpointInfo info_;
  bool closed_ = false;
  bool dead_ = false;
  bool connected_ = true;  // MSG: false until both halves are connected
  absl::Status dead_status_;
  RequestList outstanding_;
  Request* fin_req_ = nullptr;  // MSG: the FIN SendFin waits for
  absl::Status inject_failed_;  // an injected send's copy failed: going down
  std::deque<std::pair<Request*, PostFn>> backlog_;
  absl::flat_hash_map<std::string, uint64_t> raw_keys_;
};

void OfiCq::Attach(OfiEndpoint* ep) {
  MutexLock lock(&mu_);
  DomLock dom(&fabric_->dom_mu());
  endpoints_.push_back(ep);
}

void OfiCq::Detach(OfiEndpoint* ep) {
  MutexLock lock(&mu_);
  DomLock dom(&fabric_->dom_mu());
  std::erase(endpoints_, ep);
  // Its control messages not yet handed on go with it: a later endpoint at
  // the same address must not get them.
  std::erase_if(pending_control_, [ep](const auto& d) { return d.first == ep; });
}

size_t OfiCq::Progress() {
  // A plain load first: a busy poll costs no read-modify-write here.
  bool check = check_liveness_.load(std::memory_order_relaxed) &&
               check_liveness_.exchange(false, std::memory_order_relaxed);
  const int64_t now = CoarseNowNs();
  if (now - last_liveness_ns_.load(std::memory_order_relaxed) > kLivenessIntervalNs) {
    last_liveness_ns_.store(now, std::memory_order_relaxed);
    check = true;
  }
  // Which endpoints' liveness fds are readable (CheckPeer below). Not with
  // cq_wait=sockets: its MSG endpoints are all checked anyway, and the
  // poll below collects the sockets' edges (with the domain lock, right
  // before the reads they call for).
  bool all = false;
  if (check) {
    MutexLock list_lock(&mu_);
    all = check_all_.exchange(false, std::memory_order_relaxed);
    if (!all && !on_sockets_) ready_.Collect(epoll_.get(), WatchedBoundLocked());
  }
  // cq_wait=sockets with many endpoints: an fi CQ read costs libfabric tcp
  // a poll(2) of that endpoint's sockets, so a poll that read every
  // endpoint's grew with the idle connections (100 idle ones made a
  // sporadic round trip 1.3-1.6x slower than with FI_WAIT_FD, whose reads
  // cost an epoll_wait). One epoll_wait names the endpoints whose sockets
  // had an edge; only they, those with posts or work left, and every
  // endpoint every kLivenessIntervalNs (a backstop), are read.
  bool full = true;
  if (on_sockets_) {
    const int64_t last = last_full_ns_.load(std::memory_order_relaxed);
    full = now - last > kLivenessIntervalNs;
    if (full) last_full_ns_.store(now, std::memory_order_relaxed);
  }
  // Completions and control messages are taken out under the domain lock
  // alone (it keeps the endpoint list in place); they are handed on after
  // it is released, since their consumers post again. Control messages
  // wait in one queue, in the order they were drained, for whichever poll
  // takes mu_ first: concurrent polls hand them on in order.
  CompletionList out;
  size_t n = 0;
  bool control = false;
  {
    DomLock lock(&fabric_->dom_mu());
    progressed_posts_ = posts_;
    // cq_wait=sockets: the edges are consumed here, and always followed by
    // the reads (all endpoints', or those with an edge); on a liveness
    // check at least, so that they do not pile up for a sleeper's poll(2).
    const bool selective = on_sockets_ && endpoints_.size() >= kSelectiveMin;
    if (on_sockets_ && (selective || check)) hot_.Collect(epoll_.get(), WatchedBoundLocked());
    for (OfiEndpoint* ep : endpoints_) {
      if (selective && !full && !ep->MayHaveWorkLocked(hot_)) continue;
      control_.clear();
      const size_t before = out.size();
      const size_t k = ep->ProgressLocked(&out, &control_);
      n += k;
      // Found something: there may be more. Found nothing but took bytes
      // and left some (a pipeline of RMA requests, one served per read):
      // read it again, without waiting for the next full pass.
      bool more = k > 0 || out.size() > before || !control_.empty();
      if (!more && selective) more = ep->SocketsMovedLocked();
      ep->SetPollHintLocked(more);
      for (auto& m : control_) pending_control_.emplace_back(ep, std::move(m));
    }
    control = !pending_control_.empty();
  }
  const size_t done = n + out.size();
  if (done > 0) poll_ns_.store(min_poll_ns_, std::memory_order_relaxed);
  if (!out.empty()) PushAll(std::span<Completion>(out.data(), out.size()));
  if (check || control) {
    // mu_ keeps the endpoints in place while their messages are handed on
    // (Detach drops a leaving endpoint's queued messages under both locks).
    MutexLock list_lock(&mu_);
    std::deque<std::pair<OfiEndpoint*, std::vector<uint8_t>>> deliveries;
    {
      DomLock lock(&fabric_->dom_mu());
      deliveries.swap(pending_control_);
    }
    for (auto& [ep, msg] : deliveries) ep->DeliverControl(msg);
    // Liveness after draining: a FIN already received decides how a
    // closed socket is treated.
    if (check) {
      for (OfiEndpoint* ep : endpoints_) {
        if (all || !ep->LivenessByReadiness() || ready_.contains(ep)) ep->CheckPeer();
      }
    }
  }
  return done;
}

bool OfiCq::ArmProvider() {
  {
    // Injected sends wait for the next progress (OfiEndpoint::TryInject,
    // which wakes a sleeper that armed after this look); so do operations
    // posted since (PostedLocked).
    DomLock lock(&fabric_->dom_mu());
    if (posts_ != progressed_posts_) return false;
    const bool sockets = fabric_->wait_sockets();
    for (OfiEndpoint* ep : endpoints_) {
      if (ep->HasInjectedLocked() || (sockets && ep->MayNeedReadBeforeSleepLocked())) return false;
    }
  }
  // RDM without a CQ wait object (shm, cq_wait=none) has nothing for
  // fi_trywait: only the timer.
  if (fi_waits_ || fabric_->msg()) {
    MutexLock list_lock(&mu_);
    // The fids under the domain lock: an endpoint's Shutdown closes them
    // under it (without mu_).
    DomLock lock(&fabric_->dom_mu());
    std::vector<fid*> fids;
    for (OfiEndpoint* ep : endpoints_) {
      // CQs without a wait object are not for fi_trywait; MSG
      // event queues always have one (libfabric tcp signals its fd for its
      // own progress, and trywait resets it: left signalled, it would keep
      // the wait set readable).
      // Nor are a lingering endpoint's: their fds are out of the wait set.
      if (ep->Lingering()) continue;
      if (fid_cq* cq = ep->cq_fid(); cq != nullptr && fi_waits_) fids.push_back(&cq->fid);
      if (fid_eq* eq = ep->eq_fid()) fids.push_back(&eq->fid);
    }
    if (!fids.empty() &&
        fi_trywait(fabric_->fabric(), fids.data(), static_cast<int>(fids.size())) != FI_SUCCESS) {
      return false;
    }
  }
  if (timer_ && max_poll_ns_ > 0) {
    int64_t ns = poll_ns_.load(std::memory_order_relaxed);
    poll_ns_.store(std::min(2 * ns, max_poll_ns_), std::memory_order_relaxed);
    itimerspec ts{};
    ts.it_value.tv_sec = ns / 1000000000;  // backstop_ms may be a second or more
    ts.it_value.tv_nsec = ns % 1000000000;
    if (::timerfd_settime(timer_.get(), 0, &ts, nullptr) != 0) {
      ZS_LOG(kWarn, "ofi: arming the CQ's poll timer (%lld ns) failed: %s", static_cast<long long>(ns),
             std::strerror(errno));
    }
  }
  if (lingering_.load(std::memory_order_relaxed) > 0 ||
      linger_armed_.load(std::memory_order_relaxed)) {
    // Under a lock with the count read inside it, so that a thread that
    // saw no linger cannot disarm the tick of one that saw it.
    MutexLock lock(&linger_mu_);
    itimerspec ts{};
    if (lingering_.load(std::memory_order_relaxed) > 0) {
      ts.it_value.tv_nsec = kLingerTickNs;
      linger_armed_.store(true, std::memory_order_relaxed);
      ::timerfd_settime(linger_timer_.get(), 0, &ts, nullptr);
    } else {
      // The linger is over: disarm, and drain an expiry nobody read.
      ::timerfd_settime(linger_timer_.get(), 0, &ts, nullptr);
      uint64_t v;
      ssize_t rc = ::read(linger_timer_.get(), &v, sizeof(v));
      (void)rc;
      linger_armed_.store(false, std::memory_order_relaxed);
    }
  }
  return true;
}

absl::StatusOr<std::unique_ptr<CompletionQueue>> OfiFabric::CreateCq() {
  // The poll timer (no wait object) or the backstop (FI_WAIT_FD, sockets).
  const bool want_timer = !fi_wait_fd_ || settings_.backstop_ns > 0;
  Fd timer;
  if (want_timer) timer.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  Fd linger_timer(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  Fd epoll(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll || !linger_timer || (want_timer && !timer)) {
    return ErrnoError(errno, "creating the ofi CQ wait set failed", "raise the fd limit (ulimit -n)");
  }
  auto cq = std::unique_ptr<OfiCq>(
      new OfiCq(this, std::move(timer), std::move(linger_timer), std::move(epoll), wait_sockets_,
                fi_wait_fd_, settings_.backstop_ns));
  cq->WatchWake();
  return std::unique_ptr<CompletionQueue>(std::move(cq));
}

// An endpoint's own fi CQ and the fd to wait on it (-1 without a wait object).
absl::Status OpenEndpointCq(fid_domain* domain, bool wait_fd, fid_cq** cq, int* fd) {
  fi_cq_attr attr{};
  attr.format = FI_CQ_FORMAT_TAGGED;
  attr.size = 4096;
  attr.wait_obj = wait_fd ? FI_WAIT_FD : FI_WAIT_NONE;
  int rc = fi_cq_open(domain, &attr, cq, nullptr);
  if (rc != 0) return FiError(rc, "fi_cq_open");
  *fd = -1;
  if (wait_fd && (rc = fi_control(&(*cq)->fid, FI_GETWAIT, fd)) != 0) {
    fi_close(&(*cq)->fid);
    *cq = nullptr;
    return FiError(rc, "fi_control(FI_GETWAIT)");
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------ connections

absl::StatusOr<std::unique_ptr<Endpoint>> OfiFabric::Establish(Fd oob, std::string local,
                                                              std::string peer, CompletionQueue* cq,
                                                              absl::Time deadline) {
  auto* ocq = dynamic_cast<OfiCq*>(cq);
  if (ocq == nullptr) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     "the completion queue does not belong to an ofi fabric",
                     "create the CQ with the same fabric as the endpoint");
  }
  int one = 1;
  ::setsockopt(oob.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  fid_ep* ep = nullptr;
  fid_av* av = nullptr;
  fid_cq* fcq = nullptr;
  int fcq_fd = -1;
  auto fail = [&](absl::Status st) {
    if (ep) fi_close(&ep->fid);
    if (av) fi_close(&av->fid);
    if (fcq) fi_close(&fcq->fid);
    return st;
  };
  OfiHello mine{};
  {
    DomLock lock(&dom_mu_);
    int rc = fi_endpoint(domain_, info_, &ep, nullptr);
    if (rc != 0) return fail(FiError(rc, "fi_endpoint"));
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    av_attr.count = 1;
    if ((rc = fi_av_open(domain_, &av_attr, &av, nullptr)) != 0) return fail(FiError(rc, "fi_av_open"));
    if ((rc = fi_ep_bind(ep, &av->fid, 0)) != 0) return fail(FiError(rc, "fi_ep_bind(av)"));
    if (auto st = OpenEndpointCq(domain_, fi_wait_fd_, &fcq, &fcq_fd); !st.ok()) return fail(st);
    if ((rc = fi_ep_bind(ep, &fcq->fid, FI_TRANSMIT | FI_RECV)) != 0) {
      return fail(FiError(rc, "fi_ep_bind(cq)"));
    }
    if (std::string_view(info_->fabric_attr->prov_name) == "shm") {
      // shm names its region after the pid ("fi_shm://<pid>..."), and pids
      // repeat across pid namespaces sharing one /dev/shm (containers,
      // Bazel's sandbox): two endpoints then open one region and connects
      // are reset. A random name is unique on the host.
      std::string name = absl::StrCat("fi_shm://zsock-", absl::Hex(RandomU64(), absl::kZeroPad16));
      if ((rc = fi_setname(&ep->fid, name.data(), name.size() + 1)) != 0) {
        return fail(FiError(rc, "fi_setname"));
      }
    }
    if ((rc = fi_enable(ep)) != 0) return fail(FiError(rc, "fi_enable"));
    size_t len = sizeof(mine.name);
    if ((rc = fi_getname(&ep->fid, mine.name, &len)) != 0) return fail(FiError(rc, "fi_getname"));
    mine.name_len = static_cast<uint16_t>(len);
  }
  mine.magic = kHelloMagic;
  mine.version = kHelloVersion;
  // Our flow window (0: none). A peer before flow control sends 0 here.
  mine.reserved = static_cast<uint32_t>(flow_window());
  mine.uid = static_cast<uint32_t>(::geteuid());
  if (auto st = IoAll(oob.get(), &mine, sizeof(mine), true, deadline); !st.ok()) return fail(st);
  OfiHello theirs{};
  if (auto st = IoAll(oob.get(), &theirs, sizeof(theirs), false, deadline); !st.ok()) return fail(st);
  if (theirs.magic != kHelloMagic || theirs.version != kHelloVersion ||
      theirs.name_len == 0 || theirs.name_len > sizeof(theirs.name)) {
    return fail(MakeError(absl::StatusCode::kFailedPrecondition, EPROTO,
                          "malformed ofi connection hello",
                          "the peer is not a compatible zsock ofi endpoint"));
  }
  // shm regions are created for their owner only: a peer of another user
  // cannot map ours (fi_av_insert fails on its side) and must not be able
  // to. Both sides see the mismatch and say so, rather than one side failing
  // with EINVAL and the other with a connection reset.
  if (std::string(info_->fabric_attr->prov_name) == "shm" && theirs.uid != mine.uid) {
    return fail(MakeError(absl::StatusCode::kFailedPrecondition, EPERM,
                          absl::StrCat("ofi:shm connects peers of the same user only: the peer runs as uid ",
                                       theirs.uid, ", this process as uid ", mine.uid,
                                       " (shm regions are private to their user)"),
                          "run both peers as one user, or use ofi:tcp;ofi_rxm between users"));
  }
  fi_addr_t peer_addr = FI_ADDR_UNSPEC;
  {
    DomLock lock(&dom_mu_);
    int rc = fi_av_insert(av, theirs.name, 1, &peer_addr, 0, nullptr);
    if (rc != 1) {
      return fail(FiError(rc < 0 ? rc : -FI_EINVAL, "fi_av_insert of the peer's address",
                          "the peer uses another ofi provider or domain; use the same config string"));
    }
  }
  EndpointInfo info;
  info.local_address = local;
  info.peer_address = peer;
  info.peer_on_host = caps_.peer_on_host;
  info.rdma_read = caps_.rdma_read;
  info.rdma_write = caps_.rdma_write;
  info.atomics = caps_.atomics;
  info.notes.push_back(absl::StrCat("ofi provider ", info_->fabric_attr->prov_name, ", domain ",
                                    info_->domain_attr->name));
  auto endpoint = std::make_unique<OfiEndpoint>(this, ocq, ep, av, fcq, fcq_fd, peer_addr,
                                                std::move(oob), std::move(info));
  // Flow control only when both sides window: each then reports its
  // consumption often enough for the other's window.
  if (mine.reserved != 0 && theirs.reserved != 0) endpoint->SetFlow(mine.reserved, theirs.reserved);
  if (auto st = endpoint->Start(); !st.ok()) return st;
  return std::unique_ptr<Endpoint>(std::move(endpoint));
}

class OfiListener final : public Listener {
 public:
  OfiListener(OfiFabric* fabric, Fd sock, std::string address)
      : fabric_(fabric), sock_(std::move(sock)), address_(std::move(address)) {}
  std::string address() const override { return address_; }
  int fd() const override { return sock_.get(); }
  absl::StatusOr<std::unique_ptr<Endpoint>> Accept(CompletionQueue* cq, absl::Duration timeout) override {
    absl::Time deadline = absl::Now() + timeout;
    sockaddr_storage peer{};
    auto fd = AcceptUntil(sock_.get(), deadline, absl::StrCat("ofi address ", address_), 0, &peer);
    if (!fd.ok()) return fd.status();
    // Arrived: its set-up gets the connect timeout (Listener::Accept).
    absl::Duration hs = fabric_->settings().connect_timeout;
    return fabric_->Establish(std::move(*fd), address_, FormatHostPort(peer), cq, absl::Now() + hs);
  }

 private:
  OfiFabric* fabric_;
  Fd sock_;
  std::string address_;
};

absl::StatusOr<std::unique_ptr<Listener>> OfiFabric::ListenRdm(absl::string_view address) {
  socklen_t len = 0;
  auto ss = ParseHostPort(address.empty() ? "127.0.0.1:0" : address, &len);
  if (!ss.ok()) return ss.status();
  Fd sock(::socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!sock) return ErrnoError(errno, "socket() for an ofi listener failed");
  int one = 1;
  ::setsockopt(sock.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(sock.get(), reinterpret_cast<sockaddr*>(&*ss), len) != 0) {
    return ErrnoError(errno, absl::StrCat("binding ofi address ", address, " failed"),
                      errno == EADDRINUSE ? "pick another port" : "use an address of this host");
  }
  if (::listen(sock.get(), 1024) != 0) return ErrnoError(errno, "listen() failed");
  sockaddr_storage bound{};
  socklen_t bl = sizeof(bound);
  ::getsockname(sock.get(), reinterpret_cast<sockaddr*>(&bound), &bl);
  return std::unique_ptr<Listener>(new OfiListener(this, std::move(sock), FormatHostPort(bound)));
}

absl::StatusOr<std::unique_ptr<Endpoint>> OfiFabric::ConnectRdm(absl::string_view address,
                                                               CompletionQueue* cq,
                                                               absl::Duration timeout) {
  socklen_t len = 0;
  auto ss = ParseHostPort(address, &len);
  if (!ss.ok()) return ss.status();
  absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    Fd sock(::socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!sock) return ErrnoError(errno, "socket() for an ofi connection failed");
    if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&*ss), len) == 0) {
      sockaddr_storage local{};
      socklen_t ll = sizeof(local);
      ::getsockname(sock.get(), reinterpret_cast<sockaddr*>(&local), &ll);
      return Establish(std::move(sock), FormatHostPort(local), std::string(address), cq, deadline);
    }
    int err = errno;
    if (err == EINTR && absl::Now() < deadline) continue;
    // Refused at once, as TCP refuses (docs/provider-interface.md, Addresses).
    return ErrnoError(err, absl::StrCat("connecting to ofi address ", address, " failed"),
                      err == ECONNREFUSED ? "start a listener there first" : "check the address and routes");
  }
}

// ------------------------------------------------------------ connected (FI_EP_MSG) endpoints

absl::Status OpenEq(fid_fabric* fabric, fid_eq** eq, int* fd) {
  fi_eq_attr attr{};
  attr.size = 64;
  attr.wait_obj = FI_WAIT_FD;
  int rc = fi_eq_open(fabric, &attr, eq, nullptr);
  if (rc != 0) return FiError(rc, "fi_eq_open", "raise the fd limit (ulimit -n)");
  if ((rc = fi_control(&(*eq)->fid, FI_GETWAIT, fd)) != 0) {
    fi_close(&(*eq)->fid);
    *eq = nullptr;
    return FiError(rc, "fi_control(FI_GETWAIT) on an event queue");
  }
  return absl::OkStatus();
}

// An fi_eq_cm_entry with room for its connection data (the struct ends in
// a flexible array member).
struct CmEvent {
  alignas(fi_eq_cm_entry) uint8_t raw[sizeof(fi_eq_cm_entry) + 256];
  fi_eq_cm_entry* entry() { return reinterpret_cast<fi_eq_cm_entry*>(raw); }
  uint8_t* data() { return raw + sizeof(fi_eq_cm_entry); }
};

// Reads one event from `eq` (sleeping on its fd, reading under the domain
// lock), until `deadline`. Error entries become statuses naming `what`
// (and set *error_entry, when given).
absl::StatusOr<uint32_t> EqNext(DomainMutex* dom_mu, fid_eq* eq, int fd, CmEvent* ev, size_t* len,
                                absl::Time deadline, absl::string_view what,
                                bool* error_entry = nullptr) {
  for (;;) {
    uint32_t event = 0;
    ssize_t n;
    {
      DomLock lock(dom_mu);
      n = fi_eq_read(eq, &event, ev->raw, sizeof(ev->raw), 0);
      if (n == -FI_EAVAIL) {
        fi_eq_err_entry err{};
        if (fi_eq_readerr(eq, &err, 0) > 0) {
          if (error_entry != nullptr) *error_entry = true;
          int e = err.err < 0 ? -err.err : err.err;
          return MakeError(e == ECONNREFUSED ? absl::StatusCode::kUnavailable : absl::StatusCode::kAborted,
                           e < 256 ? e : EIO,
                           absl::StrCat(what, ": the event queue reported ", fi_strerror(e),
                                        " (fi_eq_readerr)"),
                           e == ECONNREFUSED ? "start a listener there first"
                                             : "check that the peer runs zsock with the same ofi provider");
        }
        continue;
      }
    }
    if (n > 0) {
      *len = static_cast<size_t>(n);
      return event;
    }
    if (n != -FI_EAGAIN) return FiError(static_cast<int>(n), absl::StrCat(what, ": fi_eq_read"));
    int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) {
      return MakeError(absl::StatusCode::kDeadlineExceeded, ETIMEDOUT,
                       absl::StrCat(what, ": no connection event in time"),
                       "check that the peer runs zsock with the same ofi provider");
    }
    // The provider may need fi_eq_read itself to progress connections:
    // sleep on the fd in bounded steps.
    pollfd pfd{fd, POLLIN, 0};
    ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 10)));
  }
}

class OfiMsgListener final : public Listener {
 public:
  OfiMsgListener(OfiFabric* fabric, fid_pep* pep, fid_eq* eq, int eq_fd, std::string address)
      : fabric_(fabric), pep_(pep), eq_(eq), eq_fd_(eq_fd), address_(std::move(address)) {}
  ~OfiMsgListener() override {
    MutexLock lock(&mu_);
    for (auto& p : pending_) {
      {
        DomLock dom(&fabric_->dom_mu());
        fi_reject(pep_, p.info->handle, nullptr, 0);
      }
      fi_freeinfo(p.info);
    }
    fi_close(&pep_->fid);
    fi_close(&eq_->fid);
  }
  std::string address() const override { return address_; }
  int fd() const override { return eq_fd_; }

  absl::StatusOr<std::unique_ptr<Endpoint>> Accept(CompletionQueue* cq, absl::Duration timeout) override {
    absl::Time deadline = absl::Now() + timeout;
    MutexLock lock(&mu_);
    auto data = Take(kCmData, 0, deadline);
    if (!data.ok()) return data.status();
    // The control half follows within the connect timeout.
    absl::Time ctrl_deadline = absl::Now() + fabric_->settings().connect_timeout;
    auto ctrl = Take(kCmControl, data->cm.nonce, ctrl_deadline);
    if (!ctrl.ok()) {
      Reject(data->info);
      return ctrl.status();
    }
    auto ep = fabric_->EstablishMsg(data->info, ctrl->info, nullptr, data->cm.nonce, cq,
                                    std::max(ctrl_deadline, absl::Now() + absl::Seconds(1)));
    fi_freeinfo(data->info);
    fi_freeinfo(ctrl->info);
    return ep;
  }

 private:
  struct Pending {
    fi_info* info;
    CmData cm;
  };

  void Reject(fi_info* info) {
    {
      DomLock dom(&fabric_->dom_mu());
      fi_reject(pep_, info->handle, nullptr, 0);
    }
    fi_freeinfo(info);
  }

  // The next connection request of `kind` (and, for control, `nonce`);
  // others wait in pending_ for their own Accept.
  absl::StatusOr<Pending> Take(uint8_t kind, uint64_t nonce, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (;;) {
      for (auto it = pending_.begin(); it != pending_.end(); ++it) {
        if (it->cm.kind == kind && (kind == kCmData || it->cm.nonce == nonce)) {
          Pending p = *it;
          pending_.erase(it);
          return p;
        }
      }
      CmEvent ev{};
      size_t len = 0;
      bool error_entry = false;
      auto event = EqNext(&fabric_->dom_mu(), eq_, eq_fd_, &ev, &len, deadline,
                          absl::StrCat("accepting on ofi address ", address_), &error_entry);
      if (!event.ok()) {
        if (event.status().code() == absl::StatusCode::kDeadlineExceeded) {
          return MakeError(absl::StatusCode::kDeadlineExceeded, ETIMEDOUT,
                           absl::StrCat("no connection arrived at ofi address ", address_, " in time"),
                           "connect a peer to this address, or wait longer");
        }
        if (!error_entry) return event.status();
        ZS_LOG(kInfo, "%s", event.status().ToString());
        continue;  // a failed request (an error entry) does not end the listener
      }
      if (*event != FI_CONNREQ) continue;
      fi_info* info = ev.entry()->info;
      CmData cm{};
      if (len < sizeof(fi_eq_cm_entry) + sizeof(cm)) {
        Reject(info);
        continue;
      }
      std::memcpy(&cm, ev.data(), sizeof(cm));
      if (cm.magic != kHelloMagic || cm.version != kHelloVersion || cm.kind > kCmControl) {
        ZS_LOG(kInfo, "ofi listener %s: rejected a connection request that is not from zsock", address_);
        Reject(info);
        continue;
      }
      pending_.push_back(Pending{info, cm});
    }
  }

  OfiFabric* fabric_;
  fid_pep* pep_;
  fid_eq* eq_;
  int eq_fd_;
  std::string address_;
  Mutex mu_;
  std::vector<Pending> pending_ ABSL_GUARDED_BY(mu_);
};

fi_info* OfiFabric::MsgHints() const {
  fi_info* hints = MakeHints(settings_, FI_EP_MSG, info_->caps & (FI_MSG | FI_RMA | FI_ATOMIC), kMrModes);
  free(hints->fabric_attr->prov_name);
  hints->fabric_attr->prov_name = strdup(info_->fabric_attr->prov_name);
  return hints;
}

absl::StatusOr<std::unique_ptr<Listener>> OfiFabric::ListenMsg(absl::string_view address) {
  socklen_t sl = 0;
  auto ss = ParseHostPort(address.empty() ? "127.0.0.1:0" : address, &sl);
  if (!ss.ok()) return ss.status();
  std::string hp = FormatHostPort(*ss);
  std::string host = hp.substr(0, hp.rfind(':')), port = hp.substr(hp.rfind(':') + 1);
  if (!host.empty() && host[0] == '[') host = host.substr(1, host.size() - 2);
  fi_info* hints = MsgHints();
  fi_info* info = nullptr;
  int rc = fi_getinfo(kFiVersion, host.c_str(), port.c_str(), FI_SOURCE, hints, &info);
  fi_freeinfo(hints);
  if (rc != 0) {
    return FiError(rc, absl::StrCat("fi_getinfo for an ofi listener on ", hp),
                   "use an address of this host on the configured iface");
  }
  fid_eq* eq = nullptr;
  int eq_fd = -1;
  fid_pep* pep = nullptr;
  auto fail = [&](absl::Status st) {
    if (pep) fi_close(&pep->fid);
    if (eq) fi_close(&eq->fid);
    fi_freeinfo(info);
    return st;
  };
  if (auto st = OpenEq(fabric_, &eq, &eq_fd); !st.ok()) return fail(st);
  if ((rc = fi_passive_ep(fabric_, info, &pep, nullptr)) != 0) return fail(FiError(rc, "fi_passive_ep"));
  if ((rc = fi_pep_bind(pep, &eq->fid, 0)) != 0) return fail(FiError(rc, "fi_pep_bind(eq)"));
  if ((rc = fi_listen(pep)) != 0) {
    return fail(FiError(rc, absl::StrCat("fi_listen on ", hp),
                        rc == -FI_EADDRINUSE ? "pick another port" : "use an address of this host"));
  }
  sockaddr_storage bound{};
  size_t bl = sizeof(bound);
  if ((rc = fi_getname(&pep->fid, &bound, &bl)) != 0) return fail(FiError(rc, "fi_getname(pep)"));
  fi_freeinfo(info);
  return std::unique_ptr<Listener>(new OfiMsgListener(this, pep, eq, eq_fd, FormatHostPort(bound)));
}

absl::StatusOr<std::unique_ptr<Endpoint>> OfiFabric::ConnectMsg(absl::string_view address,
                                                               CompletionQueue* cq,
                                                               absl::Duration timeout) {
  socklen_t sl = 0;
  auto ss = ParseHostPort(address, &sl);
  if (!ss.ok()) return ss.status();
  std::string hp = FormatHostPort(*ss);
  std::string host = hp.substr(0, hp.rfind(':')), port = hp.substr(hp.rfind(':') + 1);
  if (!host.empty() && host[0] == '[') host = host.substr(1, host.size() - 2);
  fi_info* hints = MsgHints();
  fi_info* info = nullptr;
  int rc = fi_getinfo(kFiVersion, host.c_str(), port.c_str(), 0, hints, &info);
  fi_freeinfo(hints);
  if (rc != 0) {
    return FiError(rc, absl::StrCat("fi_getinfo for an ofi connection to ", hp),
                   "check the address and the iface= option");
  }
  // Like the RDM path, a refused connection fails at once, as TCP's does.
  const absl::Time deadline = absl::Now() + timeout;
  uint64_t nonce = (static_cast<uint64_t>(::getpid()) << 32) ^ next_nonce_.fetch_add(1) ^
                   static_cast<uint64_t>(absl::GetCurrentTimeNanos());
  auto ep = EstablishMsg(info, info, info->dest_addr, nonce, cq, deadline);
  fi_freeinfo(info);
  return ep;
}

absl::StatusOr<std::unique_ptr<Endpoint>> OfiFabric::EstablishMsg(fi_info* data_info, fi_info* ctrl_info,
                                                                 const void* dest, uint64_t nonce,
                                                                 CompletionQueue* cq, absl::Time deadline) {
  auto* ocq = dynamic_cast<OfiCq*>(cq);
  const bool active = dest != nullptr;
  fid_ep* ep = nullptr;
  fid_ep* cep = nullptr;
  fid_eq* eq = nullptr;
  int eq_fd = -1;
  fid_cq* fcq = nullptr;
  int fcq_fd = -1;
  auto fail = [&](absl::Status st) {
    DomLock lock(&dom_mu_);
    if (cep) fi_close(&cep->fid);
    if (ep) fi_close(&ep->fid);
    if (fcq) fi_close(&fcq->fid);
    if (eq) fi_close(&eq->fid);
    return st;
  };
  if (ocq == nullptr) {
    return fail(MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                          "the completion queue does not belong to an ofi fabric",
                          "create the CQ with the same fabric as the endpoint"));
  }
  {
    DomLock lock(&dom_mu_);
    int rc;
    if (auto st = OpenEq(fabric_, &eq, &eq_fd); !st.ok()) return fail(st);
    if ((rc = fi_endpoint(domain_, data_info, &ep, nullptr)) != 0) return fail(FiError(rc, "fi_endpoint"));
    if ((rc = fi_endpoint(domain_, ctrl_info, &cep, nullptr)) != 0) return fail(FiError(rc, "fi_endpoint"));
    if (auto st = OpenEndpointCq(domain_, fi_wait_fd_, &fcq, &fcq_fd); !st.ok()) return fail(st);
    for (fid_ep* e : {ep, cep}) {
      if ((rc = fi_ep_bind(e, &eq->fid, 0)) != 0) return fail(FiError(rc, "fi_ep_bind(eq)"));
      if ((rc = fi_ep_bind(e, &fcq->fid, FI_TRANSMIT | FI_RECV)) != 0) return fail(FiError(rc, "fi_ep_bind(cq)"));
      if ((rc = fi_enable(e)) != 0) return fail(FiError(rc, "fi_enable"));
    }
  }
  EndpointInfo info;
  info.peer_on_host = caps_.peer_on_host;
  info.rdma_read = caps_.rdma_read;
  info.rdma_write = caps_.rdma_write;
  info.atomics = caps_.atomics;
  info.notes.push_back(absl::StrCat("ofi provider ", info_->fabric_attr->prov_name,
                                    " (connected FI_EP_MSG endpoints), domain ", info_->domain_attr->name));
  // The endpoint owns the fi objects from here; it joins the CQ once
  // connected (until then nothing else reads its event queue).
  auto endpoint = std::make_unique<OfiEndpoint>(this, ocq, ep, cep, eq, eq_fd, fcq, fcq_fd, std::move(info));
  const std::string what = active ? "connecting an ofi endpoint" : "accepting an ofi connection";
  if (auto st = endpoint->Start(); !st.ok()) return st;  // control receives before the peer can send
  {
    DomLock lock(&dom_mu_);
    int rc;
    if (active) {
      CmData cm{kHelloMagic, kHelloVersion, kCmData, 0, nonce};
      if ((rc = fi_connect(ep, dest, &cm, sizeof(cm))) != 0) return FiError(rc, "fi_connect");
      cm.kind = kCmControl;
      if ((rc = fi_connect(cep, dest, &cm, sizeof(cm))) != 0) return FiError(rc, "fi_connect");
    } else {
      if ((rc = fi_accept(ep, nullptr, 0)) != 0) return FiError(rc, "fi_accept");
      if ((rc = fi_accept(cep, nullptr, 0)) != 0) return FiError(rc, "fi_accept");
    }
  }
  bool data_up = false, ctrl_up = false;
  while (!data_up || !ctrl_up) {
    CmEvent ev{};
    size_t len = 0;
    auto event = EqNext(&dom_mu_, eq, eq_fd, &ev, &len, deadline, what);
    if (!event.ok()) return event.status();
    if (*event == FI_CONNECTED) {
      if (ev.entry()->fid == &ep->fid) data_up = true;
      if (ev.entry()->fid == &cep->fid) ctrl_up = true;
    } else if (*event == FI_SHUTDOWN) {
      return MakeError(absl::StatusCode::kUnavailable, ECONNRESET,
                       absl::StrCat(what, ": the peer shut the connection down while it was set up"),
                       "check the peer's log");
    }
  }
  if (auto st = endpoint->Connected(); !st.ok()) return st;
  return std::unique_ptr<Endpoint>(std::move(endpoint));
}

absl::StatusOr<std::unique_ptr<Listener>> OfiFabric::Listen(absl::string_view address) {
  return msg_ ? ListenMsg(address) : ListenRdm(address);
}

absl::StatusOr<std::unique_ptr<Endpoint>> OfiFabric::Connect(absl::string_view address, CompletionQueue* cq,
                                                            absl::Duration timeout) {
  return msg_ ? ConnectMsg(address, cq, timeout) : ConnectRdm(address, cq, timeout);
}

const bool kRegistered = RegisterProvider(ProviderInfo{
    "ofi",
    "libfabric endpoints: reliable-datagram (tcp;ofi_rxm, shm, verbs;ofi_rxm) and connected (tcp, verbs)",
    // verbs configurations share the MSG and rxm code paths; without an
    // RDMA device they are unavailable and the conformance suite skips them.
    {"ofi:tcp;ofi_rxm?iface=lo", "ofi:shm", "ofi:tcp?iface=lo", "ofi:verbs", "ofi:verbs;ofi_rxm"},
    [](const FabricSpec& spec) { return OfiFabric::Open(spec); },
});

}  // namespace
}  // namespace zsock::ofi
