// The SDP wire format, version 1 (docs/protocol.md): the message set of the
// Sockets Direct Protocol (IBTA Annex A4) as zsock carries it over any
// provider endpoint.
//
// Every message starts with the 16-byte base header (BSDH): message id,
// flags, bufs (the sender's currently posted private receive buffers: the
// credit state), total length, sequence number and acknowledged sequence.
// Bodies are fixed layouts per message id, little-endian; SrcAvail and
// SinkAvail carry a serialized RemoteKey (docs/provider-interface.md) of
// variable length, announced in the body; Hello/HelloAck end in a list of
// type-length-value extensions (unknown types are skipped: AZ-SDP adds its
// lock-word table there).
//
// Decode() validates every field it can check without connection state
// (lengths, ids, flags, reserved bytes, version, buffer size and count
// bounds, key framing and range, advertised ranges) and returns an
// InvalidArgument status naming the field; the engine checks the rest
// (sequence numbers, credits, advert ids). Decode never reads outside the
// given bytes and never allocates more than the message's own length.
#ifndef ZSOCK_CORE_SDP_WIRE_H_
#define ZSOCK_CORE_SDP_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/provider.h"

namespace zsock::sdp::wire {

inline constexpr uint8_t kVersionMajor = 1;
inline constexpr uint8_t kVersionMinor = 2;
inline constexpr size_t kHeaderSize = 16;

// Private receive buffers: every message must fit in one.
inline constexpr uint32_t kMinBufSize = 1024;
inline constexpr uint32_t kMaxBufSize = 16u << 20;
// A side posts at least this many (the credit reserve needs them) and at
// most kMaxBufs.
inline constexpr uint16_t kMinBufs = 4;
inline constexpr uint16_t kMaxBufs = 4096;
// RemoteKey v1 framing: 24-byte header + blob of at most RemoteKey::kMaxBlob.
inline constexpr size_t kKeyHeader = 24;
inline constexpr size_t kMaxKeyLen = kKeyHeader + RemoteKey::kMaxBlob;
// Largest Hello/HelloAck extension area.
inline constexpr size_t kMaxExtensions = 512;
// az_slot value meaning "no AZ-SDP lock word" (all of version 1).
inline constexpr uint32_t kNoSlot = 0xffffffffu;

// Message ids: the IBTA Annex A4 values.
enum class MessageId : uint8_t {
  kHello = 0x00,
  kHelloAck = 0x01,
  kDisconnReq = 0x02,
  kAbortConn = 0x03,
  kSendSm = 0x04,  // reserved in v1 (never sent; refused)
  kRdmaWrCompl = 0x05,
  kRdmaRdCompl = 0x06,
  kModeChange = 0x07,
  kSrcAvailCancel = 0x08,
  kSinkAvailCancel = 0x09,
  kSinkCancelAck = 0x0a,
  kSinkAvail = 0xfd,
  kSrcAvail = 0xfe,
  kData = 0xff,
};
absl::string_view MessageName(MessageId id);

// Flags (base header byte 1). Each message id allows only some.
enum Flag : uint8_t {
  // RdmaRdCompl: this is the sink's answer to a SrcAvailCancel (bytes = the
  // last bytes it read; the advert is finished).
  kFlagCancelReply = 0x01,
  // RdmaRdCompl: the sink will not read the rest of this SrcAvail; the source
  // sends the remaining bytes as Data (the advert is finished).
  kFlagSendSmall = 0x02,
  // Data: acknowledge this message soon (autocork, docs/protocol.md): once
  // it is processed, the receiver posts some message (an empty Data if it
  // has nothing else to send), whose mseq_ack covers it. Only to a peer that
  // announced kExtAckReq.
  kFlagAckReq = 0x04,
  // SrcAvail (1.2, only to a peer that announced kExtPull): pulled bcopy.
  // The source copied the bytes into its own buffer and returned to the
  // application; it never cancels the advert. RdmaRdCompl with SendSmall
  // means the sink discarded it (SHUT_RD); a sink that cannot read it
  // resets the connection.
  kFlagPull = 0x20,
  // Reserved for AZ-SDP (decoded, refused by a v1 engine): SrcAvail
  // "updated source avail" naming a copy-on-write buffer that replaces the
  // advert with the same az_slot.
  kFlagAzUpdate = 0x40,
  // Reserved for AZ-SDP: the source protected the buffer (mprotect) and did
  // not wait for this advert before returning to the application.
  kFlagAzAsync = 0x80,
};

struct Header {
  MessageId mid = MessageId::kData;
  uint8_t flags = 0;
  uint16_t bufs = 0;      // receive buffers the sender has posted now
  uint32_t len = 0;       // whole message, header included
  uint32_t mseq = 0;      // this message's sequence number (first = 1)
  uint32_t mseq_ack = 0;  // last sequence number received from the peer
};

// Capability bits in Hello/HelloAck.
enum Capability : uint8_t {
  kCapRdmaRead = 0x01,   // I can RDMA-read your SrcAvails (sink side)
  kCapRdmaWrite = 0x02,  // I can RDMA-write your SinkAvails (source side)
  kCapAz = 0x04,         // reserved: AZ-SDP (several adverts, lock words)
};

// Data path modes (Hello.mode, ModeChange.mode).
enum class Mode : uint8_t { kBcopy = 0, kZcopy = 1, kAz = 2 /* reserved */ };

// Extension types in Hello/HelloAck.
enum ExtensionType : uint16_t {
  // Reserved for AZ-SDP: the sender's lock-word table, u32 slot count then a
  // serialized RemoteKey granting remote atomics on count 8-byte words.
  kExtAzLockTable = 1,
  // The sender's socket address as text ("IP:PORT", "[IPv6]:PORT"), as the
  // SDP Hello header carries ports and IP addresses: the sockets layer's
  // getpeername. Optional; a value that does not parse is ignored.
  kExtSocketAddress = 2,
  // 1.1 (empty value): I answer Data flagged kFlagAckReq (autocork). An
  // extension rather than a capability bit: 1.0 engines skip unknown
  // extensions but refuse unknown capability bits.
  kExtAckReq = 3,
  // 1.2: u32 count (1..64): I accept up to count SrcAvails flagged
  // kFlagPull outstanding, besides max_adverts: my reads of memory you
  // allocated with Fabric::AllocateRegistered are CPU copies
  // (Capabilities::rma_allocated), so send large writes that way.
  kExtPull = 4,
};
struct Extension {
  uint16_t type = 0;
  std::string value;
};

struct Hello {  // also HelloAck
  uint8_t major = kVersionMajor;
  uint8_t minor = kVersionMinor;
  uint8_t caps = 0;
  uint8_t max_adverts = 1;  // SrcAvails the sender accepts outstanding (v1: 1)
  uint32_t buf_size = 0;    // bytes in each of the sender's receive buffers
  uint16_t max_bufs = 0;    // most receive buffers it will ever have posted
  Mode mode = Mode::kBcopy; // the sender's data path (informational)
  std::vector<Extension> extensions;
};

// SrcAvail and SinkAvail.
struct Advert {
  uint64_t addr = 0;        // first byte of the buffer
  uint32_t length = 0;      // bytes offered (SrcAvail) / room (SinkAvail)
  uint32_t az_slot = kNoSlot;  // reserved for AZ-SDP: lock word index
  // Byte position in the stream: SrcAvail: bytes the source had delivered
  // before this advert; SinkAvail: bytes the sink had received.
  uint64_t stream_pos = 0;
  RemoteKey key;            // decoded from key_bytes
  std::string key_bytes;    // the serialized RemoteKey, as sent
};

// RdmaRdCompl and RdmaWrCompl.
struct Completed {
  uint32_t advert = 0;  // mseq of the SrcAvail / SinkAvail
  uint32_t bytes = 0;   // bytes read / written since the previous report
};

// SrcAvailCancel, SinkAvailCancel, SinkCancelAck.
struct AdvertRef {
  uint32_t advert = 0;
};

struct ModeChange {
  Mode mode = Mode::kBcopy;
};

struct Abort {
  uint32_t reason = 0;  // an errno value, 0 = unspecified
};

struct Empty {};  // DisconnReq; Data carries its payload separately

using Body = std::variant<Empty, Hello, Advert, Completed, AdvertRef, ModeChange, Abort>;

struct Message {
  Header header;
  Body body;
  // Data only: the payload, pointing into the decoded bytes.
  std::span<const uint8_t> payload;
};

// Bounds the receiver applies.
struct Limits {
  size_t max_len = kMaxBufSize;  // this side's receive buffer size
};

// Decodes and validates one message occupying all of `bytes`.
absl::StatusOr<Message> Decode(std::span<const uint8_t> bytes, const Limits& limits = {});
// Decode's checks of the base header alone, for a receiver's fast path:
// Data (whose body is its payload, bytes[kHeaderSize..]) is then fully
// validated; other messages still need Decode for their bodies.
absl::Status DecodeHeader(std::span<const uint8_t> bytes, const Limits& limits, Header* h);

// Encoded size of `m` (header included; Data payload given separately).
size_t EncodedSize(const Message& m, size_t payload_len = 0);
// Encodes `m` into `out` (at least EncodedSize bytes), filling header.len;
// a Data payload is copied from `payload`. Returns the bytes written.
size_t Encode(const Message& m, std::span<uint8_t> out,
              std::span<const uint8_t> payload = {});
// Convenience for tests and small messages.
std::string EncodeToString(const Message& m, std::span<const uint8_t> payload = {});

// Writes only the base header (the engine builds Data in place).
void EncodeHeader(const Header& h, uint8_t* out);

}  // namespace zsock::sdp::wire

#endif  // ZSOCK_CORE_SDP_WIRE_H_
