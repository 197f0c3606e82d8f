// OfiFabric::Open: resolving a configuration to a libfabric domain, the
// capabilities and notes it reports, and how its CQs wait; Listen and
// Connect by endpoint type; the provider's registration.
//
// The ofi provider: the zsock provider interface over libfabric (1.17,
// Debian's libfabric-dev). Configurations: `ofi:tcp;ofi_rxm` (the CI
// default), `ofi:shm`, `ofi:verbs;ofi_rxm` (reliable-datagram, FI_EP_RDM,
// rdm_connect.cc), `ofi:tcp` and `ofi:verbs` (connected, FI_EP_MSG,
// msg_connect.cc), or `ofi:` for whatever fi_getinfo offers first. Design
// notes and limits: docs/ofi.md.
//
// Where the rest is: settings.h (options, hints), memory.h (registration,
// keys; core's LocalKeyTable records them), cq.h (completion queues and
// waiting), request.h (operations in flight), endpoint.h (what endpoints
// share), rdm_endpoint.h and msg_endpoint.h (the two kinds), liveness.cc
// (the peer's close), connect.h (listening and connecting).
#include "providers/ofi/fabric.h"

#include <rdma/fi_atomic.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/log.h"
#include "core/status.h"
#include "providers/ofi/errors.h"
#include "providers/ofi/connect.h"

namespace zsock::ofi {

OfiFabric::~OfiFabric() {
  ReleaseCache();
  { DomLock lock(&dom_mu_); }  // closes registrations parked by revocations
  if (domain_) fi_close(&domain_->fid);
  if (fabric_) fi_close(&fabric_->fid);
  if (info_) fi_freeinfo(info_);
}

absl::StatusOr<std::unique_ptr<Fabric>> OfiFabric::Open(const FabricSpec& spec) {
  auto settings = LoadSettings(spec);
  if (!settings.ok()) return settings.status();
  auto f = std::unique_ptr<OfiFabric>(new OfiFabric());
  f->settings_ = *settings;
  const fi_ep_type type = IsMsgProvider(settings->prov) ? FI_EP_MSG : FI_EP_RDM;
  // shm 1.17 neither refuses a forged or read-only key on its RMA path nor
  // reports the refusal to the initiator (docs/ofi.md): its one-sided
  // operations go through core emulation, which checks our own record.
  const bool rma_wanted = settings->prov != "shm";
  if (absl::Status st = f->OpenDomain(type, rma_wanted); !st.ok()) return st;
  f->msg_ = type == FI_EP_MSG;
  f->rma_native_ = (f->info_->caps & FI_RMA) != 0;
  f->atomics_native_ = (f->info_->caps & FI_ATOMIC) && !f->local_mr() &&
                       fi_query_atomic(f->domain_, FI_UINT64, FI_SUM, nullptr, FI_FETCH_ATOMIC) == 0 &&
                       fi_query_atomic(f->domain_, FI_UINT64, FI_CSWAP, nullptr, FI_COMPARE_ATOMIC) == 0;
  f->DescribeCapabilities();
  if (absl::Status st = f->ChooseCqWait(); !st.ok()) return st;
  f->AddNotes(rma_wanted);
  return std::unique_ptr<Fabric>(std::move(f));
}

// Atomics first; a provider without them (tcp) or whose atomic variant
// cannot open a domain (shm 1.17 wants legacy FI_MR_BASIC for it) serves
// without, and core emulates atomics.
absl::Status OfiFabric::OpenDomain(fi_ep_type type, bool rma_wanted) {
  int rc = 0;
  for (bool atomics : {true, false}) {
    if (atomics && !rma_wanted) continue;
    const uint64_t requested_caps = (type == FI_EP_RDM ? FI_MSG | FI_TAGGED : FI_MSG) |
                                    (rma_wanted ? FI_RMA : 0) | (atomics ? FI_ATOMIC : 0);
    fi_info* hints = MakeHints(settings_, type, requested_caps, kMrModes);
    fi_info* info = nullptr;
    rc = fi_getinfo(kFiVersion, nullptr, nullptr, 0, hints, &info);
    fi_freeinfo(hints);
    if (rc == -FI_ENODATA && atomics) continue;
    if (rc != 0) return NoProvider(settings_, type, requested_caps, rc);
    if (info_) fi_freeinfo(info_);
    info_ = fi_dupinfo(info);
    fi_freeinfo(info);
    // fi_getinfo may offer more primary capabilities than asked for: ask the
    // domain for exactly what was requested.
    info_->caps &= requested_caps | FI_READ | FI_WRITE | FI_SEND | FI_RECV | FI_REMOTE_READ |
                   FI_REMOTE_WRITE;
    // zsock honours ALLOCATED and PROV_KEY anyway; with VIRT_ADDR they make
    // the legacy FI_MR_BASIC some provider variants still insist on.
    if (info_->domain_attr->mr_mode & FI_MR_VIRT_ADDR) {
      info_->domain_attr->mr_mode |= FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    }
    if (fabric_ == nullptr && (rc = fi_fabric(info_->fabric_attr, &fabric_, nullptr)) != 0) {
      return FiError(rc, "fi_fabric", "check the FI_* options of the config string");
    }
    ZS_LOG(kDebug, "ofi: fi_domain for %s (api %u.%u, caps 0x%llx, mr_mode 0x%x, atomics %d)",
           info_->fabric_attr->prov_name, FI_MAJOR(info_->fabric_attr->api_version),
           FI_MINOR(info_->fabric_attr->api_version), static_cast<unsigned long long>(info_->caps),
           info_->domain_attr->mr_mode, atomics);
    rc = fi_domain(fabric_, info_, &domain_, nullptr);
    if (rc == 0) break;
    if (!atomics) {
      return FiError(rc, absl::StrCat("fi_domain for ", info_->fabric_attr->prov_name),
                     "the provider offered a domain it cannot open; try another iface=");
    }
  }
  return absl::OkStatus();
}

void OfiFabric::DescribeCapabilities() {
  const std::string prov_name = info_->fabric_attr->prov_name;
  Capabilities& c = caps_;
  c.provider = "ofi";
  c.spec = absl::StrCat(prov_name, " (", msg_ ? "FI_EP_MSG" : "FI_EP_RDM", ", domain ",
                        info_->domain_attr->name, ")");
  c.send_recv = Support::kNative;
  c.rdma_read = rma_native_ ? Support::kNative : Support::kEmulated;
  c.rdma_write = c.rdma_read;
  c.atomics = atomics_native_ ? Support::kNative : Support::kEmulated;
  // One-sided only where the provider progresses data by itself; with
  // manual progress (tcp;ofi_rxm emulates atomics over messages) the
  // target must poll.
  c.atomics_allocated = (atomics_native_ && info_->domain_attr->data_progress == FI_PROGRESS_AUTO)
                            ? Support::kNative
                            : Support::kEmulated;
  c.max_msg_size = std::min<size_t>(info_->ep_attr->max_msg_size, size_t{1} << 30);
  // Emulated transfers travel in one control message each.
  c.max_rma_size = rma_native_ ? c.max_msg_size : kControlBuf - kControlOverhead;
  // fi_tinject only where an injected message is with the peer when the
  // call returns: shm copies it into the peer's queue (or says EAGAIN).
  // tcp (under rxm) may keep it in its own send queue, which fi_close
  // drops: a send reported complete would be lost by a close right after.
  inject_size_ = (!msg_ && prov_name == "shm") ? info_->tx_attr->inject_size : 0;
  // No inline promise even so: shm refuses an injection (EAGAIN, and the
  // send is posted instead) until the peer's progress has mapped the
  // connection, so an early small send completes only once the peer polls
  // (conformance InlineSendsCompleteWithoutThePeer).
  c.inline_size = 0;
  // Injected sends (kInjectContext) for every configuration: no completion
  // is reported, so nothing is promised about a close right after (see
  // OfiEndpoint::InjectWith). Capped: past it the caller's ordinary sends
  // are as cheap, and the copy an injection may make stays small.
  c.inject_size = std::min<size_t>(info_->tx_attr->inject_size, kMaxInject);
  c.registration_required = local_mr();
  c.peer_on_host = prov_name == "shm";
}

// Connected endpoints of libfabric tcp wait on their own sockets. The
// FI_WAIT_FD object costs every arriving message: its fd is an epoll set
// of libfabric's over tcp's own (which holds the sockets), and every
// arrival wakes through both and through zsock's epoll set (measured: a
// ping-pong is noticeably slower with it, docs/ofi.md). With the sockets
// in zsock's set directly, a blocked wait still wakes when data arrives
// (docs/ofi.md "Waiting").
absl::Status OfiFabric::ChooseCqWait() {
  using CqWait = Settings::CqWait;
  const bool tcp_msg = msg_ && std::string(info_->fabric_attr->prov_name) == "tcp";
  CqWait wait = settings_.cq_wait;
  if (wait == CqWait::kSockets && !tcp_msg) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("ofi option cq_wait=sockets needs connected endpoints of libfabric "
                                  "tcp, not ", caps_.spec),
                     "use it with ofi:tcp only, or write cq_wait=fd or cq_wait=none");
  }
  if (wait == CqWait::kAuto) wait = tcp_msg && ::access("/proc/self/fd", R_OK) == 0 ? CqWait::kSockets : CqWait::kFd;
  if (wait == CqWait::kSockets && ::access("/proc/self/fd", R_OK) != 0) {
    return ErrnoError(errno, "ofi option cq_wait=sockets: /proc/self/fd cannot be read",
                      "mount /proc, or write cq_wait=fd");
  }
  if (wait == CqWait::kFd) {
    fid_cq* probe = nullptr;
    fi_cq_attr attr{};
    attr.format = msg_ ? FI_CQ_FORMAT_DATA : FI_CQ_FORMAT_TAGGED;
    attr.wait_obj = FI_WAIT_FD;
    attr.size = 64;
    if (fi_cq_open(domain_, &attr, &probe, nullptr) != 0) wait = CqWait::kNone;
    if (probe) fi_close(&probe->fid);
  }
  fi_wait_fd_ = wait == CqWait::kFd;
  wait_sockets_ = wait == CqWait::kSockets;
  if (settings_.backstop_set && wait == CqWait::kNone) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("ofi option backstop_ms applies to cq_wait=sockets and cq_wait=fd, "
                                  "not to CQs without a wait object",
                                  settings_.cq_wait == CqWait::kNone
                                      ? ""
                                      : " (this provider offers no FI_WAIT_FD CQ)"),
                     "leave it out: without a wait object a sleeper polls on a timer of 50 us to 1 ms");
  }
  caps_.wait_fd = wait != CqWait::kNone;
  return absl::OkStatus();
}

void OfiFabric::AddNotes(bool rma_wanted) {
  Capabilities& c = caps_;
  c.notes.push_back(absl::StrCat(
      "libfabric ", FI_MAJOR(fi_version()), ".", FI_MINOR(fi_version()), ", mr_mode 0x",
      absl::Hex(info_->domain_attr->mr_mode), ", ",
      info_->domain_attr->data_progress == FI_PROGRESS_AUTO ? "auto" : "manual",
      " data progress, ",
      msg_ ? "connected endpoints (fi_listen/fi_connect/fi_accept, address IP:PORT)"
           : "connections bootstrap over TCP (address IP:PORT)"));
  if (msg_) {
    c.notes.push_back(
        "each connection is two FI_EP_MSG endpoints (user messages; control messages), "
        "FI_SHUTDOWN on the event queue reports a dead peer");
  }
  if (wait_sockets_) {
    c.notes.push_back(
        "cq_wait=sockets: CQs without a wait object (FI_WAIT_NONE); blocking waits sleep on the "
        "endpoints' TCP sockets (found in /proc/self/fd by their addresses)");
  } else if (settings_.cq_wait == Settings::CqWait::kNone) {
    c.notes.push_back(
        "cq_wait=none: CQs without a wait object (FI_WAIT_NONE), for busy polling: blocking "
        "waits poll with a timer backing off from 50 us to 1 ms");
  } else if (!c.wait_fd) {
    c.notes.push_back(
        "the provider has no CQ wait object: blocking waits poll with a timer backing off "
        "from 50 us to 1 ms (never a busy core)");
  } else if (settings_.backstop_ns > 0) {
    c.notes.push_back(absl::StrCat(
        "cq_wait=fd: blocking waits sleep on the fi CQs' FI_WAIT_FD objects (fi_trywait), with a "
        "backstop timer that re-polls a sleeping CQ every backstop_ms=",
        settings_.backstop_ns / 1000000));
  }
  if (!rma_wanted) {
    c.notes.push_back(
        "RDMA read/write and atomics: emulated by the target's progress engine, checked against "
        "its own registration record (shm 1.17 does not refuse out-of-bounds or read-only keys "
        "on its RMA path); at most 64 KiB per operation; peers must run as the same user "
        "(shm regions are private to a user)");
  } else if (!atomics_native_) {
    c.notes.push_back(absl::StrCat("atomics: emulated by the target's progress engine (",
                                   (info_->caps & FI_ATOMIC) ? "fi_query_atomic refused FI_UINT64 FI_SUM/FI_CSWAP"
                                                             : "the provider has no FI_ATOMIC",
                                   ")"));
  }
}

EndpointInfo OfiFabric::NewEndpointInfo(absl::string_view kind) const {
  EndpointInfo info;
  info.peer_on_host = caps_.peer_on_host;
  info.rdma_read = caps_.rdma_read;
  info.rdma_write = caps_.rdma_write;
  info.atomics = caps_.atomics;
  info.notes.push_back(absl::StrCat("ofi provider ", info_->fabric_attr->prov_name, kind, ", domain ",
                                    info_->domain_attr->name));
  return info;
}

absl::StatusOr<std::unique_ptr<Listener>> OfiFabric::Listen(absl::string_view address) {
  return msg_ ? ListenMsg(this, address) : ListenRdm(this, address);
}

absl::StatusOr<std::unique_ptr<Endpoint>> OfiFabric::Connect(absl::string_view address, CompletionQueue* cq,
                                                            absl::Duration timeout) {
  return msg_ ? ConnectMsg(this, address, cq, timeout) : ConnectRdm(this, address, cq, timeout);
}

namespace {

const bool kRegistered = RegisterProvider(ProviderInfo{
    "ofi",
    "libfabric endpoints: reliable-datagram (tcp;ofi_rxm, shm, verbs;ofi_rxm) and connected (tcp, verbs)",
    // verbs configurations share the MSG and rxm code paths; without an
    // RDMA device they are unavailable and the conformance suite skips them.
    {"ofi:tcp;ofi_rxm?iface=lo", "ofi:shm", "ofi:tcp?iface=lo", "ofi:verbs", "ofi:verbs;ofi_rxm"},
    [](const FabricSpec& spec) { return OfiFabric::Open(spec); },
});

}  // namespace
}  // namespace zsock::ofi
