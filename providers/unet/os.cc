// unet's operating-system helpers (os.h): memfds, mappings, socket
// addresses, fd passing, pidfds.
#include "providers/unet/os.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace zsock::unet {

absl::StatusOr<Fd> CreateMemfd(const char* name, size_t size) {
  int fd = static_cast<int>(
      ::syscall(SYS_memfd_create, name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (fd < 0) {
    return ErrnoError(errno, "memfd_create for a unet segment failed",
                      "unet needs Linux >= 3.17 with memfd; check seccomp policy");
  }
  Fd owned(fd);
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    return ErrnoError(errno, absl::StrCat("sizing a unet segment to ", size, " bytes failed"),
                      "lower unet_buffers/unet_buffer_size or raise memory limits");
  }
  // Sealed against resizing, so a peer can map it without fearing SIGBUS.
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return ErrnoError(errno, "sealing a unet segment failed");
  }
  return owned;
}

absl::StatusOr<Mapping> MapFd(int fd, size_t size, const char* what) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return ErrnoError(errno, absl::StrCat("mapping ", what, " (", size, " bytes) failed"),
                      "check the address-space and memory limits (ulimit -v)");
  }
  return Mapping(p, size);
}

absl::Status CheckPeerMemfd(int fd, size_t size, const char* what) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(errno, "fstat on a peer memfd failed");
  int seals = ::fcntl(fd, F_GET_SEALS);
  if (static_cast<size_t>(st.st_size) < size || seals < 0 || !(seals & F_SEAL_SHRINK)) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO,
                     absl::StrCat("peer's ", what, " is ", st.st_size,
                                  " bytes or not sealed (need ", size, ")"),
                     "the peer is not a compatible zsock unet endpoint");
  }
  return absl::OkStatus();
}

absl::StatusOr<sockaddr_un> MakeAddr(absl::string_view address, socklen_t* len) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::string name = absl::StrCat("zsock-unet/", address);
  if (address.empty() || name.size() + 1 > sizeof(sa.sun_path)) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("unet address '", address, "' is empty or longer than ",
                                  sizeof(sa.sun_path) - 12, " bytes"),
                     "use a short name such as 'server1' or '127.0.0.1:5000'");
  }
  // Abstract namespace: sun_path[0] == 0, nothing on disk.
  std::memcpy(sa.sun_path + 1, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return sa;
}

int PidfdOpen(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  errno = ENOSYS;
  return -1;
#endif
}

namespace {

// Room for kMaxPassedFds fds and one set of credentials.
constexpr size_t kControlBytes =
    CMSG_SPACE(kMaxPassedFds * sizeof(int)) + CMSG_SPACE(sizeof(ucred));

}  // namespace

ssize_t SendWithFds(int sock, const void* data, size_t len, std::span<const int> fds,
                    bool credentials, int flags) {
  iovec iov{const_cast<void*>(data), len};
  alignas(cmsghdr) char control[kControlBytes] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int)) +
                       (credentials ? CMSG_SPACE(sizeof(ucred)) : 0);
  cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
  std::memcpy(CMSG_DATA(cm), fds.data(), fds.size() * sizeof(int));
  if (credentials) {
    cm = CMSG_NXTHDR(&msg, cm);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_CREDENTIALS;
    cm->cmsg_len = CMSG_LEN(sizeof(ucred));
    ucred me{getpid(), getuid(), getgid()};
    std::memcpy(CMSG_DATA(cm), &me, sizeof(me));
  }
  ssize_t n;
  do {
    n = ::sendmsg(sock, &msg, MSG_NOSIGNAL | flags);
  } while (n < 0 && errno == EINTR);
  return n;
}

ssize_t RecvWithFds(int sock, void* data, size_t len, std::span<Fd> fds, size_t* nfds,
                    pid_t* pid, bool* complete, int flags) {
  iovec iov{data, len};
  alignas(cmsghdr) char control[kControlBytes] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | flags);
  } while (n < 0 && errno == EINTR);
  *nfds = 0;
  *pid = 0;
  *complete = (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) == 0;
  if (n < 0) return n;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level != SOL_SOCKET) continue;
    if (cm->cmsg_type == SCM_CREDENTIALS && cm->cmsg_len >= CMSG_LEN(sizeof(ucred))) {
      ucred cred;
      std::memcpy(&cred, CMSG_DATA(cm), sizeof(cred));
      *pid = cred.pid;
    } else if (cm->cmsg_type == SCM_RIGHTS) {
      size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
        if (*nfds < fds.size()) fds[(*nfds)++].reset(fd); else ::close(fd);
      }
    }
  }
  return n;
}

}  // namespace zsock::unet
