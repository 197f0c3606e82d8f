// The pipe protocol between zsock_bench's child processes and the parent:
// frames [type u8][length u32][payload], native byte order (both ends are
// the same binary on the same host). The server sends its port, every
// process one result per point it measured, and a failing process one
// error (its cause, as text) before it exits.
#ifndef ZSOCK_BENCH_FRAMES_H_
#define ZSOCK_BENCH_FRAMES_H_

#include <cstddef>
#include <cstdint>

namespace zsock::bench::internal {

constexpr char kFramePort = 'P';    // payload: u16 port
constexpr char kFrameResult = 'R';  // payload: PointWire, then `samples` doubles
constexpr char kFrameError = 'E';   // payload: the message
constexpr size_t kFrameHeaderSize = 5;

// One process's measurement of one point.
struct PointWire {
  int32_t point;
  int32_t pad;
  int64_t iterations;
  int64_t bytes;
  int64_t messages;
  double seconds;
  int64_t samples;  // latency samples (us) that follow
};

}  // namespace zsock::bench::internal

#endif  // ZSOCK_BENCH_FRAMES_H_
