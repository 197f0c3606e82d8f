// sdp_bench: SDP stream throughput, bcopy beside zcopy, per write size,
// between two processes (used to pick the default zcopy_threshold; numbers
// in docs/protocol.md).
//
//   bazel run -c opt //bench:sdp_bench -- --provider=unet --sizes=4096,65536,1048576
//
// For each mode and size the sender writes --mib MiB in writes of that size
// from a page-aligned buffer; the receiver reads with a buffer of the same
// size (MSG_WAITALL) and answers one byte at the end. Throughput = bytes /
// (time from the first write to that answer), 10^9 B/s.
#include <sys/mman.h>
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
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/sdp/engine.h"

ABSL_FLAG(std::string, provider, "unet", "fabric config string");
ABSL_FLAG(std::string, sizes, "4096,16384,32768,65536,131072,262144,1048576",
          "write sizes in bytes");
ABSL_FLAG(int, mib, 256, "MiB streamed per mode and size");
ABSL_FLAG(int, reps, 3, "repetitions per point (the best is reported)");

namespace zsock::sdp {
namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "sdp_bench: %s\n", what.c_str());
  _exit(1);
}

uint8_t* PageBuffer(size_t n) {
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) Die("mmap");
  std::memset(p, 0x5a, n);
  return static_cast<uint8_t*>(p);
}

ConnectionOptions Opts(Mode mode) {
  ConnectionOptions o;
  o.mode = mode;
  o.zcopy_threshold = 1024;  // every size goes zero-copy in zcopy mode
  return o;
}

// The forked receiver: its own engine, a connection to `address`, and for
// every size and repetition `total` bytes read, then one byte answered.
[[noreturn]] void Receive(const std::string& provider, const std::string& address, Mode mode,
                          const std::vector<size_t>& sizes, size_t total, int reps) {
  auto e = Engine::Create({provider, false});
  if (!e.ok()) Die(e.status().ToString());
  auto c = (*e)->Connect(address, Opts(mode), absl::Now() + absl::Seconds(30));
  if (!c.ok()) Die(c.status().ToString());
  size_t max = 0;
  for (size_t s : sizes) max = std::max(max, s);
  uint8_t* buf = PageBuffer(max);
  for (size_t s : sizes) {
    for (int r = 0; r < reps; ++r) {
      size_t got = 0;
      while (got < total) {
        size_t want = std::min(s, total - got);
        auto n = (*c)->Recv(buf, want, MSG_WAITALL);
        if (!n.ok() || *n == 0) Die("recv failed");
        got += *n;
      }
      uint8_t one = 1;
      if (!(*c)->Send(&one, 1).ok()) Die("ack failed");
    }
  }
  (void)(*c)->Close();
  _exit(0);
}

// The best of `reps` streams of `total` bytes in writes of `size`, 10^9 B/s.
double SendPoint(Connection* conn, const uint8_t* buf, size_t size, size_t total, int reps) {
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    absl::Time start = absl::Now();
    size_t sent = 0;
    while (sent < total) {
      size_t n = std::min(size, total - sent);
      size_t off = 0;
      while (off < n) {
        auto k = conn->Send(buf + off, n - off);
        if (!k.ok()) Die(k.status().ToString());
        off += *k;
      }
      sent += n;
    }
    uint8_t ack;
    auto a = conn->Recv(&ack, 1, MSG_WAITALL);
    if (!a.ok() || *a != 1) Die("no ack");
    double secs = absl::ToDoubleSeconds(absl::Now() - start);
    best = std::max(best, total / secs / 1e9);
  }
  return best;
}

// Every size in `mode` (a receiver process per mode); returns GB/s by size.
std::vector<double> RunMode(const std::string& provider, Mode mode,
                            const std::vector<size_t>& sizes, size_t total, int reps) {
  auto engine = Engine::Create({provider, false});
  if (!engine.ok()) Die(engine.status().ToString());
  auto listener = (*engine)->Listen("", Opts(mode));
  if (!listener.ok()) Die(listener.status().ToString());
  std::string address = (*listener)->address();
  std::fflush(nullptr);
  pid_t child = fork();
  if (child == 0) Receive(provider, address, mode, sizes, total, reps);
  auto conn = (*listener)->Accept(absl::Now() + absl::Seconds(30));
  if (!conn.ok()) Die(conn.status().ToString());
  size_t max = 0;
  for (size_t s : sizes) max = std::max(max, s);
  uint8_t* buf = PageBuffer(max);
  std::vector<double> gbps;
  for (size_t size : sizes) gbps.push_back(SendPoint(conn->get(), buf, size, total, reps));
  (void)(*conn)->Close();
  int status;
  waitpid(child, &status, 0);
  return gbps;
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<size_t> sizes;
  for (auto s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    size_t v;
    if (!absl::SimpleAtoi(s, &v) || v == 0) Die("bad --sizes");
    sizes.push_back(v);
  }
  const size_t total = size_t(absl::GetFlag(FLAGS_mib)) << 20;
  const int reps = absl::GetFlag(FLAGS_reps);
  const std::string provider = absl::GetFlag(FLAGS_provider);
  std::printf("# sdp_bench provider=%s, %zu MiB per point, best of %d\n", provider.c_str(),
              total >> 20, reps);
  std::printf("%10s %14s %14s\n", "size", "bcopy GB/s", "zcopy GB/s");
  const std::vector<double> bcopy = RunMode(provider, Mode::kBcopy, sizes, total, reps);
  const std::vector<double> zcopy = RunMode(provider, Mode::kZcopy, sizes, total, reps);
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::printf("%10zu %14.2f %14.2f\n", sizes[i], bcopy[i], zcopy[i]);
  }
  return 0;
}

}  // namespace
}  // namespace zsock::sdp

int main(int argc, char** argv) { return zsock::sdp::Main(argc, argv); }
