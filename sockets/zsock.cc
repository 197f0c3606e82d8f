// The C API (sockets/zsock.h) over zsock::Socket: errno and -1 on error,
// libc for every fd that is not a zsock socket.
#include "sockets/zsock.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstring>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/time/clock.h"
#include "core/log.h"
#include "core/status.h"
#include "sockets/socket.h"
#include "sockets/socket_table.h"

namespace zsock {
namespace {

// Sets errno from `s` and returns -1. EAGAIN and the like are the normal
// business of non-blocking sockets and are not logged.
int Fail(const absl::Status& s) {
  int e = StatusErrno(s);
  if (e == 0) e = EIO;
  if (e != EAGAIN && e != EINPROGRESS && e != EALREADY) {
    ZS_LOG(kDebug, "zsock socket call failed: %s", s.ToString());
  }
  errno = e;
  return -1;
}

ssize_t FailSize(const absl::Status& s) { return Fail(s); }

int CopyAddress(const absl::StatusOr<SocketAddress>& a, sockaddr* out, socklen_t* len) {
  if (!a.ok()) return Fail(a.status());
  if (out == nullptr || len == nullptr) {
    errno = EFAULT;
    return -1;
  }
  std::memcpy(out, &a->storage, std::min(*len, a->len));
  *len = a->len;
  return 0;
}

// One buffer as the iovec span Socket::Send/Recv take (on the caller's
// stack: a vector cost a malloc and a free per call).
struct OneIov {
  OneIov(const void* buf, size_t len) : v{const_cast<void*>(buf), len} {}
  operator std::span<const iovec>() const { return {&v, 1}; }
  iovec v;
};

// A byte count, or -1 with errno set.
ssize_t Count(const absl::StatusOr<size_t>& n) {
  return n.ok() ? static_cast<ssize_t>(*n) : FailSize(n.status());
}

}  // namespace
}  // namespace zsock

using zsock::FindSocket;
using zsock::Socket;

extern "C" {

int zs_is_zsock(int fd) { return FindSocket(fd) != nullptr; }

int zs_socket(int domain, int type, int protocol) {
  const int flags = type & (SOCK_NONBLOCK | SOCK_CLOEXEC);
  const int base = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC);
  if ((domain != AF_INET && domain != AF_INET6) || base != SOCK_STREAM ||
      (protocol != 0 && protocol != IPPROTO_TCP)) {
    return ::socket(domain, type, protocol);  // not ours: a kernel socket
  }
  auto s = Socket::Create(domain, flags);
  if (!s.ok()) return zsock::Fail(s.status());
  zsock::AddSocket(*s);
  return (*s)->fd();
}

int zs_bind(int fd, const sockaddr* addr, socklen_t len) {
  auto s = FindSocket(fd);
  if (!s) return ::bind(fd, addr, len);
  absl::Status st = s->Bind(addr, len);
  return st.ok() ? 0 : zsock::Fail(st);
}

int zs_listen(int fd, int backlog) {
  auto s = FindSocket(fd);
  if (!s) return ::listen(fd, backlog);
  absl::Status st = s->Listen(backlog);
  return st.ok() ? 0 : zsock::Fail(st);
}

int zs_accept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  auto s = FindSocket(fd);
  if (!s) return ::accept4(fd, addr, len, flags);
  if (flags & ~(SOCK_NONBLOCK | SOCK_CLOEXEC)) {
    errno = EINVAL;
    return -1;
  }
  zsock::SocketAddress peer;
  auto c = s->Accept(flags, &peer);
  if (!c.ok()) return zsock::Fail(c.status());
  zsock::AddSocket(*c);
  if (addr != nullptr && len != nullptr) {
    if (peer.len == 0) {
      auto p = (*c)->PeerAddress();
      if (p.ok()) peer = *p;
    }
    std::memcpy(addr, &peer.storage, std::min(*len, peer.len));
    *len = peer.len;
  }
  return (*c)->fd();
}

int zs_accept(int fd, sockaddr* addr, socklen_t* len) { return zs_accept4(fd, addr, len, 0); }

int zs_connect(int fd, const sockaddr* addr, socklen_t len) {
  auto s = FindSocket(fd);
  if (!s) return ::connect(fd, addr, len);
  absl::Status st = s->Connect(addr, len);
  return st.ok() ? 0 : zsock::Fail(st);
}

ssize_t zs_send(int fd, const void* buf, size_t len, int flags) {
  Socket* s = zsock::FindSocketForCall(fd);
  if (!s) return ::send(fd, buf, len, flags);
  return zsock::Count(s->Send(zsock::OneIov(buf, len), flags));
}

ssize_t zs_recv(int fd, void* buf, size_t len, int flags) {
  Socket* s = zsock::FindSocketForCall(fd);
  if (!s) return ::recv(fd, buf, len, flags);
  return zsock::Count(s->Recv(zsock::OneIov(buf, len), flags));
}

ssize_t zs_read(int fd, void* buf, size_t len) {
  Socket* s = zsock::FindSocketForCall(fd);
  if (!s) return ::read(fd, buf, len);
  return zsock::Count(s->Recv(zsock::OneIov(buf, len), 0));
}

ssize_t zs_write(int fd, const void* buf, size_t len) {
  Socket* s = zsock::FindSocketForCall(fd);
  if (!s) return ::write(fd, buf, len);
  return zsock::Count(s->Send(zsock::OneIov(buf, len), 0));
}

ssize_t zs_writev(int fd, const iovec* iov, int iovcnt) {
  Socket* s = zsock::FindSocketForCall(fd);
  if (!s) return ::writev(fd, iov, iovcnt);
  if (iovcnt < 0 || iovcnt > IOV_MAX) {
    errno = EINVAL;
    return -1;
  }
  return zsock::Count(s->Send(std::span<const iovec>(iov, static_cast<size_t>(iovcnt)), 0));
}

ssize_t zs_readv(int fd, const iovec* iov, int iovcnt) {
  Socket* s = zsock::FindSocketForCall(fd);
  if (!s) return ::readv(fd, iov, iovcnt);
  if (iovcnt < 0 || iovcnt > IOV_MAX) {
    errno = EINVAL;
    return -1;
  }
  return zsock::Count(s->Recv(std::span<const iovec>(iov, static_cast<size_t>(iovcnt)), 0));
}

ssize_t zs_sendmsg(int fd, const msghdr* msg, int flags) {
  Socket* s = zsock::FindSocketForCall(fd);
  if (!s) return ::sendmsg(fd, msg, flags);
  if (msg == nullptr || msg->msg_iovlen > IOV_MAX) {
    errno = msg == nullptr ? EFAULT : EMSGSIZE;
    return -1;
  }
  // A stream socket ignores msg_name (as TCP does) and has no control data.
  return zsock::Count(s->Send(std::span<const iovec>(msg->msg_iov, msg->msg_iovlen), flags));
}

ssize_t zs_recvmsg(int fd, msghdr* msg, int flags) {
  Socket* s = zsock::FindSocketForCall(fd);
  if (!s) return ::recvmsg(fd, msg, flags);
  if (msg == nullptr || msg->msg_iovlen > IOV_MAX) {
    errno = msg == nullptr ? EFAULT : EMSGSIZE;
    return -1;
  }
  auto n = s->Recv(std::span<const iovec>(msg->msg_iov, msg->msg_iovlen), flags);
  if (!n.ok()) return zsock::FailSize(n.status());
  msg->msg_namelen = 0;
  msg->msg_controllen = 0;
  msg->msg_flags = 0;
  return static_cast<ssize_t>(*n);
}

int zs_shutdown(int fd, int how) {
  auto s = FindSocket(fd);
  if (!s) return ::shutdown(fd, how);
  absl::Status st = s->Shutdown(how);
  return st.ok() ? 0 : zsock::Fail(st);
}

int zs_close(int fd) {
  // Close takes the socket out of the table as it closes the number (which
  // the kernel may then hand to another open()).
  auto s = FindSocket(fd);
  if (!s) return ::close(fd);
  absl::Status st = s->Close();
  return st.ok() ? 0 : zsock::Fail(st);
}

int zs_setsockopt(int fd, int level, int name, const void* value, socklen_t len) {
  auto s = FindSocket(fd);
  if (!s) return ::setsockopt(fd, level, name, value, len);
  absl::Status st = s->SetOption(level, name, value, len);
  return st.ok() ? 0 : zsock::Fail(st);
}

int zs_getsockopt(int fd, int level, int name, void* value, socklen_t* len) {
  auto s = FindSocket(fd);
  if (!s) return ::getsockopt(fd, level, name, value, len);
  absl::Status st = s->GetOption(level, name, value, len);
  return st.ok() ? 0 : zsock::Fail(st);
}

int zs_getsockname(int fd, sockaddr* addr, socklen_t* len) {
  auto s = FindSocket(fd);
  if (!s) return ::getsockname(fd, addr, len);
  return zsock::CopyAddress(s->LocalAddress(), addr, len);
}

int zs_getpeername(int fd, sockaddr* addr, socklen_t* len) {
  auto s = FindSocket(fd);
  if (!s) return ::getpeername(fd, addr, len);
  return zsock::CopyAddress(s->PeerAddress(), addr, len);
}

int zs_fcntl(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  long arg = va_arg(ap, long);  // every fcntl argument fits a long (int or pointer)
  va_end(ap);
  auto s = FindSocket(fd);
  if (!s) return ::fcntl(fd, cmd, arg);
  switch (cmd) {
    case F_GETFL:
      return O_RDWR | (s->nonblocking() ? O_NONBLOCK : 0);
    case F_SETFL:
      s->set_nonblocking((arg & O_NONBLOCK) != 0);
      return 0;
    default:
      return ::fcntl(fd, cmd, arg);  // F_GETFD/F_SETFD, F_DUPFD ... act on the real fd
  }
}

int zs_poll(pollfd* fds, nfds_t nfds, int timeout) {
  absl::InlinedVector<std::shared_ptr<Socket>, 16> socks(nfds);
  bool any = false;
  for (nfds_t i = 0; i < nfds; ++i) {
    socks[i] = FindSocket(fds[i].fd);
    any |= socks[i] != nullptr;
  }
  if (!any) return ::poll(fds, nfds, timeout);
  const absl::Time deadline =
      timeout < 0 ? absl::InfiniteFuture() : absl::Now() + absl::Milliseconds(timeout);
  std::vector<pollfd> kernel(fds, fds + nfds);
  for (;;) {
    // zsock sockets first, from the engine's state (exact); this also
    // brings their mirrored fds down to the truth, so poll(2) sleeps.
    int ready = 0;
    for (nfds_t i = 0; i < nfds; ++i) {
      fds[i].revents = 0;
      if (!socks[i]) continue;
      short want = static_cast<short>(fds[i].events | POLLERR | POLLHUP | POLLNVAL);
      fds[i].revents = static_cast<short>(socks[i]->Events() & want);
      ready += fds[i].revents != 0;
    }
    int wait_ms = 0;
    if (ready == 0) {
      if (deadline == absl::InfiniteFuture()) {
        wait_ms = -1;
      } else {
        wait_ms = static_cast<int>(
            std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now() +
                                                            absl::Microseconds(999))));
      }
    }
    for (nfds_t i = 0; i < nfds; ++i) kernel[i].revents = 0;
    int rc = ::poll(kernel.data(), nfds, wait_ms);
    if (rc < 0) return -1;  // errno from poll (EINTR, EINVAL, ...)
    int woke = 0;
    for (nfds_t i = 0; i < nfds; ++i) {
      if (socks[i]) {
        if (ready == 0 && kernel[i].revents != 0) {
          short want = static_cast<short>(fds[i].events | POLLERR | POLLHUP | POLLNVAL);
          fds[i].revents = static_cast<short>(socks[i]->Events() & want);
        }
      } else {
        fds[i].revents = kernel[i].revents;
      }
      woke += fds[i].revents != 0;
    }
    if (woke > 0) return woke;
    if (wait_ms == 0 || absl::Now() >= deadline) return 0;
  }
}

}  // extern "C"
