// Kernel TCP as a latency-minded user runs it (sockops.h): the data path
// never sleeps. send and recv retry MSG_DONTWAIT calls until they move a
// byte, poll retries a zero-timeout poll, and every socket asks for
// SO_BUSY_POLL, which makes the kernel spin on the device queue inside
// those calls where a driver supports it (on loopback it has nothing to
// spin on). Written here because the point is the loop itself: libc has no
// busy-waiting mode.
//
// What the caller set is honoured as the kernel would: a socket made
// non-blocking with fcntl gets EAGAIN at once, and SO_RCVTIMEO and
// SO_SNDTIMEO end a spin with EAGAIN when they expire.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdint>

#include "bench/clock.h"
#include "bench/sockops.h"

namespace zsock::bench {
namespace {

// SO_BUSY_POLL's budget: how long one call may spin on the device queue.
constexpr int kBusyPollUs = 50;

// What fcntl and setsockopt set, per fd. The benchmark's children are
// single-threaded and use few descriptors; a higher fd has no timeout and
// counts as blocking unless it was opened non-blocking (checked then).
constexpr int kMaxFd = 4096;
struct FdState {
  bool nonblocking = false;
  int64_t rcv_timeout_ns = 0;  // 0: none
  int64_t snd_timeout_ns = 0;
};
FdState g_fds[kMaxFd];

FdState* StateOf(int fd) { return fd >= 0 && fd < kMaxFd ? &g_fds[fd] : nullptr; }

// Spins `call` (a MSG_DONTWAIT send or recv) until it does not say EAGAIN,
// or the socket's timeout passes.
template <typename Call>
ssize_t Spin(bool nonblocking, int64_t timeout_ns, Call call) {
  const int64_t deadline = timeout_ns > 0 ? NowNs() + timeout_ns : INT64_MAX;
  for (;;) {
    ssize_t n = call();
    if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK) || nonblocking) return n;
    if (NowNs() >= deadline) {
      errno = EAGAIN;
      return -1;
    }
  }
}

// Refused without CAP_NET_ADMIN above net.core.busy_read: then the loop
// alone polls.
void AskBusyPoll(int fd) {
  int us = kBusyPollUs;
  (void)::setsockopt(fd, SOL_SOCKET, SO_BUSY_POLL, &us, sizeof(us));
}

int BusySocket(int domain, int type, int protocol) {
  int fd = ::socket(domain, type, protocol);
  if (fd < 0) return fd;
  if (FdState* s = StateOf(fd)) *s = FdState{.nonblocking = (type & SOCK_NONBLOCK) != 0};
  AskBusyPoll(fd);
  return fd;
}

int BusyAccept(int fd, sockaddr* addr, socklen_t* len) {
  int nfd = ::accept(fd, addr, len);
  if (nfd < 0) return nfd;
  // An accepted socket is blocking whatever the listener was, and starts
  // with no timeouts.
  if (FdState* s = StateOf(nfd)) *s = FdState{};
  AskBusyPoll(nfd);
  return nfd;
}

ssize_t BusySend(int fd, const void* buf, size_t len, int flags) {
  const FdState* s = StateOf(fd);
  const bool nb = (s != nullptr && s->nonblocking) || (flags & MSG_DONTWAIT) != 0;
  return Spin(nb, s ? s->snd_timeout_ns : 0,
              [&] { return ::send(fd, buf, len, flags | MSG_DONTWAIT); });
}

ssize_t BusyRecv(int fd, void* buf, size_t len, int flags) {
  const FdState* s = StateOf(fd);
  const bool nb = (s != nullptr && s->nonblocking) || (flags & MSG_DONTWAIT) != 0;
  return Spin(nb, s ? s->rcv_timeout_ns : 0,
              [&] { return ::recv(fd, buf, len, flags | MSG_DONTWAIT); });
}

int BusyPoll(pollfd* fds, nfds_t nfds, int timeout_ms) {
  const int64_t deadline =
      timeout_ms < 0 ? INT64_MAX : NowNs() + int64_t{timeout_ms} * 1000000;
  for (;;) {
    int n = ::poll(fds, nfds, 0);
    if (n != 0 || NowNs() >= deadline) return n;
  }
}

int BusySetsockopt(int fd, int level, int name, const void* value, socklen_t len) {
  int rc = ::setsockopt(fd, level, name, value, len);
  FdState* s = StateOf(fd);
  if (rc == 0 && s != nullptr && level == SOL_SOCKET &&
      (name == SO_RCVTIMEO || name == SO_SNDTIMEO) && len >= sizeof(timeval)) {
    const auto* tv = static_cast<const timeval*>(value);
    const int64_t ns = int64_t{tv->tv_sec} * 1000000000 + int64_t{tv->tv_usec} * 1000;
    (name == SO_RCVTIMEO ? s->rcv_timeout_ns : s->snd_timeout_ns) = ns;
  }
  return rc;
}

int BusyFcntl(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  // Every fcntl command takes at most one argument, an int or a pointer;
  // read as a pointer, as glibc's fcntl reads it, it passes either through.
  void* arg = va_arg(ap, void*);
  va_end(ap);
  int rc = ::fcntl(fd, cmd, arg);
  if (rc == 0 && cmd == F_SETFL) {
    if (FdState* s = StateOf(fd)) {
      s->nonblocking = (static_cast<int>(reinterpret_cast<intptr_t>(arg)) & O_NONBLOCK) != 0;
    }
  }
  return rc;
}

}  // namespace

const SockOps& KernelTcpBusyOps() {
  static const SockOps ops = {
      .name = "tcp-busy",
      .socket = BusySocket,
      .bind = ::bind,
      .listen = ::listen,
      .accept = BusyAccept,
      .connect = ::connect,
      .send = BusySend,
      .recv = BusyRecv,
      .close = ::close,
      .setsockopt = BusySetsockopt,
      .getsockname = ::getsockname,
      .poll = BusyPoll,
      .fcntl = BusyFcntl,
      .stats = nullptr,
  };
  return ops;
}

}  // namespace zsock::bench
