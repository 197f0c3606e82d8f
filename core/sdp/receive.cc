// The receive path of an SDP connection (docs/protocol.md): completions of
// every kind, receive buffers and credits, sequencing, and the dispatch of
// each incoming message to its handler. Data, nearly every message of a
// stream, takes a path of its own through Process (bcopy.cc handles it);
// the other messages are decoded whole and go to one handler per message
// id, in the file of their data path.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/log.h"
#include "core/sdp/conn_state.h"
#include "core/sdp/engine.h"
#include "core/status.h"

namespace zsock::sdp {

using wire::MessageId;

void ConnState::PostRx(int buf) {
  if (failure.ep_closed) return;
  uint8_t* p = rx.region.base + static_cast<size_t>(buf) * rx.size;
  auto st = ep->PostRecv(p, rx.size, rx.region.mr.get(), MakeCtx(id, kCtxRx, buf));
  if (!st.ok()) {
    if (shut.peer_wr) return;  // the peer is done; nothing more to receive
    Fail(ResetError(absl::StrCat("posting a receive buffer failed: ", st.message())));
    return;
  }
  rx.posted_flag[buf] = 1;
  rx.posted++;
}

void ConnState::Repost(int buf) {
  if (phase == Phase::kClosed || !failure.error.ok()) return;
  PostRx(buf);
  int owed = Owed();
  int peer_est = credit.last_reported - static_cast<int>(credit.recv_since_report);
  if (owed > 0 && (peer_est <= kCreditReserve + 1 || owed >= rx.count / 2)) {
    credit.update_pending = true;
  }
}

void ConnState::OnCompletion(CtxKind kind, uint32_t index, Completion& c) {
  switch (kind) {
    case kCtxRx: {
      if (index >= static_cast<uint32_t>(rx.count) || !rx.posted_flag[index]) return;
      rx.posted_flag[index] = 0;
      rx.posted--;
      if (!c.status.ok()) {
        if (phase == Phase::kClosed) return;
        if (c.status.code() == absl::StatusCode::kOutOfRange) {
          wire::Header h;
          ProtocolError(Violation(h, "is longer than the private receive buffer"));
        } else {
          Fail(ResetError(absl::StrCat("connection to ", peer_address, " lost: ",
                                       c.status.message())));
        }
        return;
      }
      OnRx(static_cast<int>(index), c.length);
      break;
    }
    case kCtxTx:
      tx.free.push_back(static_cast<int>(index));
      tx.inflight--;
      if (failure.close_when_idle && tx.inflight == 0) CloseEndpoint();
      if (!c.status.ok() && phase != Phase::kClosed) {
        Fail(ResetError(absl::StrCat("send to ", peer_address, " failed: ", c.status.message())));
      }
      break;
    case kCtxHello:
      tx.inflight--;
      if (!c.status.ok()) Fail(ResetError(absl::StrCat("Hello failed: ", c.status.message())));
      break;
    case kCtxRead:
      sink.reads_out--;
      if (!c.status.ok() && sink.read_status.ok()) sink.read_status = c.status;
      break;
    case kCtxWrite:
      source.writes_out--;
      if (!c.status.ok() && source.write_status.ok()) source.write_status = c.status;
      break;
    case kCtxAtomic:
      az.atomics_out--;
      if (!c.status.ok() && az.atomic_status.ok()) az.atomic_status = c.status;
      break;
    case kCtxAzRead:
      AzRxLanded(c.status);
      break;
  }
  TryTransmit();
}

void ConnState::OnRx(int buf, size_t len) {
  if (!failure.error.ok()) return;
  const uint8_t* p = rx.region.base + static_cast<size_t>(buf) * rx.size;
  if (len < wire::kHeaderSize) {
    ProtocolError(MakeError(absl::StatusCode::kInvalidArgument, EPROTO,
                            absl::StrCat("SDP message of ", len, " bytes is shorter than the "
                                         "16-byte base header"),
                            "the peer violates docs/protocol.md; the connection is aborted"));
    return;
  }
  uint32_t mseq;
  std::memcpy(&mseq, p + 8, 4);
  uint32_t ahead = mseq - credit.rx_mseq;
  if (ahead == 0 || ahead > static_cast<uint32_t>(rx.count) || rx.reorder.count(mseq)) {
    wire::Header h;
    h.mid = static_cast<MessageId>(p[0]);
    h.mseq = mseq;
    ProtocolError(
        Violation(h, absl::StrCat("is out of sequence (expected ", credit.rx_mseq + 1, ")")));
    return;
  }
  // Providers may complete receives out of order: process by mseq. The
  // usual case, the next one with nothing parked, skips the map (a node
  // allocation per message).
  if (ahead == 1 && rx.reorder.empty()) {
    Process(buf, len);
    return;
  }
  rx.reorder[mseq] = {buf, len};
  while (failure.error.ok()) {
    auto it = rx.reorder.find(credit.rx_mseq + 1);
    if (it == rx.reorder.end()) break;
    auto [b, l] = it->second;
    rx.reorder.erase(it);
    Process(b, l);
  }
}

void ConnState::Process(int buf, size_t len) {
  const uint8_t* p = rx.region.base + static_cast<size_t>(buf) * rx.size;
  const std::span<const uint8_t> bytes(p, len);
  if (len >= wire::kHeaderSize && p[0] == static_cast<uint8_t>(MessageId::kData)) {
    // Data, nearly every message of a stream, without a wire::Message: its
    // body variant and StatusOr are a measurable part of a small send plus
    // receive (bench/socket_ops_bench).
    wire::Header h;
    if (absl::Status st = wire::DecodeHeader(bytes, wire::Limits{rx.size}, &h); !st.ok()) {
      ProtocolError(std::move(st));
      return;
    }
    ZS_LOG(kTrace, "sdp conn %d rx Data mseq %u flags 0x%x len %u payload %u",
           static_cast<int>(id), h.mseq, h.flags, h.len, h.len - wire::kHeaderSize);
    if (!AcceptHeader(h, nullptr)) return;
    if (h.flags & wire::kFlagAckReq) bcopy.answer_due = true;
    const DataOutcome out = OnData(h, buf, bytes.subspan(wire::kHeaderSize));
    if (out == DataOutcome::kFailed) return;
    if (out == DataOutcome::kRepost) Repost(buf);
    engine->NotifyLocked();
    return;
  }
  ProcessMessage(buf, bytes);
}

namespace {

// The fields of `m` that matter when following a stream (trace log).
std::string TraceBody(const wire::Message& m) {
  if (const auto* a = std::get_if<wire::Advert>(&m.body)) {
    return absl::StrCat(" advert len ", a->length, " stream_pos ", a->stream_pos);
  }
  if (const auto* c = std::get_if<wire::Completed>(&m.body)) {
    return absl::StrCat(" advert ", c->advert, " bytes ", c->bytes);
  }
  if (const auto* r = std::get_if<wire::AdvertRef>(&m.body)) {
    return absl::StrCat(" advert ", r->advert);
  }
  return m.payload.empty() ? std::string() : absl::StrCat(" payload ", m.payload.size());
}

}  // namespace

void ConnState::ProcessMessage(int buf, std::span<const uint8_t> bytes) {
  auto decoded = wire::Decode(bytes, wire::Limits{rx.size});
  if (!decoded.ok()) {
    ProtocolError(decoded.status());
    return;
  }
  wire::Message& m = *decoded;
  const wire::Header& h = m.header;
  ZS_LOG(kTrace, "sdp conn %d rx %s mseq %u flags 0x%x len %u%s", static_cast<int>(id),
         wire::MessageName(h.mid), h.mseq, h.flags, h.len, TraceBody(m));
  const bool hello = h.mid == MessageId::kHello || h.mid == MessageId::kHelloAck;
  if (!AcceptHeader(h, hello ? &m : nullptr)) return;
  if (!Dispatch(m)) return;
  Repost(buf);
  engine->NotifyLocked();
}

bool ConnState::Dispatch(wire::Message& m) {
  const wire::Header& h = m.header;
  switch (h.mid) {
    case MessageId::kHello:
    case MessageId::kHelloAck:
      return true;  // AcceptHeader handed it to OnHello
    case MessageId::kSrcAvail:
      return OnSrcAvail(h, std::get<wire::Advert>(m.body));
    case MessageId::kSinkAvail:
      return OnSinkAvail(h, std::get<wire::Advert>(m.body));
    case MessageId::kRdmaRdCompl:
      return OnRdmaRdCompl(h, std::get<wire::Completed>(m.body));
    case MessageId::kRdmaWrCompl:
      return OnRdmaWrCompl(h, std::get<wire::Completed>(m.body));
    case MessageId::kSrcAvailCancel:
      return OnSrcAvailCancel(h, std::get<wire::AdvertRef>(m.body));
    case MessageId::kSinkAvailCancel:
      return OnSinkAvailCancel(h, std::get<wire::AdvertRef>(m.body));
    case MessageId::kSinkCancelAck:
      return OnSinkCancelAck(h, std::get<wire::AdvertRef>(m.body));
    case MessageId::kModeChange:
      return OnModeChange(std::get<wire::ModeChange>(m.body));
    case MessageId::kDisconnReq:
      return OnDisconnReq(h);
    case MessageId::kAbortConn:
      return OnAbortConn(std::get<wire::Abort>(m.body));
    case MessageId::kSendSm:  // refused by the decoder
    case MessageId::kData:    // took Process's own path
      break;
  }
  return OnUnhandled(h);
}

bool ConnState::AcceptHeader(const wire::Header& h, const wire::Message* hello) {
  credit.rx_mseq = h.mseq;
  stats.messages_received++;
  credit.recv_since_report++;
  if (hello != nullptr) {
    OnHello(*hello);
    if (!failure.error.ok()) return false;
  } else if (phase != Phase::kOpen) {
    ProtocolError(Violation(h, "arrived before the Hello exchange finished"));
    return false;
  }
  // Credits (docs/protocol.md): bufs is absolute, relative to mseq_ack.
  if (static_cast<int32_t>(h.mseq_ack - credit.peer_ack) < 0 ||
      static_cast<int32_t>(credit.tx_mseq - h.mseq_ack) < 0) {
    ProtocolError(Violation(h, absl::StrCat("acknowledges mseq ", h.mseq_ack, " outside [",
                                            credit.peer_ack, ", ", credit.tx_mseq, "]")));
    return false;
  }
  if (h.bufs > peer.max_bufs) {
    ProtocolError(Violation(h, absl::StrCat("grants ", h.bufs, " buffers; the peer announced at "
                                            "most ", peer.max_bufs)));
    return false;
  }
  if (static_cast<int>(h.bufs) < static_cast<int>(credit.tx_mseq - h.mseq_ack)) {
    ProtocolError(Violation(h, absl::StrCat("grants ", h.bufs, " buffers while ",
                                            credit.tx_mseq - h.mseq_ack,
                                            " messages are unacknowledged (negative credit)")));
    return false;
  }
  credit.peer_ack = h.mseq_ack;
  credit.peer_bufs = h.bufs;
  OnPeerAck();
  if (Credits() > kCreditReserve) credit.stalled = false;
  return true;
}

}  // namespace zsock::sdp
