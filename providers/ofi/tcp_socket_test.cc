// FindTcpSocket on plain loopback TCP connections: both ends in this
// process, near the lowest free fd and far from it (the /proc/self/fd
// listing), and a connection that is not there.
#include "providers/ofi/tcp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace zsock::ofi {
namespace {

struct Conn {
  Fd client, server;
  sockaddr_storage client_addr{}, server_addr{};
};

// A loopback connection: client `connect`s, server is the accepted end.
Conn Connect() {
  Conn c;
  Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  EXPECT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(::listen(listener.get(), 4), 0);
  EXPECT_EQ(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  c.client.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  EXPECT_EQ(::connect(c.client.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  c.server.reset(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  EXPECT_TRUE(c.server);
  len = sizeof(c.client_addr);
  ::getsockname(c.client.get(), reinterpret_cast<sockaddr*>(&c.client_addr), &len);
  len = sizeof(c.server_addr);
  ::getsockname(c.server.get(), reinterpret_cast<sockaddr*>(&c.server_addr), &len);
  return c;
}

// Whether `dup` is another fd for the same socket as `fd` (same inode).
bool SameSocket(const Fd& dup, const Fd& fd) {
  struct stat a {}, b {};
  return dup && dup.get() != fd.get() && ::fstat(dup.get(), &a) == 0 && ::fstat(fd.get(), &b) == 0 &&
         a.st_ino == b.st_ino && a.st_dev == b.st_dev;
}

TEST(FindTcpSocket, FindsEachEndByItsAddresses) {
  Conn c = Connect();
  for (int window : {1 << 20, 0}) {  // 0: straight to the /proc/self/fd listing
    Fd client = FindTcpSocket(c.client_addr, c.server_addr, window);
    Fd server = FindTcpSocket(c.server_addr, c.client_addr, window);
    EXPECT_TRUE(SameSocket(client, c.client)) << "window " << window;
    EXPECT_TRUE(SameSocket(server, c.server)) << "window " << window;
    EXPECT_NE(::fcntl(client.get(), F_GETFD) & FD_CLOEXEC, 0);
  }
}

// Far from the lowest free fd: a socket below many others, found by the
// outward search, and by the listing when the search is cut short.
TEST(FindTcpSocket, FindsASocketFarBelowTheLowestFreeFd) {
  Conn c = Connect();
  std::vector<Fd> filler;
  for (int i = 0; i < 300; ++i) filler.emplace_back(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  for (int window : {1 << 20, 8}) {
    Fd found = FindTcpSocket(c.client_addr, c.server_addr, window);
    EXPECT_TRUE(SameSocket(found, c.client)) << "window " << window;
  }
}

// Above the lowest free fd, past a hole: found on the way up.
TEST(FindTcpSocket, FindsASocketAboveAHole) {
  std::vector<Fd> filler;
  for (int i = 0; i < 40; ++i) filler.emplace_back(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  Conn c = Connect();  // its fds above the filler
  filler[5].reset();   // the lowest free fd is now far below it
  Fd found = FindTcpSocket(c.server_addr, c.client_addr);
  EXPECT_TRUE(SameSocket(found, c.server));
}

TEST(FindTcpSocket, AConnectionThatIsNotHereIsNotFound) {
  Conn c = Connect();
  sockaddr_storage elsewhere = c.server_addr;
  reinterpret_cast<sockaddr_in&>(elsewhere).sin_port = htons(1);  // nobody's peer
  errno = 0;
  Fd none = FindTcpSocket(c.client_addr, elsewhere);
  EXPECT_FALSE(none);
  EXPECT_EQ(errno, ENOENT);
  // Closed: gone too.
  sockaddr_storage local = c.client_addr, peer = c.server_addr;
  c.client.reset();
  EXPECT_FALSE(FindTcpSocket(local, peer));
}

// What the owner took and what is still queued, exactly.
TEST(TcpReadProgress, CountsWhatTheOwnerTookAndWhatIsQueued) {
  Conn c = Connect();
  char out[1000];
  std::memset(out, 7, sizeof(out));
  ASSERT_EQ(::send(c.client.get(), out, sizeof(out), 0), static_cast<ssize_t>(sizeof(out)));
  uint64_t consumed = 1;
  int unread = 0;
  for (int i = 0; i < 1000 && unread < 1000; ++i) {  // loopback delivers at once, but let it
    ASSERT_TRUE(TcpReadProgress(c.server.get(), &consumed, &unread));
    if (unread < 1000) ::usleep(1000);
  }
  EXPECT_EQ(unread, 1000);
  EXPECT_EQ(consumed, 0u);
  char in[300];
  ASSERT_EQ(::recv(c.server.get(), in, sizeof(in), 0), static_cast<ssize_t>(sizeof(in)));
  ASSERT_TRUE(TcpReadProgress(c.server.get(), &consumed, &unread));
  EXPECT_EQ(unread, 700);
  EXPECT_EQ(consumed, 300u);
}

}  // namespace
}  // namespace zsock::ofi
