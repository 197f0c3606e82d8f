// Socket addresses as provider address strings: "IPv4:PORT" and
// "[IPv6]:PORT". Every provider accepts these in Listen/Connect (port 0 in
// Listen picks a free port), so the sockets layer maps sockaddr_in/in6 onto
// any provider the same way (docs/provider-interface.md, "Addresses").
#ifndef ZSOCK_CORE_SOCKADDR_H_
#define ZSOCK_CORE_SOCKADDR_H_

#include <sys/socket.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zsock {

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t len = 0;

  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  int family() const { return storage.ss_family; }
  uint16_t port() const;
  void set_port(uint16_t port);
  // "127.0.0.1:5000", "[::1]:5000".
  std::string ToString() const;
  bool is_wildcard() const;  // 0.0.0.0 or ::
  bool is_loopback() const;  // 127/8 or ::1

  static absl::StatusOr<SocketAddress> FromSockaddr(const sockaddr* sa, socklen_t len);
};

// Parses "IP:PORT" / "[IPv6]:PORT" (numeric only). An empty host means
// 127.0.0.1.
absl::StatusOr<SocketAddress> ParseSocketAddress(absl::string_view text);

// Whether `addr` is an address of this host (in the caller's network
// namespace): loopback, wildcard, or assigned to an interface.
bool IsLocalAddress(const SocketAddress& addr);

// The address a bound socket has (getsockname), as a string; "" on error.
std::string BoundAddress(int fd);

}  // namespace zsock

#endif  // ZSOCK_CORE_SOCKADDR_H_
