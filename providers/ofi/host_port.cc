// "IP:PORT" addresses to and from sockaddr_storage.
#include "providers/ofi/host_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include "absl/strings/str_cat.h"
#include "core/sockaddr.h"

namespace zsock::ofi {

absl::StatusOr<sockaddr_storage> ParseHostPort(absl::string_view address, socklen_t* len) {
  auto a = ParseSocketAddress(address);
  if (!a.ok()) return a.status();
  *len = a->len;
  return a->storage;
}

std::string FormatHostPort(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    return absl::StrCat("[", host, "]:", ntohs(a->sin6_port));
  }
  auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
  inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
  return absl::StrCat(host, ":", ntohs(a->sin_port));
}

}  // namespace zsock::ofi
