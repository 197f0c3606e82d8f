// VerbsEndpoint: one RC connection of the verbs provider: the rdma_cm id
// (on its own event channel), its ibv_cq and QP, and the message engine
// (engine.h) that runs the protocol over them as its Transport.
//
// Calls into the engine hold the endpoint's mutex; what a call produced
// (completions, control messages, a failure) is delivered after it is
// released. The operations and the progress VerbsCq drives are defined
// here, inline, as they are on the per-message path; set-up, start and
// close are in endpoint.cc.
#ifndef ZSOCK_PROVIDERS_VERBS_ENDPOINT_H_
#define ZSOCK_PROVIDERS_VERBS_ENDPOINT_H_

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/mutex.h"
#include "core/provider.h"
#include "core/rcache.h"
#include "core/status.h"
#include "providers/verbs/cq.h"
#include "providers/verbs/engine.h"
#include "providers/verbs/fabric.h"
#include "providers/verbs/wire.h"

namespace zsock::verbs {

class VerbsEndpoint final : public Endpoint, private Transport {
 public:
  VerbsEndpoint(VerbsFabric* fabric, VerbsCq* cq, rdma_cm_id* id, rdma_event_channel* ch,
                ibv_cq* icq, uint32_t max_inline);
  ~VerbsEndpoint() override;

  // Registers the slabs and posts receives (before the peer can send).
  absl::Status Prepare() {
    MutexLock lock(&mu_);
    return engine_.Prepare();
  }

  // The connection is up and the peer's hello known.
  void Start(const struct Hello& peer, std::string local, std::string remote);

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
  void Close() override;

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
  static EngineConfig Config(VerbsFabric* f, uint32_t max_inline);

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

}  // namespace zsock::verbs

#endif  // ZSOCK_PROVIDERS_VERBS_ENDPOINT_H_
