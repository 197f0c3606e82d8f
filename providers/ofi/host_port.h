// "IP:PORT" / "[IPv6]:PORT" addresses in the sockaddr_storage form the
// socket and libfabric calls take, and back (core/sockaddr.h parses).
#ifndef ZSOCK_PROVIDERS_OFI_HOST_PORT_H_
#define ZSOCK_PROVIDERS_OFI_HOST_PORT_H_

#include <sys/socket.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zsock::ofi {

// Parses `address`; `*len` gets the length of the address it holds.
absl::StatusOr<sockaddr_storage> ParseHostPort(absl::string_view address, socklen_t* len);
std::string FormatHostPort(const sockaddr_storage& ss);

}  // namespace zsock::ofi

#endif  // ZSOCK_PROVIDERS_OFI_HOST_PORT_H_
