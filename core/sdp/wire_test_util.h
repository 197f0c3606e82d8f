// Valid sample messages of every type, for the wire tests and the fuzz seed
// corpus.
#ifndef ZSOCK_CORE_SDP_WIRE_TEST_UTIL_H_
#define ZSOCK_CORE_SDP_WIRE_TEST_UTIL_H_

#include <cstring>
#include <string>
#include <vector>

#include "core/sdp/wire.h"

namespace zsock::sdp::wire {

inline RemoteKey SampleKey(uint32_t access) {
  RemoteKey k;
  k.addr = 0x10000;
  k.length = 0x10000;
  k.access = access;
  k.blob = {1, 2, 3, 4, 5};
  return k;
}

inline Advert SampleAdvert(MessageId mid) {
  Advert a;
  a.addr = 0x10100;
  a.length = 4096;
  a.stream_pos = 12345;
  a.key = SampleKey(mid == MessageId::kSrcAvail ? kRemoteRead : kRemoteWrite);
  // RemoteKey v1 bytes (docs/provider-interface.md), written out here so the
  // fuzz seed generator needs no provider code.
  a.key_bytes.assign(kKeyHeader + a.key.blob.size(), '\0');
  a.key_bytes[0] = 1;
  a.key_bytes[1] = static_cast<char>(a.key.blob.size());
  std::memcpy(&a.key_bytes[4], &a.key.access, 4);
  std::memcpy(&a.key_bytes[8], &a.key.addr, 8);
  std::memcpy(&a.key_bytes[16], &a.key.length, 8);
  std::memcpy(&a.key_bytes[kKeyHeader], a.key.blob.data(), a.key.blob.size());
  return a;
}

inline Message Make(MessageId mid, uint8_t flags, Body body) {
  Message m;
  m.header.mid = mid;
  m.header.flags = flags;
  m.header.bufs = 7;
  m.header.mseq = 42;
  m.header.mseq_ack = 41;
  m.body = std::move(body);
  return m;
}

// One encoded sample of each message.
inline std::vector<std::string> SampleMessages() {
  std::vector<std::string> out;
  Hello h;
  h.caps = kCapRdmaRead | kCapRdmaWrite;
  h.buf_size = 65536;
  h.max_bufs = 16;
  h.mode = Mode::kZcopy;
  h.extensions.push_back({kExtAzLockTable, "lock-table"});
  out.push_back(EncodeToString(Make(MessageId::kHello, 0, h)));
  h.extensions.clear();
  out.push_back(EncodeToString(Make(MessageId::kHelloAck, 0, h)));
  std::string payload = "hello, stream";
  out.push_back(EncodeToString(
      Make(MessageId::kData, 0, Empty{}),
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(payload.data()), payload.size())));
  out.push_back(EncodeToString(Make(MessageId::kData, 0, Empty{})));
  out.push_back(EncodeToString(Make(MessageId::kDisconnReq, 0, Empty{})));
  out.push_back(EncodeToString(Make(MessageId::kAbortConn, 0, Abort{104})));
  out.push_back(EncodeToString(Make(MessageId::kSrcAvail, 0, SampleAdvert(MessageId::kSrcAvail))));
  out.push_back(
      EncodeToString(Make(MessageId::kSinkAvail, 0, SampleAdvert(MessageId::kSinkAvail))));
  out.push_back(EncodeToString(Make(MessageId::kRdmaRdCompl, kFlagCancelReply, Completed{40, 100})));
  out.push_back(EncodeToString(Make(MessageId::kRdmaWrCompl, 0, Completed{40, 100})));
  out.push_back(EncodeToString(Make(MessageId::kSrcAvailCancel, 0, AdvertRef{40})));
  out.push_back(EncodeToString(Make(MessageId::kSinkAvailCancel, 0, AdvertRef{40})));
  out.push_back(EncodeToString(Make(MessageId::kSinkCancelAck, 0, AdvertRef{40})));
  out.push_back(EncodeToString(Make(MessageId::kModeChange, 0, ModeChange{Mode::kBcopy})));
  return out;
}

}  // namespace zsock::sdp::wire

#endif  // ZSOCK_CORE_SDP_WIRE_TEST_UTIL_H_
