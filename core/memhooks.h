// Memory-release hooks: tell zsock when memory goes away.
//
// Registered memory must not outlive its mapping: a peer holding a remote key
// to freed or unmapped memory must be refused, and a cached registration
// must not be reused for a new mapping at the same address. Linux offers no
// cheap notification for this, so zsock interposes the calls that release
// memory, as UCX's ucm does: free, realloc (when it moves), reallocarray,
// operator delete, munmap, mremap, madvise(MADV_DONTNEED/MADV_FREE/
// MADV_REMOVE) and shmdt. Each interposer
// reports the released range to the registered handlers *before* the memory
// is released, then chains to the next definition (libc, or a sanitizer's
// interceptor) via dlsym(RTLD_NEXT).
//
// The fast path costs one relaxed atomic load while no handler is installed.
// Handlers run in the releasing thread, must not allocate, and must tolerate
// being called for ranges they do not cover. Set ZSOCK_MEMHOOKS=off to
// disable the interposers (then callers must call
// RegistrationCache::Invalidate themselves before releasing memory).
//
// The interposers must come before libc in the process's symbol lookup
// order: linked into the executable (core:memhooks is linkstatic and
// alwayslink), or in libzsock.so.1 when the executable links it (its
// DT_NEEDED entries precede libc's). A libzsock loaded by dlopen() is not in
// effect (MemoryHooksActive() is false). Not reported: memory released by libc
// internally without going through these symbols (e.g. a malloc arena
// trimmed by brk/madvise, only ever pages whose blocks were already
// reported free), mmap(MAP_FIXED) or shmat(SHM_REMAP) over existing memory,
// and raw syscalls. Under ThreadSanitizer, releases on threads not created
// through pthread_create, and those made during a thread's start-up or
// after its thread_local destructors, are not reported either.
#ifndef ZSOCK_CORE_MEMHOOKS_H_
#define ZSOCK_CORE_MEMHOOKS_H_

#include <cstddef>
#include <cstdint>

namespace zsock {

using MemoryReleaseHandler = void (*)(void* arg, uintptr_t addr, size_t len);

// Installs a handler; returns its id (>= 0), or -1 when the table is full
// (64 handlers).
int AddMemoryReleaseHandler(MemoryReleaseHandler fn, void* arg);
// Uninstalls it and waits until no other thread is running it, so `arg` may
// be destroyed afterwards. Must not be called while holding a lock the
// handler takes.
void RemoveMemoryReleaseHandler(int id);

// Installs the release gate (one per process; nullptr removes it): it runs
// before every handler, in the releasing thread, and may block. AZ-SDP's
// guard uses it to make free/munmap of a buffer that is still being sent
// wait for the transfer (before the registration cache revokes its key).
// Like handlers, it must not allocate.
void SetMemoryReleaseGate(MemoryReleaseHandler fn, void* arg);

// Counts munmap/mremap/shmdt calls through the interposers (whether or not
// handlers are installed): a cache of /proc/self/maps taken at generation G
// is stale once this differs (AZ-SDP's guard). Not counted: new mappings
// (they appear at addresses a cache does not hold) and mprotect.
uint64_t MappingGeneration();

// Whether the interposers are active in this process (they are unless
// ZSOCK_MEMHOOKS=off, or the binary was linked without them).
bool MemoryHooksActive();

// True while handlers run for a free/delete/realloc of a heap block. Such a
// release returns to the system at most the whole pages inside the block: a
// page the block shares with other live blocks stays mapped (and its
// registration valid). A registration cache that revoked everything
// overlapping the block revoked live buffers whenever a small neighbour in
// their first or last page was freed.
bool ReleaseIsHeapBlock();

// Reports a release to all handlers (what the interposers call). Explicit
// calls are delivered even with ZSOCK_MEMHOOKS=off, but not from inside a
// handler or a ScopedMemoryHookBypass; empty ranges are ignored.
void NotifyMemoryReleased(const void* addr, size_t len);

// While alive, releases by this thread are not reported (used by zsock's own
// code paths that free memory while holding cache locks).
class ScopedMemoryHookBypass {
 public:
  ScopedMemoryHookBypass();
  ~ScopedMemoryHookBypass();
  ScopedMemoryHookBypass(const ScopedMemoryHookBypass&) = delete;
  ScopedMemoryHookBypass& operator=(const ScopedMemoryHookBypass&) = delete;
};

}  // namespace zsock

#endif  // ZSOCK_CORE_MEMHOOKS_H_
