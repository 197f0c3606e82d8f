// The harness of zsock_test (the zs_* API over every provider
// configuration x {bcopy, zcopy, azcopy}, with two real processes): the
// `Sockets` fixture, which forks a server child and a client child, and
// the checks those children use.
//
// Each test forks a server child and a client child that choose the
// provider through the environment (ZSOCK_PROVIDER, ZSOCK_MODE) before their
// first zs_ call, as an application would. The parent never opens a fabric
// (configuration is read once per process). A configuration the server
// cannot open makes the test SKIPPED with the reason. A child reports a
// failed check by exiting non-zero (CHECK_C), which fails the test.
#ifndef ZSOCK_SOCKETS_ZSOCK_TEST_UTIL_H_
#define ZSOCK_SOCKETS_ZSOCK_TEST_UTIL_H_

#include <netinet/in.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace zsock::sockets_test {

// A server child's exit code for "this provider cannot run here".
inline constexpr int kSkipExit = 77;

// Ends a child with a message naming the line and errno.
[[noreturn]] void Die(int line, const std::string& what);
#define CHECK_C(cond)                                                          \
  do {                                                                         \
    if (!(cond)) ::zsock::sockets_test::Die(__LINE__, "check failed: " #cond); \
  } while (0)

// A byte pattern that depends on the stream offset: Fill writes it, Check
// says whether `p` holds it.
void Fill(uint8_t* p, size_t n, uint64_t offset);
bool Check(const uint8_t* p, size_t n, uint64_t offset);

// Writes all of buf (blocking socket).
void WriteAll(int fd, const uint8_t* p, size_t n);

sockaddr_in Loopback(uint16_t port);
// A blocking zsock socket connected to 127.0.0.1:port.
int ConnectTo(uint16_t port);

// A pipe both children of a test inherit, for a one-byte go-ahead.
struct TestPipe {
  TestPipe();
  ~TestPipe();
  int fd[2] = {-1, -1};
};

// A child running `body` (with a time limit) and its exit code.
pid_t Fork(std::function<int()> body);
int Reap(pid_t pid);

// How many times a test repeats a round of `n`: a quarter of them (at
// least one) under ThreadSanitizer. Each round checks the same things,
// and TSan reports a race in one round whether or not it shows there;
// but TSan makes connection set-up and teardown over some providers
// (ofi:tcp;ofi_rxm, whose per-connection buffer pools it shadows) slow
// enough that a dozen rounds approach a child's time limit.
int Rounds(int n);

using Param = std::tuple<std::string, std::string>;  // provider config, mode

class Sockets : public ::testing::TestWithParam<Param> {
 protected:
  // Sets the provider configuration of this test (and extra_env_) in the
  // environment of the calling child.
  void UseConfig();
  std::string connect_timeout_ms_ = "60000";
  std::vector<std::pair<std::string, std::string>> extra_env_;  // set in both children

  // A listening socket on 127.0.0.1:<free port>; exits kSkipExit if the
  // provider cannot run here.
  int ServerListen(int backlog, uint16_t* port, int extra_flags = 0);

  // Runs `server` (given its listening fd) and `client` (given the port) in
  // two processes; the port travels through a pipe.
  void RunPair(std::function<int(int listen_fd)> server, std::function<int(uint16_t port)> client,
               int backlog = 128);
};

}  // namespace zsock::sockets_test

#endif  // ZSOCK_SOCKETS_ZSOCK_TEST_UTIL_H_
