// unet: U-Net-style user-level endpoints over shared memory (the default
// zsock provider; needs nothing installed).
//
// Connection set-up runs over an abstract-namespace Unix SEQPACKET socket:
// each side sends a Hello plus three fds with SCM_RIGHTS (its communication
// segment, its completion queue's eventfd, its fabric's key table), so only
// processes handed the fds can touch them and nothing is left in the file
// system after a crash. The socket then stays open as the liveness signal: it
// closing (or the peer's pidfd becoming readable) marks the peer dead.
//
// Data path (base level): small messages inline in descriptors, larger ones
// through segment buffers. Direct access: RDMA read/write go straight to the
// peer's registered memory with process_vm_readv/writev after checking the
// peer's key table; when cross-memory attach is denied the Endpoint base
// class emulates them through the segment. Atomics are executed by the
// target's progress engine (core emulation). Design notes: docs/unet.md.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <deque>
#include <random>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/copy.h"
#include "core/keyslot.h"
#include "core/fd.h"
#include "core/accept.h"
#include "core/config.h"
#include "core/mutex.h"
#include "core/log.h"
#include "core/provider.h"
#include "core/ready_owners.h"
#include "core/sockaddr.h"
#include "core/status.h"
#include "providers/unet/handshake.h"
#include "providers/unet/liveness.h"
#include "providers/unet/local_registrations.h"
#include "providers/unet/os.h"
#include "providers/unet/segment.h"
#include "providers/unet/settings.h"

namespace zsock::unet {
namespace {

constexpr size_t kMaxMessage = size_t{1} << 30;
// Completions gathered under a lock and pushed after it; inline storage
// keeps the per-message path free of heap allocations.
using Completions = absl::InlinedVector<Completion, 4>;

class UnetFabric;
class UnetEndpoint;
Endpoint* AsEndpoint(UnetEndpoint* ep);  // (defined where UnetEndpoint is complete)

// ------------------------------------------------------------ registrations

class UnetRegion final : public MemoryRegion {
 public:
  UnetRegion(UnetFabric* fabric, void* addr, size_t len, uint32_t access,
             uint32_t slot, uint32_t gen, KeySlot* entry, PrivateSlot* own)
      : MemoryRegion(addr, len, access), fabric_(fabric), slot_(slot), gen_(gen), entry_(entry),
        own_(own) {}
  ~UnetRegion() override;

  RemoteKey remote_key() const override {
    RemoteKey key;
    key.addr = reinterpret_cast<uint64_t>(addr());
    key.length = length();
    key.access = access();
    key.blob.resize(8);
    std::memcpy(key.blob.data(), &slot_, 4);
    std::memcpy(key.blob.data() + 4, &gen_, 4);
    return key;
  }

  void Revoke() noexcept override {
    uint32_t expected = gen_;
    // Only the first revocation acts (the private generation decides).
    if (!own_->gen.compare_exchange_strong(expected, gen_ + 1, std::memory_order_seq_cst)) {
      return;
    }
    entry_->gen.store(gen_ + 1, std::memory_order_seq_cst);  // peers stop here
    // Local emulated accesses are short copies: wait for them.
    while (own_->active.load(std::memory_order_seq_cst) != 0) sched_yield();
    // Peers inside a direct access: wait at most one second, since a peer
    // killed mid-access (or a hostile one) would otherwise hold us forever.
    const int64_t deadline = absl::GetCurrentTimeNanos() + 1000000000;
    while (entry_->active.load(std::memory_order_seq_cst) != 0 &&
           absl::GetCurrentTimeNanos() < deadline) {
      sched_yield();
    }
  }

 private:
  UnetFabric* fabric_;
  uint32_t slot_;
  uint32_t gen_;
  KeySlot* entry_;
  PrivateSlot* own_;
};

bool DecodeKey(const RemoteKey& key, uint32_t* slot, uint32_t* gen) {
  if (key.blob.size() != 8) return false;
  std::memcpy(slot, key.blob.data(), 4);
  std::memcpy(gen, key.blob.data() + 4, 4);
  return true;
}

// Validates (addr, len, access) against a key-table entry (core/keyslot.h).
// On success the caller is counted in entry->active and must call Unpin.
absl::Status PinKey(KeySlot* table, uint32_t slots, const RemoteKey& key, uint64_t addr,
                    size_t len, uint32_t access, KeySlot** pinned) {
  uint32_t slot, gen;
  if (!DecodeKey(key, &slot, &gen) || slot >= slots || (gen & 1) == 0) {
    return RemoteKeyError("the key is malformed", addr, len);
  }
  if (absl::Status st = PinKeySlot(&table[slot], gen, addr, len, access); !st.ok()) return st;
  *pinned = &table[slot];
  return absl::OkStatus();
}

void Unpin(KeySlot* e) { UnpinKeySlot(e); }

// ------------------------------------------------------------ completion queue

class UnetCq final : public CompletionQueue {
 public:
  static absl::StatusOr<std::unique_ptr<UnetCq>> Create() {
    int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (efd < 0) return ErrnoError(errno, "eventfd for a unet CQ failed", "raise the fd limit (ulimit -n)");
    Fd event(efd);
    int epfd = ::epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0) return ErrnoError(errno, "epoll_create1 for a unet CQ failed", "raise the fd limit (ulimit -n)");
    Fd ep(epfd);
    // The eventfds carry no endpoint (data 0); an endpoint's socket and
    // pidfd carry the endpoint (Attach).
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = 0;
    if (::epoll_ctl(epfd, EPOLL_CTL_ADD, efd, &ev) != 0) {
      return ErrnoError(errno, "adding the eventfd to the unet CQ epoll set failed");
    }
    auto bell_fd = CreateMemfd("zsock-unet-bell", kBellBytes);
    if (!bell_fd.ok()) return bell_fd.status();
    auto bell_map = MapFd(bell_fd->get(), kBellBytes, "a unet CQ bell");
    if (!bell_map.ok()) return bell_map.status();
    auto* bell = new (bell_map->get()) CqBell{};
    bell->magic = kBellMagic;
    bell->version = kVersion;
    bell->slots = kBellSlots;
    auto cq = std::unique_ptr<UnetCq>(new UnetCq(std::move(event), std::move(ep),
                                                 std::move(*bell_fd), std::move(*bell_map)));
    if (::epoll_ctl(epfd, EPOLL_CTL_ADD, cq->wake_fd(), &ev) != 0) {
      return ErrnoError(errno, "adding the wake eventfd to the unet CQ epoll set failed");
    }
    return cq;
  }
  ~UnetCq() override;

  int wait_fd() const override { return epoll_.get(); }
  int event_fd() const { return event_.get(); }
  int bell_fd() const { return bell_fd_.get(); }

  // A bit in the bell for a new endpoint (kNoBellSlot when all kBellSlots
  // are taken: that endpoint is polled on every progress). Released by
  // Detach, or by ReleaseSlot when the handshake fails.
  uint32_t AllocateSlot();
  void ReleaseSlot(uint32_t slot);
  // The endpoint has local work (completions to hand out, queued sends, a
  // receive matching a waiting message): look at it on the next progress.
  void Mark(uint32_t slot) { RingBell(bell_, slot); }

  void Attach(UnetEndpoint* ep, uint32_t slot, int watch_fd, int pidfd);
  void Detach(UnetEndpoint* ep, uint32_t slot, int watch_fd, int pidfd);
  void Unwatch(int fd) { ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr); }

 protected:
  size_t Progress() override;
  bool ArmProvider() override;
  void ClearWakeup() override {
    // One read: an eventfd's read returns its whole count and zeroes it.
    uint64_t v;
    ssize_t rc = ::read(event_.get(), &v, sizeof(v));
    (void)rc;  // EAGAIN: woken by something else
    liveness_.Request();
  }

 private:
  UnetCq(Fd event, Fd epoll, Fd bell_fd, Mapping bell_map)
      : event_(std::move(event)),
        epoll_(std::move(epoll)),
        bell_fd_(std::move(bell_fd)),
        bell_map_(std::move(bell_map)),
        bell_(reinterpret_cast<CqBell*>(bell_map_.get())) {}
  // Up to this many endpoints every progress asks each endpoint's rings
  // (a few ns each while they stay in cache); beyond, it reads the bell and
  // asks only the endpoints whose bits are set. With the bell every
  // message costs the receiver one more cache line (the bell word), which
  // a pair of endpoints need not pay; with 500 endpoints the sweep's rings
  // no longer fit the caches and TLB (8 B ping-pong 0.21 -> 31 us).
  static constexpr size_t kSweepMax = 16;
  bool UseBellLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return endpoints_.size() > kSweepMax;
  }

  // Calls fn(endpoint) for each endpoint whose bell bit is set, until fn
  // returns true (then returns true). `clear`: take the bits (a seq_cst
  // exchange, ordered before the reads of the rings: RingBell); otherwise
  // only read them (seq_cst: after the armed flag's store, ArmProvider).
  template <typename Fn>
  bool VisitBellLocked(bool clear, Fn fn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t words = (by_slot_.size() + 63) / 64;
    for (size_t w = 0; w < words; ++w) {
      std::atomic<uint64_t>& word = bell_->ready[w];
      if (word.load(std::memory_order_relaxed) == 0) continue;
      uint64_t bits = clear ? word.exchange(0, std::memory_order_seq_cst)
                            : word.load(std::memory_order_seq_cst);
      while (bits != 0) {
        const size_t slot = w * 64 + static_cast<size_t>(std::countr_zero(bits));
        bits &= bits - 1;
        // A bit may name a free slot (a peer's late ring, or any bit a
        // faulty peer sets): nothing to do.
        UnetEndpoint* ep = slot < by_slot_.size() ? by_slot_[slot] : nullptr;
        if (ep != nullptr && fn(ep)) return true;
      }
    }
    return false;
  }

  Fd event_;
  Fd epoll_;
  Fd bell_fd_;
  Mapping bell_map_;
  CqBell* bell_;
  Mutex mu_;
  std::vector<UnetEndpoint*> endpoints_ ABSL_GUARDED_BY(mu_);
  // Endpoints by bell slot (null: free), and those without a slot.
  std::vector<UnetEndpoint*> by_slot_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_slots_ ABSL_GUARDED_BY(mu_);
  std::vector<UnetEndpoint*> unslotted_ ABSL_GUARDED_BY(mu_);
  LivenessTicker liveness_;
  // The endpoints whose socket or pidfd is readable (a peer's message on
  // the socket, its end, or its exit): only they are looked at on a
  // wake-up or liveness tick, not every endpoint with three system calls
  // (a CQ with 500 idle connections made each wake-up 0.6 ms).
  ReadyOwners ready_ ABSL_GUARDED_BY(mu_);
};

// ------------------------------------------------------------ fabric

class UnetFabric final : public Fabric {
 public:
  static absl::StatusOr<std::unique_ptr<Fabric>> Open(const FabricSpec& spec) {
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

  ~UnetFabric() override { ReleaseCache(); }

  const Capabilities& caps() const override { return caps_; }
  const Settings& settings() const { return settings_; }
  int key_fd() const { return key_fd_.get(); }
  KeySlot* key_table() const { return reinterpret_cast<KeySlot*>(key_map_.get()); }

  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* addr, size_t len,
                                                               uint32_t access) override {
    auto r = RegisterSlot(addr, len, access, 0);
    if (!r.ok()) return r.status();
    return std::unique_ptr<MemoryRegion>(std::move(*r));
  }

  absl::StatusOr<std::unique_ptr<MemoryRegion>> AllocateRegistered(size_t len,
                                                                   uint32_t access) override {
    return AllocateShared(len, access, nullptr);
  }
  absl::StatusOr<std::unique_ptr<MemoryRegion>> AllocateRegisteredFor(Endpoint* ep, size_t len,
                                                                      uint32_t access) override {
    return AllocateShared(len, access, ep);
  }
  // A shared segment announced to every peer, now and later, or (`only`)
  // to that endpoint's peer alone.
  absl::StatusOr<std::unique_ptr<MemoryRegion>> AllocateShared(size_t len, uint32_t access,
                                                               Endpoint* only);

  // Endpoints announce to their peers every shared segment, now and later.
  void AttachEndpoint(UnetEndpoint* ep, int sock);
  void DetachEndpoint(UnetEndpoint* ep);
  void ForgetShared(uint32_t id);

  void ReleaseSlot(uint32_t slot) { local_.Release(slot); }

  absl::Status AccessLocal(const RemoteKey& rkey, uint64_t addr, size_t len, uint32_t access,
                           absl::FunctionRef<void(void*)> fn) override {
    uint32_t slot, gen;
    if (!DecodeKey(rkey, &slot, &gen)) return RemoteKeyError("the key is malformed", addr, len);
    return local_.Access(slot, gen, addr, len, access, fn);
  }

  absl::StatusOr<std::unique_ptr<CompletionQueue>> CreateCq() override {
    auto cq = UnetCq::Create();
    if (!cq.ok()) return cq.status();
    return std::unique_ptr<CompletionQueue>(std::move(*cq));
  }

  absl::StatusOr<std::unique_ptr<Listener>> Listen(absl::string_view address) override;
  absl::StatusOr<std::unique_ptr<Endpoint>> Connect(absl::string_view address,
                                                    CompletionQueue* cq,
                                                    absl::Duration timeout) override;

  // Runs the handshake on a connected socket and builds the endpoint.
  absl::StatusOr<std::unique_ptr<Endpoint>> Handshake(Fd sock, std::string local,
                                                      std::string peer, CompletionQueue* cq,
                                                      absl::Time deadline);

 private:
  UnetFabric(const FabricSpec& spec, const Settings& s, Fd key_fd, Mapping key_map)
      : settings_(s), key_fd_(std::move(key_fd)), key_map_(std::move(key_map)),
        local_(s.key_slots) {
    caps_.provider = "unet";
    caps_.spec = spec.ToString();
    caps_.send_recv = Support::kNative;
    caps_.rdma_read = s.cma ? Support::kNative : Support::kEmulated;
    caps_.rdma_write = caps_.rdma_read;
    caps_.atomics = Support::kEmulated;
    caps_.atomics_allocated = Support::kNative;
    caps_.rma_allocated = Support::kNative;
    caps_.max_msg_size = kMaxMessage;
    // Emulated (cma=off, or a peer that denies cross-memory attach), a
    // read's answer carries its data and headers in one message
    // (kEmulationHeadroom).
    caps_.max_rma_size = kMaxMessage - kEmulationHeadroom;
    caps_.inline_size = kInline;
    caps_.inject_size = kInline;
    caps_.registration_required = false;
    caps_.peer_on_host = true;
    caps_.wait_fd = true;
    if (s.cma) {
      caps_.notes.push_back(
          "rdma read/write: process_vm_readv/writev (probed per connection; "
          "falls back to copying through the segment when denied)");
    } else {
      caps_.notes.push_back("rdma read/write: copied through the segment (unet_cma=off)");
    }
    caps_.notes.push_back(
        "rdma read/write of memory from AllocateRegistered: a copy through this process's "
        "mapping of the peer's shared segment (no kernel, no target progress)");
    caps_.notes.push_back(
        "atomics: CPU atomics on memory from AllocateRegistered (a shared segment; no "
        "target progress needed), otherwise executed by the target's progress engine");
  }

  friend class UnetSharedRegion;

  absl::StatusOr<std::unique_ptr<UnetRegion>> RegisterSlot(void* addr, size_t len,
                                                          uint32_t access, uint32_t shm_id) {
    if (addr == nullptr || len == 0) {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       "cannot register an empty or null range", "register at least one byte");
    }
    auto taken = local_.Take();
    if (!taken.ok()) return taken.status();
    const uint32_t slot = *taken;
    // Generations come from the private record: peers can write the shared one.
    const uint32_t gen = local_.Activate(slot, reinterpret_cast<uint64_t>(addr), len, access);
    PrivateSlot* own = local_.slot(slot);
    KeySlot* e = &key_table()[slot];
    e->addr = own->addr;
    e->len = len;
    e->access = access;
    e->shm_id = shm_id;
    e->gen.store(gen, std::memory_order_release);
    return std::make_unique<UnetRegion>(this, addr, len, access, slot, gen, e, own);
  }

  struct SharedSeg {
    uint32_t id;
    int fd;  // owned by the UnetSharedRegion
    uint64_t base;
    uint64_t size;
  };

  Capabilities caps_;
  Settings settings_;
  Fd key_fd_;
  Mapping key_map_;
  LocalRegistrations local_;
  Mutex ep_mu_;
  std::vector<std::pair<UnetEndpoint*, int>> endpoints_ ABSL_GUARDED_BY(ep_mu_);
  std::vector<SharedSeg> shared_ ABSL_GUARDED_BY(ep_mu_);
  uint32_t next_shm_id_ ABSL_GUARDED_BY(ep_mu_) = 1;
};

UnetRegion::~UnetRegion() {
  Revoke();
  fabric_->ReleaseSlot(slot_);
}

// Sends one shared segment to a peer. Best effort: a peer that does not get
// it (full socket buffer) performs atomics on it through emulation instead.
void AnnounceShared(int sock, uint32_t id, int fd, uint64_t base, uint64_t size) {
  ShmAnnounce a{kShmAnnounce, id, base, size};
  if (SendWithFds(sock, &a, sizeof(a), {&fd, 1}, /*credentials=*/false, MSG_DONTWAIT) !=
      sizeof(a)) {
    ZS_LOG(kInfo, "could not announce shared segment %u to a peer (%s); its atomics on it "
           "will be emulated", id, std::strerror(errno));
  }
}

// Registered memory in a shared segment (memfd) that every peer maps.
class UnetSharedRegion final : public MemoryRegion {
 public:
  UnetSharedRegion(UnetFabric* fabric, uint32_t id, Fd fd, Mapping map,
                   std::unique_ptr<UnetRegion> reg)
      : MemoryRegion(reg->addr(), reg->length(), reg->access()),
        fabric_(fabric), id_(id), fd_(std::move(fd)), map_(std::move(map)), reg_(std::move(reg)) {}
  ~UnetSharedRegion() override {
    reg_.reset();  // revokes: peers' key checks fail from here on
    fabric_->ForgetShared(id_);
  }
  RemoteKey remote_key() const override { return reg_->remote_key(); }
  void Revoke() noexcept override { reg_->Revoke(); }

 private:
  UnetFabric* fabric_;
  uint32_t id_;
  Fd fd_;
  Mapping map_;
  std::unique_ptr<UnetRegion> reg_;
};

absl::StatusOr<std::unique_ptr<MemoryRegion>> UnetFabric::AllocateShared(size_t len,
                                                                         uint32_t access,
                                                                         Endpoint* only) {
  if (len == 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     "cannot allocate an empty registered region", "ask for at least one byte");
  }
  size_t size = (len + 4095) & ~size_t{4095};
  auto fd = CreateMemfd("zsock-unet-shared", size);
  if (!fd.ok()) return fd.status();
  auto map = MapFd(fd->get(), size, "a unet shared segment");
  if (!map.ok()) return map.status();
  MutexLock lock(&ep_mu_);
  uint32_t id = next_shm_id_++;
  auto reg = RegisterSlot(map->get(), len, access, id);
  if (!reg.ok()) return reg.status();
  uint64_t base = reinterpret_cast<uint64_t>(map->get());
  if (only == nullptr) shared_.push_back({id, fd->get(), base, size});
  for (const auto& [ep, sock] : endpoints_) {
    if (only == nullptr || AsEndpoint(ep) == only) {
      AnnounceShared(sock, id, fd->get(), base, size);
    }
  }
  return std::unique_ptr<MemoryRegion>(
      new UnetSharedRegion(this, id, std::move(*fd), std::move(*map), std::move(*reg)));
}

void UnetFabric::AttachEndpoint(UnetEndpoint* ep, int sock) {
  MutexLock lock(&ep_mu_);
  endpoints_.emplace_back(ep, sock);
  for (const auto& seg : shared_) AnnounceShared(sock, seg.id, seg.fd, seg.base, seg.size);
}

void UnetFabric::DetachEndpoint(UnetEndpoint* ep) {
  MutexLock lock(&ep_mu_);
  std::erase_if(endpoints_, [ep](const auto& e) { return e.first == ep; });
}

void UnetFabric::ForgetShared(uint32_t id) {
  MutexLock lock(&ep_mu_);
  std::erase_if(shared_, [id](const SharedSeg& s) { return s.id == id; });
}

// ------------------------------------------------------------ endpoint

class UnetEndpoint final : public Endpoint {
 public:
  struct Parts {
    Fd sock;
    Fd pidfd;
    pid_t peer_pid = 0;
    Fd rx_fd;          // my segment
    Mapping rx;
    SegmentLayout rx_layout;
    Mapping tx;        // peer's segment
    SegmentLayout tx_layout;
    Fd peer_event;     // peer CQ's eventfd
    Mapping peer_bell;  // peer CQ's bell
    uint32_t peer_bell_slot = kNoBellSlot;  // the peer endpoint's bit in it
    uint32_t bell_slot = kNoBellSlot;       // this endpoint's bit in our CQ's bell
    Mapping peer_keys;
    uint32_t peer_key_slots = 0;
    bool cma = false;
    EndpointInfo info;
  };

  UnetEndpoint(UnetFabric* fabric, UnetCq* cq, Parts parts)
      : Endpoint(fabric, cq), fabric_(fabric), cq_(cq), p_(std::move(parts)) {
    peer_bell_ = reinterpret_cast<CqBell*>(p_.peer_bell.get());
    const auto& rl = p_.rx_layout;
    const auto& tl = p_.tx_layout;
    rx_user_ = RingConsumer<Desc>(reinterpret_cast<Desc*>(p_.rx.get() + rl.user_ring), rl.ring_entries);
    rx_ctl_ = RingConsumer<Desc>(reinterpret_cast<Desc*>(p_.rx.get() + rl.ctl_ring), rl.ring_entries);
    // The free rings start full (every buffer free), so production resumes
    // one lap later.
    rx_user_free_ = RingProducer<FreeSlot>(reinterpret_cast<FreeSlot*>(p_.rx.get() + rl.user_free),
                                           rl.nbuffers, rl.nbuffers);
    rx_ctl_free_ = RingProducer<FreeSlot>(reinterpret_cast<FreeSlot*>(p_.rx.get() + rl.ctl_free),
                                          kControlBuffers, kControlBuffers);
    tx_user_ = RingProducer<Desc>(reinterpret_cast<Desc*>(p_.tx.get() + tl.user_ring), tl.ring_entries);
    tx_ctl_ = RingProducer<Desc>(reinterpret_cast<Desc*>(p_.tx.get() + tl.ctl_ring), tl.ring_entries);
    tx_user_free_ = RingConsumer<FreeSlot>(reinterpret_cast<FreeSlot*>(p_.tx.get() + tl.user_free), tl.nbuffers);
    tx_ctl_free_ = RingConsumer<FreeSlot>(reinterpret_cast<FreeSlot*>(p_.tx.get() + tl.ctl_free), kControlBuffers);
    cq_->Attach(this, p_.bell_slot, p_.sock.get(), p_.pidfd.get());
    fabric->AttachEndpoint(this, p_.sock.get());
  }

  ~UnetEndpoint() override {
    Close();
    fabric_->DetachEndpoint(this);
    cq_->Detach(this, p_.bell_slot, p_.sock.get(), p_.pidfd.get());
  }

  const EndpointInfo& info() const override { return p_.info; }

  absl::Status Send(const void* buf, size_t len, MemoryRegion*, uint64_t context) override {
    if (context == kInjectContext && len > kInline) {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       absl::StrCat("an injected send of ", len, " bytes exceeds unet's inject_size ",
                                    kInline),
                       "inject at most caps().inject_size bytes, or send with a context");
    }
    return Enqueue(kUserMsg, static_cast<const uint8_t*>(buf), len, {}, context);
  }

  absl::Status SendControl(std::span<const uint8_t> msg) override {
    return Enqueue(kControlMsg, nullptr, msg.size(),
                   std::vector<uint8_t>(msg.begin(), msg.end()), 0);
  }

  absl::Status PostRecv(void* buf, size_t len, MemoryRegion*, uint64_t context) override {
    MutexLock lock(&mu_);
    if (closed_) return ClosedError();
    if (dead_ && (rx_abandoned_ || !rx_pending_locked())) return dead_status_;
    posted_.push_back({static_cast<uint8_t*>(buf), len, context});
    UpdateHintsLocked();
    // A message may already wait for this receive while another thread
    // sleeps on the CQ: wake it to match them. (Only a sleeper: a write(2)
    // per repost was a tenth of a small-message stream's CPU. ArmAndCheck
    // takes mu_, so an Arm racing with this either sees the message or is
    // seen by WakeSleeper.)
    if (rx_user_.Peek() != nullptr) {
      MarkSelf();  // before the wake-up: the woken thread looks at marked endpoints
      cq_->WakeSleeper();
    }
    return absl::OkStatus();
  }

  absl::Status Read(void* local, size_t len, MemoryRegion* mr, uint64_t remote_addr,
                    const RemoteKey& rkey, uint64_t context) override {
    bool handled = false;
    absl::Status st = MappedAccess(OpType::kRead, local, len, remote_addr, rkey, context, &handled);
    if (handled) return st;
    if (!p_.cma) return Endpoint::Read(local, len, mr, remote_addr, rkey, context);
    return DirectAccess(OpType::kRead, local, len, remote_addr, rkey, context);
  }

  absl::Status Write(const void* local, size_t len, MemoryRegion* mr, uint64_t remote_addr,
                     const RemoteKey& rkey, uint64_t context) override {
    bool handled = false;
    absl::Status st = MappedAccess(OpType::kWrite, const_cast<void*>(local), len, remote_addr,
                                   rkey, context, &handled);
    if (handled) return st;
    if (!p_.cma) return Endpoint::Write(local, len, mr, remote_addr, rkey, context);
    return DirectAccess(OpType::kWrite, const_cast<void*>(local), len, remote_addr, rkey, context);
  }

  absl::Status FetchAdd(uint64_t* result, uint64_t remote_addr, const RemoteKey& rkey,
                        uint64_t add, uint64_t context) override {
    bool handled = false;
    absl::Status st = DirectAtomic(OpType::kFetchAdd, result, remote_addr, rkey, add, 0,
                                   context, &handled);
    if (handled) return st;
    return Endpoint::FetchAdd(result, remote_addr, rkey, add, context);
  }

  absl::Status CompareSwap(uint64_t* result, uint64_t remote_addr, const RemoteKey& rkey,
                           uint64_t compare, uint64_t swap, uint64_t context) override {
    bool handled = false;
    absl::Status st = DirectAtomic(OpType::kCompareSwap, result, remote_addr, rkey, compare,
                                   swap, context, &handled);
    if (handled) return st;
    return Endpoint::CompareSwap(result, remote_addr, rkey, compare, swap, context);
  }

  void Close() override {
    Completions failed;
    {
      MutexLock lock(&mu_);
      if (closed_) return;
      closed_ = true;
      ::shutdown(p_.sock.get(), SHUT_RDWR);
      // Our own shutdown makes the socket readable for good: stop watching
      // it, or every wait on this CQ would spin.
      cq_->Unwatch(p_.sock.get());
      if (p_.pidfd) cq_->Unwatch(p_.pidfd.get());
      absl::Status why = MakeError(absl::StatusCode::kCancelled, ECANCELED,
                                   "the endpoint was closed", "");
      // Sends that completed before the close are reported as sent.
      for (Completion& c : sent_done_) failed.push_back(std::move(c));
      sent_done_.clear();
      FlushLocked(why, &failed);
    }
    for (auto& c : failed) cq_->Push(std::move(c));
    FailEmulated(MakeError(absl::StatusCode::kCancelled, ECANCELED, "the endpoint was closed"));
  }

  // Called by UnetCq::Progress. check_liveness: the socket or pidfd is
  // readable (UnetCq::CollectReadyLocked): read the socket's messages, look
  // for the peer's end.
  size_t Progress(bool check_liveness);
  // Whether Progress would find work (the CQ has armed its bell).
  bool ArmAndCheck();

 private:
  struct PendingSend {
    uint8_t type;
    const uint8_t* data;
    std::vector<uint8_t> owned;  // control messages and queued injected sends keep their bytes here
    size_t len;
    size_t offset;
    bool started;
    uint64_t context;
  };
  struct PostedRecv {
    uint8_t* buf;
    size_t len;
    uint64_t context;
  };
  // Assembly state of a message arriving in chunks.
  struct Incoming {
    bool active = false;
    size_t total = 0;
    size_t got = 0;
    bool truncated = false;
    std::vector<uint8_t> control;  // control messages
  };

  absl::Status ClosedError() const {
    return MakeError(absl::StatusCode::kFailedPrecondition, ENOTCONN,
                     "operation on a closed unet endpoint", "connect a new endpoint");
  }

  bool rx_pending_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return rx_user_.Peek() != nullptr || rx_ctl_.Peek() != nullptr;
  }

  absl::Status Enqueue(uint8_t type, const uint8_t* data, size_t len,
                       std::vector<uint8_t> owned, uint64_t context) {
    if (len > kMaxMessage) {
      return MakeError(absl::StatusCode::kInvalidArgument, EMSGSIZE,
                       absl::StrCat("message of ", len, " bytes exceeds unet's maximum of ",
                                    kMaxMessage),
                       "split the message");
    }
    bool notify = false;
    {
      MutexLock lock(&mu_);
      if (closed_) return ClosedError();
      if (dead_) return dead_status_;
      PendingSend ps{type, data, std::move(owned), len, 0, false, context};
      if (!ps.owned.empty()) ps.data = ps.owned.data();
      auto& q = type == kControlMsg ? ctlq_ : sendq_;
      q.push_back(std::move(ps));
      if (q.size() == 1) {
        // Sends that reached the peer's ring here report at the CQ's next
        // progress of this endpoint, which hands them straight to a polling
        // caller: pushed from here each took the CQ's lock and queue, and
        // the poll that took it a second lock. ArmAndCheck looks at them
        // under mu_, so WakeSleeper wakes a sleeper that armed after it.
        const size_t before = sent_done_.size();
        notify = PushSendsLocked(&sent_done_);
        if (sent_done_.size() > before) {
          MarkSelf();  // before the wake-up: the woken thread looks at marked endpoints
          cq_->WakeSleeper();
        }
      }
      // An injected send still queued (the peer's ring is full) keeps a
      // copy: the caller's buffer is its own again once Send returns. (It
      // is the queue's last entry: the queue is first in, first out.)
      if (context == kInjectContext && !q.empty() && q.back().owned.empty()) {
        PendingSend& last = q.back();
        last.owned.assign(last.data, last.data + last.len);
        last.data = last.owned.data();
      }
      UpdateHintsLocked();
      if (!q.empty()) MarkSelf();  // waits for ring slots or buffers
    }
    if (notify) Notify();
    return absl::OkStatus();
  }

  // Moves pending sends into the peer's rings as far as descriptors and
  // buffers allow. Returns whether anything was published.
  // (`List`: Completions, or sent_done_'s vector.)
  template <typename List>
  bool PushSendsLocked(List* done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    bool published = PushQueueLocked(&ctlq_, done);
    published |= PushQueueLocked(&sendq_, done);
    return published;
  }

  // Moves one queue's messages into the peer's rings (user and control
  // messages use separate rings and buffer pools, so neither blocks the other).
  template <typename List>
  bool PushQueueLocked(std::deque<PendingSend>* queue, List* done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    bool published = false;
    const uint32_t bufsize = p_.tx_layout.buffer_size;
    while (!queue->empty()) {
      PendingSend& ps = queue->front();
      const bool ctl = ps.type == kControlMsg;
      RingProducer<Desc>& ring = ctl ? tx_ctl_ : tx_user_;
      while (!ps.started || ps.offset < ps.len) {
        Desc* d = ring.TryClaim();
        if (d == nullptr) return published;
        size_t chunk;
        uint8_t flags = ps.started ? 0 : kFirst;
        if (!ps.started && ps.len <= kInline) {
          chunk = ps.len;
          flags |= kInlineData;
          if (chunk > 0) std::memcpy(d->data, ps.data, chunk);
          d->buf = 0;
        } else {
          RingConsumer<FreeSlot>& free = ctl ? tx_ctl_free_ : tx_user_free_;
          FreeSlot* fs = free.Peek();
          if (fs == nullptr) return published;
          uint32_t idx = fs->buf;
          free.Release(fs);
          // The owner hands out its own indices; trust but verify.
          uint32_t lo = ctl ? p_.tx_layout.nbuffers : 0;
          uint32_t hi = ctl ? p_.tx_layout.nbuffers + kControlBuffers : p_.tx_layout.nbuffers;
          if (idx < lo || idx >= hi) {
            MarkDeadLocked(MakeError(absl::StatusCode::kDataLoss, EPROTO,
                                     "the unet peer returned an invalid buffer index",
                                     "the peer is faulty; reconnect"));
            return published;
          }
          chunk = std::min<size_t>(bufsize, ps.len - ps.offset);
          CopyBytes(p_.tx.get() + p_.tx_layout.buffers + size_t{idx} * bufsize,
                    ps.data + ps.offset, chunk);
          d->buf = idx;
        }
        d->type = ps.type;
        d->len = static_cast<uint32_t>(chunk);
        d->total = ps.len;
        ps.offset += chunk;
        ps.started = true;
        if (ps.offset == ps.len) flags |= kLast;
        d->flags = flags;
        ring.Publish(d);
        published = true;
      }
      if (!ctl && ps.context != kInjectContext) {
        Completion c;
        c.context = ps.context;
        c.op = OpType::kSend;
        c.length = ps.len;
        c.endpoint = this;
        done->push_back(std::move(c));
      }
      queue->pop_front();
    }
    return published;
  }

  // Tells the peer's CQ to look at the peer endpoint (its bell bit), and
  // wakes it if it sleeps. Called after publishing into the peer's rings or
  // returning its buffers.
  void Notify() {
    // Orders what was published before the bell's reads (RingBell).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    // The sleeper stores armed, then reads the bits (seq_cst, in
    // UnetCq::ArmProvider); we set a bit (a seq_cst RMW), then read armed
    // (seq_cst): one of us sees the other. A bit found already set needs
    // no order: whoever clears it looks at the rings after the fence above.
    RingBell(peer_bell_, p_.peer_bell_slot);
    if (peer_bell_->armed.load(std::memory_order_seq_cst) != 0 &&
        peer_bell_->armed.exchange(0, std::memory_order_seq_cst) != 0) {
      uint64_t one = 1;
      ssize_t rc = ::write(p_.peer_event.get(), &one, sizeof(one));
      (void)rc;  // EAGAIN: the counter is already non-zero, the peer wakes anyway
    }
  }

  void ReturnBuffer(bool ctl, uint32_t idx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    RingProducer<FreeSlot>& ring = ctl ? rx_ctl_free_ : rx_user_free_;
    FreeSlot* fs = ring.TryClaim();
    // Cannot be full while the peer follows the protocol: at most as many
    // indices are returned as exist.
    if (fs == nullptr) {
      MarkDeadLocked(ProtocolError("free ring overflow (peer corrupted its slots)"));
      return;
    }
    fs->buf = idx;
    ring.Publish(fs);
  }

  // A descriptor's fields, read once. The peer may rewrite its descriptors
  // at any moment, so fields are copied out of shared memory a single time
  // and only the copy is validated and used (no double fetch).
  struct Chunk {
    uint8_t type;
    uint8_t flags;
    uint32_t len;
    uint32_t buf;
    uint64_t total;
    const uint8_t* data;  // validated: len bytes inside our segment
  };

  // Snapshots and validates a descriptor; false when it is malformed.
  bool ReadChunk(const Desc* d, bool ctl, Chunk* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    constexpr size_t kFieldsStart = offsetof(Desc, type);
    constexpr size_t kFieldsEnd = offsetof(Desc, data);
    alignas(Desc) uint8_t raw[sizeof(Desc)];
    std::memcpy(raw + kFieldsStart, reinterpret_cast<const uint8_t*>(d) + kFieldsStart,
                kFieldsEnd - kFieldsStart);
    const auto* copy = reinterpret_cast<const Desc*>(raw);
    c->type = copy->type;
    c->flags = copy->flags;
    c->len = copy->len;
    c->buf = copy->buf;
    c->total = copy->total;
    const auto& l = p_.rx_layout;
    if (c->type != (ctl ? kControlMsg : kUserMsg)) return false;
    if ((c->flags & kFirst) && c->total > kMaxMessage) return false;
    if (c->flags & kInlineData) {
      if (c->len > kInline || !(c->flags & kFirst) || !(c->flags & kLast)) return false;
      c->data = d->data;
      return true;
    }
    uint32_t lo = ctl ? l.nbuffers : 0;
    uint32_t hi = ctl ? l.nbuffers + kControlBuffers : l.nbuffers;
    if (c->buf < lo || c->buf >= hi || c->len > l.buffer_size) return false;
    c->data = p_.rx.get() + l.buffers + size_t{c->buf} * l.buffer_size;
    return true;
  }

  absl::Status ProtocolError(const char* what) {
    return MakeError(absl::StatusCode::kDataLoss, EPROTO,
                     absl::StrCat("malformed unet descriptor from peer pid ", p_.peer_pid, ": ", what),
                     "the peer is faulty or not a compatible zsock; the connection was aborted");
  }

  // Consumes the control ring into complete messages.
  size_t DrainControlLocked(std::vector<std::vector<uint8_t>>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    size_t n = 0;
    while (Desc* d = rx_ctl_.Peek()) {
      Chunk c;
      if (!ReadChunk(d, true, &c) || bool(c.flags & kFirst) == ctl_in_.active) {
        MarkDeadLocked(ProtocolError("bad control descriptor"));
        return n;
      }
      if (c.flags & kFirst) {
        ctl_in_ = Incoming{};
        ctl_in_.active = true;
        ctl_in_.total = c.total;
        // Grows with what arrives; the announced total is the peer's word.
        ctl_in_.control.reserve(std::min<uint64_t>(c.total, 64 * 1024));
      }
      if (ctl_in_.control.size() + c.len > ctl_in_.total) {
        MarkDeadLocked(ProtocolError("control message longer than announced"));
        return n;
      }
      ctl_in_.control.insert(ctl_in_.control.end(), c.data, c.data + c.len);
      rx_ctl_.Release(d);
      if (!(c.flags & kInlineData)) ReturnBuffer(true, c.buf);
      ++n;
      if (c.flags & kLast) {
        if (ctl_in_.control.size() != ctl_in_.total) {
          MarkDeadLocked(ProtocolError("control message shorter than announced"));
          return n;
        }
        out->push_back(std::move(ctl_in_.control));
        ctl_in_ = Incoming{};
      }
    }
    return n;
  }

  // Matches user messages to posted receives.
  size_t DrainUserLocked(Completions* done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    size_t n = 0;
    while (!posted_.empty()) {
      Desc* d = rx_user_.Peek();
      if (d == nullptr) break;
      Chunk c;
      if (!ReadChunk(d, false, &c) || bool(c.flags & kFirst) == user_in_.active) {
        MarkDeadLocked(ProtocolError("bad user descriptor"));
        return n;
      }
      PostedRecv& r = posted_.front();
      if (c.flags & kFirst) {
        user_in_ = Incoming{};
        user_in_.active = true;
        user_in_.total = c.total;
        user_in_.truncated = c.total > r.len;
      }
      if (user_in_.got + c.len > user_in_.total) {
        MarkDeadLocked(ProtocolError("message longer than announced"));
        return n;
      }
      if (!user_in_.truncated && c.len > 0) CopyBytes(r.buf + user_in_.got, c.data, c.len);
      user_in_.got += c.len;
      rx_user_.Release(d);
      if (!(c.flags & kInlineData)) ReturnBuffer(false, c.buf);
      ++n;
      if (c.flags & kLast) {
        if (user_in_.got != user_in_.total) {
          MarkDeadLocked(ProtocolError("message shorter than announced"));
          return n;
        }
        // Straight into the polling caller's output where it can be.
        Completion& comp = cq_->EmitSlot(done);
        comp.context = r.context;
        comp.op = OpType::kRecv;
        comp.endpoint = this;
        if (user_in_.truncated) {
          comp.length = 0;
          comp.status = MakeError(absl::StatusCode::kOutOfRange, EMSGSIZE,
                                  absl::StrCat("a ", user_in_.total, "-byte message met a ", r.len,
                                               "-byte receive and was discarded"),
                                  "post receive buffers as large as the largest message");
        } else {
          comp.length = user_in_.total;
          comp.status = absl::OkStatus();
        }
        posted_.pop_front();
        user_in_ = Incoming{};
      }
    }
    return n;
  }

  void UpdateHintsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    hint_busy_.store(!sendq_.empty() || !ctlq_.empty() || !sent_done_.empty() || dead_,
                     std::memory_order_relaxed);
    hint_posted_.store(!posted_.empty(), std::memory_order_relaxed);
  }

  // Whether Progress may have anything to do, read without the lock: a
  // stale answer costs one poll (the next sees the update), and sleeping is
  // decided by ArmAndCheck under the lock, so no wakeup is lost.
  bool MayHaveWork() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (hint_busy_.load(std::memory_order_relaxed)) return true;
    if (rx_ctl_.Peek() != nullptr) return true;
    return hint_posted_.load(std::memory_order_relaxed) && rx_user_.Peek() != nullptr;
  }

  // Our CQ looks at this endpoint on its next progress (UnetCq::Mark).
  void MarkSelf() { cq_->Mark(p_.bell_slot); }

  void MarkDeadLocked(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    hint_busy_.store(true, std::memory_order_relaxed);
    MarkSelf();
    // After a protocol violation nothing more is read from the peer's rings.
    if (why.code() == absl::StatusCode::kDataLoss) rx_abandoned_ = true;
    if (dead_) return;
    dead_ = true;
    dead_status_ = std::move(why);
    ZS_LOG(kInfo, "unet endpoint to pid %d is down: %s", p_.peer_pid, dead_status_.ToString());
    cq_->Unwatch(p_.sock.get());
    if (p_.pidfd) cq_->Unwatch(p_.pidfd.get());
  }

  Completion Failed(uint64_t context, OpType op, const absl::Status& why) {
    Completion c;
    c.context = context;
    c.op = op;
    c.endpoint = this;
    c.status = why;
    return c;
  }

  // Fails queued sends (user ones report; control ones are core's).
  void FailSendsLocked(const absl::Status& why, Completions* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto& ps : sendq_) {
      if (ps.type == kUserMsg && ps.context != kInjectContext) {
        out->push_back(Failed(ps.context, OpType::kSend, why));
      }
    }
    sendq_.clear();
    ctlq_.clear();
  }

  // Fails every queued operation with `why`.
  void FlushLocked(const absl::Status& why, Completions* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    FailSendsLocked(why, out);
    for (auto& r : posted_) out->push_back(Failed(r.context, OpType::kRecv, why));
    posted_.clear();
  }

  // Reads what the peer sent on the connection socket (shared-segment
  // announcements). Returns false once the socket reports the peer gone.
  bool ServiceSocketLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (;;) {
      ShmAnnounce a{};
      Fd fd;
      size_t nfds = 0;
      pid_t pid = 0;
      bool complete = false;
      ssize_t n = RecvWithFds(p_.sock.get(), &a, sizeof(a), {&fd, 1}, &nfds, &pid, &complete,
                              MSG_DONTWAIT);
      if (n == 0) return false;
      if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
      // Segments are whole pages, never re-announced (a replaced mapping could
      // be in use by DirectAtomic), and come from the peer itself.
      if (n != sizeof(a) || !complete || pid != p_.peer_pid || a.type != kShmAnnounce ||
          !fd || a.size < 4096 || a.size % 4096 != 0 || peer_shm_.contains(a.id) ||
          a.size > (uint64_t{1} << 40) || peer_shm_.size() >= kMaxPeerSegments ||
          !CheckPeerMemfd(fd.get(), a.size, "shared segment").ok()) {
        ZS_LOG(kWarn, "ignoring a malformed message on the unet socket of peer pid %d",
               p_.peer_pid);
        continue;
      }
      auto map = MapFd(fd.get(), a.size, "a peer's shared segment");
      if (!map.ok()) continue;  // atomics on it stay emulated
      peer_shm_[a.id] = PeerShm{std::move(*map), a.base, a.size};
    }
  }

  // Performs an atomic with CPU instructions when the target word lies in a
  // shared segment we hold; sets *handled = false to fall back to emulation.
  absl::Status DirectAtomic(OpType op, uint64_t* result, uint64_t remote_addr,
                            const RemoteKey& rkey, uint64_t a, uint64_t b, uint64_t context,
                            bool* handled) {
    *handled = false;
    if (remote_addr % 8 != 0) return absl::OkStatus();  // emulation reports it
    KeySlot* e;
    if (!PinKey(reinterpret_cast<KeySlot*>(p_.peer_keys.get()), p_.peer_key_slots, rkey,
                remote_addr, 8, kRemoteAtomic, &e)
             .ok()) {
      return absl::OkStatus();  // let emulation report the refusal from the target
    }
    uint64_t* word = nullptr;
    {
      MutexLock lock(&mu_);
      if (closed_ || dead_) {
        Unpin(e);
        *handled = true;
        return closed_ ? ClosedError() : dead_status_;
      }
      word = reinterpret_cast<uint64_t*>(PeerShmLocked(e->shm_id, remote_addr, 8));
    }
    if (word == nullptr) {
      Unpin(e);
      return absl::OkStatus();
    }
    uint64_t old;
    if (op == OpType::kFetchAdd) {
      old = __atomic_fetch_add(word, a, __ATOMIC_SEQ_CST);
    } else {
      old = a;
      __atomic_compare_exchange_n(word, &old, b, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    }
    Unpin(e);
    if (result != nullptr) *result = old;
    *handled = true;
    return PushDone(context, op, 8);
  }

  // Where [remote_addr, remote_addr + len) of the peer lies in our mapping
  // of its shared segment shm_id (0: not in a shared segment), or nullptr.
  uint8_t* PeerShmLocked(uint32_t shm_id, uint64_t remote_addr, uint64_t len)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (shm_id == 0) return nullptr;
    auto it = peer_shm_.find(shm_id);
    if (it == peer_shm_.end()) {
      ServiceSocketLocked();  // the announcement may still be on the socket
      it = peer_shm_.find(shm_id);
    }
    if (it == peer_shm_.end() || remote_addr < it->second.base || len > it->second.size ||
        remote_addr - it->second.base > it->second.size - len) {
      return nullptr;
    }
    return it->second.map.get() + (remote_addr - it->second.base);
  }

  // RDMA read or write of memory the peer allocated with
  // AllocateRegistered: a copy through our own mapping of its segment,
  // after the key-table check (rma_allocated = native). Neither the kernel
  // nor the target takes part, and nothing is copied twice: this is what
  // makes SDP's pulled bcopy (docs/protocol.md) one copy on each side. Sets
  // *handled = false for other memory, or a refused key (the caller's path
  // reports the refusal).
  absl::Status MappedAccess(OpType op, void* local, size_t len, uint64_t remote_addr,
                            const RemoteKey& rkey, uint64_t context, bool* handled) {
    *handled = false;
    KeySlot* e;
    const uint32_t access = op == OpType::kRead ? kRemoteRead : kRemoteWrite;
    if (len == 0 || !PinKey(reinterpret_cast<KeySlot*>(p_.peer_keys.get()), p_.peer_key_slots,
                            rkey, remote_addr, len, access, &e)
                         .ok()) {
      return absl::OkStatus();
    }
    uint8_t* remote = nullptr;
    {
      MutexLock lock(&mu_);
      if (closed_ || dead_) {
        Unpin(e);
        *handled = true;
        return closed_ ? ClosedError() : dead_status_;
      }
      remote = PeerShmLocked(e->shm_id, remote_addr, len);
    }
    if (remote == nullptr) {
      Unpin(e);
      return absl::OkStatus();
    }
    // The pin (the slot's `active` count) holds off a revocation, so the
    // peer does not reuse the memory while we copy.
    if (op == OpType::kRead) {
      CopyBytes(local, remote, len);
    } else {
      CopyBytes(remote, local, len);
    }
    Unpin(e);
    *handled = true;
    return PushDone(context, op, len);
  }

  // Reports a one-sided operation that finished at the call.
  absl::Status PushDone(uint64_t context, OpType op, size_t len) {
    Completion c;
    c.context = context;
    c.op = op;
    c.length = len;
    c.endpoint = this;
    cq_->Push(std::move(c));
    return absl::OkStatus();
  }

  bool PeerGone() {
    if (p_.pidfd) {
      pollfd pfd{p_.pidfd.get(), POLLIN, 0};
      if (::poll(&pfd, 1, 0) > 0) return true;
    }
    char c;
    ssize_t n = ::recv(p_.sock.get(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }

  absl::Status DirectAccess(OpType op, void* local, size_t len, uint64_t remote_addr,
                            const RemoteKey& rkey, uint64_t context) {
    {
      MutexLock lock(&mu_);
      if (closed_) return ClosedError();
      if (dead_) return dead_status_;
    }
    KeySlot* e;
    uint32_t access = op == OpType::kRead ? kRemoteRead : kRemoteWrite;
    if (auto st = PinKey(reinterpret_cast<KeySlot*>(p_.peer_keys.get()), p_.peer_key_slots,
                         rkey, remote_addr, len, access, &e);
        !st.ok()) {
      return st;
    }
    absl::Status st;
    // The pidfd guards against a recycled pid: never touch a process that
    // is not our peer.
    if (PeerGone()) {
      st = MakeError(absl::StatusCode::kAborted, ECONNRESET,
                     absl::StrCat("unet peer pid ", p_.peer_pid, " has exited"),
                     "reconnect to a live peer");
    }
    size_t done = 0;
    while (st.ok() && done < len) {
      iovec liov{static_cast<uint8_t*>(local) + done, len - done};
      iovec riov{reinterpret_cast<void*>(remote_addr + done), len - done};
      ssize_t n = op == OpType::kRead
                      ? ::process_vm_readv(p_.peer_pid, &liov, 1, &riov, 1, 0)
                      : ::process_vm_writev(p_.peer_pid, &liov, 1, &riov, 1, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        int err = n < 0 ? errno : EFAULT;
        st = ErrnoError(err, absl::StrCat(op == OpType::kRead ? "process_vm_readv" : "process_vm_writev",
                                          " on peer pid ", p_.peer_pid, " failed"),
                        err == EPERM ? "cross-memory attach was denied; set unet_cma=off to copy "
                                       "through the segment"
                                     : "the peer may have unmapped the memory or exited");
        break;
      }
      done += static_cast<size_t>(n);
    }
    Unpin(e);
    if (!st.ok()) return st;
    return PushDone(context, op, len);
  }

  struct PeerShm {
    Mapping map;
    uint64_t base;
    uint64_t size;
  };

  UnetFabric* fabric_;
  UnetCq* cq_;
  Parts p_;
  absl::flat_hash_map<uint32_t, PeerShm> peer_shm_ ABSL_GUARDED_BY(mu_);
  CqBell* peer_bell_;
  Mutex mu_;
  RingConsumer<Desc> rx_user_ ABSL_GUARDED_BY(mu_);
  RingConsumer<Desc> rx_ctl_ ABSL_GUARDED_BY(mu_);
  RingProducer<FreeSlot> rx_user_free_ ABSL_GUARDED_BY(mu_);
  RingProducer<FreeSlot> rx_ctl_free_ ABSL_GUARDED_BY(mu_);
  RingProducer<Desc> tx_user_ ABSL_GUARDED_BY(mu_);
  RingProducer<Desc> tx_ctl_ ABSL_GUARDED_BY(mu_);
  RingConsumer<FreeSlot> tx_user_free_ ABSL_GUARDED_BY(mu_);
  RingConsumer<FreeSlot> tx_ctl_free_ ABSL_GUARDED_BY(mu_);
  // Control messages have their own queue: a user message waiting for ring
  // space or buffers must never hold back emulation traffic.
  std::deque<PendingSend> sendq_ ABSL_GUARDED_BY(mu_);
  std::deque<PendingSend> ctlq_ ABSL_GUARDED_BY(mu_);
  std::deque<PostedRecv> posted_ ABSL_GUARDED_BY(mu_);
  Incoming user_in_ ABSL_GUARDED_BY(mu_);
  Incoming ctl_in_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool dead_ ABSL_GUARDED_BY(mu_) = false;
  bool dead_sends_failed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Completion> sent_done_ ABSL_GUARDED_BY(mu_);  // Enqueue's completions, for Progress
  bool rx_abandoned_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status dead_status_ ABSL_GUARDED_BY(mu_);
  // Hints read without mu_ by Progress's fast path (an empty poll takes no
  // lock); written under mu_ by UpdateHintsLocked.
  std::atomic<bool> hint_busy_{false};    // queued sends, or dead
  std::atomic<bool> hint_posted_{false};  // receives are posted
};

Endpoint* AsEndpoint(UnetEndpoint* ep) { return ep; }

size_t UnetEndpoint::Progress(bool check_liveness) {
  if (!check_liveness && !MayHaveWork()) return 0;
  std::vector<std::vector<uint8_t>> control;
  Completions done;
  absl::Status emulated_failure;
  size_t n = 0;
  bool notify = false;
  {
    MutexLock lock(&mu_);
    if (closed_) return 0;
    // Sends that completed in Enqueue, ahead of anything found now. Pushed
    // here, so that sent_done_ keeps its capacity (a stream defers dozens
    // between polls; moved out, each batch cost a few allocations).
    if (!sent_done_.empty()) {
      n += sent_done_.size();
      cq_->PushAll(std::span<Completion>(sent_done_.data(), sent_done_.size()));
      sent_done_.clear();
    }
    size_t consumed = 0;
    if (!rx_abandoned_) consumed += DrainControlLocked(&control);
    if (!rx_abandoned_) consumed += DrainUserLocked(&done);
    n += consumed;
    if ((!sendq_.empty() || !ctlq_.empty()) && !dead_) notify |= PushSendsLocked(&done);
    // Consuming frees ring slots (and maybe buffers) a sleeping sender may
    // be waiting for.
    notify |= consumed > 0;
    if (!dead_ && check_liveness && (!ServiceSocketLocked() || PeerGone())) {
      MarkDeadLocked(MakeError(absl::StatusCode::kAborted, ECONNRESET,
                               absl::StrCat("unet peer pid ", p_.peer_pid,
                                            " closed the connection (it exited, was killed or closed the endpoint)"),
                               "reconnect; data the peer sent before it went away was delivered"));
    }
    if (dead_) {
      // Queued sends and emulated operations can never finish.
      if (!dead_sends_failed_) {
        dead_sends_failed_ = true;
        FailSendsLocked(dead_status_, &done);
        emulated_failure = dead_status_;
      }
      // Receives fail once everything the peer sent has been consumed.
      if (!posted_.empty() && (rx_abandoned_ || rx_user_.Peek() == nullptr)) {
        absl::Status why = dead_status_;
        if (user_in_.active && !rx_abandoned_) {
          why = MakeError(absl::StatusCode::kAborted, ECONNRESET,
                          absl::StrCat("unet peer pid ", p_.peer_pid, " went away after ",
                                       user_in_.got, " of ", user_in_.total,
                                       " bytes of a message"),
                          "reconnect and resend");
          user_in_ = Incoming{};
        }
        FlushLocked(why, &done);
      }
      n += done.size();
    }
    UpdateHintsLocked();
    // Work left (sends waiting for the peer, messages beyond this pass):
    // keep the bell bit this progress took.
    if (MayHaveWork()) MarkSelf();
  }
  if (notify) Notify();
  for (auto& c : done) cq_->Push(std::move(c));
  for (auto& m : control) DeliverControl(m);
  if (!emulated_failure.ok()) FailEmulated(emulated_failure);
  return n;
}

bool UnetEndpoint::ArmAndCheck() {
  // The CQ has set its bell's armed flag (UnetCq::ArmProvider).
  MutexLock lock(&mu_);
  if (closed_) return false;
  if (!sent_done_.empty()) return true;
  if (dead_) {
    return !dead_sends_failed_ || !posted_.empty() || (!rx_abandoned_ && rx_ctl_.Peek() != nullptr);
  }
  if (rx_ctl_.Peek() != nullptr) return true;
  if (!posted_.empty() && rx_user_.Peek() != nullptr) return true;
  // Progress possible if a queued message finds a descriptor and, if
  // needed, a buffer.
  for (const auto* q : {&ctlq_, &sendq_}) {
    if (q->empty()) continue;
    const PendingSend& ps = q->front();
    bool ctl = ps.type == kControlMsg;
    if ((ctl ? tx_ctl_ : tx_user_).TryClaim() != nullptr &&
        ((!ps.started && ps.len <= kInline) || (ctl ? tx_ctl_free_ : tx_user_free_).Peek() != nullptr)) {
      return true;
    }
  }
  return false;
}

// ------------------------------------------------------------ CQ methods

UnetCq::~UnetCq() = default;

uint32_t UnetCq::AllocateSlot() {
  MutexLock lock(&mu_);
  if (!free_slots_.empty()) {
    uint32_t slot = free_slots_.back();
    free_slots_.pop_back();
    return slot;
  }
  if (by_slot_.size() >= kBellSlots) return kNoBellSlot;
  by_slot_.push_back(nullptr);
  return static_cast<uint32_t>(by_slot_.size() - 1);
}

void UnetCq::ReleaseSlot(uint32_t slot) {
  if (slot == kNoBellSlot) return;
  MutexLock lock(&mu_);
  by_slot_[slot] = nullptr;
  free_slots_.push_back(slot);
}

void UnetCq::Attach(UnetEndpoint* ep, uint32_t slot, int watch_fd, int pidfd) {
  MutexLock lock(&mu_);
  endpoints_.push_back(ep);
  if (slot == kNoBellSlot) {
    unslotted_.push_back(ep);
  } else {
    by_slot_[slot] = ep;
    // The peer may have published (and rung) before the slot had its
    // endpoint, and a progress in between dropped the bit: look once.
    Mark(slot);
  }
  for (int fd : {watch_fd, pidfd}) {
    if (fd < 0) continue;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.ptr = ep;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev);
  }
}


void UnetCq::Detach(UnetEndpoint* ep, uint32_t slot, int watch_fd, int pidfd) {
  Unwatch(watch_fd);
  if (pidfd >= 0) Unwatch(pidfd);
  {
    MutexLock lock(&mu_);
    endpoints_.erase(std::remove(endpoints_.begin(), endpoints_.end(), ep), endpoints_.end());
    std::erase(unslotted_, ep);
  }
  ReleaseSlot(slot);
}

size_t UnetCq::Progress() {
  const bool check = liveness_.Due();
  MutexLock lock(&mu_);
  // Per endpoint its socket and pidfd, then the two eventfds.
  if (check) ready_.Collect(epoll_.get(), 2 * endpoints_.size() + 2);
  size_t n = 0;
  if (!UseBellLocked()) {
    for (UnetEndpoint* ep : endpoints_) n += ep->Progress(check && ready_.contains(ep));
    return n;
  }
  // Readable sockets and pidfds are rare (a peer's end, an announcement).
  if (check && !ready_.empty()) {
    for (UnetEndpoint* ep : endpoints_) {
      if (ready_.contains(ep)) n += ep->Progress(true);
    }
  }
  VisitBellLocked(/*clear=*/true, [&](UnetEndpoint* ep) {
    n += ep->Progress(false);
    return false;
  });
  for (UnetEndpoint* ep : unslotted_) n += ep->Progress(check && ready_.contains(ep));
  return n;
}

bool UnetCq::ArmProvider() {
  // Before the look below: a peer that rings after it sees the flag.
  bell_->armed.store(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  MutexLock lock(&mu_);
  if (!UseBellLocked()) {
    for (UnetEndpoint* ep : endpoints_) {
      if (ep->ArmAndCheck()) return false;
    }
    return true;
  }
  // Only endpoints whose bits are set can have work (the bits stay set for
  // the progress that follows a wake-up).
  if (VisitBellLocked(/*clear=*/false, [](UnetEndpoint* ep) { return ep->ArmAndCheck(); })) {
    return false;
  }
  for (UnetEndpoint* ep : unslotted_) {
    if (ep->ArmAndCheck()) return false;
  }
  return true;
}

// ------------------------------------------------------------ listener

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

absl::StatusOr<std::unique_ptr<Listener>> UnetFabric::Listen(absl::string_view address) {
  std::string name(address);
  std::string shown;
  Fd reservation;
  if (name.empty()) {
    static std::atomic<uint32_t> counter{0};
    name = absl::StrCat("auto-", getpid(), "-", counter.fetch_add(1));
  } else if (auto sa = ParseSocketAddress(address); sa.ok()) {
    // IP:PORT (the sockets layer's form). A kernel TCP socket bound to the
    // same address reserves the port, so port 0 gets a free one and a port
    // in use by kernel TCP or another zsock listener is refused the way
    // bind(2) refuses it.
    reservation.reset(::socket(sa->family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!reservation) return ErrnoError(errno, "socket() to reserve a unet port failed");
    if (::bind(reservation.get(), sa->get(), sa->len) != 0) {
      int err = errno;
      return ErrnoError(err, absl::StrCat("binding unet address ", address, " failed"),
                        err == EADDRINUSE      ? "the port is in use on this host; pick another"
                        : err == EADDRNOTAVAIL ? "use an address of this host (unet is host-local)"
                                               : "");
    }
    shown = BoundAddress(reservation.get());
    auto bound = ParseSocketAddress(shown);
    if (!bound.ok()) return bound.status();
    name = PortName(bound->port());
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

absl::StatusOr<std::unique_ptr<Endpoint>> UnetFabric::Handshake(Fd sock, std::string local,
                                                                std::string peer,
                                                                CompletionQueue* cq,
                                                                absl::Time deadline) {
  auto* ucq = dynamic_cast<UnetCq*>(cq);
  if (ucq == nullptr) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     "the completion queue does not belong to a unet fabric",
                     "create the CQ with the same fabric as the endpoint");
  }
  int on = 1;
  if (::setsockopt(sock.get(), SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)) != 0) {
    return ErrnoError(errno, "SO_PASSCRED on a unet connection failed");
  }
  UnetEndpoint::Parts parts;
  parts.rx_layout = SegmentLayout::For(settings_.ring_entries, settings_.buffer_size,
                                       settings_.nbuffers);
  auto rx_fd = CreateMemfd("zsock-unet-segment", parts.rx_layout.total);
  if (!rx_fd.ok()) return rx_fd.status();
  auto rx = MapFd(rx_fd->get(), parts.rx_layout.total, "a unet segment");
  if (!rx.ok()) return rx.status();
  {
    // Initialise my segment: rings empty, every buffer on a free ring.
    auto* hdr = new (rx->get()) SegmentHeader{};
    hdr->magic = kSegmentMagic;
    hdr->version = kVersion;
    hdr->ring_entries = settings_.ring_entries;
    hdr->buffer_size = settings_.buffer_size;
    hdr->nbuffers = settings_.nbuffers;
    hdr->owner_pid = static_cast<uint32_t>(getpid());
    const auto& l = parts.rx_layout;
    for (size_t ring : {l.user_ring, l.ctl_ring}) {
      auto* d = reinterpret_cast<Desc*>(rx->get() + ring);
      for (uint32_t i = 0; i < l.ring_entries; ++i) d[i].seq.store(i, std::memory_order_relaxed);
    }
    auto* uf = reinterpret_cast<FreeSlot*>(rx->get() + l.user_free);
    for (uint32_t i = 0; i < l.nbuffers; ++i) {  // full: seq = i + 1
      uf[i].buf = i;
      uf[i].seq.store(i + 1, std::memory_order_relaxed);
    }
    auto* cf = reinterpret_cast<FreeSlot*>(rx->get() + l.ctl_free);
    for (uint32_t i = 0; i < kControlBuffers; ++i) {
      cf[i].buf = l.nbuffers + i;
      cf[i].seq.store(i + 1, std::memory_order_relaxed);
    }
    std::atomic_thread_fence(std::memory_order_release);
  }
  // The probe word lets the peer test cross-memory attach on us; it is set
  // once per process so concurrent handshakes agree on it.
  static const uint64_t probe_word =
      std::random_device{}() | (uint64_t{std::random_device{}()} << 32) | 1;
  const uint64_t probe = probe_word;
  parts.bell_slot = ucq->AllocateSlot();
  absl::Cleanup release_slot = [&] { ucq->ReleaseSlot(parts.bell_slot); };
  Hello hello{kSegmentMagic, kVersion, settings_.ring_entries, settings_.buffer_size,
              settings_.nbuffers, settings_.key_slots, parts.bell_slot, parts.rx_layout.total,
              reinterpret_cast<uint64_t>(&probe_word), probe};
  int fds[kHelloFds] = {rx_fd->get(), ucq->event_fd(), key_fd_.get(), ucq->bell_fd()};
  if (auto st = SendHello(sock.get(), hello, fds); !st.ok()) return st;
  Hello theirs{};
  Fd their_fds[kHelloFds];
  pid_t peer_pid = 0;
  if (auto st = RecvHello(sock.get(), deadline, &theirs, their_fds, &peer_pid); !st.ok()) return st;
  parts.peer_pid = peer_pid;
  parts.tx_layout = SegmentLayout::For(theirs.ring_entries, theirs.buffer_size, theirs.nbuffers);
  if (auto st = CheckPeerMemfd(their_fds[0].get(), parts.tx_layout.total, "segment"); !st.ok()) return st;
  size_t keys_size = sizeof(KeySlot) * theirs.key_slots;
  if (auto st = CheckPeerMemfd(their_fds[2].get(), keys_size, "key table"); !st.ok()) return st;
  auto tx = MapFd(their_fds[0].get(), parts.tx_layout.total, "the peer's unet segment");
  if (!tx.ok()) return tx.status();
  auto keys = MapFd(their_fds[2].get(), keys_size, "the peer's unet key table");
  if (!keys.ok()) return keys.status();
  if (auto st = CheckPeerMemfd(their_fds[3].get(), kBellBytes, "CQ bell"); !st.ok()) return st;
  auto bell = MapFd(their_fds[3].get(), kBellBytes, "the peer's unet CQ bell");
  if (!bell.ok()) return bell.status();
  auto* peer_bell = reinterpret_cast<const CqBell*>(bell->get());
  if (peer_bell->magic != kBellMagic || peer_bell->version != kVersion ||
      peer_bell->slots != kBellSlots) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO,
                     "the peer's unet CQ bell has a wrong magic, version or size",
                     "the peer is not a compatible zsock unet endpoint");
  }
  auto* peer_hdr = reinterpret_cast<SegmentHeader*>(tx->get());
  if (peer_hdr->magic != kSegmentMagic || peer_hdr->ring_entries != theirs.ring_entries ||
      peer_hdr->nbuffers != theirs.nbuffers || peer_hdr->buffer_size != theirs.buffer_size) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO,
                     "the peer's unet segment does not match its hello",
                     "the peer is not a compatible zsock unet endpoint");
  }
  parts.info.local_address = local;
  parts.info.peer_address = peer.empty() ? absl::StrCat("unet-pid-", peer_pid) : peer;
  parts.info.peer_on_host = true;
  parts.info.atomics = Support::kEmulated;
  // Cross-memory attach probe: read the peer's probe word.
  parts.cma = false;
  if (settings_.cma) {
    uint64_t seen = 0;
    iovec liov{&seen, sizeof(seen)};
    iovec riov{reinterpret_cast<void*>(theirs.probe_addr), sizeof(seen)};
    ssize_t n = ::process_vm_readv(peer_pid, &liov, 1, &riov, 1, 0);
    if (n == sizeof(seen) && seen == theirs.probe_value) {
      parts.cma = true;
    } else {
      int err = n < 0 ? errno : EIO;
      int scope = -1;  // -1: no Yama LSM
      if (FILE* f = std::fopen("/proc/sys/kernel/yama/ptrace_scope", "r")) {
        if (std::fscanf(f, "%d", &scope) != 1) scope = -1;
        std::fclose(f);
      }
      std::string note = absl::StrCat(
          "cross-memory attach to pid ", peer_pid, " denied (", std::strerror(err),
          scope >= 0 ? absl::StrCat("; kernel.yama.ptrace_scope=", scope) : std::string(),
          "): rdma read/write copy through the segment. For direct access run both "
          "processes as the same user (or give this one CAP_SYS_PTRACE) without a seccomp "
          "filter on process_vm_readv",
          scope > 0 ? ", and set kernel.yama.ptrace_scope=0" : "");
      ZS_LOG(kWarn, "%s", note);
      parts.info.notes.push_back(note);
    }
  } else {
    parts.info.notes.push_back("unet_cma=off: rdma read/write copy through the segment");
  }
  parts.info.rdma_read = parts.cma ? Support::kNative : Support::kEmulated;
  parts.info.rdma_write = parts.info.rdma_read;
  int pidfd = PidfdOpen(peer_pid);
  if (pidfd >= 0) parts.pidfd.reset(pidfd);
  parts.sock = std::move(sock);
  parts.rx_fd = std::move(*rx_fd);
  parts.rx = std::move(*rx);
  parts.tx = std::move(*tx);
  parts.peer_event = std::move(their_fds[1]);
  parts.peer_bell = std::move(*bell);
  parts.peer_bell_slot = theirs.bell_slot;
  parts.peer_keys = std::move(*keys);
  parts.peer_key_slots = theirs.key_slots;
  std::move(release_slot).Cancel();  // the endpoint releases it (UnetCq::Detach)
  return std::unique_ptr<Endpoint>(new UnetEndpoint(this, ucq, std::move(parts)));
}

const bool kRegistered = RegisterProvider(ProviderInfo{
    "unet",
    "U-Net-style user-level endpoints over shared memory (same host; embedded)",
    {"unet", "unet?cma=off"},
    [](const FabricSpec& spec) { return UnetFabric::Open(spec); },
});

}  // namespace
}  // namespace zsock::unet
