// unet: user-level endpoints over shared memory, after "U-Net: A
// User-Level Network Interface for Parallel and Distributed Computing"
// (the default zsock provider; needs nothing installed; this host only).
// Design notes: docs/unet.md.
//
// The fabric holds the key table peers map, the local registration table,
// and the endpoints (to announce shared segments to). Connection set-up
// runs over an abstract-namespace Unix SEQPACKET socket named after the
// address (an IP:PORT address names its port, held by a kernel TCP socket
// bound to it), so nothing is left in the file system after a crash; the
// hello exchange (handshake.h) passes the fds of each side's segment, CQ
// eventfd, key table and CQ bell, so only processes handed them can touch
// them. The socket then stays open as the liveness signal.
//
// Files: fabric.cc (opening, listening, connecting), handshake.cc,
// regions.cc (registrations), cq.cc, endpoint.h (the data path and direct
// access), os.cc, settings.cc.
#ifndef ZSOCK_PROVIDERS_UNET_FABRIC_H_
#define ZSOCK_PROVIDERS_UNET_FABRIC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/fd.h"
#include "core/mutex.h"
#include "core/provider.h"
#include "core/local_keys.h"
#include "providers/unet/os.h"
#include "providers/unet/regions.h"
#include "providers/unet/segment.h"
#include "providers/unet/settings.h"

namespace zsock::unet {

class UnetEndpoint;

class UnetFabric final : public Fabric {
 public:
  static absl::StatusOr<std::unique_ptr<Fabric>> Open(const FabricSpec& spec);
  ~UnetFabric() override { ReleaseCache(); }

  const Capabilities& caps() const override { return caps_; }
  const Settings& settings() const { return settings_; }
  int key_fd() const { return key_fd_.get(); }
  KeySlot* key_table() const { return reinterpret_cast<KeySlot*>(key_map_.get()); }

  // regions.cc
  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* addr, size_t len,
                                                               uint32_t access) override;
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
  LocalKeyTable& local_keys() { return local_; }

  absl::Status AccessLocal(const RemoteKey& rkey, uint64_t addr, size_t len, uint32_t access,
                           absl::FunctionRef<void(void*)> fn) override;

  absl::StatusOr<std::unique_ptr<CompletionQueue>> CreateCq() override;
  absl::StatusOr<std::unique_ptr<Listener>> Listen(absl::string_view address) override;
  absl::StatusOr<std::unique_ptr<Endpoint>> Connect(absl::string_view address,
                                                    CompletionQueue* cq,
                                                    absl::Duration timeout) override;

  // Runs the handshake on a connected socket and builds the endpoint
  // (handshake.cc).
  absl::StatusOr<std::unique_ptr<Endpoint>> Handshake(Fd sock, std::string local,
                                                      std::string peer, CompletionQueue* cq,
                                                      absl::Time deadline);

 private:
  UnetFabric(const FabricSpec& spec, const Settings& s, Fd key_fd, Mapping key_map);

  absl::StatusOr<std::unique_ptr<UnetRegion>> RegisterSlot(void* addr, size_t len,
                                                          uint32_t access, uint32_t shm_id);

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
  LocalKeyTable local_;
  Mutex ep_mu_;
  std::vector<std::pair<UnetEndpoint*, int>> endpoints_ ABSL_GUARDED_BY(ep_mu_);
  std::vector<SharedSeg> shared_ ABSL_GUARDED_BY(ep_mu_);
  uint32_t next_shm_id_ ABSL_GUARDED_BY(ep_mu_) = 1;
};

}  // namespace zsock::unet

#endif  // ZSOCK_PROVIDERS_UNET_FABRIC_H_
