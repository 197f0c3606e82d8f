// Setting up verbs connections with librdmacm (VerbsFabric::Listen and
// Connect, fabric.h): the listener, which validates each connecting peer's
// hello before it accepts, and the client side, which retries a refused
// connection (a listener not up yet) with backoff until its deadline.
#include <rdma/rdma_cma.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/log.h"
#include "core/status.h"
#include "providers/verbs/cm.h"
#include "providers/verbs/endpoint.h"
#include "providers/verbs/fabric.h"
#include "providers/verbs/settings.h"
#include "providers/verbs/wire.h"

namespace zsock::verbs {
namespace {

// The connection parameters of this fabric, carrying `hello`.
rdma_conn_param ConnParam(const VerbsFabric* f, const std::string& hello) {
  rdma_conn_param p{};
  p.private_data = hello.data();
  p.private_data_len = static_cast<uint8_t>(hello.size());
  p.responder_resources = static_cast<uint8_t>(std::min(f->dev_attr().max_qp_rd_atom, 255));
  p.initiator_depth = static_cast<uint8_t>(std::min(f->dev_attr().max_qp_init_rd_atom, 255));
  p.flow_control = 1;
  p.retry_count = static_cast<uint8_t>(f->settings().retry_count);
  p.rnr_retry_count = static_cast<uint8_t>(f->settings().rnr_retry);
  return p;
}

class VerbsListener final : public Listener {
 public:
  VerbsListener(VerbsFabric* fabric, rdma_event_channel* ch, rdma_cm_id* id, std::string address)
      : fabric_(fabric), ch_(ch), id_(id), address_(std::move(address)) {}
  ~VerbsListener() override {
    rdma_destroy_id(id_);
    rdma_destroy_event_channel(ch_);
  }
  std::string address() const override { return address_; }
  int fd() const override { return ch_->fd; }

  absl::StatusOr<std::unique_ptr<Endpoint>> Accept(CompletionQueue* cq,
                                                   absl::Duration timeout) override {
    absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      auto ev = NextCmEvent(ch_, deadline, absl::StrCat("a connection on verbs address ", address_));
      if (!ev.ok()) return ev.status();
      if ((*ev)->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
        rdma_ack_cm_event(*ev);
        continue;
      }
      rdma_cm_id* child = (*ev)->id;
      auto peer = DecodeHello((*ev)->param.conn.private_data, (*ev)->param.conn.private_data_len);
      uint8_t peer_initiator = (*ev)->param.conn.initiator_depth;
      uint8_t peer_responder = (*ev)->param.conn.responder_resources;
      rdma_ack_cm_event(*ev);
      if (!peer.ok()) {
        ZS_LOG(kInfo, "verbs: refusing a connection: %s", peer.status().ToString());
        rdma_reject(child, nullptr, 0);
        rdma_destroy_id(child);
        continue;
      }
      // Arrived: its set-up gets the connect timeout (Listener::Accept).
      auto ep = Establish(child, *peer, peer_initiator, peer_responder, cq,
                          absl::Now() + absl::Milliseconds(fabric_->settings().connect_timeout_ms));
      if (!ep.ok()) {
        ZS_LOG(kInfo, "verbs: accepting a connection failed: %s", ep.status().ToString());
        if (absl::Now() >= deadline) return ep.status();
        continue;
      }
      return ep;
    }
  }

 private:
  absl::StatusOr<std::unique_ptr<Endpoint>> Establish(rdma_cm_id* child, const struct Hello& peer,
                                                      uint8_t peer_initiator, uint8_t peer_responder,
                                                      CompletionQueue* cq, absl::Time deadline) {
    rdma_event_channel* ch = rdma_create_event_channel();
    if (ch == nullptr) {
      rdma_reject(child, nullptr, 0);
      rdma_destroy_id(child);
      return VerbsErrno(errno, "rdma_create_event_channel", "raise the fd limit");
    }
    SetNonBlocking(ch->fd);
    if (rdma_migrate_id(child, ch) != 0) {
      int err = errno;
      rdma_reject(child, nullptr, 0);
      rdma_destroy_id(child);
      rdma_destroy_event_channel(ch);
      return VerbsErrno(err, "rdma_migrate_id");
    }
    auto ep = fabric_->MakeEndpoint(child, ch, cq);
    if (!ep.ok()) {
      rdma_reject(child, nullptr, 0);
      if (child->qp) rdma_destroy_qp(child);
      rdma_destroy_id(child);
      rdma_destroy_event_channel(ch);
      return ep.status();
    }
    // From here the endpoint owns child and ch.
    std::string hello = fabric_->Hello();
    rdma_conn_param p = ConnParam(fabric_, hello);
    p.responder_resources = std::min(p.responder_resources, peer_initiator);
    p.initiator_depth = std::min(p.initiator_depth, peer_responder);
    if (rdma_accept(child, &p) != 0) return VerbsErrno(errno, "rdma_accept");
    if (auto st = ExpectCmEvent(ch, RDMA_CM_EVENT_ESTABLISHED, deadline,
                                "the verbs connection to be established");
        !st.ok()) {
      return st;
    }
    (*ep)->Start(peer, address_, AddressOf(rdma_get_peer_addr(child)));
    return std::unique_ptr<Endpoint>(std::move(*ep));
  }

  VerbsFabric* fabric_;
  rdma_event_channel* ch_;
  rdma_cm_id* id_;
  std::string address_;
};

// One attempt at connecting `id` (on `ch`) to `dst`: resolve the address
// and the route, build the endpoint (*ep, which then owns id and ch), and
// connect; *peer_data receives the peer's hello.
absl::Status ConnectOnce(VerbsFabric* f, absl::string_view address, sockaddr_storage& src,
                         sockaddr_storage& dst, rdma_cm_id* id, rdma_event_channel* ch,
                         CompletionQueue* cq, absl::Time deadline,
                         std::unique_ptr<VerbsEndpoint>* ep, std::string* peer_data) {
  const int ms = static_cast<int>(std::clamp<int64_t>(
      absl::ToInt64Milliseconds(deadline - absl::Now()), 1, f->settings().connect_timeout_ms));
  if (src.ss_family != dst.ss_family) {
    return MakeError(absl::StatusCode::kInvalidArgument, EAFNOSUPPORT,
                     absl::StrCat("cannot reach ", address, " from ", f->local_ip(),
                                  " (address families differ)"),
                     "use an address of the same family as the device's");
  }
  if (rdma_resolve_addr(id, reinterpret_cast<sockaddr*>(&src), reinterpret_cast<sockaddr*>(&dst),
                        ms) != 0) {
    return VerbsErrno(errno, "rdma_resolve_addr");
  }
  if (auto st = ExpectCmEvent(ch, RDMA_CM_EVENT_ADDR_RESOLVED, deadline,
                              absl::StrCat("resolving ", address));
      !st.ok()) {
    return st;
  }
  if (rdma_resolve_route(id, ms) != 0) return VerbsErrno(errno, "rdma_resolve_route");
  if (auto st = ExpectCmEvent(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, deadline,
                              absl::StrCat("a route to ", address));
      !st.ok()) {
    return st;
  }
  auto made = f->MakeEndpoint(id, ch, cq);
  if (!made.ok()) return made.status();
  *ep = std::move(*made);
  std::string hello = f->Hello();
  rdma_conn_param p = ConnParam(f, hello);
  if (rdma_connect(id, &p) != 0) return VerbsErrno(errno, "rdma_connect");
  return ExpectCmEvent(ch, RDMA_CM_EVENT_ESTABLISHED, deadline,
                       absl::StrCat("connecting to ", address), peer_data);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Listener>> VerbsFabric::Listen(absl::string_view address) {
  auto hp = ParseHostPort(address.empty() ? FormatHostPort(local_ip_, 0) : std::string(address));
  if (!hp.ok()) return hp.status();
  auto ss = ToSockaddr(*hp);
  if (!ss.ok()) return ss.status();
  rdma_event_channel* ch = nullptr;
  rdma_cm_id* id = nullptr;
  if (auto st = NewCmId(&ch, &id); !st.ok()) return st;
  auto fail = [&](absl::Status st) {
    rdma_destroy_id(id);
    rdma_destroy_event_channel(ch);
    return st;
  };
  if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&*ss)) != 0) {
    int err = errno;
    return fail(ErrnoError(err, absl::StrCat("rdma_bind_addr to ", FormatHostPort(hp->host, hp->port)),
                           err == EADDRINUSE ? "pick another port"
                                             : "use the IP address of an RDMA interface of this host"));
  }
  if (id->verbs != nullptr && id->verbs != ctx_) {
    return fail(MakeError(absl::StatusCode::kInvalidArgument, EXDEV,
                          absl::StrCat("address ", hp->host, " belongs to RDMA device ",
                                       ibv_get_device_name(id->verbs->device), ", not ", device_name_),
                          "listen on an address of the fabric's device"));
  }
  if (rdma_listen(id, 1024) != 0) return fail(VerbsErrno(errno, "rdma_listen"));
  uint16_t port = ntohs(rdma_get_src_port(id));
  return std::unique_ptr<Listener>(new VerbsListener(this, ch, id, FormatHostPort(hp->host, port)));
}

absl::StatusOr<std::unique_ptr<Endpoint>> VerbsFabric::Connect(absl::string_view address,
                                                              CompletionQueue* cq,
                                                              absl::Duration timeout) {
  auto hp = ParseHostPort(address);
  if (!hp.ok()) return hp.status();
  if (hp->port == 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("verbs address '", address, "' has no port"),
                     "connect to the address a listener reports (IP:PORT)");
  }
  auto dst = ToSockaddr(*hp);
  if (!dst.ok()) return dst.status();
  auto src = ToSockaddr(HostPort{local_ip_, 0});
  if (!src.ok()) return src.status();
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(1);
  for (;;) {
    rdma_event_channel* ch = nullptr;
    rdma_cm_id* id = nullptr;
    if (auto st = NewCmId(&ch, &id); !st.ok()) return st;
    std::unique_ptr<VerbsEndpoint> ep;
    std::string peer_data;
    absl::Status st = ConnectOnce(this, address, *src, *dst, id, ch, cq, deadline, &ep, &peer_data);
    if (st.ok()) {
      auto peer = DecodeHello(peer_data.data(), peer_data.size());
      if (!peer.ok()) return peer.status();  // ep's destructor disconnects
      ep->Start(*peer, AddressOf(rdma_get_local_addr(id)), std::string(address));
      return std::unique_ptr<Endpoint>(std::move(ep));
    }
    const bool owned_by_ep = ep != nullptr;
    ep.reset();
    if (!owned_by_ep) {
      if (id->qp) rdma_destroy_qp(id);
      rdma_destroy_id(id);
      rdma_destroy_event_channel(ch);
    }
    // The listener may not be up yet (REJECTED for a port nobody listens on).
    if (StatusErrno(st) != ECONNREFUSED || absl::Now() + backoff > deadline) return st;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(50));
  }
}

}  // namespace zsock::verbs
