// sdp::Connection's calls other than Send and Recv (send.cc, recv.cc):
// options, shutdown, abort and close, readiness, statistics and settings,
// and the test hooks. Each takes the engine mutex and finds the state
// again under it (Close may clear it from another thread).
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/time/clock.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/copy.h"
#include "core/log.h"
#include "core/rcache.h"
#include "core/sdp/az_guard.h"
#include "core/sdp/calls.h"
#include "core/mutex.h"
#include "core/sdp/conn_state.h"
#include "core/sdp/engine.h"
#include "core/status.h"

namespace zsock::sdp {

using wire::MessageId;

ConnectionOptions ConnectionOptions::FromConfig() {
  ConnectionOptions o;
  const auto& config = Config::Global();
  if (config.ok()) {
    const std::string mode = config->GetString("mode");
    o.mode = mode == "azcopy" ? Mode::kAz : mode == "zcopy" ? Mode::kZcopy : Mode::kBcopy;
    o.zcopy_threshold = static_cast<size_t>(config->GetInt("zcopy_threshold"));
    o.pull_threshold = static_cast<size_t>(config->GetInt("pull_threshold"));
    o.az_policy = config->GetString("az_policy") == "block" ? AzPolicy::kBlock : AzPolicy::kCopy;
    o.az_adverts = static_cast<uint32_t>(config->GetInt("az_adverts"));
    o.az_fault_limit = static_cast<uint32_t>(config->GetInt("az_fault_limit"));
    o.az_early_recv = config->GetBool("az_early_recv");
    o.autocork = config->GetBool("autocork");
  }
  return o;
}

uint32_t ConnState::ReadinessNow() const {
  uint32_t r = 0;
  if (!failure.error.ok()) r |= kError | kReadable | kWritable | kHup;
  if (!rx.queue.empty() || shut.peer_wr || shut.rd) r |= kReadable;
  if (shut.peer_wr) r |= kRdHup;
  if (phase == Phase::kOpen && !shut.wr && (CanAppend() || source.peer_sink.valid)) r |= kWritable;
  if (shut.peer_wr && shut.wr) r |= kHup;
  return r;
}

// ---------------------------------------------------------------- Connection

Connection::~Connection() {
  if (state_ != nullptr) (void)Close();
}

absl::StatusOr<size_t> Connection::Send(const void* buf, size_t len, int flags,
                                        Deadline deadline) {
  iovec v{const_cast<void*>(buf), len};
  return Send(std::span<const iovec>(&v, 1), flags, deadline);
}

absl::StatusOr<size_t> Connection::Recv(void* buf, size_t len, int flags, Deadline deadline) {
  iovec v{buf, len};
  return Recv(std::span<const iovec>(&v, 1), flags, deadline);
}

absl::StatusOr<size_t> Connection::Send(std::span<const iovec> iov, int flags,
                                        Deadline deadline) {
  if (StateUnlocked() == nullptr) return Closed();
  Engine* e = engine_;
  // A buffer whose receive is still landing (AZ-SDP az_early_recv) is
  // unreadable: wait for it before any lock is held (echo servers do this).
  for (const iovec& v : iov) az::Guard::Get().WaitReadable(v.iov_base, v.iov_len);
  absl::StatusOr<size_t> result;
  // Readiness changes found on the way (the entry's progress, waits) are
  // reported on every return, once the lock is released.
  absl::Cleanup callbacks = [e] { e->RunCallbacks(); };
  {
    MutexLock lock(&e->mu_);
    ConnState* c = state_;
    if (c == nullptr) return Closed();  // closed by another thread meanwhile
    CallScope in_call(c);
    // What arrived while the application was away: credits, the peer's
    // SinkAvail, AZ-SDP completions. Not needed by a small send that can
    // be posted at once (nothing queued ahead, credits and a slot free):
    // the poll would cost it as much as the send itself.
    // Autocork: while a tail is held, a burst of small sends fills it and
    // polls only every kCorkPollEvery sends; while an acknowledgement
    // request is out and nothing is held, poll first: an answer already
    // here lets this send go at once (and the request counts as one no
    // send waited for).
    bool poll;
    if (c->tx.ctlq.empty() && c->HeldBytes() > 0 && IovBytes(iov) <= c->CorkFlagMax()) {
      c->bcopy.ackreq_useful = true;  // a send joins a held tail: the request pays
      poll = ++c->tx.dataq.front().appends % kCorkPollEvery == 0;
    } else {
      poll = c->bcopy.ackreq_out || !c->CanPostSmall(iov);
    }
    if (poll) e->ProgressLocked();
    bool dontwait = flags & MSG_DONTWAIT;
    if (!e->WaitLocked([&] { return !c->calls.send_busy; }, dontwait ? kNoWait : deadline)) {
      return dontwait ? WouldBlock() : TimedOut();
    }
    c->calls.send_busy = true;
    absl::Cleanup done = [&] {
      c->calls.send_busy = false;
      e->NoteReadinessLocked(c);
      e->NotifyLocked();
    };
    size_t total = 0;
    auto partial = [&](absl::Status st) -> absl::StatusOr<size_t> {
      if (total > 0) return total;
      return st;
    };
    if (!c->failure.error.ok()) return c->failure.error;
    if (c->shut.wr) return PipeError();
    if (c->phase != ConnState::Phase::kOpen) return Closed();
    const size_t threshold = std::max<size_t>(c->opt.zcopy_threshold, 1);
    for (const iovec& v : iov) {
      const uint8_t* p = static_cast<const uint8_t*>(v.iov_base);
      size_t n = v.iov_len, off = 0, force_bcopy = 0;
      bool az_sync = false;  // AZ-SDP could not protect this piece: send it synchronously
      while (off < n) {
        if (!c->failure.error.ok()) return partial(c->failure.error);
        const uint8_t* q = p + off;
        size_t rem = n - off;
        // A valid SinkAvail from the peer takes the next bytes.
        if (c->source.peer_sink.valid && !dontwait) {
          // The whole SinkAvail (or all that is left to send) is written,
          // in writes of at most max_rma_size bytes (64 KiB where one-sided
          // operations are emulated), then reported by one RdmaWrCompl.
          const size_t max_rma = c->ep->fabric()->caps().max_rma_size;
          const size_t k = std::min<size_t>(rem, c->source.peer_sink.len);
          std::shared_ptr<MemoryRegion> mr;
          if (c->ep->fabric()->caps().registration_required) {
            auto r = c->ep->fabric()->rcache().Get(const_cast<uint8_t*>(q), k, kLocalRead);
            if (!r.ok()) return partial(r.status());
            mr = *r;
          }
          c->source.peer_sink.writing = true;
          absl::Status st;
          for (size_t done = 0; done < k && st.ok() && c->failure.error.ok();) {
            const size_t chunk = max_rma > 0 ? std::min(k - done, max_rma) : k - done;
            c->source.write_status = absl::OkStatus();
            st = c->ep->Write(q + done, chunk, mr.get(), c->source.peer_sink.addr + done, c->source.peer_sink.key,
                              MakeCtx(c->id, kCtxWrite, 0));
            if (st.ok()) {
              c->source.writes_out++;
              e->WaitLocked([&] { return c->source.writes_out == 0; }, absl::InfiniteFuture());
              st = c->source.write_status;
            }
            done += chunk;
          }
          c->source.peer_sink.writing = false;
          uint32_t sid = c->source.peer_sink.id;
          if (!c->failure.error.ok()) return partial(c->failure.error);
          if (!st.ok()) {
            // The sink's registration went away (its memory was released or
            // the key refused): void the SinkAvail by sending these bytes as
            // Data, which the sink copies over whatever the failed write
            // left in the same place (docs/protocol.md, "SinkAvail").
            ZS_LOG(kInfo, "sdp: RDMA write into SinkAvail %u failed (%s); sending by bcopy", sid,
                   st.ToString().c_str());
            bool cancel = c->source.peer_sink.cancel_requested;
            c->stats.rdma_fallbacks++;
            c->source.peer_sink.valid = false;
            size_t a = c->AppendData(q, std::min(rem, c->tx.size - wire::kHeaderSize));
            if (cancel) {
              c->QueueData(wire::Message{{MessageId::kSinkCancelAck}, wire::AdvertRef{sid}});
            }
            off += a;
            total += a;
            c->TryTransmit();
            continue;
          }
          c->QueueData(wire::Message{{MessageId::kRdmaWrCompl},
                                     wire::Completed{sid, static_cast<uint32_t>(k)}});
          if (c->source.peer_sink.cancel_requested) {
            c->QueueData(wire::Message{{MessageId::kSinkCancelAck}, wire::AdvertRef{sid}});
          }
          c->source.peer_sink.valid = false;
          c->tx.pos += k;
          c->stats.bytes_sent_sinkavail += k;
          off += k;
          total += k;
          c->TryTransmit();
          continue;
        }
        // AZ-SDP: protect the page-aligned middle, announce it, go on; the
        // unaligned head and tail go by bcopy (seed 003, 4.4.2).
        if (force_bcopy == 0 && c->az.enabled && c->opt.mode == Mode::kAz && rem >= threshold &&
            !az_sync) {
          const uintptr_t page = az::PageSize();
          const uintptr_t a = reinterpret_cast<uintptr_t>(q);
          const uintptr_t first = (a + page - 1) / page * page;
          const uintptr_t last = (a + std::min(rem, kMaxAdvert)) / page * page;
          if (last > first && last - first >= std::min<size_t>(threshold, 4 * page)) {
            if (first > a) {
              force_bcopy = first - a;
              c->stats.az_hybrid_bcopy += first - a;
            } else if (c->AzOut() >= c->AzLimit()) {
              c->TryTransmit();
              if (dontwait) return partial(WouldBlock());
              if (!e->WaitLocked([&] { return !c->failure.error.ok() || c->AzOut() < c->AzLimit(); },
                                 deadline)) {
                return partial(TimedOut());
              }
              continue;
            } else {
              const size_t L = last - first;
              auto r = c->ep->fabric()->rcache().Get(const_cast<uint8_t*>(q), L,
                                                     kRemoteRead | kLocalRead);
              const uint32_t serial = c->NextAzSerial();
              absl::StatusOr<int> g = -1;
              if (r.ok()) {
                e->az_used_.store(true, std::memory_order_relaxed);
                g = az::Guard::Get().Protect(first, L, e->fault_client(),
                                             (c->id << 32) | serial);
              } else {
                g = r.status();
              }
              if (!g.ok()) {
                ZS_LOG(kDebug, "sdp: AZ-SDP cannot protect the buffer (%s); sending it by zcopy",
                       g.status().ToString().c_str());
                c->stats.az_unprotectable++;
                az_sync = true;
                continue;
              }
              AzSrcAvail as;
              as.serial = serial;
              as.slot = 0;
              while (c->az.slot_busy[as.slot]) as.slot++;
              as.gen = c->az.src_gen[as.slot];
              as.len = static_cast<uint32_t>(L);
              as.addr = first;
              as.stream_pos = c->TxCommitted();
              as.guard = *g;
              as.mr = *r;
              c->az.slot_busy[as.slot] = 1;
              TxItem item;
              item.mid = MessageId::kSrcAvail;
              item.az_serial = serial;
              item.encoded = wire::EncodeToString(c->AzAdvert(as, wire::kFlagAzAsync));
              c->az.src.push_back(std::move(as));
              c->tx.dataq.push_back(std::move(item));
              c->stats.az_srcavail_sent++;
              c->stats.az_bytes += L;
              c->TryTransmit();
              off += L;
              total += L;
              continue;
            }
          } else {
            force_bcopy = rem;  // no whole page: all by bcopy
            c->stats.az_hybrid_bcopy += rem;
          }
        }
        az_sync = false;
        if (force_bcopy == 0 && (c->opt.mode == Mode::kZcopy || c->opt.mode == Mode::kAz) &&
            rem >= threshold && (c->peer.caps & wire::kCapRdmaRead) && !dontwait) {
          size_t L = std::min(rem, kMaxAdvert);
          auto r = c->ep->fabric()->rcache().Get(const_cast<uint8_t*>(q), L,
                                                 kRemoteRead | kLocalRead);
          if (r.ok()) {
            wire::Advert a;
            a.addr = reinterpret_cast<uint64_t>(q);
            a.length = static_cast<uint32_t>(L);
            a.stream_pos = c->TxCommitted();
            a.key = (*r)->remote_key();
            a.key_bytes = a.key.Serialize();
            c->source.advert = {};
            c->source.advert.active = true;
            c->source.advert.len = static_cast<uint32_t>(L);
            c->source.advert.mr = *r;
            c->QueueData(wire::Message{{MessageId::kSrcAvail}, a});
            c->stats.srcavail_sent++;
            c->TryTransmit();
            bool finished = e->WaitLocked([&] { return c->source.advert.finished; }, deadline);
            if (!finished && !c->source.advert.posted) {
              // Never left: withdraw it.
              for (auto it = c->tx.dataq.begin(); it != c->tx.dataq.end(); ++it) {
                if (it->mid == MessageId::kSrcAvail) {
                  c->tx.dataq.erase(it);
                  break;
                }
              }
              c->source.advert = {};
              return partial(TimedOut());
            }
            if (!finished) {
              c->source.advert.cancel_sent = true;
              c->stats.srcavail_cancels++;
              c->QueueCtl(wire::Message{{MessageId::kSrcAvailCancel},
                                        wire::AdvertRef{c->source.advert.id}});
              c->TryTransmit();
              e->WaitLocked([&] { return c->source.advert.finished; }, absl::InfiniteFuture());
            }
            size_t got = c->source.advert.done;
            bool small = c->source.advert.send_small;
            bool cancelled = c->source.advert.cancel_sent;
            c->source.advert = {};
            c->stats.bytes_sent_srcavail += got;
            off += got;
            total += got;
            if (!c->failure.error.ok()) return partial(c->failure.error);
            if (cancelled && got < L) return partial(TimedOut());
            if (small) {
              c->stats.sendsmall++;
              force_bcopy = L - got;
            }
            continue;
          }
          ZS_LOG(kDebug, "sdp: registration for zero-copy failed (%s); using bcopy",
                 r.status().ToString().c_str());
          force_bcopy = L;
        }
        // Pulled bcopy: one copy into our pull buffer; the peer reads it
        // straight into its application's buffer (pull.cc).
        // A non-blocking send that finds the pull buffer full goes by bcopy
        // below, as far as the send slots take it: readiness (CanAppend)
        // promised that much.
        size_t pull_at = 0, room = 0;
        if (force_bcopy == 0 && c->PullWanted(rem) && c->EnsurePullBuffer() &&
            ((room = c->PullRoom(rem, &pull_at)) > 0 || !dontwait)) {
          if (room > 0) {
            c->QueuePull(q, room, pull_at);
            off += room;
            total += room;
            continue;
          }
          c->TryTransmit();
          if (!e->WaitLocked([&] { return !c->failure.error.ok() || c->PullRoom(rem, &pull_at) > 0; },
                             deadline)) {
            return partial(TimedOut());
          }
          continue;
        }
        size_t want = force_bcopy ? std::min(rem, force_bcopy) : rem;
        size_t k = c->AppendData(q, want);
        if (k > 0) {
          off += k;
          total += k;
          if (force_bcopy) force_bcopy -= k;
          c->TryTransmit();
          continue;
        }
        c->TryTransmit();
        if (dontwait) return partial(WouldBlock());
        if (!e->WaitLocked([&] { return !c->failure.error.ok() || c->CanAppend() || c->source.peer_sink.valid; },
                           deadline)) {
          return partial(TimedOut());
        }
      }
    }
    result = total;
    ZS_LOG(kTrace, "sdp conn %d send -> %zu", static_cast<int>(c->id), total);
  }
  return result;
}

absl::StatusOr<size_t> Connection::Recv(std::span<const iovec> iov, int flags,
                                        Deadline deadline) {
  if (StateUnlocked() == nullptr) return Closed();
  Engine* e = engine_;
  // A buffer this process is still sending from (AZ-SDP) is read-only, and
  // must be settled (copy-on-write, or a wait for the pull) before anything
  // is written into it. Not before there is something to write, though: a
  // request/response peer pulls our data before it answers, so its
  // RdmaRdCompl comes ahead of its reply and usually frees the buffer at no
  // cost (settling at once made every 1 MiB azcopy ping-pong copy 1 MiB
  // aside). So wait, making progress, until the buffer is writable or the
  // stream has something for it; settle then, without the engine lock (the
  // fault path takes it).
  const auto send_protected = [&iov] {
    for (const iovec& v : iov) {
      if (az::Guard::Get().Overlaps(v.iov_base, v.iov_len)) return true;
    }
    return false;
  };
  if (send_protected()) {
    bool receivable;
    bool has_bytes;
    bool block_policy;
    {
      MutexLock lock(&e->mu_);
      ConnState* c = state_;
      if (c == nullptr) return Closed();
      CallScope in_call(c);
      block_policy = c->opt.az_policy == AzPolicy::kBlock;
      e->ProgressLocked();
      const auto ready = [&] {
        return !c->rx.queue.empty() || c->shut.peer_wr || !c->failure.error.ok() || c->shut.rd;
      };
      e->WaitLocked([&] { return !send_protected() || ready(); },
                    (flags & MSG_DONTWAIT) ? kNoWait : deadline);
      receivable = ready();
      // With only an end of stream, a reset or SHUT_RD to report, nothing
      // will be written into the buffer (and no bytes can follow those).
      has_bytes = !c->rx.queue.empty();
    }
    e->RunCallbacks();
    if (send_protected() && (!receivable || has_bytes)) {
      if (!receivable) return (flags & MSG_DONTWAIT) ? WouldBlock() : TimedOut();
      // Block-on-write settles by waiting for the peer's pull, which a
      // non-blocking call must not do: try again later (each retry makes
      // progress; an event loop sees the socket readable and spins until
      // the pull completes). Copy-on-write settles at once, or waits only
      // for a pull the peer has already started. (The receiving
      // connection's policy decides here; the fault path uses the policy of
      // the connection sending the buffer, which differs only when the two
      // were given different ConnectionOptions.)
      if ((flags & MSG_DONTWAIT) && block_policy) return WouldBlock();
      for (const iovec& v : iov) {
        if (az::Guard::Get().Overlaps(v.iov_base, v.iov_len)) {
          az::Guard::Get().WaitWritable(v.iov_base, v.iov_len);
        }
      }
    }
  }
  absl::StatusOr<size_t> result;
  absl::Cleanup callbacks = [e] { e->RunCallbacks(); };  // as in Send
  {
    MutexLock lock(&e->mu_);
    ConnState* c = state_;
    if (c == nullptr) return Closed();  // closed by another thread meanwhile
    CallScope in_call(c);
    // Bytes already queued came before anything the CQ holds: with some at
    // the head, copy them without polling (waits below still progress).
    if (c->rx.queue.empty() || c->rx.queue.front().kind != RxSeg::kData) e->ProgressLocked();
    bool dontwait = flags & MSG_DONTWAIT;
    bool peek = flags & MSG_PEEK;
    bool waitall = (flags & MSG_WAITALL) && !peek;
    if (!e->WaitLocked([&] { return !c->calls.recv_busy; }, dontwait ? kNoWait : deadline)) {
      return dontwait ? WouldBlock() : TimedOut();
    }
    c->calls.recv_busy = true;
    absl::Cleanup done = [&] {
      c->calls.recv_busy = false;
      e->NoteReadinessLocked(c);
      e->NotifyLocked();
    };
    IovCursor cur(iov);
    size_t copied = 0;
    if (cur.done()) return size_t{0};
    Fabric* fabric = c->ep->fabric();
    const size_t max_rma = fabric->caps().max_rma_size ? fabric->caps().max_rma_size : kMaxAdvert;
    for (;;) {
      if (c->failure.local_abort) return c->failure.error;
      if (c->shut.rd) return copied;
      // 1. Copy what the stream holds.
      size_t peek_skip = 0;  // PEEK: bytes of the queue already copied
      for (size_t si = 0; !cur.done() && si < c->rx.queue.size();) {
        RxSeg& s = c->rx.queue[si];
        size_t avail = s.len - s.off;
        size_t start = s.off;
        if (peek) {
          if (peek_skip >= avail) {
            peek_skip -= avail;
            ++si;
            continue;
          }
          start += peek_skip;
          avail -= peek_skip;
          peek_skip = 0;
        }
        if (s.kind == RxSeg::kData) {
          size_t k = std::min(avail, cur.space());
          CopyBytes(cur.ptr(), s.data + start, k);
          cur.Advance(k);
          copied += k;
          if (peek) {
            peek_skip = 0;
            if (k == avail) {
              ++si;
            }
            continue;
          }
          s.off += k;
          c->stats.bytes_recv_bcopy += k;
          if (s.off == s.len) {
            int b = s.buf;
            c->rx.queue.pop_front();
            c->Repost(b);
          }
          continue;
        }
        // An earlier receive that returned early must land before the next
        // read (its RdmaRdCompl goes first).
        if (c->az.rx.active) {
          e->WaitLocked([&] { return !c->az.rx.active || !c->failure.error.ok(); },
                        absl::InfiniteFuture());
          if (!c->failure.error.ok()) return copied ? absl::StatusOr<size_t>(copied) : c->failure.error;
          si = 0;
          peek_skip = 0;
          if (peek) break;
          continue;
        }
        // AZ-SDP SrcAvail: lock its word before the first read, unless the
        // source moved the data to a copy (then its AzUpdate comes).
        if (s.slot != wire::kNoSlot && !s.locked && !s.moved) {
          uint64_t expect = AzWord(s.gen, kAzFree);
          if (__atomic_compare_exchange_n(c->LockWord(s.slot), &expect,
                                          AzWord(s.gen, kAzSinkReading), false, __ATOMIC_SEQ_CST,
                                          __ATOMIC_SEQ_CST)) {
            s.locked = true;
          } else if (expect == AzWord(s.gen, kAzSourceMoved)) {
            const uint32_t advert = s.advert;
            auto moved = [&] {
              for (const RxSeg& x : c->rx.queue) {
                if (x.kind == RxSeg::kSrcAvail && x.advert == advert) return x.moved;
              }
              return true;
            };
            e->WaitLocked([&] { return !c->failure.error.ok() || c->shut.rd || moved(); },
                          absl::InfiniteFuture());
            if (!c->failure.error.ok()) return copied ? absl::StatusOr<size_t>(copied) : c->failure.error;
            si = 0;
            peek_skip = 0;
            if (peek) break;  // start the peek over
            continue;
          } else {
            wire::Header h;
            h.mid = MessageId::kSrcAvail;
            h.mseq = s.advert;
            c->ProtocolError(Violation(h, absl::StrCat("lock word ", s.slot, " holds ", expect,
                                                       ", not generation ", s.gen)));
            return copied ? absl::StatusOr<size_t>(copied) : c->failure.error;
          }
        }
        // AZ-SDP receive side: whole pages of a large, page-aligned buffer
        // are returned at once and land behind the application's back.
        if (s.slot != wire::kNoSlot && !peek && !waitall && c->opt.mode == Mode::kAz &&
            c->opt.az_early_recv) {
          const size_t page = az::PageSize();
          auto* d = static_cast<uint8_t*>(cur.ptr());
          const size_t k = std::min(avail, cur.space()) / page * page;
          if (reinterpret_cast<uintptr_t>(d) % page == 0 &&
              k >= std::max<size_t>(c->opt.zcopy_threshold, 16 * page) &&
              c->AzRecvEarly(s, d, k)) {
            s.off += k;
            c->rx.pos += k;
            c->stats.bytes_recv_srcavail += k;
            if (s.off == s.len) c->rx.queue.erase(c->rx.queue.begin() + static_cast<std::ptrdiff_t>(si));
            cur.Advance(k);
            copied += k;
            break;
          }
        }
        // SrcAvail: RDMA-read into the caller's buffer.
        size_t k = std::min({avail, cur.space(), max_rma});
        std::shared_ptr<MemoryRegion> mr;
        absl::Status st;
        if (fabric->caps().registration_required) {
          auto r = fabric->rcache().Get(cur.ptr(), k, kLocalWrite);
          if (r.ok()) {
            mr = *r;
          } else {
            st = r.status();
          }
        }
        uint32_t advert = s.advert;
        if (st.ok() && c->failure.ep_closed) st = c->failure.error;
        if (st.ok()) {
          s.reading = true;
          c->sink.read_status = absl::OkStatus();
          st = c->ep->Read(cur.ptr(), k, mr.get(), s.addr + start, s.key,
                           MakeCtx(c->id, kCtxRead, 0));
          if (st.ok()) {
            c->sink.reads_out++;
            // The buffer is in use until the read completes: no deadline.
            e->WaitLocked([&] { return c->sink.reads_out == 0; }, absl::InfiniteFuture());
            st = c->sink.read_status;
          }
        }
        // The deque may have grown; find the segment again (it is the
        // first SrcAvail: only one is outstanding).
        RxSeg* sp = nullptr;
        size_t idx = 0;
        for (; idx < c->rx.queue.size(); ++idx) {
          if (c->rx.queue[idx].kind == RxSeg::kSrcAvail && c->rx.queue[idx].advert == advert) {
            sp = &c->rx.queue[idx];
            break;
          }
        }
        if (sp == nullptr) return copied ? absl::StatusOr<size_t>(copied) : c->failure.error;
        sp->reading = false;
        if (!c->failure.error.ok()) return copied ? absl::StatusOr<size_t>(copied) : c->failure.error;
        if (!st.ok() && (sp->slot != wire::kNoSlot || sp->pulled)) {
          // An asynchronous advert cannot be resent by copy in stream order.
          // (A dead peer is the usual cause; a live one released the memory.)
          c->PostAbort(ECONNRESET);
          c->Fail(ResetError(absl::StrCat(
              "RDMA read of ", sp->pulled ? "pulled" : "asynchronous", " SrcAvail ", advert,
              sp->pulled ? " failed: " : " failed (an azcopy sender must not unmap a buffer it sent): ",
              st.message())));
          return copied ? absl::StatusOr<size_t>(copied) : c->failure.error;
        }
        if (!st.ok()) {
          // The source sends the rest by BCopy (RdmaRdCompl + SendSmall).
          ZS_LOG(kInfo, "sdp: RDMA read of SrcAvail %u failed (%s); asking for bcopy", advert,
                 st.ToString().c_str());
          c->stats.rdma_fallbacks++;
          uint8_t fl = sp->cancel_requested ? wire::kFlagCancelReply : wire::kFlagSendSmall;
          c->QueueCtl(wire::Message{{MessageId::kRdmaRdCompl, fl}, wire::Completed{advert, 0}});
          c->rx.queue.erase(c->rx.queue.begin() + idx);
          c->TryTransmit();
          break;
        }
        cur.Advance(k);
        copied += k;
        if (peek) {
          if (sp->cancel_requested) {
            c->QueueCtl(wire::Message{{MessageId::kRdmaRdCompl, wire::kFlagCancelReply},
                                      wire::Completed{advert, 0}});
            c->rx.queue.erase(c->rx.queue.begin() + idx);
            c->TryTransmit();
            break;
          }
          if (k == avail) ++si;
          continue;
        }
        sp->off += k;
        c->rx.pos += k;
        (sp->pulled ? c->stats.bytes_recv_pull : c->stats.bytes_recv_srcavail) += k;
        if (sp->off == sp->len) c->AzSinkDone(*sp);  // before the completion leaves
        uint8_t fl = sp->cancel_requested ? wire::kFlagCancelReply : 0;
        c->QueueCtl(wire::Message{{MessageId::kRdmaRdCompl, fl},
                                  wire::Completed{advert, static_cast<uint32_t>(k)}});
        if (sp->off == sp->len || sp->cancel_requested) c->rx.queue.erase(c->rx.queue.begin() + idx);
        c->TryTransmit();
        si = 0;
      }
      c->TryTransmit();
      if (cur.done() || (copied > 0 && !waitall)) break;
      // End of stream: the peer's DisconnReq came after all its data (even
      // if the connection failed afterwards, unless it was reset).
      if (c->shut.peer_wr && c->rx.queue.empty() && !c->failure.peer_aborted) break;
      if (!c->failure.error.ok()) return copied ? absl::StatusOr<size_t>(copied) : c->failure.error;
      if (peek && copied > 0) break;
      // This thread is about to wait for the peer (or to tell an event loop
      // to): it sends nothing more meanwhile, so a tail autocork holds goes
      // now instead of after the peer's acknowledgement.
      c->FlushTail();
      if (dontwait) {
        if (copied > 0) break;
        return WouldBlock();
      }
      // 2. Nothing queued: announce the buffer (SinkAvail) if it is large.
      if (!peek && c->rx.queue.empty() && c->opt.mode == Mode::kZcopy &&
          (c->peer.caps & wire::kCapRdmaWrite) && cur.space() >= c->opt.zcopy_threshold &&
          !c->sink.advert.active && !c->shut.rd) {
        size_t L = std::min(cur.space(), kMaxAdvert);
        auto r = fabric->rcache().Get(cur.ptr(), L, kRemoteWrite | kLocalWrite);
        if (r.ok()) {
          wire::Advert a;
          a.addr = reinterpret_cast<uint64_t>(cur.ptr());
          a.length = static_cast<uint32_t>(L);
          a.stream_pos = c->rx.pos;
          a.key = (*r)->remote_key();
          a.key_bytes = a.key.Serialize();
          c->sink.advert = {};
          c->sink.advert.active = true;
          c->sink.advert.len = static_cast<uint32_t>(L);
          c->sink.advert.mr = *r;
          c->QueueCtl(wire::Message{{MessageId::kSinkAvail}, a});
          c->stats.sinkavail_sent++;
          c->TryTransmit();
          bool resolved = e->WaitLocked(
              [&] { return c->sink.advert.resolved || !c->failure.error.ok() || c->shut.rd; }, deadline);
          if (!resolved && !c->sink.advert.posted) {
            for (auto it = c->tx.ctlq.begin(); it != c->tx.ctlq.end(); ++it) {
              if (it->mid == MessageId::kSinkAvail) {
                c->tx.ctlq.erase(it);
                break;
              }
            }
            c->sink.advert = {};
            c->stats.sinkavail_sent--;
            return copied ? absl::StatusOr<size_t>(copied) : TimedOut();
          }
          if (!resolved) {
            // Deadline or SHUT_RD: cancel, then wait for the source's answer
            // (its write, a void by data, or the ack) before giving the
            // buffer back.
            c->sink.advert.cancel_sent = true;
            c->sink.acks_due.push_back(c->sink.advert.id);
            c->stats.sinkavail_cancels++;
            c->QueueCtl(wire::Message{{MessageId::kSinkAvailCancel},
                                      wire::AdvertRef{c->sink.advert.id}});
            c->TryTransmit();
            e->WaitLocked([&] { return c->sink.advert.resolved || !c->failure.error.ok(); },
                          absl::InfiniteFuture());
          }
          // Bytes the source reported written are in the buffer even if the
          // connection failed afterwards (e.g. the peer closed right after
          // its RdmaWrCompl and DisconnReq): deliver them, as bcopy data
          // already received is delivered.
          size_t w = c->sink.advert.written;
          c->sink.advert = {};
          if (w > 0) {
            c->stats.bytes_recv_sinkavail += w;
            cur.Advance(w);
            copied += w;
          }
          if (!resolved && w == 0 && c->failure.error.ok() && c->rx.queue.empty()) {
            return copied ? absl::StatusOr<size_t>(copied) : TimedOut();
          }
          continue;
        }
      }
      if (!e->WaitLocked([&] {
            return !c->rx.queue.empty() || c->shut.peer_wr || !c->failure.error.ok() || c->shut.rd;
          }, deadline)) {
        if (copied > 0) break;
        return TimedOut();
      }
    }
    result = copied;
    ZS_LOG(kTrace, "sdp conn %d recv -> %zu", static_cast<int>(c->id), copied);
  }
  return result;
}

absl::Status Connection::Shutdown(int how) {
  if (StateUnlocked() == nullptr) return Closed();
  {
    MutexLock lock(&engine_->mu_);
    if (state_ == nullptr) return Closed();
    ConnState* c = state_;
    if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL, "shutdown: bad 'how'",
                       "use SHUT_RD, SHUT_WR or SHUT_RDWR");
    }
    ShutdownLocked(c, how);
  }
  engine_->RunCallbacks(/*sync=*/true);
  return absl::OkStatus();
}

void Connection::ShutdownLocked(ConnState* c, int how) {
  if (how == SHUT_RD || how == SHUT_RDWR) {
    c->shut.rd = true;
    c->DropReceived();
  }
  if ((how == SHUT_WR || how == SHUT_RDWR) && c->failure.error.ok()) c->QueueShutdownWr();
  engine_->NoteReadinessLocked(c);
  engine_->NotifyLocked();
}

void Connection::Abort() {
  if (StateUnlocked() == nullptr) return;
  {
    MutexLock lock(&engine_->mu_);
    if (state_ == nullptr) return;
    ConnState* c = state_;
    if (c->failure.error.ok()) {
      c->PostAbort(0);
      c->failure.local_abort = true;
      c->Fail(MakeError(absl::StatusCode::kAborted, ECONNABORTED, "the connection was aborted",
                        "open a new connection"));
      engine_->WaitLocked([&] { return c->tx.inflight == 0; },
                          absl::Now() + absl::Seconds(1));
      c->CloseEndpoint();
    }
    engine_->NoteReadinessLocked(c);
  }
  engine_->RunCallbacks(/*sync=*/true);
}

absl::Status Connection::Close() {
  if (StateUnlocked() == nullptr) return absl::OkStatus();
  absl::Status result;
  {
    MutexLock lock(&engine_->mu_);
    if (state_ == nullptr) return absl::OkStatus();
    ConnState* c = state_;
    if (c->calls.closing) {  // another thread is closing it: done when that is
      engine_->WaitLocked([&] { return state_ == nullptr; }, absl::InfiniteFuture());
      return absl::OkStatus();
    }
    c->calls.closing = true;
    if (c->calls.active > 0) {
      // Other threads are in Send or Recv on this connection (a socket
      // closed under them): wake them as shutdown(SHUT_RDWR) does and let
      // them leave before the state goes. One still inside after the
      // linger time (a send the peer never makes room for) is failed out.
      ShutdownLocked(c, SHUT_RDWR);
      if (!engine_->WaitLocked([&] { return c->calls.active == 0; }, absl::Now() + c->opt.linger)) {
        c->PostAbort(0);  // best effort, as Abort: the peer may have no room for it
        c->Fail(MakeError(absl::StatusCode::kAborted, EBADF,
                          "the socket was closed while this call waited on it",
                          "close a socket only after the calls on it have returned"));
        engine_->NotifyLocked();
        engine_->WaitLocked([&] { return c->calls.active == 0; }, absl::InfiniteFuture());
      }
    }
    if (c->failure.error.ok() && c->phase == ConnState::Phase::kOpen) {
      c->QueueShutdownWr();
      bool flushed = engine_->WaitLocked(
          [&] {
            // Everything left and the peer acknowledged our DisconnReq (a
            // provider may drop messages still in flight when the endpoint
            // closes).
            return !c->failure.error.ok() ||
                   (c->tx.dataq.empty() && c->tx.ctlq.empty() && c->tx.inflight == 0 &&
                    c->az.src.empty() &&
                    c->shut.wr_mseq != 0 && static_cast<int32_t>(c->credit.peer_ack - c->shut.wr_mseq) >= 0);
          },
          absl::Now() + c->opt.linger);
      if (!flushed) {
        result = MakeError(absl::StatusCode::kDeadlineExceeded, ETIMEDOUT,
                           "close: queued data did not leave within the linger time",
                           "raise the linger option or let the peer read");
      }
    }
    // Operations on user buffers must be over before they are released.
    engine_->WaitLocked(
        [&] {
          return c->sink.reads_out == 0 && c->source.writes_out == 0 && c->az.atomics_out == 0 &&
                 !c->az.rx.active;
        },
        absl::Now() + absl::Seconds(5));
    c->AzRxAbandon();
    c->AzReleaseAll();  // not pulled within the linger time: given up
    c->phase = ConnState::Phase::kClosed;
    c->CloseEndpoint();
    engine_->RemoveLocked(c->id);
    __atomic_store_n(&state_, nullptr, __ATOMIC_RELAXED);  // StateUnlocked reads it
    engine_->NotifyLocked();  // a second Close waits for this
  }
  engine_->RunCallbacks(/*sync=*/true);
  return result;
}

uint32_t Connection::readiness() const {
  if (StateUnlocked() == nullptr) return kError | kHup;
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return kError | kHup;
  return state_->ReadinessNow();
}

void Connection::SetReadinessCallback(std::function<void(uint32_t)> cb) {
  if (StateUnlocked() == nullptr) return;
  {
    MutexLock lock(&engine_->mu_);
    if (state_ == nullptr) return;
    state_->readiness.callback =
        cb ? std::make_shared<std::function<void(uint32_t)>>(std::move(cb)) : nullptr;
    state_->readiness.last = ~0u;  // fire once with the current state
    state_->readiness.watch = std::make_shared<std::atomic<uint32_t>>(~0u);
    engine_->NoteReadinessLocked(state_);
  }
  engine_->RunCallbacks(/*sync=*/true);
}

std::shared_ptr<std::atomic<uint32_t>> Connection::readiness_watch() const {
  if (StateUnlocked() == nullptr) return nullptr;
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return nullptr;
  return state_->readiness.watch;
}

ConnectionStats Connection::stats() const {
  if (StateUnlocked() == nullptr) return {};
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return {};
  ConnectionStats s = state_->stats;
  s.queued_bytes = state_->bcopy.queued_bytes;
  s.held_bytes = state_->HeldBytes();
  return s;
}

bool Connection::az_negotiated() const {
  if (StateUnlocked() == nullptr) return false;
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return false;
  return state_->az.enabled;
}

bool Connection::pull_negotiated() const {
  if (StateUnlocked() == nullptr) return false;
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return false;
  return state_->pull.peer_count > 0 && state_->opt.pull_threshold > 0;
}

absl::Status Connection::SetMode(Mode mode) {
  if (StateUnlocked() == nullptr) return Closed();
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return Closed();
  if (mode == Mode::kAz && state_->phase == ConnState::Phase::kOpen && !state_->az.enabled) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EOPNOTSUPP,
                     "AZ-SDP was not negotiated on this connection",
                     "set mode azcopy (ZSOCK_MODE=azcopy) on both sides before connecting; "
                     "it also needs RDMA read and atomics from the provider");
  }
  if (state_->opt.mode != mode) {
    state_->opt.mode = mode;
    if (state_->phase == ConnState::Phase::kOpen) {
      state_->QueueCtl(wire::Message{{MessageId::kModeChange}, wire::ModeChange{mode}});
      state_->TryTransmit();
    }
  }
  return absl::OkStatus();
}

void Connection::SetAutocork(bool on) {
  if (StateUnlocked() == nullptr) return;
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return;
  state_->SetAutocork(on);
}

void Connection::SetLinger(absl::Duration linger) {
  if (StateUnlocked() == nullptr) return;
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return;
  state_->opt.linger = linger;
}

absl::Status Connection::SetZcopyThreshold(size_t bytes) {
  if (StateUnlocked() == nullptr) return Closed();
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return Closed();
  state_->opt.zcopy_threshold = std::max<size_t>(bytes, 1);
  return absl::OkStatus();
}

ConnectionOptions Connection::options() const {
  if (StateUnlocked() == nullptr) return {};
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return {};
  return state_->opt;
}

std::string Connection::peer_socket_address() const {
  MutexLock lock(&engine_->mu_);
  return state_ != nullptr ? state_->peer_sockaddr : "";
}

std::string Connection::peer_address() const {
  if (StateUnlocked() == nullptr) return "";
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return "";
  return state_->peer_address;
}

std::string Connection::local_address() const {
  if (StateUnlocked() == nullptr) return "";
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return "";
  return state_->local_address;
}

absl::Status Connection::error() const {
  if (StateUnlocked() == nullptr) return Closed();
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return Closed();
  return state_->failure.error;
}

absl::Status Connection::TestInjectRaw(std::string bytes) {
  if (StateUnlocked() == nullptr) return Closed();
  MutexLock lock(&engine_->mu_);
  if (state_ == nullptr) return Closed();
  ConnState* c = state_;
  if (bytes.size() > c->tx.size || bytes.size() < wire::kHeaderSize) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL, "raw message size",
                     "give 16 bytes .. the peer's buffer size");
  }
  // Sent as the next message: the sequence numbers are patched in unless
  // the caller set them (non-zero), so only the field under test is wrong.
  TxItem item;
  item.mid = static_cast<MessageId>(static_cast<uint8_t>(bytes[0]));
  if (!c->failure.error.ok()) return c->failure.error;
  if (c->tx.free.empty() || c->Credits() < 1) return WouldBlock();
  int slot = c->tx.free.back();
  c->tx.free.pop_back();
  uint8_t* p = c->SlotPtr(slot);
  std::memcpy(p, bytes.data(), bytes.size());
  uint32_t mseq, ack;
  std::memcpy(&mseq, p + 8, 4);
  std::memcpy(&ack, p + 12, 4);
  ++c->credit.tx_mseq;
  if (mseq == 0) std::memcpy(p + 8, &c->credit.tx_mseq, 4);
  if (ack == 0) std::memcpy(p + 12, &c->credit.rx_mseq, 4);
  auto st = c->ep->Send(p, bytes.size(), c->tx.region.mr.get(), MakeCtx(c->id, kCtxTx, slot));
  if (!st.ok()) {
    c->tx.free.push_back(slot);
    return st;
  }
  c->tx.inflight++;
  return absl::OkStatus();
}

void Connection::TestReleaseHeld() {
  if (StateUnlocked() == nullptr) return;
  {
    MutexLock lock(&engine_->mu_);
    if (state_ == nullptr) return;
    state_->tx.held = false;
    state_->opt.test_hold = nullptr;
    state_->TryTransmit();
    engine_->NotifyLocked();
  }
  engine_->RunCallbacks();
}

}  // namespace zsock::sdp
