// AZ-SDP (docs/azsdp.md, seed 003 section 4): the connection's side of
// asynchronous zero-copy. Send protects the page-aligned middle of a large
// buffer (az_guard.h), announces it in a SrcAvail flagged AzAsync with a lock
// word in the receiver's table, and returns; the receiver locks the word
// before it pulls; a write to the buffer ends in Engine::OnFault, which
// copies the data aside if it wins the lock word by remote compare-and-swap
// (AzUpdate points the receiver at the copy) or waits for the pull.
// Everything here runs with the engine mutex held.
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/copy.h"
#include "core/log.h"
#include "core/memhooks.h"
#include "core/sdp/az_guard.h"
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

void ConnState::AzSinkDone(RxSeg& s) {
  if (s.slot == wire::kNoSlot || !az.table) return;
  AzSinkDone(s.slot, s.gen);
  s.slot = wire::kNoSlot;
}

void ConnState::AzSinkDone(uint32_t slot, uint64_t gen) {
  __atomic_store_n(LockWord(slot), AzWord(gen + 1, kAzFree), __ATOMIC_SEQ_CST);
  az.sink_gen[slot] = gen + 1;
}

// Receive side (seed 003 section 4.2): the pages at `dest` become
// inaccessible and the call returns; the RDMA read lands in a fresh mapping
// that then replaces them (mremap: no copy), and any access meanwhile waits
// in the guard. The providers move data with the CPU, which could not write
// into pages the application may not touch: hence the separate mapping.
bool ConnState::AzRecvEarly(RxSeg& s, uint8_t* dest, size_t len) {
  void* temp = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (temp == MAP_FAILED) return false;
  std::unique_ptr<MemoryRegion> mr;
  if (ep->fabric()->caps().registration_required) {
    auto r = ep->fabric()->RegisterMemory(temp, len, kLocalWrite | kLocalRead);
    if (!r.ok()) {
      ::munmap(temp, len);
      return false;
    }
    mr = std::move(*r);
  }
  const uint32_t serial = kAzRecvSerial | (++az.rx_serial & ~kAzRecvSerial);
  auto g = az::Guard::Get().ProtectNone(reinterpret_cast<uintptr_t>(dest), len,
                                        engine->fault_client(), (id << 32) | serial);
  if (!g.ok()) {
    ZS_LOG(kDebug, "sdp: AZ-SDP receives synchronously: %s", g.status().ToString().c_str());
    mr.reset();
    ::munmap(temp, len);
    return false;
  }
  engine->az_used_.store(true, std::memory_order_relaxed);
  const size_t max_rma = ep->fabric()->caps().max_rma_size;
  const size_t chunk = max_rma > 0 ? std::min(max_rma, len) : len;
  int posted = 0;
  absl::Status st;
  for (size_t off = 0; off < len && st.ok(); off += chunk) {
    st = ep->Read(static_cast<uint8_t*>(temp) + off, std::min(chunk, len - off), mr.get(),
                  s.addr + s.off + off, s.key, MakeCtx(id, kCtxAzRead, 0));
    if (st.ok()) posted++;
  }
  if (posted == 0) {
    az::Guard::Get().Release(*g);
    mr.reset();
    ::munmap(temp, len);
    return false;
  }
  az.rx.pending = posted;
  az.rx.status = st;  // a piece that could not start fails the landing
  az.rx.active = true;
  az.rx.serial = serial;
  az.rx.advert = s.advert;
  az.rx.bytes = static_cast<uint32_t>(len);
  az.rx.seg_done = s.off + len == s.len;
  az.rx.slot = s.slot;
  az.rx.gen = s.gen;
  az.rx.dest = reinterpret_cast<uintptr_t>(dest);
  az.rx.len = len;
  az.rx.temp = temp;
  az.rx.mr = std::move(mr);
  az.rx.guard = *g;
  if (az.rx.seg_done) s.slot = wire::kNoSlot;  // the lock word resets on landing
  stats.az_recv_early++;
  return true;
}

void ConnState::AzRxLanded(absl::Status st) {
  if (!az.rx.active) return;
  if (!st.ok() && az.rx.status.ok()) az.rx.status = st;
  if (--az.rx.pending > 0) return;
  st = az.rx.status;
  az.rx.mr.reset();
  if (st.ok()) {
    // syscall, not mremap(): the interposer's release gate would wait for
    // the very range this releases.
    void* r = reinterpret_cast<void*>(syscall(SYS_mremap, az.rx.temp, az.rx.len, az.rx.len,
                                              MREMAP_MAYMOVE | MREMAP_FIXED, az.rx.dest));
    if (r == MAP_FAILED) {
      st = ErrnoError(errno, "AZ-SDP: mremap of a landed receive failed", "report a bug");
    }
  }
  if (!st.ok()) ::munmap(az.rx.temp, az.rx.len);
  az::Guard::Get().Release(az.rx.guard);
  // Registrations of the replaced pages are stale.
  NotifyMemoryReleased(reinterpret_cast<void*>(az.rx.dest), az.rx.len);
  AzEarlyRecv done = std::move(az.rx);
  az.rx = AzEarlyRecv{};
  if (st.ok()) {
    if (done.seg_done) AzSinkDone(done.slot, done.gen);
    QueueCtl(wire::Message{{MessageId::kRdmaRdCompl}, wire::Completed{done.advert, done.bytes}});
    TryTransmit();
  } else if (failure.error.ok()) {
    // The application was told these bytes arrived: the connection cannot
    // go on (its buffer keeps what it held before the call).
    PostAbort(ECONNRESET);
    Fail(MakeError(absl::StatusCode::kAborted, ECONNRESET,
                   absl::StrCat("AZ-SDP: the read of a receive that returned early failed: ",
                                st.message()),
                   "the last receive's bytes did not arrive; reconnect"));
  }
  engine->NotifyLocked();
}

void ConnState::AzRxAbandon() {
  if (!az.rx.active) return;
  az.rx.pending = 1;
  AzRxLanded(failure.error.ok() ? absl::CancelledError("connection closed") : failure.error);
}

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
