// Core emulation of one-sided operations over a provider's control channel.
//
// When a provider lacks native RDMA read/write or atomics (or, like unet
// without cross-memory attach, cannot use them towards a given peer), the
// Endpoint base class sends a request over the control channel; the target's
// progress engine validates the remote key with Fabric::AccessLocal,
// performs the access on its own memory and replies. Written once here so no
// provider or caller repeats it. Wire format: docs/provider-interface.md.
#ifndef ZSOCK_CORE_EMULATION_H_
#define ZSOCK_CORE_EMULATION_H_

#include <cstdint>
#include <span>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "core/mutex.h"
#include "core/provider.h"

namespace zsock {

class Emulation {
 public:
  explicit Emulation(Endpoint* ep) : ep_(ep) {}

  absl::Status Read(void* local, size_t len, uint64_t remote_addr,
                    const RemoteKey& rkey, uint64_t context);
  absl::Status Write(const void* local, size_t len, uint64_t remote_addr,
                     const RemoteKey& rkey, uint64_t context);
  absl::Status Atomic(OpType op, uint64_t* result, uint64_t remote_addr,
                      const RemoteKey& rkey, uint64_t a, uint64_t b,
                      uint64_t context);

  // A control message from the peer (request or response).
  void Deliver(std::span<const uint8_t> msg);
  // Fails every operation in flight (peer gone).
  void FailAll(const absl::Status& why);

 private:
  struct Pending {
    OpType op;
    void* local;      // Read destination or atomic result
    size_t len;
    uint64_t context;
  };
  absl::Status Start(OpType op, void* local, size_t len, uint64_t remote_addr,
                     const RemoteKey& rkey, uint64_t a, uint64_t b,
                     std::span<const uint8_t> payload, uint64_t context);
  void Serve(std::span<const uint8_t> msg);
  void Finish(std::span<const uint8_t> msg);

  Endpoint* ep_;
  Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zsock

#endif  // ZSOCK_CORE_EMULATION_H_
