// zsock_test, the calls: BSD call semantics, refused connects, a
// non-blocking accept beside a stalled handshake, and the socket table's
// per-thread cache (zsock_test_util.h has the harness).
#include "sockets/zsock_test_util.h"

#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "sockets/zsock.h"

namespace zsock::sockets_test {
namespace {

// The server side of CallSemantics: a second listener on its port is
// refused; then peeks, reads, meets EAGAIN and the peer's half-close on
// the accepted socket, and writes after it.
int CallSemanticsServer(int l) {
  int dup = zs_socket(AF_INET, SOCK_STREAM, 0);
  CHECK_C(dup >= 0);
  sockaddr_in mine{};
  socklen_t len = sizeof(mine);
  CHECK_C(zs_getsockname(l, reinterpret_cast<sockaddr*>(&mine), &len) == 0);
  CHECK_C(zs_bind(dup, reinterpret_cast<sockaddr*>(&mine), sizeof(mine)) != 0 ||
          zs_listen(dup, 1) != 0);
  CHECK_C(errno == EADDRINUSE);
  CHECK_C(zs_close(dup) == 0);
  int one = 1;
  CHECK_C(zs_getsockopt(l, SOL_SOCKET, SO_ACCEPTCONN, &one, &len) == 0 && one == 1);

  sockaddr_in peer{};
  len = sizeof(peer);
  int fd = zs_accept4(l, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC);
  CHECK_C(fd >= 0);
  CHECK_C(len == sizeof(sockaddr_in) && peer.sin_family == AF_INET);
  CHECK_C(fcntl(fd, F_GETFD) & FD_CLOEXEC);
  // MSG_PEEK leaves the bytes; MSG_WAITALL waits for all of them.
  char buf[64] = {};
  CHECK_C(zs_recv(fd, buf, 5, MSG_PEEK | MSG_WAITALL) == 5);
  CHECK_C(std::memcmp(buf, "hello", 5) == 0);
  CHECK_C(zs_recv(fd, buf, 11, MSG_WAITALL) == 11);
  CHECK_C(std::memcmp(buf, "hello world", 11) == 0);
  // Non-blocking: nothing there -> EAGAIN, and the fd is not readable.
  CHECK_C(zs_fcntl(fd, F_SETFL, zs_fcntl(fd, F_GETFL) | O_NONBLOCK) == 0);
  CHECK_C(zs_fcntl(fd, F_GETFL) & O_NONBLOCK);
  CHECK_C(zs_recv(fd, buf, sizeof(buf), 0) == -1 && errno == EAGAIN);
  pollfd pf{fd, POLLIN, 0};
  CHECK_C(::poll(&pf, 1, 0) == 0);
  // Only now may the client send the rest: it waits for this byte (a
  // fixed pause there would race with a slow run of the lines above).
  WriteAll(fd, reinterpret_cast<const uint8_t*>("g"), 1);
  // The peer's half-close: data first, then 0, and POLLRDHUP.
  pf.events = POLLIN | POLLRDHUP;
  CHECK_C(::poll(&pf, 1, 30000) == 1);
  CHECK_C(zs_fcntl(fd, F_SETFL, 0) == 0);
  CHECK_C(zs_recv(fd, buf, 4, MSG_WAITALL) == 4 && std::memcmp(buf, "last", 4) == 0);
  // The connection's counters: the 15 bytes received, the 1 sent.
  zs_stats st{};
  socklen_t slen = sizeof(st);
  CHECK_C(zs_getsockopt(fd, SOL_ZSOCK, ZSOCK_SO_STATS, &st, &slen) == 0 && slen == sizeof(st));
  CHECK_C(st.bytes_recv_bcopy == 15 && st.bytes_sent_bcopy == 1 && st.messages_received >= 3);
  CHECK_C(zs_recv(fd, buf, sizeof(buf), 0) == 0);
  CHECK_C(zs_recv(fd, buf, sizeof(buf), 0) == 0);
  // We can still write after the peer's SHUT_WR.
  WriteAll(fd, reinterpret_cast<const uint8_t*>("reply"), 5);
  CHECK_C(zs_close(fd) == 0);
  CHECK_C(zs_close(l) == 0);
  return 0;
}

// Connects an unconnected socket (ENOTCONN before, EISCONN after) and
// checks both addresses.
void ConnectAndCheckAddresses(int fd, uint16_t port) {
  CHECK_C(zs_is_zsock(fd) == 1);
  char c;
  CHECK_C(zs_recv(fd, &c, 1, 0) == -1 && errno == ENOTCONN);
  zs_stats st{};
  socklen_t slen = sizeof(st);
  CHECK_C(zs_getsockopt(fd, SOL_ZSOCK, ZSOCK_SO_STATS, &st, &slen) == -1 && errno == ENOTCONN);
  sockaddr_in a = Loopback(port);
  CHECK_C(zs_connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  CHECK_C(zs_connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == -1 && errno == EISCONN);
  sockaddr_in peer{}, self{};
  socklen_t len = sizeof(peer);
  CHECK_C(zs_getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) == 0);
  CHECK_C(peer.sin_port == htons(port) && peer.sin_addr.s_addr == htonl(INADDR_LOOPBACK));
  len = sizeof(self);
  CHECK_C(zs_getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len) == 0);
  CHECK_C(self.sin_family == AF_INET);
}

// TCP_NODELAY, ZSOCK_SO_AUTOCORK, SO_ERROR and an unknown option.
void CheckOptions(int fd) {
  int v = 1, err = -1;
  CHECK_C(zs_setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, sizeof(v)) == 0);
  // Autocork: on by default (configuration key autocork), 0 or 1.
  int ac = -1;
  socklen_t len = sizeof(ac);
  CHECK_C(zs_getsockopt(fd, SOL_ZSOCK, ZSOCK_SO_AUTOCORK, &ac, &len) == 0 && ac == 1);
  v = 2;
  CHECK_C(zs_setsockopt(fd, SOL_ZSOCK, ZSOCK_SO_AUTOCORK, &v, sizeof(v)) == -1 &&
          errno == EINVAL);
  v = 0;
  CHECK_C(zs_setsockopt(fd, SOL_ZSOCK, ZSOCK_SO_AUTOCORK, &v, sizeof(v)) == 0);
  CHECK_C(zs_getsockopt(fd, SOL_ZSOCK, ZSOCK_SO_AUTOCORK, &ac, &len) == 0 && ac == 0);
  v = 1;
  CHECK_C(zs_setsockopt(fd, SOL_ZSOCK, ZSOCK_SO_AUTOCORK, &v, sizeof(v)) == 0);
  CHECK_C(zs_getsockopt(fd, SOL_ZSOCK, ZSOCK_SO_AUTOCORK, &ac, &len) == 0 && ac == 1);
  len = sizeof(err);
  CHECK_C(zs_getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0);
  CHECK_C(zs_setsockopt(fd, SOL_SOCKET, 12345, &v, sizeof(v)) == -1 && errno == ENOPROTOOPT);
}

// After shutdown(SHUT_WR) a send fails with EPIPE. Without MSG_NOSIGNAL
// it raises SIGPIPE, as send(2) on TCP does, and the handler may call zs_*
// itself (here on the same fd).
void CheckSendAfterShutdown(int fd) {
  CHECK_C(zs_shutdown(fd, SHUT_WR) == 0);
  CHECK_C(zs_send(fd, "x", 1, MSG_NOSIGNAL) == -1 && errno == EPIPE);
  static std::atomic<int> sigpipes{0};
  static int pipe_fd = -1;
  pipe_fd = fd;
  struct sigaction sa{}, old{};
  sa.sa_handler = [](int) {
    const int saved = errno;
    sigpipes++;
    (void)zs_send(pipe_fd, "y", 1, MSG_NOSIGNAL);
    errno = saved;
  };
  CHECK_C(sigaction(SIGPIPE, &sa, &old) == 0);
  CHECK_C(zs_send(fd, "x", 1, 0) == -1 && errno == EPIPE);
  CHECK_C(sigpipes.load() == 1);
  CHECK_C(sigaction(SIGPIPE, &old, nullptr) == 0);
}

// Counters after the exchange: 15 bytes sent (not the refused sends), 6
// received ("g" and "reply"); a shorter struct gets the prefix; the option
// is read-only.
void CheckStatsAfterExchange(int fd) {
  zs_stats st{};
  socklen_t slen = sizeof(st);
  CHECK_C(zs_getsockopt(fd, SOL_ZSOCK, ZSOCK_SO_STATS, &st, &slen) == 0 && slen == sizeof(st));
  CHECK_C(st.bytes_sent_bcopy == 15 && st.bytes_recv_bcopy == 6 && st.messages_sent >= 3);
  uint64_t first = 0;
  slen = sizeof(first);
  CHECK_C(zs_getsockopt(fd, SOL_ZSOCK, ZSOCK_SO_STATS, &first, &slen) == 0 &&
          slen == sizeof(first) && first == 15);
  CHECK_C(zs_setsockopt(fd, SOL_ZSOCK, ZSOCK_SO_STATS, &st, sizeof(st)) == -1 &&
          errno == ENOPROTOOPT);
}

// Calls on a closed or unknown fd go to libc. The closed number may be
// reused at any moment by a library thread: ucx opens pipes (libc then
// says ENOTSOCK) and, over tcp, sockets of its own (EPIPE or ENOTCONN, or
// a send). The send is empty, so that one landing on such a socket
// changes nothing.
void CheckClosedNumberGoesToLibc(int fd) {
  CHECK_C(zs_is_zsock(fd) == 0);
  if (fcntl(fd, F_GETFD) == -1) {
    const int rc = zs_send(fd, "x", 0, MSG_NOSIGNAL);
    const int err = errno;
    CHECK_C((rc == -1 && err == EBADF) || fcntl(fd, F_GETFD) != -1);
  }
  constexpr int kNeverOpened = 987654;
  CHECK_C(zs_send(kNeverOpened, "x", 1, MSG_NOSIGNAL) == -1 && errno == EBADF);
}

// The client side of CallSemantics.
int CallSemanticsClient(uint16_t port) {
  int fd = zs_socket(AF_INET, SOCK_STREAM, 0);
  CHECK_C(fd >= 0);
  ConnectAndCheckAddresses(fd, port);
  CheckOptions(fd);
  // Two writes, one peeked and read whole by the server.
  WriteAll(fd, reinterpret_cast<const uint8_t*>("hello"), 5);
  iovec iov[2] = {{const_cast<char*>(" wor"), 4}, {const_cast<char*>("ld"), 2}};
  CHECK_C(zs_writev(fd, iov, 2) == 6);
  // The server checks that nothing more is there, then says go.
  char go = 0;
  CHECK_C(zs_recv(fd, &go, 1, MSG_WAITALL) == 1 && go == 'g');
  WriteAll(fd, reinterpret_cast<const uint8_t*>("last"), 4);
  CheckSendAfterShutdown(fd);
  char buf[8] = {};
  CHECK_C(zs_recv(fd, buf, 5, MSG_WAITALL) == 5 && std::memcmp(buf, "reply", 5) == 0);
  CheckStatsAfterExchange(fd);
  CHECK_C(zs_recv(fd, buf, sizeof(buf), 0) == 0);
  CHECK_C(zs_close(fd) == 0);
  CheckClosedNumberGoesToLibc(fd);
  return 0;
}

// BSD call semantics a sockets program relies on.
TEST_P(Sockets, CallSemantics) { RunPair(CallSemanticsServer, CallSemanticsClient); }

// Connecting where nobody listens: ECONNREFUSED, directly or through
// EINPROGRESS + SO_ERROR for a non-blocking socket.
TEST_P(Sockets, ConnectRefused) {
  RunPair(
      [&](int l) {
        CHECK_C(zs_close(l) == 0);  // frees the port
        return 0;
      },
      [&](uint16_t port) {
        usleep(100000);  // the server closed its listener
        int fd = zs_socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        CHECK_C(fd >= 0);
        sockaddr_in a = Loopback(port);
        int rc = zs_connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
        if (rc == -1 && errno == EINPROGRESS) {
          pollfd pf{fd, POLLOUT, 0};
          CHECK_C(::poll(&pf, 1, 60000) == 1);
          int err = 0;
          socklen_t len = sizeof(err);
          CHECK_C(zs_getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0);
          if (err != ECONNREFUSED) {
            errno = err;
            Die(__LINE__, "SO_ERROR is not ECONNREFUSED");
          }
        } else {
          CHECK_C(rc == -1 && errno == ECONNREFUSED);
        }
        CHECK_C(zs_close(fd) == 0);
        return 0;
      });
}

// A client that opens the provider-level connection and then says nothing
// (a stalled or hostile handshake). Knows where each provider listens:
// unet on an abstract Unix SEQPACKET socket named after the port, ofi's RDM
// bootstrap and ucx on the TCP port itself (ucx starts no handshake for a
// silent TCP client, so there it stalls nothing). Returns -1 if neither
// connects.
int StallConnect(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = Loopback(port);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return fd;
  if (fd >= 0) ::close(fd);
  fd = ::socket(AF_UNIX, SOCK_SEQPACKET, 0);
  sockaddr_un u{};
  u.sun_family = AF_UNIX;
  std::string name = "zsock-unet/port/" + std::to_string(port);
  std::memcpy(u.sun_path + 1, name.data(), name.size());
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&u), len) == 0) return fd;
  if (fd >= 0) ::close(fd);
  return -1;
}

// accept(2) on a non-blocking listener never waits: handshakes finish in
// the background, and a client that stalls its handshake delays no accept
// call (it is dropped after the server's connect_timeout_ms; the clients
// behind it are accepted then: handshakes run one at a time).
TEST_P(Sockets, NonblockingAcceptNeverWaitsForAHandshake) {
  connect_timeout_ms_ = "1500";
  RunPair(
      [&](int l) {
        CHECK_C(zs_fcntl(l, F_SETFL, zs_fcntl(l, F_GETFL) | O_NONBLOCK) == 0);
        // Nothing finished: EAGAIN at once, and the fd is not readable.
        absl::Time t0 = absl::Now();
        CHECK_C(zs_accept(l, nullptr, nullptr) == -1 && errno == EAGAIN);
        CHECK_C(absl::Now() - t0 < absl::Seconds(1));
        pollfd pf{l, POLLIN | POLLOUT, 0};
        CHECK_C(::poll(&pf, 1, 0) == 0);  // neither readable nor writable
        int fd = -1;
        while (fd < 0) {
          pf = pollfd{l, POLLIN, 0};
          CHECK_C(::poll(&pf, 1, 30000) == 1);
          t0 = absl::Now();
          fd = zs_accept(l, nullptr, nullptr);
          CHECK_C(absl::Now() - t0 < absl::Seconds(1));  // the call itself never waits
          CHECK_C(fd >= 0 || errno == EAGAIN);
        }
        // It is the real client, and the queue is empty again.
        char c = 0;
        CHECK_C(zs_recv(fd, &c, 1, MSG_WAITALL) == 1 && c == 'x');
        CHECK_C(zs_send(fd, &c, 1, 0) == 1);
        CHECK_C(zs_accept(l, nullptr, nullptr) == -1 && errno == EAGAIN);
        CHECK_C(zs_close(fd) == 0);
        CHECK_C(zs_close(l) == 0);
        return 0;
      },
      [&](uint16_t port) {
        // This client waits longer than the server gives the stalled one.
        setenv("ZSOCK_CONNECT_TIMEOUT_MS", "60000", 1);
        int stalled = StallConnect(port);  // first in the listener's queue
        usleep(100000);
        int fd = ConnectTo(port);
        char c = 'x';
        CHECK_C(zs_send(fd, &c, 1, 0) == 1);
        CHECK_C(zs_recv(fd, &c, 1, MSG_WAITALL) == 1 && c == 'x');
        CHECK_C(zs_close(fd) == 0);
        if (stalled >= 0) ::close(stalled);
        return 0;
      });
}

// Each thread remembers its last socket lookups by fd number: a number that
// another thread closed and that now names a kernel fd (or another zsock
// socket) must reach its new owner from every thread, not the old socket.
// In a child: the sockets layer's engine must not be created in the test
// process, whose later tests fork (an engine does not survive fork).
TEST(SocketTable, AClosedNumberReachesItsNewOwnerFromEveryThread) {
  pid_t child = Fork([] {
    int fd = zs_socket(AF_INET, SOCK_STREAM, 0);
    CHECK_C(fd >= 0);
    std::atomic<int> step{0};
    std::atomic<int> seen_before{-1}, seen_after{-1}, seen_third{-1};
    std::thread other([&] {
      seen_before = zs_is_zsock(fd);  // this thread now remembers fd
      step = 1;
      while (step.load() != 2) std::this_thread::yield();
      seen_after = zs_is_zsock(fd);  // a kernel socket now
      int type = 0;
      socklen_t len = sizeof(type);
      // The kernel answers for it: an AF_UNIX datagram socket.
      if (zs_getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_DGRAM) {
        seen_after = 2;
      }
      step = 3;
      while (step.load() != 4) std::this_thread::yield();
      seen_third = zs_is_zsock(fd);  // a zsock socket again, if it got the number
    });
    while (step.load() != 1) std::this_thread::yield();
    CHECK_C(zs_close(fd) == 0);
    int k = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    CHECK_C(k >= 0);
    if (k != fd) {
      CHECK_C(dup2(k, fd) == fd);
      close(k);
    }
    step = 2;
    while (step.load() != 3) std::this_thread::yield();
    close(fd);
    int again = zs_socket(AF_INET, SOCK_STREAM, 0);
    CHECK_C(again >= 0);
    step = 4;
    other.join();
    CHECK_C(seen_before.load() == 1);
    CHECK_C(seen_after.load() == 0);  // else the other thread saw the closed zsock socket
    if (again == fd) CHECK_C(seen_third.load() == 1);
    CHECK_C(zs_close(again) == 0);
    return 0;
  });
  EXPECT_EQ(Reap(child), 0);
}

}  // namespace
}  // namespace zsock::sockets_test
