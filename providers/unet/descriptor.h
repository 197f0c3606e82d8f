// unet's checks on what a peer wrote into our segment before any of it is
// used: each descriptor in our two rings (type, flags, lengths, buffer
// index), each buffer index the peer hands back on a free ring, and the
// sequence of chunks that makes one message (opened by exactly one first
// chunk, never longer than it announced, exactly that long at its last).
//
// Pure functions of the descriptor's bytes and our own layout, so that they
// can be fuzzed alone (descriptor_fuzz.cc). Inline: every received message
// passes here.
#ifndef ZSOCK_PROVIDERS_UNET_DESCRIPTOR_H_
#define ZSOCK_PROVIDERS_UNET_DESCRIPTOR_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "providers/unet/segment.h"

namespace zsock::unet {

// A descriptor's fields, read once. The peer may rewrite its descriptors
// at any moment, so fields are copied out of shared memory a single time
// and only the copy is validated and used (no double fetch).
struct Chunk {
  uint8_t type;
  uint8_t flags;
  uint32_t len;
  uint32_t buf;
  uint64_t total;
  const uint8_t* data;  // validated: len bytes inside our segment
};

// Whether buffer index `idx` belongs to a ring's pool: user messages use
// buffers [0, nbuffers), control messages the kControlBuffers after them.
inline bool InPool(uint32_t idx, bool ctl, uint32_t nbuffers) {
  const uint32_t lo = ctl ? nbuffers : 0;
  const uint32_t hi = ctl ? nbuffers + kControlBuffers : nbuffers;
  return idx >= lo && idx < hi;
}

// Copies a descriptor's fields out of shared memory, each once (`data` is
// left for ReadChunk).
inline void SnapshotChunk(const Desc* d, Chunk* c) {
  constexpr size_t kFieldsStart = offsetof(Desc, type);
  constexpr size_t kFieldsEnd = offsetof(Desc, data);
  alignas(Desc) uint8_t raw[sizeof(Desc)];
  std::memcpy(raw + kFieldsStart, reinterpret_cast<const uint8_t*>(d) + kFieldsStart,
              kFieldsEnd - kFieldsStart);
  const auto* copy = reinterpret_cast<const Desc*>(raw);
  c->type = copy->type;
  c->flags = copy->flags;
  c->len = copy->len;
  c->buf = copy->buf;
  c->total = copy->total;
}

// Whether snapshot `c`, from the user ring (or the control ring: `ctl`) of
// a segment laid out as `l`, is well formed: the ring's type; a total of
// at most kMaxMessage on a first chunk; inline data only as a whole message
// of at most kInline bytes, or else a buffer of the ring's pool and at
// most one buffer's bytes.
inline bool ValidChunk(const Chunk& c, bool ctl, const SegmentLayout& l) {
  if (c.type != (ctl ? kControlMsg : kUserMsg)) return false;
  if ((c.flags & kFirst) && c.total > kMaxMessage) return false;
  if (c.flags & kInlineData) {
    return c.len <= kInline && (c.flags & kFirst) && (c.flags & kLast);
  }
  return InPool(c.buf, ctl, l.nbuffers) && c.len <= l.buffer_size;
}

// The byte offset of buffer `buf` in a segment laid out as `l`.
inline size_t BufferOffset(const SegmentLayout& l, uint32_t buf) {
  return l.buffers + size_t{buf} * l.buffer_size;
}

// Snapshots and validates the descriptor at `d`, read from the user ring
// (or the control ring: `ctl`) of `segment`, which is laid out as `l`.
// On success c->data points at the chunk's len bytes: inside the
// descriptor, or inside one buffer of the ring's pool. False when the
// descriptor is malformed.
inline bool ReadChunk(const Desc* d, bool ctl, const SegmentLayout& l, const uint8_t* segment,
                      Chunk* c) {
  SnapshotChunk(d, c);
  if (!ValidChunk(*c, ctl, l)) return false;
  c->data = (c->flags & kInlineData) ? d->data : segment + BufferOffset(l, c->buf);
  return true;
}

// Assembly state of a message arriving in chunks, and the checks on their
// sequence. The announced total is the peer's word: it is checked against
// every chunk, never trusted ahead of the bytes.
struct Incoming {
  bool active = false;
  size_t total = 0;
  size_t got = 0;
  bool truncated = false;        // user messages: larger than the receive
  std::vector<uint8_t> control;  // control messages: the bytes so far

  // Whether `c` may come next: a first chunk exactly when no message is open.
  bool InOrder(const Chunk& c) const { return bool(c.flags & kFirst) != active; }
  // Opens a message announced as `announced` bytes (after InOrder, at a
  // first chunk).
  void Start(uint64_t announced) {
    *this = Incoming{};
    active = true;
    total = announced;
  }
  // Whether `len` more bytes stay within the announced total.
  bool Fits(uint32_t len) const { return got + len <= total; }
  // Whether the message has exactly its announced length (at its last chunk).
  bool Complete() const { return got == total; }
};

}  // namespace zsock::unet

#endif  // ZSOCK_PROVIDERS_UNET_DESCRIPTOR_H_
