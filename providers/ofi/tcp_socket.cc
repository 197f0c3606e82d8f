#include "providers/ofi/tcp_socket.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"

namespace zsock::ofi {
namespace {

bool SameSockAddr(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto& x = reinterpret_cast<const sockaddr_in&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port &&
           std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof(x.sin6_addr)) == 0;
  }
  return false;
}

// 1: it is; 0: it is not (another socket, or no socket); -1: no such fd.
int SocketHasAddresses(int fd, const sockaddr_storage& local, const sockaddr_storage& peer) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return errno == EBADF ? -1 : 0;
  if (!SameSockAddr(ss, local)) return 0;
  len = sizeof(ss);
  return ::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0 && SameSockAddr(ss, peer) ? 1 : 0;
}

// -1: no such fd; 0: not it; 1: found (`*found` holds the duplicate).
// `*dup_errno` says why a matching one could not be duplicated.
int Probe(int fd, const sockaddr_storage& local, const sockaddr_storage& peer, Fd* found,
          int* dup_errno) {
  int r = SocketHasAddresses(fd, local, peer);
  if (r <= 0) return r;
  Fd dup(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!dup) *dup_errno = errno;
  if (dup && SocketHasAddresses(dup.get(), local, peer) == 1) {
    *found = std::move(dup);
    return 1;
  }
  return 0;
}

// A run this long of closed fd numbers above the lowest free one is taken
// for the end of the table (the /proc listing covers what lies beyond).
constexpr int kClosedRun = 256;

}  // namespace

Fd FindTcpSocket(const sockaddr_storage& local, const sockaddr_storage& peer, int window) {
  int dup_errno = 0;
  Fd found;
  const int lowest_free = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (lowest_free >= 0) {
    ::close(lowest_free);
    // Outward from the lowest free fd: down to 0, and up until a run of
    // closed numbers. One system call per fd, and the new socket is
    // usually within a few.
    int down = lowest_free - 1, up = lowest_free + 1, closed_run = 0;
    for (int step = 0; step < window && (down >= 0 || closed_run < kClosedRun); ++step) {
      if (down >= 0 && Probe(down--, local, peer, &found, &dup_errno) == 1) return found;
      if (closed_run < kClosedRun) {
        int r = Probe(up++, local, peer, &found, &dup_errno);
        if (r == 1) return found;
        closed_run = r < 0 ? closed_run + 1 : 0;
      }
    }
  } else {
    dup_errno = errno;  // EMFILE: no fd for a duplicate either
  }
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    std::vector<int> fds;
    while (dirent* e = ::readdir(dir)) {
      int fd = 0;
      if (absl::SimpleAtoi(e->d_name, &fd) && fd != ::dirfd(dir)) fds.push_back(fd);
    }
    ::closedir(dir);
    for (int fd : fds) {
      if (Probe(fd, local, peer, &found, &dup_errno) == 1) return found;
    }
  } else if (dup_errno == 0) {
    dup_errno = errno;
  }
  errno = dup_errno != 0 ? dup_errno : ENOENT;
  return Fd();
}

bool TcpReadProgress(int fd, uint64_t* consumed, int* unread) {
  int queued = 0;
  if (::ioctl(fd, SIOCINQ, &queued) != 0) return false;
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0 ||
      len < offsetof(tcp_info, tcpi_bytes_received) + sizeof(info.tcpi_bytes_received)) {
    return false;
  }
  *unread = queued;
  *consumed = info.tcpi_bytes_received - static_cast<uint64_t>(queued);
  return true;
}

}  // namespace zsock::ofi
