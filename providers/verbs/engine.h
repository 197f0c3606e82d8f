// The verbs provider's per-connection message engine, apart from the device:
// eager messages through registered send slots and receive buffers,
// rendezvous (the receiver RDMA-reads large messages and answers FIN),
// credit-based flow control, the in-order backlog that absorbs send-queue
// and credit exhaustion, native RDMA read/write/atomics, and failing
// everything exactly once when the connection ends.
//
// The engine speaks ibv_send_wr / ibv_recv_wr / ibv_wc through a Transport:
// ibv_post_send, ibv_post_recv and ibv_poll_cq on a real RC QP in
// endpoint.h; an in-memory simulation of a pair of connected QPs in
// engine_sim.h, which runs the engine's protocol end to end without a
// device.
//
// Where it lives: engine.cc (setting up, the operations, posting, teardown)
// and engine_completions.cc (completions, received messages, rendezvous
// pulls); engine_op.h holds what both share.
//
// Not thread-safe: the endpoint serialises calls with its own mutex.
#ifndef ZSOCK_PROVIDERS_VERBS_ENGINE_H_
#define ZSOCK_PROVIDERS_VERBS_ENGINE_H_

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/provider.h"
#include "providers/verbs/credits.h"
#include "providers/verbs/matcher.h"
#include "core/slab.h"
#include "providers/verbs/wire.h"
#include "providers/verbs/work_request.h"

namespace zsock::verbs {

// What the engine needs from the device.
class Transport {
 public:
  virtual ~Transport() = default;
  // ibv_post_send / ibv_post_recv: 0 or an errno value.
  virtual int PostSend(ibv_send_wr* wr) = 0;
  virtual int PostRecv(ibv_recv_wr* wr) = 0;
  // ibv_poll_cq: up to n completions, or < 0.
  virtual int Poll(int n, ibv_wc* wc) = 0;
  // A registration owned by the caller (Fabric::RegisterMemory).
  virtual absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(void* addr, size_t len,
                                                                 uint32_t access) = 0;
  // A registration from the pin-down cache (Fabric::rcache().Get).
  virtual absl::StatusOr<std::shared_ptr<MemoryRegion>> Pin(void* addr, size_t len,
                                                            uint32_t access) = 0;
  // The shared receive queue's buffers (EngineConfig::srq only).
  virtual const uint8_t* SrqBuffer(size_t slot) { return nullptr; }
  virtual void RepostSrq(size_t slot) {}
};

struct EngineConfig {
  int sq_depth = 256;
  int recv_depth = 128;        // receive buffers (without SRQ) = the peer's credits
  size_t eager_size = 8192;    // our receive buffer size
  uint32_t max_inline = 0;     // the QP's max_inline_data
  uint32_t max_msg_sz = 1u << 30;
  bool srq = false;            // receives come from a shared receive queue
  size_t srq_slot_size = 0;
};

// What one call produced, for the caller to deliver without its lock.
struct EngineOutput {
  std::vector<Completion> completions;
  std::vector<std::vector<uint8_t>> control;  // core control messages (DeliverControl)
  bool fail_emulated = false;                 // the connection ended: FailEmulated(status)
};

class Engine {
 public:
  static constexpr uint64_t kRecvBit = uint64_t{1} << 63;
  static constexpr size_t kMaxMessage = size_t{1} << 30;

  Engine(Endpoint* owner, Transport* transport, EngineConfig config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Registers the slabs and posts the receive buffers (before connecting).
  absl::Status Prepare();
  // The peer's hello arrived: credits and buffer sizes.
  void Start(const Hello& peer, std::string peer_address);

  absl::Status Send(const void* buf, size_t len, MemoryRegion* mr, uint64_t context,
                    bool control, EngineOutput* out);
  absl::Status PostRecv(void* buf, size_t len, MemoryRegion* mr, uint64_t context,
                        EngineOutput* out);
  // kind: kRdmaRead or kRdmaWrite.
  absl::Status Rma(WrKind kind, void* local, size_t len, MemoryRegion* mr, uint64_t remote_addr,
                   const RemoteKey& rkey, uint64_t context, EngineOutput* out);
  // kind: kFetchAdd (a = addend) or kCompareSwap (a = compare, b = swap).
  absl::Status Atomic(WrKind kind, uint64_t* result, uint64_t remote_addr, const RemoteKey& rkey,
                      uint64_t a, uint64_t b, uint64_t context, EngineOutput* out);

  // Queues the close notice (user messages sent so far).
  void QueueClose(EngineOutput* out);
  // Nothing queued or in flight, and no rendezvous send waits for its FIN.
  bool Idle() const;

  // Polls the transport, handles each completion, posts what now fits.
  size_t Progress(EngineOutput* out);
  // Completions polled elsewhere (while arming), handled by the next Progress.
  void Stash(const ibv_wc& wc) { stash_.push_back(wc); }
  bool has_stash() const { return !stash_.empty(); }

  // The connection ended (`why`: peer gone, closed, a failed work request):
  // everything outstanding fails once with it; messages already received
  // stay for receives posted later unless `closed`.
  void Fail(const absl::Status& why, bool closed, EngineOutput* out);

  bool dead() const { return dead_; }
  bool closed() const { return closed_; }
  const absl::Status& dead_status() const { return dead_status_; }
  bool peer_closed() const { return peer_closed_; }
  size_t sq_used() const { return sq_used_; }
  size_t backlog() const { return backlog_.size(); }
  uint32_t credits() const { return credits_.available(); }
  uint32_t credits_owed() const { return credits_.pending_return(); }

 private:
  struct Op;
  struct Pull;

  size_t eager_payload() const { return peer_eager_ - kHeaderSize; }
  absl::Status CheckUsable() const;
  absl::Status LocalKeys(const void* buf, size_t len, MemoryRegion* mr, uint32_t access, Op* op,
                         uint32_t* lkey, uint32_t* rkey);
  void Enqueue(std::unique_ptr<Op> op, EngineOutput* out);
  void Pump(EngineOutput* out);
  absl::Status Post(Op* op);
  void ReleaseSlot(Op* op);
  absl::Status PostRecvSlot(size_t i);
  Completion Done(OpType op, uint64_t context, absl::Status st, size_t len);
  void FailOp(Op* op, const absl::Status& st, EngineOutput* out);
  void HandleWc(const ibv_wc& wc, EngineOutput* out);
  void HandleRecv(const ibv_wc& wc, EngineOutput* out);
  // One received message whose header `h` decoded; `body` follows it.
  void HandleMessage(const Header& h, const uint8_t* body, EngineOutput* out);
  // Gives receive buffer `slot` back (SRQ or our own queue); false when
  // reposting failed and the connection ended.
  bool RefillRecv(size_t slot, EngineOutput* out);
  void HandleMatch(Match m, EngineOutput* out);
  void StartControlPull(const Arrival& a, EngineOutput* out);
  void StartPull(std::unique_ptr<Pull> pull, uint64_t local, uint32_t lkey, const RtsBody& rts,
                 EngineOutput* out);
  void FinishPull(uint64_t id, const absl::Status& st, EngineOutput* out);
  void QueueFin(uint64_t cookie, int err, EngineOutput* out);
  // Control messages are delivered in the order they arrived, even when an
  // earlier one still comes by rendezvous.
  void FlushControl(EngineOutput* out);
  void SendCreditUpdate();
  void Die(const absl::Status& why, EngineOutput* out);
  void FailAll(const absl::Status& why, EngineOutput* out);
  static const char* OpName(const Op* op);

  Endpoint* owner_;
  Transport* t_;
  EngineConfig cfg_;
  std::string peer_address_;
  size_t peer_eager_ = 0;
  Credits credits_{0};
  Slab send_slab_;  // send slots; its pool holds the free ones
  Slab recv_slab_;  // our receive buffers (without SRQ), each always posted
  std::deque<std::unique_ptr<Op>> backlog_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Op>> ops_;   // posted, by wr_id
  absl::flat_hash_map<uint64_t, std::unique_ptr<Op>> rts_;   // waiting for FIN, by cookie
  absl::flat_hash_set<uint64_t> fin_early_;                   // FIN before the RTS completion
  absl::flat_hash_map<uint64_t, std::unique_ptr<Pull>> pulls_;
  std::vector<ibv_wc> stash_;
  struct ControlSlot {
    bool ready = false;
    bool ok = false;  // false: a failed rendezvous (nothing to deliver)
    std::vector<uint8_t> data;
  };
  std::deque<ControlSlot> control_q_;
  uint64_t control_base_ = 0;  // sequence number of control_q_.front()
  Matcher matcher_;
  size_t sq_used_ = 0;
  size_t rts_waiting_ = 0;
  uint64_t next_wr_ = 1;
  uint64_t next_cookie_ = 1;
  uint64_t next_pull_ = 1;
  uint64_t user_sent_ = 0;
  uint64_t peer_sent_ = 0;
  bool peer_closed_ = false;
  bool started_ = false;
  bool closed_ = false;
  bool dead_ = false;
  absl::Status dead_status_;
};

}  // namespace zsock::verbs

#endif  // ZSOCK_PROVIDERS_VERBS_ENGINE_H_
