// What zsock ofi peers exchange while they connect (wire formats, sent as
// the raw structs below). RDM: each side sends an OfiHello on the
// bootstrap TCP socket. MSG: each fi_connect carries a CmData as its
// connection data, which pairs the two halves of one zsock connection by
// a nonce.
#ifndef ZSOCK_PROVIDERS_OFI_HANDSHAKE_H_
#define ZSOCK_PROVIDERS_OFI_HANDSHAKE_H_

#include <cstdint>

namespace zsock::ofi {

inline constexpr uint32_t kHelloMagic = 0x7a6f6669;  // "zofi"
inline constexpr uint16_t kHelloVersion = 2;

struct OfiHello {
  uint32_t magic;
  uint16_t version;
  uint16_t name_len;
  uint32_t uid;  // effective uid: shm connects peers of one user only
  uint32_t reserved;  // the sender's flow window (0: none), from flow control on
  uint8_t name[256];  // the sender's fi_getname address
};

// Connection-request data: which half of a zsock connection this is.
struct CmData {
  uint32_t magic;
  uint16_t version;
  uint8_t kind;  // kCmData or kCmControl
  uint8_t reserved;
  uint64_t nonce;  // pairs the two halves
};
inline constexpr uint8_t kCmData = 0, kCmControl = 1;

}  // namespace zsock::ofi

#endif  // ZSOCK_PROVIDERS_OFI_HANDSHAKE_H_
