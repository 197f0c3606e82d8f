// What the handshake learns about a peer before it picks transports:
// whether it runs on this host (the boot id) and whether this process can
// attach its shared memory the way UCX's posix transport does (the probe:
// a memfd holding a random word, which the peer opens through /proc).
#ifndef ZSOCK_PROVIDERS_UCX_PEER_PROBE_H_
#define ZSOCK_PROVIDERS_UCX_PEER_PROBE_H_

#include <array>
#include <cstdint>

#include "absl/status/status.h"

namespace zsock::ucx {

// This boot's id (the same in every process of this host).
std::array<uint8_t, 16> BootId();

uint64_t RandomU64();

// A tiny memfd holding a random word, kept open for the life of the
// process. A peer that can open /proc/<our pid>/fd/<fd> (what UCX's posix
// transport does to attach our segments) and read the word can share
// memory with us; EACCES there means another user or ptrace policy.
struct ShmProbe {
  int fd = -1;  // -1: no probe could be made
  uint64_t nonce = 0;
};
const ShmProbe& Probe();

// Whether we can attach shared memory of process `pid` (which sent its
// probe's fd and nonce). OK, or why not (with what to do).
absl::Status ProbeSharedMemory(uint32_t pid, int32_t fd, uint64_t nonce);

}  // namespace zsock::ucx

#endif  // ZSOCK_PROVIDERS_UCX_PEER_PROBE_H_
