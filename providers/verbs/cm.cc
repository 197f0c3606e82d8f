// The verbs provider's librdmacm and address helpers (see cm.h).
#include "providers/verbs/cm.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status.h"

namespace zsock::verbs {

absl::Status VerbsErrno(int err, absl::string_view call, absl::string_view fix) {
  return ErrnoError(err, absl::StrCat(call, " failed"), fix);
}

absl::StatusOr<sockaddr_storage> ToSockaddr(const HostPort& hp) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port = absl::StrCat(hp.port);
  int rc = ::getaddrinfo(hp.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("bad verbs address ", hp.host, ": ", gai_strerror(rc)),
                     "write a numeric IP:PORT");
  }
  sockaddr_storage ss{};
  std::memcpy(&ss, res->ai_addr, res->ai_addrlen);
  ::freeaddrinfo(res);
  return ss;
}

std::string AddressOf(sockaddr* sa) {
  if (sa == nullptr) return "?";
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    return FormatHostPort(buf, ntohs(a->sin6_port));
  }
  auto* a = reinterpret_cast<sockaddr_in*>(sa);
  inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
  return FormatHostPort(buf, ntohs(a->sin_port));
}

void SetNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

absl::Status NewCmId(rdma_event_channel** ch, rdma_cm_id** id) {
  *ch = rdma_create_event_channel();
  if (*ch == nullptr) return VerbsErrno(errno, "rdma_create_event_channel", "raise the fd limit");
  SetNonBlocking((*ch)->fd);
  *id = nullptr;
  if (rdma_create_id(*ch, id, nullptr, RDMA_PS_TCP) != 0) {
    int err = errno;
    rdma_destroy_event_channel(*ch);
    return VerbsErrno(err, "rdma_create_id");
  }
  return absl::OkStatus();
}

// Waits for the next CM event on `ch` until `deadline`.
absl::StatusOr<rdma_cm_event*> NextCmEvent(rdma_event_channel* ch, absl::Time deadline,
                                           absl::string_view what) {
  for (;;) {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(ch, &ev) == 0) return ev;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return VerbsErrno(errno, "rdma_get_cm_event");
    }
    int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) {
      return MakeError(absl::StatusCode::kDeadlineExceeded, ETIMEDOUT,
                       absl::StrCat("timed out waiting for ", what),
                       "check that the peer runs and that the address is reachable over RDMA");
    }
    pollfd pfd{ch->fd, POLLIN, 0};
    ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
  }
}

// Waits for a specific event; anything else is an error naming it.
absl::Status ExpectCmEvent(rdma_event_channel* ch, rdma_cm_event_type want, absl::Time deadline,
                           absl::string_view what, std::string* private_data) {
  auto ev = NextCmEvent(ch, deadline, what);
  if (!ev.ok()) return ev.status();
  rdma_cm_event_type got = (*ev)->event;
  int status = (*ev)->status;
  if (got == want && private_data != nullptr && (*ev)->param.conn.private_data != nullptr) {
    private_data->assign(static_cast<const char*>((*ev)->param.conn.private_data),
                         (*ev)->param.conn.private_data_len);
  }
  std::string reject;
  if (got == RDMA_CM_EVENT_REJECTED && (*ev)->param.conn.private_data_len > 0) {
    reject = " (the peer refused the connection)";
  }
  rdma_ack_cm_event(*ev);
  if (got == want) return absl::OkStatus();
  const char* fix = "check the address, that the peer listens there, and the fabric (`ibstat`, `rdma link`)";
  absl::StatusCode code = absl::StatusCode::kUnavailable;
  int err = status < 0 ? -status : (status > 0 && status < 256 ? status : EHOSTUNREACH);
  if (got == RDMA_CM_EVENT_REJECTED) {
    err = ECONNREFUSED;
    fix = "start a listener at that address (rdma_cm rejects connections to a port nobody listens on)";
  }
  return MakeError(code, err,
                   absl::StrCat(what, ": got ", rdma_event_str(got), " instead of ",
                                rdma_event_str(want), reject),
                   fix);
}

}  // namespace zsock::verbs
