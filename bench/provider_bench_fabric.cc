// provider_bench's provider side (see provider_bench.h): the server and
// the client over one fabric, per size a ping-pong, a stream with a window
// of sends outstanding and, where the provider can read, a stream of RDMA
// reads.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "bench/clock.h"
#include "bench/provider_bench.h"
#include "bench/samples.h"
#include "core/provider.h"

namespace zsock::provider_bench {
namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace zsock::provider_bench
