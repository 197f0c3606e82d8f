#include "core/sdp/wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace zsock::sdp::wire {
namespace {

// Body layouts (offsets after the base header); see docs/protocol.md.
constexpr size_t kHelloFixed = 16;
constexpr size_t kAdvertFixed = 28;
constexpr size_t kCompletedSize = 8;
constexpr size_t kAdvertRefSize = 4;
constexpr size_t kModeChangeSize = 4;
constexpr size_t kAbortSize = 4;

constexpr uint8_t kKnownCaps = kCapRdmaRead | kCapRdmaWrite | kCapAz;

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // little-endian hosts only (x86-64, arm64)
  return v;
}
template <typename T>
void Store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

absl::Status Bad(MessageId mid, absl::string_view field, absl::string_view why) {
  return MakeError(absl::StatusCode::kInvalidArgument, EPROTO,
                   absl::StrCat("malformed SDP ", MessageName(mid), ": field ", field, " ", why),
                   "the peer violates docs/protocol.md (version 1); the connection is aborted");
}

uint8_t AllowedFlags(MessageId mid) {
  switch (mid) {
    case MessageId::kRdmaRdCompl: return kFlagCancelReply | kFlagSendSmall;
    case MessageId::kSrcAvail: return kFlagPull | kFlagAzUpdate | kFlagAzAsync;
    case MessageId::kData: return kFlagAckReq;
    default: return 0;
  }
}

bool KnownId(uint8_t id) {
  switch (static_cast<MessageId>(id)) {
    case MessageId::kHello:
    case MessageId::kHelloAck:
    case MessageId::kDisconnReq:
    case MessageId::kAbortConn:
    case MessageId::kSendSm:
    case MessageId::kRdmaWrCompl:
    case MessageId::kRdmaRdCompl:
    case MessageId::kModeChange:
    case MessageId::kSrcAvailCancel:
    case MessageId::kSinkAvailCancel:
    case MessageId::kSinkCancelAck:
    case MessageId::kSinkAvail:
    case MessageId::kSrcAvail:
    case MessageId::kData:
      return true;
  }
  return false;
}

absl::Status CheckBodySize(MessageId mid, size_t have, size_t want) {
  if (have != want) {
    return Bad(mid, "len", absl::StrCat("gives a ", have, "-byte body; this message has ", want));
  }
  return absl::OkStatus();
}

absl::StatusOr<Hello> DecodeHello(MessageId mid, const uint8_t* p, size_t n) {
  if (n < kHelloFixed) {
    return Bad(mid, "len", absl::StrCat("gives a ", n, "-byte body; at least ", kHelloFixed,
                                        " needed"));
  }
  Hello h;
  h.major = p[0];
  h.minor = p[1];
  h.caps = p[2];
  h.max_adverts = p[3];
  h.buf_size = Load<uint32_t>(p + 4);
  h.max_bufs = Load<uint16_t>(p + 8);
  uint8_t mode = p[10];
  uint8_t reserved8 = p[11];
  uint16_t ext_len = Load<uint16_t>(p + 12);
  uint16_t reserved16 = Load<uint16_t>(p + 14);
  if (h.major != kVersionMajor) {
    return Bad(mid, "version",
               absl::StrCat(static_cast<int>(h.major), ".", static_cast<int>(h.minor),
                            " is not supported (this side speaks ", kVersionMajor, ".x)"));
  }
  // A later minor version may announce capabilities this side does not
  // know: they are kept (the message re-encodes as it came) and ignored,
  // since either side uses a capability only if both announced it. From
  // our own or an older minor version they are a violation.
  if ((h.caps & ~kKnownCaps) && h.minor <= kVersionMinor) {
    return Bad(mid, "caps", absl::StrCat("has unknown bits 0x", absl::Hex(h.caps & ~kKnownCaps)));
  }
  if (h.max_adverts == 0) return Bad(mid, "max_adverts", "is 0 (at least 1)");
  if (h.buf_size < kMinBufSize || h.buf_size > kMaxBufSize) {
    return Bad(mid, "buf_size",
               absl::StrCat(h.buf_size, " is outside [", kMinBufSize, ", ", kMaxBufSize, "]"));
  }
  if (h.max_bufs < kMinBufs || h.max_bufs > kMaxBufs) {
    return Bad(mid, "max_bufs",
               absl::StrCat(h.max_bufs, " is outside [", kMinBufs, ", ", kMaxBufs, "]"));
  }
  if (mode > static_cast<uint8_t>(Mode::kAz)) {
    return Bad(mid, "mode", absl::StrCat(static_cast<int>(mode), " is not 0, 1 or 2"));
  }
  h.mode = static_cast<Mode>(mode);
  if (reserved8 != 0 || reserved16 != 0) return Bad(mid, "reserved", "is not zero");
  if (ext_len > kMaxExtensions || kHelloFixed + ext_len != n) {
    return Bad(mid, "ext_len",
               absl::StrCat(ext_len, " does not match the ", n - kHelloFixed,
                            " bytes after the fixed body (at most ", kMaxExtensions, ")"));
  }
  const uint8_t* e = p + kHelloFixed;
  size_t left = ext_len;
  while (left > 0) {
    if (left < 4) return Bad(mid, "extension", "header is truncated");
    Extension x;
    x.type = Load<uint16_t>(e);
    uint16_t len = Load<uint16_t>(e + 2);
    if (x.type == 0) return Bad(mid, "extension.type", "is 0");
    if (len > left - 4) {
      return Bad(mid, "extension.len", absl::StrCat(len, " runs past the extension area"));
    }
    x.value.assign(reinterpret_cast<const char*>(e + 4), len);
    h.extensions.push_back(std::move(x));
    e += 4 + len;
    left -= 4 + len;
  }
  return h;
}

absl::StatusOr<Advert> DecodeAdvert(MessageId mid, const uint8_t* p, size_t n) {
  if (n < kAdvertFixed) {
    return Bad(mid, "len", absl::StrCat("gives a ", n, "-byte body; at least ", kAdvertFixed,
                                        " needed"));
  }
  Advert a;
  a.addr = Load<uint64_t>(p);
  a.length = Load<uint32_t>(p + 8);
  a.az_slot = Load<uint32_t>(p + 12);
  a.stream_pos = Load<uint64_t>(p + 16);
  uint16_t key_len = Load<uint16_t>(p + 24);
  uint16_t reserved = Load<uint16_t>(p + 26);
  if (reserved != 0) return Bad(mid, "reserved", "is not zero");
  if (a.length == 0) return Bad(mid, "length", "is 0");
  if (a.addr + a.length < a.addr) return Bad(mid, "addr", "+ length wraps around");
  if (key_len < kKeyHeader || key_len > kMaxKeyLen) {
    return Bad(mid, "key_len",
               absl::StrCat(key_len, " is outside [", kKeyHeader, ", ", kMaxKeyLen, "]"));
  }
  if (kAdvertFixed + key_len != n) {
    return Bad(mid, "key_len",
               absl::StrCat(key_len, " does not match the ", n - kAdvertFixed,
                            " bytes after the fixed body"));
  }
  const uint8_t* k = p + kAdvertFixed;
  // RemoteKey version 1 (core/provider.cc): u8 version, u8 blob_len,
  // u16 reserved, u32 access, u64 addr, u64 length, blob.
  if (k[0] != 1) return Bad(mid, "key.version", absl::StrCat(static_cast<int>(k[0]), " is not 1"));
  size_t blob_len = k[1];
  if (blob_len > RemoteKey::kMaxBlob || kKeyHeader + blob_len != key_len) {
    return Bad(mid, "key.blob_len",
               absl::StrCat(blob_len, " does not match key_len ", key_len));
  }
  a.key.access = Load<uint32_t>(k + 4);
  a.key.addr = Load<uint64_t>(k + 8);
  a.key.length = Load<uint64_t>(k + 16);
  if (a.key.addr + a.key.length < a.key.addr) return Bad(mid, "key.length", "wraps around");
  if (a.addr < a.key.addr || a.addr + a.length > a.key.addr + a.key.length) {
    return Bad(mid, "addr", "range lies outside the range its key registers");
  }
  uint32_t need = mid == MessageId::kSrcAvail ? kRemoteRead : kRemoteWrite;
  if ((a.key.access & need) != need) {
    return Bad(mid, "key.access",
               mid == MessageId::kSrcAvail ? "lacks remote read" : "lacks remote write");
  }
  a.key.blob.assign(k + kKeyHeader, k + key_len);
  a.key_bytes.assign(reinterpret_cast<const char*>(k), key_len);
  return a;
}

}  // namespace

absl::string_view MessageName(MessageId id) {
  switch (id) {
    case MessageId::kHello: return "Hello";
    case MessageId::kHelloAck: return "HelloAck";
    case MessageId::kDisconnReq: return "DisconnReq";
    case MessageId::kAbortConn: return "AbortConn";
    case MessageId::kSendSm: return "SendSm";
    case MessageId::kRdmaWrCompl: return "RdmaWrCompl";
    case MessageId::kRdmaRdCompl: return "RdmaRdCompl";
    case MessageId::kModeChange: return "ModeChange";
    case MessageId::kSrcAvailCancel: return "SrcAvailCancel";
    case MessageId::kSinkAvailCancel: return "SinkAvailCancel";
    case MessageId::kSinkCancelAck: return "SinkCancelAck";
    case MessageId::kSinkAvail: return "SinkAvail";
    case MessageId::kSrcAvail: return "SrcAvail";
    case MessageId::kData: return "Data";
  }
  return "message";
}

absl::Status DecodeHeader(std::span<const uint8_t> bytes, const Limits& limits, Header* out) {
  if (bytes.size() < kHeaderSize) {
    return MakeError(absl::StatusCode::kInvalidArgument, EPROTO,
                     absl::StrCat("malformed SDP message: ", bytes.size(),
                                  " bytes is shorter than the 16-byte base header"),
                     "the peer violates docs/protocol.md (version 1); the connection is aborted");
  }
  const uint8_t* p = bytes.data();
  if (!KnownId(p[0])) {
    return MakeError(absl::StatusCode::kInvalidArgument, EPROTO,
                     absl::StrCat("malformed SDP message: field mid 0x", absl::Hex(p[0]),
                                  " is not a known message id"),
                     "the peer violates docs/protocol.md (version 1); the connection is aborted");
  }
  Header& h = *out;
  h.mid = static_cast<MessageId>(p[0]);
  h.flags = p[1];
  h.bufs = Load<uint16_t>(p + 2);
  h.len = Load<uint32_t>(p + 4);
  h.mseq = Load<uint32_t>(p + 8);
  h.mseq_ack = Load<uint32_t>(p + 12);
  if (h.mid == MessageId::kSendSm) {
    return Bad(h.mid, "mid", "is reserved in version 1 (a sink asks for BCopy with "
                             "RdmaRdCompl flag SendSmall)");
  }
  if (h.len != bytes.size()) {
    return Bad(h.mid, "len", absl::StrCat(h.len, " differs from the ", bytes.size(),
                                          " bytes received"));
  }
  if (h.len > limits.max_len) {
    return Bad(h.mid, "len", absl::StrCat(h.len, " exceeds the receive buffer size ",
                                          limits.max_len));
  }
  if (h.flags & ~AllowedFlags(h.mid)) {
    return Bad(h.mid, "flags", absl::StrCat("0x", absl::Hex(h.flags), " sets bits this message "
                                            "does not define"));
  }
  if (h.bufs > kMaxBufs) {
    return Bad(h.mid, "bufs", absl::StrCat(h.bufs, " exceeds ", kMaxBufs));
  }
  if (h.mseq == 0) return Bad(h.mid, "mseq", "is 0 (sequence numbers start at 1)");
  return absl::OkStatus();
}

absl::StatusOr<Message> Decode(std::span<const uint8_t> bytes, const Limits& limits) {
  Message m;
  if (auto st = DecodeHeader(bytes, limits, &m.header); !st.ok()) return st;
  const Header& h = m.header;
  const uint8_t* b = bytes.data() + kHeaderSize;
  size_t n = bytes.size() - kHeaderSize;
  switch (h.mid) {
    case MessageId::kHello:
    case MessageId::kHelloAck: {
      auto hello = DecodeHello(h.mid, b, n);
      if (!hello.ok()) return hello.status();
      m.body = std::move(*hello);
      break;
    }
    case MessageId::kData:
      m.payload = bytes.subspan(kHeaderSize);
      break;
    case MessageId::kDisconnReq:
      if (auto st = CheckBodySize(h.mid, n, 0); !st.ok()) return st;
      break;
    case MessageId::kAbortConn: {
      if (auto st = CheckBodySize(h.mid, n, kAbortSize); !st.ok()) return st;
      m.body = Abort{Load<uint32_t>(b)};
      break;
    }
    case MessageId::kSrcAvail:
    case MessageId::kSinkAvail: {
      auto a = DecodeAdvert(h.mid, b, n);
      if (!a.ok()) return a.status();
      m.body = std::move(*a);
      break;
    }
    case MessageId::kRdmaRdCompl:
    case MessageId::kRdmaWrCompl: {
      if (auto st = CheckBodySize(h.mid, n, kCompletedSize); !st.ok()) return st;
      Completed c{Load<uint32_t>(b), Load<uint32_t>(b + 4)};
      if (c.advert == 0) return Bad(h.mid, "advert", "is 0 (adverts are named by their mseq)");
      if (h.mid == MessageId::kRdmaWrCompl && c.bytes == 0) {
        return Bad(h.mid, "bytes", "is 0 (a write completion reports at least one byte)");
      }
      m.body = c;
      break;
    }
    case MessageId::kSrcAvailCancel:
    case MessageId::kSinkAvailCancel:
    case MessageId::kSinkCancelAck: {
      if (auto st = CheckBodySize(h.mid, n, kAdvertRefSize); !st.ok()) return st;
      AdvertRef r{Load<uint32_t>(b)};
      if (r.advert == 0) return Bad(h.mid, "advert", "is 0 (adverts are named by their mseq)");
      m.body = r;
      break;
    }
    case MessageId::kModeChange: {
      if (auto st = CheckBodySize(h.mid, n, kModeChangeSize); !st.ok()) return st;
      if (b[0] > static_cast<uint8_t>(Mode::kAz)) {
        return Bad(h.mid, "mode", absl::StrCat(static_cast<int>(b[0]), " is not 0, 1 or 2"));
      }
      if (b[1] != 0 || b[2] != 0 || b[3] != 0) return Bad(h.mid, "reserved", "is not zero");
      m.body = ModeChange{static_cast<Mode>(b[0])};
      break;
    }
    case MessageId::kSendSm:
      break;  // refused above
  }
  return m;
}

size_t EncodedSize(const Message& m, size_t payload_len) {
  switch (m.header.mid) {
    case MessageId::kHello:
    case MessageId::kHelloAck: {
      size_t n = kHeaderSize + kHelloFixed;
      if (auto* h = std::get_if<Hello>(&m.body)) {
        for (const auto& x : h->extensions) n += 4 + x.value.size();
      }
      return n;
    }
    case MessageId::kData: return kHeaderSize + payload_len;
    case MessageId::kDisconnReq: return kHeaderSize;
    case MessageId::kAbortConn: return kHeaderSize + kAbortSize;
    case MessageId::kSrcAvail:
    case MessageId::kSinkAvail: {
      size_t n = kHeaderSize + kAdvertFixed;
      if (auto* a = std::get_if<Advert>(&m.body)) n += a->key_bytes.size();
      return n;
    }
    case MessageId::kRdmaRdCompl:
    case MessageId::kRdmaWrCompl: return kHeaderSize + kCompletedSize;
    case MessageId::kSrcAvailCancel:
    case MessageId::kSinkAvailCancel:
    case MessageId::kSinkCancelAck: return kHeaderSize + kAdvertRefSize;
    case MessageId::kModeChange: return kHeaderSize + kModeChangeSize;
    case MessageId::kSendSm: return kHeaderSize;
  }
  return kHeaderSize;
}

void EncodeHeader(const Header& h, uint8_t* out) {
  out[0] = static_cast<uint8_t>(h.mid);
  out[1] = h.flags;
  Store<uint16_t>(out + 2, h.bufs);
  Store<uint32_t>(out + 4, h.len);
  Store<uint32_t>(out + 8, h.mseq);
  Store<uint32_t>(out + 12, h.mseq_ack);
}

size_t Encode(const Message& m, std::span<uint8_t> out, std::span<const uint8_t> payload) {
  size_t n = EncodedSize(m, payload.size());
  if (out.size() < n) return 0;
  std::memset(out.data(), 0, n);
  Header h = m.header;
  h.len = static_cast<uint32_t>(n);
  EncodeHeader(h, out.data());
  uint8_t* b = out.data() + kHeaderSize;
  switch (m.header.mid) {
    case MessageId::kHello:
    case MessageId::kHelloAck: {
      Hello hello;
      if (auto* x = std::get_if<Hello>(&m.body)) hello = *x;
      b[0] = hello.major;
      b[1] = hello.minor;
      b[2] = hello.caps;
      b[3] = hello.max_adverts;
      Store<uint32_t>(b + 4, hello.buf_size);
      Store<uint16_t>(b + 8, hello.max_bufs);
      b[10] = static_cast<uint8_t>(hello.mode);
      size_t ext = 0;
      for (const auto& x : hello.extensions) ext += 4 + x.value.size();
      Store<uint16_t>(b + 12, static_cast<uint16_t>(ext));
      uint8_t* e = b + kHelloFixed;
      for (const auto& x : hello.extensions) {
        Store<uint16_t>(e, x.type);
        Store<uint16_t>(e + 2, static_cast<uint16_t>(x.value.size()));
        std::memcpy(e + 4, x.value.data(), x.value.size());
        e += 4 + x.value.size();
      }
      break;
    }
    case MessageId::kData:
      if (!payload.empty()) std::memcpy(b, payload.data(), payload.size());
      break;
    case MessageId::kAbortConn:
      if (auto* x = std::get_if<Abort>(&m.body)) Store<uint32_t>(b, x->reason);
      break;
    case MessageId::kSrcAvail:
    case MessageId::kSinkAvail:
      if (auto* a = std::get_if<Advert>(&m.body)) {
        Store<uint64_t>(b, a->addr);
        Store<uint32_t>(b + 8, a->length);
        Store<uint32_t>(b + 12, a->az_slot);
        Store<uint64_t>(b + 16, a->stream_pos);
        Store<uint16_t>(b + 24, static_cast<uint16_t>(a->key_bytes.size()));
        std::memcpy(b + kAdvertFixed, a->key_bytes.data(), a->key_bytes.size());
      }
      break;
    case MessageId::kRdmaRdCompl:
    case MessageId::kRdmaWrCompl:
      if (auto* c = std::get_if<Completed>(&m.body)) {
        Store<uint32_t>(b, c->advert);
        Store<uint32_t>(b + 4, c->bytes);
      }
      break;
    case MessageId::kSrcAvailCancel:
    case MessageId::kSinkAvailCancel:
    case MessageId::kSinkCancelAck:
      if (auto* r = std::get_if<AdvertRef>(&m.body)) Store<uint32_t>(b, r->advert);
      break;
    case MessageId::kModeChange:
      if (auto* x = std::get_if<ModeChange>(&m.body)) b[0] = static_cast<uint8_t>(x->mode);
      break;
    case MessageId::kDisconnReq:
    case MessageId::kSendSm:
      break;
  }
  return n;
}

std::string EncodeToString(const Message& m, std::span<const uint8_t> payload) {
  std::string out(EncodedSize(m, payload.size()), '\0');
  Encode(m, std::span<uint8_t>(reinterpret_cast<uint8_t*>(out.data()), out.size()), payload);
  return out;
}

}  // namespace zsock::sdp::wire
