// Bcopy (docs/protocol.md): the byte stream copied through private buffers
// under credit-based flow control. Outgoing bytes are appended to the Data
// message at the tail of the data queue while it has room (small writes
// coalesce while credits are out), each Data taking one send slot;
// incoming Data stays in its receive buffer, queued for Recv, until read.
// A Data without payload is a credit update.
#include <algorithm>

#include "core/copy.h"
#include "core/sdp/conn_state.h"

namespace zsock::sdp {

using wire::MessageId;

ConnState::DataOutcome ConnState::OnData(const wire::Header& h, int buf,
                                         std::span<const uint8_t> payload) {
  if (payload.empty()) return DataOutcome::kRepost;  // credit update
  if (shut.peer_wr) {
    ProtocolError(Violation(h, "carries data after DisconnReq"));
    return DataOutcome::kFailed;
  }
  VoidSinkAvail();
  rx.pos += payload.size();
  if (shut.rd) return DataOutcome::kRepost;  // discarded
  RxSeg s;
  s.kind = RxSeg::kData;
  s.buf = buf;
  s.data = payload.data();
  s.len = payload.size();
  rx.queue.push_back(s);
  return DataOutcome::kKeep;
}

bool ConnState::CanPostSmall(std::span<const iovec> iov) const {
  if (phase != Phase::kOpen || !tx.ctlq.empty() || !tx.dataq.empty() ||
      source.peer_sink.valid || Credits() < kCreditReserve + 1 || tx.free.size() <= kCtlSlots) {
    return false;
  }
  return IovBytes(iov) <
         std::min(tx.size - wire::kHeaderSize, std::max<size_t>(opt.zcopy_threshold, 1));
}

size_t ConnState::AppendData(const uint8_t* p, size_t n) {
  size_t total = 0;
  bool coalesced = false;
  while (n > 0) {
    TxItem* tail = nullptr;
    if (!tx.dataq.empty() && tx.dataq.back().mid == MessageId::kData &&
        tx.dataq.back().slot >= 0 && tx.dataq.back().payload < tx.size - wire::kHeaderSize) {
      tail = &tx.dataq.back();
      if (tail->payload > 0 && total == 0) coalesced = true;
    } else {
      if (bcopy.queued_bytes >= opt.sndbuf || tx.free.size() <= kCtlSlots) break;
      TxItem item;
      item.mid = MessageId::kData;
      item.slot = tx.free.back();
      tx.free.pop_back();
      tx.dataq.push_back(std::move(item));
      tail = &tx.dataq.back();
    }
    size_t k = std::min(n, tx.size - wire::kHeaderSize - tail->payload);
    CopyBytes(SlotPtr(tail->slot) + wire::kHeaderSize + tail->payload, p, k);
    tail->payload += k;
    bcopy.queued_bytes += k;
    p += k;
    n -= k;
    total += k;
  }
  if (total > 0) {
    tx.pos += total;
    stats.bytes_sent_bcopy += total;
    if (coalesced) stats.coalesced_sends++;
    // A SinkAvail the peer sent before these bytes is void (the sink sees
    // them first).
    if (source.peer_sink.valid && !source.peer_sink.writing) source.peer_sink.valid = false;
  }
  return total;
}

}  // namespace zsock::sdp
