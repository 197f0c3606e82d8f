// Socket-address parsing and formatting shared by providers and sockets/.
#include "core/sockaddr.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace zsock {

uint16_t SocketAddress::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

void SocketAddress::set_port(uint16_t port) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(port);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(port);
}

std::string SocketAddress::ToString() const {
  char host[INET6_ADDRSTRLEN] = "?";
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, host, sizeof(host));
    return absl::StrCat(host, ":", port());
  }
  if (family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, host,
              sizeof(host));
    return absl::StrCat("[", host, "]:", port());
  }
  return "";
}

bool SocketAddress::is_wildcard() const {
  if (family() == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr == htonl(INADDR_ANY);
  }
  if (family() == AF_INET6) {
    return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr);
  }
  return false;
}

bool SocketAddress::is_loopback() const {
  if (family() == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr) >> 24) == 127;
  }
  if (family() == AF_INET6) {
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr);
  }
  return false;
}

absl::StatusOr<SocketAddress> SocketAddress::FromSockaddr(const sockaddr* sa, socklen_t len) {
  SocketAddress out;
  if (sa == nullptr) {
    return MakeError(absl::StatusCode::kInvalidArgument, EFAULT, "null socket address");
  }
  if (sa->sa_family == AF_INET && len >= sizeof(sockaddr_in)) {
    out.len = sizeof(sockaddr_in);
  } else if (sa->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
    out.len = sizeof(sockaddr_in6);
  } else {
    return MakeError(absl::StatusCode::kInvalidArgument,
                     sa->sa_family == AF_INET || sa->sa_family == AF_INET6 ? EINVAL : EAFNOSUPPORT,
                     absl::StrCat("socket address of family ", sa->sa_family, " and length ", len,
                                  " is not an IPv4 or IPv6 address"),
                     "pass a sockaddr_in or sockaddr_in6 with its size");
  }
  std::memcpy(&out.storage, sa, out.len);
  return out;
}

absl::StatusOr<SocketAddress> ParseSocketAddress(absl::string_view text) {
  std::string host(text), port = "0";
  if (!text.empty() && text[0] == '[') {
    auto close = text.find(']');
    if (close == absl::string_view::npos) {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       absl::StrCat("bad socket address '", text, "'"),
                       "write IP:PORT or [IPv6]:PORT");
    }
    host = std::string(text.substr(1, close - 1));
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') {
        return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                         absl::StrCat("bad socket address '", text, "'"),
                         "write [IPv6]:PORT");
      }
      port = std::string(text.substr(close + 2));
    }
  } else if (auto colon = text.rfind(':'); colon != absl::string_view::npos) {
    host = std::string(text.substr(0, colon));
    port = std::string(text.substr(colon + 1));
  }
  if (host.empty()) host = "127.0.0.1";
  uint32_t port_num = 0;
  if (!absl::SimpleAtoi(port, &port_num) || port_num > 65535) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("bad port in socket address '", text, "'"),
                     "write IP:PORT with a port from 0 to 65535");
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("bad socket address '", text, "': ", gai_strerror(rc)),
                     "write a numeric IP:PORT, e.g. 127.0.0.1:5000 or [::1]:5000");
  }
  SocketAddress out;
  std::memcpy(&out.storage, res->ai_addr, res->ai_addrlen);
  out.len = res->ai_addrlen;
  freeaddrinfo(res);
  return out;
}

bool IsLocalAddress(const SocketAddress& addr) {
  if (addr.is_loopback() || addr.is_wildcard()) return true;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* i = list; i != nullptr && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != addr.family()) continue;
    if (addr.family() == AF_INET) {
      found = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr ==
              reinterpret_cast<const sockaddr_in*>(&addr.storage)->sin_addr.s_addr;
    } else {
      found = std::memcmp(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                          &reinterpret_cast<const sockaddr_in6*>(&addr.storage)->sin6_addr,
                          sizeof(in6_addr)) == 0;
    }
  }
  freeifaddrs(list);
  return found;
}

std::string BoundAddress(int fd) {
  SocketAddress a;
  a.len = sizeof(a.storage);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a.storage), &a.len) != 0) return "";
  return a.ToString();
}

}  // namespace zsock
