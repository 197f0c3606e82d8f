#include "providers/ofi/tcp_socket.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cerrno>
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

bool SocketHasAddresses(int fd, const sockaddr_storage& local, const sockaddr_storage& peer) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0 || !SameSockAddr(ss, local)) {
    return false;
  }
  len = sizeof(ss);
  return ::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0 && SameSockAddr(ss, peer);
}

// `fd` if it is the socket, duplicated; `*dup_errno` says why a matching
// one could not be duplicated.
Fd Probe(int fd, const sockaddr_storage& local, const sockaddr_storage& peer, int* dup_errno) {
  if (!SocketHasAddresses(fd, local, peer)) return Fd();
  Fd dup(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!dup) *dup_errno = errno;
  if (dup && SocketHasAddresses(dup.get(), local, peer)) return dup;
  return Fd();
}

}  // namespace

Fd FindTcpSocket(const sockaddr_storage& local, const sockaddr_storage& peer, int window) {
  int dup_errno = 0;
  const int lowest_free = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (lowest_free >= 0) {
    ::close(lowest_free);
    for (int d = 1; d <= window; ++d) {
      for (int fd : {lowest_free - d, lowest_free + d}) {
        if (fd < 0) continue;
        if (Fd found = Probe(fd, local, peer, &dup_errno)) return found;
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
      if (Fd found = Probe(fd, local, peer, &dup_errno)) return found;
    }
  } else if (dup_errno == 0) {
    dup_errno = errno;
  }
  errno = dup_errno != 0 ? dup_errno : ENOENT;
  return Fd();
}

}  // namespace zsock::ofi
