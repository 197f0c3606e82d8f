// The zsock entry of the transport table: the zs_* sockets API
// (sockets/zsock.h). Nothing else in the harness names it.
#include "bench/sockops.h"
#include "sockets/zsock.h"

namespace zsock::bench {

absl::StatusOr<const SockOps*> ZsockOps() {
  static const SockOps ops = {
      .name = "zsock",
      .socket = zs_socket,
      .bind = zs_bind,
      .listen = zs_listen,
      .accept = zs_accept,
      .connect = zs_connect,
      .send = zs_send,
      .recv = zs_recv,
      .close = zs_close,
      .setsockopt = zs_setsockopt,
      .getsockname = zs_getsockname,
      .poll = zs_poll,
      .fcntl = zs_fcntl,
  };
  return &ops;
}

}  // namespace zsock::bench
