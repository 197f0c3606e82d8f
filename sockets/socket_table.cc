// The table of zsock sockets by fd number: see socket_table.h.
#include "sockets/socket_table.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/mutex.h"

namespace zsock {
namespace {

// By fd number under a reader/writer lock; each change also bumps the
// generation of the fd's bucket, which the per-thread cache checks with
// one plain atomic load: a send or receive then takes no lock here (the
// reader lock's two read-modify-writes were a noticeable part of a small
// send's cost in the sockets layer).
constexpr size_t kGenBuckets = 4096;

struct Table {
  SharedMutex mu;
  std::vector<std::shared_ptr<Socket>> by_fd ABSL_GUARDED_BY(mu);
  std::atomic<uint64_t> gen[kGenBuckets] = {};  // bumped under mu (writer)
};

Table& GetTable() {
  static Table* t = new Table;
  return *t;
}

std::atomic<uint64_t>& GenOf(Table& t, int fd) {
  return t.gen[static_cast<size_t>(fd) % kGenBuckets];
}

// A thread's last lookups, direct-mapped by fd. An entry is good while its
// bucket's generation is unchanged (any Add or Unlist in the bucket
// invalidates it). It keeps a closed socket's object (not its fd or
// connection, which Close releases) until replaced or the thread ends.
struct CachedSocket {
  int fd = -1;
  uint64_t gen = 0;
  std::shared_ptr<Socket> socket;
};
constexpr size_t kCacheEntries = 8;
thread_local CachedSocket t_cache[kCacheEntries];

// This thread's cache entry for fd, refreshed from the table when stale.
const std::shared_ptr<Socket>& Lookup(int fd) {
  static const std::shared_ptr<Socket> kNone;
  if (fd < 0) return kNone;
  Table& t = GetTable();
  CachedSocket& e = t_cache[static_cast<size_t>(fd) % kCacheEntries];
  const uint64_t gen = GenOf(t, fd).load(std::memory_order_acquire);
  if (e.fd == fd && e.gen == gen) return e.socket;
  t.mu.ReaderLock();
  std::shared_ptr<Socket> s =
      static_cast<size_t>(fd) < t.by_fd.size() ? t.by_fd[static_cast<size_t>(fd)] : nullptr;
  // Read under the lock: writers bump it under the writer lock, after the
  // table changed.
  const uint64_t seen = GenOf(t, fd).load(std::memory_order_relaxed);
  t.mu.ReaderUnlock();
  e.fd = fd;
  e.gen = seen;
  e.socket = std::move(s);
  return e.socket;
}

}  // namespace

std::shared_ptr<Socket> FindSocket(int fd) { return Lookup(fd); }

Socket* FindSocketForCall(int fd) { return Lookup(fd).get(); }

void AddSocket(std::shared_ptr<Socket> s) {
  Table& t = GetTable();
  std::shared_ptr<Socket> old;  // dropped outside the lock: it may close
  t.mu.Lock();
  const int fd = s->fd();
  const size_t i = static_cast<size_t>(fd);
  if (i >= t.by_fd.size()) t.by_fd.resize(std::max(i + 1, t.by_fd.size() * 2));
  old = std::exchange(t.by_fd[i], std::move(s));
  GenOf(t, fd).fetch_add(1, std::memory_order_release);
  t.mu.Unlock();
}

void UnlistSocket(const Socket* s, int fd, absl::FunctionRef<void()> close_fd) {
  if (fd < 0) return;
  Table& t = GetTable();
  std::shared_ptr<Socket> listed;  // dropped outside the lock
  t.mu.Lock();
  const size_t i = static_cast<size_t>(fd);
  if (i < t.by_fd.size() && t.by_fd[i].get() == s) {
    listed = std::move(t.by_fd[i]);
    GenOf(t, fd).fetch_add(1, std::memory_order_release);
  }
  close_fd();
  t.mu.Unlock();
  // This thread's entry goes now (other threads' go at their next lookup).
  CachedSocket& e = t_cache[i % kCacheEntries];
  if (e.fd == fd && e.socket.get() == s) e = CachedSocket{};
}

}  // namespace zsock
