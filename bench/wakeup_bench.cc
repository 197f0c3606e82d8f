// wakeup_bench: the round trip of sporadic traffic, where both sides sleep
// between messages, beside kernel TCP. zsock_bench and provider_bench
// measure busy traffic, where a reply arrives within the spin and nobody
// sleeps; an RPC service with gaps between requests pays the wake-ups
// instead: the server wakes for the request, the client for the reply.
//
//   bazel run -c opt //bench:wakeup_bench -- [--level=provider|sockets]
//       [--provider=unet] [--gap_us=1000] [--rounds=300] [--idle=0]
//
// --level=provider: two processes, an Endpoint each, every wait a
//   CompletionQueue::Wait (spinning, spin_us adapting up to spin_max_us, then
//   sleeping on the CQ fd);
//   --idle=N more connections from the client sit idle on the server's CQ
//   (how a wake-up scales with the connections a CQ holds); at the sockets
//   level, N more connected sockets that carry nothing, in both processes.
// --level=sockets: the zs_* calls (SDP over --provider), then the same over
//   kernel TCP sockets (TCP_NODELAY) with the same gaps. --pieces=N writes
//   each request as N sends (as a program writing a header and a body
//   does); --wait=poll waits for the reply in poll(2) on the socket, as an
//   event loop does, before reading it (--wait=recv: in the receive). A
//   request in 3 or more pieces followed by poll is autocork's worst case
//   (docs/protocol.md, "Autocork").
// Processes are not pinned: a sleeping process wakes where the scheduler
// puts it, as an unpinned service's would. Prints p50/p90/p99 round trip in
// microseconds (64-byte messages).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/provider.h"
#include "sockets/zsock.h"

ABSL_FLAG(std::string, level, "provider", "provider (Endpoint API) or sockets (zs_* beside kernel TCP)");
ABSL_FLAG(std::string, provider, "unet", "fabric config string");
ABSL_FLAG(int, gap_us, 1000, "idle time between round trips (both sides fall asleep)");
ABSL_FLAG(int, rounds, 300, "round trips measured (one more warms up)");
ABSL_FLAG(int, idle, 0,
          "idle connections besides the measured one: on the server's CQ (provider level), or "
          "idle sockets between the two processes (sockets level)");
ABSL_FLAG(int, pieces, 1, "sockets level: sends each 64-byte request is written in (1..64)");
ABSL_FLAG(std::string, wait, "recv", "sockets level: the client waits for the reply in recv or poll");

namespace zsock {
namespace {

constexpr size_t kMsg = 64;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "wakeup_bench: %s\n", what.c_str());
  std::_Exit(1);
}

// Forks the server. The child gets 0 and *fd the pipe's write end, the
// parent the child's pid and *fd the read end (the other ends closed, so a
// server that dies before it writes ends the parent's read).
pid_t ForkWithPipe(int* fd) {
  int p[2];
  if (::pipe(p) != 0) Die("pipe failed");
  pid_t child = ::fork();
  if (child < 0) Die("fork failed");
  ::close(child == 0 ? p[0] : p[1]);
  *fd = child == 0 ? p[1] : p[0];
  return child;
}

// The child's listener address, in one fixed-size record on a pipe.
void WriteRecord(int fd, const std::string& s) {
  char rec[256] = {};
  std::snprintf(rec, sizeof(rec), "%s", s.c_str());
  if (::write(fd, rec, sizeof(rec)) != static_cast<ssize_t>(sizeof(rec))) Die("pipe write failed");
}
std::string ReadRecord(int fd) {
  char rec[256] = {};
  size_t got = 0;
  while (got < sizeof(rec)) {
    ssize_t n = ::read(fd, rec + got, sizeof(rec) - got);
    if (n <= 0) Die("the server died before it listened");
    got += static_cast<size_t>(n);
  }
  rec[sizeof(rec) - 1] = '\0';
  return rec;
}

void Report(const std::string& name, std::vector<double> rtt) {
  std::sort(rtt.begin(), rtt.end());
  auto at = [&](double q) { return rtt[std::min(rtt.size() - 1, static_cast<size_t>(rtt.size() * q))]; };
  std::printf("%-40s gap %6d us  rtt p50 %8.1f  p90 %8.1f  p99 %8.1f us\n", name.c_str(),
              absl::GetFlag(FLAGS_gap_us), at(0.5), at(0.9), at(0.99));
  std::fflush(stdout);
}

// Waits for the next completion of kind `want`; send completions met on
// the way are counted in *sends.
void Next(CompletionQueue* cq, OpType want, int* sends = nullptr) {
  Completion c;
  for (;;) {
    auto n = cq->Wait(std::span<Completion>(&c, 1), absl::Seconds(30));
    if (!n.ok()) Die(n.status().ToString());
    if (*n == 0) Die("nothing arrived in 30 s");
    if (!c.status.ok()) Die(c.status.ToString());
    if (c.op == OpType::kSend && sends != nullptr) ++*sends;
    if (c.op == want) return;
  }
}

void ProviderLevel() {
  const std::string config = absl::GetFlag(FLAGS_provider);
  const int rounds = absl::GetFlag(FLAGS_rounds), idle = absl::GetFlag(FLAGS_idle);
  const int gap = absl::GetFlag(FLAGS_gap_us);
  int pipe_fd;
  pid_t child = ForkWithPipe(&pipe_fd);
  if (child == 0) {
    auto f = Fabric::Open(config);
    if (!f.ok()) Die(f.status().ToString());
    auto l = (*f)->Listen(absl::StartsWith(config, "unet") ? "" : "127.0.0.1:0");
    if (!l.ok()) Die(l.status().ToString());
    WriteRecord(pipe_fd, (*l)->address());
    auto cq = (*f)->CreateCq();
    if (!cq.ok()) Die(cq.status().ToString());
    std::vector<std::unique_ptr<Endpoint>> eps;
    for (int i = 0; i <= idle; ++i) {
      auto e = (*l)->Accept(cq->get(), absl::Seconds(30));
      if (!e.ok()) Die(e.status().ToString());
      eps.push_back(std::move(*e));
    }
    Endpoint* e = eps.back().get();  // the client connects the measured one last
    char in[kMsg], out[kMsg] = {};
    for (int i = 0; i <= rounds; ++i) {
      if (auto st = e->PostRecv(in, sizeof(in), nullptr, 1); !st.ok()) Die(st.ToString());
      Next(cq->get(), OpType::kRecv);
      if (auto st = e->Send(out, sizeof(out), nullptr, 2); !st.ok()) Die(st.ToString());
      Next(cq->get(), OpType::kSend);
    }
    // Until the client is done: its last send completion may need us.
    char end;
    if (auto st = e->PostRecv(&end, 1, nullptr, 3); !st.ok()) Die(st.ToString());
    Completion c;
    (void)(*cq)->Wait(std::span<Completion>(&c, 1), absl::Seconds(5));
    std::_Exit(0);
  }
  const std::string address = ReadRecord(pipe_fd);
  auto f = Fabric::Open(config);
  if (!f.ok()) Die(f.status().ToString());
  auto idle_cq = (*f)->CreateCq();
  auto cq = (*f)->CreateCq();
  if (!idle_cq.ok() || !cq.ok()) Die("creating the CQs failed");
  std::vector<std::unique_ptr<Endpoint>> idles;
  for (int i = 0; i < idle; ++i) {
    auto e = (*f)->Connect(address, idle_cq->get(), absl::Seconds(30));
    if (!e.ok()) Die(e.status().ToString());
    idles.push_back(std::move(*e));
  }
  auto e = (*f)->Connect(address, cq->get(), absl::Seconds(30));
  if (!e.ok()) Die(e.status().ToString());
  char in[kMsg], out[kMsg] = {};
  std::vector<double> rtt;
  int sent = 0;
  for (int i = 0; i <= rounds; ++i) {
    ::usleep(static_cast<useconds_t>(gap));
    const absl::Time t0 = absl::Now();
    if (auto st = (*e)->PostRecv(in, sizeof(in), nullptr, 1); !st.ok()) Die(st.ToString());
    if (auto st = (*e)->Send(out, sizeof(out), nullptr, 2); !st.ok()) Die(st.ToString());
    Next(cq->get(), OpType::kRecv, &sent);  // the reply (the send's completion may come later)
    if (i > 0) rtt.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
  }
  char end = 0;
  if (auto st = (*e)->Send(&end, 1, nullptr, 4); !st.ok()) Die(st.ToString());
  // Every send's completion, the end's last (sends complete in order):
  // some providers move a send only while its sender progresses.
  while (sent < rounds + 2) {
    Completion c;
    auto n = (*cq)->Wait(std::span<Completion>(&c, 1), absl::Seconds(30));
    if (!n.ok() || *n == 0) Die("the last sends did not complete");
    if (!c.status.ok()) Die(c.status.ToString());
    if (c.op == OpType::kSend) ++sent;
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  Report(absl::StrCat(config, " provider, ", idle, " idle conn."), rtt);
}

// The socket calls of one side of the comparison: zs_* (SDP over
// --provider) or the kernel's.
struct SocketCalls {
  bool zs;
  int Socket() const {
    return zs ? zs_socket(AF_INET, SOCK_STREAM, 0) : ::socket(AF_INET, SOCK_STREAM, 0);
  }
  int Bind(int fd, sockaddr_in* a) const {
    return zs ? zs_bind(fd, reinterpret_cast<sockaddr*>(a), sizeof(*a))
              : ::bind(fd, reinterpret_cast<sockaddr*>(a), sizeof(*a));
  }
  int Listen(int fd, int backlog) const {
    return zs ? zs_listen(fd, backlog) : ::listen(fd, backlog);
  }
  int GetSockName(int fd, sockaddr_in* a, socklen_t* len) const {
    return zs ? zs_getsockname(fd, reinterpret_cast<sockaddr*>(a), len)
              : ::getsockname(fd, reinterpret_cast<sockaddr*>(a), len);
  }
  int Accept(int fd) const {
    return zs ? zs_accept(fd, nullptr, nullptr) : ::accept(fd, nullptr, nullptr);
  }
  int Connect(int fd, sockaddr_in* a) const {
    return zs ? zs_connect(fd, reinterpret_cast<sockaddr*>(a), sizeof(*a))
              : ::connect(fd, reinterpret_cast<sockaddr*>(a), sizeof(*a));
  }
  ssize_t Send(int fd, const void* b, size_t n) const {
    return zs ? zs_send(fd, b, n, MSG_NOSIGNAL) : ::send(fd, b, n, MSG_NOSIGNAL);
  }
  void RecvAll(int fd, void* b, size_t n) const {
    size_t got = 0;
    while (got < n) {
      ssize_t k = zs ? zs_recv(fd, static_cast<char*>(b) + got, n - got, 0)
                     : ::recv(fd, static_cast<char*>(b) + got, n - got, 0);
      if (k <= 0) {
        Die(absl::StrCat("receive failed: ", k == 0 ? "end of stream" : std::strerror(errno)));
      }
      got += static_cast<size_t>(k);
    }
  }
  int NoDelay(int fd) const {
    int one = 1;
    return zs ? zs_setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one))
              : ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  void Close(int fd) const {
    if (zs) zs_close(fd); else ::close(fd);
  }
};

// The forked server: listens, reports its port on `pipe_fd`, accepts the
// measured connection and `idle` more, and echoes `rounds` + 1 requests.
[[noreturn]] void SocketsServer(const SocketCalls& io, int pipe_fd, int rounds, int idle) {
  int l = io.Socket();
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  const int backlog = 8 + idle;
  if (l < 0 || io.Bind(l, &a) != 0 || io.Listen(l, backlog) != 0 ||
      io.GetSockName(l, &a, &len) != 0) {
    Die(absl::StrCat("listen failed: ", std::strerror(errno)));
  }
  WriteRecord(pipe_fd, std::to_string(ntohs(a.sin_port)));
  int c = io.Accept(l);
  if (c < 0 || io.NoDelay(c) != 0) Die(absl::StrCat("accept failed: ", std::strerror(errno)));
  for (int i = 0; i < idle; ++i) {  // kept open, never used, until _Exit
    if (io.Accept(l) < 0) {
      Die(absl::StrCat("accepting an idle connection failed: ", std::strerror(errno)));
    }
  }
  char b[kMsg];
  for (int i = 0; i <= rounds; ++i) {
    io.RecvAll(c, b, sizeof(b));
    if (io.Send(c, b, sizeof(b)) != static_cast<ssize_t>(sizeof(b))) Die("reply failed");
  }
  io.RecvAll(c, b, 1);  // the client's end
  std::_Exit(0);
}

// Connects the measured socket (returned) and `idle` more (*idle_fds).
int SocketsConnect(const SocketCalls& io, int port, int idle, std::vector<int>* idle_fds) {
  int s = io.Socket();
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (s < 0 || io.Connect(s, &a) != 0 || io.NoDelay(s) != 0) {
    Die(absl::StrCat("connect failed: ", std::strerror(errno)));
  }
  for (int i = 0; i < idle; ++i) {
    int t = io.Socket();
    if (t < 0 || io.Connect(t, &a) != 0) {
      Die(absl::StrCat("connecting an idle socket failed: ", std::strerror(errno)));
    }
    idle_fds->push_back(t);
  }
  return s;
}

// `rounds` timed round trips (after one untimed), each after sleeping
// --gap_us; returns them in us.
std::vector<double> SocketsRoundTrips(const SocketCalls& io, int s, int rounds, size_t pieces,
                                      bool poll_first) {
  const int gap = absl::GetFlag(FLAGS_gap_us);
  char b[kMsg] = {};
  std::vector<double> rtt;
  for (int i = 0; i <= rounds; ++i) {
    ::usleep(static_cast<useconds_t>(gap));
    const absl::Time t0 = absl::Now();
    for (size_t p = 0, off = 0; p < pieces; ++p) {
      const size_t n = p + 1 < pieces ? kMsg / pieces : kMsg - off;
      if (io.Send(s, b + off, n) != static_cast<ssize_t>(n)) Die("send failed");
      off += n;
    }
    if (poll_first) {
      pollfd pf{s, POLLIN, 0};
      if (::poll(&pf, 1, -1) != 1) Die(absl::StrCat("poll failed: ", std::strerror(errno)));
    }
    io.RecvAll(s, b, sizeof(b));
    if (i > 0) rtt.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
  }
  if (io.Send(s, b, 1) != 1) Die("send failed");
  return rtt;
}

// kernel: the same over kernel TCP sockets; else zs_* (SDP over --provider).
void SocketsLevel(bool zs) {
  const SocketCalls io{zs};
  const int rounds = absl::GetFlag(FLAGS_rounds);
  const int idle = absl::GetFlag(FLAGS_idle);
  int pipe_fd;
  pid_t child = ForkWithPipe(&pipe_fd);
  if (child == 0) SocketsServer(io, pipe_fd, rounds, idle);
  const int port = std::atoi(ReadRecord(pipe_fd).c_str());
  std::vector<int> idle_fds;
  int s = SocketsConnect(io, port, idle, &idle_fds);
  const size_t pieces = static_cast<size_t>(absl::GetFlag(FLAGS_pieces));
  const bool poll_first = absl::GetFlag(FLAGS_wait) == "poll";
  std::vector<double> rtt = SocketsRoundTrips(io, s, rounds, pieces, poll_first);
  int status = 0;
  ::waitpid(child, &status, 0);
  io.Close(s);
  for (int t : idle_fds) io.Close(t);
  const std::string how = absl::StrCat(", ", pieces, pieces == 1 ? " send" : " sends",
                                       poll_first ? ", poll" : "",
                                       idle > 0 ? absl::StrCat(", ", idle, " idle") : "");
  Report(zs ? absl::StrCat(absl::GetFlag(FLAGS_provider), " sockets (SDP)", how)
            : absl::StrCat("kernel TCP sockets", how),
         rtt);
}

}  // namespace
}  // namespace zsock

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string level = absl::GetFlag(FLAGS_level);
  if (absl::GetFlag(FLAGS_rounds) < 1) zsock::Die("--rounds must be at least 1");
  if (absl::GetFlag(FLAGS_gap_us) < 0) zsock::Die("--gap_us must not be negative");
  if (absl::GetFlag(FLAGS_pieces) < 1 || absl::GetFlag(FLAGS_pieces) > 64) {
    zsock::Die("--pieces must be 1..64");
  }
  if (absl::GetFlag(FLAGS_wait) != "recv" && absl::GetFlag(FLAGS_wait) != "poll") {
    zsock::Die("--wait must be recv or poll");
  }
  if (level == "provider") {
    zsock::ProviderLevel();
  } else if (level == "sockets") {
    // The sockets layer reads its provider from the configuration.
    ::setenv("ZSOCK_PROVIDER", absl::GetFlag(FLAGS_provider).c_str(), 1);
    // Kernel TCP first: its fork must precede the sockets layer's threads.
    zsock::SocketsLevel(false);
    zsock::SocketsLevel(true);
  } else {
    zsock::Die(absl::StrCat("--level must be provider or sockets, not '", level, "'"));
  }
  return 0;
}
