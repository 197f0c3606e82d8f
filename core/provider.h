// The zsock provider interface: what every fabric backend implements.
//
// A Fabric is one opened provider configuration ("unet", "ofi:tcp;ofi_rxm",
// "ucx:posix,cma", ...). From it come memory registrations, completion queues,
// listeners and reliable, connected, in-order endpoints offering two-sided
// send/recv, one-sided read/write and 8-byte atomics.
//
// Contract for provider writers (see docs/provider-interface.md):
//  - Every operation either fails synchronously with a Status (nothing was
//    started, nothing is reported later) or returns OK and later produces
//    exactly one Completion with the caller's context on the endpoint's CQ.
//  - An operation a provider cannot do natively is left to the Endpoint base
//    class, whose default implementation emulates it over the provider's
//    control channel (SendControl / DeliverControl) once, in core. The
//    provider reports kEmulated for it in Capabilities.
//  - Nothing requires a spinning thread: CompletionQueue::wait_fd() becomes
//    readable whenever the provider's progress may have work, after a
//    successful Arm().
//  - Errors are built with MakeError/ErrnoError (core/status.h) and say what
//    to do about them.
#ifndef ZSOCK_CORE_PROVIDER_H_
#define ZSOCK_CORE_PROVIDER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/mutex.h"

namespace zsock {

class CompletionQueue;
class Endpoint;
class Emulation;
class Fabric;
class RegistrationCache;

// How an operation is provided.
enum class Support { kNone, kEmulated, kNative };
absl::string_view SupportName(Support s);

// What a fabric (and, per endpoint, a connection) can do.
struct Capabilities {
  std::string provider;          // "unet", "ofi", ...
  std::string spec;              // what follows "provider:" after resolution
  Support send_recv = Support::kNative;
  Support rdma_read = Support::kNone;
  Support rdma_write = Support::kNone;
  Support atomics = Support::kNone;  // 8-byte fetch-add and compare-and-swap
  // Atomics on memory from Fabric::AllocateRegistered (kNative: the target
  // need not make progress for them to complete).
  Support atomics_allocated = Support::kNone;
  // RDMA read and write of memory from Fabric::AllocateRegistered (kNative:
  // the initiator's CPU copies it through its own mapping of the target's
  // memory, as cheap as a local copy; SDP's pulled bcopy needs it).
  Support rma_allocated = Support::kNone;
  size_t max_msg_size = 0;       // largest single Send / PostRecv
  size_t max_rma_size = 0;       // largest single Read / Write
  size_t inline_size = 0;        // sends up to this size complete at once
  // Sends of at most this size may be injected: Send with context
  // kInjectContext copies the bytes before it returns and reports no
  // completion, neither success nor failure (libfabric's fi_inject, verbs'
  // unsignaled inline sends); 0: not offered.
  size_t inject_size = 0;
  bool registration_required = false;  // local buffers need a MemoryRegion
  bool peer_on_host = false;     // peers are (or may be) on this host
  bool wait_fd = true;           // CompletionQueue::wait_fd is usable
  // Any thread may call into the fabric at any time. False when the user
  // configured a single-threaded mode (ucx's threads=serialized): one
  // thread at a time, which the SDP engine (a progress thread beside the
  // application's) cannot promise.
  bool thread_safe = true;
  std::vector<std::string> notes;  // e.g. why an operation is emulated
};

// Bytes of a control message that core emulation keeps for its headers
// (the request's key, the answer's header): an emulated read of at most
// max_msg_size - kEmulationHeadroom bytes fits one answer. Providers that
// may emulate RMA set max_rma_size to at most that.
inline constexpr size_t kEmulationHeadroom = 4096;

// Access rights of a registration.
enum Access : uint32_t {
  kLocalRead = 1u << 0,
  kLocalWrite = 1u << 1,
  kRemoteRead = 1u << 2,
  kRemoteWrite = 1u << 3,
  kRemoteAtomic = 1u << 4,
  kAccessAll = 0x1f,
};

// A serializable remote key: the registered range and the provider's opaque
// key bytes. Peers exchange it (Serialize / Parse) to name memory for Read,
// Write and atomics; an access outside [addr, addr + length) must fail.
struct RemoteKey {
  static constexpr size_t kMaxBlob = 128;
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t access = 0;
  std::vector<uint8_t> blob;  // provider-specific, at most kMaxBlob bytes

  std::string Serialize() const;
  static absl::StatusOr<RemoteKey> Parse(absl::string_view bytes);
};

// One registration of [addr, addr + length) with a provider. Destroying it
// deregisters. Providers subclass it.
class MemoryRegion {
 public:
  MemoryRegion(void* addr, size_t length, uint32_t access)
      : addr_(addr), length_(length), access_(access) {}
  virtual ~MemoryRegion() = default;
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  void* addr() const { return addr_; }
  size_t length() const { return length_; }
  uint32_t access() const { return access_; }
  // The local descriptor a provider needs for buffers in this region
  // (fi_mr_desc, an lkey, ...); nullptr when none.
  virtual void* desc() const { return nullptr; }
  virtual RemoteKey remote_key() const = 0;
  // Stops remote access through this region's key now. Called by the
  // registration cache from memory-release hooks (free, munmap, ...), so it
  // must not allocate, lock a lock a caller may hold, or call back into zsock.
  virtual void Revoke() noexcept = 0;

 private:
  void* addr_;
  size_t length_;
  uint32_t access_;
};

enum class OpType : uint8_t {
  kSend,
  kRecv,
  kRead,
  kWrite,
  kFetchAdd,
  kCompareSwap,
};
absl::string_view OpTypeName(OpType op);

// The context of an injected send (Capabilities::inject_size): no
// completion is reported for it. Never a context of anything else. A
// provider with inject_size 0 treats it as an ordinary context.
inline constexpr uint64_t kInjectContext = ~uint64_t{0};

// One finished operation. `status` is OK or says why it failed (a dead peer,
// a bad remote key, truncation, ...).
struct Completion {
  uint64_t context = 0;   // the caller's context
  OpType op = OpType::kSend;
  size_t length = 0;      // bytes received (kRecv) or transferred
  Endpoint* endpoint = nullptr;
  absl::Status status;
};

// A queue of completions from one or more endpoints. This is the interface
// the SDP engine and applications use; every provider's CQ derives from
// core's CqBase (core/cq.h), which holds the ready list, the spin-then-block
// Wait and the wake-up protocol, and leaves the provider its Progress,
// ArmProvider and wait_fd.
class CompletionQueue {
 public:
  virtual ~CompletionQueue() = default;

  // Moves up to out.size() completions into `out`, driving progress first.
  // Never blocks. Returns how many were written.
  virtual size_t Poll(std::span<Completion> out) = 0;

  // Waits until at least one completion is available or `timeout` passes
  // (then returns 0). Spins, then blocks on wait_fd(); a spinning thread is
  // never required.
  virtual absl::StatusOr<size_t> Wait(std::span<Completion> out,
                                      absl::Duration timeout) = 0;

  // A file descriptor for poll/epoll: readable when Poll may return entries.
  // Protocol: call Arm(); if it returns true, sleep on wait_fd(); after
  // waking, Poll. If Arm() returns false, entries are already pending. An
  // idle armed CQ's fd is not readable (conformance: WaitThroughCqFdInEpoll).
  virtual int wait_fd() const = 0;
  virtual bool Arm() = 0;

  // Reports a completion (providers, core emulation). Wakes a thread
  // sleeping on wait_fd() after Arm().
  virtual void Push(Completion c) = 0;
  // Wakes a thread sleeping on wait_fd() after Arm(), for work created
  // outside Progress (e.g. a receive posted for a message already there).
  virtual void Wake() = 0;
};

// Per-connection facts, available once connected.
struct EndpointInfo {
  std::string local_address;
  std::string peer_address;
  bool peer_on_host = false;
  Support rdma_read = Support::kNone;
  Support rdma_write = Support::kNone;
  Support atomics = Support::kNone;
  std::vector<std::string> notes;
};

// A reliable, connected, in-order endpoint.
class Endpoint {
 public:
  Endpoint(Fabric* fabric, CompletionQueue* cq);
  virtual ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  Fabric* fabric() const { return fabric_; }
  CompletionQueue* cq() const { return cq_; }
  virtual const EndpointInfo& info() const = 0;

  // Two-sided. Messages are matched to posted receives in order. A message
  // longer than the receive it meets fails that receive with OutOfRange and
  // is discarded. `mr` may be null when !registration_required. With
  // context kInjectContext and len <= caps().inject_size the send is
  // injected (Capabilities::inject_size): the buffer is the caller's again
  // when Send returns OK, and no completion follows.
  virtual absl::Status Send(const void* buf, size_t len, MemoryRegion* mr,
                            uint64_t context) = 0;
  virtual absl::Status PostRecv(void* buf, size_t len, MemoryRegion* mr,
                                uint64_t context) = 0;

  // One-sided: [remote_addr, remote_addr + len) must lie inside `rkey`.
  // Defaults emulate through the control channel (the target's progress
  // engine performs the access).
  virtual absl::Status Read(void* local, size_t len, MemoryRegion* mr,
                            uint64_t remote_addr, const RemoteKey& rkey,
                            uint64_t context);
  virtual absl::Status Write(const void* local, size_t len, MemoryRegion* mr,
                             uint64_t remote_addr, const RemoteKey& rkey,
                             uint64_t context);
  // 8-byte atomics on an 8-byte aligned remote word; the old value is
  // stored in *result before the completion is reported.
  virtual absl::Status FetchAdd(uint64_t* result, uint64_t remote_addr,
                                const RemoteKey& rkey, uint64_t add,
                                uint64_t context);
  virtual absl::Status CompareSwap(uint64_t* result, uint64_t remote_addr,
                                   const RemoteKey& rkey, uint64_t compare,
                                   uint64_t swap, uint64_t context);

  // Graceful close; outstanding operations complete with Cancelled.
  virtual void Close() = 0;

  // ---- for providers ----
  // Sends one control message (core emulation traffic) to the peer, kept
  // apart from user messages. Must accept any length up to max_msg_size.
  virtual absl::Status SendControl(std::span<const uint8_t> msg) = 0;
  // A provider calls this from Progress() for each control message received.
  void DeliverControl(std::span<const uint8_t> msg);
  // A provider calls this once the peer is known dead: emulated operations in
  // flight fail with `why`.
  void FailEmulated(const absl::Status& why);

 private:
  Fabric* fabric_;
  CompletionQueue* cq_;
  std::unique_ptr<Emulation> emulation_;
  friend class Emulation;
};

// Accepts connections on an address.
class Listener {
 public:
  virtual ~Listener() = default;
  virtual std::string address() const = 0;
  // Readable when Accept would not block.
  virtual int fd() const = 0;
  // Waits up to `timeout` for a connection to arrive; DeadlineExceeded if
  // none came. The set-up of one that arrived is bounded by the fabric's
  // connect timeout (connect_timeout_ms), not by `timeout`, so a caller may
  // wait in short slices without cutting handshakes short. Completions of
  // the new endpoint go to `cq`.
  virtual absl::StatusOr<std::unique_ptr<Endpoint>> Accept(
      CompletionQueue* cq, absl::Duration timeout) = 0;
};

// One opened provider configuration.
class Fabric {
 public:
  Fabric();
  virtual ~Fabric();
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  // Opens a fabric from a config string "provider[:spec][?key=value&...]",
  // e.g. "unet", "unet?cma=off", "ofi:tcp;ofi_rxm", "ucx:posix,cma".
  static absl::StatusOr<std::unique_ptr<Fabric>> Open(absl::string_view config);

  virtual const Capabilities& caps() const = 0;

  // Registers memory with the provider directly (no cache). Most callers
  // want rcache().
  virtual absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(
      void* addr, size_t len, uint32_t access) = 0;
  // The fabric's shared pin-down cache over RegisterMemory.
  RegistrationCache& rcache();
  // Allocates `len` bytes suited for remote access and registers them, like
  // ucp_mem_map with allocation. The region owns the memory (freed with it).
  // Providers may place it where peers reach it directly: unet uses a shared
  // segment, so remote atomics on it are CPU atomics that need no progress
  // by the target. Default: anonymous pages + RegisterMemory.
  virtual absl::StatusOr<std::unique_ptr<MemoryRegion>> AllocateRegistered(size_t len,
                                                                          uint32_t access);
  // The same, for the peer of `ep` alone: a provider that shares allocated
  // memory with peers (unet) shares it with that peer only, so no other
  // peer can map it. Default: AllocateRegistered.
  virtual absl::StatusOr<std::unique_ptr<MemoryRegion>> AllocateRegisteredFor(Endpoint* ep,
                                                                             size_t len,
                                                                             uint32_t access) {
    (void)ep;
    return AllocateRegistered(len, access);
  }

  virtual absl::StatusOr<std::unique_ptr<CompletionQueue>> CreateCq() = 0;
  // Listens on `address` (provider syntax; "" picks a free one).
  virtual absl::StatusOr<std::unique_ptr<Listener>> Listen(
      absl::string_view address) = 0;
  // Connects to a listener; blocks up to `timeout`.
  virtual absl::StatusOr<std::unique_ptr<Endpoint>> Connect(
      absl::string_view address, CompletionQueue* cq,
      absl::Duration timeout) = 0;

  // For core emulation on the target side: if [addr, addr + len) lies inside
  // a live local registration named by `rkey` that grants `access`, runs
  // `fn` on the local address while the registration is held (a concurrent
  // revoke waits for it) and returns OK; otherwise fails without touching
  // memory. The check uses the fabric's own record of the registration,
  // never anything a peer can write or the range the key claims.
  virtual absl::Status AccessLocal(const RemoteKey& rkey, uint64_t addr, size_t len,
                                   uint32_t access, absl::FunctionRef<void(void*)> fn) = 0;

 protected:
  // Deregisters everything the registration cache holds. A provider's
  // destructor must call it first: cached regions call back into the
  // provider, whose state is gone by the time ~Fabric runs.
  void ReleaseCache();

 private:
  Mutex rcache_mu_;
  std::unique_ptr<RegistrationCache> rcache_ ABSL_GUARDED_BY(rcache_mu_);
};

// ---- provider registry ----

// A parsed config string: "provider[:spec][?key=value&key=value]".
struct FabricSpec {
  std::string provider;
  std::string spec;
  std::map<std::string, std::string> options;
  std::string ToString() const;
};
absl::StatusOr<FabricSpec> ParseFabricSpec(absl::string_view config);

struct ProviderInfo {
  std::string name;
  std::string description;
  // Example configurations to list in zsock_info and test in conformance.
  std::vector<std::string> configurations;
  std::function<absl::StatusOr<std::unique_ptr<Fabric>>(const FabricSpec&)> open;
};

// Registers a provider; called from a static initializer in each provider
// (built in, or in a module as it is loaded). Returns false, and registers
// nothing, if a provider of that name is already registered.
bool RegisterProvider(ProviderInfo info);
// Every provider: the built-in ones and those of the provider modules,
// which the first call loads (core/modules.h).
std::vector<const ProviderInfo*> RegisteredProviders();
// The providers registered so far, without loading modules.
std::vector<const ProviderInfo*> ProvidersRegisteredSoFar();
// The registered provider a config string names (config "" = ZSOCK_PROVIDER /
// the config file), without opening it; NotFound names the providers built
// into this binary. Fabric::Open uses it, so the messages are the same.
absl::StatusOr<const ProviderInfo*> FindProvider(absl::string_view config,
                                                 FabricSpec* spec = nullptr);

}  // namespace zsock

#endif  // ZSOCK_CORE_PROVIDER_H_
