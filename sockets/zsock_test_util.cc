// The harness of zsock_test: see zsock_test_util.h. Every TEST_P of the
// Sockets fixture, in every file of the test, runs over Params() below.
#include "sockets/zsock_test_util.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/base/config.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "sockets/zsock.h"
#include "tests/child_process.h"
#include "tests/conformance_configs.h"

namespace zsock::sockets_test {

[[noreturn]] void Die(int line, const std::string& what) {
  std::fprintf(stderr, "child %d: line %d: %s (errno %d: %s)\n", getpid(), line, what.c_str(),
               errno, std::strerror(errno));
  std::fflush(stderr);
  _exit(1);
}

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

TestPipe::TestPipe() { CHECK_C(pipe(fd) == 0); }

TestPipe::~TestPipe() {
  close(fd[0]);
  close(fd[1]);
}

pid_t Fork(std::function<int()> body) {
  return zsock::testutil::SpawnChild(std::move(body), absl::Seconds(150));
}

int Reap(pid_t pid) { return zsock::testutil::ReapChild(pid, absl::Seconds(300)); }

int Rounds(int n) {
#ifdef ABSL_HAVE_THREAD_SANITIZER
  return std::max(1, n / 4);
#else
  return n;
#endif
}

void Sockets::UseConfig() {
  setenv("ZSOCK_PROVIDER", std::get<0>(GetParam()).c_str(), 1);
  setenv("ZSOCK_MODE", std::get<1>(GetParam()).c_str(), 1);
  // Make zcopy happen at test sizes.
  setenv("ZSOCK_ZCOPY_THRESHOLD", "16384", 1);
  // Many connections set up at once on a loaded 2-core machine (ofi's
  // per-connection endpoints are slow to make): allow a minute.
  setenv("ZSOCK_CONNECT_TIMEOUT_MS", connect_timeout_ms_.c_str(), 1);
  for (const auto& [k, v] : extra_env_) setenv(k.c_str(), v.c_str(), 1);
}

int Sockets::ServerListen(int backlog, uint16_t* port, int extra_flags) {
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

void Sockets::RunPair(std::function<int(int listen_fd)> server,
                      std::function<int(uint16_t port)> client, int backlog) {
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
  const int client_rc = Reap(c);
  EXPECT_EQ(client_rc, 0) << "client";
  // A server whose client failed would wait for it until its time limit
  // (in accept, or for data): end it now. Its exit status is still checked.
  if (client_rc != 0) kill(s, SIGKILL);
  EXPECT_EQ(Reap(s), 0) << "server" << (client_rc != 0 ? " (killed: its client failed)" : "");
}

namespace {

std::vector<Param> Params() {
  std::vector<Param> out;
  for (const auto& c : zsock::ConformanceConfigurations()) {
    out.emplace_back(c, "bcopy");
    if (!zsock::RunsEveryMode(c)) continue;
    for (const char* mode : {"zcopy", "azcopy"}) out.emplace_back(c, mode);
  }
  // ofi:tcp's other wait (its default waits on its sockets), and its
  // sockets with no backstop timer: a wake-up they miss fails a test.
  for (const char* c : {"ofi:tcp?iface=lo&cq_wait=fd", "ofi:tcp?iface=lo&backstop_ms=0"}) {
    if (zsock::ConfigurationWanted(c)) out.emplace_back(c, "bcopy");
  }
  return out;
}

std::string Name(const ::testing::TestParamInfo<Param>& info) {
  std::string s = absl::StrCat(std::get<0>(info.param), "_", std::get<1>(info.param));
  for (char& c : s) {
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return s;
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(Providers, Sockets, ::testing::ValuesIn(Params()), Name);

}  // namespace zsock::sockets_test
