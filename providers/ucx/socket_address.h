// The TCP addresses of ucx listeners and connections (the handshake's
// socket): parsing the address a user gives, and naming a socket's ends in
// endpoint info.
#ifndef ZSOCK_PROVIDERS_UCX_SOCKET_ADDRESS_H_
#define ZSOCK_PROVIDERS_UCX_SOCKET_ADDRESS_H_

#include <sys/socket.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zsock::ucx {

// "IP:PORT" or "[IPv6]:PORT"; "?" for another family.
std::string FormatAddress(const sockaddr_storage& ss);

// The local (peer = false) or remote end of socket `fd`, formatted; "?" on error.
std::string SocketAddress(int fd, bool peer);

// Parses "IP:PORT", "[IPv6]:PORT" or "host:PORT"; *len is the address's length.
absl::StatusOr<sockaddr_storage> ParseAddress(absl::string_view address, socklen_t* len);

}  // namespace zsock::ucx

#endif  // ZSOCK_PROVIDERS_UCX_SOCKET_ADDRESS_H_
