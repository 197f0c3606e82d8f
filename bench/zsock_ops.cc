// The zsock entry of the transport table: the zs_* sockets API
// (sockets/zsock.h). Nothing else in the harness names it.
#include "bench/sockops.h"
#include "sockets/zsock.h"

namespace zsock::bench {
namespace {

std::vector<std::pair<const char*, uint64_t>> Stats(int fd) {
  zs_stats st{};
  socklen_t len = sizeof(st);
  if (zs_getsockopt(fd, SOL_ZSOCK, ZSOCK_SO_STATS, &st, &len) != 0) return {};
#define ZS_STAT(f) {#f, st.f}
  return {ZS_STAT(bytes_sent_bcopy),     ZS_STAT(bytes_sent_srcavail), ZS_STAT(bytes_sent_sinkavail),
          ZS_STAT(bytes_recv_bcopy),     ZS_STAT(bytes_recv_srcavail), ZS_STAT(bytes_recv_sinkavail),
          ZS_STAT(messages_sent),        ZS_STAT(messages_received),   ZS_STAT(coalesced_sends),
          ZS_STAT(credit_stalls),        ZS_STAT(credit_updates_sent), ZS_STAT(autocork_holds),
          ZS_STAT(ack_requests),         ZS_STAT(ack_answers),         ZS_STAT(queued_bytes),
          ZS_STAT(held_bytes),           ZS_STAT(srcavail_sent),       ZS_STAT(srcavail_cancels),
          ZS_STAT(sendsmall),            ZS_STAT(sinkavail_sent),      ZS_STAT(sinkavail_cancels),
          ZS_STAT(sinkavail_void),       ZS_STAT(sinkavail_received),  ZS_STAT(cancels_received),
          ZS_STAT(rdma_fallbacks),       ZS_STAT(az_srcavail_sent),    ZS_STAT(az_bytes),
          ZS_STAT(az_hybrid_bcopy),      ZS_STAT(az_unprotectable),    ZS_STAT(az_faults),
          ZS_STAT(az_copies),            ZS_STAT(az_blocks),           ZS_STAT(az_fallbacks),
          ZS_STAT(az_recv_early)};
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
