// zsock::Fd: owns one file descriptor and closes it (move-only). Shared by
// every provider (they pass segments, eventfds, sockets and CQ fds around).
#ifndef ZSOCK_CORE_FD_H_
#define ZSOCK_CORE_FD_H_

#include <unistd.h>

namespace zsock {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    reset(o.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace zsock

#endif  // ZSOCK_CORE_FD_H_
