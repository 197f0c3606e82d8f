// AZ-SDP's buffer guard (docs/azsdp.md): write-protects the pages of user
// buffers whose transfer is still in flight, and resolves the faults of
// threads that touch them.
//
// The guard is process-wide (a signal handler is). Protect() makes whole
// pages read-only (PROT_READ: the peer, or the provider on its behalf, still
// reads them) together with every other mapping of the same pages (a memfd
// or shared file mapped twice, an mremap alias). A thread that writes there
// takes SIGSEGV; the handler, which is async-signal-safe (it reads a fixed
// table of atomics, writes an eventfd and sleeps on a futex), checks that the
// address is in a range it protected, wakes the guard's service thread and
// sleeps until the range is released; the access then re-executes. The
// service thread calls the range's FaultClient (the SDP engine), which either
// copies the data aside (copy-on-write) or waits for the transfer
// (block-on-write); both end in Release(), which restores write access on
// pages no other range covers.
//
// Faults that are not the guard's go to the handler installed before it
// (SA_SIGINFO or not), or get the default action. If the application
// installs its own SIGSEGV handler later, the next Protect() notices, keeps
// that handler as the one to chain to and reinstalls the guard's.
//
// free/realloc/munmap/mremap/madvise of protected memory wait for its
// transfers (a core memory-release gate). After fork() the child starts with
// nothing protected (its copies of the pages are writable again); the parent
// is unaffected. Kernel accesses to protected pages (read(2) into them) fail
// with EFAULT rather than fault: zsock's own receive paths call
// WaitWritable() first.
#ifndef ZSOCK_CORE_SDP_AZ_GUARD_H_
#define ZSOCK_CORE_SDP_AZ_GUARD_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace zsock::sdp::az {

class FaultClient {
 public:
  virtual ~FaultClient() = default;
  // On the service thread, no guard lock held, after a thread touched the
  // range protected with `cookie`. Must lead to Release() of that range
  // (possibly later, from another thread). May block.
  virtual void OnFault(uint64_t cookie) = 0;
};

struct GuardStats {
  uint64_t protects = 0;     // ranges protected
  uint64_t faults = 0;       // faults (and WaitWritable calls) on them
  uint64_t alias_ranges = 0; // extra mappings protected with them
  uint64_t live = 0;         // ranges protected now
};

// Page size, and the page-aligned middle [first, last) of [p, p+n).
size_t PageSize();

class Guard {
 public:
  static Guard& Get();

  // Write-protects the pages [addr, addr + len) (both page-aligned) and
  // their aliases. FailedPrecondition when they are not all private or
  // shared read-write, non-executable memory (the caller sends without
  // protection then); ResourceExhausted when too many ranges are protected.
  absl::StatusOr<int> Protect(uintptr_t addr, size_t len, FaultClient* client,
                              uint64_t cookie);
  // Receive side: makes the pages [addr, addr + len) inaccessible
  // (PROT_NONE) until Release; any access waits. Only private anonymous
  // read-write memory that no range covers (FailedPrecondition otherwise).
  absl::StatusOr<int> ProtectNone(uintptr_t addr, size_t len, FaultClient* client,
                                  uint64_t cookie);
  // Restores write access where no other protected range needs it and wakes
  // the threads waiting on this range. Idempotent per handle use.
  void Release(int handle);
  // True if [addr, addr + len) overlaps a protected page.
  bool Overlaps(const void* addr, size_t len) const;
  // Blocks until [addr, addr + len) overlaps no protected page, asking the
  // clients to resolve. Not from a signal handler; no engine lock held.
  void WaitWritable(const void* addr, size_t len);
  // Blocks until [addr, addr + len) overlaps no page made unreadable by
  // ProtectNone (a receive in flight); cheap when nothing is protected.
  void WaitReadable(const void* addr, size_t len);
  // Waits until the service thread is not calling `client` and drops its
  // pending faults; call before destroying it.
  void RemoveClient(FaultClient* client);
  GuardStats stats() const;

  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;
  struct Impl;  // az_guard.cc

 private:
  Guard();
  void WaitFor(const void* addr, size_t len, bool unreadable_only);
  Impl* impl_;
};

}  // namespace zsock::sdp::az

#endif  // ZSOCK_CORE_SDP_AZ_GUARD_H_
