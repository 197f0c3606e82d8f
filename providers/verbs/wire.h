// The verbs provider's wire formats, all little-endian and versioned
// (docs/verbs.md has the tables): the blob inside a RemoteKey, the hello
// carried in rdma_cm's connection private data, and the header that starts
// every message. Decoders validate everything a peer sends.
#ifndef ZSOCK_PROVIDERS_VERBS_WIRE_H_
#define ZSOCK_PROVIDERS_VERBS_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/local_keys.h"

namespace zsock::verbs {

// ------------------------------------------------------------ remote keys

// The RemoteKey blob: u8 version (2) | u8 flags (0) | u16 reserved (0) |
// u32 rkey | u32 slot | u32 generation. A peer uses only the rkey (in its
// work requests, checked by the HCA); slot and generation name the
// registration in the target's LocalKeyTable, which checks the emulated
// accesses core performs for the peer. Both ends run the same build.
struct KeyBlob {
  uint32_t rkey = 0;
  LocalKeyTable::Key key;
};
constexpr size_t kKeyBlobSize = 8 + LocalKeyTable::kEncodedSize;
constexpr uint8_t kKeyBlobVersion = 2;
std::vector<uint8_t> EncodeKeyBlob(const KeyBlob& k);
absl::StatusOr<KeyBlob> DecodeKeyBlob(const std::vector<uint8_t>& blob);

// ------------------------------------------------------------ private data

// Carried in rdma_connect / rdma_accept private data (at most 56 bytes on
// InfiniBand for a connect request): what the peer needs to send to us.
struct Hello {
  static constexpr uint32_t kMagic = 0x62727a76;  // "vzrb"
  static constexpr uint8_t kVersion = 1;
  static constexpr size_t kSize = 32;
  uint8_t flags = 0;           // kHelloSrq, kHelloAtomics
  uint32_t credits = 0;        // receive buffers the peer may fill (0 = SRQ)
  uint32_t eager_size = 0;     // size of each receive buffer
  uint32_t max_inline = 0;     // informational
  uint64_t fabric_id = 0;      // random per fabric (logs, same-fabric checks)
};
constexpr uint8_t kHelloSrq = 1;
constexpr uint8_t kHelloAtomics = 2;
std::string EncodeHello(const Hello& h);
// `bytes` may be longer than kSize (rdma_cm pads private data with zeros).
absl::StatusOr<Hello> DecodeHello(const void* bytes, size_t len);

// ------------------------------------------------------------ framing

// Every message starts with this 24-byte header:
//   u8 type | u8 flags | u16 credits | u32 length | u64 cookie | u64 aux
// kEager: `length` payload bytes follow. kRts (rendezvous request): an
// RtsBody follows (u64 addr | u64 length | u32 rkey): the sender's buffer,
// which the receiver RDMA-reads; `cookie` names it. kFin: rendezvous
// `cookie` is done (aux = 0, or the errno of the receiver's failure).
// kCredit: credits only. kClose: `aux` = user messages sent before closing.
// `credits` returns receive buffers to the peer on every message.
enum class MsgType : uint8_t { kEager = 1, kRts = 2, kFin = 3, kCredit = 4, kClose = 5 };
constexpr uint8_t kMsgControl = 1;  // core's control channel, not a user message

struct Header {
  MsgType type = MsgType::kEager;
  uint8_t flags = 0;
  uint16_t credits = 0;
  uint32_t length = 0;
  uint64_t cookie = 0;
  uint64_t aux = 0;
};
constexpr size_t kHeaderSize = 24;
struct RtsBody {               // follows a kRts header
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t rkey = 0;
};
constexpr size_t kRtsBodySize = 20;

void EncodeHeader(const Header& h, uint8_t* out);
// Validates the type, and that a message of `len` bytes holds what the
// header announces (eager payload, RTS body) within `eager_size`.
absl::StatusOr<Header> DecodeHeader(const uint8_t* in, size_t len, size_t eager_size);
void EncodeRts(const RtsBody& r, uint8_t* out);
RtsBody DecodeRts(const uint8_t* in);

}  // namespace zsock::verbs

#endif  // ZSOCK_PROVIDERS_VERBS_WIRE_H_
