// The fuzz body for unet's checks on what a peer writes into shared memory
// (descriptor_fuzz.h). Built with -DZSOCK_LIBFUZZER it is also the
// libFuzzer target.
#include "providers/unet/descriptor_fuzz.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "providers/unet/descriptor.h"

namespace zsock::unet {
namespace {

constexpr uint32_t kFuzzBufferSize = 4096;
// The posted receive's size, by the input's second byte: around the
// inline limit and the buffer size, where off-by-one errors would live.
constexpr size_t kRecvSizes[] = {0,    1,    8,    95,   96,    97,
                                 4095, 4096, 4097, 8192, 12288, 65536};

[[noreturn]] void Finding(const char* what) {
  std::fprintf(stderr, "unet descriptor fuzz: %s\n", what);
  std::abort();
}

void Expect(bool ok, const char* what) {
  if (!ok) Finding(what);
}

// Zeroed bytes aligned like a segment (whose parts are 64-byte aligned),
// allocated at exactly their size so that ASan sees a byte beyond them.
class Bytes {
 public:
  explicit Bytes(size_t n)
      : p_(static_cast<uint8_t*>(::operator new(std::max<size_t>(n, 1), std::align_val_t{64}))) {
    std::memset(p_, 0, n);
  }
  ~Bytes() { ::operator delete(p_, std::align_val_t{64}); }
  Bytes(const Bytes&) = delete;
  Bytes& operator=(const Bytes&) = delete;
  uint8_t* get() const { return p_; }

 private:
  uint8_t* p_;
};

// The receiving side: our segment, the peer's, one posted receive at a
// time, and the two messages being assembled.
class Receiver {
 public:
  Receiver(const SegmentLayout& l, size_t recv_size)
      : l_(l), rx_(l.total), recv_size_(recv_size) {}

  bool abandoned() const { return abandoned_; }

  // The peer publishes `bytes` (128) as the next descriptor of a ring; we
  // read it, and (`rewrite`) the peer then rewrites every byte of it.
  void Descriptor(bool ctl, const uint8_t* bytes, bool rewrite) {
    uint32_t& pos = ctl ? ctl_pos_ : user_pos_;
    uint8_t* slot = rx_.get() + (ctl ? l_.ctl_ring : l_.user_ring) +
                    sizeof(Desc) * (pos++ & (l_.ring_entries - 1));
    std::memcpy(slot, bytes, sizeof(Desc));
    const auto* d = reinterpret_cast<const Desc*>(slot);
    Chunk c{};
    const bool valid = ReadChunk(d, ctl, l_, rx_.get(), &c);
    if (rewrite) {
      for (size_t i = 0; i < sizeof(Desc); ++i) slot[i] = static_cast<uint8_t>(~slot[i]);
    }
    Incoming& in = ctl ? ctl_in_ : user_in_;
    if (!valid || !in.InOrder(c)) {
      abandoned_ = true;
      return;
    }
    CheckChunk(c, d, ctl);
    Assemble(c, ctl, &in);
  }

  // The peer hands back buffer `idx` on a free ring; we fill it with a
  // message's bytes if it passes the check (rings.cc: PushQueueLocked).
  void FreeIndex(bool ctl, uint32_t idx) {
    if (!InPool(idx, ctl, l_.nbuffers)) {
      abandoned_ = true;
      return;
    }
    if (tx_ == nullptr) tx_ = std::make_unique<Bytes>(l_.total);
    std::memset(tx_->get() + BufferOffset(l_, idx), 0xa5, l_.buffer_size);
  }

 private:
  // What an accepted chunk must satisfy, whatever the peer wrote.
  void CheckChunk(const Chunk& c, const Desc* d, bool ctl) const {
    Expect(c.type == (ctl ? kControlMsg : kUserMsg), "a chunk of the other ring's type");
    Expect(!(c.flags & kFirst) || c.total <= kMaxMessage, "a total over kMaxMessage");
    if (c.flags & kInlineData) {
      Expect(c.data == d->data && c.len <= kInline, "inline data outside the descriptor");
      Expect((c.flags & kFirst) && (c.flags & kLast), "inline data that is not a whole message");
      return;
    }
    Expect(InPool(c.buf, ctl, l_.nbuffers), "a buffer outside the ring's pool");
    const size_t off = static_cast<size_t>(c.data - rx_.get());
    Expect(off == BufferOffset(l_, c.buf) && c.len <= l_.buffer_size &&
               off + c.len <= l_.total,
           "a chunk's bytes outside its buffer");
  }

  // The message's sequence, as DrainUserLocked and DrainControlLocked run
  // it; the bytes are really copied, into a receive of exactly its size.
  void Assemble(const Chunk& c, bool ctl, Incoming* in) {
    if (c.flags & kFirst) {
      in->Start(c.total);
      if (ctl) {
        in->control.reserve(std::min<uint64_t>(c.total, 64 * 1024));
      } else {
        in->truncated = c.total > recv_size_;
        recv_ = std::make_unique<uint8_t[]>(recv_size_);
      }
    }
    if (!in->Fits(c.len)) {
      abandoned_ = true;
      return;
    }
    if (ctl) {
      in->control.insert(in->control.end(), c.data, c.data + c.len);
    } else if (!in->truncated && c.len > 0) {
      std::memcpy(recv_.get() + in->got, c.data, c.len);
    }
    in->got += c.len;
    Expect(in->got <= in->total, "more bytes than announced");
    Expect(ctl || in->truncated || in->got <= recv_size_, "more bytes than the receive holds");
    Expect(!ctl || in->control.size() == in->got, "control bytes miscounted");
    if (!(c.flags & kLast)) return;
    if (!in->Complete()) {
      abandoned_ = true;
      return;
    }
    Expect(in->got == in->total && in->total <= kMaxMessage, "a message of the wrong length");
    *in = Incoming{};
  }

  const SegmentLayout l_;
  Bytes rx_;  // our segment: the peer writes its rings and buffers
  std::unique_ptr<Bytes> tx_;  // the peer's segment: we write its buffers
  const size_t recv_size_;
  std::unique_ptr<uint8_t[]> recv_;
  Incoming user_in_, ctl_in_;
  uint32_t user_pos_ = 0, ctl_pos_ = 0;
  bool abandoned_ = false;
};

// A hello ValidHelloParams accepts must describe a layout that adds up:
// parts in order, none overlapping, the last buffer ending at segment_size.
void CheckHello(const uint8_t* bytes) {
  Hello h;
  std::memcpy(&h, bytes, sizeof(h));
  if (!ValidHelloParams(h)) return;
  const SegmentLayout l = SegmentLayout::For(h.ring_entries, h.buffer_size, h.nbuffers);
  Expect(l.total == h.segment_size, "an accepted hello's segment_size differs from its layout");
  Expect(l.user_ring >= sizeof(SegmentHeader) &&
             l.ctl_ring == l.user_ring + sizeof(Desc) * l.ring_entries &&
             l.user_free == l.ctl_ring + sizeof(Desc) * l.ring_entries &&
             l.ctl_free == l.user_free + sizeof(FreeSlot) * l.nbuffers &&
             l.buffers >= l.ctl_free + sizeof(FreeSlot) * kControlBuffers &&
             l.buffers % 4096 == 0,
         "an accepted hello's layout overlaps");
  Expect(BufferOffset(l, l.nbuffers + kControlBuffers - 1) + l.buffer_size == l.total,
         "an accepted hello's buffers do not end at segment_size");
  Expect(h.key_slots <= (1u << 20) && (h.bell_slot < kBellSlots || h.bell_slot == kNoBellSlot),
         "an accepted hello's key table or bell slot is out of range");
}

// Copies up to `n` bytes of the input at *pos into out (zero-padding past
// its end) and advances *pos.
void Take(const uint8_t* data, size_t size, size_t* pos, uint8_t* out, size_t n) {
  const size_t have = std::min(n, size - *pos);
  std::memset(out, 0, n);
  if (have > 0) std::memcpy(out, data + *pos, have);
  *pos += have;
}

}  // namespace

bool FuzzOne(const uint8_t* data, size_t size) {
  if (size < 2) return true;
  const SegmentLayout l = SegmentLayout::For((data[0] & 1) ? 16 : 8, kFuzzBufferSize,
                                             (data[0] & 2) ? 16 : 8);
  Receiver rx(l, kRecvSizes[data[1] % std::size(kRecvSizes)]);
  size_t pos = 2;
  while (pos < size && !rx.abandoned()) {
    const uint8_t tag = data[pos++];
    switch (tag & 3) {
      case kFuzzUserDesc:
      case kFuzzControlDesc: {
        alignas(Desc) uint8_t desc[sizeof(Desc)];
        Take(data, size, &pos, desc, sizeof(desc));
        rx.Descriptor((tag & 3) == kFuzzControlDesc, desc, (tag & kFuzzRewrite) != 0);
        break;
      }
      case kFuzzFreeIndex: {
        uint8_t raw[4];
        Take(data, size, &pos, raw, sizeof(raw));
        uint32_t idx;
        std::memcpy(&idx, raw, sizeof(idx));
        rx.FreeIndex((tag & kFuzzControlPool) != 0, idx);
        break;
      }
      case kFuzzHello: {
        uint8_t raw[sizeof(Hello)];
        Take(data, size, &pos, raw, sizeof(raw));
        CheckHello(raw);
        break;
      }
    }
  }
  return !rx.abandoned();
}

std::string MakeFuzzInput(uint8_t layout, uint8_t recv_size) {
  return std::string{static_cast<char>(layout), static_cast<char>(recv_size)};
}

void AppendDesc(std::string* input, uint8_t tag, uint8_t type, uint8_t flags, uint32_t len,
                uint32_t buf, uint64_t total, const std::string& inline_data) {
  uint8_t raw[sizeof(Desc)] = {};
  raw[offsetof(Desc, type)] = type;
  raw[offsetof(Desc, flags)] = flags;
  std::memcpy(raw + offsetof(Desc, len), &len, sizeof(len));
  std::memcpy(raw + offsetof(Desc, buf), &buf, sizeof(buf));
  std::memcpy(raw + offsetof(Desc, total), &total, sizeof(total));
  std::memcpy(raw + offsetof(Desc, data), inline_data.data(),
              std::min(inline_data.size(), kInline));
  input->push_back(static_cast<char>(tag));
  input->append(reinterpret_cast<const char*>(raw), sizeof(raw));
}

void AppendFreeIndex(std::string* input, bool ctl, uint32_t idx) {
  input->push_back(static_cast<char>(kFuzzFreeIndex | (ctl ? kFuzzControlPool : 0)));
  input->append(reinterpret_cast<const char*>(&idx), sizeof(idx));
}

void AppendHello(std::string* input, const Hello& hello) {
  input->push_back(static_cast<char>(kFuzzHello));
  input->append(reinterpret_cast<const char*>(&hello), sizeof(hello));
}

std::vector<std::string> SampleFuzzInputs() {
  std::vector<std::string> out;
  // An inline message into an 8-byte receive.
  std::string s = MakeFuzzInput(0, 2);
  AppendDesc(&s, kFuzzUserDesc, kUserMsg, kFirst | kLast | kInlineData, 8, 0, 8, "12345678");
  out.push_back(s);
  // A 5000-byte message in two buffers into an 8192-byte receive, the
  // second descriptor rewritten after the read.
  s = MakeFuzzInput(3, 9);
  AppendDesc(&s, kFuzzUserDesc, kUserMsg, kFirst, 4096, 0, 5000);
  AppendDesc(&s, kFuzzUserDesc | kFuzzRewrite, kUserMsg, kLast, 904, 1, 0);
  out.push_back(s);
  // A control message in a control buffer, then one inline.
  s = MakeFuzzInput(1, 0);
  AppendDesc(&s, kFuzzControlDesc, kControlMsg, kFirst | kLast, 200, 8, 200);
  AppendDesc(&s, kFuzzControlDesc, kControlMsg, kFirst | kLast | kInlineData, 3, 0, 3, "abc");
  out.push_back(s);
  // A message larger than the receive (discarded), then buffers handed back.
  s = MakeFuzzInput(0, 1);
  AppendDesc(&s, kFuzzUserDesc, kUserMsg, kFirst | kLast | kInlineData, 8, 0, 8, "12345678");
  AppendFreeIndex(&s, false, 3);
  AppendFreeIndex(&s, true, 9);
  out.push_back(s);
  // A hello with the default parameters (docs/configuration.md).
  s = MakeFuzzInput(0, 0);
  Hello h{kSegmentMagic, kVersion, 256, 32 * 1024, 64, 4096, 0, 0, 0, 0};
  h.segment_size = SegmentLayout::For(h.ring_entries, h.buffer_size, h.nbuffers).total;
  AppendHello(&s, h);
  out.push_back(s);
  return out;
}

}  // namespace zsock::unet

#ifdef ZSOCK_LIBFUZZER
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zsock::unet::FuzzOne(data, size);
  return 0;
}
#endif
