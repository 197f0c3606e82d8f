// provider_bench: provider-level ping-pong latency and streaming bandwidth
// between two processes pinned to different cores, beside kernel TCP over
// loopback with the same sizes, in one run.
//
//   bazel run -c opt //bench:provider_bench -- --provider=unet --sizes=8,4096,1048576
//
// Two hosts (e.g. verbs over a real fabric; docs/verbs.md):
//   host A: provider_bench --provider=verbs:mlx5_0 --role=server --address=10.0.0.1:7471
//   host B: provider_bench --provider=verbs:mlx5_0 --role=client --address=10.0.0.1:7471
//
// Each process opens its own fabric after the fork (providers such as verbs
// do not survive fork: docs/provider-interface.md, "Fork").
//
// One-way latency = round trip / 2 (p50, p99, average). Stream bandwidth is
// bytes delivered per second with `window` sends outstanding, 10^9 B/s.
// This is the foundation's demo; the full benchmark suite (SDP modes, the
// seed 003 figures, JSON, plots) is bench/zsock_bench once the SDP engine
// exists.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/provider.h"

ABSL_FLAG(std::string, provider, "unet", "fabric config string");
ABSL_FLAG(std::string, sizes, "8,64,1024,4096,65536,1048576", "message sizes in bytes");
ABSL_FLAG(int, iters, 20000, "ping-pong round trips per size (fewer for large sizes)");
ABSL_FLAG(int64_t, stream_bytes, int64_t{1} << 30, "bytes streamed per size");
ABSL_FLAG(int, window, 32, "stream: sends outstanding");
ABSL_FLAG(bool, baseline_tcp, true, "also run kernel TCP over loopback");
ABSL_FLAG(std::string, role, "both",
          "both: server and client on this host; server / client: one side of a two-host run");
ABSL_FLAG(std::string, address, "", "server: address to listen on (\"\" = the provider's choice); "
          "client: the server's address");

namespace zsock {
namespace {

struct Result {
  double p50 = 0, p99 = 0, avg = 0;  // one-way latency, us
  double gbps = 0;                   // 10^9 bytes per second
};

void Pin(int core) {
  int ncpu = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core % std::max(ncpu, 1), &set);
  sched_setaffinity(0, sizeof(set), &set);
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "provider_bench: %s\n", what.c_str());
  _exit(1);
}

int Iters(size_t size) {
  int it = absl::GetFlag(FLAGS_iters);
  if (size >= (1 << 20)) return std::max(50, it / 100);
  if (size >= (64 << 10)) return std::max(200, it / 10);
  return it;
}

int64_t StreamCount(size_t size) {
  return std::max<int64_t>(64, absl::GetFlag(FLAGS_stream_bytes) / static_cast<int64_t>(std::max<size_t>(size, 1)));
}

Completion Next(CompletionQueue* cq) {
  Completion c;
  for (;;) {
    auto n = cq->Wait(std::span<Completion>(&c, 1), absl::Seconds(30));
    if (!n.ok()) Die(n.status().ToString());
    if (*n == 0) Die("timed out waiting for a completion");
    if (!c.status.ok()) Die(c.status.ToString());
    return c;
  }
}

void WaitFor(CompletionQueue* cq, OpType op) {
  while (Next(cq).op != op) {}
}

Result Summarize(std::vector<double>& rtt_us, double gbps) {
  Result r;
  std::sort(rtt_us.begin(), rtt_us.end());
  double sum = 0;
  for (double v : rtt_us) sum += v;
  r.p50 = rtt_us[rtt_us.size() / 2] / 2;
  r.p99 = rtt_us[std::min(rtt_us.size() - 1, rtt_us.size() * 99 / 100)] / 2;
  r.avg = sum / rtt_us.size() / 2;
  r.gbps = gbps;
  return r;
}

// ---- provider ----

void ProviderServer(const std::string& config, Listener* listener, Fabric* fabric,
                    const std::vector<size_t>& sizes, int window) {
  auto cq = fabric->CreateCq();
  if (!cq.ok()) Die(cq.status().ToString());
  auto ep = listener->Accept(cq->get(), absl::Seconds(30));
  if (!ep.ok()) Die(ep.status().ToString());
  Endpoint* e = ep->get();
  size_t max = *std::max_element(sizes.begin(), sizes.end());
  std::vector<std::vector<uint8_t>> bufs(window, std::vector<uint8_t>(std::max<size_t>(max, 8)));
  for (size_t size : sizes) {
    for (int i = 0; i < Iters(size); ++i) {
      if (!e->PostRecv(bufs[0].data(), max, nullptr, 0).ok()) Die("post");
      WaitFor(cq->get(), OpType::kRecv);
      if (!e->Send(bufs[0].data(), size, nullptr, 0).ok()) Die("send");
      WaitFor(cq->get(), OpType::kSend);
    }
    int64_t count = StreamCount(size);
    int64_t posted = 0, got = 0;
    for (; posted < std::min<int64_t>(window, count); ++posted) {
      if (!e->PostRecv(bufs[posted % window].data(), max, nullptr, posted % window).ok()) Die("post");
    }
    while (got < count) {
      Completion c = Next(cq->get());
      if (c.op != OpType::kRecv) continue;
      ++got;
      if (posted < count) {
        if (!e->PostRecv(bufs[c.context].data(), max, nullptr, c.context).ok()) Die("post");
        ++posted;
      }
    }
    if (!e->Send(bufs[0].data(), 1, nullptr, 0).ok()) Die("ack");
    WaitFor(cq->get(), OpType::kSend);
  }
  (void)config;
}

std::vector<Result> ProviderClient(const std::string& config, const std::string& address,
                                   const std::vector<size_t>& sizes, int window) {
  auto fabric = Fabric::Open(config);
  if (!fabric.ok()) Die(fabric.status().ToString());
  auto cq = (*fabric)->CreateCq();
  if (!cq.ok()) Die(cq.status().ToString());
  auto ep = (*fabric)->Connect(address, cq->get(), absl::Seconds(30));
  if (!ep.ok()) Die(ep.status().ToString());
  Endpoint* e = ep->get();
  size_t max = *std::max_element(sizes.begin(), sizes.end());
  std::vector<uint8_t> out(std::max<size_t>(max, 8), 0x5a), in(std::max<size_t>(max, 8));
  std::vector<Result> results;
  for (size_t size : sizes) {
    int iters = Iters(size);
    std::vector<double> rtt;
    rtt.reserve(iters);
    for (int i = 0; i < iters; ++i) {
      int64_t t0 = absl::GetCurrentTimeNanos();
      if (!e->PostRecv(in.data(), max, nullptr, 0).ok()) Die("post");
      if (!e->Send(out.data(), size, nullptr, 0).ok()) Die("send");
      bool sent = false, got = false;
      while (!sent || !got) {
        Completion c = Next(cq->get());
        sent |= c.op == OpType::kSend;
        got |= c.op == OpType::kRecv;
      }
      rtt.push_back((absl::GetCurrentTimeNanos() - t0) / 1000.0);
    }
    int64_t count = StreamCount(size);
    if (!e->PostRecv(in.data(), max, nullptr, 1).ok()) Die("post");
    int64_t t0 = absl::GetCurrentTimeNanos();
    int64_t sent = 0, done = 0;
    for (; sent < std::min<int64_t>(window, count); ++sent) {
      if (!e->Send(out.data(), size, nullptr, 0).ok()) Die("send");
    }
    bool acked = false;
    while (done < count || !acked) {
      Completion c = Next(cq->get());
      if (c.op == OpType::kRecv) { acked = true; continue; }
      ++done;
      if (sent < count) {
        if (!e->Send(out.data(), size, nullptr, 0).ok()) Die("send");
        ++sent;
      }
    }
    double secs = (absl::GetCurrentTimeNanos() - t0) / 1e9;
    results.push_back(Summarize(rtt, static_cast<double>(size) * count / secs / 1e9));
  }
  return results;
}

// ---- kernel TCP ----

void FullIo(int fd, void* buf, size_t len, bool write) {
  auto* p = static_cast<uint8_t*>(buf);
  while (len > 0) {
    ssize_t n = write ? ::send(fd, p, len, MSG_NOSIGNAL) : ::recv(fd, p, len, 0);
    if (n <= 0) Die(absl::StrCat("tcp ", write ? "send" : "recv", " failed: ", std::strerror(errno)));
    p += n;
    len -= static_cast<size_t>(n);
  }
}

void TcpServer(int lfd, const std::vector<size_t>& sizes) {
  int fd = ::accept(lfd, nullptr, nullptr);
  if (fd < 0) Die("accept");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  size_t max = *std::max_element(sizes.begin(), sizes.end());
  std::vector<uint8_t> buf(std::max<size_t>(max, 8));
  for (size_t size : sizes) {
    for (int i = 0; i < Iters(size); ++i) {
      FullIo(fd, buf.data(), size, false);
      FullIo(fd, buf.data(), size, true);
    }
    int64_t count = StreamCount(size);
    for (int64_t i = 0; i < count; ++i) FullIo(fd, buf.data(), size, false);
    FullIo(fd, buf.data(), 1, true);
  }
  ::close(fd);
}

std::vector<Result> TcpClient(int port, const std::vector<size_t>& sizes) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) Die("tcp connect");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  size_t max = *std::max_element(sizes.begin(), sizes.end());
  std::vector<uint8_t> buf(std::max<size_t>(max, 8), 0x5a);
  std::vector<Result> results;
  for (size_t size : sizes) {
    std::vector<double> rtt;
    for (int i = 0; i < Iters(size); ++i) {
      int64_t t0 = absl::GetCurrentTimeNanos();
      FullIo(fd, buf.data(), size, true);
      FullIo(fd, buf.data(), size, false);
      rtt.push_back((absl::GetCurrentTimeNanos() - t0) / 1000.0);
    }
    int64_t count = StreamCount(size);
    int64_t t0 = absl::GetCurrentTimeNanos();
    for (int64_t i = 0; i < count; ++i) FullIo(fd, buf.data(), size, true);
    FullIo(fd, buf.data(), 1, false);
    double secs = (absl::GetCurrentTimeNanos() - t0) / 1e9;
    results.push_back(Summarize(rtt, static_cast<double>(size) * count / secs / 1e9));
  }
  ::close(fd);
  return results;
}

// Runs `server` in a child pinned to core 0 and `client` here on core 1.
template <typename ServerFn, typename ClientFn>
std::vector<Result> RunPair(ServerFn server, ClientFn client) {
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    Pin(0);
    server();
    std::fflush(nullptr);
    _exit(0);
  }
  Pin(1);
  std::vector<Result> r = client();
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Die("server process failed");
  return r;
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<size_t> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    size_t v;
    if (!absl::SimpleAtoi(s, &v) || v == 0) Die(absl::StrCat("bad size '", s, "'"));
    sizes.push_back(v);
  }
  const std::string config = absl::GetFlag(FLAGS_provider);
  const int window = absl::GetFlag(FLAGS_window);
  const std::string role = absl::GetFlag(FLAGS_role);
  // The server opens its fabric in its own process: one that listens.
  auto serve = [&](int address_fd) {
    auto fabric = Fabric::Open(config);
    if (!fabric.ok()) Die(fabric.status().ToString());
    auto listener = (*fabric)->Listen(absl::GetFlag(FLAGS_address));
    if (!listener.ok()) Die(listener.status().ToString());
    std::string address = (*listener)->address() + "\n";
    if (::write(address_fd, address.data(), address.size()) != static_cast<ssize_t>(address.size())) {
      Die("writing the listener address");
    }
    ProviderServer(config, listener->get(), fabric->get(), sizes, window);
  };
  if (role == "server") {
    std::fprintf(stderr, "serving %s; run the client with --address=", config.c_str());
    serve(STDERR_FILENO);
    return 0;
  }
  if (role != "both" && role != "client") Die("--role is both, server or client");
  std::vector<Result> zs;
  if (role == "client") {
    if (absl::GetFlag(FLAGS_address).empty()) Die("--role=client needs --address=<server address>");
    zs = ProviderClient(config, absl::GetFlag(FLAGS_address), sizes, window);
  } else {
    int pipefd[2];
    if (::pipe(pipefd) != 0) Die("pipe");
    std::fprintf(stderr, "running %s ...\n", config.c_str());
    zs = RunPair([&] { ::close(pipefd[0]); serve(pipefd[1]); },
                 [&] {
                   ::close(pipefd[1]);
                   std::string address;
                   char ch;
                   while (::read(pipefd[0], &ch, 1) == 1 && ch != '\n') address += ch;
                   ::close(pipefd[0]);
                   if (address.empty()) Die("the server process did not start");
                   return ProviderClient(config, address, sizes, window);
                 });
  }
  std::vector<Result> tcp;
  if (absl::GetFlag(FLAGS_baseline_tcp)) {
    std::fprintf(stderr, "running kernel TCP (loopback, TCP_NODELAY) ...\n");
    int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof(sa);
    if (::bind(lfd, reinterpret_cast<sockaddr*>(&sa), sl) != 0 || ::listen(lfd, 1) != 0) Die("tcp listen");
    getsockname(lfd, reinterpret_cast<sockaddr*>(&sa), &sl);
    int port = ntohs(sa.sin_port);
    tcp = RunPair([&] { TcpServer(lfd, sizes); }, [&] { return TcpClient(port, sizes); });
    ::close(lfd);
  }
  std::printf("%-10s %-10s %10s %10s %10s %12s\n", "transport", "size", "lat_p50us",
              "lat_p99us", "lat_avgus", "bw_GB/s");
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::printf("%-10s %-10zu %10.2f %10.2f %10.2f %12.3f\n", config.c_str(), sizes[i],
                zs[i].p50, zs[i].p99, zs[i].avg, zs[i].gbps);
    if (!tcp.empty()) {
      std::printf("%-10s %-10zu %10.2f %10.2f %10.2f %12.3f\n", "tcp", sizes[i], tcp[i].p50,
                  tcp[i].p99, tcp[i].avg, tcp[i].gbps);
    }
  }
  if (!tcp.empty()) {
    std::printf("\n%-10s %16s %16s\n", "size", "latency tcp/zs", "bandwidth zs/tcp");
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::printf("%-10zu %15.1fx %15.1fx\n", sizes[i], tcp[i].p50 / zs[i].p50,
                  zs[i].gbps / tcp[i].gbps);
    }
  }
  return 0;
}

}  // namespace
}  // namespace zsock

int main(int argc, char** argv) { return zsock::Main(argc, argv); }
