// MSG connection set-up: the passive endpoint's listener, which pairs the
// two connection requests of each zsock connection, connecting, and
// establishing a MsgEndpoint on either side.
#include "providers/ofi/connect.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/cq_cast.h"
#include "core/log.h"
#include "core/mutex.h"
#include "core/status.h"
#include "providers/ofi/cq.h"
#include "providers/ofi/errors.h"
#include "providers/ofi/event_queue.h"
#include "providers/ofi/fabric.h"
#include "providers/ofi/handshake.h"
#include "providers/ofi/host_port.h"
#include "providers/ofi/msg_endpoint.h"

namespace zsock::ofi {
namespace {

// fi_getinfo for MSG endpoints at `address` of `fabric`'s provider (a
// listener's with FI_SOURCE); `*hp` gets the address as "IP:PORT". A
// failure names `what` and the address, and says `fix`.
absl::StatusOr<fi_info*> GetMsgInfo(OfiFabric* fabric, absl::string_view address, uint64_t flags,
                                    absl::string_view what, absl::string_view fix, std::string* hp) {
  socklen_t sl = 0;
  auto ss = ParseHostPort(address, &sl);
  if (!ss.ok()) return ss.status();
  *hp = FormatHostPort(*ss);
  std::string host = hp->substr(0, hp->rfind(':')), port = hp->substr(hp->rfind(':') + 1);
  if (!host.empty() && host[0] == '[') host = host.substr(1, host.size() - 2);
  const fi_info* fab = fabric->info();
  fi_info* hints = MakeHints(fabric->settings(), FI_EP_MSG, fab->caps & (FI_MSG | FI_RMA | FI_ATOMIC),
                             kMrModes);
  free(hints->fabric_attr->prov_name);
  hints->fabric_attr->prov_name = strdup(fab->fabric_attr->prov_name);
  fi_info* info = nullptr;
  int rc = fi_getinfo(kFiVersion, host.c_str(), port.c_str(), flags, hints, &info);
  fi_freeinfo(hints);
  if (rc != 0) return FiError(rc, absl::StrCat(what, *hp), fix);
  return info;
}

// The two fi endpoints bound to one event queue and one fi CQ, enabled.
absl::Status OpenMsgPartsLocked(OfiFabric* fabric, fi_info* data_info, fi_info* ctrl_info,
                                EndpointParts* p) {
  int rc;
  if (auto st = OpenEq(fabric->fabric(), &p->eq, &p->eq_fd); !st.ok()) return st;
  for (auto [info, e] : {std::pair{data_info, &p->ep}, std::pair{ctrl_info, &p->cep}}) {
    if ((rc = fi_endpoint(fabric->domain(), info, e, nullptr)) != 0) return FiError(rc, "fi_endpoint");
  }
  if (auto st = OpenEndpointCq(fabric->domain(), fabric->fi_wait_fd(), &p->fcq, &p->fcq_fd); !st.ok()) {
    return st;
  }
  for (fid_ep* e : {p->ep, p->cep}) {
    if ((rc = fi_ep_bind(e, &p->eq->fid, 0)) != 0) return FiError(rc, "fi_ep_bind(eq)");
    if ((rc = fi_ep_bind(e, &p->fcq->fid, FI_TRANSMIT | FI_RECV)) != 0) return FiError(rc, "fi_ep_bind(cq)");
    if ((rc = fi_enable(e)) != 0) return FiError(rc, "fi_enable");
  }
  return absl::OkStatus();
}

// fi_connect of both halves to `dest` (active side, data half first), or
// fi_accept of both requests (passive side: `dest` null).
absl::Status StartConnecting(OfiFabric* fabric, fid_ep* ep, fid_ep* cep, const void* dest, uint64_t nonce) {
  DomLock lock(&fabric->dom_mu());
  int rc;
  if (dest != nullptr) {
    CmData cm{kHelloMagic, kHelloVersion, kCmData, 0, nonce};
    if ((rc = fi_connect(ep, dest, &cm, sizeof(cm))) != 0) return FiError(rc, "fi_connect");
    cm.kind = kCmControl;
    if ((rc = fi_connect(cep, dest, &cm, sizeof(cm))) != 0) return FiError(rc, "fi_connect");
  } else {
    if ((rc = fi_accept(ep, nullptr, 0)) != 0) return FiError(rc, "fi_accept");
    if ((rc = fi_accept(cep, nullptr, 0)) != 0) return FiError(rc, "fi_accept");
  }
  return absl::OkStatus();
}

// Waits for FI_CONNECTED on both halves.
absl::Status WaitConnected(OfiFabric* fabric, const EndpointParts& p, absl::Time deadline,
                           const std::string& what) {
  bool data_up = false, ctrl_up = false;
  while (!data_up || !ctrl_up) {
    CmEvent ev{};
    size_t len = 0;
    auto event = EqNext(&fabric->dom_mu(), p.eq, p.eq_fd, &ev, &len, deadline, what);
    if (!event.ok()) return event.status();
    if (*event == FI_CONNECTED) {
      if (ev.entry()->fid == &p.ep->fid) data_up = true;
      if (ev.entry()->fid == &p.cep->fid) ctrl_up = true;
    } else if (*event == FI_SHUTDOWN) {
      return MakeError(absl::StatusCode::kUnavailable, ECONNRESET,
                       absl::StrCat(what, ": the peer shut the connection down while it was set up"),
                       "check the peer's log");
    }
  }
  return absl::OkStatus();
}

// Makes an endpoint of a data and a control fi endpoint and connects
// them: fi_connect to `dest` (active side) or fi_accept of the two
// connection requests (passive side); waits for FI_CONNECTED on both.
absl::StatusOr<std::unique_ptr<Endpoint>> EstablishMsg(OfiFabric* fabric, fi_info* data_info,
                                                       fi_info* ctrl_info, const void* dest,
                                                       uint64_t nonce, CompletionQueue* cq,
                                                       absl::Time deadline) {
  auto ocq = CqOf<OfiCq>(cq, "ofi", fabric);
  if (!ocq.ok()) return ocq.status();
  EndpointParts p;
  if (auto st = OpenParts(fabric, &p,
                          [&](EndpointParts* parts) {
                            return OpenMsgPartsLocked(fabric, data_info, ctrl_info, parts);
                          });
      !st.ok()) {
    return st;
  }
  // The endpoint owns the fi objects from here; it joins the CQ once
  // connected (until then nothing else reads its event queue).
  auto endpoint = std::make_unique<MsgEndpoint>(
      fabric, *ocq, p.ep, p.cep, p.eq, p.eq_fd, p.fcq, p.fcq_fd,
      fabric->NewEndpointInfo(" (connected FI_EP_MSG endpoints)"));
  const std::string what = dest != nullptr ? "connecting an ofi endpoint" : "accepting an ofi connection";
  if (auto st = endpoint->Start(); !st.ok()) return st;  // control receives before the peer can send
  if (auto st = StartConnecting(fabric, p.ep, p.cep, dest, nonce); !st.ok()) return st;
  if (auto st = WaitConnected(fabric, p, deadline, what); !st.ok()) return st;
  if (auto st = endpoint->Connected(); !st.ok()) return st;
  return std::unique_ptr<Endpoint>(std::move(endpoint));
}

class MsgListener final : public Listener {
 public:
  MsgListener(OfiFabric* fabric, fid_pep* pep, fid_eq* eq, int eq_fd, std::string address)
      : fabric_(fabric), pep_(pep), eq_(eq), eq_fd_(eq_fd), address_(std::move(address)) {}
  ~MsgListener() override {
    MutexLock lock(&mu_);
    for (auto& p : pending_) {
      {
        DomLock dom(&fabric_->dom_mu());
        fi_reject(pep_, p.info->handle, nullptr, 0);
      }
      fi_freeinfo(p.info);
    }
    fi_close(&pep_->fid);
    fi_close(&eq_->fid);
  }
  std::string address() const override { return address_; }
  int fd() const override { return eq_fd_; }

  absl::StatusOr<std::unique_ptr<Endpoint>> Accept(CompletionQueue* cq, absl::Duration timeout) override {
    absl::Time deadline = absl::Now() + timeout;
    MutexLock lock(&mu_);
    auto data = Take(kCmData, 0, deadline);
    if (!data.ok()) return data.status();
    // The control half follows within the connect timeout.
    absl::Time ctrl_deadline = absl::Now() + fabric_->settings().connect_timeout;
    auto ctrl = Take(kCmControl, data->cm.nonce, ctrl_deadline);
    if (!ctrl.ok()) {
      Reject(data->info);
      return ctrl.status();
    }
    auto ep = EstablishMsg(fabric_, data->info, ctrl->info, nullptr, data->cm.nonce, cq,
                           std::max(ctrl_deadline, absl::Now() + absl::Seconds(1)));
    fi_freeinfo(data->info);
    fi_freeinfo(ctrl->info);
    return ep;
  }

 private:
  struct Pending {
    fi_info* info;
    CmData cm;
  };

  void Reject(fi_info* info) {
    {
      DomLock dom(&fabric_->dom_mu());
      fi_reject(pep_, info->handle, nullptr, 0);
    }
    fi_freeinfo(info);
  }

  // The next connection request of `kind` (and, for control, `nonce`);
  // others wait in pending_ for their own Accept.
  absl::StatusOr<Pending> Take(uint8_t kind, uint64_t nonce, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (;;) {
      for (auto it = pending_.begin(); it != pending_.end(); ++it) {
        if (it->cm.kind == kind && (kind == kCmData || it->cm.nonce == nonce)) {
          Pending p = *it;
          pending_.erase(it);
          return p;
        }
      }
      if (absl::Status st = ReadRequest(deadline); !st.ok()) return st;
    }
  }

  // Reads the next event; a zsock connection request joins pending_, any
  // other is rejected.
  absl::Status ReadRequest(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    CmEvent ev{};
    size_t len = 0;
    bool error_entry = false;
    auto event = EqNext(&fabric_->dom_mu(), eq_, eq_fd_, &ev, &len, deadline,
                        absl::StrCat("accepting on ofi address ", address_), &error_entry);
    if (!event.ok()) {
      if (event.status().code() == absl::StatusCode::kDeadlineExceeded) {
        return MakeError(absl::StatusCode::kDeadlineExceeded, ETIMEDOUT,
                         absl::StrCat("no connection arrived at ofi address ", address_, " in time"),
                         "connect a peer to this address, or wait longer");
      }
      if (!error_entry) return event.status();
      ZS_LOG(kInfo, "%s", event.status().ToString());
      return absl::OkStatus();  // a failed request (an error entry) does not end the listener
    }
    if (*event != FI_CONNREQ) return absl::OkStatus();
    fi_info* info = ev.entry()->info;
    CmData cm{};
    if (len < sizeof(fi_eq_cm_entry) + sizeof(cm)) {
      Reject(info);
      return absl::OkStatus();
    }
    std::memcpy(&cm, ev.data(), sizeof(cm));
    if (cm.magic != kHelloMagic || cm.version != kHelloVersion || cm.kind > kCmControl) {
      ZS_LOG(kInfo, "ofi listener %s: rejected a connection request that is not from zsock", address_);
      Reject(info);
      return absl::OkStatus();
    }
    pending_.push_back(Pending{info, cm});
    return absl::OkStatus();
  }

  OfiFabric* fabric_;
  fid_pep* pep_;
  fid_eq* eq_;
  int eq_fd_;
  std::string address_;
  Mutex mu_;
  std::vector<Pending> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<Listener>> ListenMsg(OfiFabric* fabric, absl::string_view address) {
  std::string hp;
  auto got = GetMsgInfo(fabric, address.empty() ? "127.0.0.1:0" : address, FI_SOURCE,
                        "fi_getinfo for an ofi listener on ",
                        "use an address of this host on the configured iface", &hp);
  if (!got.ok()) return got.status();
  fi_info* info = *got;
  int rc;
  fid_eq* eq = nullptr;
  int eq_fd = -1;
  fid_pep* pep = nullptr;
  auto fail = [&](absl::Status st) {
    if (pep) fi_close(&pep->fid);
    if (eq) fi_close(&eq->fid);
    fi_freeinfo(info);
    return st;
  };
  if (auto st = OpenEq(fabric->fabric(), &eq, &eq_fd); !st.ok()) return fail(st);
  if ((rc = fi_passive_ep(fabric->fabric(), info, &pep, nullptr)) != 0) {
    return fail(FiError(rc, "fi_passive_ep"));
  }
  if ((rc = fi_pep_bind(pep, &eq->fid, 0)) != 0) return fail(FiError(rc, "fi_pep_bind(eq)"));
  if ((rc = fi_listen(pep)) != 0) {
    return fail(FiError(rc, absl::StrCat("fi_listen on ", hp),
                        rc == -FI_EADDRINUSE ? "pick another port" : "use an address of this host"));
  }
  sockaddr_storage bound{};
  size_t bl = sizeof(bound);
  if ((rc = fi_getname(&pep->fid, &bound, &bl)) != 0) return fail(FiError(rc, "fi_getname(pep)"));
  fi_freeinfo(info);
  return std::unique_ptr<Listener>(new MsgListener(fabric, pep, eq, eq_fd, FormatHostPort(bound)));
}

absl::StatusOr<std::unique_ptr<Endpoint>> ConnectMsg(OfiFabric* fabric, absl::string_view address,
                                                     CompletionQueue* cq, absl::Duration timeout) {
  std::string hp;
  auto got = GetMsgInfo(fabric, address, 0, "fi_getinfo for an ofi connection to ",
                        "check the address and the iface= option", &hp);
  if (!got.ok()) return got.status();
  fi_info* info = *got;
  // Like the RDM path, a refused connection fails at once, as TCP's does.
  const absl::Time deadline = absl::Now() + timeout;
  uint64_t nonce = (static_cast<uint64_t>(::getpid()) << 32) ^ fabric->NextNonce() ^
                   static_cast<uint64_t>(absl::GetCurrentTimeNanos());
  auto ep = EstablishMsg(fabric, info, info, info->dest_addr, nonce, cq, deadline);
  fi_freeinfo(info);
  return ep;
}

}  // namespace zsock::ofi
