// endpoint_ops_bench: the software cost of one provider operation, both
// sides in one thread (Google Benchmark). Unlike provider_bench (two pinned
// processes, wall-clock latency), this measures CPU time per message with no
// wire wait in it, so it is stable on a loaded machine and shows what the
// provider's bookkeeping costs (locks, allocations, completion objects).
//
//   bazel run -c opt //bench:endpoint_ops_bench -- [--config=unet] [benchmark flags]
//
// Each iteration: post a receive, send `size` bytes, poll both completion
// queues until the receive and the send have completed.
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "core/provider.h"

namespace zsock {
namespace {

std::string g_config = "unet";

struct Pair {
  std::unique_ptr<Fabric> fabric;
  std::unique_ptr<CompletionQueue> cq_a, cq_b;
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Endpoint> a, b;
};

absl::Status Setup(Pair* p) {
  auto fabric = Fabric::Open(g_config);
  if (!fabric.ok()) return fabric.status();
  p->fabric = std::move(*fabric);
  auto cq_a = p->fabric->CreateCq();
  if (!cq_a.ok()) return cq_a.status();
  auto cq_b = p->fabric->CreateCq();
  if (!cq_b.ok()) return cq_b.status();
  p->cq_a = std::move(*cq_a);
  p->cq_b = std::move(*cq_b);
  auto listener = p->fabric->Listen("");
  if (!listener.ok()) return listener.status();
  p->listener = std::move(*listener);
  absl::StatusOr<std::unique_ptr<Endpoint>> accepted = absl::UnknownError("not run");
  std::thread t([&] { accepted = p->listener->Accept(p->cq_b.get(), absl::Seconds(30)); });
  auto connected = p->fabric->Connect(p->listener->address(), p->cq_a.get(), absl::Seconds(30));
  t.join();
  if (!connected.ok()) return connected.status();
  if (!accepted.ok()) return accepted.status();
  p->a = std::move(*connected);
  p->b = std::move(*accepted);
  return absl::OkStatus();
}

// Polls both queues until `cq_want` yields one completion of `want` and
// `cq_other` one of `other`; false on error. Both queues are polled on every
// spin: a provider with manual progress (ofi:shm) moves a message only when
// the sender's side is progressed too.
bool PollBoth(CompletionQueue* cq_want, OpType want, CompletionQueue* cq_other, OpType other,
              std::string* error) {
  Completion c;
  bool got_want = false, got_other = false;
  for (long spins = 0; spins < 100000000; ++spins) {
    if (!got_want && cq_want->Poll(std::span<Completion>(&c, 1)) == 1) {
      if (!c.status.ok()) {
        *error = c.status.ToString();
        return false;
      }
      got_want = c.op == want;
    }
    if (!got_other && cq_other->Poll(std::span<Completion>(&c, 1)) == 1) {
      if (!c.status.ok()) {
        *error = c.status.ToString();
        return false;
      }
      got_other = c.op == other;
    }
    if (got_want && got_other) return true;
  }
  *error = "no completion after 1e8 polls";
  return false;
}

void BM_SendRecv(benchmark::State& state) {
  Pair p;
  if (absl::Status s = Setup(&p); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  const size_t size = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> src(size, 0x5a), dst(size);
  std::string error;
  for (auto _ : state) {
    if (!p.b->PostRecv(dst.data(), size, nullptr, 1).ok() ||
        !p.a->Send(src.data(), size, nullptr, 2).ok()) {
      state.SkipWithError("post or send failed");
      break;
    }
    if (!PollBoth(p.cq_b.get(), OpType::kRecv, p.cq_a.get(), OpType::kSend, &error)) {
      state.SkipWithError(error.c_str());
      break;
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(size));
  p.a->Close();
  p.b->Close();
}
BENCHMARK(BM_SendRecv)->Arg(8)->Arg(64)->Arg(1024)->Arg(4096)->Arg(65536);

// A ping-pong's half: post a receive, inject `size` bytes (no send
// completion, Capabilities::inject_size), poll the receiver until the
// receive has completed. What a latency benchmark's turn costs in software.
void BM_InjectRecv(benchmark::State& state) {
  Pair p;
  if (absl::Status s = Setup(&p); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  const size_t size = static_cast<size_t>(state.range(0));
  if (size > p.fabric->caps().inject_size) {
    state.SkipWithError("larger than the provider's inject_size");
    return;
  }
  std::vector<uint8_t> src(size, 0x5a), dst(size);
  Completion c;
  for (auto _ : state) {
    if (!p.b->PostRecv(dst.data(), size, nullptr, 1).ok() ||
        !p.a->Send(src.data(), size, nullptr, kInjectContext).ok()) {
      state.SkipWithError("post or send failed");
      break;
    }
    long spins = 0;
    while (p.cq_b->Poll(std::span<Completion>(&c, 1)) == 0) {
      // A provider with manual progress moves the message only when the
      // sender's side is progressed too.
      p.cq_a->Poll(std::span<Completion>(&c, 0));
      if (++spins == 100000000) break;
    }
    if (spins == 100000000 || !c.status.ok() || c.op != OpType::kRecv) {
      state.SkipWithError(spins == 100000000 ? "no completion after 1e8 polls"
                                             : c.status.ToString().c_str());
      break;
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(size));
  p.a->Close();
  p.b->Close();
}
BENCHMARK(BM_InjectRecv)->Arg(8)->Arg(64);

// One-sided read and write of `size` bytes between two registered buffers
// (unet: cross-memory attach; others: native or core emulation).
void BM_Rma(benchmark::State& state, OpType op) {
  Pair p;
  if (absl::Status s = Setup(&p); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  const size_t size = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> local(size, 0x5a), remote(size, 0xa5);
  auto lmr = p.fabric->RegisterMemory(local.data(), size, kAccessAll);
  auto rmr = p.fabric->RegisterMemory(remote.data(), size, kAccessAll);
  if (!lmr.ok() || !rmr.ok()) {
    state.SkipWithError("registration failed");
    return;
  }
  RemoteKey key = (*rmr)->remote_key();
  const uint64_t addr = reinterpret_cast<uint64_t>(remote.data());
  std::string error;
  for (auto _ : state) {
    absl::Status s = op == OpType::kRead
                         ? p.a->Read(local.data(), size, lmr->get(), addr, key, 3)
                         : p.a->Write(local.data(), size, lmr->get(), addr, key, 3);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
    // The target's progress serves emulated accesses.
    Completion c;
    bool done = false;
    for (long spins = 0; !done && spins < 100000000; ++spins) {
      p.cq_b->Poll(std::span<Completion>(&c, 1));
      if (p.cq_a->Poll(std::span<Completion>(&c, 1)) == 1) {
        if (!c.status.ok()) {
          error = c.status.ToString();
          break;
        }
        done = c.op == op;
      }
    }
    if (!done) {
      state.SkipWithError(error.empty() ? "no completion" : error.c_str());
      break;
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(size));
  p.a->Close();
  p.b->Close();
}
BENCHMARK_CAPTURE(BM_Rma, read, OpType::kRead)->Arg(4096)->Arg(65536)->Arg(1 << 20);
BENCHMARK_CAPTURE(BM_Rma, write, OpType::kWrite)->Arg(4096)->Arg(65536)->Arg(1 << 20);

// An empty poll: what a waiting thread pays per spin.
void BM_EmptyPoll(benchmark::State& state) {
  Pair p;
  if (absl::Status s = Setup(&p); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  Completion c;
  for (auto _ : state) {
    benchmark::DoNotOptimize(p.cq_b->Poll(std::span<Completion>(&c, 1)));
  }
  p.a->Close();
  p.b->Close();
}
BENCHMARK(BM_EmptyPoll);

}  // namespace
}  // namespace zsock

int main(int argc, char** argv) {
  // --config=<fabric config> is ours; the rest goes to Google Benchmark.
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--config=", 9) == 0) {
      zsock::g_config = argv[i] + 9;
    } else {
      rest.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
