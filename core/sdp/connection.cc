// sdp::Connection's calls other than Send and Recv (send.cc, recv.cc):
// options, shutdown, abort and close, readiness, statistics and settings,
// and the test hooks. Each takes the engine mutex and finds the state
// again under it (Close may clear it from another thread).
#include <cerrno>
#include <cstring>

#include "absl/time/clock.h"
#include "core/config.h"
#include "core/mutex.h"
#include "core/sdp/conn_state.h"
#include "core/sdp/engine.h"
#include "core/status.h"

namespace zsock::sdp {

using wire::MessageId;

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

uint32_t ConnState::ReadinessNow() const {
  uint32_t r = 0;
  if (!failure.error.ok()) r |= kError | kReadable | kWritable | kHup;
  if (!rx.queue.empty() || shut.peer_wr || shut.rd) r |= kReadable;
  if (shut.peer_wr) r |= kRdHup;
  if (phase == Phase::kOpen && !shut.wr && (CanAppend() || source.peer_sink.valid)) r |= kWritable;
  if (shut.peer_wr && shut.wr) r |= kHup;
  return r;
}

Connection::~Connection() {
  if (state_ != nullptr) (void)Close();
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
