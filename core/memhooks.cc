// Memory-release interposers and the handler table (see memhooks.h).
//
// Hand-written: no Debian library offers memory-release interposition to
// other programs (UCX's ucm and libfabric's memhooks monitor do it only for
// their own registration caches, behind their own APIs), so zsock carries
// this small equivalent. The interposing definitions must be linked into the
// executable (core:memhooks is linkstatic + alwayslink) so that they come
// before libc and before a sanitizer runtime in symbol lookup; each then
// chains to the next definition found with dlsym(RTLD_NEXT), which is the
// ASan/TSan interceptor under a sanitizer and libc otherwise.
//
// Everything on the hook path is allocation-free: a fixed table of 64
// handler slots made of atomics, thread-local guards with the initial-exec
// TLS model, getenv() for ZSOCK_MEMHOOKS, and raw syscalls to read
// /proc/self/maps for shmdt.
//
// Besides the calls listed in memhooks.h, operator delete is interposed
// (sanitizers and malloc libraries define it without calling free), and, in
// ThreadSanitizer builds only, pthread_create (see t_thread_ready). Sanitizer runtimes call free while initializing
// themselves and their threads, so the code reached before a handler can
// run is compiled without sanitizer instrumentation.

#include "core/memhooks.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdlib>
#include <new>

#include "absl/base/config.h"

// The sanitizer allocator interface (<sanitizer/allocator_interface.h>),
// declared weak so that plain builds link without a sanitizer runtime. Under
// ASan/TSan, malloc_usable_size() reports an error for pointers the
// sanitizer's allocator does not own (e.g. blocks from its early dlsym
// allocator); these let the interposer ask first.
extern "C" int __sanitizer_get_ownership(const volatile void* p)
    __attribute__((weak));
extern "C" size_t __sanitizer_get_allocated_size(const volatile void* p)
    __attribute__((weak));
// The sanitizer runtimes' own names for their interceptors (`free` in
// libasan/libtsan is a weak alias of these). They are what dlsym(RTLD_NEXT)
// returns under a sanitizer; naming them directly lets free/realloc work
// while the runtime initializes itself, when calling dlsym is unsafe: the
// runtime is itself inside dlsym, whose error-string cleanup is what calls
// free, and a nested dlsym would free that string a second time.
extern "C" void __interceptor_free(void* p) __attribute__((weak));
extern "C" void* __interceptor_realloc(void* p, size_t n) __attribute__((weak));

// Code that may run before a sanitizer runtime has initialized (it calls
// free while setting itself up) must not be instrumented.
#define ZSOCK_NO_SANITIZE \
  __attribute__((no_sanitize("address", "thread", "undefined")))

namespace zsock {
namespace {

#define ZSOCK_TLS thread_local __attribute__((tls_model("initial-exec")))

constexpr int kMaxHandlers = 64;

enum SlotState : int { kSlotFree = 0, kSlotBusy = 1, kSlotReady = 2 };

struct Slot {
  std::atomic<int> state{kSlotFree};
  std::atomic<MemoryReleaseHandler> fn{nullptr};
  std::atomic<void*> arg{nullptr};
  // Dispatches currently inside (or about to enter) this slot's handler;
  // RemoveMemoryReleaseHandler waits for it to drain.
  std::atomic<int> active{0};
};

// Constant-initialized: usable by interposers called before static
// constructors run.
Slot g_slots[kMaxHandlers];
// Number of installed handlers: the fast path is one relaxed load of this.
std::atomic<int> g_installed{0};
std::atomic<MemoryReleaseHandler> g_gate{nullptr};
std::atomic<uint64_t> g_map_generation{0};
std::atomic<void*> g_gate_arg{nullptr};
// One past the highest slot index ever used.
std::atomic<int> g_slot_limit{0};
// ZSOCK_MEMHOOKS: -1 not read yet, 0 off, 1 on.
std::atomic<int> g_env_state{-1};
// Whether this object's free() is the one the process uses: -1 unknown.
std::atomic<int> g_in_effect{-1};

// > 0 while this thread must not report (inside a handler, or a
// ScopedMemoryHookBypass).
ZSOCK_TLS int t_bypass = 0;
ZSOCK_TLS bool t_heap_block = false;  // see ReleaseIsHeapBlock
// True while this thread is inside dlsym() resolving a real function.
ZSOCK_TLS bool t_resolving = false;
// Slot whose handler this thread is running, or -1.
ZSOCK_TLS int t_running_slot = -1;
// TSan builds only: whether this thread may run instrumented code
// (handlers). TSan's thread start-up calls free (pthread_getattr_np) before
// the thread's TSan state exists, and its teardown after it is gone; an
// instrumented handler crashes there. Set on the main thread from
// .preinit_array and on other threads by the pthread_create wrapper below,
// around the start routine and the thread's C++ thread_local destructors.
ZSOCK_TLS bool t_thread_ready = false;

// The next definitions (libc or a sanitizer interceptor). Accessed with
// __atomic builtins rather than std::atomic<void*>, whose member functions
// are not always inlined at -O0 and would be instrumented calls.
void* g_real_free = nullptr;
void* g_real_realloc = nullptr;
void* g_real_munmap = nullptr;
void* g_real_mremap = nullptr;
void* g_real_madvise = nullptr;
void* g_real_shmdt = nullptr;
#ifdef ABSL_HAVE_THREAD_SANITIZER
void* g_real_pthread_create = nullptr;
#endif

// operator delete and its variants, by mangled name.
enum DeleteKind {
  kDelete,                    // operator delete(void*)
  kDeleteArray,               // operator delete[](void*)
  kDeleteSized,               // operator delete(void*, size_t)
  kDeleteArraySized,          // operator delete[](void*, size_t)
  kDeleteAligned,             // operator delete(void*, align_val_t)
  kDeleteArrayAligned,        // operator delete[](void*, align_val_t)
  kDeleteSizedAligned,        // operator delete(void*, size_t, align_val_t)
  kDeleteArraySizedAligned,   // operator delete[](void*, size_t, align_val_t)
  kDeleteNothrow,             // operator delete(void*, nothrow_t)
  kDeleteArrayNothrow,        // operator delete[](void*, nothrow_t)
  kDeleteAlignedNothrow,      // operator delete(void*, align_val_t, nothrow_t)
  kDeleteArrayAlignedNothrow, // operator delete[](void*, align_val_t, nothrow_t)
  kNumDeleteKinds,
};
constexpr const char* kDeleteNames[kNumDeleteKinds] = {
    "_ZdlPv",
    "_ZdaPv",
    "_ZdlPvm",
    "_ZdaPvm",
    "_ZdlPvSt11align_val_t",
    "_ZdaPvSt11align_val_t",
    "_ZdlPvmSt11align_val_t",
    "_ZdaPvmSt11align_val_t",
    "_ZdlPvRKSt9nothrow_t",
    "_ZdaPvRKSt9nothrow_t",
    "_ZdlPvSt11align_val_tRKSt9nothrow_t",
    "_ZdaPvSt11align_val_tRKSt9nothrow_t",
};
void* g_real_delete[kNumDeleteKinds] = {};

// Returns the next definition of `name` (`bootstrap` until it is known, if
// given), or nullptr while this thread is already resolving one (dlsym may
// call calloc/free itself) or if dlsym fails.
ZSOCK_NO_SANITIZE void* ResolveNext(void** cache, const char* name,
                                    void* bootstrap = nullptr) {
  void* fn = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
  if (fn != nullptr) return fn;
  if (bootstrap != nullptr) return bootstrap;
  if (t_resolving) return nullptr;
  t_resolving = true;
  fn = dlsym(RTLD_NEXT, name);
  t_resolving = false;
  if (fn != nullptr) __atomic_store_n(cache, fn, __ATOMIC_RELEASE);
  return fn;
}

// Resolves everything once, as early as possible, so that dlsym normally
// never runs inside an interposer: from the executable's .preinit_array
// (memhooks_preinit.cc, before any shared library's initializer) when the
// hooks are linked into the executable, or from this constructor when they
// are in libzsock.so.1 (a shared object has no .preinit_array; the
// libraries initialized before it resolve lazily, see free()).
ZSOCK_NO_SANITIZE void ResolveAllNext(int, char**, char**) {
  static bool done = false;  // the main thread only: preinit, then constructor
  if (done) return;
  done = true;
  t_thread_ready = true;  // the main thread
  ResolveNext(&g_real_free, "free");
  ResolveNext(&g_real_realloc, "realloc");
  ResolveNext(&g_real_munmap, "munmap");
  ResolveNext(&g_real_mremap, "mremap");
  ResolveNext(&g_real_madvise, "madvise");
  ResolveNext(&g_real_shmdt, "shmdt");
#ifdef ABSL_HAVE_THREAD_SANITIZER
  ResolveNext(&g_real_pthread_create, "pthread_create");
#endif
  for (int i = 0; i < kNumDeleteKinds; ++i) {
    ResolveNext(&g_real_delete[i], kDeleteNames[i]);
  }
}

__attribute__((constructor(101))) ZSOCK_NO_SANITIZE void ResolveAllNextAtLoad() {
  ResolveAllNext(0, nullptr, nullptr);
}

}  // namespace

// For memhooks_preinit.cc.
extern void (*const kMemhooksResolveAll)(int, char**, char**);
void (*const kMemhooksResolveAll)(int, char**, char**) = &ResolveAllNext;

namespace {

bool EnvEnabled() {
  int state = g_env_state.load(std::memory_order_relaxed);
  if (state >= 0) return state == 1;
  // getenv does not allocate. Only reached once a handler is installed, i.e.
  // after libc initialized the environment.
  const char* v = std::getenv("ZSOCK_MEMHOOKS");
  bool off = false;
  if (v != nullptr) {
    auto eq = [v](const char* word) {
      const char* p = v;
      for (; *p != '\0' && *word != '\0'; ++p, ++word) {
        char c = *p;
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
        if (c != *word) return false;
      }
      return *p == '\0' && *word == '\0';
    };
    off = eq("off") || eq("0") || eq("false") || eq("no");
  }
  state = off ? 0 : 1;
  g_env_state.store(state, std::memory_order_relaxed);
  return state == 1;
}

// Whether an interposer should report: the fast path is the first load.
ZSOCK_NO_SANITIZE inline bool ShouldReport() {
  if (g_installed.load(std::memory_order_relaxed) == 0) return false;
  if (t_bypass != 0) return false;
#ifdef ABSL_HAVE_THREAD_SANITIZER
  if (!t_thread_ready) return false;
#endif
  return EnvEnabled();
}

#ifdef ABSL_HAVE_THREAD_SANITIZER
// ---- TSan builds only: marking threads ready (see t_thread_ready) ----

struct ThreadStart {
  void* (*fn)(void*);
  void* arg;
};

// Destroyed after the thread's other thread_local objects (it is
// constructed first), while TSan's per-thread state still exists.
struct ThreadReadyMark {
  ThreadReadyMark() { t_thread_ready = true; }
  ~ThreadReadyMark() { t_thread_ready = false; }
};

void* StartThreadReady(void* p) {
  ThreadStart start = *static_cast<ThreadStart*>(p);
  static thread_local ThreadReadyMark mark;
  (void)mark;  // odr-use: constructs it
  std::free(p);
  return start.fn(start.arg);
}
#endif  // ABSL_HAVE_THREAD_SANITIZER

void Dispatch(uintptr_t addr, size_t len) {
  ++t_bypass;  // handlers' own releases are not reported (no recursion)
  if (MemoryReleaseHandler gate = g_gate.load(std::memory_order_acquire)) {
    gate(g_gate_arg.load(std::memory_order_acquire), addr, len);
  }
  const int limit = g_slot_limit.load(std::memory_order_acquire);
  for (int i = 0; i < limit; ++i) {
    Slot& slot = g_slots[i];
    if (slot.fn.load(std::memory_order_relaxed) == nullptr) continue;
    // Dekker-style with RemoveMemoryReleaseHandler: announce, then re-check.
    slot.active.fetch_add(1, std::memory_order_seq_cst);
    MemoryReleaseHandler fn = slot.fn.load(std::memory_order_seq_cst);
    if (fn != nullptr) {
      void* arg = slot.arg.load(std::memory_order_acquire);
      const int outer = t_running_slot;
      t_running_slot = i;
      fn(arg, addr, len);
      t_running_slot = outer;
    }
    slot.active.fetch_sub(1, std::memory_order_release);
  }
  --t_bypass;
}

// A heap block's release (free, delete, realloc): see ReleaseIsHeapBlock.
void DispatchHeapBlock(uintptr_t addr, size_t len) {
  t_heap_block = true;
  Dispatch(addr, len);
  t_heap_block = false;
}

// Extent of a malloc'd block; at least 1 so the start address is reported.
size_t BlockSize(void* ptr) {
  size_t n;
  if (&__sanitizer_get_ownership != nullptr &&
      &__sanitizer_get_allocated_size != nullptr) {
    if (__sanitizer_get_ownership(ptr) == 0) return 1;
    n = __sanitizer_get_allocated_size(ptr);
  } else {
    n = malloc_usable_size(ptr);
  }
  return n == 0 ? 1 : n;
}

// Body of every operator delete interposer: report, then chain to the next
// definition (libstdc++'s, a sanitizer's, or a malloc library's) with
// reporting bypassed, since libstdc++'s calls free.
template <typename... Args>
ZSOCK_NO_SANITIZE void DeleteHook(DeleteKind kind, void* ptr, Args... args) {
  if (ptr == nullptr || t_resolving) return;  // t_resolving: see free()
  if (ShouldReport()) DispatchHeapBlock(reinterpret_cast<uintptr_t>(ptr), BlockSize(ptr));
  auto real = reinterpret_cast<void (*)(void*, Args...)>(
      ResolveNext(&g_real_delete[kind], kDeleteNames[kind]));
  if (real == nullptr) return;  // leak: no deallocator to return it to
  ++t_bypass;
  real(ptr, args...);
  --t_bypass;
}

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// Parses "start-end perms offset dev inode ..." (one /proc/self/maps line).
bool ParseMapsLine(const char* s, uintptr_t* start, uintptr_t* end,
                   unsigned long* inode) {
  auto hex = [&s](uintptr_t* out) {
    uintptr_t v = 0;
    const char* begin = s;
    for (;; ++s) {
      char c = *s;
      int d;
      if (c >= '0' && c <= '9') d = c - '0';
      else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      else break;
      v = v * 16 + static_cast<uintptr_t>(d);
    }
    *out = v;
    return s != begin;
  };
  auto skip_field = [&s]() {
    while (*s == ' ') ++s;
    while (*s != ' ' && *s != '\0') ++s;
  };
  if (!hex(start) || *s != '-') return false;
  ++s;
  if (!hex(end)) return false;
  skip_field();  // perms
  skip_field();  // offset
  skip_field();  // dev
  while (*s == ' ') ++s;
  unsigned long v = 0;
  for (; *s >= '0' && *s <= '9'; ++s) v = v * 10 + static_cast<unsigned long>(*s - '0');
  *inode = v;
  return true;
}

// Size of the SysV segment attached at `addr`: the run of /proc/self/maps
// entries that starts at `addr` and continues contiguously with the same
// inode. Uses raw syscalls and stack buffers only (no allocation, no
// sanitizer interceptors). Falls back to one page when the maps file cannot
// be read or has no entry starting at `addr`.
size_t ShmSegmentSize(const void* addr) {
  const uintptr_t want = reinterpret_cast<uintptr_t>(addr);
  const int fd = static_cast<int>(
      syscall(SYS_openat, AT_FDCWD, "/proc/self/maps", O_RDONLY | O_CLOEXEC));
  if (fd < 0) return PageSize();
  char buf[2048];
  char line[160];  // the fields we need fit; longer lines are truncated
  size_t line_len = 0;
  bool found = false;
  bool done = false;
  uintptr_t seg_end = 0;
  unsigned long seg_inode = 0;
  while (!done) {
    const long n = syscall(SYS_read, fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (long i = 0; i < n && !done; ++i) {
      if (buf[i] != '\n') {
        if (line_len < sizeof(line) - 1) line[line_len++] = buf[i];
        continue;
      }
      line[line_len] = '\0';
      line_len = 0;
      uintptr_t start, end;
      unsigned long inode;
      if (!ParseMapsLine(line, &start, &end, &inode)) continue;
      if (!found) {
        if (start == want) {
          found = true;
          seg_end = end;
          seg_inode = inode;
        } else if (start > want) {
          done = true;  // maps are sorted by address
        }
      } else if (start == seg_end && inode == seg_inode && inode != 0) {
        seg_end = end;
      } else {
        done = true;
      }
    }
  }
  syscall(SYS_close, fd);
  return found ? seg_end - want : PageSize();
}

// Identifies this object for MemoryHooksActive().
void AnchorFunction() {}

bool InterposersInEffect() {
  int state = g_in_effect.load(std::memory_order_acquire);
  if (state >= 0) return state == 1;
  // The first definition of free in global lookup order must be ours (it is
  // not if this code sits in a shared library loaded after libc or after a
  // sanitizer runtime).
  void* effective = dlsym(RTLD_DEFAULT, "free");
  Dl_info effective_info{}, our_info{};
  bool ours = effective != nullptr && dladdr(effective, &effective_info) != 0 &&
              dladdr(reinterpret_cast<void*>(&AnchorFunction), &our_info) != 0 &&
              effective_info.dli_fbase == our_info.dli_fbase;
  g_in_effect.store(ours ? 1 : 0, std::memory_order_release);
  return ours;
}

// In a child after fork() the parent's handlers must not run: their caches
// belong to the parent, and their revocations would write to key tables the
// child shares with the parent (MAP_SHARED), revoking the parent's keys.
// Only the forking thread exists in the child, so plain stores suffice.
void ForgetHandlersInChild() {
  for (Slot& slot : g_slots) {
    slot.fn.store(nullptr, std::memory_order_relaxed);
    slot.arg.store(nullptr, std::memory_order_relaxed);
    slot.active.store(0, std::memory_order_relaxed);
    slot.state.store(kSlotFree, std::memory_order_relaxed);
  }
  g_gate.store(nullptr, std::memory_order_relaxed);
  g_installed.store(0, std::memory_order_seq_cst);
}

std::atomic<bool> g_atfork_registered{false};

}  // namespace

int AddMemoryReleaseHandler(MemoryReleaseHandler fn, void* arg) {
  if (fn == nullptr) return -1;
  if (!g_atfork_registered.exchange(true)) {
    pthread_atfork(nullptr, nullptr, ForgetHandlersInChild);
  }
  for (int i = 0; i < kMaxHandlers; ++i) {
    Slot& slot = g_slots[i];
    int expected = kSlotFree;
    if (!slot.state.compare_exchange_strong(expected, kSlotBusy,
                                            std::memory_order_acq_rel)) {
      continue;
    }
    slot.arg.store(arg, std::memory_order_relaxed);
    slot.fn.store(fn, std::memory_order_seq_cst);  // publishes arg
    int limit = g_slot_limit.load(std::memory_order_relaxed);
    while (limit < i + 1 &&
           !g_slot_limit.compare_exchange_weak(limit, i + 1,
                                               std::memory_order_acq_rel)) {
    }
    slot.state.store(kSlotReady, std::memory_order_release);
    g_installed.fetch_add(1, std::memory_order_seq_cst);
    return i;
  }
  return -1;
}

void RemoveMemoryReleaseHandler(int id) {
  if (id < 0 || id >= kMaxHandlers) return;
  Slot& slot = g_slots[id];
  int expected = kSlotReady;
  if (!slot.state.compare_exchange_strong(expected, kSlotBusy,
                                          std::memory_order_acq_rel)) {
    return;  // not installed
  }
  slot.fn.store(nullptr, std::memory_order_seq_cst);
  // Wait until no other thread is inside this handler, so the caller may
  // destroy `arg` when we return. A handler removing itself does not wait
  // for its own call. The wait is a yield loop: handler calls are short.
  const int own = (t_running_slot == id) ? 1 : 0;
  while (slot.active.load(std::memory_order_seq_cst) > own) sched_yield();
  slot.arg.store(nullptr, std::memory_order_relaxed);
  g_installed.fetch_sub(1, std::memory_order_seq_cst);
  slot.state.store(kSlotFree, std::memory_order_release);
}

void SetMemoryReleaseGate(MemoryReleaseHandler fn, void* arg) {
  if (!g_atfork_registered.exchange(true)) {
    pthread_atfork(nullptr, nullptr, ForgetHandlersInChild);
  }
  g_gate_arg.store(arg, std::memory_order_release);
  MemoryReleaseHandler old = g_gate.exchange(fn, std::memory_order_acq_rel);
  if (old == nullptr && fn != nullptr) g_installed.fetch_add(1, std::memory_order_seq_cst);
  if (old != nullptr && fn == nullptr) g_installed.fetch_sub(1, std::memory_order_seq_cst);
}

uint64_t MappingGeneration() { return g_map_generation.load(std::memory_order_acquire); }

bool MemoryHooksActive() { return EnvEnabled() && InterposersInEffect(); }

bool ReleaseIsHeapBlock() { return t_heap_block; }

void NotifyMemoryReleased(const void* addr, size_t len) {
  if (len == 0 || g_installed.load(std::memory_order_relaxed) == 0 ||
      t_bypass != 0) {
    return;
  }
  Dispatch(reinterpret_cast<uintptr_t>(addr), len);
}

ScopedMemoryHookBypass::ScopedMemoryHookBypass() { ++t_bypass; }
ScopedMemoryHookBypass::~ScopedMemoryHookBypass() { --t_bypass; }

}  // namespace zsock

// ---- the interposers ----

using zsock::BlockSize;
using zsock::Dispatch;
using zsock::DispatchHeapBlock;
using zsock::ResolveNext;
using zsock::ShouldReport;

extern "C" {

ZSOCK_NO_SANITIZE void free(void* ptr) noexcept {
  if (ptr == nullptr) return;
  // Bootstrap: dlsym may free while we resolve the real free on this thread.
  // We cannot tell which allocator that block came from, so it is leaked
  // (a few bytes, at most once per thread, and normally never: everything
  // is resolved from .preinit_array, and under a sanitizer the runtime's
  // free is known without dlsym).
  if (zsock::t_resolving) return;
  if (ShouldReport()) DispatchHeapBlock(reinterpret_cast<uintptr_t>(ptr), BlockSize(ptr));
  auto real = reinterpret_cast<void (*)(void*)>(
      ResolveNext(&zsock::g_real_free, "free",
                  reinterpret_cast<void*>(&__interceptor_free)));
  if (real != nullptr) real(ptr);  // else leak: no allocator to return it to
}

ZSOCK_NO_SANITIZE void* realloc(void* ptr, size_t size) noexcept {
  if (zsock::t_resolving) {  // see free(); dlsym is not known to realloc
    errno = ENOMEM;
    return nullptr;
  }
  // The block may move or shrink: report the old extent (a block that stays
  // in place only costs the caches a re-registration).
  if (ptr != nullptr && ShouldReport()) {
    DispatchHeapBlock(reinterpret_cast<uintptr_t>(ptr), BlockSize(ptr));
  }
  auto real = reinterpret_cast<void* (*)(void*, size_t)>(
      ResolveNext(&zsock::g_real_realloc, "realloc",
                  reinterpret_cast<void*>(&__interceptor_realloc)));
  if (real == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  return real(ptr, size);
}

// Sanitizer runtimes intercept reallocarray without going through realloc,
// so it is defined here over our realloc (as glibc defines it): one report.
ZSOCK_NO_SANITIZE void* reallocarray(void* ptr, size_t nmemb,
                                     size_t size) noexcept {
  size_t bytes;
  if (__builtin_mul_overflow(nmemb, size, &bytes)) {
    errno = ENOMEM;
    return nullptr;
  }
  return realloc(ptr, bytes);
}

ZSOCK_NO_SANITIZE int munmap(void* addr, size_t len) noexcept {
  if (ShouldReport() && len != 0) Dispatch(reinterpret_cast<uintptr_t>(addr), len);
  auto real = reinterpret_cast<int (*)(void*, size_t)>(
      ResolveNext(&zsock::g_real_munmap, "munmap"));
  int rc = real != nullptr ? real(addr, len)
                           : static_cast<int>(syscall(SYS_munmap, addr, len));
  zsock::g_map_generation.fetch_add(1, std::memory_order_release);
  return rc;
}

ZSOCK_NO_SANITIZE void* mremap(void* old_address, size_t old_size,
                                size_t new_size, int flags, ...) noexcept {
  void* new_address = nullptr;
  if ((flags & MREMAP_FIXED) != 0) {
    va_list ap;
    va_start(ap, flags);
    new_address = va_arg(ap, void*);
    va_end(ap);
  }
  if (ShouldReport()) {
    // The old range may move or shrink; a fixed target is replaced.
    if (old_size != 0) Dispatch(reinterpret_cast<uintptr_t>(old_address), old_size);
    if ((flags & MREMAP_FIXED) != 0 && new_size != 0) {
      Dispatch(reinterpret_cast<uintptr_t>(new_address), new_size);
    }
  }
  auto real = reinterpret_cast<void* (*)(void*, size_t, size_t, int, ...)>(
      ResolveNext(&zsock::g_real_mremap, "mremap"));
  void* rc = real != nullptr
                 ? real(old_address, old_size, new_size, flags, new_address)
                 : reinterpret_cast<void*>(syscall(SYS_mremap, old_address, old_size,
                                                   new_size, flags, new_address));
  zsock::g_map_generation.fetch_add(1, std::memory_order_release);
  return rc;
}

ZSOCK_NO_SANITIZE int madvise(void* addr, size_t len, int advice) noexcept {
  bool releases = advice == MADV_DONTNEED || advice == MADV_FREE ||
                  advice == MADV_REMOVE;
#ifdef MADV_DONTNEED_LOCKED
  releases = releases || advice == MADV_DONTNEED_LOCKED;
#endif
  if (releases && len != 0 && ShouldReport()) {
    Dispatch(reinterpret_cast<uintptr_t>(addr), len);
  }
  auto real = reinterpret_cast<int (*)(void*, size_t, int)>(
      ResolveNext(&zsock::g_real_madvise, "madvise"));
  if (real != nullptr) return real(addr, len, advice);
  return static_cast<int>(syscall(SYS_madvise, addr, len, advice));
}

ZSOCK_NO_SANITIZE int shmdt(const void* addr) noexcept {
  if (ShouldReport()) {
    Dispatch(reinterpret_cast<uintptr_t>(addr), zsock::ShmSegmentSize(addr));
  }
  auto real = reinterpret_cast<int (*)(const void*)>(
      ResolveNext(&zsock::g_real_shmdt, "shmdt"));
  int rc = real != nullptr ? real(addr) : static_cast<int>(syscall(SYS_shmdt, addr));
  zsock::g_map_generation.fetch_add(1, std::memory_order_release);
  return rc;
}

#ifdef ABSL_HAVE_THREAD_SANITIZER
// TSan builds only: marks the new thread ready (see t_thread_ready).
int pthread_create(pthread_t* thread, const pthread_attr_t* attr,
                   void* (*start_routine)(void*), void* arg) {
  using Fn = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  auto real = reinterpret_cast<Fn>(
      ResolveNext(&zsock::g_real_pthread_create, "pthread_create"));
  if (real == nullptr) return EAGAIN;
  auto* start =
      static_cast<zsock::ThreadStart*>(std::malloc(sizeof(zsock::ThreadStart)));
  if (start == nullptr) return EAGAIN;
  start->fn = start_routine;
  start->arg = arg;
  const int rc = real(thread, attr, &zsock::StartThreadReady, start);
  if (rc != 0) std::free(start);
  return rc;
}
#endif  // ABSL_HAVE_THREAD_SANITIZER

}  // extern "C"

// ---- C++ deallocation ----
// Sanitizer runtimes (and malloc libraries such as tcmalloc) define
// operator delete without going through free, so it is interposed too.

using zsock::DeleteHook;

ZSOCK_NO_SANITIZE void operator delete(void* p) noexcept {
  DeleteHook(zsock::kDelete, p);
}
ZSOCK_NO_SANITIZE void operator delete[](void* p) noexcept {
  DeleteHook(zsock::kDeleteArray, p);
}
ZSOCK_NO_SANITIZE void operator delete(void* p, std::size_t n) noexcept {
  DeleteHook(zsock::kDeleteSized, p, n);
}
ZSOCK_NO_SANITIZE void operator delete[](void* p, std::size_t n) noexcept {
  DeleteHook(zsock::kDeleteArraySized, p, n);
}
ZSOCK_NO_SANITIZE void operator delete(void* p, std::align_val_t a) noexcept {
  DeleteHook(zsock::kDeleteAligned, p, a);
}
ZSOCK_NO_SANITIZE void operator delete[](void* p, std::align_val_t a) noexcept {
  DeleteHook(zsock::kDeleteArrayAligned, p, a);
}
ZSOCK_NO_SANITIZE void operator delete(void* p, std::size_t n,
                                       std::align_val_t a) noexcept {
  DeleteHook(zsock::kDeleteSizedAligned, p, n, a);
}
ZSOCK_NO_SANITIZE void operator delete[](void* p, std::size_t n,
                                         std::align_val_t a) noexcept {
  DeleteHook(zsock::kDeleteArraySizedAligned, p, n, a);
}
ZSOCK_NO_SANITIZE void operator delete(void* p, const std::nothrow_t& t) noexcept {
  DeleteHook<const std::nothrow_t&>(zsock::kDeleteNothrow, p, t);
}
ZSOCK_NO_SANITIZE void operator delete[](void* p,
                                         const std::nothrow_t& t) noexcept {
  DeleteHook<const std::nothrow_t&>(zsock::kDeleteArrayNothrow, p, t);
}
ZSOCK_NO_SANITIZE void operator delete(void* p, std::align_val_t a,
                                       const std::nothrow_t& t) noexcept {
  DeleteHook<std::align_val_t, const std::nothrow_t&>(
      zsock::kDeleteAlignedNothrow, p, a, t);
}
ZSOCK_NO_SANITIZE void operator delete[](void* p, std::align_val_t a,
                                         const std::nothrow_t& t) noexcept {
  DeleteHook<std::align_val_t, const std::nothrow_t&>(
      zsock::kDeleteArrayAlignedNothrow, p, a, t);
}
