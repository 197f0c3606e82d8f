// VerbsFabric: one RDMA device's port as a zsock fabric. It holds the
// device's librdmacm verbs context, one protection domain, optionally one
// shared receive queue (srq=on) and the LocalKeyTable of its registrations
// for emulated accesses; it creates completion queues, listeners and connections
// (connect.cc) and the endpoints on them.
//
// Where it lives: fabric.cc (registration, CQs, endpoints, the hello),
// fabric_setup.cc (opening the device: Setup in named steps), connect.cc
// (listen, accept, connect).
#ifndef ZSOCK_PROVIDERS_VERBS_FABRIC_H_
#define ZSOCK_PROVIDERS_VERBS_FABRIC_H_

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/local_keys.h"
#include "core/log.h"
#include "core/mutex.h"
#include "core/provider.h"
#include "core/slab.h"
#include "core/status.h"
#include "providers/verbs/engine.h"
#include "providers/verbs/region.h"
#include "providers/verbs/settings.h"
#include "providers/verbs/wire.h"

namespace zsock::verbs {

class VerbsEndpoint;

// Registrations through ibv_reg_mr on the fabric's protection domain.
class IbvRegistrar final : public Registrar {
 public:
  explicit IbvRegistrar(ibv_pd* pd) : pd_(pd) {}
  absl::StatusOr<Keys> Register(void* addr, size_t len, int ibv_access) override {
    ibv_mr* mr = ibv_reg_mr(pd_, addr, len, ibv_access);
    if (mr == nullptr) {
      int err = errno;
      return ErrnoError(err, absl::StrCat("ibv_reg_mr of ", len, " bytes at 0x",
                                          absl::Hex(reinterpret_cast<uintptr_t>(addr))),
                        err == ENOMEM || err == EAGAIN
                            ? "raise the locked-memory limit (ulimit -l unlimited, or memlock in "
                              "/etc/security/limits.conf) or lower rcache_max_bytes"
                            : "register mapped memory the process may access");
    }
    return Keys{mr, mr->lkey, mr->rkey};
  }
  void Deregister(void* handle) noexcept override {
    ibv_dereg_mr(static_cast<ibv_mr*>(handle));
  }

 private:
  ibv_pd* pd_;
};

class VerbsFabric final : public Fabric {
 public:
  static absl::StatusOr<std::unique_ptr<Fabric>> Open(const FabricSpec& spec);
  ~VerbsFabric() override;

  const Capabilities& caps() const override { return caps_; }
  const Settings& settings() const { return settings_; }
  ibv_context* ctx() const { return ctx_; }
  ibv_pd* pd() const { return pd_; }
  ibv_srq* srq() const { return srq_; }
  Slab& srq_slab() { return srq_slab_; }
  Mutex& srq_mu() { return srq_mu_; }
  const ibv_device_attr& dev_attr() const { return dev_attr_; }
  uint32_t max_msg_sz() const { return max_msg_sz_; }
  bool atomics_native() const { return atomics_native_; }
  uint64_t id() const { return id_; }
  const std::string& local_ip() const { return local_ip_; }
  const std::string& device_name() const { return device_name_; }

  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* addr, size_t len,
                                                               uint32_t access) override {
    return Register(&registrar_, local_keys_.get(), addr, len, access);
  }

  // Trusts only the table: the range a RemoteKey claims is not checked.
  absl::Status AccessLocal(const RemoteKey& rkey, uint64_t addr, size_t len, uint32_t access,
                           absl::FunctionRef<void(void*)> fn) override {
    auto blob = DecodeKeyBlob(rkey.blob);
    if (!blob.ok()) return blob.status();
    return local_keys_->Access(blob->key, addr, len, access, fn);
  }

  absl::StatusOr<std::unique_ptr<CompletionQueue>> CreateCq() override;
  absl::StatusOr<std::unique_ptr<Listener>> Listen(absl::string_view address) override;
  absl::StatusOr<std::unique_ptr<Endpoint>> Connect(absl::string_view address, CompletionQueue* cq,
                                                    absl::Duration timeout) override;

  // Builds the QP and endpoint on a resolved (client) or requested (server)
  // id that has its own event channel.
  absl::StatusOr<std::unique_ptr<VerbsEndpoint>> MakeEndpoint(rdma_cm_id* id,
                                                              rdma_event_channel* ch,
                                                              CompletionQueue* cq);
  // Refills one SRQ buffer. Inline: every message received through the SRQ
  // gives its buffer back here.
  void RepostSrq(size_t slot) {
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uint64_t>(srq_slab_.slot(slot));
    sge.length = static_cast<uint32_t>(srq_slab_.slot_size());
    sge.lkey = LkeyOf(srq_slab_.mr());
    ibv_recv_wr wr{};
    wr.wr_id = Engine::kRecvBit | slot;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    MutexLock lock(&srq_mu_);
    if (int rc = ibv_post_srq_recv(srq_, &wr, &bad); rc != 0) {
      ZS_LOG(kError, "ibv_post_srq_recv failed (%s): the shared receive queue shrinks",
             std::strerror(rc));
    }
  }

  // This fabric's connection private data (wire.h).
  std::string Hello() const;

 private:
  VerbsFabric() = default;
  absl::Status Setup(const FabricSpec& spec);
  // Setup's steps (fabric_setup.cc).
  absl::Status InitFork();
  absl::StatusOr<std::vector<DeviceDesc>> OpenDevices();
  absl::Status ChoosePort(const std::vector<DeviceDesc>& descs, const PortDesc** port);
  absl::Status ChooseLocalIp(const PortDesc& port);
  absl::Status CreateSrq();
  void DescribeCaps(const PortDesc& port);

  Settings settings_;
  ibv_context** devices_ = nullptr;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_srq* srq_ = nullptr;
  Slab srq_slab_;
  Mutex srq_mu_;
  ibv_device_attr dev_attr_{};
  uint32_t max_msg_sz_ = 0;
  int port_ = 0;
  bool atomics_native_ = false;
  uint64_t id_ = 0;
  std::string local_ip_;
  std::string device_name_;
  Capabilities caps_;
  // Made in Setup with settings_.max_registrations slots.
  std::unique_ptr<LocalKeyTable> local_keys_;
  IbvRegistrar registrar_{nullptr};
};

}  // namespace zsock::verbs

#endif  // ZSOCK_PROVIDERS_VERBS_FABRIC_H_
