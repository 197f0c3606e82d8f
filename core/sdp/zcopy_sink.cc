// ZCopy, the sink side (docs/protocol.md, "SrcAvail", "SinkAvail"): the
// peer's SrcAvails (synchronous, asynchronous or pulled) join the receive
// stream, and Recv RDMA-reads them into the caller's buffer, reporting
// each read (RdmaRdCompl) or asking for bcopy when a read fails (SendSmall);
// a large Recv with nothing queued announces its buffer (SinkAvail) and
// waits for the source's write (RdmaWrCompl), cancelling it at the
// deadline (SinkAvailCancel, answered by SinkCancelAck). The handlers of
// the messages a sink receives are here.
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

bool ConnState::OnSrcAvail(const wire::Header& h, wire::Advert& a) {
  if (!SrcAvailFlagsValid(h, a)) return false;
  if (h.flags & wire::kFlagAzUpdate) return OnAzUpdate(h, a);
  const bool pulled = h.flags & wire::kFlagPull;
  const bool az_msg = h.flags != 0 && !pulled;
  if (!(my_caps & wire::kCapRdmaRead)) {
    ProtocolError(Violation(h, "arrived although this side did not offer RDMA read"));
    return false;
  }
  if (shut.peer_wr) {
    ProtocolError(Violation(h, "arrived after DisconnReq"));
    return false;
  }
  if (!SrcAvailPositionValid(h, a, pulled, az_msg)) return false;
  VoidSinkAvail();
  if (!pulled) sink.last_src_advert = h.mseq;  // (pulled adverts are never cancelled)
  RxSeg s;
  s.kind = RxSeg::kSrcAvail;
  s.pulled = pulled;
  s.len = a.length;
  s.advert = h.mseq;
  s.addr = a.addr;
  s.key = std::move(a.key);
  s.stream_pos = a.stream_pos;
  if (az_msg) {
    s.slot = a.az_slot;
    s.gen = az.sink_gen[a.az_slot];
  }
  if (shut.rd) {
    // Discarded: AZ and pulled adverts count as delivered (their source
    // cannot resend in order), others are resent as Data and dropped.
    if (az_msg || pulled) {
      rx.pos += s.len;
      AzSinkDone(s);
    }
    QueueCtl(wire::Message{{MessageId::kRdmaRdCompl, wire::kFlagSendSmall},
                           wire::Completed{h.mseq, 0}});
    return true;
  }
  rx.queue.push_back(std::move(s));
  return true;
}

bool ConnState::SrcAvailFlagsValid(const wire::Header& h, const wire::Advert& a) {
  const bool pulled = h.flags & wire::kFlagPull;
  if (pulled && (h.flags != wire::kFlagPull || a.az_slot != wire::kNoSlot || !pull.offered)) {
    ProtocolError(Violation(h, pull.offered ? "mixes the Pull flag with AZ-SDP fields"
                                            : "is flagged Pull, which this side did not offer"));
    return false;
  }
  const bool az_msg = h.flags != 0 && !pulled;
  if ((az_msg || a.az_slot != wire::kNoSlot) && !az.table) {
    ProtocolError(Violation(h, "uses AZ-SDP fields, which were not negotiated"));
    return false;
  }
  if (az_msg && (!(h.flags & wire::kFlagAzAsync) || a.az_slot >= az.table_slots)) {
    ProtocolError(Violation(h, absl::StrCat("names lock word ", a.az_slot, " of ",
                                            az.table_slots, " or lacks the AzAsync flag")));
    return false;
  }
  if (!az_msg && a.az_slot != wire::kNoSlot) {
    ProtocolError(Violation(h, "names a lock word without the AzAsync flag"));
    return false;
  }
  return true;
}

bool ConnState::SrcAvailPositionValid(const wire::Header& h, const wire::Advert& a, bool pulled,
                                      bool az_msg) {
  // Stream position: everything received plus what outstanding
  // SrcAvails announced.
  uint64_t announced = rx.pos;
  uint32_t outstanding = 0, outstanding_pulled = 0;
  for (const RxSeg& s : rx.queue) {
    if (s.kind != RxSeg::kSrcAvail) continue;
    (s.pulled ? outstanding_pulled : outstanding)++;
    announced += s.len - s.off;
    if (az_msg && s.slot == a.az_slot) {
      ProtocolError(Violation(h, absl::StrCat("reuses lock word ", a.az_slot,
                                              " of outstanding SrcAvail ", s.advert)));
      return false;
    }
  }
  if (pulled ? outstanding_pulled >= kPullMaxAdverts : outstanding >= MyMaxAdverts()) {
    ProtocolError(Violation(h, absl::StrCat("exceeds the ",
                                            pulled ? kPullMaxAdverts : MyMaxAdverts(),
                                            pulled ? " outstanding pulled" : " outstanding",
                                            " SrcAvails this side accepts")));
    return false;
  }
  if (a.stream_pos != announced) {
    ProtocolError(Violation(h, absl::StrCat("claims stream position ", a.stream_pos,
                                            "; this side received ", announced)));
    return false;
  }
  return true;
}

bool ConnState::OnRdmaWrCompl(const wire::Header& h, const wire::Completed& c) {
  ZcopySinkState::SinkAvail& adv = sink.advert;
  if (!adv.active || !adv.posted || adv.resolved || c.advert != adv.id) {
    ProtocolError(Violation(h, absl::StrCat("names SinkAvail ", c.advert,
                                            ", which is not outstanding")));
    return false;
  }
  if (c.bytes > adv.len) {
    ProtocolError(Violation(h, absl::StrCat("reports ", c.bytes, " bytes written into a ",
                                            adv.len, "-byte SinkAvail")));
    return false;
  }
  adv.written = c.bytes;
  adv.resolved = true;
  rx.pos += c.bytes;
  return true;
}

bool ConnState::OnSrcAvailCancel(const wire::Header& h, const wire::AdvertRef& r) {
  stats.cancels_received++;
  if (r.advert != sink.last_src_advert) {
    ProtocolError(Violation(h, absl::StrCat("cancels SrcAvail ", r.advert,
                                            ", not the last one received")));
    return false;
  }
  bool deferred = false;
  for (auto it = rx.queue.begin(); it != rx.queue.end(); ++it) {
    if (it->kind == RxSeg::kSrcAvail && it->advert == r.advert) {
      if (it->reading) {
        it->cancel_requested = true;  // Recv answers after its read
        deferred = true;
      } else {
        rx.queue.erase(it);
      }
      break;
    }
  }
  if (!deferred) {
    QueueCtl(wire::Message{{MessageId::kRdmaRdCompl, wire::kFlagCancelReply},
                           wire::Completed{r.advert, 0}});
  }
  return true;
}

bool ConnState::OnSinkCancelAck(const wire::Header& h, const wire::AdvertRef& r) {
  if (sink.acks_due.empty() || sink.acks_due.front() != r.advert) {
    ProtocolError(Violation(h, absl::StrCat("acknowledges SinkAvail ", r.advert,
                                            ", which was not cancelled")));
    return false;
  }
  sink.acks_due.pop_front();
  if (sink.advert.active && sink.advert.id == r.advert && !sink.advert.resolved) {
    sink.advert.resolved = true;
    sink.advert.written = 0;
  }
  return true;
}

void ConnState::VoidSinkAvail() {
  if (!sink.advert.active || sink.advert.resolved) return;
  if (!sink.advert.posted) Withdraw(tx.ctlq, MessageId::kSinkAvail);  // still queued here
  sink.advert.resolved = true;
  sink.advert.written = 0;
  stats.sinkavail_void++;
}

// ---------------------------------------------------------------- Recv steps

SegStep ConnState::RecvFromSrcAvail(RecvCall& call, size_t si, size_t start, size_t avail) {
  RxSeg& s = rx.queue[si];
  // An earlier receive that returned early must land before the next
  // read (its RdmaRdCompl goes first).
  if (az.rx.active) {
    engine->WaitLocked([&] { return !az.rx.active || !failure.error.ok(); },
                       absl::InfiniteFuture());
    if (!failure.error.ok()) return call.EndSeg(failure.error);
    return SegStep::kRestart;
  }
  // AZ-SDP SrcAvail: lock its word before the first read, unless the
  // source moved the data to a copy (then its AzUpdate comes).
  if (s.slot != wire::kNoSlot && !s.locked && !s.moved) {
    if (SegStep r = LockAzAdvert(call, s); r != SegStep::kPass) return r;
  }
  // AZ-SDP receive side: whole pages of a large, page-aligned buffer
  // are returned at once and land behind the application's back.
  if (s.slot != wire::kNoSlot && !call.peek && !call.waitall && opt.mode == Mode::kAz &&
      opt.az_early_recv) {
    if (SegStep r = RecvEarly(call, si, s, avail); r != SegStep::kPass) return r;
  }
  // SrcAvail: RDMA-read into the caller's buffer.
  const size_t k = std::min({avail, call.cur.space(), call.max_rma});
  const uint32_t advert = s.advert;
  const absl::Status st = ReadSrcAvail(s, start, call.cur.ptr(), k);
  // The deque may have grown; find the segment again (it is the
  // first SrcAvail: only one is outstanding).
  size_t idx = 0;
  while (idx < rx.queue.size() &&
         !(rx.queue[idx].kind == RxSeg::kSrcAvail && rx.queue[idx].advert == advert)) {
    ++idx;
  }
  if (idx == rx.queue.size()) return call.EndSeg(failure.error);
  RxSeg& sp = rx.queue[idx];
  sp.reading = false;
  if (!failure.error.ok()) return call.EndSeg(failure.error);
  if (!st.ok()) return SrcAvailReadFailed(call, idx, st);
  call.Took(k);
  if (call.peek) {
    if (sp.cancel_requested) {
      QueueCtl(wire::Message{{MessageId::kRdmaRdCompl, wire::kFlagCancelReply},
                             wire::Completed{advert, 0}});
      rx.queue.erase(rx.queue.begin() + idx);
      TryTransmit();
      return SegStep::kStop;
    }
    return k == avail ? SegStep::kNextSeg : SegStep::kSameSeg;
  }
  sp.off += k;
  rx.pos += k;
  (sp.pulled ? stats.bytes_recv_pull : stats.bytes_recv_srcavail) += k;
  if (sp.off == sp.len) AzSinkDone(sp);  // before the completion leaves
  uint8_t fl = sp.cancel_requested ? wire::kFlagCancelReply : 0;
  QueueCtl(wire::Message{{MessageId::kRdmaRdCompl, fl},
                         wire::Completed{advert, static_cast<uint32_t>(k)}});
  if (sp.off == sp.len || sp.cancel_requested) rx.queue.erase(rx.queue.begin() + idx);
  TryTransmit();
  return SegStep::kRestart;
}

absl::Status ConnState::ReadSrcAvail(RxSeg& s, size_t start, uint8_t* dest, size_t k) {
  Fabric* fabric = ep->fabric();
  std::shared_ptr<MemoryRegion> mr;
  absl::Status st;
  if (fabric->caps().registration_required) {
    auto r = fabric->rcache().Get(dest, k, kLocalWrite);
    if (r.ok()) {
      mr = *r;
    } else {
      st = r.status();
    }
  }
  if (st.ok() && failure.ep_closed) st = failure.error;
  if (!st.ok()) return st;
  s.reading = true;
  sink.read_status = absl::OkStatus();
  st = ep->Read(dest, k, mr.get(), s.addr + start, s.key, MakeCtx(id, kCtxRead, 0));
  if (!st.ok()) return st;
  sink.reads_out++;
  // The buffer is in use until the read completes: no deadline.
  engine->WaitLocked([&] { return sink.reads_out == 0; }, absl::InfiniteFuture());
  return sink.read_status;
}

SegStep ConnState::SrcAvailReadFailed(RecvCall& call, size_t idx, const absl::Status& st) {
  RxSeg& sp = rx.queue[idx];
  const uint32_t advert = sp.advert;
  if (sp.slot != wire::kNoSlot || sp.pulled) {
    // An asynchronous advert cannot be resent by copy in stream order.
    // (A dead peer is the usual cause; a live one released the memory.)
    PostAbort(ECONNRESET);
    Fail(ResetError(absl::StrCat(
        "RDMA read of ", sp.pulled ? "pulled" : "asynchronous", " SrcAvail ", advert,
        sp.pulled ? " failed: "
                  : " failed (an azcopy sender must not unmap a buffer it sent): ",
        st.message())));
    return call.EndSeg(failure.error);
  }
  // The source sends the rest by BCopy (RdmaRdCompl + SendSmall).
  ZS_LOG(kInfo, "sdp: RDMA read of SrcAvail %u failed (%s); asking for bcopy", advert,
         st.ToString().c_str());
  stats.rdma_fallbacks++;
  uint8_t fl = sp.cancel_requested ? wire::kFlagCancelReply : wire::kFlagSendSmall;
  QueueCtl(wire::Message{{MessageId::kRdmaRdCompl, fl}, wire::Completed{advert, 0}});
  rx.queue.erase(rx.queue.begin() + idx);
  TryTransmit();
  return SegStep::kStop;
}

Step ConnState::RecvIntoSinkAvail(RecvCall& call) {
  const size_t L = std::min(call.cur.space(), kMaxAdvert);
  auto r = ep->fabric()->rcache().Get(call.cur.ptr(), L, kRemoteWrite | kLocalWrite);
  if (!r.ok()) return Step::kPass;
  wire::Advert a;
  a.addr = reinterpret_cast<uint64_t>(call.cur.ptr());
  a.length = static_cast<uint32_t>(L);
  a.stream_pos = rx.pos;
  a.key = (*r)->remote_key();
  a.key_bytes = a.key.Serialize();
  sink.advert = {};
  sink.advert.active = true;
  sink.advert.len = static_cast<uint32_t>(L);
  sink.advert.mr = *r;
  QueueCtl(wire::Message{{MessageId::kSinkAvail}, a});
  stats.sinkavail_sent++;
  TryTransmit();
  bool resolved = engine->WaitLocked(
      [&] { return sink.advert.resolved || !failure.error.ok() || shut.rd; }, call.deadline);
  if (!resolved && !sink.advert.posted) {
    Withdraw(tx.ctlq, MessageId::kSinkAvail);
    sink.advert = {};
    stats.sinkavail_sent--;
    return call.End(TimedOut());
  }
  if (!resolved) {
    // Deadline or SHUT_RD: cancel, then wait for the source's answer
    // (its write, a void by data, or the ack) before giving the
    // buffer back.
    sink.advert.cancel_sent = true;
    sink.acks_due.push_back(sink.advert.id);
    stats.sinkavail_cancels++;
    QueueCtl(wire::Message{{MessageId::kSinkAvailCancel}, wire::AdvertRef{sink.advert.id}});
    TryTransmit();
    engine->WaitLocked([&] { return sink.advert.resolved || !failure.error.ok(); },
                       absl::InfiniteFuture());
  }
  // Bytes the source reported written are in the buffer even if the
  // connection failed afterwards (e.g. the peer closed right after
  // its RdmaWrCompl and DisconnReq): deliver them, as bcopy data
  // already received is delivered.
  size_t w = sink.advert.written;
  sink.advert = {};
  if (w > 0) {
    stats.bytes_recv_sinkavail += w;
    call.Took(w);
  }
  if (!resolved && w == 0 && failure.error.ok() && rx.queue.empty()) {
    return call.End(TimedOut());
  }
  return Step::kNext;
}

}  // namespace zsock::sdp
