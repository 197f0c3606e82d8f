// Handshake frames and the Hello's encoding.
#include "providers/ucx/hello.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace zsock::ucx {
namespace {

constexpr size_t kMaxWireField = 64 * 1024;

}  // namespace

BootstrapIo HandshakeIo(int fd, absl::Time deadline) {
  return BootstrapIo(fd, deadline,
                     {.peer = "the ucx peer",
                      .fix = "check that the peer is a compatible zsock ucx endpoint and is not "
                             "stuck; its log says if it rejected the connection (e.g. shared "
                             "memory impossible and fallback=none)"});
}

absl::Status SendFrame(int fd, FrameType type, absl::string_view payload, absl::Time deadline) {
  return HandshakeIo(fd, deadline).SendFrame(type, payload);
}

absl::StatusOr<std::string> RecvFrame(int fd, FrameType type, absl::Time deadline) {
  return HandshakeIo(fd, deadline).RecvFrame(type, kMaxWireField);
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
