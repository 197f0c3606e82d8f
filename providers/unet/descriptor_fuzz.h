// The fuzz body for unet's checks on what a peer writes into shared memory
// (descriptor.h, and ValidHelloParams in segment.h), shared by the
// libFuzzer target (descriptor_fuzz.cc built with -DZSOCK_LIBFUZZER) and
// the gtest that runs it in CI (descriptor_fuzz_test.cc).
//
// An input is a layout byte, a receive-size byte, then records, each a tag
// byte and its payload (MakeFuzzInput writes them):
//   tag 0/1  a descriptor (128 bytes) the peer publishes in our user /
//            control ring; tag bit 2: it rewrites it (the next 128 bytes)
//            right after we read it
//   tag 2    a buffer index (4 bytes) the peer hands back on a free ring
//            (tag bit 2: the control pool)
//   tag 3    a hello (56 bytes)
#ifndef ZSOCK_PROVIDERS_UNET_DESCRIPTOR_FUZZ_H_
#define ZSOCK_PROVIDERS_UNET_DESCRIPTOR_FUZZ_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "providers/unet/segment.h"

namespace zsock::unet {

// Consumes the input as a receiver would: every descriptor through
// ReadChunk and the message's sequence checks, its bytes copied out of a
// segment of exactly the layout's size (ASan sees any read outside it) into
// a receive buffer of exactly the posted size, until a check refuses one
// (the connection is then abandoned). Aborts (a finding) when something
// the checks accepted breaks an invariant: a chunk's bytes outside its
// descriptor or its pool's buffers, a message longer than announced or
// than the receive, a delivered message of the wrong length, a hello
// accepted whose layout does not add up. Returns false when a check
// refused a record, true when all passed.
bool FuzzOne(const uint8_t* data, size_t size);

// Builders for inputs (tests and seeds).
enum FuzzTag : uint8_t {
  kFuzzUserDesc = 0,
  kFuzzControlDesc = 1,
  kFuzzFreeIndex = 2,
  kFuzzHello = 3,
  kFuzzRewrite = 4,     // with a descriptor tag: rewritten after the read
  kFuzzControlPool = 4, // with kFuzzFreeIndex: the control pool
};
// The header: `layout` selects ring entries and buffer counts (bit 0: 16
// ring entries instead of 8, bit 1: 16 user buffers instead of 8),
// `recv_size` the posted receive's size (an index into a fixed list).
std::string MakeFuzzInput(uint8_t layout, uint8_t recv_size);
void AppendDesc(std::string* input, uint8_t tag, uint8_t type, uint8_t flags, uint32_t len,
                uint32_t buf, uint64_t total, const std::string& inline_data = "");
void AppendFreeIndex(std::string* input, bool ctl, uint32_t idx);
void AppendHello(std::string* input, const Hello& hello);

// A few well-formed inputs (one message of each kind and size class): the
// seed corpus.
std::vector<std::string> SampleFuzzInputs();

}  // namespace zsock::unet

#endif  // ZSOCK_PROVIDERS_UNET_DESCRIPTOR_FUZZ_H_
