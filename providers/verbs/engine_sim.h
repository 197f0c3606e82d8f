// A simulated pair of connected RC queue pairs for the verbs engine's tests
// (no device needed). It executes the ibv_send_wr / ibv_recv_wr the engines
// post the way an HCA does (SEND into the next posted receive, RDMA
// READ/WRITE and atomics checked against the target's registrations by
// rkey, inline data copied at post time, RNR when no receive is posted,
// error states that flush everything) and reports ibv_wc entries, so the
// tests exercise the protocol: framing, eager/rendezvous, matching,
// credits, back-pressure and teardown.
#ifndef ZSOCK_PROVIDERS_VERBS_ENGINE_SIM_H_
#define ZSOCK_PROVIDERS_VERBS_ENGINE_SIM_H_

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/local_keys.h"
#include "core/provider.h"
#include "providers/verbs/engine.h"
#include "providers/verbs/region.h"

namespace zsock::verbs::sim {

// Registrations of one simulated host: lkey/rkey -> range and rights.
class SimMemory : public Registrar {
 public:
  struct Mr {
    uint64_t addr;
    uint64_t len;
    int access;
    bool live = true;
  };
  absl::StatusOr<Keys> Register(void* addr, size_t len, int ibv_access) override {
    uint32_t key = next_++;
    mrs_[key] = Mr{reinterpret_cast<uint64_t>(addr), len, ibv_access};
    ++registrations;
    return Keys{reinterpret_cast<void*>(uintptr_t{key}), key, key};
  }
  void Deregister(void* handle) noexcept override {
    mrs_[static_cast<uint32_t>(reinterpret_cast<uintptr_t>(handle))].live = false;
  }
  // Whether key covers [addr, addr + len) with `need` (IBV_ACCESS_* bits; 0
  // = local read, always granted).
  bool Covers(uint32_t key, uint64_t addr, uint64_t len, int need) const {
    auto it = mrs_.find(key);
    if (it == mrs_.end() || !it->second.live) return false;
    const Mr& m = it->second;
    return addr >= m.addr && len <= m.len && addr - m.addr <= m.len - len &&
           (m.access & need) == need;
  }
  LocalKeyTable table{1 << 20};  // a fabric's default max_registrations
  int registrations = 0;

 private:
  uint32_t next_ = 0x100;
  std::map<uint32_t, Mr> mrs_;
};

// One side of the connection: the engine's Transport.
class SimSide : public Transport {
 public:
  struct PendingSend {
    ibv_send_wr wr;
    ibv_sge sge;
    std::vector<uint8_t> inline_data;
  };
  struct PostedRecv {
    uint64_t wr_id;
    ibv_sge sge;
  };

  SimSide(int sq_depth, uint32_t max_inline) : sq_depth_(sq_depth), max_inline_(max_inline) {}
  ~SimSide() override { srq_mr_.reset(); }  // before `mem`, its registrar

  // A shared receive queue: `slots` buffers of `size` bytes.
  void MakeSrq(size_t slots, size_t size) {
    srq_mem_.assign(slots * size, 0);
    srq_size_ = size;
    auto mr = Register(srq_mem_.data(), srq_mem_.size(), kLocalWrite);
    srq_mr_ = std::move(*mr);
    for (size_t i = 0; i < slots; ++i) RepostSrq(i);
  }
  const uint8_t* SrqBuffer(size_t slot) override { return srq_mem_.data() + slot * srq_size_; }
  void RepostSrq(size_t slot) override {
    ibv_sge sge{reinterpret_cast<uint64_t>(srq_mem_.data() + slot * srq_size_),
                static_cast<uint32_t>(srq_size_), LkeyOf(srq_mr_.get())};
    rq_.push_back(PostedRecv{Engine::kRecvBit | slot, sge});
    ++srq_reposts;
  }
  std::vector<uint8_t> srq_mem_;
  size_t srq_size_ = 0;
  std::unique_ptr<MemoryRegion> srq_mr_;
  int srq_reposts = 0;

  int PostSend(ibv_send_wr* wr) override {
    if (error_) return EINVAL;
    if (static_cast<int>(sq_.size() + unpolled_sends_) >= sq_depth_) {
      ++overflows;
      return ENOMEM;
    }
    PendingSend p;
    p.wr = *wr;
    if (wr->num_sge > 0) p.sge = wr->sg_list[0];
    p.wr.sg_list = wr->num_sge > 0 ? &p.sge : nullptr;
    if (wr->send_flags & IBV_SEND_INLINE) {
      if (wr->num_sge > 0 && p.sge.length > max_inline_) return EINVAL;
      if (wr->num_sge > 0) {
        const auto* src = reinterpret_cast<const uint8_t*>(p.sge.addr);
        p.inline_data.assign(src, src + p.sge.length);
      }
      ++inline_posts;
    }
    if (wr->opcode == IBV_WR_SEND) ++sends_posted;
    sq_.push_back(std::move(p));
    return 0;
  }
  int PostRecv(ibv_recv_wr* wr) override {
    if (error_) return EINVAL;
    rq_.push_back(PostedRecv{wr->wr_id, wr->sg_list[0]});
    return 0;
  }
  int Poll(int n, ibv_wc* wc) override {
    int got = 0;
    while (got < n && !cq_.empty()) {
      wc[got] = cq_.front();
      cq_.pop_front();
      if (!(wc[got].wr_id & Engine::kRecvBit)) --unpolled_sends_;
      ++got;
    }
    return got;
  }
  absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(void* addr, size_t len,
                                                         uint32_t access) override {
    return verbs::Register(&mem, &mem.table, addr, len, access);
  }
  absl::StatusOr<std::shared_ptr<MemoryRegion>> Pin(void* addr, size_t len,
                                                    uint32_t access) override {
    ++pins;
    auto r = verbs::Register(&mem, &mem.table, addr, len, access);
    if (!r.ok()) return r.status();
    return std::shared_ptr<MemoryRegion>(std::move(*r));
  }

  void Complete(uint64_t wr_id, ibv_wc_status st, ibv_wc_opcode opcode, uint32_t len = 0) {
    ibv_wc wc{};
    wc.wr_id = wr_id;
    wc.status = st;
    wc.opcode = opcode;
    wc.byte_len = len;
    cq_.push_back(wc);
    if (!(wr_id & Engine::kRecvBit)) ++unpolled_sends_;
  }

  // The QP enters the error state: everything posted is flushed.
  void EnterError() {
    if (error_) return;
    error_ = true;
    for (auto& p : sq_) Complete(p.wr.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND);
    sq_.clear();
    for (auto& r : rq_) Complete(r.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV);
    rq_.clear();
  }

  SimMemory mem;
  SimSide* peer = nullptr;
  std::deque<PendingSend> sq_;
  std::deque<PostedRecv> rq_;
  std::deque<ibv_wc> cq_;
  int unpolled_sends_ = 0;
  int sq_depth_;
  uint32_t max_inline_;
  bool error_ = false;
  bool dead_ = false;  // the process is gone: nothing answers
  int overflows = 0;
  int inline_posts = 0;
  int sends_posted = 0;
  int rnr_naks = 0;
  int pins = 0;
};

// Executes the front work request of `s` against its peer; false if none
// could run (empty, or RNR: the peer has no receive posted).
bool Execute(SimSide* s);

// A connected pair of engines over the simulation.
struct Pair {
  Pair(EngineConfig ca, EngineConfig cb);
  static Hello HelloOf(const EngineConfig& c);
  // Runs the wire and both engines until nothing moves.
  void Settle();
  // The next completion of a side (settling as needed).
  std::optional<Completion> Next(EngineOutput* out);
  SimSide a, b;
  Engine ea, eb;
  EngineOutput oa, ob;
};

// A small configuration: few send slots and credits, small buffers, and
// rendezvous pulls split in chunks.
EngineConfig Small();

// Deterministic pseudo-random bytes.
void Fill(uint8_t* p, size_t n, uint64_t seed);

}  // namespace zsock::verbs::sim

#endif  // ZSOCK_PROVIDERS_VERBS_ENGINE_SIM_H_
