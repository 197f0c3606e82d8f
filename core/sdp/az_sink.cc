// AZ-SDP, the sink side (docs/azsdp.md; "Asynchronous Zero-copy
// Communication for Synchronous Sockets in the Sockets Direct Protocol
// (SDP) over InfiniBand", section 4): this side's lock words, which Recv
// takes before it reads an asynchronous SrcAvail (a source that won the
// word first moved the data and sends AzUpdate), and receives that return
// before their data has landed (az_early_recv).
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/log.h"
#include "core/memhooks.h"
#include "core/sdp/az_guard.h"
#include "core/sdp/calls.h"
#include "core/sdp/conn_state.h"
#include "core/sdp/engine.h"
#include "core/status.h"

namespace zsock::sdp {

using wire::MessageId;

bool ConnState::OnAzUpdate(const wire::Header& h, wire::Advert& a) {
  // Copy-on-write: the source won the lock word and moved the data.
  RxSeg* seg = nullptr;
  for (RxSeg& x : rx.queue) {
    if (x.kind == RxSeg::kSrcAvail && x.slot == a.az_slot) seg = &x;
  }
  if (seg == nullptr) {
    if (shut.rd) return true;  // dropped unread (DropReceived)
    ProtocolError(Violation(h, absl::StrCat("updates lock word ", a.az_slot,
                                            ", which no outstanding SrcAvail uses")));
    return false;
  }
  if (seg->locked || seg->moved || a.length != seg->len || a.stream_pos != seg->stream_pos) {
    ProtocolError(Violation(h, absl::StrCat("updates SrcAvail ", seg->advert,
                                            " which this side locked, or changes its "
                                            "length or position")));
    return false;
  }
  seg->addr = a.addr;
  seg->key = std::move(a.key);
  seg->moved = true;
  return true;
}

SegStep ConnState::LockAzAdvert(RecvCall& call, RxSeg& s) {
  uint64_t expect = AzWord(s.gen, kAzFree);
  if (__atomic_compare_exchange_n(LockWord(s.slot), &expect, AzWord(s.gen, kAzSinkReading),
                                  false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    s.locked = true;
    return SegStep::kPass;
  }
  if (expect == AzWord(s.gen, kAzSourceMoved)) {
    const uint32_t advert = s.advert;
    auto moved = [&] {
      for (const RxSeg& x : rx.queue) {
        if (x.kind == RxSeg::kSrcAvail && x.advert == advert) return x.moved;
      }
      return true;
    };
    engine->WaitLocked([&] { return !failure.error.ok() || shut.rd || moved(); },
                       absl::InfiniteFuture());
    if (!failure.error.ok()) return call.EndSeg(failure.error);
    return SegStep::kRestart;  // (a peek starts over)
  }
  wire::Header h;
  h.mid = MessageId::kSrcAvail;
  h.mseq = s.advert;
  ProtocolError(Violation(h, absl::StrCat("lock word ", s.slot, " holds ", expect,
                                          ", not generation ", s.gen)));
  return call.EndSeg(failure.error);
}

SegStep ConnState::RecvEarly(RecvCall& call, size_t si, RxSeg& s, size_t avail) {
  const size_t page = az::PageSize();
  auto* d = static_cast<uint8_t*>(call.cur.ptr());
  const size_t k = std::min(avail, call.cur.space()) / page * page;
  if (reinterpret_cast<uintptr_t>(d) % page != 0 ||
      k < std::max<size_t>(opt.zcopy_threshold, 16 * page) || !AzRecvEarly(s, d, k)) {
    return SegStep::kPass;
  }
  s.off += k;
  rx.pos += k;
  stats.bytes_recv_srcavail += k;
  if (s.off == s.len) rx.queue.erase(rx.queue.begin() + static_cast<std::ptrdiff_t>(si));
  call.Took(k);
  return SegStep::kStop;
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

// Receive side (the AZ-SDP paper, section 4.2): the pages at `dest` become
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

}  // namespace zsock::sdp
