// IoAll: a blocking exchange of a fixed number of bytes on a connection's
// out-of-band TCP socket, bounded by a deadline, with errors that say
// which side of a handshake went wrong. The RDM connection set-up sends
// and receives its hello this way (rdm_connect.cc).
#ifndef ZSOCK_PROVIDERS_OFI_BOOTSTRAP_IO_H_
#define ZSOCK_PROVIDERS_OFI_BOOTSTRAP_IO_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace zsock::ofi {

// Sends (`write`) or receives all `len` bytes at `buf` on `fd` by
// `deadline`: DeadlineExceeded after it, Unavailable if the peer closed.
absl::Status IoAll(int fd, void* buf, size_t len, bool write, absl::Time deadline);

}  // namespace zsock::ofi

#endif  // ZSOCK_PROVIDERS_OFI_BOOTSTRAP_IO_H_
