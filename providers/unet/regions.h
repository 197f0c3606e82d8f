// unet's memory registrations. A registration takes one slot of the
// fabric's key table (KeySlot, segment.h: shared with peers, who check it
// before a direct access) and the same slot of its private record
// (core/local_keys.h); its remote key's blob names the slot and the
// registration's generation. Revoking makes both generations even and
// waits until no access is inside.
//
// AllocateRegistered memory is a shared segment (a memfd) announced to
// every peer on the connection socket: peers then reach it through their
// own mapping (direct_access.cc) instead of the kernel or our progress.
#ifndef ZSOCK_PROVIDERS_UNET_REGIONS_H_
#define ZSOCK_PROVIDERS_UNET_REGIONS_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "core/fd.h"
#include "core/provider.h"
#include "core/local_keys.h"
#include "providers/unet/os.h"
#include "providers/unet/segment.h"

namespace zsock::unet {

class UnetFabric;

// The slot and generation a remote key's blob names; false when the blob
// is not a unet key.
inline bool DecodeKey(const RemoteKey& key, LocalKeyTable::Key* out) {
  if (key.blob.size() != LocalKeyTable::kEncodedSize) return false;
  *out = LocalKeyTable::Decode(key.blob.data());
  return true;
}

class UnetRegion final : public MemoryRegion {
 public:
  UnetRegion(UnetFabric* fabric, void* addr, size_t len, uint32_t access, LocalKeyTable::Key key,
             KeySlot* entry)
      : MemoryRegion(addr, len, access), fabric_(fabric), key_(key), entry_(entry) {}
  ~UnetRegion() override;

  RemoteKey remote_key() const override;
  void Revoke() noexcept override;

 private:
  UnetFabric* fabric_;
  LocalKeyTable::Key key_;
  KeySlot* entry_;  // the shared key table's slot (peers check it)
};

// Registered memory in a shared segment (memfd) that every peer maps.
class UnetSharedRegion final : public MemoryRegion {
 public:
  UnetSharedRegion(UnetFabric* fabric, uint32_t id, Fd fd, Mapping map,
                   std::unique_ptr<UnetRegion> reg)
      : MemoryRegion(reg->addr(), reg->length(), reg->access()),
        fabric_(fabric), id_(id), fd_(std::move(fd)), map_(std::move(map)), reg_(std::move(reg)) {}
  ~UnetSharedRegion() override;
  RemoteKey remote_key() const override { return reg_->remote_key(); }
  void Revoke() noexcept override { reg_->Revoke(); }

 private:
  UnetFabric* fabric_;
  uint32_t id_;
  Fd fd_;
  Mapping map_;
  std::unique_ptr<UnetRegion> reg_;
};

// Sends one shared segment to a peer. Best effort: a peer that does not get
// it (full socket buffer) performs atomics on it through emulation instead.
void AnnounceShared(int sock, uint32_t id, int fd, uint64_t base, uint64_t size);

}  // namespace zsock::unet

#endif  // ZSOCK_PROVIDERS_UNET_REGIONS_H_
