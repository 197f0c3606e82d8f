// The data zsock_bench's tests send and check, the page-aligned buffers
// they move it through, and the busy computation of the overlap test.
//
// Every point sends a pattern derived from (point, epoch) (the pagefault
// test starts a new epoch each time the sender rewrites its buffer), so a
// receiver can check any message it gets without being told its content:
// a transport that drops, reorders or corrupts bytes fails the run.
#ifndef ZSOCK_BENCH_PATTERN_H_
#define ZSOCK_BENCH_PATTERN_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace zsock::bench::internal {

// The pattern's seed for `point` at `epoch`.
uint64_t Seed(int point, int64_t epoch);

// Writes the pattern of `seed` into p[0, n).
void Fill(uint8_t* p, size_t n, uint64_t seed);
// Dies (data corrupted, naming the first differing byte) unless p[0, n)
// holds the pattern of `seed`. `what` names the message.
void Check(const uint8_t* p, size_t n, uint64_t seed, absl::string_view what);

// A page-aligned buffer (zero-copy paths and AZ-SDP work on whole pages).
class Buffer {
 public:
  explicit Buffer(size_t len);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* data() { return p_; }

 private:
  size_t len_;
  uint8_t* p_;
};

// Busy computation for `us` microseconds (overlap test).
void Compute(int64_t us);

}  // namespace zsock::bench::internal

#endif  // ZSOCK_BENCH_PATTERN_H_
