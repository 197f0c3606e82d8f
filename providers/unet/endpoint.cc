// unet's endpoint (endpoint.h): construction, close and failure. A peer
// that breaks the protocol or goes away marks the endpoint dead; what it
// sent before is still delivered, everything queued fails with the reason.
#include "providers/unet/endpoint.h"

#include <sys/socket.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/log.h"
#include "providers/unet/fabric.h"

namespace zsock::unet {

UnetEndpoint::UnetEndpoint(UnetFabric* fabric, UnetCq* cq, Parts parts)
    : Endpoint(fabric, cq), fabric_(fabric), cq_(cq), p_(std::move(parts)) {
  peer_bell_ = reinterpret_cast<CqBell*>(p_.peer_bell.get());
  const auto& rl = p_.rx_layout;
  const auto& tl = p_.tx_layout;
  rx_user_ = RingConsumer<Desc>(reinterpret_cast<Desc*>(p_.rx.get() + rl.user_ring), rl.ring_entries);
  rx_ctl_ = RingConsumer<Desc>(reinterpret_cast<Desc*>(p_.rx.get() + rl.ctl_ring), rl.ring_entries);
  // The free rings start full (every buffer free), so production resumes
  // one lap later.
  rx_user_free_ = RingProducer<FreeSlot>(reinterpret_cast<FreeSlot*>(p_.rx.get() + rl.user_free),
                                         rl.nbuffers, rl.nbuffers);
  rx_ctl_free_ = RingProducer<FreeSlot>(reinterpret_cast<FreeSlot*>(p_.rx.get() + rl.ctl_free),
                                        kControlBuffers, kControlBuffers);
  tx_user_ = RingProducer<Desc>(reinterpret_cast<Desc*>(p_.tx.get() + tl.user_ring), tl.ring_entries);
  tx_ctl_ = RingProducer<Desc>(reinterpret_cast<Desc*>(p_.tx.get() + tl.ctl_ring), tl.ring_entries);
  tx_user_free_ = RingConsumer<FreeSlot>(reinterpret_cast<FreeSlot*>(p_.tx.get() + tl.user_free), tl.nbuffers);
  tx_ctl_free_ = RingConsumer<FreeSlot>(reinterpret_cast<FreeSlot*>(p_.tx.get() + tl.ctl_free), kControlBuffers);
  cq_->Attach(this, p_.bell_slot, p_.sock.get(), p_.pidfd.get());
  fabric->AttachEndpoint(this, p_.sock.get());
}

UnetEndpoint::~UnetEndpoint() {
  Close();
  fabric_->DetachEndpoint(this);
  cq_->Detach(this, p_.bell_slot, p_.sock.get(), p_.pidfd.get());
}

void UnetEndpoint::Close() {
  Completions failed;
  {
    MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    ::shutdown(p_.sock.get(), SHUT_RDWR);
    // Our own shutdown makes the socket readable for good: stop watching
    // it, or every wait on this CQ would spin.
    cq_->Unwatch(p_.sock.get());
    if (p_.pidfd) cq_->Unwatch(p_.pidfd.get());
    absl::Status why = MakeError(absl::StatusCode::kCancelled, ECANCELED,
                                 "the endpoint was closed", "");
    // Sends that completed before the close are reported as sent.
    for (Completion& c : sent_done_) failed.push_back(std::move(c));
    sent_done_.clear();
    FlushLocked(why, &failed);
  }
  for (auto& c : failed) cq_->Push(std::move(c));
  FailEmulated(MakeError(absl::StatusCode::kCancelled, ECANCELED, "the endpoint was closed"));
}

absl::Status UnetEndpoint::ProtocolError(const char* what) {
  return MakeError(absl::StatusCode::kDataLoss, EPROTO,
                   absl::StrCat("malformed unet descriptor from peer pid ", p_.peer_pid, ": ", what),
                   "the peer is faulty or not a compatible zsock; the connection was aborted");
}

void UnetEndpoint::MarkDeadLocked(absl::Status why) {
  hint_busy_.store(true, std::memory_order_relaxed);
  MarkSelf();
  // After a protocol violation nothing more is read from the peer's rings.
  if (why.code() == absl::StatusCode::kDataLoss) rx_abandoned_ = true;
  if (dead_) return;
  dead_ = true;
  dead_status_ = std::move(why);
  ZS_LOG(kInfo, "unet endpoint to pid %d is down: %s", p_.peer_pid, dead_status_.ToString());
  cq_->Unwatch(p_.sock.get());
  if (p_.pidfd) cq_->Unwatch(p_.pidfd.get());
}

Completion UnetEndpoint::Failed(uint64_t context, OpType op, const absl::Status& why) {
  Completion c;
  c.context = context;
  c.op = op;
  c.endpoint = this;
  c.status = why;
  return c;
}

// Fails queued sends (user ones report; control ones are core's).
void UnetEndpoint::FailSendsLocked(const absl::Status& why, Completions* out) {
  for (auto& ps : sendq_) {
    if (ps.type == kUserMsg && ps.context != kInjectContext) {
      out->push_back(Failed(ps.context, OpType::kSend, why));
    }
  }
  sendq_.clear();
  ctlq_.clear();
}

// Fails every queued operation with `why`.
void UnetEndpoint::FlushLocked(const absl::Status& why, Completions* out) {
  FailSendsLocked(why, out);
  for (auto& r : posted_) out->push_back(Failed(r.context, OpType::kRecv, why));
  posted_.clear();
}

}  // namespace zsock::unet
