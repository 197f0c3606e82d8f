// Exact-length I/O on a stream socket with a time limit, for the exchanges
// that set a connection up (a provider's handshake over TCP or a Unix
// socket) and for benchmarks' own traffic.
//
// Each call moves all of its bytes or fails with a Status that names the
// peer, the exchange and what to check: DeadlineExceeded when the limit
// passes, Unavailable (ECONNRESET) when the peer closes mid-exchange, the
// errno of any other failure. EINTR and EAGAIN are retried. The limits
// hold on a non-blocking socket; on a blocking one a read or write waits
// in the kernel, past them, so pass a blocking socket only with no limit. The limit is either one deadline for the whole
// exchange or, with an idle limit, a bound on each wait for the peer (a
// long transfer that keeps moving is never cut short).
//
// The calls go through SocketCalls so that code measuring another sockets
// implementation (zsock's zs_* calls) uses the same loop. Read and Write
// are inline and a BootstrapIo is a few words: a benchmark may build one
// per message on its timed path.
#ifndef ZSOCK_CORE_BOOTSTRAP_IO_H_
#define ZSOCK_CORE_BOOTSTRAP_IO_H_

#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace zsock {

// The socket calls BootstrapIo makes; KernelSocketCalls() are libc's.
struct SocketCalls {
  ssize_t (*send)(int fd, const void* buf, size_t len, int flags);
  ssize_t (*recv)(int fd, void* buf, size_t len, int flags);
  int (*poll)(pollfd* fds, nfds_t n, int timeout_ms);
};
const SocketCalls& KernelSocketCalls();

class BootstrapIo {
 public:
  // Views of strings the caller keeps (usually literals).
  struct Options {
    // Names the peer in errors: "the ucx peer".
    absl::string_view peer = "the peer";
    // What the user should check when the peer closes or stalls.
    absl::string_view fix = "check the peer's log";
    // Set: each wait for the peer may last this long (the deadline is
    // ignored). Unset: the whole exchange ends at the deadline.
    absl::Duration idle_limit = absl::InfiniteDuration();
    const SocketCalls* calls = nullptr;  // null: KernelSocketCalls()
  };

  BootstrapIo(int fd, absl::Time deadline, const Options& options)
      : fd_(fd), deadline_(deadline), opt_(options),
        calls_(options.calls != nullptr ? options.calls : &KernelSocketCalls()) {}

  int fd() const { return fd_; }

  // `what` names the exchange in errors: "the handshake", "ping".
  // Waits until `events` (POLLIN / POLLOUT) are ready.
  absl::Status Wait(short events, absl::string_view what);
  absl::Status Write(const void* data, size_t len, absl::string_view what = "the handshake") {
    const auto* p = static_cast<const uint8_t*>(data);
    while (len > 0) {
      ssize_t n = calls_->send(fd_, p, len, MSG_NOSIGNAL);
      if (ABSL_PREDICT_TRUE(n > 0)) {
        p += n;
        len -= static_cast<size_t>(n);
      } else if (absl::Status st = AfterShortIo(n, POLLOUT, what); !st.ok()) {
        return st;
      }
    }
    return absl::OkStatus();
  }
  absl::Status Read(void* data, size_t len, absl::string_view what = "the handshake") {
    auto* p = static_cast<uint8_t*>(data);
    while (len > 0) {
      ssize_t n = calls_->recv(fd_, p, len, 0);
      if (ABSL_PREDICT_TRUE(n > 0)) {
        p += n;
        len -= static_cast<size_t>(n);
      } else if (absl::Status st = AfterShortIo(n, POLLIN, what); !st.ok()) {
        return st;
      }
    }
    return absl::OkStatus();
  }

  // Framed messages: u32 type | u32 length | payload, in host order (both
  // ends of a bootstrap run on one kind of machine). A frame of another
  // type or longer than `max_len` is an EPROTO error.
  absl::Status SendFrame(uint32_t type, absl::string_view payload);
  absl::StatusOr<std::string> RecvFrame(uint32_t type, size_t max_len);

 private:
  // After a send or recv that moved nothing (`n` <= 0; `events` says
  // which): OK to try again (EINTR, or the socket became ready), else the
  // error that ends the exchange.
  absl::Status AfterShortIo(ssize_t n, short events, absl::string_view what);

  int fd_;
  absl::Time deadline_;
  Options opt_;
  const SocketCalls* calls_;
};

}  // namespace zsock

#endif  // ZSOCK_CORE_BOOTSTRAP_IO_H_
