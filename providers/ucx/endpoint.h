// The ucx endpoint: a connection's user-facing half. Its state that UCX
// callbacks reach is its EpCore (ep_core.h), which may outlive it; the
// endpoint also owns the handshake's TCP socket, kept open as the
// liveness signal (the peer sends nothing on it after the handshake, so
// readable means gone).
//
// Two-sided messages: ucp_tag_send_nbx / ucp_tag_recv_nbx on the tag
// naming the receiving endpoint (ep_core.h). Control messages (core
// emulation, flow reports) use its control tag and are probed by progress
// (after an arrival, once per coarse tick, before sleeping), so a user
// message waiting for a receive never blocks them. Completions are
// reported in posting order.
//
// One-sided operations: on ordinary memory UCX 1.13 has no transport RMA
// on these transports, only its software emulation, which writes wherever
// the peer says without any key check; zsock uses core emulation there
// (the target checks every access against its registration table). On
// memory from AllocateRegistered (posix shared memory) RMA and atomics are
// native UCP operations, checked first against the target's key table,
// which the initiator maps through ucp_rkey_ptr (native_rma.cc).
//
// The injected send (Send with kInjectContext -> InjectLocked ->
// SendNowLocked -> ucp_tag_send_nbx) is a ping-pong's every reply: it
// stays inline and free of the tracked send's frame.
#ifndef ZSOCK_PROVIDERS_UCX_ENDPOINT_H_
#define ZSOCK_PROVIDERS_UCX_ENDPOINT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "core/fd.h"
#include "core/provider.h"
#include "providers/ucx/cq.h"
#include "providers/ucx/ep_core.h"

namespace zsock::ucx {

class UcxFabric;

inline constexpr size_t kMaxMessage = size_t{1} << 30;

class UcxEndpoint final : public Endpoint {
 public:
  UcxEndpoint(UcxFabric* fabric, UcxCq* cq, std::shared_ptr<EpCore> core, Fd sock,
              EndpointInfo info);
  ~UcxEndpoint() override;

  const EndpointInfo& info() const override { return info_; }

  absl::Status Send(const void* buf, size_t len, MemoryRegion* mr, uint64_t context) override;
  absl::Status PostRecv(void* buf, size_t len, MemoryRegion*, uint64_t context) override;
  absl::Status SendControl(std::span<const uint8_t> msg) override;
  absl::Status Read(void* local, size_t len, MemoryRegion* mr, uint64_t remote_addr,
                    const RemoteKey& rkey, uint64_t context) override;
  absl::Status Write(const void* local, size_t len, MemoryRegion* mr, uint64_t remote_addr,
                     const RemoteKey& rkey, uint64_t context) override;
  absl::Status FetchAdd(uint64_t* result, uint64_t remote_addr, const RemoteKey& rkey,
                        uint64_t add, uint64_t context) override;
  absl::Status CompareSwap(uint64_t* result, uint64_t remote_addr, const RemoteKey& rkey,
                           uint64_t compare, uint64_t swap, uint64_t context) override;
  void Close() override;

  // ---- for UcxCq ----
  // The connection socket became readable: the peer went away (it sends
  // nothing after the handshake).
  void OnSocketEvent();
  // Delivers control messages and a pending emulation failure; called by
  // the endpoint's CQ without any provider lock the handlers could need.
  size_t Service();
  // Whether Service has something to do.
  bool HasWork();

 private:
  // A send that reports its completion.
  [[gnu::noinline]] absl::Status SendTracked(const void* buf, size_t len, MemoryRegion*,
                                             uint64_t context);
  // An injected send (Capabilities::inject_size): no completion is
  // reported; SendNowLocked sends it from the caller's buffer or a copy.
  // Defined in endpoint.cc, inline into Send.
  inline absl::Status InjectLocked(EpCore* c, const void* buf, size_t len)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->worker->mu);
  // Beyond the window: a copy waits (FlowLocked sends it).
  [[gnu::noinline]] absl::Status HoldInjectedLocked(EpCore* c, const void* buf, size_t len)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->worker->mu);
  // Native UCP RMA/atomics on a peer's AllocateRegistered memory, after
  // checking the peer's own record of the key. *handled = false: not such
  // memory (or not over shared memory): the caller emulates.
  absl::Status Native(OpType type, void* local, size_t len, uint64_t raddr,
                      const RemoteKey& rkey, uint64_t a, uint64_t b, uint64_t* result,
                      uint64_t context, bool* handled);

  UcxCq* cq_;
  std::shared_ptr<EpCore> core_;
  Fd sock_;
  EndpointInfo info_;
};

}  // namespace zsock::ucx

#endif  // ZSOCK_PROVIDERS_UCX_ENDPOINT_H_
