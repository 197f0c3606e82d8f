// The bodies of zsock_bench's child processes, by test family. Each runs
// every point of g_child.run over connections already set up, reports one
// result per point (child_io.h) and checks the data it receives
// (pattern.h). Timestamps are bench::NowNs (the TSC where invariant; the
// same clock for zsock and the kernel TCP baseline).
//
// ServerMain and ClientMain are what the parent forks: they set up the
// connections the test needs and hand them to the family's body.
#ifndef ZSOCK_BENCH_FAMILIES_H_
#define ZSOCK_BENCH_FAMILIES_H_

#include <cstdint>
#include <vector>

namespace zsock::bench::internal {

// The parent's entry points for the two roles (roles.cc).
void ServerMain();
void ClientMain();

// pingpong, hotspot (pingpong.cc): one-way latency of bounced messages.
void PingpongClient(int fd);
// Echoes on every connection; with several (hotspot) serves whichever is ready.
void PingpongServer(const std::vector<int>& fds);

// stream, overlap, pagefault, msgrate (stream.cc): one connection, the
// client streams, the server acknowledges.
void StreamClient(int fd);
void StreamServerConn(int fd);
// multistream (stream.cc): one thread per connection on both sides.
void MultistreamClient(const std::vector<int>& fds);
void MultistreamServer(const std::vector<int>& fds);

// fanin, fanout (fan.cc): one server, one connection per client process.
void FanServer(const std::vector<int>& fds);
void FanClient(int fd);

// connect (connect.cc): a connection per message.
void ConnectServer(int lfd);
void ConnectClient(uint16_t port);

}  // namespace zsock::bench::internal

#endif  // ZSOCK_BENCH_FAMILIES_H_
