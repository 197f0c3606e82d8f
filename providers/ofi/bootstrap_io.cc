// IoAll: the bootstrap socket's reads and writes with a deadline.
#include "providers/ofi/bootstrap_io.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>

#include "absl/time/clock.h"
#include "core/status.h"

namespace zsock::ofi {

absl::Status IoAll(int fd, void* buf, size_t len, bool write, absl::Time deadline) {
  auto* p = static_cast<uint8_t*>(buf);
  while (len > 0) {
    int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) {
      return MakeError(absl::StatusCode::kDeadlineExceeded, ETIMEDOUT,
                       "the ofi peer did not complete the connection handshake in time",
                       "check that the peer runs zsock with the same ofi provider");
    }
    pollfd pfd{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    if (::poll(&pfd, 1, static_cast<int>(left)) <= 0) continue;
    ssize_t n = write ? ::send(fd, p, len, MSG_NOSIGNAL) : ::recv(fd, p, len, 0);
    if (n == 0) {
      return MakeError(absl::StatusCode::kUnavailable, ECONNRESET,
                       "the ofi peer closed the connection during the handshake",
                       "check the peer's log: it may use another ofi provider or version");
    }
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return ErrnoError(errno, "ofi handshake I/O failed");
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace zsock::ofi
