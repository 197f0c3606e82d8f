// The device-independent half of the verbs provider: everything that can be
// decided without an RDMA device, as pure functions and small classes that
// //providers/verbs:verbs_test exercises on machines without one.
//
//  - Settings: the config string `verbs[:DEVICE][?port=N&gid_index=N&...]`
//    parsed and validated (ParseSettings), then matched against the devices
//    ibv_get_device_list found (SelectDevice, over plain DeviceDesc records).
//  - Access mapping: zsock Access bits -> ibv_access_flags.
//  - Remote keys: the blob inside RemoteKey (the rkey), and the checks an
//    initiator makes before it posts (range inside the key, 8-byte
//    alignment for atomics, rights the key grants).
//  - Work requests: BuildSendWr turns one operation into ibv_send_wr fields
//    (opcode, flags incl. IBV_SEND_INLINE under the inline limit, remote
//    address/rkey, atomic operands).
//  - Work-completion errors: WcError maps ibv_wc_status to a Status whose
//    text says what the status usually means and what to do.
//  - Connection private data (rdma_connect/rdma_accept): Hello encode/decode
//    with validation of everything a peer sends.
//  - Message framing on the wire (Header), and the receive matcher that pairs
//    arriving messages with posted receives in order.
//  - Registrations: a Registrar seam (ibv_reg_mr / ibv_dereg_mr in the
//    provider, a fake in tests), VerbsRegion over it, and the RegTable the
//    target uses for emulated accesses (Fabric::AccessLocal).
//
// Wire formats are little-endian and versioned; docs/verbs.md has the tables.
#ifndef ZSOCK_PROVIDERS_VERBS_VERBS_CORE_H_
#define ZSOCK_PROVIDERS_VERBS_VERBS_CORE_H_

#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/mutex.h"
#include "core/provider.h"

namespace zsock::verbs {

// ------------------------------------------------------------ settings

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

// ------------------------------------------------------------ access

// ibv_reg_mr access flags for zsock Access bits. Remote write and remote
// atomic imply local write (the verbs rule: IBV_ACCESS_REMOTE_WRITE and
// IBV_ACCESS_REMOTE_ATOMIC require IBV_ACCESS_LOCAL_WRITE).
int AccessToIbv(uint32_t access);

// ------------------------------------------------------------ remote keys

// The RemoteKey blob: u8 version (1) | u8 flags | u16 reserved | u32 rkey.
constexpr size_t kKeyBlobSize = 8;
constexpr uint8_t kKeyBlobVersion = 1;
std::vector<uint8_t> EncodeKeyBlob(uint32_t rkey);
absl::StatusOr<uint32_t> DecodeKeyBlob(const std::vector<uint8_t>& blob);

// What an initiator checks before posting a one-sided operation: the
// blob decodes, [remote_addr, remote_addr + len) lies inside the key's range,
// the key grants `need` (kRemoteRead/Write/Atomic), and atomics are on an
// aligned 8-byte word. The target's HCA checks again against the real
// registration (a forged key fails there with REM_ACCESS_ERR).
absl::StatusOr<uint32_t> CheckRemote(const RemoteKey& key, uint64_t remote_addr,
                                     size_t len, uint32_t need, bool atomic);

// ------------------------------------------------------------ work requests

enum class WrKind { kSend, kRdmaWrite, kRdmaRead, kFetchAdd, kCompareSwap };

struct WorkRequest {
  WrKind kind = WrKind::kSend;
  uint64_t wr_id = 0;
  uint64_t local_addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint64_t compare_add = 0;  // fetch-add: the addend; compare-swap: compare
  uint64_t swap = 0;
  bool signaled = true;
};

// Fills `wr` and `sge` (which `wr` points to) for ibv_post_send. Sends and
// RDMA writes of at most `max_inline` bytes carry IBV_SEND_INLINE (their data
// is copied at post time; lkey unused); reads and atomics never do. Atomics
// need an 8-byte local buffer and an 8-byte aligned remote address.
// `max_len` is the port's max_msg_sz.
absl::Status BuildSendWr(const WorkRequest& in, uint32_t max_inline, uint32_t max_len,
                         ibv_send_wr* wr, ibv_sge* sge);

// ------------------------------------------------------------ completions

// A failed work completion as a Status: ibv_wc_status_str, the vendor
// error, the operation, and what the status usually means. Dead-peer
// statuses are Aborted/ECONNRESET, truncation OutOfRange/EMSGSIZE, refused
// remote accesses PermissionDenied/EACCES.
absl::Status WcError(ibv_wc_status status, uint32_t vendor_err, absl::string_view op);

// ------------------------------------------------------------ private data

// Carried in rdma_connect / rdma_accept private data (at most 56 bytes on
// InfiniBand for a connect request): what the peer needs to send to us.
struct Hello {
  static constexpr uint32_t kMagic = 0x62727a76;  // "vzrb"
  static constexpr uint8_t kVersion = 1;
  static constexpr size_t kSize = 32;
  uint8_t flags = 0;           // kHelloSrq, kHelloAtomics
  uint32_t credits = 0;        // receive buffers the peer may fill (0 = SRQ)
  uint32_t eager_size = 0;     // size of each receive buffer
  uint32_t max_inline = 0;     // informational
  uint64_t fabric_id = 0;      // random per fabric (logs, same-fabric checks)
};
constexpr uint8_t kHelloSrq = 1;
constexpr uint8_t kHelloAtomics = 2;
std::string EncodeHello(const Hello& h);
// `bytes` may be longer than kSize (rdma_cm pads private data with zeros).
absl::StatusOr<Hello> DecodeHello(const void* bytes, size_t len);

// ------------------------------------------------------------ framing

// Every message starts with this 24-byte header:
//   u8 type | u8 flags | u16 credits | u32 length | u64 cookie | u64 aux
// kEager: `length` payload bytes follow. kRts (rendezvous request): an
// RtsBody follows (u64 addr | u64 length | u32 rkey): the sender's buffer,
// which the receiver RDMA-reads; `cookie` names it. kFin: rendezvous
// `cookie` is done (aux = 0, or the errno of the receiver's failure).
// kCredit: credits only. kClose: `aux` = user messages sent before closing.
// `credits` returns receive buffers to the peer on every message.
enum class MsgType : uint8_t { kEager = 1, kRts = 2, kFin = 3, kCredit = 4, kClose = 5 };
constexpr uint8_t kMsgControl = 1;  // core's control channel, not a user message

struct Header {
  MsgType type = MsgType::kEager;
  uint8_t flags = 0;
  uint16_t credits = 0;
  uint32_t length = 0;
  uint64_t cookie = 0;
  uint64_t aux = 0;
};
constexpr size_t kHeaderSize = 24;
struct RtsBody {               // follows a kRts header
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t rkey = 0;
};
constexpr size_t kRtsBodySize = 20;

void EncodeHeader(const Header& h, uint8_t* out);
// Validates the type, and that a message of `len` bytes holds what the
// header announces (eager payload, RTS body) within `eager_size`.
absl::StatusOr<Header> DecodeHeader(const uint8_t* in, size_t len, size_t eager_size);
void EncodeRts(const RtsBody& r, uint8_t* out);
RtsBody DecodeRts(const uint8_t* in);

// ------------------------------------------------------------ matching

// Pairs arriving user messages with posted receives, both in order. A
// message arriving with no receive posted waits (eager: its bytes are
// copied aside; rendezvous: its descriptor), and the next receive posted
// takes it.
struct PostedRecv {
  void* buf = nullptr;
  size_t len = 0;
  MemoryRegion* mr = nullptr;
  uint64_t context = 0;
};
struct Arrival {
  bool rendezvous = false;
  std::vector<uint8_t> data;   // eager payload
  RtsBody rts;                 // rendezvous descriptor
  uint64_t cookie = 0;         // rendezvous id at the sender
};
struct Match {
  PostedRecv recv;
  Arrival msg;
  // The message is longer than the receive: fail the receive with
  // OutOfRange and discard the message (rendezvous: tell the sender).
  bool truncated = false;
};

class Matcher {
 public:
  // Returns the match if a receive was waiting, else queues the message.
  std::optional<Match> Arrive(Arrival msg);
  std::optional<Match> Post(PostedRecv recv);
  size_t waiting_messages() const { return messages_.size(); }
  size_t waiting_recvs() const { return recvs_.size(); }
  // Removes everything (endpoint down): receives to fail, messages dropped.
  std::deque<PostedRecv> TakeRecvs();
  std::deque<Arrival> TakeMessages();

 private:
  static Match Pair(PostedRecv r, Arrival m);
  std::deque<PostedRecv> recvs_;
  std::deque<Arrival> messages_;
};

// Send credits: how many of the peer's receive buffers we may fill, and how
// many of ours we have refilled since we last told the peer. As in SDP, the
// last credit is kept for a credit update: a message takes a credit only
// when two are left, an explicit update (kCredit) may take the last one, and
// is sent only when it returns at least two (one to replace the buffer it
// fills, one gained: updates that return one would bounce between two
// blocked peers forever). Two peers that both ran short can then always
// tell each other what they refilled, so neither waits forever and no
// receiver is overrun (recv_depth >= 4).
class Credits {
 public:
  explicit Credits(uint32_t initial) : available_(initial) {}
  bool unlimited() const { return available_ == kUnlimited; }
  // Takes one credit for a message; false when fewer than two are left
  // (queue it).
  bool Take();
  // Takes one credit for a credit update (the last one may go); false when
  // none is left or fewer than two are owed to the peer.
  bool TakeForUpdate();
  // The peer returned `n`.
  void Grant(uint32_t n);
  // One of our buffers was refilled; returns true when an explicit update
  // should be sent (half the window refilled and nothing to piggyback on).
  bool Returned(uint32_t window);
  // Credits to piggyback on the next message we send (then zero).
  uint16_t TakeReturn();
  uint32_t available() const { return available_; }
  uint32_t pending_return() const { return to_return_; }
  static constexpr uint32_t kUnlimited = UINT32_MAX;

 private:
  uint32_t available_;
  uint32_t to_return_ = 0;
};

// ------------------------------------------------------------ registrations

// The seam between the provider's registrations and the device: ibv_reg_mr
// and ibv_dereg_mr in production, a fake in tests.
class Registrar {
 public:
  struct Keys {
    void* handle = nullptr;  // ibv_mr*
    uint32_t lkey = 0;
    uint32_t rkey = 0;
  };
  virtual ~Registrar() = default;
  virtual absl::StatusOr<Keys> Register(void* addr, size_t len, int ibv_access) = 0;
  // Must be callable from memory-release hooks (no zsock locks).
  virtual void Deregister(void* handle) noexcept = 0;
};

// The target's record of its live registrations, keyed by rkey. Used for
// emulated accesses (Fabric::AccessLocal) and to refuse keys after Revoke.
class RegTable {
 public:
  struct Entry {
    uint64_t addr = 0;
    uint64_t len = 0;
    uint32_t access = 0;
    std::atomic<bool> revoked{false};
    std::atomic<int> active{0};  // accesses in progress
  };
  std::shared_ptr<Entry> Add(uint32_t rkey, uint64_t addr, uint64_t len, uint32_t access);
  // Removes `entry` (not a newer registration that reused its rkey).
  void Remove(uint32_t rkey, const Entry* entry);
  // Runs fn on addr if a live registration with `rkey` covers the range
  // with the rights; else PermissionDenied without touching memory.
  absl::Status Access(uint32_t rkey, uint64_t addr, size_t len, uint32_t access,
                      absl::FunctionRef<void(void*)> fn);
  // Lock-free (memory-release hooks): refuses the key from now on and waits
  // for accesses in progress.
  static void Revoke(Entry* e) noexcept;

 private:
  Mutex mu_;
  std::map<uint32_t, std::shared_ptr<Entry>> by_rkey_ ABSL_GUARDED_BY(mu_);
};

// One registration. Revoke deregisters at once (the HCA then refuses the
// rkey); the destructor deregisters if Revoke did not.
class VerbsRegion final : public MemoryRegion {
 public:
  VerbsRegion(Registrar* registrar, RegTable* table, void* addr, size_t len, uint32_t access,
              Registrar::Keys keys);
  ~VerbsRegion() override;
  void* desc() const override { return const_cast<uint32_t*>(&lkey_); }
  uint32_t lkey() const { return lkey_; }
  uint32_t rkey() const { return rkey_; }
  RemoteKey remote_key() const override;
  void Revoke() noexcept override;
  bool revoked() const { return handle_.load() == nullptr; }

 private:
  Registrar* registrar_;
  RegTable* table_;
  std::shared_ptr<RegTable::Entry> entry_;
  std::atomic<void*> handle_;
  uint32_t lkey_;
  uint32_t rkey_;
};

// Registers through `registrar` and records the region in `table`.
absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(Registrar* registrar, RegTable* table,
                                                       void* addr, size_t len, uint32_t access);

// The lkey of a region this provider made (desc() points at it).
inline uint32_t LkeyOf(const MemoryRegion* mr) {
  return *static_cast<const uint32_t*>(mr->desc());
}

}  // namespace zsock::verbs

#endif  // ZSOCK_PROVIDERS_VERBS_VERBS_CORE_H_
