// unet shared-memory layouts: the communication segment and the key table.
//
// Each endpoint owns one communication segment (a sealed memfd) that its
// peer maps and writes into: two descriptor rings (user and control
// messages; the peer produces, the owner consumes), two free rings of
// buffer indices (the owner returns buffers, the peer takes them) and the
// buffers themselves. Descriptors are 128 bytes; messages up to kInline bytes
// travel inside the descriptor, larger ones in buffers, chunked when they
// exceed one buffer. Layout and field meanings: docs/unet.md.
//
// Rings are single-producer/single-consumer with a sequence number per slot
// (written last with release semantics), so a consumer touches only the slot
// it reads and never a shared index. Everything a peer wrote is validated
// before use: the peer is another process and may be faulty.
#ifndef ZSOCK_PROVIDERS_UNET_SEGMENT_H_
#define ZSOCK_PROVIDERS_UNET_SEGMENT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace zsock::unet {

inline constexpr uint64_t kSegmentMagic = 0x31746e756b63737aull;  // "zsckunt1"
inline constexpr uint32_t kVersion = 2;  // 2: the CQ bell (CqBell)
inline constexpr size_t kInline = 96;
// The largest message: what a first descriptor's `total` may announce.
inline constexpr size_t kMaxMessage = size_t{1} << 30;
inline constexpr uint32_t kControlBuffers = 4;

enum DescType : uint8_t { kUserMsg = 1, kControlMsg = 2 };
enum DescFlags : uint8_t { kFirst = 1, kLast = 2, kInlineData = 4 };

struct alignas(64) Desc {
  std::atomic<uint64_t> seq;
  uint8_t type;
  uint8_t flags;
  uint16_t reserved;
  uint32_t len;    // bytes in this chunk
  uint32_t buf;    // buffer index when !kInlineData
  uint32_t reserved2;
  uint64_t total;  // whole message length (valid with kFirst)
  uint8_t data[kInline];
};
static_assert(sizeof(Desc) == 128);

struct alignas(16) FreeSlot {
  std::atomic<uint64_t> seq;
  uint32_t buf;
  uint32_t reserved;
};
static_assert(sizeof(FreeSlot) == 16);

struct SegmentHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t ring_entries;
  uint32_t buffer_size;
  uint32_t nbuffers;  // user buffers; kControlBuffers more follow them
  uint32_t owner_pid;
  uint32_t reserved;
  // Version 1's per-segment wake flag; version 2 wakes through the CQ bell's
  // `armed` (CqBell) and leaves this zero.
  alignas(64) std::atomic<uint32_t> unused_armed;
  alignas(64) uint8_t pad[64];
};
static_assert(sizeof(SegmentHeader) == 192);

// One per completion queue, in a sealed memfd that every peer of the CQ's
// endpoints maps: the CQ's sleep flag and one "look at me" bit per endpoint
// slot. A peer that publishes into an endpoint's rings, or returns its
// buffers, sets that endpoint's bit, then writes the CQ's eventfd if
// `armed`. A CQ with many endpoints then polls only those whose bits are set
// instead of asking every endpoint's rings (docs/unet.md, "Notification").
//
// Why by hand: this is a cross-process layout in shared memory; no library
// offers a doorbell bitmap that another process writes.
inline constexpr uint64_t kBellMagic = 0x6c6c6562746e7573ull;  // "suntbell"
inline constexpr uint32_t kBellSlots = 4096;
inline constexpr uint32_t kNoBellSlot = 0xffffffffu;  // endpoint has no bit: always polled
inline constexpr size_t kBellBytes = 4096;

struct CqBell {
  uint64_t magic;
  uint32_t version;
  uint32_t slots;
  // Set by the CQ before it sleeps; whoever rings a bit clears it and
  // writes the CQ's eventfd.
  alignas(64) std::atomic<uint32_t> armed;
  alignas(64) std::atomic<uint64_t> ready[kBellSlots / 64];
};
static_assert(sizeof(CqBell) <= kBellBytes);

// Sets `slot`'s bit (a peer may ring any slot: the owner treats a bit as a
// hint and looks at that endpoint's rings). The caller has issued a
// seq_cst fence after publishing, so the owner, which clears a word with a
// seq_cst exchange before it reads the rings, either sees the bit or sees
// what was published. A bit already set is left alone: no store, so an idle
// sweeping CQ's line stays shared.
inline void RingBell(CqBell* bell, uint32_t slot) {
  if (slot >= kBellSlots) return;
  std::atomic<uint64_t>& w = bell->ready[slot / 64];
  const uint64_t bit = uint64_t{1} << (slot % 64);
  if ((w.load(std::memory_order_relaxed) & bit) == 0) w.fetch_or(bit, std::memory_order_seq_cst);
}

// The connection handshake: each side sends one Hello on the Unix socket
// with four fds (SCM_RIGHTS: its segment, its CQ's eventfd, its key table,
// its CQ's bell) and its credentials (SCM_CREDENTIALS).
struct Hello {
  uint64_t magic;
  uint32_t version;
  uint32_t ring_entries;
  uint32_t buffer_size;
  uint32_t nbuffers;
  uint32_t key_slots;
  uint32_t bell_slot;    // the sender endpoint's bit in its CQ bell (kNoBellSlot: none)
  uint64_t segment_size;
  uint64_t probe_addr;   // address of probe_value in the sender's memory
                         // (the peer reads it to test cross-memory attach)
  uint64_t probe_value;
};
static_assert(sizeof(Hello) == 56);

// Byte offsets of each part for given parameters.
struct SegmentLayout {
  uint32_t ring_entries = 0;
  uint32_t buffer_size = 0;
  uint32_t nbuffers = 0;
  size_t user_ring = 0;
  size_t ctl_ring = 0;
  size_t user_free = 0;
  size_t ctl_free = 0;
  size_t buffers = 0;
  size_t total = 0;

  static SegmentLayout For(uint32_t ring_entries, uint32_t buffer_size,
                           uint32_t nbuffers) {
    SegmentLayout l;
    l.ring_entries = ring_entries;
    l.buffer_size = buffer_size;
    l.nbuffers = nbuffers;
    size_t off = 256;
    l.user_ring = off;
    off += sizeof(Desc) * ring_entries;
    l.ctl_ring = off;
    off += sizeof(Desc) * ring_entries;
    l.user_free = off;
    off += sizeof(FreeSlot) * nbuffers;
    l.ctl_free = off;
    off += sizeof(FreeSlot) * kControlBuffers;
    off = (off + 4095) & ~size_t{4095};
    l.buffers = off;
    off += size_t{buffer_size} * (nbuffers + kControlBuffers);
    l.total = off;
    return l;
  }
};

// Whether a hello's segment parameters are ones unet accepts: ring entries
// and user buffers powers of two from 8 to 65536, buffers of 4 KiB to
// 16 MiB, 1 to 2^20 key slots, a bell slot in range (or none), and a
// segment_size equal to what they lay out. A peer's segment is mapped and
// addressed only after this (and SegmentLayout::For cannot overflow then).
inline bool ValidHelloParams(const Hello& h) {
  const uint32_t re = h.ring_entries, nb = h.nbuffers;
  return re >= 8 && re <= 65536 && (re & (re - 1)) == 0 && nb >= 8 && nb <= 65536 &&
         (nb & (nb - 1)) == 0 && h.buffer_size >= 4096 && h.buffer_size <= (16u << 20) &&
         h.key_slots != 0 && h.key_slots <= (1u << 20) &&
         (h.bell_slot < kBellSlots || h.bell_slot == kNoBellSlot) &&
         h.segment_size == SegmentLayout::For(re, h.buffer_size, nb).total;
}

// One registration in a fabric's key table (a memfd every peer maps).
// gen is odd while the registration is live; Revoke makes it even and waits
// until no peer is inside an access (active == 0).
//
// shm_id names the shared segment (Fabric::AllocateRegistered) holding the
// registration, 0 when it is ordinary process memory: peers holding that
// segment perform atomics on it directly.
struct alignas(32) KeySlot {
  std::atomic<uint32_t> gen;
  std::atomic<uint32_t> active;
  uint32_t access;
  uint32_t shm_id;
  uint64_t addr;
  uint64_t len;
};

// Sent over the connection's Unix socket with the segment's memfd
// (SCM_RIGHTS) when a shared registered segment exists or is created.
struct ShmAnnounce {
  uint32_t type;  // kShmAnnounce
  uint32_t id;
  uint64_t base;  // address in the owner's address space
  uint64_t size;
};
inline constexpr uint32_t kShmAnnounce = 1;
inline constexpr size_t kMaxPeerSegments = 4096;
static_assert(sizeof(KeySlot) == 32);

// Producer side of an SPSC ring whose slots carry `seq`.
template <typename Slot>
class RingProducer {
 public:
  RingProducer() = default;
  // `start` is the first position to produce: 0 for a ring that starts
  // empty, `entries` for one initialised full (the free rings).
  RingProducer(Slot* slots, uint32_t entries, uint64_t start = 0)
      : slots_(slots), mask_(entries - 1), pos_(start) {}
  Slot* TryClaim() {
    Slot* s = &slots_[pos_ & mask_];
    return s->seq.load(std::memory_order_acquire) == pos_ ? s : nullptr;
  }
  void Publish(Slot* s) {
    s->seq.store(pos_ + 1, std::memory_order_release);
    ++pos_;
  }

 private:
  Slot* slots_ = nullptr;
  uint64_t mask_ = 0;
  uint64_t pos_ = 0;
};

// Consumer side of an SPSC ring.
template <typename Slot>
class RingConsumer {
 public:
  RingConsumer() = default;
  RingConsumer(Slot* slots, uint32_t entries) : slots_(slots), mask_(entries - 1) {}
  RingConsumer& operator=(const RingConsumer& o) {
    slots_ = o.slots_;
    mask_ = o.mask_;
    pos_.store(o.pos_.load(std::memory_order_relaxed), std::memory_order_relaxed);
    return *this;
  }
  // Only the owner (holding its lock) may Release; Peek may also be called
  // without that lock as a hint (pos_ is atomic for that).
  Slot* Peek() const {
    const uint64_t pos = pos_.load(std::memory_order_relaxed);
    Slot* s = &slots_[pos & mask_];
    return s->seq.load(std::memory_order_acquire) == pos + 1 ? s : nullptr;
  }
  void Release(Slot* s) {
    const uint64_t pos = pos_.load(std::memory_order_relaxed);
    s->seq.store(pos + mask_ + 1, std::memory_order_release);
    pos_.store(pos + 1, std::memory_order_relaxed);
  }

 private:
  Slot* slots_ = nullptr;
  uint64_t mask_ = 0;
  std::atomic<uint64_t> pos_{0};
};

}  // namespace zsock::unet

#endif  // ZSOCK_PROVIDERS_UNET_SEGMENT_H_
