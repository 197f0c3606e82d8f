// The two roles zsock_bench forks: the server listens (and reports its
// port to the parent), accepts the connections the test needs and serves
// them; a client connects and runs the test's client body.
#include <cstdint>
#include <vector>

#include "bench/child_io.h"
#include "bench/families.h"
#include "bench/frames.h"

namespace zsock::bench::internal {

void ServerMain() {
  uint16_t port = 0;
  int lfd = ListenLoopback(&port);
  WriteFrame(kFramePort, &port, sizeof(port));
  const Run& run = *g_child.run;
  const Test test = g_child.opt->test;
  if (test == Test::kConnect) {
    ConnectServer(lfd);
    CloseFd(lfd);
    return;
  }
  std::vector<int> fds;
  for (int64_t i = 0; i < run.clients * run.streams; ++i) fds.push_back(AcceptOne(lfd, true));
  CloseFd(lfd);
  switch (test) {
    case Test::kPingpong:
    case Test::kHotspot: PingpongServer(fds); break;
    case Test::kMultistream: MultistreamServer(fds); break;
    case Test::kFanin:
    case Test::kFanout: FanServer(fds); break;
    default: StreamServerConn(fds[0]); break;
  }
  for (int fd : fds) CloseFd(fd);
}

void ClientMain() {
  const Run& run = *g_child.run;
  const Test test = g_child.opt->test;
  if (test == Test::kConnect) {
    ConnectClient(g_child.port);
    return;
  }
  std::vector<int> fds;
  for (int64_t i = 0; i < run.streams; ++i) fds.push_back(ConnectLoopback(g_child.port, true));
  switch (test) {
    case Test::kPingpong:
    case Test::kHotspot: PingpongClient(fds[0]); break;
    case Test::kMultistream: MultistreamClient(fds); break;
    case Test::kFanin:
    case Test::kFanout: FanClient(fds[0]); break;
    default: StreamClient(fds[0]); break;
  }
  for (int fd : fds) CloseFd(fd);
}

}  // namespace zsock::bench::internal
