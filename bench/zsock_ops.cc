// The zsock entry of the transport table.
//
// THE ONE PLACE TO CHANGE when sockets/zsock.h lands (issue 6): replace the
// body below with
//
//   #include "sockets/zsock.h"
//   absl::StatusOr<const SockOps*> ZsockOps() {
//     static const SockOps ops = {
//         .name = "zsock", .socket = zs_socket, .bind = zs_bind,
//         .listen = zs_listen, .accept = zs_accept, .connect = zs_connect,
//         .send = zs_send, .recv = zs_recv, .close = zs_close,
//         .setsockopt = zs_setsockopt, .getsockname = zs_getsockname,
//         .poll = zs_poll, .fcntl = zs_fcntl};
//     return &ops;
//   }
//
// and add the sockets library to :zsock_ops's deps in bench/BUILD.bazel.
// Nothing else in the harness names the zsock API.
#include "absl/status/status.h"
#include "bench/sockops.h"
#include "core/status.h"

namespace zsock::bench {

absl::StatusOr<const SockOps*> ZsockOps() {
  return MakeError(absl::StatusCode::kFailedPrecondition, 0,
                   "zsock sockets API not built yet (issue 6)",
                   "measure kernel TCP alone with --provider=tcp until sockets/zsock.h "
                   "lands; then bench/zsock_ops.cc fills this table");
}

}  // namespace zsock::bench
