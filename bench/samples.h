// bench::ReserveTouched: room for a timed loop's per-iteration samples,
// with its memory already mapped.
//
// Why: vector::reserve maps nothing (a large allocation is a fresh mmap
// whose pages appear at first touch), so a loop that push_backs one
// double per round trip took a minor page fault every page of samples,
// inside the time it measured (measured with provider_bench: the round
// trips that crossed a page were several times slower than the others;
// the peer tools keep no such array). Writing the whole array once before
// the clock starts moves those faults out of the measurement. No library
// offers this (a vector with a pre-faulting allocator would do the same
// at more length).
#pragma once

#include <cstddef>
#include <vector>

namespace zsock::bench {

// Empties `v` and leaves room for `n` samples whose pages are resident.
inline void ReserveTouched(std::vector<double>* v, size_t n) {
  // Writes every element, so every page (not zeros: nothing may turn that
  // into a calloc that skips them); clear keeps the capacity and the pages.
  v->assign(n, -1.0);
  v->clear();
}

}  // namespace zsock::bench
