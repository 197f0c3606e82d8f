// The verbs wire formats (see wire.h).
#include "providers/verbs/wire.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace zsock::verbs {
namespace {

void PutU16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
void PutU32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
void PutU64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint16_t GetU16(const uint8_t* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
uint32_t GetU32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
uint64_t GetU64(const uint8_t* p) { uint64_t v; std::memcpy(&v, p, 8); return v; }

}  // namespace

// ------------------------------------------------------------ remote keys

std::vector<uint8_t> EncodeKeyBlob(const KeyBlob& k) {
  std::vector<uint8_t> b(kKeyBlobSize, 0);
  b[0] = kKeyBlobVersion;
  PutU32(b.data() + 4, k.rkey);
  LocalKeyTable::Encode(k.key, b.data() + 8);
  return b;
}

absl::StatusOr<KeyBlob> DecodeKeyBlob(const std::vector<uint8_t>& blob) {
  if (blob.size() != kKeyBlobSize || blob[0] != kKeyBlobVersion || blob[1] != 0 || blob[2] != 0 ||
      blob[3] != 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("remote key blob of ", blob.size(),
                                  " bytes is not a verbs key (version ", int{kKeyBlobVersion},
                                  ", ", kKeyBlobSize, " bytes)"),
                     "pass the key a verbs fabric's registration produced, unchanged");
  }
  KeyBlob k;
  k.rkey = GetU32(blob.data() + 4);
  k.key = LocalKeyTable::Decode(blob.data() + 8);
  return k;
}

// ------------------------------------------------------------ private data

std::string EncodeHello(const Hello& h) {
  std::string out(Hello::kSize, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  PutU32(p, Hello::kMagic);
  p[4] = Hello::kVersion;
  p[5] = h.flags;
  PutU16(p + 6, static_cast<uint16_t>(Hello::kSize));
  PutU32(p + 8, h.credits);
  PutU32(p + 12, h.eager_size);
  PutU32(p + 16, h.max_inline);
  PutU64(p + 24, h.fabric_id);
  return out;
}

absl::StatusOr<Hello> DecodeHello(const void* bytes, size_t len) {
  auto bad = [](absl::string_view why) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO,
                     absl::StrCat("the peer's connection private data is not a zsock verbs hello: ",
                                  why),
                     "connect zsock verbs endpoints of the same version to each other");
  };
  if (bytes == nullptr || len < Hello::kSize) {
    return bad(absl::StrCat(len, " bytes, need ", Hello::kSize));
  }
  const auto* p = static_cast<const uint8_t*>(bytes);
  if (GetU32(p) != Hello::kMagic) return bad("wrong magic");
  if (p[4] != Hello::kVersion) {
    return bad(absl::StrCat("version ", static_cast<int>(p[4]), ", this zsock speaks ",
                            static_cast<int>(Hello::kVersion)));
  }
  if (GetU16(p + 6) != Hello::kSize) return bad("wrong length field");
  Hello h;
  h.flags = p[5];
  if (h.flags & ~(kHelloSrq | kHelloAtomics)) return bad("unknown flags");
  h.credits = GetU32(p + 8);
  h.eager_size = GetU32(p + 12);
  h.max_inline = GetU32(p + 16);
  h.fabric_id = GetU64(p + 24);
  if (GetU32(p + 20) != 0) return bad("reserved bytes set");
  if (!(h.flags & kHelloSrq) && (h.credits == 0 || h.credits > (1u << 16))) {
    return bad(absl::StrCat("receive credits ", h.credits, " outside 1..65536"));
  }
  if (h.eager_size < 256 || h.eager_size > (1u << 20)) {
    return bad(absl::StrCat("receive buffer size ", h.eager_size, " outside 256..1 MiB"));
  }
  return h;
}

// ------------------------------------------------------------ framing

void EncodeHeader(const Header& h, uint8_t* out) {
  out[0] = static_cast<uint8_t>(h.type);
  out[1] = h.flags;
  PutU16(out + 2, h.credits);
  PutU32(out + 4, h.length);
  PutU64(out + 8, h.cookie);
  PutU64(out + 16, h.aux);
}

absl::StatusOr<Header> DecodeHeader(const uint8_t* in, size_t len, size_t eager_size) {
  auto bad = [&](absl::string_view why) {
    return MakeError(absl::StatusCode::kDataLoss, EPROTO,
                     absl::StrCat("malformed verbs message from the peer (", len, " bytes): ", why),
                     "the peer is not a compatible zsock verbs endpoint; the connection is closed");
  };
  if (len < kHeaderSize || len > eager_size) return bad("bad size");
  Header h;
  h.type = static_cast<MsgType>(in[0]);
  h.flags = in[1];
  h.credits = GetU16(in + 2);
  h.length = GetU32(in + 4);
  h.cookie = GetU64(in + 8);
  h.aux = GetU64(in + 16);
  if (h.flags & ~kMsgControl) return bad("unknown flags");
  switch (h.type) {
    case MsgType::kEager:
      if (h.length != len - kHeaderSize) return bad("payload length does not match");
      break;
    case MsgType::kRts:
      if (len != kHeaderSize + kRtsBodySize) return bad("rendezvous request size");
      break;
    case MsgType::kFin:
    case MsgType::kCredit:
    case MsgType::kClose:
      if (len != kHeaderSize || h.length != 0) return bad("control size");
      break;
    default:
      return bad(absl::StrCat("unknown type ", static_cast<int>(in[0])));
  }
  return h;
}

void EncodeRts(const RtsBody& r, uint8_t* out) {
  PutU64(out, r.addr);
  PutU64(out + 8, r.length);
  PutU32(out + 16, r.rkey);
}

RtsBody DecodeRts(const uint8_t* in) {
  RtsBody r;
  r.addr = GetU64(in);
  r.length = GetU64(in + 8);
  r.rkey = GetU32(in + 16);
  return r;
}

}  // namespace zsock::verbs
