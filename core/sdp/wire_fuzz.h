// The SDP parser fuzz body, shared by the libFuzzer target
// (tools/fuzz.sh sdp-wire) and the gtest that runs it in CI (wire_fuzz_test.cc).
#ifndef ZSOCK_CORE_SDP_WIRE_FUZZ_H_
#define ZSOCK_CORE_SDP_WIRE_FUZZ_H_

#include <cstddef>
#include <cstdint>

namespace zsock::sdp::wire {

// Decodes `data`; when it decodes, re-encodes it and checks that the bytes
// round-trip exactly. Aborts (a finding) on any inconsistency.
void FuzzOne(const uint8_t* data, size_t size);

}  // namespace zsock::sdp::wire

#endif  // ZSOCK_CORE_SDP_WIRE_FUZZ_H_
