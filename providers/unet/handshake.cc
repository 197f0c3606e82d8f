// unet's hello exchange (handshake.h): one message each way on the
// connection socket, with fds and credentials, checked before use.
#include "providers/unet/handshake.h"

#include <poll.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status.h"
#include "providers/unet/os.h"

namespace zsock::unet {

// The hello carries the segment fds and our credentials, from which the
// peer learns our pid. SO_PEERCRED cannot serve: on the connecting side it
// names the process that called listen(), which need not be the one that
// accepts.
absl::Status SendHello(int sock, const Hello& hello, const int fds[kHelloFds]) {
  ssize_t n = SendWithFds(sock, &hello, sizeof(hello), {fds, kHelloFds}, /*credentials=*/true, 0);
  if (n != static_cast<ssize_t>(sizeof(hello))) {
    return ErrnoError(n < 0 ? errno : EPROTO, "sending the unet hello failed");
  }
  return absl::OkStatus();
}

absl::Status RecvHello(int sock, absl::Time deadline, Hello* hello, Fd fds[kHelloFds],
                       pid_t* peer_pid) {
  for (;;) {
    int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) {
      return MakeError(absl::StatusCode::kDeadlineExceeded, ETIMEDOUT,
                       "the unet peer sent no hello in time",
                       "check that the peer is a zsock unet endpoint and is not stuck");
    }
    pollfd pfd{sock, POLLIN, 0};
    int rc = ::poll(&pfd, 1, static_cast<int>(left_ms));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return ErrnoError(errno, "poll during unet handshake failed");
    if (rc > 0) break;
  }
  size_t received = 0;
  bool complete = false;
  ssize_t n = RecvWithFds(sock, hello, sizeof(*hello), {fds, kHelloFds}, &received, peer_pid,
                          &complete, 0);
  if (n < 0) return ErrnoError(errno, "receiving the unet hello failed");
  if (n == 0) {
    return MakeError(absl::StatusCode::kUnavailable, ECONNRESET,
                     "the unet peer closed the connection during the handshake",
                     "check the peer's log: it may have rejected our parameters");
  }
  if (n != static_cast<ssize_t>(sizeof(*hello)) || *peer_pid <= 0) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO,
                     "malformed unet hello", "the peer is not a compatible zsock unet endpoint");
  }
  // The version before the fds: version 1 sent three.
  if (hello->magic != kSegmentMagic || hello->version != kVersion) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO,
                     absl::StrCat("unet hello has version ", hello->version, " (want ", kVersion, ")"),
                     "run the same zsock version on both sides");
  }
  if (received != kHelloFds || !complete) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO,
                     absl::StrCat("malformed unet hello: ", received, " fds (want ", kHelloFds, ")"),
                     "the peer is not a compatible zsock unet endpoint");
  }
  if (!ValidHelloParams(*hello)) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO,
                     "unet hello carries invalid segment parameters",
                     "the peer is not a compatible zsock unet endpoint");
  }
  return absl::OkStatus();
}

}  // namespace zsock::unet
