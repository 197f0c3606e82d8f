// OfiEndpoint: what the two kinds of zsock ofi endpoints share. Posting
// operations (and the backlog of those that met EAGAIN or wait for the
// flow window), reading the endpoint's own fi CQ and completing its
// requests, control messages, flow control, RMA and atomics, the peer's
// graceful close (its FIN, then a linger for what it announced) and the
// shutdown. Subclasses make the libfabric calls of their kind:
// RdmEndpoint (rdm_endpoint.h) and MsgEndpoint (msg_endpoint.h); they pass
// them to the inline templates here (SubmitWithDesc, InjectWith), so the
// per-message paths need no virtual call. Methods named ...Locked run with
// the fabric's domain lock held. Defined in endpoint.cc, endpoint_rma.cc
// and liveness.cc.
#ifndef ZSOCK_PROVIDERS_OFI_ENDPOINT_H_
#define ZSOCK_PROVIDERS_OFI_ENDPOINT_H_

#include <rdma/fabric.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/flow_window.h"
#include "core/provider.h"
#include "core/ready_owners.h"
#include "providers/ofi/cq.h"
#include "providers/ofi/domain_lock.h"
#include "providers/ofi/errors.h"
#include "providers/ofi/fabric.h"
#include "providers/ofi/memory.h"
#include "providers/ofi/request.h"

namespace zsock::ofi {

// Control message: graceful close, a record (core/flow_window.h) of the
// user messages sent; the flow report (SetFlow) is the other.
inline constexpr uint8_t kFinMarker = 0xf1;

// The fi objects of an endpoint while it is set up (each kind uses some of
// them); Close closes those that were not handed to an endpoint.
struct EndpointParts {
  fid_ep* ep = nullptr;
  fid_ep* cep = nullptr;  // MSG: the control connection
  fid_av* av = nullptr;   // RDM: the address vector
  fid_eq* eq = nullptr;   // MSG: the event queue
  int eq_fd = -1;
  fid_cq* fcq = nullptr;
  int fcq_fd = -1;

  void Close();
};

// Runs `open(p)` (absl::Status(EndpointParts*)) under the domain lock;
// if it fails, what it opened is closed again, still under the lock.
template <typename Open>
absl::Status OpenParts(OfiFabric* fabric, EndpointParts* p, const Open& open) {
  DomLock lock(&fabric->dom_mu());
  absl::Status st = open(p);
  if (!st.ok()) {
    p->Close();
    *p = EndpointParts();
  }
  return st;
}

class OfiEndpoint : public Endpoint {
 public:
  // Subclasses call CloseAndDetach first in their destructors.
  ~OfiEndpoint() override = default;

  const EndpointInfo& info() const override { return info_; }

  // Posts the control receives; called once after construction.
  absl::Status Start();
  // Flow control (RDM over rxm, both sides agreeing in the hello): at most
  // `window` of our user sends are with libfabric beyond what the peer has
  // reported consumed; we report our consumption every quarter of the
  // peer's window (`peer_window`), so that neither side can stall the other.
  void SetFlow(uint32_t window, uint32_t peer_window);

  absl::Status SendControl(std::span<const uint8_t> msg) override;
  absl::Status Read(void* local, size_t len, MemoryRegion* mr, uint64_t remote_addr,
                    const RemoteKey& rkey, uint64_t context) override;
  absl::Status Write(const void* local, size_t len, MemoryRegion* mr, uint64_t remote_addr,
                     const RemoteKey& rkey, uint64_t context) override;
  absl::Status FetchAdd(uint64_t* result, uint64_t remote_addr, const RemoteKey& rkey,
                        uint64_t add, uint64_t context) override;
  absl::Status CompareSwap(uint64_t* result, uint64_t remote_addr, const RemoteKey& rkey,
                           uint64_t compare, uint64_t swap, uint64_t context) override;
  // Tells the peer how many messages to expect (SendFin), then shuts down.
  void Close() override;

  // ---- for OfiCq ----

  // Reads this endpoint's completions and retries what met EAGAIN; returns
  // how many events it took (fi CQ entries and injected sends).
  size_t ProgressLocked(CompletionList* out, std::vector<std::vector<uint8_t>>* control)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu());
  // Whether injected sends wait for ProgressLocked (ArmProvider).
  bool HasInjectedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    return !injected_.empty();
  }
  // cq_wait=sockets, many endpoints (OfiCq::Progress): whether reading this
  // endpoint's fi CQ may find anything. Only its sockets' edges (`ready`),
  // its own posts, and what the last read left can give it work:
  // libfabric tcp progresses an fi CQ's own endpoints when it is read.
  bool MayHaveWorkLocked(const ReadyOwners& ready) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    return poll_hint_ || ready.contains(this) || !injected_.empty() || !backlog_.empty() ||
           peer_closed_ || lingering_.load(std::memory_order_relaxed);
  }
  void SetPollHintLocked(bool hint) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) { poll_hint_ = hint; }
  // cq_wait=sockets, before a sleep: whether another read may find work
  // that no edge will announce. The last read found something; or libfabric
  // tcp took bytes from a socket since the last look and left some there
  // (SocketsMovedLocked). Only endpoints read since the last look can have
  // moved (new bytes bring an edge), which keeps a sleep's cost to them
  // when many connections share a CQ.
  bool MayNeedReadBeforeSleepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu());
  // Whether the transport took bytes from this endpoint's own sockets since
  // the last look and left some there (only MSG endpoints waited on by
  // their sockets have any).
  virtual bool SocketsMovedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) { return false; }
  // The wait objects fi_trywait must see before a sleep: this endpoint's
  // fi CQ when the CQs have FI_WAIT_FD objects (`cq_waits`), and whatever
  // else its kind waits on.
  virtual void AppendTrywaitFidsLocked(bool cq_waits, std::vector<fid*>* fids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu());
  // The peer closed and the endpoint waits for what it announced (its fds
  // are out of the wait set: OfiCq ticks instead).
  bool Lingering() const { return lingering_.load(std::memory_order_relaxed); }
  // Whether a readable fd (OfiCq::Watch's owner) announces everything
  // CheckPeer looks for: the bootstrap socket (RDM: the peer's FIN and
  // end), until the end is known and only the linger is left. Set before
  // the endpoint joins its CQ.
  bool LivenessByReadiness() const {
    return liveness_by_readiness_ && !lingering_.load(std::memory_order_relaxed);
  }
  // Periodic liveness check (liveness.cc); returns true once the peer is
  // gone. A peer that closed gracefully is gone once what it announced
  // has been delivered, or no receive has met anything for a while.
  bool CheckPeer();

 protected:
  // `ep`: the fi endpoint of user messages and RMA, bound to `fcq` (wait fd
  // `fcq_fd`, or -1); `peer`: the address its operations name (RDM: the
  // peer's entry in the address vector). `connected`: whether it is up
  // already (MSG: only once Connected). `liveness_by_readiness`: see
  // LivenessByReadiness.
  OfiEndpoint(OfiFabric* fabric, OfiCq* cq, fid_ep* ep, fid_cq* fcq, int fcq_fd, fi_addr_t peer,
              EndpointInfo info, bool connected, bool liveness_by_readiness);

  // ---- what each kind provides ----

  // Posts control send / receive `req` (its bytes in req->owned).
  virtual int PostControlSend(Request* req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) = 0;
  virtual int PostControlRecv(Request* req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) = 0;
  // The names of the calls that post sends and receives, for errors.
  virtual const char* SendCall() const = 0;
  virtual const char* RecvCall() const = 0;
  // Hands the FIN record `fin` to the peer (SendFin).
  virtual void SendFinLocked(std::span<const uint8_t> fin, CompletionList* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) = 0;
  // Whether the transport says the peer has ended (CheckPeer); may record
  // its FIN (fin_, fin_count_) and that nothing more can arrive (data_gone_).
  virtual bool PeerEnded() = 0;
  // Takes the fds that signal the peer's end out of the CQ's wait set.
  virtual void UnwatchConnectionLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) = 0;
  // Shutdown: ends the connection's own objects, before ep_ is closed...
  virtual void CloseConnectionLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) = 0;
  // ... and what the endpoints were bound to, after the fi CQ is drained.
  virtual void CloseBindingsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) = 0;

  // ---- for the subclasses ----

  // Closes the endpoint and leaves its CQ; first in a subclass's
  // destructor, while the CQ may still call its virtual methods.
  void CloseAndDetach();

  // Posts `r` for buffer [buf, +len) (`mr` may be null): `post(req, desc)`
  // makes the libfabric call with the buffer's descriptor. On failure `r`
  // is recycled.
  template <typename Post>
  absl::Status SubmitWithDesc(Request* r, MemoryRegion* mr, const void* buf, size_t len,
                              const Post& post) {
    auto d = Desc(mr, buf, len, r);
    if (!d.ok()) return d.status();
    void* desc = *d;
    // By value: an operation that meets EAGAIN is posted again later.
    return Submit(r, [=](Request* req) { return post(req, desc); });
  }

  // An injected send (Capabilities::inject_size, kInjectContext): by
  // `inject_now()` (fi_inject / fi_tinject, named `call`), which copies the
  // bytes and reports nothing; when the provider says EAGAIN (or sends
  // wait in the backlog, to stay behind them), a copy goes by `post(req,
  // desc)` as an ordinary send whose completion is dropped
  // (CompleteLocked). Either way it counts toward the FIN's message count
  // once it is handed over. libfabric's tcp may still hold an injected
  // message in its own queue when the call returns, and fi_close drops that
  // queue: an endpoint closed right after an injected send may lose it (no
  // completion was promised; an ordinary send after it completes only once
  // it has gone, docs/ofi.md). Always inline: the caller's Send then pays
  // one function's entry and exit on this path, as it does on the others.
  template <typename InjectNow, typename Post>
  ABSL_ATTRIBUTE_ALWAYS_INLINE absl::Status InjectWith(const void* buf, size_t len, const char* call,
                                                    const InjectNow& inject_now, const Post& post) {
    if (len > fab_->caps().inject_size) return InjectTooLarge(len);
    {
      DomLock lock(&fab_->dom_mu());
      if (DownLocked()) return DownStatusLocked();
      if (MayPostNowLocked()) {
        ssize_t rc = inject_now();
        if (rc == 0) {
          CountUserSendLocked();
          return absl::OkStatus();
        }
        if (rc != -FI_EAGAIN) {
          return FiError(static_cast<int>(rc), call, "the provider refused the operation; check sizes");
        }
      }
    }
    auto* r = NewRequest(OpType::kSend, kInjectContext, len);
    r->owned.assign(static_cast<const uint8_t*>(buf), static_cast<const uint8_t*>(buf) + len);
    return SubmitWithDesc(r, nullptr, r->owned.data(), len, post);
  }

  Request* NewRequest(OpType op, uint64_t context, size_t len) {
    auto* r = RequestCache::Get();
    r->op = op;
    r->context = context;
    r->ep = this;
    r->len = len;
    return r;
  }
  // A control send carrying a copy of `bytes`.
  Request* NewControlSend(std::span<const uint8_t> bytes);

  // Whether another user send may go to libfabric now (SetFlow).
  bool FlowOpenLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    return flow_.open();
  }
  // Whether a user send may go to libfabric ahead of the backlog: nothing
  // waits there, and the window is open.
  bool MayPostNowLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    return backlog_.empty() && FlowOpenLocked();
  }
  // A user send was handed over and needs no completion (injected).
  void CountUserSendLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    ++user_sent_ok_;
    flow_.Posted();
  }
  // Whether new operations fail at once: the endpoint is closed, dead, or
  // its connection is known lost (failed_) and shutting down.
  bool DownLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    return closed_ || dead_ || !failed_.ok();
  }
  // Why an operation cannot start on such an endpoint.
  absl::Status DownStatusLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu());

  // Called by ProgressLocked and Shutdown with the domain lock held.
  void CompleteLocked(Request* r, absl::Status st, size_t len, CompletionList* out,
                      std::vector<std::vector<uint8_t>>* control)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu());

  OfiFabric* fab_;
  OfiCq* cq_;
  fid_ep* ep_;     // user messages and RMA; null once shut down
  fid_cq* fcq_;    // this endpoint's own fi CQ
  int fcq_fd_;     // its wait fd, or -1
  fi_addr_t peer_;
  EndpointInfo info_;
  bool connected_;  // MSG: false until both halves are connected
  bool poll_hint_ = true;  // see MayHaveWorkLocked (domain lock)
  bool read_since_look_ = false;  // ProgressLocked ran since the last MayNeedReadBeforeSleepLocked
  bool liveness_by_readiness_;  // see LivenessByReadiness
  bool data_gone_ = false;  // nothing more can arrive from the peer (MSG: FI_SHUTDOWN of ep_)
  uint64_t user_sent_ok_ = 0;   // user sends completed successfully
  FlowWindow flow_;             // flow control (SetFlow): our user sends against the window
  CompletionList injected_;     // RdmEndpoint::TryInject's completions, for ProgressLocked
  uint64_t user_received_ = 0;  // user messages consumed by receives
  bool fin_ = false;            // the peer announced its close
  uint64_t fin_count_ = 0;      // ... after sending this many messages
  bool closed_ = false;
  bool dead_ = false;
  RequestList outstanding_;
  Request* fin_req_ = nullptr;  // the FIN a subclass's SendFinLocked waits for (MSG)

 private:
  using PostFn = std::function<int(Request*)>;

  // `post` is any callable int(Request*); it becomes a PostFn (a heap
  // allocation) only when the operation must wait in the backlog.
  template <typename Post>
  absl::Status Submit(Request* r, const Post& post) {
    DomLock lock(&fab_->dom_mu());
    if (DownLocked()) {
      RequestCache::Put(r);
      return DownStatusLocked();
    }
    outstanding_.insert(r);
    const bool user_send = IsUserSend(r);
    if (!backlog_.empty() || (user_send && !FlowOpenLocked())) {
      backlog_.emplace_back(r, post);  // the window opens when the peer reports
      return absl::OkStatus();
    }
    int rc = post(r);
    if (rc == -FI_EAGAIN) {
      backlog_.emplace_back(r, post);  // retried by progress
      return absl::OkStatus();
    }
    if (rc == 0 && user_send) flow_.Posted();
    if (rc != 0) return PostFailedLocked(r, rc);
    poll_hint_ = true;
    cq_->PostedLocked();
    return absl::OkStatus();
  }

  // The descriptor for a local buffer. FI_MR_LOCAL: a buffer passed without
  // its region gets one from the registration cache (DescFromCache), held
  // by the request until it completes. On failure, `r` is recycled.
  absl::StatusOr<void*> Desc(MemoryRegion* mr, const void* buf, size_t len, Request* r) {
    if (mr != nullptr) return mr->desc();
    if (!fab_->local_mr() || len == 0) return nullptr;
    return DescFromCache(buf, len, r);
  }
  absl::StatusOr<void*> DescFromCache(const void* buf, size_t len, Request* r);

  static bool IsUserSend(const Request* r) { return r->op == OpType::kSend && !r->control; }
  // The libfabric call that posts `r`, for error messages.
  const char* CallName(const Request* r) const;
  absl::Status PostFailedLocked(Request* r, int rc) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu());
  absl::Status InjectTooLarge(size_t len) const;

  // CompleteLocked's cases: a control message's send or receive, and the
  // copy of an injected send.
  void CompleteControlLocked(Request* r, const absl::Status& st, size_t len,
                             std::vector<std::vector<uint8_t>>* control)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu());
  void CompleteInjectCopyLocked(Request* r, const absl::Status& st)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu());
  // Hands on the injected sends' completions; returns how many. Inline,
  // as RetryLocked's check: every poll of every endpoint runs them.
  size_t TakeInjectedLocked(CompletionList* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    const size_t n = injected_.size();
    if (n == 0) return 0;
    for (Completion& c : injected_) cq_->EmitSlot(out) = std::move(c);
    injected_.clear();
    return n;
  }
  absl::Status PostControlRecvLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu());
  bool UserRecvPostedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu());
  void ReportConsumedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu());
  // Retries what met EAGAIN or waits for the window: operations in the
  // backlog, and a flow report.
  void RetryLocked(CompletionList* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu()) {
    if (credit_due_ || !backlog_.empty()) RetryBacklogLocked(out);
  }
  void RetryBacklogLocked(CompletionList* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu());

  // RMA and atomics (endpoint_rma.cc).
  absl::Status Rma(OpType op, void* local, size_t len, MemoryRegion* mr, uint64_t remote_addr,
                   const RemoteKey& rkey, uint64_t context);
  int WriteDelivered(void* local, size_t len, void* desc, uint64_t addr, uint64_t key, Request* req);
  absl::Status Atomic(OpType op, uint64_t* result, uint64_t remote_addr, const RemoteKey& rkey,
                      uint64_t a, uint64_t b, uint64_t context);

  // The peer's close (liveness.cc).
  void SendFin();
  // The peer has ended: takes what the provider finished first; true while
  // the endpoint lingers for what the peer announced.
  bool AwaitAnnouncedData();
  void StartLingerLocked(int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu());
  // Ends the endpoint: the fi endpoint is closed (the provider touches no
  // user buffer afterwards), the CQ is drained of its completions, and
  // every operation still outstanding completes with `why`.
  void Shutdown(const absl::Status& why, bool closed);
  void DrainAndCloseCqLocked(CompletionList* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu());
  // An operation of ours failed with `st`: sets failed_ if that means the
  // connection is gone.
  void NoteFailureLocked(const Request* r, const absl::Status& st)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(fab_->dom_mu());

  bool credit_due_ = false;     // a report met EAGAIN: again at the next progress
  bool peer_closed_ = false;    // its end was seen; delivering what it sent
  // peer_closed_, for OfiCq::Progress: the end is known and CheckPeer
  // finishes it later (the last data arrives, or the linger runs out),
  // which no fd announces: checked at every wake-up and tick.
  std::atomic<bool> lingering_{false};
  int64_t last_delivery_ns_ = 0;   // when CheckPeer last saw user_received_ move (or the close)
  uint64_t received_at_look_ = 0;  // user_received_ then
  absl::Status dead_status_;
  // The connection is lost (an operation failed as only a lost connection
  // fails it, or an injected send's copy failed): new operations fail with
  // this at once, and CheckPeer shuts the endpoint down.
  absl::Status failed_;
  std::deque<std::pair<Request*, PostFn>> backlog_;
  RawKeyMap raw_keys_;
};

}  // namespace zsock::ofi

#endif  // ZSOCK_PROVIDERS_OFI_ENDPOINT_H_
