// The zsock entry of the transport table: the zs_* sockets API
// (sockets/zsock.h). Nothing else in the harness names it.
#include "bench/sockops.h"
#include "sockets/stats_fields.h"
#include "sockets/zsock.h"

namespace zsock::bench {
namespace {

std::vector<std::pair<const char*, uint64_t>> Stats(int fd) {
  zs_stats st{};
  socklen_t len = sizeof(st);
  if (zs_getsockopt(fd, SOL_ZSOCK, ZSOCK_SO_STATS, &st, &len) != 0) return {};
#define ZS_STAT(f) {#f, st.f},
  return {ZSOCK_STATS_FIELDS(ZS_STAT)};
#undef ZS_STAT
}

}  // namespace

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
      .stats = Stats,
  };
  return &ops;
}

}  // namespace zsock::bench
