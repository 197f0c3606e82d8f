// Handshake frames and the Hello's encoding.
#include "providers/ucx/hello.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "providers/ucx/bootstrap_io.h"

namespace zsock::ucx {
namespace {

constexpr size_t kMaxWireField = 64 * 1024;

}  // namespace

absl::Status SendFrame(int fd, FrameType type, absl::string_view payload, absl::Time deadline) {
  uint32_t head[2] = {type, static_cast<uint32_t>(payload.size())};
  std::string buf(reinterpret_cast<const char*>(head), sizeof(head));
  buf.append(payload.data(), payload.size());
  return WriteAll(fd, buf.data(), buf.size(), deadline);
}

absl::StatusOr<std::string> RecvFrame(int fd, FrameType type, absl::Time deadline) {
  uint32_t head[2];
  if (auto st = ReadAll(fd, head, sizeof(head), deadline); !st.ok()) return st;
  if (head[0] != type || head[1] > kMaxWireField) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO,
                     absl::StrCat("malformed ucx handshake frame (type ", head[0], ", ", head[1],
                                  " bytes; expected type ", static_cast<uint32_t>(type), ")"),
                     "the peer is not a compatible zsock ucx endpoint");
  }
  std::string payload(head[1], '\0');
  if (auto st = ReadAll(fd, payload.data(), payload.size(), deadline); !st.ok()) return st;
  return payload;
}

std::string Hello::Encode() const {
  HelloFixed f = fixed;
  f.address_len = static_cast<uint32_t>(address.size());
  f.table_rkey_len = static_cast<uint32_t>(table_rkey.size());
  f.tls_len = static_cast<uint32_t>(tls.size());
  std::string out(reinterpret_cast<const char*>(&f), sizeof(f));
  out += address;
  out += table_rkey;
  out += tls;
  return out;
}

absl::StatusOr<Hello> Hello::Decode(absl::string_view bytes) {
  Hello h;
  if (bytes.size() < sizeof(HelloFixed)) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO, "truncated ucx hello",
                     "the peer is not a compatible zsock ucx endpoint");
  }
  std::memcpy(&h.fixed, bytes.data(), sizeof(HelloFixed));
  const HelloFixed& f = h.fixed;
  if (f.magic != kHelloMagic || f.version != kWireVersion) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO,
                     absl::StrCat("ucx hello has magic 0x", absl::Hex(f.magic), " version ",
                                  f.version, " (want version ", kWireVersion, ")"),
                     "run the same zsock version on both sides");
  }
  uint64_t total = uint64_t{sizeof(HelloFixed)} + f.address_len + f.table_rkey_len + f.tls_len;
  if (total != bytes.size() || f.address_len == 0 || f.table_rkey_len > 4096 ||
      f.tls_len > 1024 || f.ep_id == 0 || f.table_slots > (1u << 20)) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO,
                     "ucx hello carries inconsistent lengths",
                     "the peer is not a compatible zsock ucx endpoint");
  }
  size_t off = sizeof(HelloFixed);
  h.address = std::string(bytes.substr(off, f.address_len));
  off += f.address_len;
  h.table_rkey = std::string(bytes.substr(off, f.table_rkey_len));
  off += f.table_rkey_len;
  h.tls = std::string(bytes.substr(off, f.tls_len));
  return h;
}

}  // namespace zsock::ucx
