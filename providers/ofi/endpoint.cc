// OfiEndpoint: completing requests from the endpoint's fi CQ, control
// messages and flow reports, the backlog's retries, local descriptors, and
// the shutdown. RMA is in endpoint_rma.cc, the peer's close in liveness.cc.
#include "providers/ofi/endpoint.h"

#include <cerrno>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/log.h"
#include "core/rcache.h"
#include "core/status.h"
#include "providers/ofi/cq_drain.h"

namespace zsock::ofi {
namespace {

// Control receives an endpoint keeps posted.
constexpr int kControlRecvs = 8;

// Whether a failed operation says the connection under it is gone (see
// OfiEndpoint::NoteFailureLocked).
bool ConnectionLost(const absl::Status& st) {
  if (st.code() == absl::StatusCode::kCancelled) return true;
  switch (StatusErrno(st)) {
    case ENOTCONN:
    case ECONNRESET:
    case ECONNABORTED:
    case EPIPE:
    case ESHUTDOWN:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN:
      return true;
    default:
      return false;
  }
}

}  // namespace

void EndpointParts::Close() {
  if (cep) fi_close(&cep->fid);
  if (ep) fi_close(&ep->fid);
  if (av) fi_close(&av->fid);
  if (fcq) fi_close(&fcq->fid);
  if (eq) fi_close(&eq->fid);
}

OfiEndpoint::OfiEndpoint(OfiFabric* fabric, OfiCq* cq, fid_ep* ep, fid_cq* fcq, int fcq_fd,
                         fi_addr_t peer, EndpointInfo info, bool connected,
                         bool liveness_by_readiness)
    : Endpoint(fabric, cq), fab_(fabric), cq_(cq), ep_(ep), fcq_(fcq), fcq_fd_(fcq_fd), peer_(peer),
      info_(std::move(info)), connected_(connected), liveness_by_readiness_(liveness_by_readiness) {}

void OfiEndpoint::CloseAndDetach() {
  Close();
  cq_->Detach(this);
}

absl::Status OfiEndpoint::Start() {
  DomLock lock(&fab_->dom_mu());
  for (int i = 0; i < kControlRecvs; ++i) {
    if (auto st = PostControlRecvLocked(); !st.ok()) return st;
  }
  return absl::OkStatus();
}

void OfiEndpoint::SetFlow(uint32_t window, uint32_t peer_window) {
  DomLock lock(&fab_->dom_mu());
  flow_.Start(window, peer_window);
}

absl::Status OfiEndpoint::SendControl(std::span<const uint8_t> msg) {
  if (msg.size() > kControlBuf) {
    return MakeError(absl::StatusCode::kInvalidArgument, EMSGSIZE,
                     absl::StrCat("control message of ", msg.size(), " bytes exceeds ", kControlBuf),
                     "emulated transfers over ofi are limited to 64 KiB per operation");
  }
  return Submit(NewControlSend(msg), [this](Request* req) { return PostControlSend(req); });
}

void OfiEndpoint::Close() {
  SendFin();
  absl::Status why = MakeError(absl::StatusCode::kCancelled, ECANCELED, "the endpoint was closed");
  Shutdown(why, /*closed=*/true);
}

size_t OfiEndpoint::ProgressLocked(CompletionList* out, std::vector<std::vector<uint8_t>>* control) {
  // Injected sends first; a send posted ahead of them by fi_tsend reports
  // whenever libfabric completes it.
  size_t n = TakeInjectedLocked(out);
  if (fcq_ == nullptr) return n;
  read_since_look_ = true;
  n += DrainCq(fcq_, /*ep_open=*/ep_ != nullptr, [&](Request* r, size_t len, absl::Status st) {
    CompleteLocked(r, std::move(st), len, out, control);
  });
  if (peer_closed_ && user_received_ >= fin_count_) cq_->Wake();  // CheckPeer finishes it
  RetryLocked(out);
  return n;
}

bool OfiEndpoint::MayNeedReadBeforeSleepLocked() {
  if (poll_hint_) return true;
  if (!read_since_look_) return false;
  read_since_look_ = false;
  if (SocketsMovedLocked()) poll_hint_ = true;
  return poll_hint_;
}

void OfiEndpoint::AppendTrywaitFidsLocked(bool cq_waits, std::vector<fid*>* fids) {
  // CQs without a wait object are not for fi_trywait.
  if (fcq_ != nullptr && cq_waits) fids->push_back(&fcq_->fid);
}

void OfiEndpoint::CompleteLocked(Request* r, absl::Status st, size_t len, CompletionList* out,
                                 std::vector<std::vector<uint8_t>>* control) {
  outstanding_.erase(r);
  if (r == fin_req_) fin_req_ = nullptr;
  if (!st.ok()) [[unlikely]] NoteFailureLocked(r, st);
  if (r->control) {
    CompleteControlLocked(r, st, len, control);
    return;
  }
  if (r->op == OpType::kSend && r->context == kInjectContext) {
    CompleteInjectCopyLocked(r, st);
    return;
  }
  if (r->op == OpType::kRecv &&
      (st.ok() || st.code() == absl::StatusCode::kOutOfRange)) {
    ++user_received_;  // a message was consumed, truncated or not
    ReportConsumedLocked();
  }
  if (r->op == OpType::kSend && st.ok()) ++user_sent_ok_;
  if (st.ok() && r->user_result != nullptr) *r->user_result = r->result;
  // Last: nothing may append to `out` while `c` refers into it.
  Completion& c = cq_->EmitSlot(out);
  c.context = r->context;
  c.op = r->op;
  c.endpoint = this;
  c.length = st.ok() ? (r->op == OpType::kRecv ? len : r->len) : 0;
  c.status = std::move(st);
  RequestCache::Put(r);
}

// A received control message is a FIN, a flow report, or core's, handed
// on through `control`; its buffer is posted again for the next one.
void OfiEndpoint::CompleteControlLocked(Request* r, const absl::Status& st, size_t len,
                                        std::vector<std::vector<uint8_t>>* control) {
  if (r->op != OpType::kRecv || !st.ok() || dead_) {
    RequestCache::Put(r);
    return;
  }
  const std::span<const uint8_t> msg(r->owned.data(), len);
  uint64_t consumed;
  if (DecodeRecord(msg, kFinMarker, &fin_count_)) {
    fin_ = true;
  } else if (DecodeRecord(msg, kFlowReportMarker, &consumed)) {
    flow_.PeerReported(consumed);
  } else if (control != nullptr) {
    control->emplace_back(r->owned.begin(), r->owned.begin() + len);
  }
  // Reuse the buffer for the next control message.
  r->fi_ctx = {};
  outstanding_.insert(r);
  int rc = PostControlRecv(r);
  if (rc != 0) {
    outstanding_.erase(r);
    RequestCache::Put(r);
  }
}

// The copy of an injected send (InjectWith): nothing is reported (a
// failed one, NoteFailureLocked).
void OfiEndpoint::CompleteInjectCopyLocked(Request* r, const absl::Status& st) {
  if (st.ok()) ++user_sent_ok_;
  RequestCache::Put(r);
}

// The provider fails what it still holds with FI_ECANCELED when the
// connection under it ends (zsock cancels nothing itself: its own close
// sets closed_ or dead_ first), and the operation in flight with the
// socket's error. Once one has been reported the endpoint must refuse new
// operations at once: the liveness check that shuts it down may run only
// later, and until then the provider may still accept a post on the dead
// connection.
void OfiEndpoint::NoteFailureLocked(const Request* r, const absl::Status& st) {
  if (closed_ || dead_ || !failed_.ok()) return;
  if (r->op == OpType::kSend && r->context == kInjectContext && !r->control) {
    // A failed copy would leave a gap in what the peer gets while later
    // messages still arrive: the endpoint goes down instead.
    ZS_LOG(kDebug, "an injected ofi send failed: %s", st.ToString().c_str());
    failed_ = MakeError(st.code(), ECONNRESET,
                        absl::StrCat("an injected send to ", info_.peer_address, " failed: ",
                                     st.message()),
                        "reconnect; messages after it were not delivered");
  } else if (!fin_ && ConnectionLost(st)) {
    // After a graceful close (fin_) CheckPeer first delivers what the
    // peer announced.
    failed_ = MakeError(absl::StatusCode::kAborted, ECONNRESET,
                        absl::StrCat("the ofi connection to ", info_.peer_address,
                                     " was lost: ", st.message()),
                        "reconnect");
  } else {
    return;
  }
  cq_->CheckSoon();  // CheckPeer shuts the endpoint down with failed_
}

bool OfiEndpoint::UserRecvPostedLocked() {
  for (Request* r = outstanding_.front(); r != nullptr; r = r->next) {
    if (!r->control && r->op == OpType::kRecv) return true;
  }
  return false;
}

// Tells the peer how many of its messages our receives consumed, when a
// quarter of its window has been consumed since the last report (or a
// report met EAGAIN). Posted at once, never behind the backlog: a backlog
// held up by our own window must not hold up the report the peer's
// window waits for.
void OfiEndpoint::ReportConsumedLocked() {
  if (!flow_.on() || dead_ || closed_ || ep_ == nullptr) return;
  if (!credit_due_ && !flow_.ReportDue(user_received_)) return;
  auto* r = NewControlSend(EncodeRecord(kFlowReportMarker, user_received_));
  outstanding_.insert(r);
  const int rc = PostControlSend(r);
  if (rc != 0) {
    outstanding_.erase(r);
    RequestCache::Put(r);
    if (rc != -FI_EAGAIN) {
      ZS_LOG(kDebug, "ofi: a flow-control report failed (%s)", fi_strerror(-rc));
    }
    credit_due_ = true;  // again at the next progress
    return;
  }
  flow_.Reported(user_received_);
  credit_due_ = false;
  poll_hint_ = true;
}

void OfiEndpoint::RetryBacklogLocked(CompletionList* out) {
  if (credit_due_) ReportConsumedLocked();
  while (!backlog_.empty() && !dead_) {
    auto& [r, post] = backlog_.front();
    const bool user_send = IsUserSend(r);
    if (user_send && !FlowOpenLocked()) return;  // until the peer reports
    int rc = post(r);
    if (rc == -FI_EAGAIN) return;
    Request* req = r;
    backlog_.pop_front();
    if (rc == 0 && user_send) flow_.Posted();
    if (rc != 0) {
      outstanding_.erase(req);
      CompleteLocked(req, FiError(rc, CallName(req), "the provider refused the operation"), 0, out, nullptr);
    } else {
      poll_hint_ = true;  // it may have completed inside the call (cq_wait=sockets)
    }
  }
}

Request* OfiEndpoint::NewControlSend(std::span<const uint8_t> bytes) {
  auto* r = NewRequest(OpType::kSend, 0, bytes.size());
  r->control = true;
  r->owned.assign(bytes.begin(), bytes.end());
  return r;
}

absl::Status OfiEndpoint::PostControlRecvLocked() {
  auto* r = NewRequest(OpType::kRecv, 0, kControlBuf);
  r->control = true;
  r->owned.resize(kControlBuf);
  outstanding_.insert(r);
  int rc = PostControlRecv(r);
  if (rc != 0) {
    outstanding_.erase(r);
    RequestCache::Put(r);
    return FiError(rc, "posting an ofi control receive");
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> OfiEndpoint::DescFromCache(const void* buf, size_t len, Request* r) {
  auto reg = fab_->rcache().Get(const_cast<void*>(buf), len, kLocalRead | kLocalWrite);
  if (reg.ok()) {
    r->pin = *reg;
    return r->pin->desc();
  }
  if (reg.status().code() == absl::StatusCode::kUnavailable) {
    // The cache registers whole pages, and a heap buffer shares its page
    // with memory that other code (the provider's own registration among
    // it) frees meanwhile, which invalidates the registration in flight.
    // The buffer itself is live: register exactly it for this operation.
    auto direct = fab_->RegisterMemory(const_cast<void*>(buf), len, kLocalRead | kLocalWrite);
    if (direct.ok()) {
      r->pin = std::shared_ptr<MemoryRegion>(std::move(*direct));
      return r->pin->desc();
    }
    reg = direct.status();
  }
  RequestCache::Put(r);
  return reg.status();
}

absl::Status OfiEndpoint::DownStatusLocked() const {
  if (closed_) {
    return MakeError(absl::StatusCode::kFailedPrecondition, ENOTCONN,
                     "operation on a closed ofi endpoint", "connect a new endpoint");
  }
  return dead_ ? dead_status_ : failed_;
}

const char* OfiEndpoint::CallName(const Request* r) const {
  switch (r->op) {
    case OpType::kSend: return SendCall();
    case OpType::kRecv: return RecvCall();
    case OpType::kRead: return "fi_read";
    case OpType::kWrite: return "fi_writemsg(FI_DELIVERY_COMPLETE)";
    case OpType::kFetchAdd: return "fi_fetch_atomic(FI_SUM)";
    case OpType::kCompareSwap: return "fi_compare_atomic(FI_CSWAP)";
  }
  return "posting an ofi operation";
}

absl::Status OfiEndpoint::PostFailedLocked(Request* r, int rc) {
  const char* call = CallName(r);
  outstanding_.erase(r);
  RequestCache::Put(r);
  return FiError(rc, call, "the provider refused the operation; check sizes and registrations");
}

absl::Status OfiEndpoint::InjectTooLarge(size_t len) const {
  return MakeError(absl::StatusCode::kInvalidArgument, EMSGSIZE,
                   absl::StrCat("an injected send of ", len, " bytes exceeds ofi's inject_size ",
                                fab_->caps().inject_size),
                   "inject at most caps().inject_size bytes, or send with a context");
}

void OfiEndpoint::Shutdown(const absl::Status& why, bool closed) {
  CompletionList out;
  {
    DomLock lock(&fab_->dom_mu());
    if (closed) closed_ = true;
    if (dead_) return;  // nothing injected since: TryInject checks dead_
    TakeInjectedLocked(&out);  // sent before the end: reported as sent
    dead_ = true;
    dead_status_ = why;
    if (lingering_.exchange(false, std::memory_order_relaxed)) cq_->AddLinger(-1);
    ZS_LOG(kInfo, "ofi endpoint to %s is down: %s", info_.peer_address, why.ToString());
    CloseConnectionLocked();
    if (ep_) {
      fi_close(&ep_->fid);
      ep_ = nullptr;
    }
    DrainAndCloseCqLocked(&out);
    backlog_.clear();
    while (Request* r = outstanding_.front()) CompleteLocked(r, why, 0, &out, nullptr);
    CloseBindingsLocked();
  }
  cq_->PushAll(std::span<Completion>(out.data(), out.size()));
  FailEmulated(why);
}

// Completions already in our CQ name our requests: take them now, so
// nothing refers to a request once it is freed; then the CQ goes.
void OfiEndpoint::DrainAndCloseCqLocked(CompletionList* out) {
  if (!fcq_) return;
  auto finished = [&](Request* r, size_t len, absl::Status st) {
    // Finished before the close: report what really happened.
    if (outstanding_.contains(r)) CompleteLocked(r, std::move(st), len, out, nullptr);
  };
  while (DrainCq(fcq_, /*ep_open=*/false, finished) > 0) {}
  if (fcq_fd_ >= 0) cq_->Unwatch(fcq_fd_);
  fi_close(&fcq_->fid);
  fcq_ = nullptr;
  fcq_fd_ = -1;
}

}  // namespace zsock::ofi
