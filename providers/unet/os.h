// unet's operating-system helpers: memfd segments and their mappings,
// abstract-namespace Unix socket addresses, fd passing on the connection
// socket, pidfds.
//
// Everything a peer hands us (a memfd, a message with fds) is checked
// before use: CheckPeerMemfd makes sure touching a mapping cannot fault.
#ifndef ZSOCK_PROVIDERS_UNET_OS_H_
#define ZSOCK_PROVIDERS_UNET_OS_H_

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/fd.h"

namespace zsock::unet {

// Owns one shared mapping and unmaps it (move-only).
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* p, size_t len) : p_(p), len_(len) {}
  Mapping(Mapping&& o) noexcept : p_(o.p_), len_(o.len_) {
    o.p_ = nullptr;
    o.len_ = 0;
  }
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = o.p_;
      len_ = o.len_;
      o.p_ = nullptr;
      o.len_ = 0;
    }
    return *this;
  }
  ~Mapping() { reset(); }
  void reset() {
    if (p_ != nullptr) ::munmap(p_, len_);
    p_ = nullptr;
    len_ = 0;
  }
  uint8_t* get() const { return static_cast<uint8_t*>(p_); }
  size_t size() const { return len_; }

 private:
  void* p_ = nullptr;
  size_t len_ = 0;
};

// A memfd of `size` bytes, sealed against resizing, so a peer can map it
// without fearing SIGBUS.
absl::StatusOr<Fd> CreateMemfd(const char* name, size_t size);

// Maps `size` bytes of `fd` shared and writable; `what` names it in errors.
absl::StatusOr<Mapping> MapFd(int fd, size_t size, const char* what);

// Checks that a peer's memfd is at least `size` bytes and sealed against
// shrinking, so touching it cannot fault.
absl::Status CheckPeerMemfd(int fd, size_t size, const char* what);

// The abstract-namespace address of unet address `address` (nothing on
// disk); InvalidArgument when it is empty or too long.
absl::StatusOr<sockaddr_un> MakeAddr(absl::string_view address, socklen_t* len);

// pidfd_open(2), or -1 with errno (ENOSYS where the kernel headers lack it).
int PidfdOpen(pid_t pid);

// The most fds one message on the connection socket carries (the hello's).
inline constexpr size_t kMaxPassedFds = 4;

// One message on the connection socket with up to kMaxPassedFds fds
// (SCM_RIGHTS) and, if asked, our credentials (SCM_CREDENTIALS, checked by
// the kernel). Returns the bytes sent, or -1 with errno.
ssize_t SendWithFds(int sock, const void* data, size_t len, std::span<const int> fds,
                    bool credentials, int flags);

// Receives one message into `data`, up to `fds.size()` fds (extra ones are
// closed) and the sender's pid from SCM_CREDENTIALS (0 if absent; the socket
// has SO_PASSCRED). Sets *complete to false when the message or its
// ancillary data was truncated. Returns the bytes received, or -1 with errno.
ssize_t RecvWithFds(int sock, void* data, size_t len, std::span<Fd> fds, size_t* nfds,
                    pid_t* pid, bool* complete, int flags);

}  // namespace zsock::unet

#endif  // ZSOCK_PROVIDERS_UNET_OS_H_
