// MsgEndpoint: untagged sends and receives on the data connection, control
// messages on the control connection, the FIN as a control message, the
// event queue as the liveness signal, and the sockets of cq_wait=sockets.
#include "providers/ofi/msg_endpoint.h"

#include <rdma/fi_cm.h>
#include <sched.h>
#include <sys/socket.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/log.h"
#include "core/status.h"
#include "providers/ofi/host_port.h"
#include "providers/ofi/tcp_socket.h"

namespace zsock::ofi {

MsgEndpoint::MsgEndpoint(OfiFabric* fabric, OfiCq* cq, fid_ep* ep, fid_ep* cep, fid_eq* eq,
                         int eq_fd, fid_cq* fcq, int fcq_fd, EndpointInfo info)
    : OfiEndpoint(fabric, cq, ep, fcq, fcq_fd, /*peer=*/0, std::move(info), /*connected=*/false,
                  /*liveness_by_readiness=*/false),
      cep_(cep), eq_(eq), eq_fd_(eq_fd) {}

absl::Status MsgEndpoint::Connected() {
  if (absl::Status st = FindSockets(); !st.ok()) return st;
  // Not by readiness: libfabric tcp queues FI_SHUTDOWN (and signals the
  // event queue's fd) only from its own progress, which fi_eq_read
  // drives, so CheckPeer reads the queue at every wake-up and tick.
  liveness_by_readiness_ = false;
  {
    // Watched before Attach publishes the endpoint, under the lock its
    // Shutdown takes.
    DomLock lock(&fab_->dom_mu());
    connected_ = true;
    if (eq_fd_ >= 0) cq_->Watch(eq_fd_);
    if (fcq_fd_ >= 0) cq_->Watch(fcq_fd_);
    for (const Fd& sock : sockets_) {
      if (sock) cq_->WatchSocket(sock.get(), this);
    }
  }
  cq_->Attach(this);
  // A sleeper may have taken the edges of the watches above before the
  // endpoint was in the list: it polls again (and reads this endpoint,
  // whose first read is due).
  cq_->Wake();
  return absl::OkStatus();
}

absl::Status MsgEndpoint::FindSockets() {
  std::array<sockaddr_storage, 2> local{}, peer{};
  std::array<bool, 2> named{};
  {
    DomLock lock(&fab_->dom_mu());
    sockaddr_storage ss{};
    size_t len = sizeof(ss);
    if (fi_getname(&ep_->fid, &ss, &len) == 0) info_.local_address = FormatHostPort(ss);
    len = sizeof(ss);
    if (fi_getpeer(ep_, &ss, &len) == 0) info_.peer_address = FormatHostPort(ss);
    if (fab_->wait_sockets()) {
      for (int i = 0; i < 2; ++i) {
        fid_ep* e = i == 0 ? ep_ : cep_;
        size_t ll = sizeof(local[i]), pl = sizeof(peer[i]);
        named[i] = fi_getname(&e->fid, &local[i], &ll) == 0 && fi_getpeer(e, &peer[i], &pl) == 0;
      }
    }
  }
  if (!fab_->wait_sockets()) return absl::OkStatus();
  // The search outside the domain lock: it may list every fd.
  for (int i = 0; i < 2; ++i) {
    if (!named[i]) {
      return MakeError(absl::StatusCode::kUnavailable, ECONNRESET,
                       absl::StrCat("the ofi connection to ", info_.peer_address,
                                    " ended while it was set up (no peer address)"),
                       "check the peer's log");
    }
    sockets_[i] = FindTcpSocket(local[i], peer[i]);
    if (!sockets_[i]) {
      // Without it a blocked wait would not wake for this connection.
      const int err = errno;
      return ErrnoError(err, absl::StrCat("cq_wait=sockets: the TCP socket of the ofi connection to ",
                                          info_.peer_address, " was not found in /proc/self/fd or "
                                          "could not be duplicated"),
                        err == EMFILE || err == ENFILE ? "raise the fd limit (ulimit -n), or write cq_wait=fd"
                                                       : "write cq_wait=fd");
    }
  }
  return absl::OkStatus();
}

// Inline: on Send's path.
inline absl::Status MsgEndpoint::Inject(const void* buf, size_t len) {
  return InjectWith(
      buf, len, "fi_inject", [&] { return fi_inject(ep_, buf, len, 0); },
      [this](Request* req, void* desc) {
        return fi_send(ep_, req->owned.data(), req->len, desc, 0, &req->fi_ctx);
      });
}

absl::Status MsgEndpoint::Send(const void* buf, size_t len, MemoryRegion* mr, uint64_t context) {
  if (context == kInjectContext && fab_->caps().inject_size > 0) return Inject(buf, len);
  return SubmitWithDesc(NewRequest(OpType::kSend, context, len), mr, buf, len,
                        [=, this](Request* req, void* desc) {
                          return fi_send(ep_, buf, len, desc, 0, &req->fi_ctx);
                        });
}

absl::Status MsgEndpoint::PostRecv(void* buf, size_t len, MemoryRegion* mr, uint64_t context) {
  return SubmitWithDesc(NewRequest(OpType::kRecv, context, len), mr, buf, len,
                        [=, this](Request* req, void* desc) {
                          return fi_recv(ep_, buf, len, desc, 0, &req->fi_ctx);
                        });
}

// libfabric tcp serves one request per progress and leaves the next ones
// in the socket, with no new edge (a pipeline of RMA requests completes
// nothing on the target: OfiSockets.PipelinedRmaToASleepingTargetCompletes
// stalled without this look). Bytes it does not take are a message it
// holds until a receive is posted (sleeping on that is right; a post wakes
// us). TcpReadProgress is exact where a count of unread bytes alone could
// come out the same by coincidence.
bool MsgEndpoint::SocketsMovedLocked() {
  bool moved = false;
  for (int i = 0; i < 2; ++i) {
    if (!sockets_[i]) continue;
    uint64_t consumed = 0;
    int unread = 0;
    if (!TcpReadProgress(sockets_[i].get(), &consumed, &unread)) continue;
    moved |= unread > 0 && consumed != last_consumed_[i];
    last_consumed_[i] = consumed;
  }
  return moved;
}

void MsgEndpoint::AppendTrywaitFidsLocked(bool cq_waits, std::vector<fid*>* fids) {
  OfiEndpoint::AppendTrywaitFidsLocked(cq_waits, fids);
  if (eq_ != nullptr) fids->push_back(&eq_->fid);
}

int MsgEndpoint::PostControlSend(Request* req) {
  return static_cast<int>(
      fi_send(cep_, req->owned.data(), req->owned.size(), nullptr, 0, &req->fi_ctx));
}

int MsgEndpoint::PostControlRecv(Request* req) {
  return static_cast<int>(
      fi_recv(cep_, req->owned.data(), req->owned.size(), nullptr, 0, &req->fi_ctx));
}

// A control message, waited for (locally, at most one second) until it is
// in the provider's socket.
void MsgEndpoint::SendFinLocked(std::span<const uint8_t> fin, CompletionList* out) {
  auto* r = NewControlSend(fin);
  outstanding_.insert(r);
  const int64_t deadline = absl::GetCurrentTimeNanos() + 1000000000;
  int rc;
  while ((rc = PostControlSend(r)) == -FI_EAGAIN && absl::GetCurrentTimeNanos() < deadline) {
    ProgressLocked(out, nullptr);
  }
  if (rc != 0) {
    outstanding_.erase(r);
    RequestCache::Put(r);
    return;
  }
  // CompleteLocked clears fin_req_ (the request itself is recycled).
  fin_req_ = r;
  while (fin_req_ != nullptr && absl::GetCurrentTimeNanos() < deadline) {
    ProgressLocked(out, nullptr);
    if (fin_req_ != nullptr) sched_yield();
  }
  fin_req_ = nullptr;
}

// The control connection's FI_SHUTDOWN (its end follows the FIN in its
// byte stream) or an event queue error.
bool MsgEndpoint::PeerEnded() {
  DomLock lock(&fab_->dom_mu());
  if (eq_ == nullptr) return eq_gone_;
  for (;;) {
    uint32_t event = 0;
    fi_eq_cm_entry entry{};
    ssize_t n = fi_eq_read(eq_, &event, &entry, sizeof(entry), 0);
    if (n == -FI_EAVAIL) {
      fi_eq_err_entry err{};
      if (fi_eq_readerr(eq_, &err, 0) > 0) {
        ZS_LOG(kInfo, "ofi connection to %s: event queue error: %s", info_.peer_address,
               fi_strerror(err.err < 0 ? -err.err : err.err));
        eq_gone_ = true;
      }
      continue;
    }
    if (n <= 0) break;
    if (event == FI_SHUTDOWN) {
      eq_gone_ = true;
      // The data connection's end: the provider reads a connection's
      // bytes only into posted receives, so everything sent before it is
      // in our CQ by now; nothing more can come (a truncation ends it too).
      if (entry.fid == &ep_->fid) data_gone_ = true;
    }
  }
  return eq_gone_;
}

void MsgEndpoint::UnwatchConnectionLocked() {
  if (eq_fd_ >= 0) cq_->Unwatch(eq_fd_);
  for (const Fd& sock : sockets_) {
    if (sock) cq_->Unwatch(sock.get());
  }
}

void MsgEndpoint::CloseConnectionLocked() {
  // Our duplicates go first: the fi_close below closes the sockets.
  UnwatchConnectionLocked();
  for (Fd& sock : sockets_) sock.reset();
  if (cep_) {
    fi_shutdown(cep_, 0);
    fi_close(&cep_->fid);
    cep_ = nullptr;
  }
  if (ep_) fi_shutdown(ep_, 0);
}

void MsgEndpoint::CloseBindingsLocked() {
  if (eq_) {
    fi_close(&eq_->fid);
    eq_ = nullptr;
    eq_fd_ = -1;
  }
}

}  // namespace zsock::ofi
