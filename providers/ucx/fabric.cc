// The ucx fabric: opening it (context, key table, capabilities and their
// notes), its workers, its CQs, and the provider's registration.
#include "providers/ucx/fabric.h"

#include <sys/mman.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/emulation.h"
#include "providers/ucx/endpoint.h"
#include "providers/ucx/inject.h"

namespace zsock::ucx {

absl::StatusOr<std::unique_ptr<Fabric>> UcxFabric::Open(const FabricSpec& spec) {
  if (auto st = ForkGuard::Get().Check(); !st.ok()) return st;
  auto settings = LoadSettings(spec);
  if (!settings.ok()) return settings.status();
  // Native RMA only where every peer of the context shares memory with us:
  // enabling UCP RMA/atomics also enables UCX's unchecked software
  // emulation of them for whoever is connected.
  const bool rma = settings->native_rma && settings->same_host_only && settings->has_mm;
  auto ctx = Context::Create(settings->tls, *settings, settings->has_mm, rma);
  if (!ctx.ok()) return ctx.status();
  auto fabric = std::unique_ptr<UcxFabric>(
      new UcxFabric(spec, *std::move(settings), std::shared_ptr<Context>(std::move(*ctx))));
  if (auto st = fabric->InitTable(); !st.ok()) return st;
  fabric->InitCaps();
  return std::unique_ptr<Fabric>(std::move(fabric));
}

void UcxFabric::InitCaps() {
  const Settings& s = settings_;
  caps_.send_recv = Support::kNative;
  caps_.rdma_read = Support::kEmulated;
  caps_.rdma_write = Support::kEmulated;
  caps_.atomics = Support::kEmulated;
  caps_.atomics_allocated = native_ ? Support::kNative : Support::kEmulated;
  caps_.max_msg_size = kMaxMessage;
  // Emulated: a read's answer carries data and headers in one control
  // message (kEmulationHeadroom).
  caps_.max_rma_size = kMaxMessage - kEmulationHeadroom;
  caps_.inline_size = 0;
  caps_.inject_size = kInjectSize;
  caps_.registration_required = false;
  caps_.peer_on_host = s.same_host_only;
  caps_.wait_fd = true;
  caps_.thread_safe = !s.serialized;
  AddNotes();
}

// Capabilities::notes: what UCX opened and what zsock does with it.
void UcxFabric::AddNotes() {
  const Settings& s = settings_;
  if (s.serialized) {
    caps_.notes.push_back(
        "threads=serialized: one thread at a time calls into this fabric; no worker lock");
  }
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  caps_.notes.push_back(absl::StrCat(
      "UCX ", major, ".", minor, ".", release, ", UCX_TLS=", s.tls, "; UCX opened: ",
      primary_ctx_->resources().empty() ? std::string("nothing")
                                        : absl::StrJoin(primary_ctx_->resources(), ", ")));
  std::vector<std::string> missing;
  for (const std::string& t : s.requested) {
    bool alias = t == "all" || t == "sm" || t == "shm" || t == "mm";
    const auto& opened = primary_ctx_->transports();
    if (!alias && std::find(opened.begin(), opened.end(), t) == opened.end()) missing.push_back(t);
  }
  if (!missing.empty()) {
    caps_.notes.push_back(absl::StrCat(
        "requested but not available here: ", absl::StrJoin(missing, ","),
        " (ucx_info -d shows what this host offers; cma needs ptrace permission)"));
  }
  if (s.has_cma) {
    caps_.notes.push_back(
        "cma: UCX 1.13 selects no cma lane for endpoints with peer-failure handling, which "
        "zsock needs to fail a dead peer's operations; rendezvous goes through shared memory "
        "(each endpoint's notes list its lanes)");
  }
  if (s.same_host_only) {
    caps_.notes.push_back(
        s.fallback_tcp
            ? "peers that cannot share memory with this process (another user, ptrace policy, "
              "another host or pid namespace) are connected over tcp instead; their endpoint "
              "notes say so and why (fallback=none makes that an error)"
            : "fallback=none: connections to peers that cannot share memory fail");
  }
  caps_.notes.push_back(
      "rdma read/write and atomics on ordinary memory: core emulation, performed by the "
      "target's progress engine after checking its own registration table; UCX 1.13 has no "
      "transport RMA for such memory here and its software RMA writes wherever the peer says "
      "without any key check, so zsock does not use it");
  if (native_) {
    caps_.notes.push_back(
        "memory from AllocateRegistered lives in UCX posix shared memory: rdma read/write "
        "and atomics on it are native UCP operations (no target progress needed), checked "
        "first against the target's key table, which peers map through ucp_rkey_ptr");
  } else if (s.same_host_only && s.has_mm && !s.native_rma) {
    caps_.notes.push_back("native_rma=off: every one-sided operation is emulated");
  }
  caps_.notes.push_back(
      "UCP's registration cache is off (RCACHE_ENABLE=n): it installs UCM memory hooks and "
      "starts UCX's async thread at ucp_init; zsock's rcache and memhooks invalidate "
      "registrations instead");
  if (!s.ucx_options_text.empty()) {
    caps_.notes.push_back(absl::StrCat("UCX options: ", absl::StrJoin(s.ucx_options_text, " ")));
  }
}

UcxFabric::~UcxFabric() {
  ReleaseCache();
  {
    MutexLock lock(&worker_mu_);
    primary_.store(nullptr);
    fallback_.store(nullptr);
    primary_worker_.reset();
    fallback_worker_.reset();
    fallback_ctx_.reset();
  }
  if (table_memh_ != nullptr) {
    MutexLock lock(&ctx_mu_);
    ucp_mem_unmap(primary_ctx_->handle(), table_memh_);
  } else if (table_map_len_ > 0) {
    ::munmap(table_, table_map_len_);
  }
}

absl::StatusOr<std::unique_ptr<CompletionQueue>> UcxFabric::CreateCq() {
  auto cq = UcxCq::Create(this);
  if (!cq.ok()) return cq.status();
  return std::unique_ptr<CompletionQueue>(std::move(*cq));
}

absl::StatusOr<Worker*> UcxFabric::StartWorker(std::shared_ptr<Context> ctx, const char* name,
                                               std::unique_ptr<Worker>* slot,
                                               std::atomic<Worker*>* published) {
  auto w = Worker::Create(std::move(ctx), name, settings_.serialized);
  if (!w.ok()) return w.status();
  *slot = std::move(*w);
  published->store(slot->get(), std::memory_order_release);
  MutexLock lock(&cq_mu_);
  for (UcxCq* cq : cqs_) cq->WatchWorker((*slot)->efd());
  return slot->get();
}

absl::StatusOr<Worker*> UcxFabric::PrimaryWorker() {
  MutexLock lock(&worker_mu_);
  if (primary_worker_ != nullptr) return primary_worker_.get();
  return StartWorker(primary_ctx_, "primary", &primary_worker_, &primary_);
}

absl::StatusOr<Worker*> UcxFabric::FallbackWorker() {
  MutexLock lock(&worker_mu_);
  if (settings_.tls == "tcp") {  // the primary already is tcp
    if (primary_worker_ != nullptr) return primary_worker_.get();
    return StartWorker(primary_ctx_, "primary", &primary_worker_, &primary_);
  }
  if (fallback_worker_ != nullptr) return fallback_worker_.get();
  if (fallback_ctx_ == nullptr) {
    Settings tcp;
    auto ctx = Context::Create("tcp", tcp, /*mm=*/false, /*rma=*/false);
    if (!ctx.ok()) return ctx.status();
    fallback_ctx_ = std::shared_ptr<Context>(std::move(*ctx));
  }
  return StartWorker(fallback_ctx_, "tcp fallback", &fallback_worker_, &fallback_);
}

namespace {

const bool kRegistered = RegisterProvider(ProviderInfo{
    "ucx",
    "UCX 1.13 (UCP tag matching; tcp, posix shared memory, cma)",
    {"ucx:tcp", "ucx:posix,cma"},
    [](const FabricSpec& spec) { return UcxFabric::Open(spec); },
});

}  // namespace
}  // namespace zsock::ucx
