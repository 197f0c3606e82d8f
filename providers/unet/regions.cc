// unet's memory registrations (regions.h) and the fabric's side of them:
// key-table slots, shared segments and their announcements.
#include "providers/unet/regions.h"

#include <sched.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/log.h"
#include "core/status.h"
#include "providers/unet/endpoint.h"
#include "providers/unet/fabric.h"

namespace zsock::unet {

UnetRegion::~UnetRegion() {
  Revoke();
  fabric_->local_keys().Remove(key_);
}

RemoteKey UnetRegion::remote_key() const {
  RemoteKey key;
  key.addr = reinterpret_cast<uint64_t>(addr());
  key.length = length();
  key.access = access();
  key.blob.resize(LocalKeyTable::kEncodedSize);
  LocalKeyTable::Encode(key_, key.blob.data());
  return key;
}

void UnetRegion::Revoke() noexcept {
  // Only the first revocation acts (the private generation decides).
  LocalKeyTable& local = fabric_->local_keys();
  if (!local.BeginRevoke(key_)) return;
  entry_->gen.store(key_.gen + 1, std::memory_order_seq_cst);  // peers stop here
  local.AwaitAccesses(key_);
  // Peers inside a direct access: wait at most one second, since a peer
  // killed mid-access (or a hostile one) would otherwise hold us forever.
  const int64_t deadline = absl::GetCurrentTimeNanos() + 1000000000;
  while (entry_->active.load(std::memory_order_seq_cst) != 0 &&
         absl::GetCurrentTimeNanos() < deadline) {
    sched_yield();
  }
}

UnetSharedRegion::~UnetSharedRegion() {
  reg_.reset();  // revokes: peers' key checks fail from here on
  fabric_->ForgetShared(id_);
}

void AnnounceShared(int sock, uint32_t id, int fd, uint64_t base, uint64_t size) {
  ShmAnnounce a{kShmAnnounce, id, base, size};
  if (SendWithFds(sock, &a, sizeof(a), {&fd, 1}, /*credentials=*/false, MSG_DONTWAIT) !=
      sizeof(a)) {
    ZS_LOG(kInfo, "could not announce shared segment %u to a peer (%s); its atomics on it "
           "will be emulated", id, std::strerror(errno));
  }
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> UnetFabric::RegisterMemory(void* addr, size_t len,
                                                                         uint32_t access) {
  auto r = RegisterSlot(addr, len, access, 0);
  if (!r.ok()) return r.status();
  return std::unique_ptr<MemoryRegion>(std::move(*r));
}

absl::StatusOr<std::unique_ptr<UnetRegion>> UnetFabric::RegisterSlot(void* addr, size_t len,
                                                                    uint32_t access,
                                                                    uint32_t shm_id) {
  if (addr == nullptr || len == 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     "cannot register an empty or null range", "register at least one byte");
  }
  // Generations come from the private record: peers can write the shared one.
  const uint64_t base = reinterpret_cast<uint64_t>(addr);
  std::optional<LocalKeyTable::Key> key = local_.Add(base, len, access);
  if (!key.has_value()) {
    return MakeError(absl::StatusCode::kResourceExhausted, ENOSPC,
                     absl::StrCat("all ", local_.capacity(), " unet registrations are in use"),
                     "release registrations, or raise unet_max_registrations "
                     "(the registration cache evicts unused ones)");
  }
  KeySlot* e = &key_table()[key->slot];
  e->addr = base;
  e->len = len;
  e->access = access;
  e->shm_id = shm_id;
  e->gen.store(key->gen, std::memory_order_release);
  return std::make_unique<UnetRegion>(this, addr, len, access, *key, e);
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> UnetFabric::AllocateShared(size_t len,
                                                                         uint32_t access,
                                                                         Endpoint* only) {
  if (len == 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     "cannot allocate an empty registered region", "ask for at least one byte");
  }
  size_t size = (len + 4095) & ~size_t{4095};
  auto fd = CreateMemfd("zsock-unet-shared", size);
  if (!fd.ok()) return fd.status();
  auto map = MapFd(fd->get(), size, "a unet shared segment");
  if (!map.ok()) return map.status();
  MutexLock lock(&ep_mu_);
  uint32_t id = next_shm_id_++;
  auto reg = RegisterSlot(map->get(), len, access, id);
  if (!reg.ok()) return reg.status();
  uint64_t base = reinterpret_cast<uint64_t>(map->get());
  if (only == nullptr) shared_.push_back({id, fd->get(), base, size});
  for (const auto& [ep, sock] : endpoints_) {
    if (only == nullptr || static_cast<Endpoint*>(ep) == only) {
      AnnounceShared(sock, id, fd->get(), base, size);
    }
  }
  return std::unique_ptr<MemoryRegion>(
      new UnetSharedRegion(this, id, std::move(*fd), std::move(*map), std::move(*reg)));
}

void UnetFabric::AttachEndpoint(UnetEndpoint* ep, int sock) {
  MutexLock lock(&ep_mu_);
  endpoints_.emplace_back(ep, sock);
  for (const auto& seg : shared_) AnnounceShared(sock, seg.id, seg.fd, seg.base, seg.size);
}

void UnetFabric::DetachEndpoint(UnetEndpoint* ep) {
  MutexLock lock(&ep_mu_);
  std::erase_if(endpoints_, [ep](const auto& e) { return e.first == ep; });
}

void UnetFabric::ForgetShared(uint32_t id) {
  MutexLock lock(&ep_mu_);
  std::erase_if(shared_, [id](const SharedSeg& s) { return s.id == id; });
}

}  // namespace zsock::unet
