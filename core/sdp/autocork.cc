// Autocork (docs/protocol.md, "Autocork"): a small Data sent while earlier
// data is unacknowledged asks the peer for an acknowledgement (flag
// AckReq); until it comes, the next small lone tail waits in its slot and
// later sends append to it. The tail leaves on the acknowledgement, on
// anything queued behind it, with a credit update or an answer that goes
// anyway, when the application is about to wait (FlushTail), or when
// autocork is turned off. Requests that no send waited for back off.
#include <algorithm>

#include "core/sdp/conn_state.h"
#include "core/sdp/engine.h"

namespace zsock::sdp {

void ConnState::UpdateCork() {
  bcopy.cork = opt.autocork && bcopy.peer_answers && engine->has_progress_thread();
}

void ConnState::SetAutocork(bool on) {
  opt.autocork = on;
  UpdateCork();
  if (!bcopy.cork) FlushTail();
}

void ConnState::FlushTail() {
  // Whatever is queued now goes without holding, including a tail that
  // only waits for credits yet (it must not be held once they come).
  if (tx.dataq.empty()) return;
  bcopy.flush_tail = true;
  TryTransmit();
}

bool ConnState::HoldTail(const TxItem& item) const {
  if (!bcopy.cork || !bcopy.ackreq_out ||
      static_cast<int32_t>(credit.peer_ack - bcopy.ackreq_mseq) >= 0) {
    return false;
  }
  // Only a lone Data tail of at most half a slot waits: growing past that,
  // or anything queued behind it (the next slot, a SrcAvail, the
  // DisconnReq), sends it.
  if (tx.dataq.size() != 1 || &item != &tx.dataq.front() || item.slot < 0 ||
      item.payload > CorkFlagMax()) {
    return false;
  }
  // A message is going to the peer anyway (credits or an answer it asked
  // for): the data goes as that message.
  if (credit.update_pending || bcopy.answer_due || bcopy.flush_tail) return false;
  // The peer must be able to answer: by our count it still holds credits
  // for a message to us (else it may be blocked until our application
  // reads, and the tail would wait for that).
  return credit.last_reported - static_cast<int>(credit.recv_since_report) > kCreditReserve;
}

bool ConnState::WantAckReq(const TxItem& item) {
  // A small Data sent while earlier data is unacknowledged, or one that was
  // held, asks for an acknowledgement; until it comes, the next small tail
  // waits (HoldTail). Not when it goes because the application is about to
  // wait (nothing will be held behind it), nor when more data is queued
  // behind it.
  const bool payload = item.mid == wire::MessageId::kData && item.payload > 0;
  bool ackreq = payload && bcopy.cork && item.payload <= CorkFlagMax() && !bcopy.flush_tail &&
                !tx.dataq.empty() && &item == &tx.dataq.back() &&
                (item.held || PayloadInFlight());
  if (ackreq && bcopy.cork_skip > 0) {
    bcopy.cork_skip--;
    ackreq = false;
  }
  return ackreq;
}

void ConnState::OnPeerAck() {
  if (bcopy.payload_posted &&
      static_cast<int32_t>(credit.peer_ack - bcopy.last_payload_mseq) >= 0) {
    bcopy.payload_posted = false;  // all acknowledged (and no stale comparison later)
  }
  if (bcopy.ackreq_out && static_cast<int32_t>(credit.peer_ack - bcopy.ackreq_mseq) >= 0) {
    bcopy.ackreq_out = false;
    // No send joined a tail held for this acknowledgement: the
    // application is not sending in bursts, and asking costs both sides a
    // message (and the peer's progress thread a wake-up) for nothing. Ask
    // less often, up to once per kCorkMaxSkip flaggable messages; a useful
    // one resets it.
    if (bcopy.ackreq_useful) {
      bcopy.cork_backoff = 0;
    } else {
      bcopy.cork_backoff = std::min(std::max(2 * bcopy.cork_backoff, 4u), kCorkMaxSkip);
      bcopy.cork_skip = bcopy.cork_backoff;
    }
  }
}

}  // namespace zsock::sdp
