// Exact-length I/O on a stream socket with a time limit, for the exchanges
// that set a connection up (a provider's handshake over TCP or a Unix
// socket, a benchmark's control messages).
//
// Each call moves all of its bytes or fails with a Status that names the
// peer and what to check: DeadlineExceeded when the limit passes,
// Unavailable (ECONNRESET) when the peer closes mid-exchange, the errno of
// any other failure. The socket may be blocking or not; EINTR and EAGAIN
// are retried. The limit is either one deadline for the whole exchange or,
// with an idle limit, a bound on each wait for the peer (a long transfer
// that keeps moving is never cut short).
//
// The calls go through SocketCalls so that code measuring another sockets
// implementation (zsock's zs_* calls) can use the same loop.
#ifndef ZSOCK_CORE_BOOTSTRAP_IO_H_
#define ZSOCK_CORE_BOOTSTRAP_IO_H_

#include <poll.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

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
  struct Options {
    // Names the peer in errors: "the ucx peer".
    std::string peer = "the peer";
    // What the user should check when the peer closes or stalls.
    std::string fix = "check the peer's log";
    // Set: each wait for the peer may last this long (the deadline is
    // ignored). Unset: the whole exchange ends at the deadline.
    absl::Duration idle_limit = absl::InfiniteDuration();
    const SocketCalls* calls = nullptr;  // null: KernelSocketCalls()
  };

  BootstrapIo(int fd, absl::Time deadline, Options options);

  int fd() const { return fd_; }
  absl::Time deadline() const { return deadline_; }

  // Waits until `events` (POLLIN / POLLOUT) are ready. `what` completes
  // "<peer> did not <what> in time".
  absl::Status Wait(short events, absl::string_view what);
  absl::Status Write(const void* data, size_t len, absl::string_view what = "read our data");
  absl::Status Read(void* data, size_t len, absl::string_view what = "send its data");

  // Framed messages: u32 type | u32 length | payload, in host order (both
  // ends run on one kind of machine or agree on little-endian). A frame of
  // another type or longer than `max_len` is an EPROTO error.
  absl::Status SendFrame(uint32_t type, absl::string_view payload);
  absl::StatusOr<std::string> RecvFrame(uint32_t type, size_t max_len);

 private:
  absl::Status TimedOut(absl::string_view what) const;

  int fd_;
  absl::Time deadline_;
  Options opt_;
  const SocketCalls* calls_;
};

}  // namespace zsock

#endif  // ZSOCK_CORE_BOOTSTRAP_IO_H_
