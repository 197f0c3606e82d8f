#include "core/copy.h"

#include <unistd.h>

#include <string>

#include "core/config.h"
#include "core/log.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace zsock {
namespace copy_internal {

#if defined(__x86_64__)

bool HaveBackwardCopy() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}

// From the end towards the start, 128 bytes a step: each step loads below
// the stores just made, so no load waits on a recent store to the same
// address modulo 4 KiB (the aliasing that stalls forward copies when the
// destination is a little past the source). The first n % 128 bytes
// go last, through memcpy (a short copy, below rep movsb's threshold).
__attribute__((target("avx2"))) void CopyBackward(void* dst, const void* src, size_t n) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  size_t i = n;
  while (i >= 128) {
    i -= 128;
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 96), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 64), b);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 32), c);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), e);
  }
  std::memcpy(d, s, i);
}

#else  // not x86-64: rep movsb is an x86 matter

bool HaveBackwardCopy() { return false; }
void CopyBackward(void* dst, const void* src, size_t n) { std::memcpy(dst, src, n); }

#endif

size_t LimitFor(absl::string_view choice) {
  if (choice == "off") return 0;
  if (!HaveBackwardCopy()) {
    if (choice == "on") {
      ZS_LOG(kWarn, "data_copy=on: this processor has no AVX2 (or is not x86-64); copies use memcpy");
    }
    return 0;
  }
#if defined(__x86_64__)
  if (choice == "auto" && !__builtin_cpu_is("amd")) return 0;
#endif
  // glibc uses rep movsb up to the L2 size on AMD processors; above it,
  // its own loops (which handle the aliasing) take over.
  long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
  return l2 > 0 ? static_cast<size_t>(l2) : size_t{1} << 20;
}

size_t BackwardLimit() {
  static const size_t limit = [] {
    std::string choice = "auto";
    const auto& config = Config::Global();
    if (config.ok()) choice = config->GetString("data_copy");
    const size_t n = LimitFor(choice);
    if (n > 0) {
      ZS_LOG(kInfo, "data_copy=%s: copies of 2 KiB to %zu bytes whose destination is 1-31 "
             "bytes past the source modulo 64 (from 24 KiB also 33-63) go backwards "
             "(core/copy.h)", choice, n);
    }
    return n;
  }();
  return limit;
}

void CopyLarge(void* dst, const void* src, size_t n) {
  if (WantsBackward(reinterpret_cast<uintptr_t>(dst), reinterpret_cast<uintptr_t>(src), n,
                    BackwardLimit())) {
    CopyBackward(dst, src, n);
  } else {
    std::memcpy(dst, src, n);
  }
}

}  // namespace copy_internal
}  // namespace zsock
