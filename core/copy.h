// CopyBytes: memcpy for the bulk copies of the data path (SDP's bcopy
// slots and receive queue, unet's segment buffers, emulated RMA).
//
// Why not plain memcpy everywhere: glibc 2.36 (Debian 12) copies sizes from
// its rep_movsb threshold (2112 bytes by default) up to the L2 cache size
// with `rep movsb`, and on AMD EPYC processors (Zen 3 and later) that
// instruction falls to 2-3 GB/s, against 35-80 GB/s otherwise, when the
// destination lies 1 to 31 bytes past the source modulo 64 (so that each
// load aliases a store just made, modulo 4 KiB). SDP meets exactly that
// case: a page-aligned user buffer is copied into a slot after the 16-byte
// message header. Measured on the AMD EPYC CI machine (bench/copy_bench):
// 4 KiB and 64 KiB copies at +16 bytes ran at 2.5-2.8 GB/s, and unet's
// stream at 4 KiB to 64 KiB fell from 8-17 GB/s to 1.3-3 GB/s.
//
// What CopyBytes does instead, for those copies only (above 2 KiB, at most
// the L2 size, destination 1-31 bytes past the source modulo 64; and from
// 24 KiB, 33-63 bytes past, where memcpy gives 18-33 GB/s): a copy from the
// end towards the start in 128-byte steps of 32-byte AVX2 loads and
// stores. Going backwards, no load meets a store to the same address
// modulo 4 KiB, and it runs at 31-47 GB/s at every such offset. Everything
// else goes to memcpy. Written here because no library in Debian 12 offers
// a copy that avoids the aliasing: glibc's tunable
// glibc.cpu.x86_rep_movsb_threshold can only be set in the environment
// before a process starts, which a library cannot do for its users.
//
// The configuration key `data_copy` chooses: `auto` (the default: the
// backward copy on AMD processors with AVX2), `on` (on any x86-64 processor
// with AVX2) or `off` (memcpy always). docs/configuration.md.
#ifndef ZSOCK_CORE_COPY_H_
#define ZSOCK_CORE_COPY_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/strings/string_view.h"

namespace zsock {

namespace copy_internal {

// Copies at or below this go to memcpy, whose vector loop handles them.
inline constexpr size_t kSmallCopy = 2048;
// From this size on, skews of 33-63 go backwards too (copy_bench: memcpy
// 18-33 GB/s against 32-40 from 32 KiB up; memcpy wins at 16 KiB and
// below, where both buffers fit the L1 cache).
inline constexpr size_t kLargeCopy = 24 * 1024;

// Whether a copy of n bytes from src to dst takes the backward path when
// the backward path is enabled for sizes up to max_size. The skew is how
// far the destination lies past the source modulo 64.
inline bool WantsBackward(uintptr_t dst, uintptr_t src, size_t n, size_t max_size) {
  const uintptr_t skew = (dst - src) & 63;
  if (n <= kSmallCopy || n > max_size || skew == 0 || skew == 32) return false;
  return skew < 32 || n >= kLargeCopy;
}

// The backward copy itself (dst and src must not overlap). Exposed for
// tests and the benchmark; it needs AVX2 (HaveBackwardCopy()).
void CopyBackward(void* dst, const void* src, size_t n);
bool HaveBackwardCopy();

// The largest size the backward path takes for the configuration's choice
// (`auto`, `on` or `off`) on this processor; 0 when it is off.
size_t LimitFor(absl::string_view choice);

// LimitFor the global configuration's `data_copy`, decided at the first
// call.
size_t BackwardLimit();

void CopyLarge(void* dst, const void* src, size_t n);

}  // namespace copy_internal

// memcpy's contract: dst and src do not overlap.
inline void CopyBytes(void* dst, const void* src, size_t n) {
  if (n <= copy_internal::kSmallCopy) {
    std::memcpy(dst, src, n);
    return;
  }
  copy_internal::CopyLarge(dst, src, n);
}

}  // namespace zsock

#endif  // ZSOCK_CORE_COPY_H_
