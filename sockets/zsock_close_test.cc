// zsock_test, closing and peers going away: abortive close, close while
// other threads are blocked in or racing calls on the socket, a peer killed
// mid-transfer, and connections set up and closed in a row
// (zsock_test_util.h has the harness).
#include "sockets/zsock_test_util.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "sockets/zsock.h"

namespace zsock::sockets_test {
namespace {

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
        // The closed socket is gone. Its number is free (EBADF) unless a
        // thread of this process (a provider's own) opened a descriptor
        // since and got it, which is then no zsock socket (ENOTSOCK): the
        // kernel reuses the lowest free number.
        char c;
        CHECK_C(zs_recv(fd, &c, 1, 0) == -1 && (errno == EBADF || errno == ENOTSOCK));
        CHECK_C(write(closed.fd[1], "c", 1) == 1);
        return 0;
      });
}

// Sockets closed at random moments while two other threads keep calling
// send and recv on them (non-blocking, so they enter and leave the engine
// all the time, mostly on the path without the socket's lock): every call
// returns a count or a clean error, none uses freed state (ASan) and every
// close returns 0. The server echoes until its peer goes. (A quarter of
// the rounds under TSan: Rounds.)
TEST_P(Sockets, CloseRacesCallsInOtherThreads) {
  const int rounds = Rounds(12);
  RunPair(
      [&](int l) {
        for (int r = 0; r < rounds; ++r) {
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
        // that is not connected yet (UCX's tcp transport makes its sockets
        // from its own thread). No socket of zsock's answers ENOTCONN here:
        // this one goes from connected to closed (EBADF), and no other is
        // made until the round ends.
        const auto clean = [](ssize_t k, int err) {
          return k >= 0 || err == EAGAIN || err == EBADF || err == ENOTSOCK || err == ENOTCONN ||
                 err == EPIPE || err == ECONNRESET;
        };
        for (int r = 0; r < rounds; ++r) {
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
// then end-of-stream (the server's close is graceful), none is reset. (A
// quarter of the rounds under TSan: Rounds.)
TEST_P(Sockets, ConnectAcceptCloseRepeatedly) {
  const int rounds = Rounds(40);
  RunPair(
      [&](int l) {
        for (int i = 0; i < rounds; ++i) {
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
        for (int i = 0; i < rounds; ++i) {
          int fd = ConnectTo(port);
          char b = 0;
          CHECK_C(zs_recv(fd, &b, 1, MSG_WAITALL) == 1 && b == static_cast<char>(i));
          CHECK_C(zs_recv(fd, &b, 1, 0) == 0);
          CHECK_C(zs_close(fd) == 0);
        }
        return 0;
      });
}

}  // namespace
}  // namespace zsock::sockets_test
