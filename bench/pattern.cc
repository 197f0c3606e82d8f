// The test data pattern, buffers and busy computation (see pattern.h).
#include "bench/pattern.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/child_io.h"
#include "bench/clock.h"

namespace zsock::bench::internal {
namespace {

inline uint64_t PatternWord(size_t i, uint64_t seed) {
  return (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ULL ^ seed;
}

[[noreturn]] void Mismatch(const uint8_t* p, size_t n, uint64_t seed, size_t word,
                           absl::string_view what) {
  uint64_t w = PatternWord(word, seed);
  const auto* e = reinterpret_cast<const uint8_t*>(&w);
  size_t off = 8 * word;
  while (off + 1 < n && off + 1 < 8 * word + 8 && p[off] == e[off - 8 * word]) ++off;
  Die(absl::StrFormat(
      "data corrupted: %s (%zu bytes) differs from what was sent at byte %zu "
      "(expected 0x%02x, got 0x%02x); the transport lost, reordered or damaged data",
      what, n, off, e[off - 8 * word], p[off]));
}

}  // namespace

uint64_t Seed(int point, int64_t epoch) {
  return (static_cast<uint64_t>(point + 1) << 40) ^
         (static_cast<uint64_t>(epoch + 1) * 0xD6E8FEB86659FD93ULL);
}

void Fill(uint8_t* p, size_t n, uint64_t seed) {
  size_t words = n / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w = PatternWord(i, seed);
    std::memcpy(p + 8 * i, &w, 8);
  }
  if (n % 8 != 0) {
    uint64_t w = PatternWord(words, seed);
    std::memcpy(p + 8 * words, &w, n % 8);
  }
}

void Check(const uint8_t* p, size_t n, uint64_t seed, absl::string_view what) {
  const size_t words = n / 8;
  uint64_t diff = 0;
  for (size_t i = 0; i < words; ++i) {  // branch-free, so it vectorizes
    uint64_t got;
    std::memcpy(&got, p + 8 * i, 8);
    diff |= got ^ PatternWord(i, seed);
  }
  if (diff != 0) {
    for (size_t i = 0; i < words; ++i) {
      uint64_t got;
      std::memcpy(&got, p + 8 * i, 8);
      if (got != PatternWord(i, seed)) Mismatch(p, n, seed, i, what);
    }
  }
  if (n % 8 != 0) {
    uint64_t w = PatternWord(words, seed);
    if (std::memcmp(p + 8 * words, &w, n % 8) != 0) Mismatch(p, n, seed, words, what);
  }
}

Buffer::Buffer(size_t len) : len_(std::max<size_t>(len, 8)) {
  void* p = mmap(nullptr, len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) Die(absl::StrCat("mmap of ", len_, " bytes failed: ", Errno(errno)));
  p_ = static_cast<uint8_t*>(p);
}

Buffer::~Buffer() { munmap(p_, len_); }

void Compute(int64_t us) {
  const int64_t end = NowNs() + us * 1000;
  volatile uint64_t x = 1;
  while (NowNs() < end) x = x * 6364136223846793005ULL + 1;
}

}  // namespace zsock::bench::internal
