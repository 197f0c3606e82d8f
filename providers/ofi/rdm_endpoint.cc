// RdmEndpoint: tagged sends and receives to the one peer, injected sends,
// and the bootstrap socket as the FIN's carrier and the liveness signal.
#include "providers/ofi/rdm_endpoint.h"

#include <rdma/fi_tagged.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <cerrno>

#include "core/flow_window.h"

namespace zsock::ofi {
namespace {

constexpr uint64_t kUserTag = 0x1;
constexpr uint64_t kControlTag = 0x2;

}  // namespace

RdmEndpoint::RdmEndpoint(OfiFabric* fabric, OfiCq* cq, fid_ep* ep, fid_av* av, fid_cq* fcq,
                         int fcq_fd, fi_addr_t peer, Fd oob, EndpointInfo info)
    : OfiEndpoint(fabric, cq, ep, fcq, fcq_fd, peer, std::move(info), /*connected=*/true,
                  /*liveness_by_readiness=*/oob.get() >= 0),
      av_(av), oob_(std::move(oob)) {
  {
    // Watched before Attach publishes the endpoint, under the lock its
    // Shutdown takes: once attached, the CQ's progress may shut it down
    // (a dead peer) and close these fds while this thread still reads them.
    DomLock lock(&fab_->dom_mu());
    cq_->Watch(oob_.get(), this);
    if (fcq_fd_ >= 0) cq_->Watch(fcq_fd_);
  }
  cq_->Attach(this);
  // A sleeper may have taken the watches' first readiness before the
  // endpoint was in the list: it polls again.
  cq_->Wake();
}

// Inline, as TryInject: on Send's path.
inline absl::Status RdmEndpoint::Inject(const void* buf, size_t len) {
  return InjectWith(
      buf, len, "fi_tinject", [&] { return fi_tinject(ep_, buf, len, peer_, kUserTag); },
      [this](Request* req, void* desc) {
        return fi_tsend(ep_, req->owned.data(), req->len, desc, peer_, kUserTag, &req->fi_ctx);
      });
}

// A send of at most inject_size bytes (only shm has one), injected: the
// provider copies it out at once, needs no descriptor and reports no
// completion. Its one Completion waits in injected_, under the domain lock
// held here anyway, for the next progress of the CQ (ProgressLocked),
// which hands it straight to a polling caller: pushed from here it would
// take the CQ's own lock and queue, and the poll that took it a second
// lock. ArmProvider looks at injected_ under the same lock, so WakeSleeper
// here wakes a sleeper that missed it. *injected = false when it cannot go
// now (a backlog to stay behind, or EAGAIN): the caller posts it normally.
inline absl::Status RdmEndpoint::TryInject(const void* buf, size_t len, uint64_t context, bool* injected) {
  DomLock lock(&fab_->dom_mu());
  if (DownLocked()) return DownStatusLocked();
  if (!MayPostNowLocked()) return absl::OkStatus();
  ssize_t rc = fi_tinject(ep_, buf, len, peer_, kUserTag);
  if (rc == -FI_EAGAIN) return absl::OkStatus();
  if (rc != 0) {
    return FiError(static_cast<int>(rc), "fi_tinject",
                   "the provider refused the operation; check sizes");
  }
  CountUserSendLocked();
  *injected = true;
  Completion& c = injected_.emplace_back();
  c.context = context;
  c.op = OpType::kSend;
  c.endpoint = this;
  c.length = len;
  cq_->WakeSleeper();
  return absl::OkStatus();
}

absl::Status RdmEndpoint::Send(const void* buf, size_t len, MemoryRegion* mr, uint64_t context) {
  if (context == kInjectContext && fab_->caps().inject_size > 0) return Inject(buf, len);
  if (len <= fab_->inject_size() && fab_->inject_size() > 0) {
    bool injected = false;
    if (absl::Status st = TryInject(buf, len, context, &injected); !st.ok() || injected) return st;
  }
  return SubmitWithDesc(NewRequest(OpType::kSend, context, len), mr, buf, len,
                        [=, this](Request* req, void* desc) {
                          return fi_tsend(ep_, buf, len, desc, peer_, kUserTag, &req->fi_ctx);
                        });
}

absl::Status RdmEndpoint::PostRecv(void* buf, size_t len, MemoryRegion* mr, uint64_t context) {
  return SubmitWithDesc(NewRequest(OpType::kRecv, context, len), mr, buf, len,
                        [=, this](Request* req, void* desc) {
                          return fi_trecv(ep_, buf, len, desc, peer_, kUserTag, 0, &req->fi_ctx);
                        });
}

int RdmEndpoint::PostControlSend(Request* req) {
  return static_cast<int>(fi_tsend(ep_, req->owned.data(), req->owned.size(), nullptr, peer_,
                                   kControlTag, &req->fi_ctx));
}

int RdmEndpoint::PostControlRecv(Request* req) {
  return static_cast<int>(fi_trecv(ep_, req->owned.data(), req->owned.size(), nullptr, peer_,
                                   kControlTag, 0, &req->fi_ctx));
}

// On the bootstrap socket, which TCP delivers before the socket's end: no
// wait for the peer.
void RdmEndpoint::SendFinLocked(std::span<const uint8_t> fin, CompletionList* out) {
  (void)::send(oob_.get(), fin.data(), fin.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

// The bootstrap socket's end, after the FIN record if the peer closed
// gracefully; bytes that are no FIN mean the peer is no zsock ofi peer any
// more.
bool RdmEndpoint::PeerEnded() {
  uint8_t fin[kRecordSize];
  ssize_t n = ::recv(oob_.get(), fin, sizeof(fin), MSG_PEEK | MSG_DONTWAIT);
  uint64_t count = 0;
  if (n == static_cast<ssize_t>(sizeof(fin)) && DecodeRecord(fin, kFinMarker, &count)) {
    (void)::recv(oob_.get(), fin, sizeof(fin), MSG_DONTWAIT);
    DomLock lock(&fab_->dom_mu());
    fin_ = true;
    fin_count_ = count;
    n = ::recv(oob_.get(), fin, 1, MSG_PEEK | MSG_DONTWAIT);
  }
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) ||
         (n > 0 && fin[0] != kFinMarker);
}

void RdmEndpoint::UnwatchConnectionLocked() {
  if (oob_) cq_->Unwatch(oob_.get());
}

void RdmEndpoint::CloseConnectionLocked() {
  if (oob_) {
    ::shutdown(oob_.get(), SHUT_RDWR);
    cq_->Unwatch(oob_.get());
  }
}

void RdmEndpoint::CloseBindingsLocked() {
  if (av_) {
    fi_close(&av_->fid);
    av_ = nullptr;
  }
  if (!peer_shm_region_.empty()) {
    ::shm_unlink(peer_shm_region_.c_str());  // ENOENT when the peer closed first
    peer_shm_region_.clear();
  }
}

}  // namespace zsock::ofi
