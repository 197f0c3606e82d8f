#include "core/bootstrap_io.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
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

BootstrapIo::BootstrapIo(int fd, absl::Time deadline, Options options)
    : fd_(fd), deadline_(deadline), opt_(std::move(options)),
      calls_(opt_.calls != nullptr ? opt_.calls : &KernelSocketCalls()) {}

absl::Status BootstrapIo::TimedOut(absl::string_view what) const {
  std::string when = opt_.idle_limit == absl::InfiniteDuration()
                         ? std::string("in time")
                         : absl::StrCat("within ", absl::FormatDuration(opt_.idle_limit));
  return MakeError(absl::StatusCode::kDeadlineExceeded, ETIMEDOUT,
                   absl::StrCat(opt_.peer, " did not ", what, " ", when), opt_.fix);
}

absl::Status BootstrapIo::Wait(short events, absl::string_view what) {
  const bool idle = opt_.idle_limit != absl::InfiniteDuration();
  const absl::Time until = idle ? absl::Now() + opt_.idle_limit : deadline_;
  for (;;) {
    int64_t left_ms = absl::ToInt64Milliseconds(until - absl::Now());
    if (left_ms <= 0 && until != absl::InfiniteFuture()) return TimedOut(what);
    // Slices of at most a second, so a clock step cannot stretch the wait.
    int slice = until == absl::InfiniteFuture() ? 1000 : static_cast<int>(std::min<int64_t>(left_ms, 1000));
    pollfd pfd{fd_, events, 0};
    int rc = calls_->poll(&pfd, 1, slice);
    if (rc < 0 && errno != EINTR) {
      return ErrnoError(errno, absl::StrCat("poll while waiting for ", opt_.peer, " failed"));
    }
    if (rc > 0) return absl::OkStatus();
  }
}

absl::Status BootstrapIo::Write(const void* data, size_t len, absl::string_view what) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (len > 0) {
    ssize_t n = calls_->send(fd_, p, len, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (absl::Status st = Wait(POLLOUT, what); !st.ok()) return st;
      continue;
    }
    return ErrnoError(n < 0 ? errno : EPIPE, absl::StrCat("sending to ", opt_.peer, " failed"),
                      opt_.fix);
  }
  return absl::OkStatus();
}

absl::Status BootstrapIo::Read(void* data, size_t len, absl::string_view what) {
  auto* p = static_cast<uint8_t*>(data);
  while (len > 0) {
    ssize_t n = calls_->recv(fd_, p, len, 0);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      return MakeError(absl::StatusCode::kUnavailable, ECONNRESET,
                       absl::StrCat(opt_.peer, " closed the connection before it could ", what),
                       opt_.fix);
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (absl::Status st = Wait(POLLIN, what); !st.ok()) return st;
      continue;
    }
    return ErrnoError(errno, absl::StrCat("receiving from ", opt_.peer, " failed"), opt_.fix);
  }
  return absl::OkStatus();
}

absl::Status BootstrapIo::SendFrame(uint32_t type, absl::string_view payload) {
  uint32_t head[2] = {type, static_cast<uint32_t>(payload.size())};
  std::string buf(reinterpret_cast<const char*>(head), sizeof(head));
  buf.append(payload.data(), payload.size());
  return Write(buf.data(), buf.size());
}

absl::StatusOr<std::string> BootstrapIo::RecvFrame(uint32_t type, size_t max_len) {
  uint32_t head[2];
  if (absl::Status st = Read(head, sizeof(head), "send its handshake"); !st.ok()) return st;
  if (head[0] != type || head[1] > max_len) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EPROTO,
                     absl::StrCat("malformed handshake frame from ", opt_.peer, " (type ", head[0],
                                  ", ", head[1], " bytes; expected type ", type, ", at most ",
                                  max_len, " bytes)"),
                     opt_.fix);
  }
  std::string payload(head[1], '\0');
  if (absl::Status st = Read(payload.data(), payload.size(), "send its handshake"); !st.ok()) {
    return st;
  }
  return payload;
}

}  // namespace zsock
