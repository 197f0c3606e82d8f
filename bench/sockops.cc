#include "bench/sockops.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace zsock::bench {

const SockOps& KernelTcpOps() {
  static const SockOps ops = {
      .name = "tcp",
      .socket = ::socket,
      .bind = ::bind,
      .listen = ::listen,
      .accept = ::accept,
      .connect = ::connect,
      .send = ::send,
      .recv = ::recv,
      .close = ::close,
      .setsockopt = ::setsockopt,
      .getsockname = ::getsockname,
      .poll = ::poll,
      .fcntl = ::fcntl,
      .stats = nullptr,
  };
  return ops;
}

}  // namespace zsock::bench
