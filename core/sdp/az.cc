// AZ-SDP, set-up and the source side (docs/azsdp.md; "Asynchronous
// Zero-copy Communication for Synchronous Sockets in the Sockets Direct
// Protocol (SDP) over InfiniBand", section 4). Send protects the
// page-aligned middle of a large buffer (az_guard.h), announces it in a
// SrcAvail flagged AzAsync with a lock word in the receiver's table, and
// returns; the receiver locks the word before it pulls (az_sink.cc); a
// write to the buffer ends in Engine::OnFault, which copies the data aside
// if it wins the lock word by remote compare-and-swap (AzUpdate points the
// receiver at the copy) or waits for the pull. Pulled bcopy adverts
// (pull.cc) share the list of adverts in flight and its RdmaRdCompl.
#include <stdlib.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/copy.h"
#include "core/log.h"
#include "core/rcache.h"
#include "core/sdp/az_guard.h"
#include "core/sdp/calls.h"
#include "core/sdp/conn_state.h"
#include "core/sdp/engine.h"
#include "core/status.h"

namespace zsock::sdp {

using wire::MessageId;

AzCopyBuf::~AzCopyBuf() {
  mr.reset();
  std::free(base);
}

absl::Status ConnState::SetUpAz() {
  if (opt.mode != Mode::kAz) return absl::OkStatus();
  const EndpointInfo& info = ep->info();
  if (info.rdma_read == Support::kNone || info.atomics == Support::kNone) {
    ZS_LOG(kInfo, "sdp: AZ-SDP needs RDMA read and atomics, which the connection to %s lacks "
           "(read %s, atomics %s); its large sends go by zcopy",
           peer_address.c_str(), std::string(SupportName(info.rdma_read)).c_str(),
           std::string(SupportName(info.atomics)).c_str());
    return absl::OkStatus();
  }
  const uint32_t slots = std::clamp<uint32_t>(opt.az_adverts, 1, kAzMaxSlots);
  auto index = engine->AcquireLockTable();
  if (!index.ok()) {
    ZS_LOG(kWarn, "sdp: cannot allocate the AZ-SDP lock table (%s); not offering AZ-SDP",
           index.status().ToString().c_str());
    return absl::OkStatus();
  }
  az.table_index = *index;
  az.table = engine->LockTableRegion(az.table_index, &az.words);
  std::memset(az.words, 0, kAzMaxSlots * sizeof(uint64_t));
  az.table_slots = slots;
  az.sink_gen.assign(slots, 0);
  my_caps |= wire::kCapAz;
  return absl::OkStatus();
}

void ConnState::AddAzHello(wire::Hello& h) const {
  if (!az.table) return;
  h.max_adverts = static_cast<uint8_t>(az.table_slots);
  std::string v(4, '\0');
  uint32_t n = az.table_slots;
  std::memcpy(v.data(), &n, 4);  // little-endian hosts only (docs/protocol.md)
  // The key names only this connection's words of the shared region.
  RemoteKey key = az.table->remote_key();
  key.addr = reinterpret_cast<uint64_t>(az.words);
  key.length = uint64_t{az.table_slots} * sizeof(uint64_t);
  v += key.Serialize();
  h.extensions.push_back({wire::kExtAzLockTable, std::move(v)});
}

void ConnState::AcceptPeerAz() {
  if (!(peer.caps & wire::kCapAz)) return;
  const wire::Extension* ext = nullptr;
  for (const auto& e : peer.extensions) {
    if (e.type == wire::kExtAzLockTable) ext = &e;
  }
  wire::Header h;
  h.mid = active ? MessageId::kHelloAck : MessageId::kHello;
  if (ext == nullptr || ext->value.size() < 4) {
    ProtocolError(Violation(h, "offers AZ-SDP without a lock-word table"));
    return;
  }
  uint32_t slots;
  std::memcpy(&slots, ext->value.data(), 4);
  auto key = RemoteKey::Parse(absl::string_view(ext->value).substr(4));
  if (!key.ok() || slots == 0 || slots > kAzMaxSlots || slots > peer.max_adverts ||
      key->length < uint64_t{slots} * 8 || key->addr % 8 != 0 ||
      !(key->access & kRemoteAtomic)) {
    ProtocolError(Violation(h, absl::StrCat("has a malformed AZ-SDP lock-word table (", slots,
                                            " slots)")));
    return;
  }
  az.peer_table = std::move(*key);
  az.peer_table_slots = slots;
  az.src_gen.assign(slots, 0);
  az.slot_busy.assign(slots, 0);
  az.enabled = (peer.caps & wire::kCapRdmaRead) && ep->info().atomics != Support::kNone;
}

uint32_t ConnState::AzLimit() const {
  return std::min<uint32_t>(peer.max_adverts, az.peer_table_slots);
}

uint64_t ConnState::TxCommitted() const {
  uint64_t n = tx.pos;
  for (const AzSrcAvail& s : az.src) n += s.len - s.done;
  return n;
}

AzSrcAvail* ConnState::FindAz(uint32_t serial) {
  for (AzSrcAvail& s : az.src) {
    if (s.serial == serial) return &s;
  }
  return nullptr;
}

void ConnState::AzFinish(size_t index) {
  AzSrcAvail& s = az.src[index];
  if (s.pull) {
    pull.out--;
  } else {
    if (s.guard >= 0) az::Guard::Get().Release(s.guard);
    az.slot_busy[s.slot] = 0;
    az.src_gen[s.slot]++;
  }
  az.src.erase(az.src.begin() + static_cast<std::ptrdiff_t>(index));
  engine->NotifyLocked();
}

void ConnState::AzReleaseAll() {
  for (AzSrcAvail& s : az.src) {
    if (s.guard >= 0) az::Guard::Get().Release(s.guard);
  }
  az.src.clear();
  pull.out = 0;
  std::fill(az.slot_busy.begin(), az.slot_busy.end(), 0);
}

wire::Message ConnState::AzAdvert(const AzSrcAvail& s, uint8_t flags) const {
  wire::Advert a;
  if (s.copy) {
    a.addr = reinterpret_cast<uint64_t>(s.copy->base);
    a.key = s.copy->mr->remote_key();
  } else {
    a.addr = s.addr;
    a.key = s.mr->remote_key();
  }
  a.length = s.len;
  a.az_slot = s.slot;
  a.stream_pos = s.stream_pos;
  a.key_bytes = a.key.Serialize();
  return wire::Message{{MessageId::kSrcAvail, flags}, a};
}

bool ConnState::AzMove(AzSrcAvail& s) {
  auto copy = std::make_unique<AzCopyBuf>();
  if (posix_memalign(&copy->base, 4096, s.len) != 0) {
    copy->base = nullptr;
    return false;
  }
  CopyBytes(copy->base, reinterpret_cast<const void*>(s.addr), s.len);
  auto r = ep->fabric()->RegisterMemory(copy->base, s.len, kLocalRead | kRemoteRead);
  if (!r.ok()) {
    ZS_LOG(kInfo, "sdp: AZ-SDP copy-on-write cannot register its copy (%s); waiting instead",
           r.status().ToString().c_str());
    return false;
  }
  copy->mr = std::move(*r);
  s.copy = std::move(copy);
  if (s.posted) {
    QueueCtl(AzAdvert(s, wire::kFlagAzUpdate | wire::kFlagAzAsync));
  } else {
    for (TxItem& item : tx.dataq) {
      if (item.az_serial == s.serial) {
        item.encoded = wire::EncodeToString(AzAdvert(s, wire::kFlagAzAsync));
        break;
      }
    }
  }
  if (s.guard >= 0) az::Guard::Get().Release(s.guard);
  s.guard = -1;
  s.moved = true;
  s.mr.reset();
  TryTransmit();
  return true;
}

bool ConnState::OnAzRdmaRdCompl(const wire::Header& h, const wire::Completed& c,
                                size_t index) {
  AzSrcAvail& s = az.src[index];
  if (c.bytes > s.len - s.done || (h.flags & wire::kFlagCancelReply)) {
    ProtocolError(Violation(h, absl::StrCat("reports ", c.bytes, " bytes of asynchronous "
                                            "SrcAvail ", c.advert, " (", s.len - s.done,
                                            " remain) or answers a cancel never sent")));
    return false;
  }
  // SendSmall on an asynchronous or pulled advert: the sink discarded it
  // (SHUT_RD).
  uint32_t k = (h.flags & wire::kFlagSendSmall) ? s.len - s.done : c.bytes;
  s.done += k;
  tx.pos += k;
  (s.pull ? stats.bytes_sent_pull : stats.bytes_sent_srcavail) += k;
  if (s.done == s.len) AzFinish(index);
  return true;
}

// ---------------------------------------------------------------- Send step

Step ConnState::SendAsync(SendCall& call) {
  // The page-aligned middle goes asynchronously; the unaligned head and
  // tail go by bcopy (the AZ-SDP paper, section 4.4.2).
  const size_t rem = call.rem();
  const uintptr_t page = az::PageSize();
  const uintptr_t a = reinterpret_cast<uintptr_t>(call.q());
  const uintptr_t first = (a + page - 1) / page * page;
  const uintptr_t last = (a + std::min(rem, kMaxAdvert)) / page * page;
  if (last <= first || last - first < std::min<size_t>(call.threshold, 4 * page)) {
    call.force_bcopy = rem;  // no whole page: all by bcopy
    stats.az_hybrid_bcopy += rem;
    return Step::kPass;
  }
  if (first > a) {
    call.force_bcopy = first - a;
    stats.az_hybrid_bcopy += first - a;
    return Step::kPass;
  }
  if (AzOut() >= AzLimit()) {
    TryTransmit();
    if (call.dontwait) return call.End(WouldBlock());
    if (!engine->WaitLocked([&] { return !failure.error.ok() || AzOut() < AzLimit(); },
                            call.deadline)) {
      return call.End(TimedOut());
    }
    return Step::kNext;
  }
  return QueueAsync(call, last - first);
}

Step ConnState::QueueAsync(SendCall& call, size_t len) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(call.q());
  auto r = ep->fabric()->rcache().Get(const_cast<uint8_t*>(call.q()), len,
                                      kRemoteRead | kLocalRead);
  const uint32_t serial = NextAzSerial();
  absl::StatusOr<int> g = -1;
  if (r.ok()) {
    engine->az_used_.store(true, std::memory_order_relaxed);
    g = az::Guard::Get().Protect(addr, len, engine->fault_client(), (id << 32) | serial);
  } else {
    g = r.status();
  }
  if (!g.ok()) {
    ZS_LOG(kDebug, "sdp: AZ-SDP cannot protect the buffer (%s); sending it by zcopy",
           g.status().ToString().c_str());
    stats.az_unprotectable++;
    call.az_sync = true;
    return Step::kNext;
  }
  AzSrcAvail as;
  as.serial = serial;
  as.slot = 0;
  while (az.slot_busy[as.slot]) as.slot++;
  as.gen = az.src_gen[as.slot];
  as.len = static_cast<uint32_t>(len);
  as.addr = addr;
  as.stream_pos = TxCommitted();
  as.guard = *g;
  as.mr = *r;
  az.slot_busy[as.slot] = 1;
  TxItem item;
  item.mid = MessageId::kSrcAvail;
  item.az_serial = serial;
  item.encoded = wire::EncodeToString(AzAdvert(as, wire::kFlagAzAsync));
  az.src.push_back(std::move(as));
  tx.dataq.push_back(std::move(item));
  stats.az_srcavail_sent++;
  stats.az_bytes += len;
  TryTransmit();
  call.Took(len);
  return Step::kNext;
}

// ---------------------------------------------------------------- faults

ConnState::AzStep ConnState::AzFaultBegin(uint32_t serial) {
  AzSrcAvail* s = FindAz(serial);
  if (s == nullptr || s->guard < 0) return AzStep::kDone;
  stats.az_faults++;
  const int64_t now = absl::GetCurrentTimeNanos();
  if (now - az.window_start > 1000000000) {
    az.window_start = now;
    az.window_faults = 0;
  }
  if (++az.window_faults > opt.az_fault_limit && opt.mode == Mode::kAz) {
    opt.mode = Mode::kZcopy;
    stats.az_fallbacks++;
    ZS_LOG(kWarn, "sdp connection to %s: %u faults on buffers being sent within a second exceed "
           "az_fault_limit=%u; falling back to zcopy (the application writes its send buffers "
           "right after sending; SetMode(azcopy) or ZSOCK_SO_MODE re-enables AZ-SDP)",
           peer_address.c_str(), az.window_faults, opt.az_fault_limit);
    QueueCtl(wire::Message{{MessageId::kModeChange}, wire::ModeChange{Mode::kZcopy}});
    TryTransmit();
  }
  if (opt.az_policy == AzPolicy::kBlock || !failure.error.ok()) {
    stats.az_blocks++;
    return AzStep::kBlock;
  }
  if (!s->posted) {
    // Still queued here: nobody can be reading it; move it at once.
    if (AzMove(*s)) {
      stats.az_copies++;
      return AzStep::kDone;
    }
    stats.az_blocks++;
    return AzStep::kBlock;
  }
  if (s->done > 0 || s->moved) {
    stats.az_blocks++;
    return AzStep::kBlock;
  }
  az.atomic_status = absl::OkStatus();
  az.atomic_result = ~uint64_t{0};
  auto st = ep->CompareSwap(&az.atomic_result, az.peer_table.addr + uint64_t{s->slot} * 8, az.peer_table,
                            AzWord(s->gen, kAzFree), AzWord(s->gen, kAzSourceMoved),
                            MakeCtx(id, kCtxAtomic, 0));
  if (!st.ok()) {
    ZS_LOG(kInfo, "sdp: AZ-SDP lock-word compare-and-swap failed to start (%s); waiting instead",
           st.ToString().c_str());
    stats.az_blocks++;
    return AzStep::kBlock;
  }
  az.atomics_out++;
  return AzStep::kCasPosted;
}

bool ConnState::AzFaultCasDone(uint32_t serial) {
  AzSrcAvail* s = FindAz(serial);
  if (s == nullptr || s->guard < 0) return true;
  const bool won = az.atomic_status.ok() && az.atomic_result == AzWord(s->gen, kAzFree);
  if (!won) {
    if (!az.atomic_status.ok()) {
      ZS_LOG(kInfo, "sdp: AZ-SDP lock-word compare-and-swap failed (%s); waiting instead",
             az.atomic_status.ToString().c_str());
    }
    stats.az_blocks++;
    return false;
  }
  if (AzMove(*s)) {
    stats.az_copies++;
    return true;
  }
  // We hold the lock word but have no copy: point the receiver at the
  // original (still protected) and wait for it like block-on-write.
  QueueCtl(AzAdvert(*s, wire::kFlagAzUpdate | wire::kFlagAzAsync));
  s->moved = true;
  TryTransmit();
  stats.az_blocks++;
  return false;
}

bool ConnState::AzGuarded(uint32_t serial) {
  AzSrcAvail* s = FindAz(serial);
  return s != nullptr && s->guard >= 0 && failure.error.ok();
}

// ---------------------------------------------------------------- Engine

void Engine::OnFault(uint64_t cookie) {
  const uint64_t id = cookie >> 32;
  const uint32_t serial = static_cast<uint32_t>(cookie);
  {
    MutexLock lock(&mu_);
    // The connection may close during any wait: look it up each time.
    auto conn = [&]() -> ConnState* {
      auto it = conns_.find(id);
      return it == conns_.end() ? nullptr : it->second.get();
    };
    ConnState* c = conn();
    if (c == nullptr) return;
    if (serial & kAzRecvSerial) {
      // A receive that returned early: make progress until it lands.
      c->stats.az_faults++;
      WaitLocked(
          [&] {
            ConnState* x = conn();
            return x == nullptr || !x->az.rx.active || x->az.rx.serial != serial;
          },
          absl::InfiniteFuture());
      return;
    }
    bool block = false;
    switch (c->AzFaultBegin(serial)) {
      case ConnState::AzStep::kDone:
        break;
      case ConnState::AzStep::kBlock:
        block = true;
        break;
      case ConnState::AzStep::kCasPosted:
        WaitLocked(
            [&] {
              ConnState* x = conn();
              return x == nullptr || x->az.atomics_out == 0;
            },
            absl::InfiniteFuture());
        if (ConnState* x = conn()) block = !x->AzFaultCasDone(serial);
        break;
    }
    if (block) {
      WaitLocked(
          [&] {
            ConnState* x = conn();
            return x == nullptr || !x->AzGuarded(serial);
          },
          absl::InfiniteFuture());
    }
    if (ConnState* x = conn()) NoteReadinessLocked(x);
  }
  RunCallbacks();
}

}  // namespace zsock::sdp
