// UcxFabric::Handshake: the connection set-up handshake.h describes.
#include "providers/ucx/handshake.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/cq_cast.h"
#include "core/log.h"
#include "core/status.h"
#include "providers/ucx/cq.h"
#include "providers/ucx/endpoint.h"
#include "providers/ucx/fabric.h"
#include "providers/ucx/hello.h"
#include "providers/ucx/peer_probe.h"
#include "providers/ucx/socket_address.h"

namespace zsock::ucx {

std::vector<Lane> ParseLanes(const std::string& text) {
  std::vector<Lane> lanes;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.find("lane[") == absl::string_view::npos) continue;
    std::vector<absl::string_view> tok = absl::StrSplit(line, ' ', absl::SkipEmpty());
    size_t i = 0;
    while (i < tok.size() && !absl::StartsWith(tok[i], "lane[")) ++i;
    if (i + 1 >= tok.size()) continue;
    Lane lane;
    absl::string_view t = tok[i + 1];
    if (size_t c = t.find(':'); c != absl::string_view::npos) t = t.substr(c + 1);
    if (size_t d = t.rfind('.'); d != absl::string_view::npos && t.find('/') < d) {
      t = t.substr(0, d);
    }
    lane.transport = std::string(t);
    size_t arrow = i + 2;
    while (arrow < tok.size() && tok[arrow] != "->") ++arrow;
    for (size_t k = arrow + 2; k < tok.size(); ++k) {
      absl::string_view u = tok[k];
      if (size_t h = u.find('#'); h != absl::string_view::npos) u = u.substr(0, h);
      lane.uses.emplace_back(u);
    }
    lanes.push_back(std::move(lane));
  }
  return lanes;
}

namespace {

// One run of the handshake; the steps in handshake.h's order.
class Handshaker {
 public:
  Handshaker(UcxFabric* fabric, UcxCq* cq, Fd sock, absl::Time deadline)
      : fabric_(fabric), s_(fabric->settings()), cq_(cq), sock_(std::move(sock)),
        deadline_(deadline) {}

  absl::StatusOr<std::unique_ptr<Endpoint>> Run();

 private:
  absl::StatusOr<Hello> MyHello();
  absl::Status ExchangeHellos();
  // OK, or why the primary transports cannot reach the peer.
  absl::Status TryPrimary();
  // The peer's verdict (at least 4 bytes).
  absl::StatusOr<std::string> ExchangeVerdicts(const absl::Status& attempt);
  absl::Status FallBack(const absl::Status& attempt, const std::string& their_verdict);
  // Takes our endpoint out of `wk` and closes its UCX endpoint, if any.
  void Unregister(Worker* wk);
  EndpointInfo Describe();
  void DescribeLanes(EndpointInfo* info, bool* shm_amo) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w_->mu);
  void MapPeerTable() ABSL_EXCLUSIVE_LOCKS_REQUIRED(w_->mu);

  UcxFabric* const fabric_;
  const Settings& s_;
  UcxCq* const cq_;
  Fd sock_;
  const absl::Time deadline_;
  Worker* primary_ = nullptr;
  Worker* w_ = nullptr;  // the worker the endpoint ends up on
  std::shared_ptr<EpCore> core_;
  std::array<uint8_t, 16> boot_{};
  Hello theirs_;
  bool same_host_ = false;
  std::string fallback_note_;
};

absl::StatusOr<std::unique_ptr<Endpoint>> Handshaker::Run() {
  auto primary = fabric_->PrimaryWorker();
  if (!primary.ok()) return primary.status();
  primary_ = w_ = *primary;
  core_ = std::make_shared<EpCore>();
  core_->cq = cq_;
  core_->local_id = fabric_->NextEndpointId();
  core_->local_secret = static_cast<uint32_t>(RandomU64()) & 0x7fffffffu;
  if (auto st = ExchangeHellos(); !st.ok()) return st;
  absl::Status attempt = TryPrimary();
  auto their_verdict = ExchangeVerdicts(attempt);
  if (!their_verdict.ok()) return their_verdict.status();
  const bool their_ok = (*their_verdict)[0] == 1;
  if (!attempt.ok() || !their_ok) {
    if (auto st = FallBack(attempt, *their_verdict); !st.ok()) return st;
  }
  EndpointInfo info = Describe();
  return std::unique_ptr<Endpoint>(
      new UcxEndpoint(fabric_, cq_, std::move(core_), std::move(sock_), std::move(info)));
}

absl::StatusOr<Hello> Handshaker::MyHello() {
  Hello mine;
  {
    WorkerLock lock(&w_->mu);
    auto addr = w_->Address();
    if (!addr.ok()) return addr.status();
    mine.address = *addr;
  }
  const ShmProbe& probe = Probe();
  boot_ = BootId();
  HelloFixed& f = mine.fixed;
  f.magic = kHelloMagic;
  f.version = kWireVersion;
  f.flags = static_cast<uint16_t>((s_.fallback_tcp ? kHelloFallbackTcp : 0) |
                                  (fabric_->native() ? kHelloNativeTable : 0));
  f.pid = static_cast<uint32_t>(::getpid());
  f.uid = static_cast<uint32_t>(::getuid());
  f.ep_id = core_->local_id;
  f.secret = core_->local_secret;
  f.probe_nonce = probe.nonce;
  f.probe_fd = probe.fd;
  f.table_slots = static_cast<uint32_t>(fabric_->key_slots());
  f.table_addr = reinterpret_cast<uint64_t>(fabric_->key_table());
  f.flow_window = s_.flow_window;
  std::memcpy(f.boot_id, boot_.data(), boot_.size());
  if (fabric_->native()) mine.table_rkey = fabric_->table_rkey();
  mine.tls = s_.tls;
  return mine;
}

absl::Status Handshaker::ExchangeHellos() {
  auto mine = MyHello();
  if (!mine.ok()) return mine.status();
  if (auto st = SendFrame(sock_.get(), kHelloFrame, mine->Encode(), deadline_); !st.ok()) {
    return st;
  }
  auto theirs_bytes = RecvFrame(sock_.get(), kHelloFrame, deadline_);
  if (!theirs_bytes.ok()) return theirs_bytes.status();
  auto theirs = Hello::Decode(*theirs_bytes);
  if (!theirs.ok()) return theirs.status();
  theirs_ = *std::move(theirs);
  core_->peer_id = theirs_.fixed.ep_id;
  core_->peer_secret = theirs_.fixed.secret;
  core_->peer_pid = theirs_.fixed.pid;
  // Flow control when both sides window: each reports its consumption
  // often enough for the other's window.
  core_->flow.Start(mine->fixed.flow_window, theirs_.fixed.flow_window);
  same_host_ = std::memcmp(theirs_.fixed.boot_id, boot_.data(), boot_.size()) == 0;
  return absl::OkStatus();
}

absl::Status Handshaker::TryPrimary() {
  absl::Status attempt;
  if (s_.same_host_only && !same_host_) {
    attempt = MakeError(absl::StatusCode::kUnavailable, EHOSTUNREACH,
                        absl::StrCat("the peer runs on another host, which transports '", s_.tls,
                                     "' cannot reach"),
                        "use ucx:tcp (or keep fallback=tcp)");
  } else if (s_.has_mm) {
    attempt = ProbeSharedMemory(theirs_.fixed.pid, theirs_.fixed.probe_fd,
                                theirs_.fixed.probe_nonce);
  }
  core_->worker = w_;
  if (!attempt.ok()) return attempt;
  WorkerLock lock(&w_->mu);
  auto ep = w_->CreateEp(theirs_.address, core_.get());
  if (!ep.ok()) return ep.status();
  core_->uep = *ep;
  w_->eps[core_->local_id] = core_;  // before our verdict: the peer may send at once
  return absl::OkStatus();
}

void Handshaker::Unregister(Worker* wk) {
  WorkerLock lock(&wk->mu);
  wk->eps.erase(core_->local_id);
  if (core_->uep != nullptr) {
    ucp_ep_h ep = core_->uep;
    core_->uep = nullptr;
    wk->CloseEpLocked(ep);
  }
}

absl::StatusOr<std::string> Handshaker::ExchangeVerdicts(const absl::Status& attempt) {
  std::string verdict(4, '\0');
  verdict[0] = attempt.ok() ? 1 : 0;
  if (!attempt.ok()) verdict += std::string(attempt.message()).substr(0, 2048);
  if (auto st = SendFrame(sock_.get(), kVerdictFrame, verdict, deadline_); !st.ok()) {
    Unregister(w_);
    return st;
  }
  auto their_verdict = RecvFrame(sock_.get(), kVerdictFrame, deadline_);
  if (!their_verdict.ok() || their_verdict->size() < 4) {
    Unregister(w_);
    if (!their_verdict.ok()) return their_verdict.status();
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO, "malformed ucx verdict",
                     "the peer is not a compatible zsock ucx endpoint");
  }
  return their_verdict;
}

absl::Status Handshaker::FallBack(const absl::Status& attempt, const std::string& their_verdict) {
  Unregister(w_);
  std::string why = !attempt.ok()
                        ? std::string(attempt.message())
                        : absl::StrCat("the peer (pid ", theirs_.fixed.pid,
                                       ") could not reach us: ", their_verdict.substr(4));
  const bool can_fall_back = s_.fallback_tcp && (theirs_.fixed.flags & kHelloFallbackTcp) != 0;
  if (!can_fall_back) {
    return MakeError(absl::StatusCode::kFailedPrecondition, ECONNREFUSED,
                     absl::StrCat("cannot connect over ucx:", s_.tls, ": ", why),
                     "set fallback=tcp on both sides, or fix the cause above");
  }
  auto fb = fabric_->FallbackWorker();
  if (!fb.ok()) return fb.status();
  w_ = *fb;
  core_->worker = w_;
  std::string addr;
  {
    WorkerLock lock(&w_->mu);
    auto a = w_->Address();
    if (!a.ok()) return a.status();
    addr = *a;
    w_->eps[core_->local_id] = core_;
  }
  if (auto st = SendFrame(sock_.get(), kFallbackFrame, addr, deadline_); !st.ok()) {
    Unregister(w_);
    return st;
  }
  auto their_addr = RecvFrame(sock_.get(), kFallbackFrame, deadline_);
  if (!their_addr.ok()) {
    Unregister(w_);
    return their_addr.status();
  }
  WorkerLock lock(&w_->mu);
  auto ep = w_->CreateEp(*their_addr, core_.get());
  if (!ep.ok()) {
    w_->eps.erase(core_->local_id);
    return ep.status();
  }
  core_->uep = *ep;
  fallback_note_ = absl::StrCat("fell back to tcp: ", why);
  ZS_LOG(kInfo, "ucx connection to pid %u %s", theirs_.fixed.pid, fallback_note_);
  return absl::OkStatus();
}

EndpointInfo Handshaker::Describe() {
  EndpointInfo info;
  info.local_address = SocketAddress(sock_.get(), false);
  info.peer_address = SocketAddress(sock_.get(), true);
  info.peer_on_host = same_host_;
  info.rdma_read = Support::kEmulated;
  info.rdma_write = Support::kEmulated;
  info.atomics = Support::kEmulated;
  WorkerLock lock(&w_->mu);
  bool shm_amo = false;
  DescribeLanes(&info, &shm_amo);
  // Native RMA on the peer's AllocateRegistered memory: map its key table.
  if (w_->rma() && (theirs_.fixed.flags & kHelloNativeTable) != 0 &&
      !theirs_.table_rkey.empty() && shm_amo && theirs_.fixed.table_slots > 0) {
    MapPeerTable();
  }
  info.notes.push_back(
      core_->native
          ? "rdma read/write and atomics: native UCP operations on memory from the peer's "
            "AllocateRegistered (checked against its key table); on other memory emulated "
            "by the peer's progress engine, which checks every access"
          : "rdma read/write and atomics: emulated by the peer's progress engine, which "
            "checks every access against its registrations (UCX would only emulate them "
            "itself, without checks)");
  return info;
}

// The notes on the lanes UCX chose; *shm_amo: a shared-memory lane does atomics.
void Handshaker::DescribeLanes(EndpointInfo* info, bool* shm_amo) {
  ucp_ep_h uep = core_->uep;
  std::string text = CaptureOutput([uep](FILE* out) { ucp_ep_print_info(uep, out); });
  std::vector<Lane> lanes = ParseLanes(text);
  std::vector<std::string> parts;
  bool cma_lane = false, shm_lane = false;
  for (const Lane& l : lanes) {
    parts.push_back(absl::StrCat(l.transport, " (", absl::StrJoin(l.uses, " "), ")"));
    bool shm = absl::StartsWith(l.transport, "posix/") || absl::StartsWith(l.transport, "sysv/");
    shm_lane |= shm;
    cma_lane |= absl::StartsWith(l.transport, "cma/");
    for (const auto& u : l.uses) *shm_amo |= (shm && u == "amo");
  }
  info->notes.push_back(absl::StrCat("UCX lanes", w_ == primary_ ? "" : " (tcp fallback context)",
                                     ": ", parts.empty() ? "?" : absl::StrJoin(parts, ", ")));
  if (!fallback_note_.empty()) {
    info->notes.push_back(absl::StrCat(fallback_note_, ". This endpoint uses tcp although ucx:",
                                       s_.tls, " was asked for"));
  } else if (s_.has_mm && !shm_lane) {
    info->notes.push_back("shared memory was requested but UCX chose no shared-memory lane");
  }
  if (s_.has_cma && !cma_lane) {
    info->notes.push_back(
        "cma requested but UCX chose no cma lane (UCX 1.13 does not with peer-failure "
        "handling)");
  }
}

void Handshaker::MapPeerTable() {
  ucp_rkey_h rk = nullptr;
  void* ptr = nullptr;
  if (ucp_ep_rkey_unpack(core_->uep, theirs_.table_rkey.data(), &rk) != UCS_OK) return;
  if (ucp_rkey_ptr(rk, theirs_.fixed.table_addr, &ptr) == UCS_OK && ptr != nullptr) {
    core_->table_rkey = rk;
    core_->peer_table = static_cast<KeySlot*>(ptr);
    core_->peer_slots = theirs_.fixed.table_slots;
    core_->native = true;
  } else {
    ucp_rkey_destroy(rk);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Endpoint>> UcxFabric::Handshake(Fd sock, CompletionQueue* cq,
                                                              absl::Time deadline) {
  auto ucq = CqOf<UcxCq>(cq, "ucx", this);
  if (!ucq.ok()) return ucq.status();
  return Handshaker(this, *ucq, std::move(sock), deadline).Run();
}

}  // namespace zsock::ucx
