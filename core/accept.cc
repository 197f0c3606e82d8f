#include "core/accept.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace zsock {

absl::StatusOr<Fd> AcceptUntil(int listen_fd, absl::Time deadline, absl::string_view what,
                               int extra_flags, sockaddr_storage* peer) {
  for (;;) {
    sockaddr_storage ss{};
    socklen_t sl = sizeof(ss);
    int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &sl, SOCK_CLOEXEC | extra_flags);
    if (fd >= 0) {
      if (peer != nullptr) *peer = ss;
      return Fd(fd);
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return ErrnoError(errno, absl::StrCat("accept on ", what, " failed"),
                        errno == EMFILE ? "raise the fd limit (ulimit -n)" : "");
    }
    int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) {
      return MakeError(absl::StatusCode::kDeadlineExceeded, ETIMEDOUT,
                       absl::StrCat("no connection arrived on ", what), "");
    }
    pollfd pfd{listen_fd, POLLIN, 0};
    ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left_ms, 1000)));
  }
}

}  // namespace zsock
