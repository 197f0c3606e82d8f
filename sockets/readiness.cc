// ReadinessFd: see readiness.h for the mechanism.
#include "sockets/readiness.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "core/log.h"
#include "core/status.h"

namespace zsock {
namespace {

// Reads and discards everything queued on `fd`.
void Drain(int fd) {
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    return;  // 0: end of stream; EAGAIN: empty
  }
}

bool PollOut(int fd) {
  pollfd p{fd, POLLOUT, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLOUT);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ReadinessFd>> ReadinessFd::Create(bool cloexec) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return ErrnoError(errno, "socketpair for a zsock socket's file descriptor failed",
                      "raise the open-file limit (ulimit -n) if it is EMFILE");
  }
  Fd user(sv[0]), ours(sv[1]);
  if (!cloexec && ::fcntl(user.get(), F_SETFD, 0) != 0) {
    return ErrnoError(errno, "clearing FD_CLOEXEC on a zsock socket's fd failed");
  }
  // The smallest send allowance (the kernel raises 1 to its minimum): filler
  // that makes the program's end unwritable stays a few KiB.
  int one = 1;
  if (::setsockopt(user.get(), SOL_SOCKET, SO_SNDBUF, &one, sizeof(one)) != 0) {
    return ErrnoError(errno, "setsockopt(SO_SNDBUF) on a zsock socket's fd failed");
  }
  return std::unique_ptr<ReadinessFd>(new ReadinessFd(std::move(user), std::move(ours)));
}

void ReadinessFd::SetReadable(bool on) {
  if (hangup_ || eos_ || on == readable_) return;
  if (on) {
    const char token = 'r';
    ssize_t n;
    do {
      n = ::send(ours_.get(), &token, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n != 1) {
      // Cannot happen while tokens are drained on every readable->unreadable
      // transition (at most one is queued); say so if it does.
      ZS_LOG(kError, "could not mark zsock fd %d readable (%s); watchers may not wake",
             user_.get(), std::strerror(errno));
      return;
    }
  } else {
    Drain(user_.get());
  }
  readable_ = on;
}

void ReadinessFd::SetWritable(bool on) {
  if (hangup_ || on == writable_) return;
  if (on) {
    Drain(ours_.get());
    writable_ = true;
    return;
  }
  static const char kFiller[2048] = {};
  for (int i = 0; i < 64 && PollOut(user_.get()); ++i) {
    ssize_t n = ::send(user_.get(), kFiller, sizeof(kFiller), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && errno != EINTR && errno != EAGAIN) {
      ZS_LOG(kError, "could not mark zsock fd %d unwritable (%s)", user_.get(),
             std::strerror(errno));
      return;
    }
  }
  writable_ = PollOut(user_.get());
  if (writable_) {
    ZS_LOG(kError, "zsock fd %d stays writable after filling its send allowance", user_.get());
  }
}

void ReadinessFd::SetEndOfStream() {
  if (hangup_ || eos_) return;
  ::shutdown(ours_.get(), SHUT_WR);
  eos_ = true;
  readable_ = true;
}

void ReadinessFd::SetHangup() {
  if (hangup_) return;
  SetWritable(true);
  ::shutdown(ours_.get(), SHUT_RDWR);
  hangup_ = true;
  eos_ = true;
  readable_ = true;
  writable_ = true;
}

}  // namespace zsock
