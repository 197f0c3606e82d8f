// The ucx fabric: one UCP context (UCX_TLS from the fabric's spec:
// "ucx:tcp", "ucx:posix,cma", "ucx:all") and its worker, created at the
// first connection rather than at Open, so that processes forked before
// any endpoint exists start with clean UCX state (ForkGuard). Peers that
// shared memory cannot reach are connected through a second, tcp-only
// context and worker (the fallback), created when first needed.
//
// The fabric also owns the key table of its registrations (region.cc):
// the shared table peers map for native RMA, and the private one
// (LocalKeyTable) that decides emulated accesses. Connections are set up
// by the handshake (handshake.cc) over a TCP socket from Listen/Connect
// (listener.cc).
#ifndef ZSOCK_PROVIDERS_UCX_FABRIC_H_
#define ZSOCK_PROVIDERS_UCX_FABRIC_H_

#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/fd.h"
#include "core/mutex.h"
#include "core/provider.h"
#include "providers/ucx/context.h"
#include "providers/ucx/cq.h"
#include "providers/ucx/key_table.h"
#include "core/local_keys.h"
#include "providers/ucx/options.h"
#include "providers/ucx/worker.h"

namespace zsock::ucx {

class UcxRegion;

class UcxFabric final : public Fabric {
 public:
  static absl::StatusOr<std::unique_ptr<Fabric>> Open(const FabricSpec& spec);
  ~UcxFabric() override;

  const Capabilities& caps() const override { return caps_; }
  const Settings& settings() const { return settings_; }

  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* addr, size_t len,
                                                               uint32_t access) override;
  absl::StatusOr<std::unique_ptr<MemoryRegion>> AllocateRegistered(size_t len,
                                                                   uint32_t access) override;
  absl::Status AccessLocal(const RemoteKey& rkey, uint64_t addr, size_t len, uint32_t access,
                           absl::FunctionRef<void(void*)> fn) override;

  absl::StatusOr<std::unique_ptr<CompletionQueue>> CreateCq() override;
  absl::StatusOr<std::unique_ptr<Listener>> Listen(absl::string_view address) override;
  absl::StatusOr<std::unique_ptr<Endpoint>> Connect(absl::string_view address,
                                                    CompletionQueue* cq,
                                                    absl::Duration timeout) override;

  // Sets up a connection on `sock` (connected or accepted) by the
  // handshake, both sides alike (handshake.cc).
  absl::StatusOr<std::unique_ptr<Endpoint>> Handshake(Fd sock, CompletionQueue* cq,
                                                      absl::Time deadline);

  // Workers that exist (created at the first connection).
  // Called on every Poll: no allocation.
  absl::InlinedVector<Worker*, 2> LiveWorkers() const {
    absl::InlinedVector<Worker*, 2> out;
    ForEachLiveWorker([&out](Worker* w) { out.push_back(w); });
    return out;
  }
  Worker* primary() const { return primary_.load(std::memory_order_acquire); }
  Worker* fallback() const { return fallback_.load(std::memory_order_acquire); }
  // The same without building a vector.
  template <typename F>
  void ForEachLiveWorker(F f) const {
    Worker* p = primary();
    if (p != nullptr) f(p);
    if (Worker* w = fallback(); w != nullptr && w != p) f(w);
  }
  void AddCq(UcxCq* cq) {
    MutexLock lock(&cq_mu_);
    cqs_.push_back(cq);
    for (Worker* w : LiveWorkers()) cq->WatchWorker(w->efd());
  }
  void RemoveCq(UcxCq* cq) {
    MutexLock lock(&cq_mu_);
    cqs_.erase(std::remove(cqs_.begin(), cqs_.end(), cq), cqs_.end());
  }

  // ---- for the handshake ----
  // The primary worker; created at the first call.
  absl::StatusOr<Worker*> PrimaryWorker();
  // The worker of the tcp fallback context (the primary one where that is
  // tcp already); created at the first call.
  absl::StatusOr<Worker*> FallbackWorker();
  // A new endpoint id (never 0).
  uint32_t NextEndpointId() {
    uint32_t id = next_id_.fetch_add(1);
    if (id == 0) id = next_id_.fetch_add(1);
    return id;
  }
  // The primary context has RMA/atomics and a key table in shared memory.
  bool native() const { return native_; }
  const KeySlot* key_table() const { return table_; }
  size_t key_slots() const { return local_->capacity(); }
  const std::string& table_rkey() const { return table_rkey_; }

  // ---- for regions ----
  LocalKeyTable& local_keys() { return *local_; }
  void UnmapMemory(ucp_mem_h memh) {
    MutexLock lock(&ctx_mu_);
    ucp_mem_unmap(primary_ctx_->handle(), memh);
  }

 private:
  UcxFabric(const FabricSpec& spec, Settings s, std::shared_ptr<Context> ctx)
      : settings_(std::move(s)), primary_ctx_(std::move(ctx)) {
    caps_.provider = "ucx";
    caps_.spec = spec.ToString();
  }
  // region.cc: the key tables.
  absl::Status InitTable();
  // Maps the shared key table in UCX shared memory (native_ when it works).
  void MapSharedTable(size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_mu_);
  absl::StatusOr<std::unique_ptr<UcxRegion>> RegisterSlot(void* addr, size_t len,
                                                          uint32_t access, uint16_t flags,
                                                          const std::string& rkey,
                                                          ucp_mem_h memh);
  void InitCaps();
  void AddNotes();
  absl::StatusOr<Worker*> StartWorker(std::shared_ptr<Context> ctx, const char* name,
                                      std::unique_ptr<Worker>* slot,
                                      std::atomic<Worker*>* published)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(worker_mu_);

  Capabilities caps_;
  Settings settings_;
  std::shared_ptr<Context> primary_ctx_;
  bool native_ = false;  // primary context has RMA/atomics and a shared key table

  // Key table: in shared memory (ucp_mem_map ALLOCATE) when native_.
  KeySlot* table_ = nullptr;
  // The private records, one per slot of table_ (InitTable).
  std::unique_ptr<LocalKeyTable> local_;
  ucp_mem_h table_memh_ = nullptr;
  size_t table_map_len_ = 0;  // when mmap'ed instead
  std::string table_rkey_;
  Mutex ctx_mu_;  // ucp_mem_map / unmap / rkey_pack on the primary context

  Mutex worker_mu_;
  std::shared_ptr<Context> fallback_ctx_ ABSL_GUARDED_BY(worker_mu_);
  std::unique_ptr<Worker> primary_worker_ ABSL_GUARDED_BY(worker_mu_);
  std::unique_ptr<Worker> fallback_worker_ ABSL_GUARDED_BY(worker_mu_);
  std::atomic<Worker*> primary_{nullptr};
  std::atomic<Worker*> fallback_{nullptr};
  std::atomic<uint32_t> next_id_{1};

  Mutex cq_mu_;
  std::vector<UcxCq*> cqs_ ABSL_GUARDED_BY(cq_mu_);
};

}  // namespace zsock::ucx

#endif  // ZSOCK_PROVIDERS_UCX_FABRIC_H_
