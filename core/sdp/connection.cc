// The SDP connection protocol (docs/protocol.md): handshake, credits,
// BCopy with coalescing, ZCopy by SrcAvail/RDMA read and SinkAvail/RDMA
// write, cancels, half-close and abort. Everything here runs with the
// engine's mutex held; blocking waits go through Engine::WaitLocked, which
// releases it.
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/copy.h"
#include "core/log.h"
#include "core/mutex.h"
#include "core/rcache.h"
#include "core/sdp/conn_state.h"
#include "core/sdp/engine.h"
#include "core/sockaddr.h"
#include "core/status.h"

namespace zsock::sdp {

using wire::MessageId;

// ---------------------------------------------------------------- options

ConnectionOptions ConnectionOptions::FromConfig() {
  ConnectionOptions o;
  const auto& config = Config::Global();
  if (config.ok()) {
    const std::string mode = config->GetString("mode");
    o.mode = mode == "azcopy" ? Mode::kAz : mode == "zcopy" ? Mode::kZcopy : Mode::kBcopy;
    o.zcopy_threshold = static_cast<size_t>(config->GetInt("zcopy_threshold"));
    o.pull_threshold = static_cast<size_t>(config->GetInt("pull_threshold"));
    o.az_policy = config->GetString("az_policy") == "block" ? AzPolicy::kBlock : AzPolicy::kCopy;
    o.az_adverts = static_cast<uint32_t>(config->GetInt("az_adverts"));
    o.az_fault_limit = static_cast<uint32_t>(config->GetInt("az_fault_limit"));
    o.az_early_recv = config->GetBool("az_early_recv");
    o.autocork = config->GetBool("autocork");
  }
  return o;
}

// ---------------------------------------------------------------- Region

Region::~Region() {
  mr.reset();
  if (base != nullptr) ::munmap(base, len);
}

absl::Status Region::Allocate(Fabric* fabric, size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return ErrnoError(errno, absl::StrCat("cannot map ", bytes, " bytes of SDP private buffers"),
                      "lower the connection's rcvbuf/sndbuf/buf_size");
  }
  base = static_cast<uint8_t*>(p);
  len = bytes;
  if (fabric->caps().registration_required) {
    auto r = fabric->RegisterMemory(base, len, kLocalRead | kLocalWrite);
    if (!r.ok()) return r.status();
    mr = std::move(*r);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- errors

absl::Status ResetError(absl::string_view what) {
  return MakeError(absl::StatusCode::kAborted, ECONNRESET, what,
                   "the peer reset the connection, closed it or died; reconnect");
}

absl::Status PipeError() {
  return MakeError(absl::StatusCode::kFailedPrecondition, EPIPE,
                   "send after the connection was shut down for writing",
                   "do not send after Shutdown(SHUT_WR) or Close()");
}

absl::Status WouldBlock() {
  return MakeError(absl::StatusCode::kUnavailable, EAGAIN, "the operation would block",
                   "wait for readiness or call without MSG_DONTWAIT");
}

absl::Status TimedOut() {
  return MakeError(absl::StatusCode::kDeadlineExceeded, EAGAIN,
                   "the deadline passed before any byte moved",
                   "give a later deadline or wait for readiness");
}

absl::Status Closed() {
  return MakeError(absl::StatusCode::kFailedPrecondition, EBADF, "the connection is closed",
                   "do not use a Connection after Close()");
}

absl::Status Violation(const wire::Header& h, absl::string_view why) {
  return MakeError(absl::StatusCode::kInvalidArgument, EPROTO,
                   absl::StrCat("SDP ", wire::MessageName(h.mid), " (mseq ", h.mseq, ") ", why),
                   "the peer violates docs/protocol.md (version 1); the connection is aborted");
}

// ---------------------------------------------------------------- setup

absl::Status ConnState::Init() {
  rx.size = std::clamp<size_t>(opt.buf_size, wire::kMinBufSize, wire::kMaxBufSize);
  rx.count = static_cast<int>(std::clamp<size_t>(opt.rcvbuf / rx.size, wire::kMinBufs + 2,
                                                 wire::kMaxBufs));
  if (auto st = rx.region.Allocate(ep->fabric(), rx.size * rx.count); !st.ok()) return st;
  rx.posted_flag.assign(rx.count, 0);
  tx.inject_max = ep->fabric()->caps().inject_size;
  const EndpointInfo& info = ep->info();
  local_address = info.local_address;
  peer_address = info.peer_address;
  if (info.rdma_read != Support::kNone) my_caps |= wire::kCapRdmaRead;
  if (info.rdma_write != Support::kNone) my_caps |= wire::kCapRdmaWrite;
  if (auto st = SetUpAz(); !st.ok()) return st;
  SetUpPull();
  for (int i = 0; i < rx.count; ++i) {
    PostRx(i);
    if (!failure.error.ok()) return failure.error;
  }
  if (active) {
    // The Hello goes before the peer's buffer size is known: from its own
    // small region, on the implicit first credit (docs/protocol.md).
    if (auto st = tx.hello.Allocate(ep->fabric(), 4096); !st.ok()) return st;
    wire::Message m;
    m.header.mid = MessageId::kHello;
    m.header.bufs = static_cast<uint16_t>(rx.posted);
    m.header.mseq = ++credit.tx_mseq;
    wire::Hello h;
    h.caps = my_caps;
    h.buf_size = static_cast<uint32_t>(rx.size);
    h.max_bufs = static_cast<uint16_t>(rx.count);
    h.mode = opt.mode;
    if (!opt.local_sockaddr.empty()) {
      h.extensions.push_back({wire::kExtSocketAddress, opt.local_sockaddr});
    }
    h.extensions.push_back({wire::kExtAckReq, ""});  // every 1.1 engine answers AckReq
    AddAzHello(h);
    AddPullHello(h);
    m.body = h;
    size_t n = wire::Encode(m, std::span<uint8_t>(tx.hello.base, tx.hello.len));
    credit.last_reported = rx.posted;
    auto st = ep->Send(tx.hello.base, n, tx.hello.mr.get(), MakeCtx(id, kCtxHello, 0));
    if (!st.ok()) return st;
    tx.inflight++;
    stats.messages_sent++;
  }
  return absl::OkStatus();
}

absl::Status ConnState::SetUpTx() {
  tx.size = std::min<size_t>(peer.buf_size, size_t{1} << 20);
  size_t data_slots = std::clamp<size_t>(opt.sndbuf / tx.size, 4, 1024);
  size_t count = data_slots + kCtlSlots;
  if (auto st = tx.region.Allocate(ep->fabric(), tx.size * count); !st.ok()) return st;
  for (size_t i = count; i-- > 0;) tx.free.push_back(static_cast<int>(i));
  return absl::OkStatus();
}

// ---------------------------------------------------------------- failure

void ConnState::Fail(absl::Status why) {
  if (!failure.error.ok()) return;
  failure.error = std::move(why);
  ZS_LOG(kInfo, "sdp connection %d to %s failed: %s", static_cast<int>(id), peer_address.c_str(),
         failure.error.ToString().c_str());
  // Operations that wait for the peer finish now.
  if (source.advert.active) source.advert.finished = true;
  if (sink.advert.active) sink.advert.resolved = true;
  // Asynchronous sends are lost with the connection, as queued data is:
  // their buffers become writable again.
  AzReleaseAll();
  // Release the endpoint (once what is in flight, e.g. an AbortConn, has
  // left): a peer whose provider has not noticed the failure then sees the
  // connection end instead of waiting on it forever. Everything the peer
  // sent before a receive failed has been delivered by then (provider
  // contract), and nothing more is wanted from a reset connection.
  CloseEndpointWhenIdle();
  engine->NotifyLocked();
}

bool ConnState::PostAbort(uint32_t reason) {
  if (tx.region.base == nullptr || tx.free.empty() || Credits() < 1) return false;
  wire::Message m;
  m.header.mid = MessageId::kAbortConn;
  m.body = wire::Abort{reason};
  TxItem item;
  item.mid = MessageId::kAbortConn;
  item.encoded = wire::EncodeToString(m);
  return PostItem(item);
}

void ConnState::CloseEndpoint() {
  if (failure.ep_closed) return;
  failure.ep_closed = true;
  ep->Close();
}

void ConnState::CloseEndpointWhenIdle() {
  if (tx.inflight == 0) {
    CloseEndpoint();
  } else {
    failure.close_when_idle = true;
  }
}

void ConnState::ProtocolError(absl::Status why) {
  if (!failure.error.ok()) return;
  ZS_LOG(kError, "sdp connection to %s aborted: %s", peer_address.c_str(),
         why.ToString().c_str());
  engine->stats_.protocol_aborts++;
  PostAbort(EPROTO);
  Fail(MakeError(absl::StatusCode::kAborted, EPROTO,
                 absl::StrCat("connection aborted: ", why.message()),
                 "the peer sent a malformed or unexpected message; reconnect"));
  // A reset connection is dead: release the endpoint once the AbortConn has
  // left, so a peer that does not read it still sees the connection end.
  CloseEndpointWhenIdle();
}

// ---------------------------------------------------------------- receive

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
    ProtocolError(Violation(h, absl::StrCat("is out of sequence (expected ", credit.rx_mseq + 1, ")")));
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

// The fields of `m` that matter when following a stream (trace log).
static std::string TraceBody(const wire::Message& m) {
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

void ConnState::VoidSinkAvail() {
  if (!sink.advert.active || sink.advert.resolved) return;
  if (!sink.advert.posted) {
    // Still queued here: withdraw it.
    for (auto it = tx.ctlq.begin(); it != tx.ctlq.end(); ++it) {
      if (it->mid == MessageId::kSinkAvail) {
        tx.ctlq.erase(it);
        break;
      }
    }
  }
  sink.advert.resolved = true;
  sink.advert.written = 0;
  stats.sinkavail_void++;
}

void ConnState::Process(int buf, size_t len) {
  const uint8_t* p = rx.region.base + static_cast<size_t>(buf) * rx.size;
  const std::span<const uint8_t> bytes(p, len);
  if (len >= wire::kHeaderSize && p[0] == static_cast<uint8_t>(MessageId::kData)) {
    // Data, nearly every message of a stream, without a wire::Message: its
    // body variant and StatusOr cost a twentieth of a small send plus
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

  bool repost = true;
  switch (h.mid) {  // every message but Data, which took the path above
    case MessageId::kHello:
    case MessageId::kHelloAck:
      break;
    case MessageId::kSrcAvail: {
      auto& a = std::get<wire::Advert>(m.body);
      const bool pulled = h.flags & wire::kFlagPull;
      if (pulled && (h.flags != wire::kFlagPull || a.az_slot != wire::kNoSlot || !pull.offered)) {
        ProtocolError(Violation(h, pull.offered ? "mixes the Pull flag with AZ-SDP fields"
                                                : "is flagged Pull, which this side did not offer"));
        return;
      }
      const bool az_msg = h.flags != 0 && !pulled;
      if ((az_msg || a.az_slot != wire::kNoSlot) && !az.table) {
        ProtocolError(Violation(h, "uses AZ-SDP fields, which were not negotiated"));
        return;
      }
      if (az_msg && (!(h.flags & wire::kFlagAzAsync) || a.az_slot >= az.table_slots)) {
        ProtocolError(Violation(h, absl::StrCat("names lock word ", a.az_slot, " of ",
                                                az.table_slots, " or lacks the AzAsync flag")));
        return;
      }
      if (!az_msg && a.az_slot != wire::kNoSlot) {
        ProtocolError(Violation(h, "names a lock word without the AzAsync flag"));
        return;
      }
      if (h.flags & wire::kFlagAzUpdate) {
        // Copy-on-write: the source won the lock word and moved the data.
        RxSeg* seg = nullptr;
        for (RxSeg& x : rx.queue) {
          if (x.kind == RxSeg::kSrcAvail && x.slot == a.az_slot) seg = &x;
        }
        if (seg == nullptr) {
          if (shut.rd) break;  // dropped unread (DropReceived)
          ProtocolError(Violation(h, absl::StrCat("updates lock word ", a.az_slot,
                                                  ", which no outstanding SrcAvail uses")));
          return;
        }
        if (seg->locked || seg->moved || a.length != seg->len ||
            a.stream_pos != seg->stream_pos) {
          ProtocolError(Violation(h, absl::StrCat("updates SrcAvail ", seg->advert,
                                                  " which this side locked, or changes its "
                                                  "length or position")));
          return;
        }
        seg->addr = a.addr;
        seg->key = std::move(a.key);
        seg->moved = true;
        break;
      }
      if (!(my_caps & wire::kCapRdmaRead)) {
        ProtocolError(Violation(h, "arrived although this side did not offer RDMA read"));
        return;
      }
      if (shut.peer_wr) {
        ProtocolError(Violation(h, "arrived after DisconnReq"));
        return;
      }
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
          return;
        }
      }
      if (pulled ? outstanding_pulled >= kPullMaxAdverts : outstanding >= MyMaxAdverts()) {
        ProtocolError(Violation(h, absl::StrCat("exceeds the ",
                                                pulled ? kPullMaxAdverts : MyMaxAdverts(),
                                                pulled ? " outstanding pulled" : " outstanding",
                                                " SrcAvails this side accepts")));
        return;
      }
      if (a.stream_pos != announced) {
        ProtocolError(Violation(h, absl::StrCat("claims stream position ", a.stream_pos,
                                                "; this side received ", announced)));
        return;
      }
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
        break;
      }
      rx.queue.push_back(std::move(s));
      break;
    }
    case MessageId::kSinkAvail: {
      auto& a = std::get<wire::Advert>(m.body);
      if (a.az_slot != wire::kNoSlot) {
        ProtocolError(Violation(h, "uses AZ-SDP fields, which were not negotiated"));
        return;
      }
      if (!(my_caps & wire::kCapRdmaWrite)) {
        ProtocolError(Violation(h, "arrived although this side did not offer RDMA write"));
        return;
      }
      if (source.peer_sink.valid) {
        ProtocolError(Violation(h, "arrived while the previous SinkAvail is unresolved"));
        return;
      }
      source.last_sink_advert = h.mseq;
      stats.sinkavail_received++;
      // Valid only if nothing this side sent is still on its way to the sink
      // and no SrcAvail is outstanding; otherwise void (the sink sees data
      // first and knows).
      if (a.stream_pos == tx.pos && !(source.advert.active && !source.advert.finished) && az.src.empty() &&
          !shut.wr) {
        source.peer_sink.valid = true;
        source.peer_sink.writing = false;
        source.peer_sink.cancel_requested = false;
        source.peer_sink.id = h.mseq;
        source.peer_sink.len = a.length;
        source.peer_sink.addr = a.addr;
        source.peer_sink.key = std::move(a.key);
      } else if (a.stream_pos > tx.pos) {
        ProtocolError(Violation(h, absl::StrCat("claims stream position ", a.stream_pos,
                                                " beyond the ", tx.pos, " bytes sent")));
        return;
      }
      break;
    }
    case MessageId::kRdmaRdCompl: {
      auto c = std::get<wire::Completed>(m.body);
      size_t azi = 0;
      while (azi < az.src.size() && !(az.src[azi].posted && az.src[azi].id == c.advert)) ++azi;
      if (azi < az.src.size()) {
        AzSrcAvail& s = az.src[azi];
        if (c.bytes > s.len - s.done || (h.flags & wire::kFlagCancelReply)) {
          ProtocolError(Violation(h, absl::StrCat("reports ", c.bytes, " bytes of asynchronous "
                                                  "SrcAvail ", c.advert, " (", s.len - s.done,
                                                  " remain) or answers a cancel never sent")));
          return;
        }
        // SendSmall on an asynchronous or pulled advert: the sink discarded
        // it (SHUT_RD).
        uint32_t k = (h.flags & wire::kFlagSendSmall) ? s.len - s.done : c.bytes;
        s.done += k;
        tx.pos += k;
        (s.pull ? stats.bytes_sent_pull : stats.bytes_sent_srcavail) += k;
        if (s.done == s.len) AzFinish(azi);
        break;
      }
      if (!source.advert.active || !source.advert.posted || source.advert.finished || c.advert != source.advert.id) {
        ProtocolError(Violation(h, absl::StrCat("names SrcAvail ", c.advert,
                                                ", which is not outstanding")));
        return;
      }
      if (c.bytes > source.advert.len - source.advert.done) {
        ProtocolError(Violation(h, absl::StrCat("reports ", c.bytes, " bytes; only ",
                                                source.advert.len - source.advert.done, " remain")));
        return;
      }
      if ((h.flags & wire::kFlagCancelReply) && !source.advert.cancel_sent) {
        ProtocolError(Violation(h, "answers a cancel that was never sent"));
        return;
      }
      source.advert.done += c.bytes;
      tx.pos += c.bytes;  // here, not in Send: a SinkAvail may follow at once
      if (h.flags & wire::kFlagSendSmall) source.advert.send_small = true;
      if (source.advert.cancel_sent) {
        if (h.flags & wire::kFlagCancelReply) source.advert.finished = true;
      } else if (source.advert.done == source.advert.len || source.advert.send_small) {
        source.advert.finished = true;
      }
      break;
    }
    case MessageId::kRdmaWrCompl: {
      auto c = std::get<wire::Completed>(m.body);
      if (!sink.advert.active || !sink.advert.posted || sink.advert.resolved || c.advert != sink.advert.id) {
        ProtocolError(Violation(h, absl::StrCat("names SinkAvail ", c.advert,
                                                ", which is not outstanding")));
        return;
      }
      if (c.bytes > sink.advert.len) {
        ProtocolError(Violation(h, absl::StrCat("reports ", c.bytes, " bytes written into a ",
                                                sink.advert.len, "-byte SinkAvail")));
        return;
      }
      sink.advert.written = c.bytes;
      sink.advert.resolved = true;
      rx.pos += c.bytes;
      break;
    }
    case MessageId::kSrcAvailCancel: {
      auto r = std::get<wire::AdvertRef>(m.body);
      stats.cancels_received++;
      if (r.advert != sink.last_src_advert) {
        ProtocolError(Violation(h, absl::StrCat("cancels SrcAvail ", r.advert,
                                                ", not the last one received")));
        return;
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
      break;
    }
    case MessageId::kSinkAvailCancel: {
      auto r = std::get<wire::AdvertRef>(m.body);
      stats.cancels_received++;
      if (r.advert != source.last_sink_advert) {
        ProtocolError(Violation(h, absl::StrCat("cancels SinkAvail ", r.advert,
                                                ", not the last one received")));
        return;
      }
      if (source.peer_sink.valid && source.peer_sink.id == r.advert && source.peer_sink.writing) {
        source.peer_sink.cancel_requested = true;  // Send acks after its RdmaWrCompl
      } else {
        if (source.peer_sink.valid && source.peer_sink.id == r.advert) source.peer_sink.valid = false;
        QueueData(wire::Message{{MessageId::kSinkCancelAck}, wire::AdvertRef{r.advert}});
      }
      break;
    }
    case MessageId::kSinkCancelAck: {
      auto r = std::get<wire::AdvertRef>(m.body);
      if (sink.acks_due.empty() || sink.acks_due.front() != r.advert) {
        ProtocolError(Violation(h, absl::StrCat("acknowledges SinkAvail ", r.advert,
                                                ", which was not cancelled")));
        return;
      }
      sink.acks_due.pop_front();
      if (sink.advert.active && sink.advert.id == r.advert && !sink.advert.resolved) {
        sink.advert.resolved = true;
        sink.advert.written = 0;
      }
      break;
    }
    case MessageId::kModeChange:
      peer.mode = std::get<wire::ModeChange>(m.body).mode;
      break;
    case MessageId::kDisconnReq:
      if (shut.peer_wr) {
        ProtocolError(Violation(h, "repeats DisconnReq"));
        return;
      }
      shut.peer_wr = true;
      VoidSinkAvail();
      credit.update_pending = true;  // acknowledges it at once (Close waits for that)
      break;
    case MessageId::kAbortConn: {
      uint32_t reason = std::get<wire::Abort>(m.body).reason;
      failure.peer_aborted = true;
      Fail(ResetError(absl::StrCat("connection reset by the peer (AbortConn",
                                   reason ? absl::StrCat(", reason errno ", reason) : "", ")")));
      return;
    }
    default:
      ProtocolError(Violation(h, "is not handled by this version"));
      return;
  }
  if (repost) Repost(buf);
  engine->NotifyLocked();
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
    ProtocolError(Violation(h, absl::StrCat("acknowledges mseq ", h.mseq_ack,
                                            " outside [", credit.peer_ack, ", ", credit.tx_mseq, "]")));
    return false;
  }
  if (h.bufs > peer.max_bufs) {
    ProtocolError(Violation(h, absl::StrCat("grants ", h.bufs, " buffers; the peer announced at "
                                            "most ", peer.max_bufs)));
    return false;
  }
  if (static_cast<int>(h.bufs) < static_cast<int>(credit.tx_mseq - h.mseq_ack)) {
    ProtocolError(Violation(h, absl::StrCat("grants ", h.bufs, " buffers while ",
                                            credit.tx_mseq - h.mseq_ack, " messages are unacknowledged "
                                            "(negative credit)")));
    return false;
  }
  credit.peer_ack = h.mseq_ack;
  credit.peer_bufs = h.bufs;
  if (bcopy.payload_posted && static_cast<int32_t>(credit.peer_ack - bcopy.last_payload_mseq) >= 0) {
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
  if (Credits() > kCreditReserve) credit.stalled = false;
  return true;
}

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

void ConnState::OnHello(const wire::Message& m) {
  const wire::Header& h = m.header;
  bool expected = phase == Phase::kHandshake &&
                  (active ? h.mid == MessageId::kHelloAck : h.mid == MessageId::kHello);
  if (!expected) {
    ProtocolError(Violation(h, "is unexpected at this point of the connection"));
    return;
  }
  peer = std::get<wire::Hello>(m.body);
  for (const auto& e : peer.extensions) {
    if (e.type == wire::kExtAckReq) bcopy.peer_answers = true;
    if (e.type != wire::kExtSocketAddress) continue;
    if (auto a = ParseSocketAddress(e.value); a.ok()) {
      peer_sockaddr = a->ToString();
    } else {
      ZS_LOG(kInfo, "sdp peer %s announced an unparseable socket address; ignored",
             peer_address.c_str());
    }
  }
  AcceptPeerAz();
  if (!failure.error.ok()) return;
  AcceptPeerPull();
  if (!failure.error.ok()) return;
  UpdateCork();
  if (auto st = SetUpTx(); !st.ok()) {
    Fail(st);
    return;
  }
  phase = Phase::kOpen;
  if (!active) {
    wire::Hello ack;
    ack.caps = my_caps;
    ack.buf_size = static_cast<uint32_t>(rx.size);
    ack.max_bufs = static_cast<uint16_t>(rx.count);
    ack.mode = opt.mode;
    if (!opt.local_sockaddr.empty()) {
      ack.extensions.push_back({wire::kExtSocketAddress, opt.local_sockaddr});
    }
    ack.extensions.push_back({wire::kExtAckReq, ""});
    AddAzHello(ack);
    AddPullHello(ack);
    // The Hello's buffer is reposted after this message is built: count it.
    QueueCtl(wire::Message{{MessageId::kHelloAck}, ack});
  }
}

// ---------------------------------------------------------------- transmit

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
  const bool payload = item.mid == MessageId::kData && item.payload > 0;
  // Autocork: a small Data sent while earlier data is unacknowledged, or
  // one that was held, asks for an acknowledgement; until it comes, the
  // next small tail waits (HoldTail).
  // Not when it goes because the application is about to wait (nothing
  // will be held behind it), nor when more data is queued behind it.
  bool ackreq = payload && bcopy.cork && item.payload <= CorkFlagMax() && !bcopy.flush_tail &&
                !tx.dataq.empty() && &item == &tx.dataq.back() && (item.held || PayloadInFlight());
  if (ackreq && bcopy.cork_skip > 0) {
    bcopy.cork_skip--;
    ackreq = false;
  }
  if (ackreq) flags |= wire::kFlagAckReq;
  wire::Header h;
  h.mid = item.mid;
  h.flags = flags;
  h.bufs = static_cast<uint16_t>(Reportable());
  h.len = static_cast<uint32_t>(len);
  h.mseq = ++credit.tx_mseq;
  h.mseq_ack = credit.rx_mseq;
  wire::EncodeHeader(h, p);
  if (item.az_serial != 0) {
    if (AzSrcAvail* s = FindAz(item.az_serial)) {
      s->id = h.mseq;
      s->posted = true;
    }
  } else if (item.mid == MessageId::kSrcAvail && !(flags & wire::kFlagAzUpdate)) {
    source.advert.id = h.mseq;
    source.advert.posted = true;
  } else if (item.mid == MessageId::kSinkAvail) {
    sink.advert.id = h.mseq;
    sink.advert.posted = true;
  } else if (item.mid == MessageId::kDisconnReq) {
    shut.wr_mseq = h.mseq;
  }
  // Small Data messages are injected: no completion to reap and dispatch
  // for each, and the slot is free at once. Close still waits for them (the
  // peer acknowledges its DisconnReq after them); other messages keep their
  // completion (an AbortConn must leave before the endpoint closes,
  // CloseEndpointWhenIdle).
  const bool inject = item.mid == MessageId::kData && len <= tx.inject_max;
  auto st = ep->Send(p, len, tx.region.mr.get(), inject ? kInjectContext : MakeCtx(id, kCtxTx, slot));
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
  credit.last_reported = Reportable();
  credit.recv_since_report = 0;
  credit.update_pending = false;
  bcopy.answer_due = false;  // mseq_ack = rx_mseq covers every message processed
  if (payload) {
    bcopy.payload_posted = true;
    bcopy.last_payload_mseq = h.mseq;
    if (&item == &tx.dataq.back()) bcopy.flush_tail = false;  // everything queued at the flush left
  }
  if (ackreq) {
    bcopy.ackreq_out = true;
    bcopy.ackreq_mseq = h.mseq;
    bcopy.ackreq_useful = false;
    stats.ack_requests++;
  }
  stats.messages_sent++;
  if (item.mid == MessageId::kData) {
    bcopy.queued_bytes -= item.payload;
    if (item.payload == 0) stats.credit_updates_sent++;
  }
  return true;
}

void ConnState::TryTransmit() {
  if (phase != Phase::kOpen || !failure.error.ok() || tx.held) return;
  for (;;) {
    int credits = Credits();
    int owed = Owed();
    if (!tx.ctlq.empty() || !tx.dataq.empty()) {
      bool from_ctl = !tx.ctlq.empty();
      TxItem& item = from_ctl ? tx.ctlq.front() : tx.dataq.front();
      bool data = item.mid == MessageId::kData && item.payload > 0;
      int need = data ? kCreditReserve + 1 : 1;
      bool can = credits >= need && !(credits == 1 && owed <= 0) &&
                 (item.slot >= 0 || !tx.free.empty());
      if (can && data && !from_ctl && HoldTail(item)) {
        if (!item.held) stats.autocork_holds++;
        item.held = true;
        can = false;
      }
      if (can) {
        if (opt.test_hold && !opt.test_hold(item.mid)) {
          tx.held = true;
          return;
        }
        if (!PostItem(item)) return;
        if (from_ctl) {
          tx.ctlq.pop_front();
        } else {
          tx.dataq.pop_front();
        }
        engine->NotifyLocked();
        continue;
      }
      if (data && credits < need && !credit.stalled) {
        credit.stalled = true;
        stats.credit_stalls++;
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

bool ConnState::CanPostSmall(std::span<const iovec> iov) const {
  if (phase != Phase::kOpen || !tx.ctlq.empty() || !tx.dataq.empty() || source.peer_sink.valid ||
      Credits() < kCreditReserve + 1 || tx.free.size() <= kCtlSlots) {
    return false;
  }
  return IovBytes(iov) <
         std::min(tx.size - wire::kHeaderSize, std::max<size_t>(opt.zcopy_threshold, 1));
}

void ConnState::SetAutocork(bool on) {
  opt.autocork = on;
  UpdateCork();
  if (!bcopy.cork) FlushTail();
}

bool ConnState::HoldTail(const TxItem& item) const {
  if (!bcopy.cork || !bcopy.ackreq_out || static_cast<int32_t>(credit.peer_ack - bcopy.ackreq_mseq) >= 0) return false;
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

void ConnState::FlushTail() {
  // Whatever is queued now goes without holding, including a tail that
  // only waits for credits yet (it must not be held once they come).
  if (tx.dataq.empty()) return;
  bcopy.flush_tail = true;
  TryTransmit();
}

void ConnState::UpdateCork() {
  bcopy.cork = opt.autocork && bcopy.peer_answers && engine->has_progress_thread();
}

bool ConnState::CanAppend() const {
  if (!tx.dataq.empty()) {
    const TxItem& tail = tx.dataq.back();
    if (tail.mid == MessageId::kData && tail.slot >= 0 &&
        tail.payload < tx.size - wire::kHeaderSize) {
      return true;
    }
  }
  return bcopy.queued_bytes < opt.sndbuf && tx.free.size() > kCtlSlots;
}

size_t ConnState::AppendData(const uint8_t* p, size_t n) {
  size_t total = 0;
  bool coalesced = false;
  while (n > 0) {
    TxItem* tail = nullptr;
    if (!tx.dataq.empty() && tx.dataq.back().mid == MessageId::kData && tx.dataq.back().slot >= 0 &&
        tx.dataq.back().payload < tx.size - wire::kHeaderSize) {
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
    if (source.peer_sink.valid && !source.peer_sink.writing) source.peer_sink.valid = false;  // void by data
  }
  return total;
}

void ConnState::QueueShutdownWr() {
  if (shut.wr) return;
  shut.wr = true;
  if (source.peer_sink.valid && !source.peer_sink.writing) source.peer_sink.valid = false;
  QueueData(wire::Message{{MessageId::kDisconnReq}, wire::Empty{}});
  TryTransmit();
}

void ConnState::DropReceived() {
  while (!rx.queue.empty() && !rx.queue.front().reading) {
    RxSeg& s = rx.queue.front();
    if (s.kind == RxSeg::kData) {
      Repost(s.buf);
    } else {
      if (s.slot != wire::kNoSlot || s.pulled) {
        rx.pos += s.len - s.off;
        AzSinkDone(s);
      }
      QueueCtl(wire::Message{{MessageId::kRdmaRdCompl, wire::kFlagSendSmall},
                             wire::Completed{s.advert, 0}});
    }
    rx.queue.pop_front();
  }
  TryTransmit();
}

uint32_t ConnState::ReadinessNow() const {
  uint32_t r = 0;
  if (!failure.error.ok()) r |= kError | kReadable | kWritable | kHup;
  if (!rx.queue.empty() || shut.peer_wr || shut.rd) r |= kReadable;
  if (shut.peer_wr) r |= kRdHup;
  if (phase == Phase::kOpen && !shut.wr && (CanAppend() || source.peer_sink.valid)) r |= kWritable;
  if (shut.peer_wr && shut.wr) r |= kHup;
  return r;
}

// ---------------------------------------------------------------- Connection

namespace {

// MSG_DONTWAIT's deadline, an lvalue so that `dontwait ? kNoWait :
// deadline` refers to the caller's Deadline instead of copying it (a copy
// would start a relative timeout afresh).
const Deadline kNoWait{absl::InfinitePast()};

// A Send or Recv in progress on a connection, from the first engine lock
// taken on it to the last one released (a scope inside the lock): Close
// lets such calls leave before the state goes.
class CallScope {
 public:
  explicit CallScope(ConnState* c) : c_(c) { ++c_->calls.active; }
  ~CallScope() { c_->LeaveCall(); }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  ConnState* c_;
};

// Walks an iovec array.
struct IovCursor {
  std::span<const iovec> iov;
  size_t i = 0, off = 0;
  explicit IovCursor(std::span<const iovec> v) : iov(v) { Skip(); }
  void Skip() {
    while (i < iov.size() && off >= iov[i].iov_len) {
      ++i;
      off = 0;
    }
  }
  bool done() const { return i >= iov.size(); }
  uint8_t* ptr() const { return static_cast<uint8_t*>(iov[i].iov_base) + off; }
  size_t space() const { return iov[i].iov_len - off; }
  void Advance(size_t n) {
    off += n;
    Skip();
  }
};

}  // namespace

void ConnState::LeaveCall() {
  if (--calls.active == 0 && calls.closing) engine->NotifyLocked();
}

Connection::~Connection() {
  if (state_ != nullptr) (void)Close();
}

absl::StatusOr<size_t> Connection::Send(const void* buf, size_t len, int flags,
                                        Deadline deadline) {
  iovec v{const_cast<void*>(buf), len};
  return Send(std::span<const iovec>(&v, 1), flags, deadline);
}

absl::StatusOr<size_t> Connection::Recv(void* buf, size_t len, int flags, Deadline deadline) {
  iovec v{buf, len};
  return Recv(std::span<const iovec>(&v, 1), flags, deadline);
}

absl::StatusOr<size_t> Connection::Send(std::span<const iovec> iov, int flags,
                                        Deadline deadline) {
  if (StateUnlocked() == nullptr) return Closed();
  Engine* e = engine_;
  // A buffer whose receive is still landing (AZ-SDP az_early_recv) is
  // unreadable: wait for it before any lock is held (echo servers do this).
  for (const iovec& v : iov) az::Guard::Get().WaitReadable(v.iov_base, v.iov_len);
  absl::StatusOr<size_t> result;
  // Readiness changes found on the way (the entry's progress, waits) are
  // reported on every return, once the lock is released.
  absl::Cleanup callbacks = [e] { e->RunCallbacks(); };
  {
    MutexLock lock(&e->mu_);
    ConnState* c = state_;
    if (c == nullptr) return Closed();  // closed by another thread meanwhile
    CallScope in_call(c);
    // What arrived while the application was away: credits, the peer's
    // SinkAvail, AZ-SDP completions. Not needed by a small send that can
    // be posted at once (nothing queued ahead, credits and a slot free):
    // the poll would cost it as much as the send itself.
    // Autocork: while a tail is held, a burst of small sends fills it and
    // polls only every kCorkPollEvery sends; while an acknowledgement
    // request is out and nothing is held, poll first: an answer already
    // here lets this send go at once (and the request counts as one no
    // send waited for).
    bool poll;
    if (c->tx.ctlq.empty() && c->HeldBytes() > 0 && IovBytes(iov) <= c->CorkFlagMax()) {
      c->bcopy.ackreq_useful = true;  // a send joins a held tail: the request pays
      poll = ++c->tx.dataq.front().appends % kCorkPollEvery == 0;
    } else {
      poll = c->bcopy.ackreq_out || !c->CanPostSmall(iov);
    }
    if (poll) e->ProgressLocked();
    bool dontwait = flags & MSG_DONTWAIT;
    if (!e->WaitLocked([&] { return !c->calls.send_busy; }, dontwait ? kNoWait : deadline)) {
      return dontwait ? WouldBlock() : TimedOut();
    }
    c->calls.send_busy = true;
    absl::Cleanup done = [&] {
      c->calls.send_busy = false;
      e->NoteReadinessLocked(c);
      e->NotifyLocked();
    };
    size_t total = 0;
    auto partial = [&](absl::Status st) -> absl::StatusOr<size_t> {
      if (total > 0) return total;
      return st;
    };
    if (!c->failure.error.ok()) return c->failure.error;
    if (c->shut.wr) return PipeError();
    if (c->phase != ConnState::Phase::kOpen) return Closed();
    const size_t threshold = std::max<size_t>(c->opt.zcopy_threshold, 1);
    for (const iovec& v : iov) {
      const uint8_t* p = static_cast<const uint8_t*>(v.iov_base);
      size_t n = v.iov_len, off = 0, force_bcopy = 0;
      bool az_sync = false;  // AZ-SDP could not protect this piece: send it synchronously
      while (off < n) {
        if (!c->failure.error.ok()) return partial(c->failure.error);
        const uint8_t* q = p + off;
        size_t rem = n - off;
        // A valid SinkAvail from the peer takes the next bytes.
        if (c->source.peer_sink.valid && !dontwait) {
          // The whole SinkAvail (or all that is left to send) is written,
          // in writes of at most max_rma_size bytes (64 KiB where one-sided
          // operations are emulated), then reported by one RdmaWrCompl.
          const size_t max_rma = c->ep->fabric()->caps().max_rma_size;
          const size_t k = std::min<size_t>(rem, c->source.peer_sink.len);
          std::shared_ptr<MemoryRegion> mr;
          if (c->ep->fabric()->caps().registration_required) {
            auto r = c->ep->fabric()->rcache().Get(const_cast<uint8_t*>(q), k, kLocalRead);
            if (!r.ok()) return partial(r.status());
            mr = *r;
          }
          c->source.peer_sink.writing = true;
          absl::Status st;
          for (size_t done = 0; done < k && st.ok() && c->failure.error.ok();) {
            const size_t chunk = max_rma > 0 ? std::min(k - done, max_rma) : k - done;
            c->source.write_status = absl::OkStatus();
            st = c->ep->Write(q + done, chunk, mr.get(), c->source.peer_sink.addr + done, c->source.peer_sink.key,
                              MakeCtx(c->id, kCtxWrite, 0));
            if (st.ok()) {
              c->source.writes_out++;
              e->WaitLocked([&] { return c->source.writes_out == 0; }, absl::InfiniteFuture());
              st = c->source.write_status;
            }
            done += chunk;
          }
          c->source.peer_sink.writing = false;
          uint32_t sid = c->source.peer_sink.id;
          if (!c->failure.error.ok()) return partial(c->failure.error);
          if (!st.ok()) {
            // The sink's registration went away (its memory was released or
            // the key refused): void the SinkAvail by sending these bytes as
            // Data, which the sink copies over whatever the failed write
            // left in the same place (docs/protocol.md, "SinkAvail").
            ZS_LOG(kInfo, "sdp: RDMA write into SinkAvail %u failed (%s); sending by bcopy", sid,
                   st.ToString().c_str());
            bool cancel = c->source.peer_sink.cancel_requested;
            c->stats.rdma_fallbacks++;
            c->source.peer_sink.valid = false;
            size_t a = c->AppendData(q, std::min(rem, c->tx.size - wire::kHeaderSize));
            if (cancel) {
              c->QueueData(wire::Message{{MessageId::kSinkCancelAck}, wire::AdvertRef{sid}});
            }
            off += a;
            total += a;
            c->TryTransmit();
            continue;
          }
          c->QueueData(wire::Message{{MessageId::kRdmaWrCompl},
                                     wire::Completed{sid, static_cast<uint32_t>(k)}});
          if (c->source.peer_sink.cancel_requested) {
            c->QueueData(wire::Message{{MessageId::kSinkCancelAck}, wire::AdvertRef{sid}});
          }
          c->source.peer_sink.valid = false;
          c->tx.pos += k;
          c->stats.bytes_sent_sinkavail += k;
          off += k;
          total += k;
          c->TryTransmit();
          continue;
        }
        // AZ-SDP: protect the page-aligned middle, announce it, go on; the
        // unaligned head and tail go by bcopy (seed 003, 4.4.2).
        if (force_bcopy == 0 && c->az.enabled && c->opt.mode == Mode::kAz && rem >= threshold &&
            !az_sync) {
          const uintptr_t page = az::PageSize();
          const uintptr_t a = reinterpret_cast<uintptr_t>(q);
          const uintptr_t first = (a + page - 1) / page * page;
          const uintptr_t last = (a + std::min(rem, kMaxAdvert)) / page * page;
          if (last > first && last - first >= std::min<size_t>(threshold, 4 * page)) {
            if (first > a) {
              force_bcopy = first - a;
              c->stats.az_hybrid_bcopy += first - a;
            } else if (c->AzOut() >= c->AzLimit()) {
              c->TryTransmit();
              if (dontwait) return partial(WouldBlock());
              if (!e->WaitLocked([&] { return !c->failure.error.ok() || c->AzOut() < c->AzLimit(); },
                                 deadline)) {
                return partial(TimedOut());
              }
              continue;
            } else {
              const size_t L = last - first;
              auto r = c->ep->fabric()->rcache().Get(const_cast<uint8_t*>(q), L,
                                                     kRemoteRead | kLocalRead);
              const uint32_t serial = c->NextAzSerial();
              absl::StatusOr<int> g = -1;
              if (r.ok()) {
                e->az_used_.store(true, std::memory_order_relaxed);
                g = az::Guard::Get().Protect(first, L, e->fault_client(),
                                             (c->id << 32) | serial);
              } else {
                g = r.status();
              }
              if (!g.ok()) {
                ZS_LOG(kDebug, "sdp: AZ-SDP cannot protect the buffer (%s); sending it by zcopy",
                       g.status().ToString().c_str());
                c->stats.az_unprotectable++;
                az_sync = true;
                continue;
              }
              AzSrcAvail as;
              as.serial = serial;
              as.slot = 0;
              while (c->az.slot_busy[as.slot]) as.slot++;
              as.gen = c->az.src_gen[as.slot];
              as.len = static_cast<uint32_t>(L);
              as.addr = first;
              as.stream_pos = c->TxCommitted();
              as.guard = *g;
              as.mr = *r;
              c->az.slot_busy[as.slot] = 1;
              TxItem item;
              item.mid = MessageId::kSrcAvail;
              item.az_serial = serial;
              item.encoded = wire::EncodeToString(c->AzAdvert(as, wire::kFlagAzAsync));
              c->az.src.push_back(std::move(as));
              c->tx.dataq.push_back(std::move(item));
              c->stats.az_srcavail_sent++;
              c->stats.az_bytes += L;
              c->TryTransmit();
              off += L;
              total += L;
              continue;
            }
          } else {
            force_bcopy = rem;  // no whole page: all by bcopy
            c->stats.az_hybrid_bcopy += rem;
          }
        }
        az_sync = false;
        if (force_bcopy == 0 && (c->opt.mode == Mode::kZcopy || c->opt.mode == Mode::kAz) &&
            rem >= threshold && (c->peer.caps & wire::kCapRdmaRead) && !dontwait) {
          size_t L = std::min(rem, kMaxAdvert);
          auto r = c->ep->fabric()->rcache().Get(const_cast<uint8_t*>(q), L,
                                                 kRemoteRead | kLocalRead);
          if (r.ok()) {
            wire::Advert a;
            a.addr = reinterpret_cast<uint64_t>(q);
            a.length = static_cast<uint32_t>(L);
            a.stream_pos = c->TxCommitted();
            a.key = (*r)->remote_key();
            a.key_bytes = a.key.Serialize();
            c->source.advert = {};
            c->source.advert.active = true;
            c->source.advert.len = static_cast<uint32_t>(L);
            c->source.advert.mr = *r;
            c->QueueData(wire::Message{{MessageId::kSrcAvail}, a});
            c->stats.srcavail_sent++;
            c->TryTransmit();
            bool finished = e->WaitLocked([&] { return c->source.advert.finished; }, deadline);
            if (!finished && !c->source.advert.posted) {
              // Never left: withdraw it.
              for (auto it = c->tx.dataq.begin(); it != c->tx.dataq.end(); ++it) {
                if (it->mid == MessageId::kSrcAvail) {
                  c->tx.dataq.erase(it);
                  break;
                }
              }
              c->source.advert = {};
              return partial(TimedOut());
            }
            if (!finished) {
              c->source.advert.cancel_sent = true;
              c->stats.srcavail_cancels++;
              c->QueueCtl(wire::Message{{MessageId::kSrcAvailCancel},
                                        wire::AdvertRef{c->source.advert.id}});
              c->TryTransmit();
              e->WaitLocked([&] { return c->source.advert.finished; }, absl::InfiniteFuture());
            }
            size_t got = c->source.advert.done;
            bool small = c->source.advert.send_small;
            bool cancelled = c->source.advert.cancel_sent;
            c->source.advert = {};
            c->stats.bytes_sent_srcavail += got;
            off += got;
            total += got;
            if (!c->failure.error.ok()) return partial(c->failure.error);
            if (cancelled && got < L) return partial(TimedOut());
            if (small) {
              c->stats.sendsmall++;
              force_bcopy = L - got;
            }
            continue;
          }
          ZS_LOG(kDebug, "sdp: registration for zero-copy failed (%s); using bcopy",
                 r.status().ToString().c_str());
          force_bcopy = L;
        }
        // Pulled bcopy: one copy into our pull buffer; the peer reads it
        // straight into its application's buffer (pull.cc).
        // A non-blocking send that finds the pull buffer full goes by bcopy
        // below, as far as the send slots take it: readiness (CanAppend)
        // promised that much.
        size_t pull_at = 0, room = 0;
        if (force_bcopy == 0 && c->PullWanted(rem) && c->EnsurePullBuffer() &&
            ((room = c->PullRoom(rem, &pull_at)) > 0 || !dontwait)) {
          if (room > 0) {
            c->QueuePull(q, room, pull_at);
            off += room;
            total += room;
            continue;
          }
          c->TryTransmit();
          if (!e->WaitLocked([&] { return !c->failure.error.ok() || c->PullRoom(rem, &pull_at) > 0; },
                             deadline)) {
            return partial(TimedOut());
          }
          continue;
        }
        size_t want = force_bcopy ? std::min(rem, force_bcopy) : rem;
        size_t k = c->AppendData(q, want);
        if (k > 0) {
          off += k;
          total += k;
          if (force_bcopy) force_bcopy -= k;
          c->TryTransmit();
          continue;
        }
        c->TryTransmit();
        if (dontwait) return partial(WouldBlock());
        if (!e->WaitLocked([&] { return !c->failure.error.ok() || c->CanAppend() || c->source.peer_sink.valid; },
                           deadline)) {
          return partial(TimedOut());
        }
      }
    }
    result = total;
    ZS_LOG(kTrace, "sdp conn %d send -> %zu", static_cast<int>(c->id), total);
  }
  return result;
}

absl::StatusOr<size_t> Connection::Recv(std::span<const iovec> iov, int flags,
                                        Deadline deadline) {
  if (StateUnlocked() == nullptr) return Closed();
  Engine* e = engine_;
  // A buffer this process is still sending from (AZ-SDP) is read-only, and
  // must be settled (copy-on-write, or a wait for the pull) before anything
  // is written into it. Not before there is something to write, though: a
  // request/response peer pulls our data before it answers, so its
  // RdmaRdCompl comes ahead of its reply and usually frees the buffer at no
  // cost (settling at once made every 1 MiB azcopy ping-pong copy 1 MiB
  // aside). So wait, making progress, until the buffer is writable or the
  // stream has something for it; settle then, without the engine lock (the
  // fault path takes it).
  const auto send_protected = [&iov] {
    for (const iovec& v : iov) {
      if (az::Guard::Get().Overlaps(v.iov_base, v.iov_len)) return true;
    }
    return false;
  };
  if (send_protected()) {
    bool receivable;
    bool has_bytes;
    bool block_policy;
    {
      MutexLock lock(&e->mu_);
      ConnState* c = state_;
      if (c == nullptr) return Closed();
      CallScope in_call(c);
      block_policy = c->opt.az_policy == AzPolicy::kBlock;
      e->ProgressLocked();
      const auto ready = [&] {
        return !c->rx.queue.empty() || c->shut.peer_wr || !c->failure.error.ok() || c->shut.rd;
      };
      e->WaitLocked([&] { return !send_protected() || ready(); },
                    (flags & MSG_DONTWAIT) ? kNoWait : deadline);
      receivable = ready();
      // With only an end of stream, a reset or SHUT_RD to report, nothing
      // will be written into the buffer (and no bytes can follow those).
      has_bytes = !c->rx.queue.empty();
    }
    e->RunCallbacks();
    if (send_protected() && (!receivable || has_bytes)) {
      if (!receivable) return (flags & MSG_DONTWAIT) ? WouldBlock() : TimedOut();
      // Block-on-write settles by waiting for the peer's pull, which a
      // non-blocking call must not do: try again later (each retry makes
      // progress; an event loop sees the socket readable and spins until
      // the pull completes). Copy-on-write settles at once, or waits only
      // for a pull the peer has already started. (The receiving
      // connection's policy decides here; the fault path uses the policy of
      // the connection sending the buffer, which differs only when the two
      // were given different ConnectionOptions.)
      if ((flags & MSG_DONTWAIT) && block_policy) return WouldBlock();
      for (const iovec& v : iov) {
        if (az::Guard::Get().Overlaps(v.iov_base, v.iov_len)) {
          az::Guard::Get().WaitWritable(v.iov_base, v.iov_len);
        }
      }
    }
  }
  absl::StatusOr<size_t> result;
  absl::Cleanup callbacks = [e] { e->RunCallbacks(); };  // as in Send
  {
    MutexLock lock(&e->mu_);
    ConnState* c = state_;
    if (c == nullptr) return Closed();  // closed by another thread meanwhile
    CallScope in_call(c);
    // Bytes already queued came before anything the CQ holds: with some at
    // the head, copy them without polling (waits below still progress).
    if (c->rx.queue.empty() || c->rx.queue.front().kind != RxSeg::kData) e->ProgressLocked();
    bool dontwait = flags & MSG_DONTWAIT;
    bool peek = flags & MSG_PEEK;
    bool waitall = (flags & MSG_WAITALL) && !peek;
    if (!e->WaitLocked([&] { return !c->calls.recv_busy; }, dontwait ? kNoWait : deadline)) {
      return dontwait ? WouldBlock() : TimedOut();
    }
    c->calls.recv_busy = true;
    absl::Cleanup done = [&] {
      c->calls.recv_busy = false;
      e->NoteReadinessLocked(c);
      e->NotifyLocked();
    };
    IovCursor cur(iov);
    size_t copied = 0;
    if (cur.done()) return size_t{0};
    Fabric* fabric = c->ep->fabric();
    const size_t max_rma = fabric->caps().max_rma_size ? fabric->caps().max_rma_size : kMaxAdvert;
    for (;;) {
      if (c->failure.local_abort) return c->failure.error;
      if (c->shut.rd) return copied;
      // 1. Copy what the stream holds.
      size_t peek_skip = 0;  // PEEK: bytes of the queue already copied
      for (size_t si = 0; !cur.done() && si < c->rx.queue.size();) {
        RxSeg& s = c->rx.queue[si];
        size_t avail = s.len - s.off;
        size_t start = s.off;
        if (peek) {
          if (peek_skip >= avail) {
            peek_skip -= avail;
            ++si;
            continue;
          }
          start += peek_skip;
          avail -= peek_skip;
          peek_skip = 0;
        }
        if (s.kind == RxSeg::kData) {
          size_t k = std::min(avail, cur.space());
          CopyBytes(cur.ptr(), s.data + start, k);
          cur.Advance(k);
          copied += k;
          if (peek) {
            peek_skip = 0;
            if (k == avail) {
              ++si;
            }
            continue;
          }
          s.off += k;
          c->stats.bytes_recv_bcopy += k;
          if (s.off == s.len) {
            int b = s.buf;
            c->rx.queue.pop_front();
            c->Repost(b);
          }
          continue;
        }
        // An earlier receive that returned early must land before the next
        // read (its RdmaRdCompl goes first).
        if (c->az.rx.active) {
          e->WaitLocked([&] { return !c->az.rx.active || !c->failure.error.ok(); },
                        absl::InfiniteFuture());
          if (!c->failure.error.ok()) return copied ? absl::StatusOr<size_t>(copied) : c->failure.error;
          si = 0;
          peek_skip = 0;
          if (peek) break;
          continue;
        }
        // AZ-SDP SrcAvail: lock its word before the first read, unless the
        // source moved the data to a copy (then its AzUpdate comes).
        if (s.slot != wire::kNoSlot && !s.locked && !s.moved) {
          uint64_t expect = AzWord(s.gen, kAzFree);
          if (__atomic_compare_exchange_n(c->LockWord(s.slot), &expect,
                                          AzWord(s.gen, kAzSinkReading), false, __ATOMIC_SEQ_CST,
                                          __ATOMIC_SEQ_CST)) {
            s.locked = true;
          } else if (expect == AzWord(s.gen, kAzSourceMoved)) {
            const uint32_t advert = s.advert;
            auto moved = [&] {
              for (const RxSeg& x : c->rx.queue) {
                if (x.kind == RxSeg::kSrcAvail && x.advert == advert) return x.moved;
              }
              return true;
            };
            e->WaitLocked([&] { return !c->failure.error.ok() || c->shut.rd || moved(); },
                          absl::InfiniteFuture());
            if (!c->failure.error.ok()) return copied ? absl::StatusOr<size_t>(copied) : c->failure.error;
            si = 0;
            peek_skip = 0;
            if (peek) break;  // start the peek over
            continue;
          } else {
            wire::Header h;
            h.mid = MessageId::kSrcAvail;
            h.mseq = s.advert;
            c->ProtocolError(Violation(h, absl::StrCat("lock word ", s.slot, " holds ", expect,
                                                       ", not generation ", s.gen)));
            return copied ? absl::StatusOr<size_t>(copied) : c->failure.error;
          }
        }
        // AZ-SDP receive side: whole pages of a large, page-aligned buffer
        // are returned at once and land behind the application's back.
        if (s.slot != wire::kNoSlot && !peek && !waitall && c->opt.mode == Mode::kAz &&
            c->opt.az_early_recv) {
          const size_t page = az::PageSize();
          auto* d = static_cast<uint8_t*>(cur.ptr());
          const size_t k = std::min(avail, cur.space()) / page * page;
          if (reinterpret_cast<uintptr_t>(d) % page == 0 &&
              k >= std::max<size_t>(c->opt.zcopy_threshold, 16 * page) &&
              c->AzRecvEarly(s, d, k)) {
            s.off += k;
            c->rx.pos += k;
            c->stats.bytes_recv_srcavail += k;
            if (s.off == s.len) c->rx.queue.erase(c->rx.queue.begin() + static_cast<std::ptrdiff_t>(si));
            cur.Advance(k);
            copied += k;
            break;
          }
        }
        // SrcAvail: RDMA-read into the caller's buffer.
        size_t k = std::min({avail, cur.space(), max_rma});
        std::shared_ptr<MemoryRegion> mr;
        absl::Status st;
        if (fabric->caps().registration_required) {
          auto r = fabric->rcache().Get(cur.ptr(), k, kLocalWrite);
          if (r.ok()) {
            mr = *r;
          } else {
            st = r.status();
          }
        }
        uint32_t advert = s.advert;
        if (st.ok() && c->failure.ep_closed) st = c->failure.error;
        if (st.ok()) {
          s.reading = true;
          c->sink.read_status = absl::OkStatus();
          st = c->ep->Read(cur.ptr(), k, mr.get(), s.addr + start, s.key,
                           MakeCtx(c->id, kCtxRead, 0));
          if (st.ok()) {
            c->sink.reads_out++;
            // The buffer is in use until the read completes: no deadline.
            e->WaitLocked([&] { return c->sink.reads_out == 0; }, absl::InfiniteFuture());
            st = c->sink.read_status;
          }
        }
        // The deque may have grown; find the segment again (it is the
        // first SrcAvail: only one is outstanding).
        RxSeg* sp = nullptr;
        size_t idx = 0;
        for (; idx < c->rx.queue.size(); ++idx) {
          if (c->rx.queue[idx].kind == RxSeg::kSrcAvail && c->rx.queue[idx].advert == advert) {
            sp = &c->rx.queue[idx];
            break;
          }
        }
        if (sp == nullptr) return copied ? absl::StatusOr<size_t>(copied) : c->failure.error;
        sp->reading = false;
        if (!c->failure.error.ok()) return copied ? absl::StatusOr<size_t>(copied) : c->failure.error;
        if (!st.ok() && (sp->slot != wire::kNoSlot || sp->pulled)) {
          // An asynchronous advert cannot be resent by copy in stream order.
          // (A dead peer is the usual cause; a live one released the memory.)
          c->PostAbort(ECONNRESET);
          c->Fail(ResetError(absl::StrCat(
              "RDMA read of ", sp->pulled ? "pulled" : "asynchronous", " SrcAvail ", advert,
              sp->pulled ? " failed: " : " failed (an azcopy sender must not unmap a buffer it sent): ",
              st.message())));
          return copied ? absl::StatusOr<size_t>(copied) : c->failure.error;
        }
        if (!st.ok()) {
          // The source sends the rest by BCopy (RdmaRdCompl + SendSmall).
          ZS_LOG(kInfo, "sdp: RDMA read of SrcAvail %u failed (%s); asking for bcopy", advert,
                 st.ToString().c_str());
          c->stats.rdma_fallbacks++;
          uint8_t fl = sp->cancel_requested ? wire::kFlagCancelReply : wire::kFlagSendSmall;
          c->QueueCtl(wire::Message{{MessageId::kRdmaRdCompl, fl}, wire::Completed{advert, 0}});
          c->rx.queue.erase(c->rx.queue.begin() + idx);
          c->TryTransmit();
          break;
        }
        cur.Advance(k);
        copied += k;
        if (peek) {
          if (sp->cancel_requested) {
            c->QueueCtl(wire::Message{{MessageId::kRdmaRdCompl, wire::kFlagCancelReply},
                                      wire::Completed{advert, 0}});
            c->rx.queue.erase(c->rx.queue.begin() + idx);
            c->TryTransmit();
            break;
          }
          if (k == avail) ++si;
          continue;
        }
        sp->off += k;
        c->rx.pos += k;
        (sp->pulled ? c->stats.bytes_recv_pull : c->stats.bytes_recv_srcavail) += k;
        if (sp->off == sp->len) c->AzSinkDone(*sp);  // before the completion leaves
        uint8_t fl = sp->cancel_requested ? wire::kFlagCancelReply : 0;
        c->QueueCtl(wire::Message{{MessageId::kRdmaRdCompl, fl},
                                  wire::Completed{advert, static_cast<uint32_t>(k)}});
        if (sp->off == sp->len || sp->cancel_requested) c->rx.queue.erase(c->rx.queue.begin() + idx);
        c->TryTransmit();
        si = 0;
      }
      c->TryTransmit();
      if (cur.done() || (copied > 0 && !waitall)) break;
      // End of stream: the peer's DisconnReq came after all its data (even
      // if the connection failed afterwards, unless it was reset).
      if (c->shut.peer_wr && c->rx.queue.empty() && !c->failure.peer_aborted) break;
      if (!c->failure.error.ok()) return copied ? absl::StatusOr<size_t>(copied) : c->failure.error;
      if (peek && copied > 0) break;
      // This thread is about to wait for the peer (or to tell an event loop
      // to): it sends nothing more meanwhile, so a tail autocork holds goes
      // now instead of after the peer's acknowledgement.
      c->FlushTail();
      if (dontwait) {
        if (copied > 0) break;
        return WouldBlock();
      }
      // 2. Nothing queued: announce the buffer (SinkAvail) if it is large.
      if (!peek && c->rx.queue.empty() && c->opt.mode == Mode::kZcopy &&
          (c->peer.caps & wire::kCapRdmaWrite) && cur.space() >= c->opt.zcopy_threshold &&
          !c->sink.advert.active && !c->shut.rd) {
        size_t L = std::min(cur.space(), kMaxAdvert);
        auto r = fabric->rcache().Get(cur.ptr(), L, kRemoteWrite | kLocalWrite);
        if (r.ok()) {
          wire::Advert a;
          a.addr = reinterpret_cast<uint64_t>(cur.ptr());
          a.length = static_cast<uint32_t>(L);
          a.stream_pos = c->rx.pos;
          a.key = (*r)->remote_key();
          a.key_bytes = a.key.Serialize();
          c->sink.advert = {};
          c->sink.advert.active = true;
          c->sink.advert.len = static_cast<uint32_t>(L);
          c->sink.advert.mr = *r;
          c->QueueCtl(wire::Message{{MessageId::kSinkAvail}, a});
          c->stats.sinkavail_sent++;
          c->TryTransmit();
          bool resolved = e->WaitLocked(
              [&] { return c->sink.advert.resolved || !c->failure.error.ok() || c->shut.rd; }, deadline);
          if (!resolved && !c->sink.advert.posted) {
            for (auto it = c->tx.ctlq.begin(); it != c->tx.ctlq.end(); ++it) {
              if (it->mid == MessageId::kSinkAvail) {
                c->tx.ctlq.erase(it);
                break;
              }
            }
            c->sink.advert = {};
            c->stats.sinkavail_sent--;
            return copied ? absl::StatusOr<size_t>(copied) : TimedOut();
          }
          if (!resolved) {
            // Deadline or SHUT_RD: cancel, then wait for the source's answer
            // (its write, a void by data, or the ack) before giving the
            // buffer back.
            c->sink.advert.cancel_sent = true;
            c->sink.acks_due.push_back(c->sink.advert.id);
            c->stats.sinkavail_cancels++;
            c->QueueCtl(wire::Message{{MessageId::kSinkAvailCancel},
                                      wire::AdvertRef{c->sink.advert.id}});
            c->TryTransmit();
            e->WaitLocked([&] { return c->sink.advert.resolved || !c->failure.error.ok(); },
                          absl::InfiniteFuture());
          }
          // Bytes the source reported written are in the buffer even if the
          // connection failed afterwards (e.g. the peer closed right after
          // its RdmaWrCompl and DisconnReq): deliver them, as bcopy data
          // already received is delivered.
          size_t w = c->sink.advert.written;
          c->sink.advert = {};
          if (w > 0) {
            c->stats.bytes_recv_sinkavail += w;
            cur.Advance(w);
            copied += w;
          }
          if (!resolved && w == 0 && c->failure.error.ok() && c->rx.queue.empty()) {
            return copied ? absl::StatusOr<size_t>(copied) : TimedOut();
          }
          continue;
        }
      }
      if (!e->WaitLocked([&] {
            return !c->rx.queue.empty() || c->shut.peer_wr || !c->failure.error.ok() || c->shut.rd;
          }, deadline)) {
        if (copied > 0) break;
        return TimedOut();
      }
    }
    result = copied;
    ZS_LOG(kTrace, "sdp conn %d recv -> %zu", static_cast<int>(c->id), copied);
  }
  return result;
}

absl::Status Connection::Shutdown(int how) {
  if (StateUnlocked() == nullptr) return Closed();
  {
    MutexLock lock(&engine_->mu_);
    if (state_ == nullptr) return Closed();
    ConnState* c = state_;
    if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL, "shutdown: bad 'how'",
                       "use SHUT_RD, SHUT_WR or SHUT_RDWR");
    }
    ShutdownLocked(c, how);
  }
  engine_->RunCallbacks(/*sync=*/true);
  return absl::OkStatus();
}

void Connection::ShutdownLocked(ConnState* c, int how) {
  if (how == SHUT_RD || how == SHUT_RDWR) {
    c->shut.rd = true;
    c->DropReceived();
  }
  if ((how == SHUT_WR || how == SHUT_RDWR) && c->failure.error.ok()) c->QueueShutdownWr();
  engine_->NoteReadinessLocked(c);
  engine_->NotifyLocked();
}

void Connection::Abort() {
  if (StateUnlocked() == nullptr) return;
  {
    MutexLock lock(&engine_->mu_);
    if (state_ == nullptr) return;
    ConnState* c = state_;
    if (c->failure.error.ok()) {
      c->PostAbort(0);
      c->failure.local_abort = true;
      c->Fail(MakeError(absl::StatusCode::kAborted, ECONNABORTED, "the connection was aborted",
                        "open a new connection"));
      engine_->WaitLocked([&] { return c->tx.inflight == 0; },
                          absl::Now() + absl::Seconds(1));
      c->CloseEndpoint();
    }
    engine_->NoteReadinessLocked(c);
  }
  engine_->RunCallbacks(/*sync=*/true);
}

absl::Status Connection::Close() {
  if (StateUnlocked() == nullptr) return absl::OkStatus();
  absl::Status result;
  {
    MutexLock lock(&engine_->mu_);
    if (state_ == nullptr) return absl::OkStatus();
    ConnState* c = state_;
    if (c->calls.closing) {  // another thread is closing it: done when that is
      engine_->WaitLocked([&] { return state_ == nullptr; }, absl::InfiniteFuture());
      return absl::OkStatus();
    }
    c->calls.closing = true;
    if (c->calls.active > 0) {
      // Other threads are in Send or Recv on this connection (a socket
      // closed under them): wake them as shutdown(SHUT_RDWR) does and let
      // them leave before the state goes. One still inside after the
      // linger time (a send the peer never makes room for) is failed out.
      ShutdownLocked(c, SHUT_RDWR);
      if (!engine_->WaitLocked([&] { return c->calls.active == 0; }, absl::Now() + c->opt.linger)) {
        c->PostAbort(0);  // best effort, as Abort: the peer may have no room for it
        c->Fail(MakeError(absl::StatusCode::kAborted, EBADF,
                          "the socket was closed while this call waited on it",
                          "close a socket only after the calls on it have returned"));
        engine_->NotifyLocked();
        engine_->WaitLocked([&] { return c->calls.active == 0; }, absl::InfiniteFuture());
      }
    }
    if (c->failure.error.ok() && c->phase == ConnState::Phase::kOpen) {
      c->QueueShutdownWr();
      bool flushed = engine_->WaitLocked(
          [&] {
            // Everything left and the peer acknowledged our DisconnReq (a
            // provider may drop messages still in flight when the endpoint
            // closes).
            return !c->failure.error.ok() ||
                   (c->tx.dataq.empty() && c->tx.ctlq.empty() && c->tx.inflight == 0 &&
                    c->az.src.empty() &&
                    c->shut.wr_mseq != 0 && static_cast<int32_t>(c->credit.peer_ack - c->shut.wr_mseq) >= 0);
          },
          absl::Now() + c->opt.linger);
      if (!flushed) {
        result = MakeError(absl::StatusCode::kDeadlineExceeded, ETIMEDOUT,
                           "close: queued data did not leave within the linger time",
                           "raise the linger option or let the peer read");
      }
    }
    // Operations on user buffers must be over before they are released.
    engine_->WaitLocked(
        [&] {
          return c->sink.reads_out == 0 && c->source.writes_out == 0 && c->az.atomics_out == 0 &&
                 !c->az.rx.active;
        },
        absl::Now() + absl::Seconds(5));
    c->AzRxAbandon();
    c->AzReleaseAll();  // not pulled within the linger time: given up
    c->phase = ConnState::Phase::kClosed;
    c->CloseEndpoint();
    engine_->RemoveLocked(c->id);
    __atomic_store_n(&state_, nullptr, __ATOMIC_RELAXED);  // StateUnlocked reads it
    engine_->NotifyLocked();  // a second Close waits for this
  }
  engine_->RunCallbacks(/*sync=*/true);
  return result;
}

uint32_t Connection::readiness() const {
  if (StateUnlocked() == nullptr) return kError | kHup;
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return kError | kHup;
  return state_->ReadinessNow();
}

void Connection::SetReadinessCallback(std::function<void(uint32_t)> cb) {
  if (StateUnlocked() == nullptr) return;
  {
    MutexLock lock(&engine_->mu_);
    if (state_ == nullptr) return;
    state_->readiness.callback =
        cb ? std::make_shared<std::function<void(uint32_t)>>(std::move(cb)) : nullptr;
    state_->readiness.last = ~0u;  // fire once with the current state
    state_->readiness.watch = std::make_shared<std::atomic<uint32_t>>(~0u);
    engine_->NoteReadinessLocked(state_);
  }
  engine_->RunCallbacks(/*sync=*/true);
}

std::shared_ptr<std::atomic<uint32_t>> Connection::readiness_watch() const {
  if (StateUnlocked() == nullptr) return nullptr;
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return nullptr;
  return state_->readiness.watch;
}

ConnectionStats Connection::stats() const {
  if (StateUnlocked() == nullptr) return {};
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return {};
  ConnectionStats s = state_->stats;
  s.queued_bytes = state_->bcopy.queued_bytes;
  s.held_bytes = state_->HeldBytes();
  return s;
}

bool Connection::az_negotiated() const {
  if (StateUnlocked() == nullptr) return false;
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return false;
  return state_->az.enabled;
}

bool Connection::pull_negotiated() const {
  if (StateUnlocked() == nullptr) return false;
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return false;
  return state_->pull.peer_count > 0 && state_->opt.pull_threshold > 0;
}

absl::Status Connection::SetMode(Mode mode) {
  if (StateUnlocked() == nullptr) return Closed();
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return Closed();
  if (mode == Mode::kAz && state_->phase == ConnState::Phase::kOpen && !state_->az.enabled) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EOPNOTSUPP,
                     "AZ-SDP was not negotiated on this connection",
                     "set mode azcopy (ZSOCK_MODE=azcopy) on both sides before connecting; "
                     "it also needs RDMA read and atomics from the provider");
  }
  if (state_->opt.mode != mode) {
    state_->opt.mode = mode;
    if (state_->phase == ConnState::Phase::kOpen) {
      state_->QueueCtl(wire::Message{{MessageId::kModeChange}, wire::ModeChange{mode}});
      state_->TryTransmit();
    }
  }
  return absl::OkStatus();
}

void Connection::SetAutocork(bool on) {
  if (StateUnlocked() == nullptr) return;
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return;
  state_->SetAutocork(on);
}

void Connection::SetLinger(absl::Duration linger) {
  if (StateUnlocked() == nullptr) return;
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return;
  state_->opt.linger = linger;
}

absl::Status Connection::SetZcopyThreshold(size_t bytes) {
  if (StateUnlocked() == nullptr) return Closed();
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return Closed();
  state_->opt.zcopy_threshold = std::max<size_t>(bytes, 1);
  return absl::OkStatus();
}

ConnectionOptions Connection::options() const {
  if (StateUnlocked() == nullptr) return {};
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return {};
  return state_->opt;
}

std::string Connection::peer_socket_address() const {
  MutexLock lock(&engine_->mu_);
  return state_ != nullptr ? state_->peer_sockaddr : "";
}

std::string Connection::peer_address() const {
  if (StateUnlocked() == nullptr) return "";
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return "";
  return state_->peer_address;
}

std::string Connection::local_address() const {
  if (StateUnlocked() == nullptr) return "";
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return "";
  return state_->local_address;
}

absl::Status Connection::error() const {
  if (StateUnlocked() == nullptr) return Closed();
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return Closed();
  return state_->failure.error;
}

absl::Status Connection::TestInjectRaw(std::string bytes) {
  if (StateUnlocked() == nullptr) return Closed();
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return Closed();
  ConnState* c = state_;
  if (bytes.size() > c->tx.size || bytes.size() < wire::kHeaderSize) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL, "raw message size",
                     "give 16 bytes .. the peer's buffer size");
  }
  // Sent as the next message: the sequence numbers are patched in unless
  // the caller set them (non-zero), so only the field under test is wrong.
  TxItem item;
  item.mid = static_cast<MessageId>(static_cast<uint8_t>(bytes[0]));
  if (!c->failure.error.ok()) return c->failure.error;
  if (c->tx.free.empty() || c->Credits() < 1) return WouldBlock();
  int slot = c->tx.free.back();
  c->tx.free.pop_back();
  uint8_t* p = c->SlotPtr(slot);
  std::memcpy(p, bytes.data(), bytes.size());
  uint32_t mseq, ack;
  std::memcpy(&mseq, p + 8, 4);
  std::memcpy(&ack, p + 12, 4);
  ++c->credit.tx_mseq;
  if (mseq == 0) std::memcpy(p + 8, &c->credit.tx_mseq, 4);
  if (ack == 0) std::memcpy(p + 12, &c->credit.rx_mseq, 4);
  auto st = c->ep->Send(p, bytes.size(), c->tx.region.mr.get(), MakeCtx(c->id, kCtxTx, slot));
  if (!st.ok()) {
    c->tx.free.push_back(slot);
    return st;
  }
  c->tx.inflight++;
  return absl::OkStatus();
}

void Connection::TestReleaseHeld() {
  if (StateUnlocked() == nullptr) return;
  {
    MutexLock lock(&engine_->mu_);
    if (state_ == nullptr) return;
    state_->tx.held = false;
    state_->opt.test_hold = nullptr;
    state_->TryTransmit();
    engine_->NotifyLocked();
  }
  engine_->RunCallbacks();
}

}  // namespace zsock::sdp
