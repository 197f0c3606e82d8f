// ZCopy, the source side (docs/protocol.md, "SrcAvail", "SinkAvail"): a
// large send announces the caller's buffer in a SrcAvail and waits until
// the sink has RDMA-read it (RdmaRdCompl), cancelling it at the deadline
// (SrcAvailCancel); a SinkAvail from the peer, valid while nothing sent
// before it is still on its way, takes the next bytes by RDMA write
// (RdmaWrCompl). The handlers of the messages a source receives are here.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/log.h"
#include "core/rcache.h"
#include "core/sdp/calls.h"
#include "core/sdp/conn_state.h"
#include "core/sdp/engine.h"

namespace zsock::sdp {

using wire::MessageId;

// ---------------------------------------------------------------- handlers

bool ConnState::OnSinkAvail(const wire::Header& h, wire::Advert& a) {
  if (a.az_slot != wire::kNoSlot) {
    ProtocolError(Violation(h, "uses AZ-SDP fields, which were not negotiated"));
    return false;
  }
  if (!(my_caps & wire::kCapRdmaWrite)) {
    ProtocolError(Violation(h, "arrived although this side did not offer RDMA write"));
    return false;
  }
  if (source.peer_sink.valid) {
    ProtocolError(Violation(h, "arrived while the previous SinkAvail is unresolved"));
    return false;
  }
  source.last_sink_advert = h.mseq;
  stats.sinkavail_received++;
  // Valid only if nothing this side sent is still on its way to the sink
  // and no SrcAvail is outstanding; otherwise void (the sink sees data
  // first and knows).
  if (a.stream_pos == tx.pos && !(source.advert.active && !source.advert.finished) &&
      az.src.empty() && !shut.wr) {
    ZcopySourceState::PeerSinkAvail& in = source.peer_sink;
    in.valid = true;
    in.writing = false;
    in.cancel_requested = false;
    in.id = h.mseq;
    in.len = a.length;
    in.addr = a.addr;
    in.key = std::move(a.key);
  } else if (a.stream_pos > tx.pos) {
    ProtocolError(Violation(h, absl::StrCat("claims stream position ", a.stream_pos,
                                            " beyond the ", tx.pos, " bytes sent")));
    return false;
  }
  return true;
}

bool ConnState::OnRdmaRdCompl(const wire::Header& h, const wire::Completed& c) {
  size_t azi = 0;
  while (azi < az.src.size() && !(az.src[azi].posted && az.src[azi].id == c.advert)) ++azi;
  if (azi < az.src.size()) return OnAzRdmaRdCompl(h, c, azi);
  ZcopySourceState::SrcAvail& src = source.advert;
  if (!src.active || !src.posted || src.finished || c.advert != src.id) {
    ProtocolError(Violation(h, absl::StrCat("names SrcAvail ", c.advert,
                                            ", which is not outstanding")));
    return false;
  }
  if (c.bytes > src.len - src.done) {
    ProtocolError(Violation(h, absl::StrCat("reports ", c.bytes, " bytes; only ",
                                            src.len - src.done, " remain")));
    return false;
  }
  if ((h.flags & wire::kFlagCancelReply) && !src.cancel_sent) {
    ProtocolError(Violation(h, "answers a cancel that was never sent"));
    return false;
  }
  src.done += c.bytes;
  tx.pos += c.bytes;  // here, not in Send: a SinkAvail may follow at once
  if (h.flags & wire::kFlagSendSmall) src.send_small = true;
  if (src.cancel_sent) {
    if (h.flags & wire::kFlagCancelReply) src.finished = true;
  } else if (src.done == src.len || src.send_small) {
    src.finished = true;
  }
  return true;
}

bool ConnState::OnSinkAvailCancel(const wire::Header& h, const wire::AdvertRef& r) {
  stats.cancels_received++;
  if (r.advert != source.last_sink_advert) {
    ProtocolError(Violation(h, absl::StrCat("cancels SinkAvail ", r.advert,
                                            ", not the last one received")));
    return false;
  }
  ZcopySourceState::PeerSinkAvail& in = source.peer_sink;
  if (in.valid && in.id == r.advert && in.writing) {
    in.cancel_requested = true;  // Send acks after its RdmaWrCompl
  } else {
    if (in.valid && in.id == r.advert) in.valid = false;
    QueueData(wire::Message{{MessageId::kSinkCancelAck}, wire::AdvertRef{r.advert}});
  }
  return true;
}

// ---------------------------------------------------------------- Send steps

Step ConnState::SendToPeerSink(SendCall& call) {
  const uint8_t* q = call.q();
  const size_t rem = call.rem();
  const size_t k = std::min<size_t>(rem, source.peer_sink.len);
  std::shared_ptr<MemoryRegion> mr;
  if (ep->fabric()->caps().registration_required) {
    auto r = ep->fabric()->rcache().Get(const_cast<uint8_t*>(q), k, kLocalRead);
    if (!r.ok()) return call.End(r.status());
    mr = *r;
  }
  const absl::Status st = WritePeerSink(q, k, mr.get());
  const uint32_t sid = source.peer_sink.id;
  if (!failure.error.ok()) return call.End(failure.error);
  if (!st.ok()) {
    // The sink's registration went away (its memory was released or
    // the key refused): void the SinkAvail by sending these bytes as
    // Data, which the sink copies over whatever the failed write
    // left in the same place (docs/protocol.md, "SinkAvail").
    ZS_LOG(kInfo, "sdp: RDMA write into SinkAvail %u failed (%s); sending by bcopy", sid,
           st.ToString().c_str());
    bool cancel = source.peer_sink.cancel_requested;
    stats.rdma_fallbacks++;
    source.peer_sink.valid = false;
    size_t a = AppendData(q, std::min(rem, tx.size - wire::kHeaderSize));
    if (cancel) QueueData(wire::Message{{MessageId::kSinkCancelAck}, wire::AdvertRef{sid}});
    call.Took(a);
    TryTransmit();
    return Step::kNext;
  }
  QueueData(wire::Message{{MessageId::kRdmaWrCompl},
                          wire::Completed{sid, static_cast<uint32_t>(k)}});
  if (source.peer_sink.cancel_requested) {
    QueueData(wire::Message{{MessageId::kSinkCancelAck}, wire::AdvertRef{sid}});
  }
  source.peer_sink.valid = false;
  tx.pos += k;
  stats.bytes_sent_sinkavail += k;
  call.Took(k);
  TryTransmit();
  return Step::kNext;
}

absl::Status ConnState::WritePeerSink(const uint8_t* q, size_t k, MemoryRegion* mr) {
  // The whole SinkAvail (or all that is left to send) is written, in
  // writes of at most max_rma_size bytes (64 KiB where one-sided
  // operations are emulated), then reported by one RdmaWrCompl.
  const size_t max_rma = ep->fabric()->caps().max_rma_size;
  source.peer_sink.writing = true;
  absl::Status st;
  for (size_t done = 0; done < k && st.ok() && failure.error.ok();) {
    const size_t chunk = max_rma > 0 ? std::min(k - done, max_rma) : k - done;
    source.write_status = absl::OkStatus();
    st = ep->Write(q + done, chunk, mr, source.peer_sink.addr + done, source.peer_sink.key,
                   MakeCtx(id, kCtxWrite, 0));
    if (st.ok()) {
      source.writes_out++;
      engine->WaitLocked([&] { return source.writes_out == 0; }, absl::InfiniteFuture());
      st = source.write_status;
    }
    done += chunk;
  }
  source.peer_sink.writing = false;
  return st;
}

Step ConnState::SendSrcAvail(SendCall& call) {
  const uint8_t* q = call.q();
  const size_t L = std::min(call.rem(), kMaxAdvert);
  auto r = ep->fabric()->rcache().Get(const_cast<uint8_t*>(q), L, kRemoteRead | kLocalRead);
  if (!r.ok()) {
    ZS_LOG(kDebug, "sdp: registration for zero-copy failed (%s); using bcopy",
           r.status().ToString().c_str());
    call.force_bcopy = L;
    return Step::kPass;
  }
  wire::Advert a;
  a.addr = reinterpret_cast<uint64_t>(q);
  a.length = static_cast<uint32_t>(L);
  a.stream_pos = TxCommitted();
  a.key = (*r)->remote_key();
  a.key_bytes = a.key.Serialize();
  source.advert = {};
  source.advert.active = true;
  source.advert.len = static_cast<uint32_t>(L);
  source.advert.mr = *r;
  QueueData(wire::Message{{MessageId::kSrcAvail}, a});
  stats.srcavail_sent++;
  TryTransmit();
  if (!AwaitSrcAvail(call.deadline)) {
    source.advert = {};
    return call.End(TimedOut());
  }
  const size_t got = source.advert.done;
  const bool small = source.advert.send_small;
  const bool cancelled = source.advert.cancel_sent;
  source.advert = {};
  stats.bytes_sent_srcavail += got;
  call.Took(got);
  if (!failure.error.ok()) return call.End(failure.error);
  if (cancelled && got < L) return call.End(TimedOut());
  if (small) {
    stats.sendsmall++;
    call.force_bcopy = L - got;
  }
  return Step::kNext;
}

bool ConnState::AwaitSrcAvail(const Deadline& deadline) {
  if (engine->WaitLocked([&] { return source.advert.finished; }, deadline)) return true;
  if (!source.advert.posted) {
    Withdraw(tx.dataq, MessageId::kSrcAvail);  // never left
    return false;
  }
  source.advert.cancel_sent = true;
  stats.srcavail_cancels++;
  QueueCtl(wire::Message{{MessageId::kSrcAvailCancel}, wire::AdvertRef{source.advert.id}});
  TryTransmit();
  engine->WaitLocked([&] { return source.advert.finished; }, absl::InfiniteFuture());
  return true;
}

}  // namespace zsock::sdp
