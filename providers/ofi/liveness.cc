// OfiEndpoint's view of its peer: the FIN it sends on a graceful close,
// and CheckPeer, which notices the peer's end (PeerEnded, by kind), then
// lingers until what the peer announced in its FIN has been delivered.
// The CQ decides when CheckPeer runs (LivenessTicker, LingerTimer).
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/status.h"
#include "providers/ofi/endpoint.h"

namespace zsock::ofi {
namespace {

// After a graceful close, how long a posted receive waits for the rest of
// what the peer announced before the connection is reported lost.
constexpr int64_t kLingerNs = 1000 * 1000 * 1000;

}  // namespace

// Tells the peer how many user messages it will get from us, so that it
// delivers all of them before it reports the close (like SDP's
// DisconnReq): the sends that completed, counted after reading our CQ.
void OfiEndpoint::SendFin() {
  CompletionList out;
  {
    DomLock lock(&fab_->dom_mu());
    if (dead_ || ep_ == nullptr || !connected_) return;
    ProgressLocked(&out, nullptr);
    const auto fin = EncodeRecord(kFinMarker, user_sent_ok_);
    SendFinLocked(fin, &out);
  }
  cq_->PushAll(std::span<Completion>(out.data(), out.size()));
}

bool OfiEndpoint::CheckPeer() {
  absl::Status failed;
  {
    DomLock lock(&fab_->dom_mu());
    failed = failed_;
  }
  if (!failed.ok()) {
    Shutdown(failed, /*closed=*/false);
    return true;
  }
  if (!PeerEnded()) return false;
  if (AwaitAnnouncedData()) return false;
  Shutdown(MakeError(absl::StatusCode::kAborted, ECONNRESET,
                     absl::StrCat("the ofi peer ", info_.peer_address,
                                  " closed the connection (it exited, was killed or closed the endpoint)"),
                     "reconnect"),
           /*closed=*/false);
  return true;
}

bool OfiEndpoint::AwaitAnnouncedData() {
  CompletionList out;
  bool wait_for_data = false;
  {
    DomLock lock(&fab_->dom_mu());
    // Take what the provider finished before it saw the end (the FIN
    // among it, on MSG endpoints).
    if (!dead_) ProgressLocked(&out, nullptr);
    // A peer that closed gracefully told us how much it sent: deliver
    // all of it first (receives posted later still match it).
    wait_for_data = fin_ && user_received_ < fin_count_ && !dead_ && !data_gone_;
    const int64_t now = CoarseNowNs();
    if (wait_for_data && !peer_closed_) StartLingerLocked(now);
    // Deliveries are noticed here, at the liveness and linger ticks,
    // not timed as they complete (a clock read per received message).
    if (user_received_ != received_at_look_) {
      received_at_look_ = user_received_;
      last_delivery_ns_ = now;
    }
    // What the peer sent is here or in flight: a receive that stays
    // posted for kLingerNs after the peer's end without meeting anything
    // means the rest was lost (libfabric tcp ends its connection on a
    // truncation, dropping what followed).
    if (wait_for_data && UserRecvPostedLocked() && now - last_delivery_ns_ > kLingerNs) {
      wait_for_data = false;
    }
  }
  cq_->PushAll(std::span<Completion>(out.data(), out.size()));
  return wait_for_data;
}

void OfiEndpoint::StartLingerLocked(int64_t now) {
  peer_closed_ = true;
  lingering_.store(true, std::memory_order_relaxed);
  // At end of file these keep the wait set readable: out, and the CQ's
  // linger tick instead (OfiCq::AddLinger).
  UnwatchConnectionLocked();
  if (fcq_fd_ >= 0) cq_->Unwatch(fcq_fd_);
  cq_->AddLinger(1);
  // A thread that armed before this saw no linger (no tick) and may be
  // about to sleep on a set that no longer has the fd that would have
  // woken it.
  cq_->Wake();
  last_delivery_ns_ = now;
  received_at_look_ = user_received_;
}

}  // namespace zsock::ofi
