// socket_ops_bench: the software cost of the zs_* sockets calls, both ends
// of one connection in one thread (Google Benchmark). Like
// endpoint_ops_bench one layer down, it measures CPU time per call with no
// wire wait in it, so it is stable on a loaded machine and shows what the
// sockets layer, the SDP engine and the provider's bookkeeping cost per
// message; zsock_bench's ping-pong and msgrate add the cross-core waits.
//
//   bazel run -c opt //bench:socket_ops_bench -- [--provider=unet] [benchmark flags]
//
// BM_SendRecv: one send of `size` bytes, then one receive of them (MSG_WAITALL):
//   every send posts its own SDP Data message.
// BM_Burst: `n` sends of 8 bytes, then `n` receives of 8 bytes: what
//   msgrate's two ends do per message, in one thread. Once autocork holds
//   a message (the peer's acknowledgement is processed only by the
//   receives) or the peer's credits are used, sends append to the queued
//   message (docs/protocol.md) and receives copy out of one buffer.
//   The sends must fit the send buffer (sndbuf, 1 MiB): n * 8 bytes.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "sockets/zsock.h"

namespace zsock {
namespace {

struct SocketPair {
  int client = -1, server = -1;
  std::string error;
  SocketPair() {
    int l = zs_socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (l < 0 || zs_bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        zs_listen(l, 1) != 0 || zs_getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      error = std::string("listen: ") + std::strerror(errno);
      if (l >= 0) zs_close(l);
      return;
    }
    int accept_errno = 0;
    std::thread t([&] {
      server = zs_accept(l, nullptr, nullptr);
      if (server < 0) accept_errno = errno;
    });
    client = zs_socket(AF_INET, SOCK_STREAM, 0);
    if (client < 0 || zs_connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      error = std::string("connect: ") + std::strerror(errno);
      zs_close(l);  // ends the accept (EBADF)
      l = -1;
    }
    t.join();
    if (error.empty() && server < 0) error = std::string("accept: ") + std::strerror(accept_errno);
    if (l >= 0) zs_close(l);
  }
  ~SocketPair() {
    if (client >= 0) zs_close(client);
    if (server >= 0) zs_close(server);
  }
};

// Receives exactly `len` bytes into `buf`; false (with the reason) on error.
bool RecvExactly(int fd, uint8_t* buf, size_t len, benchmark::State& state) {
  ssize_t n = zs_recv(fd, buf, len, MSG_WAITALL);
  if (n == static_cast<ssize_t>(len)) return true;
  state.SkipWithError(n < 0 ? std::strerror(errno) : "short receive");
  return false;
}

void BM_SendRecv(benchmark::State& state) {
  SocketPair p;
  if (!p.error.empty()) {
    state.SkipWithError(p.error.c_str());
    return;
  }
  const size_t size = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> src(size, 0x5a), dst(size);
  uint8_t tag = 0;
  for (auto _ : state) {
    // Each message's first and last bytes carry its number: a stale or
    // misplaced receive fails the benchmark.
    src[0] = src[size - 1] = ++tag;
    if (zs_send(p.client, src.data(), size, 0) != static_cast<ssize_t>(size)) {
      state.SkipWithError(std::strerror(errno));
      return;
    }
    if (!RecvExactly(p.server, dst.data(), size, state)) return;
    if (dst[0] != tag || dst[size - 1] != tag) {
      state.SkipWithError("received bytes differ from the sent ones");
      return;
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(size));
}
BENCHMARK(BM_SendRecv)->Arg(8)->Arg(64)->Arg(4096);

void BM_Burst(benchmark::State& state) {
  SocketPair p;
  if (!p.error.empty()) {
    state.SkipWithError(p.error.c_str());
    return;
  }
  const int64_t n = state.range(0);
  uint64_t sent = 0, received = 0;  // each message is its number
  for (auto _ : state) {
    for (int64_t k = 0; k < n; ++k) {
      ++sent;
      if (zs_send(p.client, &sent, sizeof sent, 0) != static_cast<ssize_t>(sizeof sent)) {
        state.SkipWithError(std::strerror(errno));
        return;
      }
    }
    for (int64_t k = 0; k < n; ++k) {
      uint64_t got = 0;
      if (!RecvExactly(p.server, reinterpret_cast<uint8_t*>(&got), sizeof got, state)) return;
      if (got != ++received) {
        state.SkipWithError("a message arrived out of order or altered");
        return;
      }
    }
  }
  // Per message: one send plus one receive.
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * n);
}
BENCHMARK(BM_Burst)->Arg(64)->Arg(1024);

}  // namespace
}  // namespace zsock

int main(int argc, char** argv) {
  // --provider=<fabric config> is ours (it sets ZSOCK_PROVIDER before the
  // first zs_* call); the rest goes to Google Benchmark.
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--provider=", 11) == 0) {
      ::setenv("ZSOCK_PROVIDER", argv[i] + 11, 1);
    } else {
      rest.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
