// provider_bench: provider-level ping-pong latency and streaming bandwidth
// between two processes pinned to different cores, beside kernel TCP over
// loopback with the same sizes, in one run.
//
//   bazel run -c opt //bench:provider_bench -- --provider=unet --sizes=8,4096,1048576
//
// Timestamps come from bench::NowNs (the TSC where it is invariant, as
// ucx_perftest's; bench/clock.h says why not absl's clock).
// One-way latency = round trip / 2 (p50, p99, average), after a tenth as
// many untimed warm-up round trips. Stream bandwidth is bytes delivered per
// second with `window` sends outstanding, 10^9 B/s. --wait=spin busy-polls
// the CQ as fi_pingpong and ucx_perftest do (bench/compare_providers.sh runs
// the three side by side); the default waits adaptively (spin, then sleep).
// The server process opens its own fabric after the fork (providers such
// as verbs do not survive fork: docs/provider-interface.md, "Fork").
//
// Two hosts (e.g. verbs over a real fabric; docs/verbs.md):
//   host A: provider_bench --provider=verbs:mlx5_0 --role=server --address=10.0.0.1:7471
//   host B: provider_bench --provider=verbs:mlx5_0 --role=client --address=10.0.0.1:7471
// The full benchmark suite (SDP modes, the AZ-SDP paper's figures, JSON,
// plots) is bench/zsock_bench.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/clock.h"
#include "bench/samples.h"
#include "core/provider.h"

ABSL_FLAG(std::string, provider, "unet", "fabric config string");
ABSL_FLAG(std::string, sizes, "8,64,1024,4096,65536,1048576", "message sizes in bytes");
ABSL_FLAG(int, iters, 20000, "ping-pong round trips per size (fewer for large sizes)");
ABSL_FLAG(int64_t, stream_bytes, int64_t{1} << 30, "bytes streamed per size");
ABSL_FLAG(int, window, 32, "stream: sends outstanding");
ABSL_FLAG(int64_t, stream_max_msgs, int64_t{1} << 40,
          "stream: at most this many messages per size (bounds the time small sizes take)");
ABSL_FLAG(std::string, cores, "0,1", "cores to pin the server and the client to");
ABSL_FLAG(bool, baseline_tcp, true, "also run kernel TCP over loopback");
ABSL_FLAG(std::string, role, "both",
          "both: server and client on this host; server / client: one side of a two-host run");
ABSL_FLAG(std::string, address, "",
          "server: address to listen on (\"\" = the provider's choice); client: the server's address");
ABSL_FLAG(std::string, wait, "adaptive",
          "how to wait for completions: adaptive (CompletionQueue::Wait: spin, from spin_us "
          "adapting up to spin_max_us, then sleep on the CQ fd) or spin (poll without sleeping, "
          "like fi_pingpong and ucx_perftest)");
ABSL_FLAG(bool, tsv, false,
          "print one tab-separated line per size (size p50 p99 avg pp_MBps stream_MBps "
          "read_MBps) for the provider only, for scripts");
ABSL_FLAG(bool, rma_read, true,
          "also stream RDMA reads of each size (window sends outstanding) where the provider "
          "offers RDMA read, native or emulated: the ceiling of what zero-copy and AZ-SDP can "
          "pull");
ABSL_FLAG(int, idle, 0,
          "more connections, each with one receive posted on both sides, that stay idle on the "
          "measured connection's CQs (how a poll scales with the endpoints a CQ holds)");

namespace zsock {
namespace {

struct Result {
  double p50 = 0, p99 = 0, avg = 0;  // one-way latency, us
  double pp_mbps = 0;                // ping-pong: size / avg one-way, 10^6 B/s
  double gbps = 0;                   // stream, 10^9 bytes per second
  double read_gbps = -1;             // RDMA read stream, 10^9 B/s (-1: not measured)
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

// --idle: connections that carry nothing, each with a receive posted (as a
// server's idle clients have), on the CQ the measured connection uses.
constexpr uint64_t kIdleContext = 0x1d1e;

class IdleConnections {
 public:
  void Add(std::unique_ptr<Endpoint> ep) {
    if (auto st = ep->PostRecv(buf_.data(), buf_.size(), nullptr, kIdleContext); !st.ok()) {
      Die(st.ToString());
    }
    eps_.push_back(std::move(ep));
  }

 private:
  std::array<uint8_t, 64> buf_{};  // never written: nothing is sent on them
  std::vector<std::unique_ptr<Endpoint>> eps_;
};

int Iters(size_t size) {
  int it = absl::GetFlag(FLAGS_iters);
  if (size >= (1 << 20)) return std::max(50, it / 100);
  if (size >= (64 << 10)) return std::max(200, it / 10);
  return it;
}

int64_t StreamCount(size_t size) {
  int64_t n = absl::GetFlag(FLAGS_stream_bytes) / static_cast<int64_t>(std::max<size_t>(size, 1));
  return std::max<int64_t>(64, std::min(n, absl::GetFlag(FLAGS_stream_max_msgs)));
}

// Takes completions off a CQ one at a time. kSpin polls without ever
// sleeping, as fi_pingpong (FI_WAIT_NONE + fi_cq_read) and ucx_perftest
// (ucp_worker_progress) do; kAdaptive uses CompletionQueue::Wait (spin, from
// spin_us adapting up to spin_max_us, then sleep on the CQ fd), the
// library's default.
class Completions {
 public:
  Completions(CompletionQueue* cq, bool spin) : cq_(cq), spin_(spin) {}

  // The next completion, read in place (as an application reads what Poll
  // wrote into its array, and as the peer tools read theirs): valid until
  // the next call. Measured: a copy per completion showed in the small
  // one-way latency over shared memory.
  const Completion& Next() {
    for (;;) {
      if (head_ == n_) Refill();
      const Completion& c = buf_[head_++];
      // An idle connection's receive ends only when the peer has gone.
      if (c.context == kIdleContext) continue;
      if (!c.status.ok()) Die(c.status.ToString());
      return c;
    }
  }

 private:
  void Refill() {
    head_ = n_ = 0;
    if (spin_) {
      // The clock is read only once the poll has gone on for a while: a
      // clock read per completion would be the benchmark's own overhead
      // (fi_pingpong and ucx_perftest read none).
      int64_t give_up = 0;
      for (uint32_t tries = 1; (n_ = cq_->Poll(buf_)) == 0; ++tries) {
        if ((tries & 0xffff) != 0) continue;
        const int64_t now = absl::GetCurrentTimeNanos();
        if (give_up == 0) give_up = now + int64_t{30} * 1000000000;
        if (now > give_up) Die("timed out waiting for a completion");
      }
      return;
    }
    auto n = cq_->Wait(buf_, absl::Seconds(30));
    if (!n.ok()) Die(n.status().ToString());
    if (*n == 0) Die("timed out waiting for a completion");
    n_ = *n;
  }

  CompletionQueue* cq_;
  bool spin_;
  std::array<Completion, 16> buf_;
  size_t head_ = 0, n_ = 0;
};

bool Spin() {
  const std::string w = absl::GetFlag(FLAGS_wait);
  if (w != "spin" && w != "adaptive") Die(absl::StrCat("--wait must be spin or adaptive, not '", w, "'"));
  return w == "spin";
}

int Warmup(size_t size) { return std::max(10, Iters(size) / 10); }

Result Summarize(std::vector<double>& rtt_us, size_t size, double gbps) {
  Result r;
  std::sort(rtt_us.begin(), rtt_us.end());
  double sum = 0;
  for (double v : rtt_us) sum += v;
  r.p50 = rtt_us[rtt_us.size() / 2] / 2;
  r.p99 = rtt_us[std::min(rtt_us.size() - 1, rtt_us.size() * 99 / 100)] / 2;
  r.avg = sum / rtt_us.size() / 2;
  r.pp_mbps = static_cast<double>(size) / r.avg;  // bytes per us = 10^6 B/s
  r.gbps = gbps;
  return r;
}

// ---- provider ----
//
// Ping-pong, as ucx_perftest's tag_lat does it: the server replies as soon
// as a message arrives and then posts its receive for the next one; the
// client sends, then posts the receive for the reply. Replies come from a
// separate send buffer, and send completions are collected as they come
// instead of waited for. One-way latency = the time of one round trip
// (everything in the loop) / 2.

// The server opens its own fabric after the fork (the fork rule in
// docs/provider-interface.md: libfabric's shm and UCX keep threads and
// mappings a forked child does not inherit) and reports its listener's
// address on `report_fd`.
// The ping-pong injects what the provider lets it (Capabilities::
// inject_size: no send completion to reap), as fi_pingpong uses fi_inject
// up to the provider's inject_size and ucx_perftest has nothing to reap for
// a send UCX finished inside the call.
uint64_t SendContext(const Fabric& fabric, size_t size) {
  return size <= fabric.caps().inject_size ? kInjectContext : 0;
}

// The RDMA read stream runs where the provider can read (natively, or
// emulated by the target's progress) and --rma_read is on; both processes
// decide alike from the same flag and the same provider (a two-host run
// must pass the same --rma_read to both sides).
bool RmaRead(const Fabric& fabric) {
  return absl::GetFlag(FLAGS_rma_read) && fabric.caps().rdma_read != Support::kNone;
}

// The RDMA read stream's context values (the ping-pong and stream phases use
// 0 and 1 for receives, 0 for sends).
constexpr uint64_t kKeyCtx = 2;   // client: the receive of the server's key
constexpr uint64_t kDoneCtx = 3;  // server: the receive of the client's "done"
// The server's buffer for the RDMA read stream: position-dependent, so a
// piece read from or into the wrong offset shows.
uint8_t ReadPattern(size_t i) { return static_cast<uint8_t>(i * 131 + i / 4093 + 7); }

// At most this many reads per size: a read is a round trip (the stream of
// small sends is not), and a million 8-byte reads would take seconds.
constexpr int64_t kMaxReads = 100000;

// The server's connections: the measured one and --idle more on its CQ.
// Members are destroyed in reverse order: connections before the fabric.
struct ServerSide {
  std::unique_ptr<Fabric> fabric;
  std::unique_ptr<Listener> listener;
  std::unique_ptr<CompletionQueue> cq;
  std::unique_ptr<Endpoint> ep;
  IdleConnections idle;
};

// Opens the fabric, listens, reports the listener's address on
// `report_fd` (then closes it) and accepts the measured connection and the
// idle ones.
void Serve(const std::string& config, int report_fd, ServerSide* s) {
  auto fabric = Fabric::Open(config);
  if (!fabric.ok()) Die(fabric.status().ToString());
  s->fabric = std::move(*fabric);
  auto listener = s->fabric->Listen(absl::GetFlag(FLAGS_address));
  if (!listener.ok()) Die(listener.status().ToString());
  s->listener = std::move(*listener);
  std::string address = s->listener->address() + "\n";
  if (::write(report_fd, address.data(), address.size()) != static_cast<ssize_t>(address.size())) {
    Die("cannot report the listener's address");
  }
  ::close(report_fd);
  auto cq = s->fabric->CreateCq();
  if (!cq.ok()) Die(cq.status().ToString());
  s->cq = std::move(*cq);
  auto ep = s->listener->Accept(s->cq.get(), absl::Seconds(30));
  if (!ep.ok()) Die(ep.status().ToString());
  s->ep = std::move(*ep);
  for (int i = 0; i < absl::GetFlag(FLAGS_idle); ++i) {
    auto more = s->listener->Accept(s->cq.get(), absl::Seconds(30));
    if (!more.ok()) Die(more.status().ToString());
    s->idle.Add(std::move(*more));
  }
}

// The server's side of one size's ping-pong: reply to each message.
void ServePingpong(const Fabric& fabric, Endpoint* e, Completions& comps, uint8_t* in,
                   size_t max, const uint8_t* out, size_t size) {
  const int rounds = Warmup(size) + Iters(size);
  const uint64_t send_ctx = SendContext(fabric, size);
  int64_t sends = 0, sent = 0;
  if (!e->PostRecv(in, max, nullptr, 0).ok()) Die("post");
  for (int i = 0; i < rounds; ++i) {
    for (;;) {
      const Completion& c = comps.Next();
      if (c.op == OpType::kRecv) break;
      ++sent;
    }
    // The reply first, then the next receive (as ucx_perftest does):
    // re-posting is not on the round trip's path.
    if (!e->Send(out, size, nullptr, send_ctx).ok()) Die("send");
    if (send_ctx != kInjectContext) ++sends;
    if (i + 1 < rounds && !e->PostRecv(in, max, nullptr, 0).ok()) Die("post");
  }
  while (sent < sends) {
    if (comps.Next().op == OpType::kSend) ++sent;
  }
}

// The server's side of one size's stream: keep `window` receives posted
// until every message arrived, then acknowledge.
void ServeStream(Endpoint* e, Completions& comps, std::vector<std::vector<uint8_t>>& bufs,
                 size_t max, const uint8_t* out, size_t size, int window) {
  int64_t count = StreamCount(size);
  int64_t posted = 0, got = 0;
  for (; posted < std::min<int64_t>(window, count); ++posted) {
    if (!e->PostRecv(bufs[posted % window].data(), max, nullptr, posted % window).ok()) Die("post");
  }
  while (got < count) {
    const Completion& c = comps.Next();
    if (c.op != OpType::kRecv) continue;
    ++got;
    if (posted < count) {
      if (!e->PostRecv(bufs[c.context].data(), max, nullptr, c.context).ok()) Die("post");
      ++posted;
    }
  }
  if (!e->Send(out, 1, nullptr, 0).ok()) Die("ack");
  while (comps.Next().op != OpType::kSend) {}
}

// The server's side of one size's RDMA read stream: the client reads
// `target` over and over; this side sends its key, then only makes progress
// (emulated reads need it) until the client says done. The registration is
// made once, in *target_mr, and its key kept in *key.
void ServeReads(Fabric* fabric, Endpoint* e, Completions& comps, std::vector<uint8_t>& target,
                std::unique_ptr<MemoryRegion>* target_mr, std::string* key) {
  std::vector<uint8_t> done(8);
  if (!e->PostRecv(done.data(), done.size(), nullptr, kDoneCtx).ok()) Die("post");
  if (*target_mr == nullptr) {
    auto mr = fabric->RegisterMemory(target.data(), target.size(), kRemoteRead | kLocalRead);
    if (!mr.ok()) Die(mr.status().ToString());
    *target_mr = std::move(*mr);
    *key = (*target_mr)->remote_key().Serialize();
  }
  if (!e->Send(key->data(), key->size(), nullptr, 0).ok()) Die("send key");
  bool key_sent = false, finished = false;
  while (!key_sent || !finished) {
    const Completion& c = comps.Next();
    if (c.op == OpType::kSend) key_sent = true;
    if (c.op == OpType::kRecv && c.context == kDoneCtx) finished = true;
  }
}

void ProviderServer(const std::string& config, int report_fd, const std::vector<size_t>& sizes,
                    int window) {
  ServerSide side;
  Serve(config, report_fd, &side);
  Fabric* fabric = side.fabric.get();
  Endpoint* e = side.ep.get();
  Completions comps(side.cq.get(), Spin());
  size_t max = std::max<size_t>(*std::max_element(sizes.begin(), sizes.end()), 8);
  std::vector<std::vector<uint8_t>> bufs(window, std::vector<uint8_t>(max));
  std::vector<uint8_t> out(max, 0xa5);
  std::vector<uint8_t> target(max);  // what the RDMA read stream reads
  for (size_t i = 0; i < max; ++i) target[i] = ReadPattern(i);
  std::unique_ptr<MemoryRegion> target_mr;
  std::string key;
  for (size_t size : sizes) {
    ServePingpong(*fabric, e, comps, bufs[0].data(), max, out.data(), size);
    ServeStream(e, comps, bufs, max, out.data(), size, window);
    if (RmaRead(*fabric)) ServeReads(fabric, e, comps, target, &target_mr, &key);
  }
  // Stay until the client has everything: a provider may report a send
  // complete before the peer has the data, which must not vanish with us.
  if (!e->PostRecv(bufs[0].data(), max, nullptr, 0).ok()) Die("post");
  while (comps.Next().op != OpType::kRecv) {}
}

// "-" where the read stream did not run, else the rate in `scale` units.
std::string ReadCell(const Result& r, double scale, const char* fmt) {
  if (r.read_gbps < 0) return "-";
  char b[32];
  std::snprintf(b, sizeof(b), fmt, r.read_gbps * scale);
  return b;
}

// The client's RDMA read stream: waits for the server's key, then reads
// `size` bytes from the start of the server's buffer `count` times with
// `window` reads outstanding, checks the bytes against the server's
// pattern, and tells the server it is done. Returns 10^9 B/s.
double ReadStream(Endpoint* e, Completions& comps, Fabric& fabric, std::vector<uint8_t>& keybuf,
                  size_t key_len, std::vector<uint8_t>& in, size_t size, int64_t count,
                  int window) {
  while (key_len == 0) {
    const Completion& c = comps.Next();
    if (c.op == OpType::kRecv && c.context == kKeyCtx) key_len = c.length;
  }
  auto key = RemoteKey::Parse(absl::string_view(reinterpret_cast<const char*>(keybuf.data()), key_len));
  if (!key.ok()) Die(absl::StrCat("the server's remote key: ", key.status().ToString()));
  std::unique_ptr<MemoryRegion> mr;
  if (fabric.caps().registration_required) {
    auto r = fabric.RegisterMemory(in.data(), in.size(), kLocalWrite | kLocalRead);
    if (!r.ok()) Die(r.status().ToString());
    mr = std::move(*r);
  }
  std::fill(in.begin(), in.begin() + size, 0);
  // A read larger than the provider's max_rma_size goes in pieces of at
  // most that (as the SDP engine's zero-copy reads do): `count` reads of
  // `size` bytes are `count * pieces` operations.
  const size_t max_rma = fabric.caps().max_rma_size > 0 ? fabric.caps().max_rma_size : size;
  const int64_t pieces = static_cast<int64_t>((size + max_rma - 1) / max_rma);
  const int64_t total = count * pieces;
  int64_t issued = 0, done = 0;
  auto issue = [&] {
    const size_t off = static_cast<size_t>(issued % pieces) * max_rma;
    const size_t len = std::min(max_rma, size - off);
    auto st = e->Read(in.data() + off, len, mr.get(), key->addr + off, *key, 0);
    if (!st.ok()) Die(absl::StrCat("RDMA read: ", st.ToString()));
    ++issued;
  };
  const int64_t t0 = bench::NowNs();
  while (issued < std::min<int64_t>(window, total)) issue();
  while (done < total) {
    const Completion& c = comps.Next();
    if (c.op != OpType::kRead) continue;
    ++done;
    if (issued < total) issue();
  }
  const double secs = (bench::NowNs() - t0) / 1e9;
  for (size_t i = 0; i < size; ++i) {
    if (in[i] != ReadPattern(i)) {
      Die(absl::StrCat("RDMA read of ", size, " bytes: byte ", i, " is wrong"));
    }
  }
  if (!e->Send(in.data(), 1, nullptr, 0).ok()) Die("done");
  while (comps.Next().op != OpType::kSend) {}
  return static_cast<double>(size) * static_cast<double>(count) / secs / 1e9;
}

// The client's connections: the measured one and --idle more on its CQ.
// Members are destroyed in reverse order: connections before the fabric.
struct ClientSide {
  std::unique_ptr<Fabric> fabric;
  std::unique_ptr<CompletionQueue> cq;
  std::unique_ptr<Endpoint> ep;
  IdleConnections idle;
};

void ConnectClient(const std::string& config, const std::string& address, ClientSide* s) {
  auto fabric = Fabric::Open(config);
  if (!fabric.ok()) Die(fabric.status().ToString());
  s->fabric = std::move(*fabric);
  auto cq = s->fabric->CreateCq();
  if (!cq.ok()) Die(cq.status().ToString());
  s->cq = std::move(*cq);
  auto ep = s->fabric->Connect(address, s->cq.get(), absl::Seconds(30));
  if (!ep.ok()) Die(ep.status().ToString());
  s->ep = std::move(*ep);
  for (int i = 0; i < absl::GetFlag(FLAGS_idle); ++i) {
    auto more = s->fabric->Connect(address, s->cq.get(), absl::Seconds(30));
    if (!more.ok()) Die(more.status().ToString());
    s->idle.Add(std::move(*more));
  }
}

// The client's side of one size's ping-pong; returns the timed round trips
// in us.
std::vector<double> PingpongRounds(const Fabric& fabric, Endpoint* e, Completions& comps,
                             const uint8_t* out, uint8_t* in, size_t max, size_t size) {
  const int warmup = Warmup(size), rounds = warmup + Iters(size);
  const uint64_t send_ctx = SendContext(fabric, size);
  std::vector<double> rtt;
  bench::ReserveTouched(&rtt, rounds);
  int64_t sends = 0, sent = 0;
  int64_t prev = bench::NowNs();
  for (int i = 0; i < rounds; ++i) {
    if (!e->Send(out, size, nullptr, send_ctx).ok()) Die("send");
    if (send_ctx != kInjectContext) ++sends;
    // Posted after the send (as ucx_perftest does): the reply takes longer.
    if (!e->PostRecv(in, max, nullptr, 0).ok()) Die("post");
    for (;;) {
      const Completion& c = comps.Next();
      if (c.op == OpType::kRecv) break;
      ++sent;
    }
    int64_t now = bench::NowNs();
    if (i >= warmup) rtt.push_back((now - prev) / 1000.0);
    prev = now;
  }
  while (sent < sends) {
    if (comps.Next().op == OpType::kSend) ++sent;
  }
  return rtt;
}

// The client's side of one size's stream: `count` sends with `window`
// outstanding, until the server's acknowledgement. Returns the seconds;
// *key_len is the length of the server's key if it arrived meanwhile.
double StreamSends(Endpoint* e, Completions& comps, const uint8_t* out, size_t size, int64_t count,
              int window, size_t* key_len) {
  int64_t t0 = bench::NowNs();
  int64_t sent_n = 0, done = 0;
  for (; sent_n < std::min<int64_t>(window, count); ++sent_n) {
    if (!e->Send(out, size, nullptr, 0).ok()) Die("send");
  }
  bool acked = false;
  while (done < count || !acked) {
    const Completion& c = comps.Next();
    if (c.op == OpType::kRecv) {
      if (c.context == kKeyCtx) {
        *key_len = c.length;
      } else {
        acked = true;
      }
      continue;
    }
    ++done;
    if (sent_n < count) {
      if (!e->Send(out, size, nullptr, 0).ok()) Die("send");
      ++sent_n;
    }
  }
  return (bench::NowNs() - t0) / 1e9;
}

std::vector<Result> ProviderClient(const std::string& config, const std::string& address,
                                   const std::vector<size_t>& sizes, int window) {
  ClientSide side;
  ConnectClient(config, address, &side);
  Fabric& fabric = *side.fabric;
  Endpoint* e = side.ep.get();
  Completions comps(side.cq.get(), Spin());
  size_t max = std::max<size_t>(*std::max_element(sizes.begin(), sizes.end()), 8);
  std::vector<uint8_t> out(max, 0x5a), in(max);
  std::vector<uint8_t> keybuf(4096);
  std::vector<Result> results;
  for (size_t size : sizes) {
    std::vector<double> rtt = PingpongRounds(fabric, e, comps, out.data(), in.data(), max, size);
    int64_t count = StreamCount(size);
    if (!e->PostRecv(in.data(), max, nullptr, 1).ok()) Die("post");
    // The server's key follows its acknowledgement of the stream: posted
    // now, the receive is in place before it can arrive.
    const bool rma = RmaRead(fabric);
    if (rma && !e->PostRecv(keybuf.data(), keybuf.size(), nullptr, kKeyCtx).ok()) Die("post");
    size_t key_len = 0;  // the server's key, if it came while sends were still completing
    double secs = StreamSends(e, comps, out.data(), size, count, window, &key_len);
    results.push_back(Summarize(rtt, size, static_cast<double>(size) * count / secs / 1e9));
    if (rma) {
      results.back().read_gbps = ReadStream(e, comps, fabric, keybuf, key_len, in, size,
                                            std::min<int64_t>(count, kMaxReads), window);
    }
  }
  if (!e->Send(out.data(), 1, nullptr, 0).ok()) Die("bye");
  while (comps.Next().op != OpType::kSend) {}
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
    bench::ReserveTouched(&rtt, Iters(size));
    for (int i = 0; i < Iters(size); ++i) {
      int64_t t0 = bench::NowNs();
      FullIo(fd, buf.data(), size, true);
      FullIo(fd, buf.data(), size, false);
      rtt.push_back((bench::NowNs() - t0) / 1000.0);
    }
    int64_t count = StreamCount(size);
    int64_t t0 = bench::NowNs();
    for (int64_t i = 0; i < count; ++i) FullIo(fd, buf.data(), size, true);
    FullIo(fd, buf.data(), 1, false);
    double secs = (bench::NowNs() - t0) / 1e9;
    results.push_back(Summarize(rtt, size, static_cast<double>(size) * count / secs / 1e9));
  }
  ::close(fd);
  return results;
}

// Runs `server` in a child pinned to the first of --cores and `client` here
// on the second.
template <typename ServerFn, typename ClientFn>
std::vector<Result> RunPair(ServerFn server, ClientFn client) {
  std::vector<std::string> cores = absl::StrSplit(absl::GetFlag(FLAGS_cores), ',');
  int server_core = 0, client_core = 1;
  if (cores.size() != 2 || !absl::SimpleAtoi(cores[0], &server_core) ||
      !absl::SimpleAtoi(cores[1], &client_core)) {
    Die("--cores must be two core numbers, e.g. 0,1");
  }
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    Pin(server_core);
    server();
    std::fflush(nullptr);
    _exit(0);
  }
  Pin(client_core);
  std::vector<Result> r = client();
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Die("server process failed");
  return r;
}

std::vector<size_t> SizesFromFlag() {
  std::vector<size_t> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    size_t v;
    if (!absl::SimpleAtoi(s, &v) || v == 0) Die(absl::StrCat("bad size '", s, "'"));
    sizes.push_back(v);
  }
  return sizes;
}

void PrintTableHeader() {
  std::printf("%-10s %-10s %10s %10s %10s %12s %12s\n", "transport", "size", "lat_p50us",
              "lat_p99us", "lat_avgus", "bw_GB/s", "read_GB/s");
}

void PrintTableRow(const char* transport, size_t size, const Result& r, const std::string& read) {
  std::printf("%-10s %-10zu %10.2f %10.2f %10.2f %12.3f %12s\n", transport, size, r.p50, r.p99,
              r.avg, r.gbps, read.c_str());
}

// --role=both: the provider's server in a child, its client here.
std::vector<Result> RunProviderPair(const std::string& config, const std::vector<size_t>& sizes,
                                    int window) {
  std::fprintf(stderr, "running %s ...\n", config.c_str());
  int report[2];
  if (::pipe(report) != 0) Die("pipe");
  return RunPair(
      [&] {
        ::close(report[0]);
        ProviderServer(config, report[1], sizes, window);
      },
      [&] {
        ::close(report[1]);
        std::string address;
        char ch;
        while (::read(report[0], &ch, 1) == 1 && ch != '\n') address += ch;
        ::close(report[0]);
        if (address.empty()) Die("the server process could not listen (its error is above)");
        return ProviderClient(config, address, sizes, window);
      });
}

// Kernel TCP over loopback with the same sizes.
std::vector<Result> RunTcpPair(const std::vector<size_t>& sizes) {
  std::fprintf(stderr, "running kernel TCP (loopback, TCP_NODELAY) ...\n");
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t sl = sizeof(sa);
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&sa), sl) != 0 || ::listen(lfd, 1) != 0) {
    Die("tcp listen");
  }
  getsockname(lfd, reinterpret_cast<sockaddr*>(&sa), &sl);
  int port = ntohs(sa.sin_port);
  auto tcp = RunPair([&] { TcpServer(lfd, sizes); }, [&] { return TcpClient(port, sizes); });
  ::close(lfd);
  return tcp;
}

// The provider's rows, kernel TCP's beside them, and the ratios.
void PrintComparison(const std::string& config, const std::vector<size_t>& sizes,
                     const std::vector<Result>& zs, const std::vector<Result>& tcp) {
  PrintTableHeader();
  for (size_t i = 0; i < sizes.size(); ++i) {
    PrintTableRow(config.c_str(), sizes[i], zs[i], ReadCell(zs[i], 1, "%.3f"));
    if (!tcp.empty()) PrintTableRow("tcp", sizes[i], tcp[i], "-");
  }
  if (!tcp.empty()) {
    std::printf("\n%-10s %16s %16s\n", "size", "latency tcp/zs", "bandwidth zs/tcp");
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::printf("%-10zu %15.1fx %15.1fx\n", sizes[i], tcp[i].p50 / zs[i].p50,
                  zs[i].gbps / tcp[i].gbps);
    }
  }
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  bench::Calibrate();  // before the forks: the children inherit it
  const std::vector<size_t> sizes = SizesFromFlag();
  const std::string config = absl::GetFlag(FLAGS_provider);
  const int window = absl::GetFlag(FLAGS_window);
  const std::string role = absl::GetFlag(FLAGS_role);
  if (role == "server") {
    std::fprintf(stderr, "serving %s; run the client with --address=", config.c_str());
    ProviderServer(config, ::dup(STDERR_FILENO), sizes, window);
    return 0;
  }
  if (role == "client") {
    if (absl::GetFlag(FLAGS_address).empty()) Die("--role=client needs --address=<server address>");
    auto results = ProviderClient(config, absl::GetFlag(FLAGS_address), sizes, window);
    PrintTableHeader();
    for (size_t i = 0; i < sizes.size(); ++i) {
      PrintTableRow(config.c_str(), sizes[i], results[i], ReadCell(results[i], 1, "%.3f"));
    }
    return 0;
  }
  if (role != "both") Die("--role is both, server or client");
  auto zs = RunProviderPair(config, sizes, window);
  if (absl::GetFlag(FLAGS_tsv)) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::printf("%zu\t%.3f\t%.3f\t%.3f\t%.1f\t%.1f\t%s\n", sizes[i], zs[i].p50, zs[i].p99,
                  zs[i].avg, zs[i].pp_mbps, zs[i].gbps * 1000,
                  ReadCell(zs[i], 1000, "%.1f").c_str());
    }
    return 0;
  }
  std::vector<Result> tcp;
  if (absl::GetFlag(FLAGS_baseline_tcp)) tcp = RunTcpPair(sizes);
  PrintComparison(config, sizes, zs, tcp);
  return 0;
}

}  // namespace
}  // namespace zsock

int main(int argc, char** argv) { return zsock::Main(argc, argv); }
