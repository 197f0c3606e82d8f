// The AZ-SDP buffer guard (az_guard.h). Written by hand: no library offers
// write-protection of live user buffers with fault resolution; libsigsegv
// (Debian) dispatches faults but its handlers may not block on another
// thread's progress, which is the whole point here.
#include "core/sdp/az_guard.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/log.h"
#include "core/memhooks.h"
#include "core/mutex.h"
#include "core/status.h"

namespace zsock::sdp::az {
namespace {

constexpr int kSlots = 1024;
constexpr int kMaxRanges = 5;  // the buffer and up to 4 aliases

// One protected range. The signal handler reads it without locks: writers
// fill the ranges before setting `live` (release) and clear `live` only after
// write access is back, then bump `seq` (the futex waiters sleep on).
struct Slot {
  std::atomic<uint32_t> live{0};
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> fault{0};
  std::atomic<uint32_t> nranges{0};
  std::atomic<uint32_t> unreadable{0};  // PROT_NONE (a receive in flight)
  std::atomic<uintptr_t> start[kMaxRanges];
  std::atomic<uintptr_t> end[kMaxRanges];
  FaultClient* client = nullptr;  // guarded by Impl::mu
  uint64_t cookie = 0;
};

Slot g_slots[kSlots];
std::atomic<int> g_limit{0};   // slots [0, g_limit) may be live
std::atomic<int> g_live{0};
std::atomic<int> g_wake_fd{-1};
std::atomic<uint64_t> g_faults{0};
struct sigaction g_prev;       // the handler faults that are not ours go to
// The last address this thread retried without finding a range (a range
// released between the fault and the lookup): a second fault there is not
// ours. Initial-exec TLS: safe in a signal handler.
__thread uintptr_t t_retry_addr = 0;

void FutexWait(std::atomic<uint32_t>* word, uint32_t value) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, value, nullptr,
          nullptr, 0);
}
void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr,
          nullptr, 0);
}

bool Covers(const Slot& s, uintptr_t lo, uintptr_t hi) {
  uint32_t n = std::min<uint32_t>(s.nranges.load(std::memory_order_acquire), kMaxRanges);
  for (uint32_t k = 0; k < n; ++k) {
    uintptr_t a = s.start[k].load(std::memory_order_relaxed);
    uintptr_t b = s.end[k].load(std::memory_order_relaxed);
    if (lo < b && a < hi) return true;
  }
  return false;
}

int FindSlot(uintptr_t lo, uintptr_t hi, bool unreadable_only = false) {
  const int limit = g_limit.load(std::memory_order_acquire);
  for (int i = 0; i < limit; ++i) {
    const Slot& s = g_slots[i];
    if (s.live.load(std::memory_order_acquire) == 0) continue;
    if (unreadable_only && s.unreadable.load(std::memory_order_relaxed) == 0) continue;
    if (Covers(s, lo, hi)) return i;
  }
  return -1;
}

void WakeService() {
  uint64_t one = 1;
  int fd = g_wake_fd.load(std::memory_order_acquire);
  if (fd >= 0) (void)!write(fd, &one, sizeof(one));
}

// Waits until slot i's range is released (seq moves past `seq`).
void WaitRelease(Slot& s, uint32_t seq) {
  while (s.seq.load(std::memory_order_acquire) == seq) FutexWait(&s.seq, seq);
}

void Chain(int sig, siginfo_t* si, void* uc) {
  struct sigaction prev = g_prev;
  if (prev.sa_flags & SA_SIGINFO) {
    if (prev.sa_sigaction != nullptr) {
      prev.sa_sigaction(sig, si, uc);
      return;
    }
  } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
    return;
  }
  // Default action: restore it; the access faults again and the kernel
  // acts (an ignored SIGSEGV from a fault is fatal too).
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
}

// Async-signal-safe: atomics, write(2), futex(2).
void OnSegv(int sig, siginfo_t* si, void* uc) {
  const int saved_errno = errno;
  const uintptr_t a = reinterpret_cast<uintptr_t>(si->si_addr);
  if (sig == SIGSEGV && si->si_code == SEGV_ACCERR) {
    int i = FindSlot(a, a + 1);
    if (i >= 0) {
      Slot& s = g_slots[i];
      uint32_t seq = s.seq.load(std::memory_order_acquire);
      if (s.live.load(std::memory_order_acquire) != 0 && Covers(s, a, a + 1)) {
        g_faults.fetch_add(1, std::memory_order_relaxed);
        s.fault.store(1, std::memory_order_release);
        WakeService();
        WaitRelease(s, seq);
      }
      t_retry_addr = 0;
      errno = saved_errno;
      return;  // the access re-executes
    }
    if (t_retry_addr != a) {
      t_retry_addr = a;
      errno = saved_errno;
      return;
    }
    t_retry_addr = 0;
  }
  errno = saved_errno;
  Chain(sig, si, uc);
}

// ---- /proc/self/maps ----

struct Vma {
  uintptr_t start = 0, end = 0;
  bool read = false, write = false, exec = false, shared = false;
  uint64_t offset = 0, inode = 0;
  unsigned dev_major = 0, dev_minor = 0;
};

std::vector<Vma> ReadMaps() {
  std::vector<Vma> out;
  int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  std::string text;
  char buf[16384];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string line = text.substr(pos, eol - pos);
    pos = eol + 1;
    Vma v;
    unsigned long long s, e, off, ino;
    char perms[8] = {};
    unsigned maj, min;
    if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %x:%x %llu", &s, &e, perms, &off, &maj, &min,
                    &ino) != 7) {
      continue;
    }
    v.start = s;
    v.end = e;
    v.read = perms[0] == 'r';
    v.write = perms[1] == 'w';
    v.exec = perms[2] == 'x';
    v.shared = perms[3] == 's';
    v.offset = off;
    v.dev_major = maj;
    v.dev_minor = min;
    v.inode = ino;
    out.push_back(v);
  }
  return out;
}

struct Range {
  uintptr_t start, end;
};

}  // namespace

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

struct Guard::Impl {
  Mutex mu;
  CondVar cv;
  bool started ABSL_GUARDED_BY(mu) = false;
  FaultClient* calling ABSL_GUARDED_BY(mu) = nullptr;
  std::vector<Vma> maps ABSL_GUARDED_BY(mu);  // cache; reloaded on a miss
  uint64_t maps_generation ABSL_GUARDED_BY(mu) = 0;  // MappingGeneration() at load
  // The cached mapping containing `p`, or nullptr.
  const Vma* VmaAtLocked(uintptr_t p) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = std::upper_bound(maps.begin(), maps.end(), p,
                               [](uintptr_t x, const Vma& v) { return x < v.start; });
    if (it == maps.begin() || p >= (--it)->end) return nullptr;
    return &*it;
  }
  void LoadMapsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    maps_generation = MappingGeneration();
    maps = ReadMaps();
  }
  uint64_t protects ABSL_GUARDED_BY(mu) = 0;
  uint64_t aliases ABSL_GUARDED_BY(mu) = 0;

  void StartLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void EnsureHandler();
  void ServiceLoop();
  // Whether a live slot other than `except` covers [lo, hi); with
  // `read_only`, only send slots (those that leave the pages readable).
  bool LiveCoversLocked(uintptr_t lo, uintptr_t hi, int except, bool read_only = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Calls mprotect(prot) on each run of the pages of [a, b) that no other
  // live slot than `i` keeps as they are (any live slot when unprotecting;
  // a send slot when protecting read-only); returns the first errno, or 0
  // (the other runs are changed all the same).
  // Each mprotect takes the mm's lock for writing, which the peer's
  // cross-memory-attach reads of this process take for reading, so pages
  // needing no change get none.
  int ProtectRunsLocked(int i, uintptr_t a, uintptr_t b, int prot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status CheckLocked(uintptr_t addr, size_t len, std::vector<Range>* ranges)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::StatusOr<int> ProtectLocked(const std::vector<Range>& ranges, int prot,
                                    FaultClient* client, uint64_t cookie)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void UnprotectLocked(int i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
};

namespace {
Guard::Impl* g_impl = nullptr;

void Gate(void*, uintptr_t addr, size_t len) {
  if (g_live.load(std::memory_order_acquire) == 0) return;
  // Protected ranges are whole pages inside a buffer being sent: a block
  // smaller than a page holds none (every free() of a small object in the
  // process comes here). Should a small block still share a page with a
  // sent region (an application sending a span of several heap blocks),
  // the allocator's write into it faults and is resolved like any write.
  if (len < PageSize()) return;
  Guard& g = Guard::Get();
  if (g.Overlaps(reinterpret_cast<void*>(addr), len)) {
    g.WaitWritable(reinterpret_cast<void*>(addr), len);
  }
}

void AtforkPrepare() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (g_impl) g_impl->mu.Lock();
}
void AtforkParent() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (g_impl) g_impl->mu.Unlock();
}
// The child has only the forking thread and no service thread: it gets
// write access back on every page (its copies; the transfers belong to the
// parent) and a guard that starts again on its next Protect().
void AtforkChild() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (!g_impl) return;
  for (int i = 0; i < kSlots; ++i) {
    Slot& s = g_slots[i];
    if (s.live.load(std::memory_order_relaxed) == 0) continue;
    uint32_t n = s.nranges.load(std::memory_order_relaxed);
    for (uint32_t k = 0; k < n && k < kMaxRanges; ++k) {
      uintptr_t a = s.start[k].load(std::memory_order_relaxed);
      uintptr_t b = s.end[k].load(std::memory_order_relaxed);
      ::mprotect(reinterpret_cast<void*>(a), b - a, PROT_READ | PROT_WRITE);
    }
    s.live.store(0, std::memory_order_relaxed);
    s.nranges.store(0, std::memory_order_relaxed);
    s.fault.store(0, std::memory_order_relaxed);
    s.client = nullptr;
  }
  g_live.store(0, std::memory_order_relaxed);
  int fd = g_wake_fd.exchange(-1);
  if (fd >= 0) ::close(fd);
  g_impl->started = false;
  g_impl->calling = nullptr;
  g_impl->mu.Unlock();
}
}  // namespace

Guard::Guard() : impl_(new Impl) {
  g_impl = impl_;
  pthread_atfork(AtforkPrepare, AtforkParent, AtforkChild);
}

Guard& Guard::Get() {
  static Guard* g = new Guard;  // never destroyed: the handler may run at exit
  return *g;
}

void Guard::Impl::StartLocked() {
  if (started) return;
  started = true;
  g_wake_fd.store(eventfd(0, EFD_CLOEXEC), std::memory_order_release);
  SetMemoryReleaseGate(&Gate, nullptr);
  std::thread([this] { ServiceLoop(); }).detach();
}

void Guard::Impl::EnsureHandler() {
  struct sigaction cur;
  if (sigaction(SIGSEGV, nullptr, &cur) != 0) return;
  if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == &OnSegv) return;
  // Not installed yet, or the application installed its own since: chain to
  // that one and put ours in front.
  g_prev = cur;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = &OnSegv;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGSEGV, &sa, nullptr) != 0) {
    ZS_LOG(kError, "AZ-SDP: cannot install the SIGSEGV handler: %s", strerror(errno));
  }
}

void Guard::Impl::ServiceLoop() {
  const int fd = g_wake_fd.load(std::memory_order_acquire);
  for (;;) {
    uint64_t v;
    ssize_t n = ::read(fd, &v, sizeof(v));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;
    for (;;) {
      FaultClient* client = nullptr;
      uint64_t cookie = 0;
      {
        MutexLock lock(&mu);
        const int limit = g_limit.load(std::memory_order_acquire);
        for (int i = 0; i < limit && client == nullptr; ++i) {
          Slot& s = g_slots[i];
          if (s.live.load(std::memory_order_acquire) == 0) continue;
          if (s.fault.exchange(0, std::memory_order_acq_rel) == 0) continue;
          client = s.client;
          cookie = s.cookie;
        }
        if (client == nullptr) break;
        calling = client;
      }
      client->OnFault(cookie);
      MutexLock lock(&mu);
      calling = nullptr;
      cv.SignalAll();
    }
  }
}

bool Guard::Impl::LiveCoversLocked(uintptr_t lo, uintptr_t hi, int except, bool read_only) {
  const int limit = g_limit.load(std::memory_order_relaxed);
  for (int i = 0; i < limit; ++i) {
    const Slot& s = g_slots[i];
    if (i == except || s.live.load(std::memory_order_relaxed) == 0 ||
        (read_only && s.unreadable.load(std::memory_order_relaxed) != 0)) {
      continue;
    }
    if (Covers(s, lo, hi)) return true;
  }
  return false;
}

int Guard::Impl::ProtectRunsLocked(int i, uintptr_t a, uintptr_t b, int prot) {
  const uintptr_t page = PageSize();
  const bool unprotect = prot == (PROT_READ | PROT_WRITE);
  // Only this slot is live (the common case: one buffer in flight): no
  // other slot can keep a page, and 1 GiB adverts skip the page scan.
  const bool others = g_live.load(std::memory_order_relaxed) > 1;
  const auto kept = [&](uintptr_t p) {
    if (!others || (!unprotect && prot != PROT_READ)) return false;
    return LiveCoversLocked(p, p + page, i, /*read_only=*/!unprotect);
  };
  int err = 0;  // the first failure; the other runs are still changed
  uintptr_t run = a;
  for (uintptr_t p = a; p <= b; p += page) {
    if (p == b || kept(p)) {
      if (run < p && ::mprotect(reinterpret_cast<void*>(run), p - run, prot) != 0 && err == 0) {
        err = errno;
      }
      run = p + page;
    }
  }
  return err;
}

// The pages must be read-write and not executable, except pages a live
// range already protects (our own PROT_READ). Aliases: other mappings of
// the same file pages (shared mappings only; a private mapping's written
// pages are its own).
absl::Status Guard::Impl::CheckLocked(uintptr_t addr, size_t len, std::vector<Range>* ranges) {
  const uintptr_t end = addr + len;
  ranges->push_back({addr, end});
  for (int attempt = 0; attempt < 2; ++attempt) {
    bool need_reload = maps.empty() || maps_generation != MappingGeneration();
    if (!need_reload) {
      // A shared mapping's aliases may be newer than the cache.
      for (const Vma& v : maps) {
        if (v.start < end && addr < v.end && (v.shared || !v.write)) need_reload = true;
      }
    }
    if (need_reload && attempt == 0) LoadMapsLocked();
    ranges->resize(1);
    absl::Status bad;
    uintptr_t p = addr;
    while (p < end && bad.ok()) {
      const Vma* it = VmaAtLocked(p);
      if (it == nullptr) {
        bad = MakeError(absl::StatusCode::kFailedPrecondition, EFAULT,
                        absl::StrCat("AZ-SDP: address 0x", absl::Hex(p), " is not mapped"),
                        "sent synchronously instead");
        break;
      }
      const Vma& v = *it;
      const uintptr_t q = std::min(end, v.end);
      bool writable = v.read && !v.exec && (v.write || LiveCoversLocked(p, q, -1));
      if (!writable) {
        bad = MakeError(absl::StatusCode::kFailedPrecondition, EACCES,
                        "AZ-SDP: the buffer is not in ordinary read-write memory",
                        "sent synchronously instead");
        break;
      }
      if (v.shared && v.inode != 0) {
        const uint64_t f_lo = v.offset + (p - v.start), f_hi = f_lo + (q - p);
        for (const Vma& o : maps) {
          if (&o == &v || o.inode != v.inode || o.dev_major != v.dev_major ||
              o.dev_minor != v.dev_minor || !o.shared) {
            continue;
          }
          const uint64_t o_lo = o.offset, o_hi = o.offset + (o.end - o.start);
          const uint64_t lo = std::max(f_lo, o_lo), hi = std::min(f_hi, o_hi);
          if (lo >= hi) continue;
          if (ranges->size() >= kMaxRanges) {
            bad = MakeError(absl::StatusCode::kFailedPrecondition, ENOTSUP,
                            "AZ-SDP: the buffer is mapped more than 5 times",
                            "sent synchronously instead");
            break;
          }
          ranges->push_back({o.start + (lo - o_lo), o.start + (hi - o_lo)});
        }
      }
      p = q;
    }
    if (bad.ok()) return absl::OkStatus();
    if (attempt == 0 && !need_reload) {
      LoadMapsLocked();  // the cache may be stale
      continue;
    }
    return bad;
  }
  return absl::OkStatus();
}

namespace {
absl::Status WholePages(uintptr_t addr, size_t len) {
  const size_t page = PageSize();
  if (len == 0 || addr % page != 0 || len % page != 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     "AZ-SDP: protected ranges are whole pages", "internal error");
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<int> Guard::Protect(uintptr_t addr, size_t len, FaultClient* client,
                                   uint64_t cookie) {
  if (auto st = WholePages(addr, len); !st.ok()) return st;
  impl_->EnsureHandler();
  MutexLock lock(&impl_->mu);
  impl_->StartLocked();
  std::vector<Range> ranges;
  if (auto st = impl_->CheckLocked(addr, len, &ranges); !st.ok()) return st;
  return impl_->ProtectLocked(ranges, PROT_READ, client, cookie);
}

absl::StatusOr<int> Guard::ProtectNone(uintptr_t addr, size_t len, FaultClient* client,
                                       uint64_t cookie) {
  if (auto st = WholePages(addr, len); !st.ok()) return st;
  impl_->EnsureHandler();
  MutexLock lock(&impl_->mu);
  impl_->StartLocked();
  const uintptr_t end = addr + len;
  if (impl_->LiveCoversLocked(addr, end, -1)) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EBUSY,
                     "AZ-SDP: the receive buffer is still being sent", "received synchronously");
  }
  if (impl_->maps.empty() || impl_->maps_generation != MappingGeneration()) {
    impl_->LoadMapsLocked();
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    bool ok = true;
    for (uintptr_t p = addr; p < end && ok;) {
      const Vma* it = impl_->VmaAtLocked(p);
      if (it == nullptr) {
        ok = false;
        break;
      }
      ok = it->read && it->write && !it->exec && !it->shared && it->inode == 0;
      p = it->end;
    }
    if (ok) return impl_->ProtectLocked({{addr, end}}, PROT_NONE, client, cookie);
    if (attempt == 0) impl_->LoadMapsLocked();
  }
  return MakeError(absl::StatusCode::kFailedPrecondition, EACCES,
                   "AZ-SDP: the receive buffer is not private anonymous read-write memory",
                   "received synchronously");
}

absl::StatusOr<int> Guard::Impl::ProtectLocked(const std::vector<Range>& ranges, int prot,
                                               FaultClient* client, uint64_t cookie) {
  int i = 0;
  for (; i < kSlots; ++i) {
    if (g_slots[i].live.load(std::memory_order_relaxed) == 0) break;
  }
  if (i == kSlots) {
    return MakeError(absl::StatusCode::kResourceExhausted, ENOBUFS,
                     absl::StrCat("AZ-SDP: ", kSlots, " buffers are protected already"),
                     "sent synchronously instead");
  }
  Slot& s = g_slots[i];
  for (size_t k = 0; k < ranges.size(); ++k) {
    s.start[k].store(ranges[k].start, std::memory_order_relaxed);
    s.end[k].store(ranges[k].end, std::memory_order_relaxed);
  }
  s.nranges.store(static_cast<uint32_t>(ranges.size()), std::memory_order_release);
  s.client = client;
  s.cookie = cookie;
  s.fault.store(0, std::memory_order_relaxed);
  s.unreadable.store(prot == PROT_NONE ? 1 : 0, std::memory_order_relaxed);
  if (g_limit.load(std::memory_order_relaxed) < i + 1) g_limit.store(i + 1, std::memory_order_release);
  s.live.store(1, std::memory_order_release);
  g_live.fetch_add(1, std::memory_order_acq_rel);
  for (size_t k = 0; k < ranges.size(); ++k) {
    // A page another send already keeps read-only needs no mprotect (a
    // stream re-sending one buffer finds every page so while the previous
    // sends are pulled); release keeps such pages read-only for the other.
    if (int err = ProtectRunsLocked(i, ranges[k].start, ranges[k].end, prot); err != 0) {
      s.nranges.store(static_cast<uint32_t>(k + 1), std::memory_order_release);
      UnprotectLocked(i);
      return ErrnoError(err, "AZ-SDP: mprotect of the buffer failed",
                        "moved synchronously instead (raise vm.max_map_count if ENOMEM)");
    }
  }
  protects++;
  aliases += ranges.size() - 1;
  return i;
}

void Guard::Impl::UnprotectLocked(int i) {
  Slot& s = g_slots[i];
  if (s.live.load(std::memory_order_relaxed) == 0) return;
  const uint32_t n = std::min<uint32_t>(s.nranges.load(std::memory_order_relaxed), kMaxRanges);
  for (uint32_t k = 0; k < n; ++k) {
    // Pages another live range covers stay as that range needs them.
    ProtectRunsLocked(i, s.start[k].load(std::memory_order_relaxed),
                      s.end[k].load(std::memory_order_relaxed), PROT_READ | PROT_WRITE);
  }
  s.live.store(0, std::memory_order_release);
  s.client = nullptr;
  s.fault.store(0, std::memory_order_relaxed);
  s.seq.fetch_add(1, std::memory_order_acq_rel);
  g_live.fetch_sub(1, std::memory_order_acq_rel);
  FutexWakeAll(&s.seq);
}

void Guard::Release(int handle) {
  if (handle < 0 || handle >= kSlots) return;
  MutexLock lock(&impl_->mu);
  impl_->UnprotectLocked(handle);
}

bool Guard::Overlaps(const void* addr, size_t len) const {
  if (g_live.load(std::memory_order_acquire) == 0 || len == 0) return false;
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  return FindSlot(a, a + len) >= 0;
}

void Guard::WaitWritable(const void* addr, size_t len) { WaitFor(addr, len, false); }

void Guard::WaitReadable(const void* addr, size_t len) {
  if (g_live.load(std::memory_order_acquire) == 0 || len == 0) return;
  WaitFor(addr, len, true);
}

void Guard::WaitFor(const void* addr, size_t len, bool unreadable_only) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  for (;;) {
    int i = FindSlot(a, a + len, unreadable_only);
    if (i < 0) return;
    Slot& s = g_slots[i];
    uint32_t seq = s.seq.load(std::memory_order_acquire);
    if (s.live.load(std::memory_order_acquire) == 0 || !Covers(s, a, a + len)) continue;
    g_faults.fetch_add(1, std::memory_order_relaxed);
    s.fault.store(1, std::memory_order_release);
    WakeService();
    WaitRelease(s, seq);
  }
}

void Guard::RemoveClient(FaultClient* client) {
  MutexLock lock(&impl_->mu);
  const int limit = g_limit.load(std::memory_order_relaxed);
  for (int i = 0; i < limit; ++i) {
    if (g_slots[i].client == client) impl_->UnprotectLocked(i);
  }
  while (impl_->calling == client) impl_->cv.Wait(&impl_->mu);
}

GuardStats Guard::stats() const {
  MutexLock lock(&impl_->mu);
  GuardStats st;
  st.protects = impl_->protects;
  st.faults = g_faults.load(std::memory_order_relaxed);
  st.alias_ranges = impl_->aliases;
  st.live = static_cast<uint64_t>(g_live.load(std::memory_order_relaxed));
  return st;
}

}  // namespace zsock::sdp::az
