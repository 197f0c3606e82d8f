// Blocking-with-deadline I/O on a non-blocking socket: what the connection
// handshake reads and writes. Every provider with a socket bootstrap has
// these three; they are kept apart here so that one shared core helper can
// replace them.
#ifndef ZSOCK_PROVIDERS_UCX_BOOTSTRAP_IO_H_
#define ZSOCK_PROVIDERS_UCX_BOOTSTRAP_IO_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace zsock::ucx {

// Waits until `fd` has `events` (poll(2) flags); DeadlineExceeded naming
// what the peer did not `what` ("send its handshake") once `deadline` passes.
absl::Status WaitFd(int fd, short events, absl::Time deadline, const char* what);

// Writes / reads exactly `len` bytes, waiting for the socket up to `deadline`.
absl::Status WriteAll(int fd, const void* data, size_t len, absl::Time deadline);
absl::Status ReadAll(int fd, void* data, size_t len, absl::Time deadline);

}  // namespace zsock::ucx

#endif  // ZSOCK_PROVIDERS_UCX_BOOTSTRAP_IO_H_
