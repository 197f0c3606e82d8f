// Deadline-bounded socket reads and writes for the connection handshake.
#include "providers/ucx/bootstrap_io.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status.h"

namespace zsock::ucx {

absl::Status WaitFd(int fd, short events, absl::Time deadline, const char* what) {
  for (;;) {
    int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) {
      return MakeError(absl::StatusCode::kDeadlineExceeded, ETIMEDOUT,
                       absl::StrCat("the ucx peer did not ", what, " in time"),
                       "check that the peer is a zsock ucx endpoint and is not stuck");
    }
    pollfd pfd{fd, events, 0};
    int rc = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left_ms, 1000)));
    if (rc < 0 && errno != EINTR) return ErrnoError(errno, "poll during the ucx handshake failed");
    if (rc > 0) return absl::OkStatus();
  }
}

absl::Status WriteAll(int fd, const void* data, size_t len, absl::Time deadline) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (auto st = WaitFd(fd, POLLOUT, deadline, "accept handshake data"); !st.ok()) return st;
      continue;
    }
    return ErrnoError(errno, "sending the ucx handshake failed",
                      "the peer closed the connection during the handshake; check its log");
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, void* data, size_t len, absl::Time deadline) {
  auto* p = static_cast<uint8_t*>(data);
  while (len > 0) {
    ssize_t n = ::recv(fd, p, len, 0);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      return MakeError(absl::StatusCode::kUnavailable, ECONNRESET,
                       "the ucx peer closed the connection during the handshake",
                       "check the peer's log: it may have rejected the connection (e.g. "
                       "shared memory impossible and fallback=none)");
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (auto st = WaitFd(fd, POLLIN, deadline, "send its handshake"); !st.ok()) return st;
      continue;
    }
    return ErrnoError(errno, "receiving the ucx handshake failed");
  }
  return absl::OkStatus();
}

}  // namespace zsock::ucx
