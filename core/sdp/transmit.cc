// The transmit path of an SDP connection (docs/protocol.md): the control
// and data queues, and posting their messages from the private send slots
// as credits allow. Control messages go first; Data keeps kCreditReserve
// credits back for them; a credit update or an acknowledgement the peer
// asked for goes even when the head of the queues cannot.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/log.h"
#include "core/sdp/conn_state.h"
#include "core/sdp/engine.h"

namespace zsock::sdp {

using wire::MessageId;

void Withdraw(std::deque<TxItem>& q, wire::MessageId mid) {
  for (auto it = q.begin(); it != q.end(); ++it) {
    if (it->mid == mid) {
      q.erase(it);
      return;
    }
  }
}

void ConnState::QueueCtl(const wire::Message& m) {
  TxItem item;
  item.mid = m.header.mid;
  item.encoded = wire::EncodeToString(m);
  tx.ctlq.push_back(std::move(item));
}

void ConnState::QueueData(const wire::Message& m) {
  TxItem item;
  item.mid = m.header.mid;
  item.encoded = wire::EncodeToString(m);
  tx.dataq.push_back(std::move(item));
}

bool ConnState::PostItem(TxItem& item) {
  int slot = item.slot;
  if (slot < 0) {
    if (tx.free.empty()) return false;
    slot = tx.free.back();
    tx.free.pop_back();
  }
  uint8_t* p = SlotPtr(slot);
  size_t len;
  uint8_t flags = 0;
  if (item.mid == MessageId::kData) {
    len = wire::kHeaderSize + item.payload;
  } else {
    std::memcpy(p, item.encoded.data(), item.encoded.size());
    len = item.encoded.size();
    flags = p[1];
  }
  const bool ackreq = WantAckReq(item);
  if (ackreq) flags |= wire::kFlagAckReq;
  wire::Header h;
  h.mid = item.mid;
  h.flags = flags;
  h.bufs = static_cast<uint16_t>(Reportable());
  h.len = static_cast<uint32_t>(len);
  h.mseq = ++credit.tx_mseq;
  h.mseq_ack = credit.rx_mseq;
  wire::EncodeHeader(h, p);
  NoteAdvertPosted(item, h);
  // Small Data messages are injected: no completion to reap and dispatch
  // for each, and the slot is free at once. Close still waits for them (the
  // peer acknowledges its DisconnReq after them); other messages keep their
  // completion (an AbortConn must leave before the endpoint closes,
  // CloseEndpointWhenIdle).
  const bool inject = item.mid == MessageId::kData && len <= tx.inject_max;
  auto st = ep->Send(p, len, tx.region.mr.get(),
                     inject ? kInjectContext : MakeCtx(id, kCtxTx, slot));
  if (!st.ok()) {
    tx.free.push_back(slot);
    --credit.tx_mseq;
    Fail(ResetError(absl::StrCat("send to ", peer_address, " failed: ", st.message())));
    return false;
  }
  ZS_LOG(kTrace, "sdp conn %d tx %s mseq %u len %zu%s", static_cast<int>(id),
         wire::MessageName(item.mid), h.mseq, len, inject ? " (injected)" : "");
  if (inject) {
    tx.free.push_back(slot);
  } else {
    tx.inflight++;
  }
  NotePosted(item, h.mseq, ackreq);
  return true;
}

void ConnState::NoteAdvertPosted(const TxItem& item, const wire::Header& h) {
  if (item.az_serial != 0) {
    if (AzSrcAvail* s = FindAz(item.az_serial)) {
      s->id = h.mseq;
      s->posted = true;
    }
  } else if (item.mid == MessageId::kSrcAvail && !(h.flags & wire::kFlagAzUpdate)) {
    source.advert.id = h.mseq;
    source.advert.posted = true;
  } else if (item.mid == MessageId::kSinkAvail) {
    sink.advert.id = h.mseq;
    sink.advert.posted = true;
  } else if (item.mid == MessageId::kDisconnReq) {
    shut.wr_mseq = h.mseq;
  }
}

void ConnState::NotePosted(const TxItem& item, uint32_t mseq, bool ackreq) {
  credit.last_reported = Reportable();
  credit.recv_since_report = 0;
  credit.update_pending = false;
  bcopy.answer_due = false;  // mseq_ack = rx_mseq covers every message processed
  if (item.mid == MessageId::kData && item.payload > 0) {
    bcopy.payload_posted = true;
    bcopy.last_payload_mseq = mseq;
    // Everything queued at the flush has left.
    if (&item == &tx.dataq.back()) bcopy.flush_tail = false;
  }
  if (ackreq) {
    bcopy.ackreq_out = true;
    bcopy.ackreq_mseq = mseq;
    bcopy.ackreq_useful = false;
    stats.ack_requests++;
  }
  stats.messages_sent++;
  if (item.mid == MessageId::kData) {
    bcopy.queued_bytes -= item.payload;
    if (item.payload == 0) stats.credit_updates_sent++;
  }
}

ConnState::HeadOutcome ConnState::PostHead(int credits, int owed) {
  const bool from_ctl = !tx.ctlq.empty();
  TxItem& item = from_ctl ? tx.ctlq.front() : tx.dataq.front();
  const bool data = item.mid == MessageId::kData && item.payload > 0;
  const int need = data ? kCreditReserve + 1 : 1;
  bool can = credits >= need && !(credits == 1 && owed <= 0) &&
             (item.slot >= 0 || !tx.free.empty());
  if (can && data && !from_ctl && HoldTail(item)) {
    if (!item.held) stats.autocork_holds++;
    item.held = true;
    can = false;
  }
  if (!can) {
    if (data && credits < need && !credit.stalled) {
      credit.stalled = true;
      stats.credit_stalls++;
    }
    return HeadOutcome::kWaits;
  }
  if (opt.test_hold && !opt.test_hold(item.mid)) {
    tx.held = true;
    return HeadOutcome::kStop;
  }
  if (!PostItem(item)) return HeadOutcome::kStop;
  if (from_ctl) {
    tx.ctlq.pop_front();
  } else {
    tx.dataq.pop_front();
  }
  return HeadOutcome::kPosted;
}

void ConnState::TryTransmit() {
  if (phase != Phase::kOpen || !failure.error.ok() || tx.held) return;
  for (;;) {
    int credits = Credits();
    int owed = Owed();
    if (!tx.ctlq.empty() || !tx.dataq.empty()) {
      const HeadOutcome out = PostHead(credits, owed);
      if (out == HeadOutcome::kStop) return;
      if (out == HeadOutcome::kPosted) {
        engine->NotifyLocked();
        continue;
      }
    }
    // The head cannot go (or nothing is queued): a credit update still may,
    // so that two sides stalled on Data never deadlock (docs/protocol.md).
    if (credit.update_pending && owed > 0 && credits >= 1 && !tx.free.empty()) {
      TxItem upd;  // Data without payload
      upd.mid = MessageId::kData;
      if (!PostItem(upd)) return;
      engine->NotifyLocked();
      continue;
    }
    // The peer asked for an acknowledgement and nothing else carried one:
    // an empty Data (which also reports our buffers).
    // Like a control message, but not out of the reserve unless it also
    // returns credits (the requester holds only while we have more).
    if (bcopy.answer_due && credits >= 1 && (credits > kCreditReserve || owed > 0) &&
        !tx.free.empty()) {
      TxItem ack;
      ack.mid = MessageId::kData;
      if (!PostItem(ack)) return;
      stats.ack_answers++;
      engine->NotifyLocked();
      continue;
    }
    return;
  }
}

}  // namespace zsock::sdp
