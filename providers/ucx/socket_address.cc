// Parsing and formatting the handshake socket's addresses.
#include "providers/ucx/socket_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace zsock::ucx {

std::string FormatAddress(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return absl::StrCat(host, ":", ntohs(in->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    return absl::StrCat("[", host, "]:", ntohs(in6->sin6_port));
  }
  return "?";
}

std::string SocketAddress(int fd, bool peer) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  int rc = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len)
                : ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  return rc == 0 ? FormatAddress(ss) : std::string("?");
}

absl::StatusOr<sockaddr_storage> ParseAddress(absl::string_view address, socklen_t* len) {
  std::string host, port;
  if (absl::StartsWith(address, "[")) {
    size_t close = address.find("]:");
    if (close == absl::string_view::npos) {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       absl::StrCat("ucx address '", address, "' is not [IPv6]:PORT"),
                       "write e.g. [::1]:5000");
    }
    host = std::string(address.substr(1, close - 1));
    port = std::string(address.substr(close + 2));
  } else {
    size_t colon = address.rfind(':');
    if (colon == absl::string_view::npos || colon == 0) {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       absl::StrCat("ucx address '", address, "' is not IP:PORT"),
                       "write e.g. 127.0.0.1:5000 (or \"\" to listen on a free loopback port)");
    }
    host = std::string(address.substr(0, colon));
    port = std::string(address.substr(colon + 1));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("cannot resolve ucx address '", address, "': ", gai_strerror(rc)),
                     "use a numeric IP address and port, e.g. 127.0.0.1:5000");
  }
  sockaddr_storage ss{};
  std::memcpy(&ss, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  ::freeaddrinfo(res);
  return ss;
}

}  // namespace zsock::ucx
