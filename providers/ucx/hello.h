// The connection handshake's wire format (version kWireVersion). Each side
// sends a Hello frame (its worker address, endpoint id and secret, the
// shared-memory probe, its key table), then a Verdict frame (whether it
// could create its UCX endpoint to the peer: u8 ok, 3 bytes zero, the
// reason if not), and, when either side could not and both allow it, a
// Fallback frame carrying the address of its tcp-only worker.
#ifndef ZSOCK_PROVIDERS_UCX_HELLO_H_
#define ZSOCK_PROVIDERS_UCX_HELLO_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/bootstrap_io.h"

namespace zsock::ucx {

inline constexpr uint32_t kHelloMagic = 0x5843555a;  // "ZUCX"
inline constexpr uint16_t kWireVersion = 1;

// Handshake frames: u32 type | u32 length | payload.
enum FrameType : uint32_t { kHelloFrame = 1, kVerdictFrame = 2, kFallbackFrame = 3 };

// The handshake's socket I/O (core/bootstrap_io.h), with errors that name
// the ucx peer.
BootstrapIo HandshakeIo(int fd, absl::Time deadline);

absl::Status SendFrame(int fd, FrameType type, absl::string_view payload, absl::Time deadline);
// A frame of `type`; FailedPrecondition for another type or an oversized one.
absl::StatusOr<std::string> RecvFrame(int fd, FrameType type, absl::Time deadline);

// The fixed part of the hello, little-endian; followed by the worker
// address, the key table's packed rkey and the transports string.
struct HelloFixed {
  uint32_t magic;
  uint16_t version;
  uint16_t flags;  // kHello* below
  uint32_t pid;
  uint32_t uid;
  uint32_t ep_id;
  uint32_t secret;
  uint64_t probe_nonce;
  int32_t probe_fd;
  uint32_t table_slots;
  uint64_t table_addr;
  uint8_t boot_id[16];
  uint32_t address_len;
  uint32_t table_rkey_len;
  uint32_t tls_len;
  uint32_t flow_window;  // the sender's window (0: none; a zsock before flow control sends 0)
};
static_assert(sizeof(HelloFixed) == 80);
inline constexpr uint16_t kHelloFallbackTcp = 1;  // sender accepts a tcp fallback
inline constexpr uint16_t kHelloNativeTable = 2;  // key table in shared memory

struct Hello {
  HelloFixed fixed{};
  std::string address;
  std::string table_rkey;
  std::string tls;

  // The bytes of a Hello frame's payload (the lengths filled in).
  std::string Encode() const;
  // Checks magic, version and lengths.
  static absl::StatusOr<Hello> Decode(absl::string_view bytes);
};

}  // namespace zsock::ucx

#endif  // ZSOCK_PROVIDERS_UCX_HELLO_H_
