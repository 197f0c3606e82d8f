// OfiFabric: one opened ofi configuration: the fi_info, fabric and domain
// it resolved to, the capabilities it reports, how its CQs wait, the
// domain lock, and the table of its live registrations. Endpoints and CQs
// keep a pointer to it and read its settings on their hot paths (inline
// accessors). Open is in fabric.cc, registration in memory.cc, CreateCq in
// cq.cc; Listen and Connect hand over to rdm_connect.cc or msg_connect.cc.
#ifndef ZSOCK_PROVIDERS_OFI_FABRIC_H_
#define ZSOCK_PROVIDERS_OFI_FABRIC_H_

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/local_keys.h"
#include "core/provider.h"
#include "providers/ofi/domain_lock.h"
#include "providers/ofi/settings.h"

namespace zsock::ofi {

// Capabilities::inject_size at most (the provider's own tx inject size is
// often larger: rxm's eager buffer, shm's 4 KiB).
inline constexpr size_t kMaxInject = 512;
// The largest control message, and the room in one for core's emulation
// header and a serialized key.
inline constexpr size_t kControlBuf = 64 * 1024;
inline constexpr size_t kControlOverhead = 512;
// How many registrations a fabric holds live at once (its LocalKeyTable's
// capacity), as verbs' default max_registrations. The table grows in
// chunks as registrations arrive, so the bound costs only one pointer per
// chunk; libfabric's own MR limits usually bind first.
inline constexpr uint32_t kMaxRegistrations = 1u << 20;

class OfiFabric final : public Fabric {
 public:
  static absl::StatusOr<std::unique_ptr<Fabric>> Open(const FabricSpec& spec);
  ~OfiFabric() override;

  const Capabilities& caps() const override { return caps_; }
  fi_info* info() const { return info_; }
  fid_domain* domain() const { return domain_; }
  fid_fabric* fabric() const { return fabric_; }
  DomainMutex& dom_mu() { return dom_mu_; }
  LocalKeyTable& keys() { return keys_; }
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
  // Remote addresses are virtual addresses when the provider reports
  // FI_MR_VIRT_ADDR, offsets into the registration otherwise (fi_mr(3)).
  bool virt_addr() const { return (info_->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0; }
  bool raw_keys() const { return (info_->domain_attr->mr_mode & FI_MR_RAW) != 0; }
  bool local_mr() const {
    return (info_->domain_attr->mr_mode & FI_MR_LOCAL) != 0 || settings_.mr_local;
  }
  const Settings& settings() const { return settings_; }
  // A number for pairing the two halves of an MSG connection.
  uint64_t NextNonce() { return next_nonce_.fetch_add(1); }
  // A new endpoint's description: the fabric's capabilities, and a note
  // naming the provider and domain, with `kind` after the provider.
  EndpointInfo NewEndpointInfo(absl::string_view kind) const;

  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* addr, size_t len,
                                                               uint32_t access) override;
  absl::Status AccessLocal(const RemoteKey& rkey, uint64_t addr, size_t len, uint32_t access,
                           absl::FunctionRef<void(void*)> fn) override;
  absl::StatusOr<std::unique_ptr<CompletionQueue>> CreateCq() override;
  absl::StatusOr<std::unique_ptr<Listener>> Listen(absl::string_view address) override;
  absl::StatusOr<std::unique_ptr<Endpoint>> Connect(absl::string_view address, CompletionQueue* cq,
                                                    absl::Duration timeout) override;

 private:
  OfiFabric() = default;

  // The steps of Open.
  absl::Status OpenDomain(fi_ep_type type, bool rma_wanted);
  void DescribeCapabilities();
  absl::Status ChooseCqWait();
  void AddNotes(bool rma_wanted);

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
  std::atomic<uint64_t> next_nonce_{1};
  LocalKeyTable keys_{kMaxRegistrations};
};

}  // namespace zsock::ofi

#endif  // ZSOCK_PROVIDERS_OFI_FABRIC_H_
