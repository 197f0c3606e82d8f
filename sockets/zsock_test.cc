// The zs_* sockets API over every provider configuration x {bcopy, zcopy},
// with two real processes: byte-exact echo both ways at once, BSD call
// semantics, an epoll echo server with many clients, half-close, abort and a
// peer killed mid-transfer.
//
// Each test forks a server child and a client child that choose the
// provider through the environment (ZSOCK_PROVIDER, ZSOCK_MODE) before their
// first zs_ call, as an application would. The parent never opens a fabric
// (configuration is read once per process). A configuration the server
// cannot open makes the test SKIPPED with the reason.
#include "sockets/zsock.h"
#include "tests/child_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/conformance_configs.h"

namespace {

constexpr int kSkipExit = 77;

[[noreturn]] void Die(int line, const std::string& what) {
  std::fprintf(stderr, "child %d: line %d: %s (errno %d: %s)\n", getpid(), line, what.c_str(),
               errno, std::strerror(errno));
  std::fflush(stderr);
  _exit(1);
}
#define CHECK_C(cond)                          \
  do {                                         \
    if (!(cond)) Die(__LINE__, "check failed: " #cond); \
  } while (0)

void Fill(uint8_t* p, size_t n, uint64_t offset) {
  for (size_t i = 0; i < n; ++i) {
    uint64_t x = offset + i;
    p[i] = static_cast<uint8_t>((x * 2654435761u) >> 13);
  }
}

bool Check(const uint8_t* p, size_t n, uint64_t offset) {
  for (size_t i = 0; i < n; ++i) {
    uint64_t x = offset + i;
    if (p[i] != static_cast<uint8_t>((x * 2654435761u) >> 13)) return false;
  }
  return true;
}

// Writes all of buf (blocking socket).
void WriteAll(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t k = zs_send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    CHECK_C(k > 0);
    p += k;
    n -= static_cast<size_t>(k);
  }
}

sockaddr_in Loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

int ConnectTo(uint16_t port) {
  int fd = zs_socket(AF_INET, SOCK_STREAM, 0);
  CHECK_C(fd >= 0);
  sockaddr_in a = Loopback(port);
  CHECK_C(zs_connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  return fd;
}

// A pipe both children of a test inherit, for a one-byte go-ahead.
struct TestPipe {
  TestPipe() { CHECK_C(pipe(fd) == 0); }
  ~TestPipe() {
    close(fd[0]);
    close(fd[1]);
  }
  int fd[2] = {-1, -1};
};

pid_t Fork(std::function<int()> body) {
  return zsock::testutil::SpawnChild(std::move(body), absl::Seconds(150));
}

int Reap(pid_t pid) { return zsock::testutil::ReapChild(pid, absl::Seconds(300)); }

using Param = std::tuple<std::string, std::string>;  // provider config, mode

class Sockets : public ::testing::TestWithParam<Param> {
 protected:
  void UseConfig() {
    setenv("ZSOCK_PROVIDER", std::get<0>(GetParam()).c_str(), 1);
    setenv("ZSOCK_MODE", std::get<1>(GetParam()).c_str(), 1);
    // Make zcopy happen at test sizes.
    setenv("ZSOCK_ZCOPY_THRESHOLD", "16384", 1);
    // Many connections set up at once on a loaded 2-core machine (ofi's
    // per-connection endpoints are slow to make): allow a minute.
    setenv("ZSOCK_CONNECT_TIMEOUT_MS", connect_timeout_ms_.c_str(), 1);
    for (const auto& [k, v] : extra_env_) setenv(k.c_str(), v.c_str(), 1);
  }
  std::string connect_timeout_ms_ = "60000";
  std::vector<std::pair<std::string, std::string>> extra_env_;  // set in both children

  // A listening socket on 127.0.0.1:<free port>; exits kSkipExit if the
  // provider cannot run here.
  int ServerListen(int backlog, uint16_t* port, int extra_flags = 0) {
    UseConfig();
    int l = zs_socket(AF_INET, SOCK_STREAM | extra_flags, 0);
    if (l < 0 && (errno == ENODEV || errno == EAGAIN || errno == ENOENT || errno == EPERM ||
                  errno == EOPNOTSUPP || errno == ENOSYS || errno == EHOSTUNREACH)) {
      std::fprintf(stderr, "provider cannot run here (errno %d: %s)\n", errno, std::strerror(errno));
      _exit(kSkipExit);
    }
    CHECK_C(l >= 0);
    sockaddr_in a = Loopback(0);
    CHECK_C(zs_bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    socklen_t len = sizeof(a);
    CHECK_C(zs_getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    CHECK_C(a.sin_port != 0);
    CHECK_C(zs_listen(l, backlog) == 0);
    *port = ntohs(a.sin_port);
    return l;
  }

  // Runs `server` (given its listening fd) and `client` (given the port) in
  // two processes; the port travels through a pipe.
  void RunPair(std::function<int(int listen_fd)> server, std::function<int(uint16_t port)> client,
               int backlog = 128) {
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    pid_t s = Fork([&] {
      close(p[0]);
      uint16_t port = 0;
      // On kSkipExit the pipe closes with nothing written.
      int l = ServerListen(backlog, &port);
      CHECK_C(write(p[1], &port, sizeof(port)) == sizeof(port));
      close(p[1]);
      return server(l);
    });
    close(p[1]);
    uint16_t port = 0;
    ssize_t got = read(p[0], &port, sizeof(port));
    close(p[0]);
    if (got != sizeof(port)) {
      int rc = Reap(s);
      if (rc == kSkipExit) GTEST_SKIP() << std::get<0>(GetParam()) << " cannot run here";
      FAIL() << "server child exited " << rc << " before listening";
    }
    pid_t c = Fork([&] {
      UseConfig();
      return client(port);
    });
    EXPECT_EQ(Reap(c), 0) << "client";
    EXPECT_EQ(Reap(s), 0) << "server";
  }
};

// Random-length writes and reads both ways at once, checked byte for byte:
// the client streams to the server, which echoes; the client reads the echo
// in another thread with random read sizes.
TEST_P(Sockets, EchoBothWaysByteExact) {
  // 256 MiB where RDMA is native and local (unet with cross-memory
  // attach), 32 MiB where it is emulated or goes through a network stack.
  const bool big = std::get<0>(GetParam()) == "unet";
  const uint64_t total = big ? (uint64_t{256} << 20) : (uint64_t{32} << 20);
  RunPair(
      [&](int l) {
        int fd = zs_accept(l, nullptr, nullptr);
        CHECK_C(fd >= 0);
        std::vector<uint8_t> buf(4 << 20);
        for (;;) {
          ssize_t n = zs_recv(fd, buf.data(), buf.size(), 0);
          CHECK_C(n >= 0);
          if (n == 0) break;
          WriteAll(fd, buf.data(), static_cast<size_t>(n));
        }
        CHECK_C(zs_close(fd) == 0);
        CHECK_C(zs_close(l) == 0);
        return 0;
      },
      [&](uint16_t port) {
        int fd = ConnectTo(port);
        std::atomic<bool> reader_ok{false};
        std::thread reader([&] {
          std::mt19937_64 rng(2);
          std::vector<uint8_t> buf(8 << 20);
          uint64_t off = 0;
          while (off < total) {
            size_t want = 1 + rng() % buf.size();
            ssize_t n = zs_recv(fd, buf.data(), want, 0);
            if (n <= 0) {
              std::fprintf(stderr, "reader: recv(%zu) at offset %" PRIu64 " returned %zd (%s)\n",
                           want, off, n, n < 0 ? std::strerror(errno) : "end of stream");
              return;
            }
            if (!Check(buf.data(), static_cast<size_t>(n), off)) {
              size_t bad = 0;
              while (Check(buf.data() + bad, 1, off + bad)) ++bad;
              std::fprintf(stderr,
                           "reader: wrong bytes: recv(%zu) at offset %" PRIu64
                           " returned %zd, first wrong byte at +%zu\n",
                           want, off, n, bad);
              return;
            }
            off += static_cast<uint64_t>(n);
          }
          uint8_t extra;
          reader_ok = zs_recv(fd, &extra, 1, 0) == 0;  // the server closed after the echo
        });
        std::mt19937_64 rng(1);
        std::vector<uint8_t> buf(8 << 20);
        uint64_t off = 0;
        while (off < total) {
          // Mostly small and medium writes, some up to 8 MiB.
          size_t len = rng() % 4 == 0 ? 1 + rng() % buf.size() : 1 + rng() % 70000;
          len = static_cast<size_t>(std::min<uint64_t>(len, total - off));
          Fill(buf.data(), len, off);
          WriteAll(fd, buf.data(), len);
          off += len;
        }
        CHECK_C(zs_shutdown(fd, SHUT_WR) == 0);
        reader.join();
        CHECK_C(reader_ok.load());
        CHECK_C(zs_close(fd) == 0);
        return 0;
      });
}

// BSD call semantics a sockets program relies on.
TEST_P(Sockets, CallSemantics) {
  RunPair(
      [&](int l) {
        // A second listener on the same port is refused.
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
        // fixed pause there raced with a slow run of the lines above).
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
      },
      [&](uint16_t port) {
        int fd = zs_socket(AF_INET, SOCK_STREAM, 0);
        CHECK_C(fd >= 0);
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
        int v = 1, err = -1;
        CHECK_C(zs_setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, sizeof(v)) == 0);
        // Autocork: on by default (configuration key autocork), 0 or 1.
        int ac = -1;
        len = sizeof(ac);
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
        // Two writes, one peeked and read whole by the server.
        WriteAll(fd, reinterpret_cast<const uint8_t*>("hello"), 5);
        iovec iov[2] = {{const_cast<char*>(" wor"), 4}, {const_cast<char*>("ld"), 2}};
        CHECK_C(zs_writev(fd, iov, 2) == 6);
        // The server checks that nothing more is there, then says go.
        char go = 0;
        CHECK_C(zs_recv(fd, &go, 1, MSG_WAITALL) == 1 && go == 'g');
        WriteAll(fd, reinterpret_cast<const uint8_t*>("last"), 4);
        CHECK_C(zs_shutdown(fd, SHUT_WR) == 0);
        CHECK_C(zs_send(fd, "x", 1, MSG_NOSIGNAL) == -1 && errno == EPIPE);
        // Without MSG_NOSIGNAL the send raises SIGPIPE, as send(2) on TCP
        // does, and the handler may call zs_* itself (here on the same fd).
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
        char buf[8] = {};
        CHECK_C(zs_recv(fd, buf, 5, MSG_WAITALL) == 5 && std::memcmp(buf, "reply", 5) == 0);
        // Counters: 15 bytes sent (not the refused sends), 6 received ("g"
        // and "reply"); a shorter struct gets the prefix; the option is
        // read-only.
        slen = sizeof(st);
        CHECK_C(zs_getsockopt(fd, SOL_ZSOCK, ZSOCK_SO_STATS, &st, &slen) == 0 && slen == sizeof(st));
        CHECK_C(st.bytes_sent_bcopy == 15 && st.bytes_recv_bcopy == 6 && st.messages_sent >= 3);
        uint64_t first = 0;
        slen = sizeof(first);
        CHECK_C(zs_getsockopt(fd, SOL_ZSOCK, ZSOCK_SO_STATS, &first, &slen) == 0 &&
                slen == sizeof(first) && first == 15);
        CHECK_C(zs_setsockopt(fd, SOL_ZSOCK, ZSOCK_SO_STATS, &st, sizeof(st)) == -1 &&
                errno == ENOPROTOOPT);
        CHECK_C(zs_recv(fd, buf, sizeof(buf), 0) == 0);
        CHECK_C(zs_close(fd) == 0);
        CHECK_C(zs_is_zsock(fd) == 0);
        // Calls on a closed or unknown fd go to libc. The closed number may
        // be reused at any moment by a library thread: ucx opens pipes
        // (libc then says ENOTSOCK) and, over tcp, sockets of its own
        // (EPIPE or ENOTCONN, or a send). The send is empty, so that one
        // landing on such a socket changes nothing.
        if (fcntl(fd, F_GETFD) == -1) {
          const int rc = zs_send(fd, "x", 0, MSG_NOSIGNAL);
          const int err = errno;
          CHECK_C((rc == -1 && err == EBADF) || fcntl(fd, F_GETFD) != -1);
        }
        constexpr int kNeverOpened = 987654;
        CHECK_C(zs_send(kNeverOpened, "x", 1, MSG_NOSIGNAL) == -1 && errno == EBADF);
        return 0;
      });
}

// The fd's poll readiness follows every transition, not only the first:
// after a receive says EAGAIN, the next bytes (with the peer still open, so
// no end of stream wakes it) make the fd readable; after a send says
// EAGAIN, the peer's reading makes it writable. The sockets layer stops
// hearing about bits its mirror already shows (Connection::
// readiness_watch), and must start again when it turns one off.
TEST_P(Sockets, PollFollowsEveryReadinessTransition) {
  constexpr int kRounds = 3;
  TestPipe full;  // the client says its send buffer is full
  RunPair(
      [&](int l) {
        int fd = zs_accept(l, nullptr, nullptr);
        CHECK_C(fd >= 0);
        CHECK_C(zs_fcntl(fd, F_SETFL, O_NONBLOCK) == 0);
        for (int round = 0; round < kRounds; ++round) {
          pollfd pf{fd, POLLIN, 0};
          CHECK_C(::poll(&pf, 1, 30000) == 1 && (pf.revents & POLLIN));
          char c = 0;
          CHECK_C(zs_recv(fd, &c, 1, 0) == 1 && c == 'a' + round);
          CHECK_C(zs_recv(fd, &c, 1, 0) == -1 && errno == EAGAIN);
          CHECK_C(::poll(&pf, 1, 0) == 0);
          CHECK_C(zs_send(fd, &c, 1, MSG_NOSIGNAL) == 1);  // the client's turn
        }
        // The client fills its send buffer, then waits for POLLOUT: read
        // everything (blocking) once it is full, until its end of stream.
        char b = 0;
        CHECK_C(read(full.fd[0], &b, 1) == 1);
        CHECK_C(zs_fcntl(fd, F_SETFL, 0) == 0);
        std::vector<uint8_t> buf(1 << 16);
        while (zs_recv(fd, buf.data(), buf.size(), 0) > 0) {}
        CHECK_C(zs_close(fd) == 0);
        CHECK_C(zs_close(l) == 0);
        return 0;
      },
      [&](uint16_t port) {
        int fd = ConnectTo(port);
        for (int round = 0; round < kRounds; ++round) {
          const char c = static_cast<char>('a' + round);
          CHECK_C(zs_send(fd, &c, 1, MSG_NOSIGNAL) == 1);
          char back = 0;
          CHECK_C(zs_recv(fd, &back, 1, MSG_WAITALL) == 1 && back == c);
        }
        // Not writable once a send says EAGAIN; writable again when the
        // server has read.
        CHECK_C(zs_fcntl(fd, F_SETFL, O_NONBLOCK) == 0);
        std::vector<uint8_t> chunk(1 << 16, 0x5a);
        size_t sent = 0;
        for (;;) {
          ssize_t k = zs_send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL);
          if (k < 0) {
            CHECK_C(errno == EAGAIN);
            break;
          }
          sent += static_cast<size_t>(k);
          CHECK_C(sent < (size_t{1} << 30));  // a send buffer has an end
        }
        // (Not checked: that the fd is unwritable now. A provider's send
        // completion can free a slot and make it writable again by itself.)
        pollfd pf{fd, POLLOUT, 0};
        CHECK_C(write(full.fd[1], "f", 1) == 1);
        CHECK_C(::poll(&pf, 1, 30000) == 1 && (pf.revents & POLLOUT));
        CHECK_C(zs_shutdown(fd, SHUT_WR) == 0);
        CHECK_C(zs_close(fd) == 0);
        return 0;
      });
}

// SO_RCVTIMEO and SO_SNDTIMEO: a blocked call gives up with EAGAIN, not
// before the time asked for, and the connection works on afterwards. (A
// deadline from CLOCK_REALTIME_COARSE plus one tick failed this: on this
// tickless VM the coarse clock lagged by up to 1.5 ticks.)
TEST_P(Sockets, TimeoutsExpireNoEarlierThanAsked) {
  constexpr int kTimeoutMs = 100;
  const auto elapsed_ms = [](absl::Time t0) { return absl::ToDoubleMilliseconds(absl::Now() - t0); };
  TestPipe done;  // the client says a send has timed out
  RunPair(
      [&](int l) {
        int fd = zs_accept(l, nullptr, nullptr);
        CHECK_C(fd >= 0);
        timeval tv{0, kTimeoutMs * 1000};
        CHECK_C(zs_setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0);
        timeval got{};
        socklen_t len = sizeof(got);
        CHECK_C(zs_getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &got, &len) == 0);
        CHECK_C(got.tv_sec == 0 && got.tv_usec == kTimeoutMs * 1000);
        char c = 0;
        absl::Time t0 = absl::Now();
        CHECK_C(zs_recv(fd, &c, 1, 0) == -1 && errno == EAGAIN);
        double ms = elapsed_ms(t0);
        CHECK_C(ms >= kTimeoutMs && ms < 20000);
        CHECK_C(zs_send(fd, "g", 1, MSG_NOSIGNAL) == 1);  // the client may fill now
        char d = 0;  // reading nothing meanwhile: its sends time out
        CHECK_C(read(done.fd[0], &d, 1) == 1);
        // Then everything the client sent comes, its last byte included.
        std::vector<uint8_t> buf(1 << 16);
        ssize_t k;
        while ((k = zs_recv(fd, buf.data(), buf.size(), 0)) != 0) {
          CHECK_C(k > 0 || errno == EAGAIN);  // a slow sender meets our timeout too
        }
        CHECK_C(zs_close(fd) == 0);
        CHECK_C(zs_close(l) == 0);
        return 0;
      },
      [&](uint16_t port) {
        int fd = ConnectTo(port);
        char c = 0;
        CHECK_C(zs_recv(fd, &c, 1, MSG_WAITALL) == 1 && c == 'g');
        timeval tv{0, kTimeoutMs * 1000};
        CHECK_C(zs_setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) == 0);
        // The server reads nothing until told: once the send buffer is
        // full, a send returns what it queued when the timeout expires, and
        // the next one, with nothing queued, says EAGAIN.
        // Chunks below every mode's zero-copy threshold: buffered sends.
        std::vector<uint8_t> chunk(4096, 0x5a);
        bool timed_out = false;
        for (int i = 0; i < (1 << 16) && !timed_out; ++i) {
          absl::Time t0 = absl::Now();
          ssize_t k = zs_send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL);
          if (k < 0) {
            CHECK_C(errno == EAGAIN);
            CHECK_C(elapsed_ms(t0) >= kTimeoutMs);
            timed_out = true;
          }
        }
        CHECK_C(timed_out);
        CHECK_C(write(done.fd[1], "d", 1) == 1);
        tv = timeval{0, 0};  // no timeout: wait until the server reads
        CHECK_C(zs_setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) == 0);
        CHECK_C(zs_send(fd, "z", 1, MSG_NOSIGNAL) == 1);
        CHECK_C(zs_shutdown(fd, SHUT_WR) == 0);
        CHECK_C(zs_close(fd) == 0);
        return 0;
      });
}

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

// A non-blocking, epoll-driven echo server and many concurrent clients
// (non-blocking connects, all in flight at once).
TEST_P(Sockets, EpollEchoServerManyClients) {
  // 256 on every provider. ofi:tcp;ofi_rxm makes a libfabric endpoint per
  // connection, and rxm 1.17 holds about 36 MB per endpoint with its
  // default 16 KiB bounce buffers: 256 connections were 9 GB per process
  // (the ASan run was OOM-killed). With FI_OFI_RXM_BUFFER_SIZE=4096, the
  // tuning docs/ofi.md gives for many connections, 256 take about 3 GB and
  // 11 s. ZSOCK_TEST_CLIENTS overrides the count (to work on it).
  if (std::get<0>(GetParam()).rfind("ofi:tcp;ofi_rxm", 0) == 0) {
    extra_env_.push_back({"FI_OFI_RXM_BUFFER_SIZE", "4096"});
  }
  const char* env_clients = getenv("ZSOCK_TEST_CLIENTS");
  const int clients = env_clients ? std::max(1, atoi(env_clients)) : 256;
  constexpr size_t kMsg = 3000;
  RunPair(
      [&](int l) {
        CHECK_C(zs_fcntl(l, F_SETFL, O_NONBLOCK) == 0);
        int ep = epoll_create1(EPOLL_CLOEXEC);
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.fd = l;
        CHECK_C(epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev) == 0);
        std::map<int, std::vector<uint8_t>> pending;  // unsent echo per fd
        int done = 0, accepted = 0;
        while (done < clients) {
          epoll_event evs[64];
          int n = epoll_wait(ep, evs, 64, 60000);
          CHECK_C(n > 0);
          for (int i = 0; i < n; ++i) {
            int fd = evs[i].data.fd;
            if (fd == l) {
              for (;;) {
                int c = zs_accept4(l, nullptr, nullptr, SOCK_NONBLOCK);
                if (c < 0) {
                  CHECK_C(errno == EAGAIN || errno == ECONNABORTED);
                  break;
                }
                ++accepted;
                epoll_event cev{};
                cev.events = EPOLLIN | EPOLLET;
                cev.data.fd = c;
                CHECK_C(epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev) == 0);
              }
              continue;
            }
            // Edge-triggered: read until EAGAIN.
            for (;;) {
              uint8_t buf[8192];
              ssize_t k = zs_recv(fd, buf, sizeof(buf), 0);
              if (k > 0) {
                auto& out = pending[fd];
                out.insert(out.end(), buf, buf + k);
                continue;
              }
              if (k == 0) {
                CHECK_C(pending[fd].empty());
                epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
                CHECK_C(zs_close(fd) == 0);
                pending.erase(fd);
                ++done;
                break;
              }
              CHECK_C(errno == EAGAIN);
              break;
            }
            if (auto it = pending.find(fd); it != pending.end() && !it->second.empty()) {
              auto& out = it->second;
              ssize_t k = zs_send(fd, out.data(), out.size(), MSG_NOSIGNAL);
              CHECK_C(k > 0 || (k < 0 && errno == EAGAIN));
              if (k > 0) out.erase(out.begin(), out.begin() + k);
              CHECK_C(out.empty());  // 3000 bytes always fit the send buffer
            }
          }
        }
        CHECK_C(accepted == clients);
        close(ep);
        CHECK_C(zs_close(l) == 0);
        return 0;
      },
      [&](uint16_t port) {
        std::vector<int> fds(clients);
        sockaddr_in a = Loopback(port);
        for (int i = 0; i < clients; ++i) {
          fds[i] = zs_socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
          CHECK_C(fds[i] >= 0);
          int rc = zs_connect(fds[i], reinterpret_cast<sockaddr*>(&a), sizeof(a));
          CHECK_C(rc == 0 || errno == EINPROGRESS);
        }
        // Wait for every connect through zs_poll, then send.
        std::vector<pollfd> pf(clients);
        for (int i = 0; i < clients; ++i) pf[i] = {fds[i], POLLOUT, 0};
        int connected = 0;
        std::vector<bool> up(clients, false);
        absl::Time deadline = absl::Now() + absl::Seconds(120);
        while (connected < clients) {
          CHECK_C(absl::Now() < deadline);
          int n = zs_poll(pf.data(), pf.size(), 1000);
          CHECK_C(n >= 0);
          for (int i = 0; i < clients; ++i) {
            if (up[i] || !(pf[i].revents & POLLOUT)) continue;
            int err = 0;
            socklen_t len = sizeof(err);
            CHECK_C(zs_getsockopt(fds[i], SOL_SOCKET, SO_ERROR, &err, &len) == 0);
            if (err != 0) {
              errno = err;
              Die(__LINE__, absl::StrCat("connect ", i, " of ", clients, " failed"));
            }
            up[i] = true;
            pf[i].events = 0;
            ++connected;
            std::vector<uint8_t> msg(kMsg);
            Fill(msg.data(), kMsg, static_cast<uint64_t>(i) * 7919);
            CHECK_C(zs_send(fds[i], msg.data(), kMsg, MSG_NOSIGNAL) == static_cast<ssize_t>(kMsg));
          }
        }
        // Read every echo (blocking now), check it, close.
        for (int i = 0; i < clients; ++i) {
          CHECK_C(zs_fcntl(fds[i], F_SETFL, 0) == 0);
          std::vector<uint8_t> got(kMsg);
          CHECK_C(zs_recv(fds[i], got.data(), kMsg, MSG_WAITALL) == static_cast<ssize_t>(kMsg));
          CHECK_C(Check(got.data(), kMsg, static_cast<uint64_t>(i) * 7919));
          CHECK_C(zs_close(fds[i]) == 0);
        }
        return 0;
      },
      /*backlog=*/512);
}

// SO_LINGER {1, 0}: close resets the connection; the peer sees ECONNRESET.
TEST_P(Sockets, AbortiveCloseResetsPeer) {
  RunPair(
      [&](int l) {
        int fd = zs_accept(l, nullptr, nullptr);
        CHECK_C(fd >= 0);
        char c;
        CHECK_C(zs_recv(fd, &c, 1, 0) == 1);
        linger lg{1, 0};
        CHECK_C(zs_setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) == 0);
        CHECK_C(zs_close(fd) == 0);
        CHECK_C(zs_close(l) == 0);
        return 0;
      },
      [&](uint16_t port) {
        int fd = ConnectTo(port);
        CHECK_C(zs_send(fd, "x", 1, 0) == 1);
        char buf[16];
        ssize_t n = zs_recv(fd, buf, sizeof(buf), 0);
        CHECK_C(n == -1 && errno == ECONNRESET);
        CHECK_C(zs_close(fd) == 0);
        return 0;
      });
}

// A socket closed while other threads of its process are blocked in calls
// on it (the peer reads nothing meanwhile): close wakes them, as
// shutdown(SHUT_RDWR) does, and returns once they have left. The blocked
// recv returns 0; the blocked send, which the peer never makes room for,
// is failed out after the linger time (1 s here) with what it queued or
// EBADF. The fd is gone afterwards, and the peer reads what left and then
// an end of stream or a reset.
TEST_P(Sockets, CloseWakesCallsBlockedInOtherThreads) {
  TestPipe closed;  // the client has closed: the server may read
  RunPair(
      [&](int l) {
        int fd = zs_accept(l, nullptr, nullptr);
        CHECK_C(fd >= 0);
        char d = 0;
        CHECK_C(read(closed.fd[0], &d, 1) == 1);
        std::vector<uint8_t> buf(1 << 16);
        uint64_t got = 0;
        ssize_t k;
        while ((k = zs_recv(fd, buf.data(), buf.size(), 0)) > 0) got += static_cast<uint64_t>(k);
        CHECK_C(k == 0 || errno == ECONNRESET || errno == EPIPE);
        CHECK_C(got >= 4096);  // the send buffer's worth that left before the close
        CHECK_C(zs_close(fd) == 0);
        CHECK_C(zs_close(l) == 0);
        return 0;
      },
      [&](uint16_t port) {
        int fd = ConnectTo(port);
        linger lg{1, 1};  // set after connect: applies to this connection's close
        CHECK_C(zs_setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) == 0);
        std::atomic<int> started{0};
        std::atomic<uint64_t> sent{0};
        ssize_t rn = 1, sn = 4096;
        int rerr = 0, serr = 0;
        std::thread reader([&] {
          ++started;
          char c;
          rn = zs_recv(fd, &c, 1, 0);
          rerr = errno;
        });
        std::thread sender([&] {
          // Chunks below every mode's zero-copy threshold: buffered sends,
          // which block once the peer's buffers and ours are full.
          std::vector<uint8_t> chunk(4096, 0x5a);
          ++started;
          while ((sn = zs_send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL)) == 4096) {
            sent += 4096;
          }
          serr = errno;
        });
        while (started < 2) absl::SleepFor(absl::Milliseconds(1));
        // Both are inside their calls by then (the buffers fill in far less).
        for (uint64_t last = 0; last == 0 || sent != last;) {
          last = sent;
          absl::SleepFor(absl::Milliseconds(300));
        }
        const absl::Time t0 = absl::Now();
        CHECK_C(zs_close(fd) == 0);
        reader.join();
        sender.join();
        // SO_LINGER's 1 s applies to the connection made before it was set
        // (the default would be 10 s).
        CHECK_C(absl::Now() - t0 < absl::Seconds(8));
        CHECK_C(rn == 0 || (rn == -1 && rerr == EBADF));
        CHECK_C((sn > 0 && sn < 4096) || (sn == -1 && (serr == EBADF || serr == EPIPE)));
        CHECK_C(sent >= 4096);
        char c;
        CHECK_C(zs_recv(fd, &c, 1, 0) == -1 && errno == EBADF);
        CHECK_C(write(closed.fd[1], "c", 1) == 1);
        return 0;
      });
}

// Sockets closed at random moments while two other threads keep calling
// send and recv on them (non-blocking, so they enter and leave the engine
// all the time, mostly on the path without the socket's lock): every call
// returns a count or a clean error, none uses freed state (ASan) and every
// close returns 0. The server echoes until its peer goes.
TEST_P(Sockets, CloseRacesCallsInOtherThreads) {
  constexpr int kRounds = 12;
  RunPair(
      [&](int l) {
        for (int r = 0; r < kRounds; ++r) {
          int fd = zs_accept(l, nullptr, nullptr);
          CHECK_C(fd >= 0);
          char buf[4096];
          ssize_t k;
          while ((k = zs_recv(fd, buf, sizeof(buf), 0)) > 0) {
            (void)zs_send(fd, buf, static_cast<size_t>(k), MSG_NOSIGNAL | MSG_DONTWAIT);
          }
          CHECK_C(k == 0 || errno == ECONNRESET || errno == EPIPE);
          CHECK_C(zs_close(fd) == 0);
        }
        CHECK_C(zs_close(l) == 0);
        return 0;
      },
      [&](uint16_t port) {
        std::mt19937_64 rng(7);
        // ENOTCONN too: after the close the number may name a kernel socket
        // that is not connected yet (a receive over ucx:tcp got it once, in
        // 2026-11-25's CI, round 11 of 12; UCX's tcp transport makes its
        // sockets from its own thread: the likely owner, not traced). No
        // socket of zsock's answers ENOTCONN here: this one goes from
        // connected to closed (EBADF), and no other is made until the round
        // ends.
        const auto clean = [](ssize_t k, int err) {
          return k >= 0 || err == EAGAIN || err == EBADF || err == ENOTSOCK || err == ENOTCONN ||
                 err == EPIPE || err == ECONNRESET;
        };
        for (int r = 0; r < kRounds; ++r) {
          int fd = ConnectTo(port);
          std::atomic<bool> stop{false};
          std::atomic<uint64_t> calls{0};
          std::atomic<int> bad{0};  // an errno no call should set
          std::thread sender([&] {
            const char msg[8] = {1, 2, 3, 4, 5, 6, 7, 8};
            while (!stop) {
              ssize_t k = zs_send(fd, msg, sizeof(msg), MSG_NOSIGNAL | MSG_DONTWAIT);
              if (!clean(k, errno)) bad = errno;
              ++calls;
            }
          });
          std::thread receiver([&] {
            char buf[512];
            while (!stop) {
              ssize_t k = zs_recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
              if (!clean(k, errno)) bad = -errno;
              ++calls;
            }
          });
          while (calls < 200) absl::SleepFor(absl::Microseconds(100));
          absl::SleepFor(absl::Microseconds(static_cast<int64_t>(rng() % 5000)));
          CHECK_C(zs_close(fd) == 0);
          // Stopped at once: a call after the close reaches whatever the
          // number names by then (EBADF, or ENOTSOCK once a provider's
          // thread reused it for an eventfd, as ucx:tcp's does, or
          // ENOTCONN for a socket such a thread has not connected yet).
          stop = true;
          sender.join();
          receiver.join();
          if (bad != 0) std::fprintf(stderr, "round %d: errno %d (negative: recv)\n", r, bad.load());
          CHECK_C(bad == 0);
        }
        return 0;
      });
}

// The server is killed with SIGKILL while streaming: the client's blocked
// recv and its sends end with ECONNRESET or EPIPE, not a hang.
TEST_P(Sockets, PeerKilledMidTransfer) {
  if (absl::StartsWith(std::get<0>(GetParam()), "ofi:shm")) {
    GTEST_SKIP() << "libfabric 1.17 shm keeps each peer's queue lock (a spin lock) in shared "
                    "memory: a peer SIGKILLed while it holds it leaves every later send to it, "
                    "and the survivor's own progress, spinning inside libfabric (docs/ofi.md)";
  }
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  pid_t server = Fork([&] {
    close(p[0]);
    uint16_t port = 0;
    int l = ServerListen(4, &port);
    CHECK_C(write(p[1], &port, sizeof(port)) == sizeof(port));
    int fd = zs_accept(l, nullptr, nullptr);
    CHECK_C(fd >= 0);
    // Stream only once the client's connect has returned (it sends a byte):
    // this test is about a peer dying mid-transfer, not during set-up.
    char go;
    CHECK_C(zs_recv(fd, &go, 1, MSG_WAITALL) == 1);
    std::vector<uint8_t> buf(1 << 20, 0x5a);
    for (;;) WriteAll(fd, buf.data(), buf.size());  // until killed
    return 0;
  });
  close(p[1]);
  uint16_t port = 0;
  if (read(p[0], &port, sizeof(port)) != sizeof(port)) {
    int rc = Reap(server);
    if (rc == kSkipExit) GTEST_SKIP() << std::get<0>(GetParam()) << " cannot run here";
    FAIL() << "server exited " << rc;
  }
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t client = Fork([&] {
    UseConfig();
    int fd = ConnectTo(port);
    CHECK_C(zs_send(fd, "g", 1, 0) == 1);
    std::vector<uint8_t> buf(1 << 20);
    uint64_t got = 0;
    while (got < (uint64_t{8} << 20)) {
      ssize_t n = zs_recv(fd, buf.data(), buf.size(), 0);
      CHECK_C(n > 0);
      got += static_cast<uint64_t>(n);
    }
    char one = 1;
    CHECK_C(write(ready[1], &one, 1) == 1);
    absl::Time start = absl::Now();
    ssize_t n;
    do {
      n = zs_recv(fd, buf.data(), buf.size(), 0);
    } while (n > 0);
    CHECK_C(n == -1 && (errno == ECONNRESET || errno == EPIPE));
    CHECK_C(zs_send(fd, "x", 1, MSG_NOSIGNAL) == -1 && (errno == ECONNRESET || errno == EPIPE));
    CHECK_C(absl::Now() - start < absl::Seconds(30));
    CHECK_C(zs_close(fd) == 0);
    return 0;
  });
  close(ready[1]);  // a client that dies early ends the read below with EOF
  char one;
  if (read(ready[0], &one, 1) != 1) {
    kill(server, SIGKILL);
    Reap(server);
    FAIL() << "client never received data; it exited " << Reap(client);
  }
  kill(server, SIGKILL);
  EXPECT_EQ(Reap(server), -SIGKILL);
  EXPECT_EQ(Reap(client), 0);
  close(p[0]);
  close(ready[0]);
}

// Connections set up and closed in a row: each one delivers its byte and
// then end-of-stream (the server's close is graceful), none is reset.
TEST_P(Sockets, ConnectAcceptCloseRepeatedly) {
  constexpr int kRounds = 40;
  RunPair(
      [&](int l) {
        for (int i = 0; i < kRounds; ++i) {
          int fd = zs_accept(l, nullptr, nullptr);
          CHECK_C(fd >= 0);
          char b = static_cast<char>(i);
          CHECK_C(zs_send(fd, &b, 1, 0) == 1);
          CHECK_C(zs_close(fd) == 0);
        }
        CHECK_C(zs_close(l) == 0);
        return 0;
      },
      [&](uint16_t port) {
        for (int i = 0; i < kRounds; ++i) {
          int fd = ConnectTo(port);
          char b = 0;
          CHECK_C(zs_recv(fd, &b, 1, MSG_WAITALL) == 1 && b == static_cast<char>(i));
          CHECK_C(zs_recv(fd, &b, 1, 0) == 0);
          CHECK_C(zs_close(fd) == 0);
        }
        return 0;
      });
}

std::vector<Param> Params() {
  std::vector<Param> out;
  for (const auto& c : zsock::ConformanceConfigurations()) {
    for (const char* mode : {"bcopy", "zcopy", "azcopy"}) out.emplace_back(c, mode);
  }
  // ofi:tcp's other wait (its default waits on its sockets), and its
  // sockets with no backstop timer: a wake-up they miss fails a test.
  out.emplace_back("ofi:tcp?iface=lo&cq_wait=fd", "bcopy");
  out.emplace_back("ofi:tcp?iface=lo&backstop_ms=0", "bcopy");
  return out;
}

std::string Name(const ::testing::TestParamInfo<Param>& info) {
  std::string s = absl::StrCat(std::get<0>(info.param), "_", std::get<1>(info.param));
  for (char& c : s) {
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return s;
}

INSTANTIATE_TEST_SUITE_P(Providers, Sockets, ::testing::ValuesIn(Params()), Name);

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
