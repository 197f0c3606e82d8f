#include "core/bootstrap_io.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status.h"

namespace zsock {
namespace {

ssize_t KernelSend(int fd, const void* buf, size_t len, int flags) {
  return ::send(fd, buf, len, flags);
}
ssize_t KernelRecv(int fd, void* buf, size_t len, int flags) { return ::recv(fd, buf, len, flags); }
int KernelPoll(pollfd* fds, nfds_t n, int timeout_ms) { return ::poll(fds, n, timeout_ms); }

}  // namespace

const SocketCalls& KernelSocketCalls() {
  static constexpr SocketCalls kCalls{KernelSend, KernelRecv, KernelPoll};
  return kCalls;
}

absl::Status BootstrapIo::Wait(short events, absl::string_view what) {
  const bool idle = opt_.idle_limit != absl::InfiniteDuration();
  const absl::Time until = idle ? absl::Now() + opt_.idle_limit : deadline_;
  for (;;) {
    // Slices of at most a second, so that a clock step cannot stretch it.
    int slice = 1000;
    if (until != absl::InfiniteFuture()) {
      int64_t left_ms = absl::ToInt64Milliseconds(until - absl::Now());
      if (left_ms <= 0) {
        std::string msg = idle ? absl::StrCat(opt_.peer, " made no progress for ",
                                              absl::FormatDuration(opt_.idle_limit), " during ",
                                              what)
                               : absl::StrCat(opt_.peer, " did not complete ", what, " in time");
        return MakeError(absl::StatusCode::kDeadlineExceeded, ETIMEDOUT, msg, opt_.fix);
      }
      slice = static_cast<int>(std::min<int64_t>(left_ms, 1000));
    }
    pollfd pfd{fd_, events, 0};
    int rc = calls_->poll(&pfd, 1, slice);
    if (rc < 0 && errno != EINTR) {
      return ErrnoError(errno, absl::StrCat("poll during ", what, " with ", opt_.peer, " failed"));
    }
    if (rc > 0) return absl::OkStatus();
  }
}

absl::Status BootstrapIo::AfterShortIo(ssize_t n, short events, absl::string_view what) {
  const bool sending = events == POLLOUT;
  if (n == 0 && !sending) {
    return MakeError(absl::StatusCode::kUnavailable, ECONNRESET,
                     absl::StrCat(opt_.peer, " closed the connection during ", what), opt_.fix);
  }
  if (n < 0 && errno == EINTR) return absl::OkStatus();
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Wait(events, what);
  // A send that took nothing without an error is a closed peer too.
  const int err = n < 0 ? errno : EPIPE;
  return ErrnoError(err,
                    absl::StrCat(sending ? "sending " : "receiving ", what,
                                 sending ? " to " : " from ", opt_.peer, " failed"),
                    opt_.fix);
}

absl::Status BootstrapIo::SendFrame(uint32_t type, absl::string_view payload) {
  uint32_t head[2] = {type, static_cast<uint32_t>(payload.size())};
  std::string buf(reinterpret_cast<const char*>(head), sizeof(head));
  buf.append(payload.data(), payload.size());
  return Write(buf.data(), buf.size());
}

absl::StatusOr<std::string> BootstrapIo::RecvFrame(uint32_t type, size_t max_len) {
  uint32_t head[2];
  if (absl::Status st = Read(head, sizeof(head)); !st.ok()) return st;
  if (head[0] != type || head[1] > max_len) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO,
                     absl::StrCat("malformed handshake frame from ", opt_.peer, " (type 0x",
                                  absl::Hex(head[0]), ", ", head[1], " bytes; expected type 0x",
                                  absl::Hex(type), ", at most ", max_len, " bytes)"),
                     opt_.fix);
  }
  std::string payload(head[1], '\0');
  if (absl::Status st = Read(payload.data(), payload.size()); !st.ok()) return st;
  return payload;
}

}  // namespace zsock
