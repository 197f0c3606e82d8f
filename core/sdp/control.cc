// Connection control (docs/protocol.md): set-up and the Hello/HelloAck
// exchange, ModeChange, half-close (DisconnReq) and failure (AbortConn, a
// protocol violation, a dead peer), and the errors the connection reports.
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "core/log.h"
#include "core/sdp/conn_state.h"
#include "core/sdp/engine.h"
#include "core/sockaddr.h"
#include "core/status.h"

namespace zsock::sdp {

using wire::MessageId;

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

// ---------------------------------------------------------------- set-up

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
  return active ? SendHello() : absl::OkStatus();
}

wire::Hello ConnState::MyHello() const {
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
  return h;
}

absl::Status ConnState::SendHello() {
  // The Hello goes before the peer's buffer size is known: from its own
  // small region, on the implicit first credit (docs/protocol.md).
  if (auto st = tx.hello.Allocate(ep->fabric(), 4096); !st.ok()) return st;
  wire::Message m;
  m.header.mid = MessageId::kHello;
  m.header.bufs = static_cast<uint16_t>(rx.posted);
  m.header.mseq = ++credit.tx_mseq;
  m.body = MyHello();
  size_t n = wire::Encode(m, std::span<uint8_t>(tx.hello.base, tx.hello.len));
  credit.last_reported = rx.posted;
  auto st = ep->Send(tx.hello.base, n, tx.hello.mr.get(), MakeCtx(id, kCtxHello, 0));
  if (!st.ok()) return st;
  tx.inflight++;
  stats.messages_sent++;
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

// ---------------------------------------------------------------- control messages

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
    // The Hello's buffer is reposted after this message is built: count it.
    QueueCtl(wire::Message{{MessageId::kHelloAck}, MyHello()});
  }
}

bool ConnState::OnModeChange(const wire::ModeChange& m) {
  peer.mode = m.mode;
  return true;
}

bool ConnState::OnDisconnReq(const wire::Header& h) {
  if (shut.peer_wr) {
    ProtocolError(Violation(h, "repeats DisconnReq"));
    return false;
  }
  shut.peer_wr = true;
  VoidSinkAvail();
  credit.update_pending = true;  // acknowledges it at once (Close waits for that)
  return true;
}

bool ConnState::OnAbortConn(const wire::Abort& a) {
  failure.peer_aborted = true;
  Fail(ResetError(absl::StrCat("connection reset by the peer (AbortConn",
                               a.reason ? absl::StrCat(", reason errno ", a.reason) : "", ")")));
  return false;
}

bool ConnState::OnUnhandled(const wire::Header& h) {
  ProtocolError(Violation(h, "is not handled by this version"));
  return false;
}

// ---------------------------------------------------------------- half-close

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

void ConnState::LeaveCall() {
  if (--calls.active == 0 && calls.closing) engine->NotifyLocked();
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

}  // namespace zsock::sdp
