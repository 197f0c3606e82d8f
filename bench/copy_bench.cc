// copy_bench: what one bulk copy costs, by size and by how far the
// destination lies past the source modulo 64 (the skew), for glibc's memcpy
// and for zsock's CopyBytes (core/copy.h), in one run (Google Benchmark).
//
//   bazel run -c opt //bench:copy_bench -- [benchmark flags]
//
// The arguments are {size, skew}. The source is page-aligned; the
// destination is page-aligned plus the skew, as SDP's slot payload lies 16
// bytes after its header. Both buffers stay in the cache (each iteration
// copies the same bytes), so this is the copy's own speed; bytes_per_second
// is the figure to compare. On AMD EPYC (Zen 3 and later) with glibc 2.36,
// memcpy at small skews, from a few KiB up to the L2 size, runs several
// times slower than aligned (measured with this benchmark).
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "benchmark/benchmark.h"
#include "core/copy.h"

namespace zsock {
namespace {

constexpr size_t kMax = size_t{4} << 20;

struct Buffers {
  uint8_t* src;
  uint8_t* dst;
  Buffers() {
    src = static_cast<uint8_t*>(std::aligned_alloc(4096, kMax + 4096));
    dst = static_cast<uint8_t*>(std::aligned_alloc(4096, kMax + 4096));
    std::memset(src, 1, kMax + 4096);
    std::memset(dst, 2, kMax + 4096);
  }
};

Buffers& Bufs() {
  static Buffers* b = new Buffers;
  return *b;
}

template <void (*Copy)(void*, const void*, size_t)>
void BM_Copy(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  uint8_t* dst = Bufs().dst + state.range(1);
  const uint8_t* src = Bufs().src;
  for (auto _ : state) {
    Copy(dst, src, n);
    benchmark::DoNotOptimize(dst);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
}

void Memcpy(void* d, const void* s, size_t n) { std::memcpy(d, s, n); }

void Args(benchmark::internal::Benchmark* b) {
  for (int64_t size : {1024, 4096, 8192, 16384, 32752, 65536, 262144, 1 << 20, 4 << 20}) {
    for (int64_t skew : {0, 8, 16, 32, 40, 48, 56}) b->Args({size, skew});
  }
}

BENCHMARK(BM_Copy<Memcpy>)->Name("memcpy")->Apply(Args);
BENCHMARK(BM_Copy<CopyBytes>)->Name("CopyBytes")->Apply(Args);
// The backward copy alone, whatever the skew (it needs AVX2).
BENCHMARK(BM_Copy<copy_internal::CopyBackward>)->Name("backward")->Apply(Args);

}  // namespace
}  // namespace zsock

BENCHMARK_MAIN();
