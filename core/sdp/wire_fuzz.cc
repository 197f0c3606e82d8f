#include "core/sdp/wire_fuzz.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>

#include "core/sdp/wire.h"

namespace zsock::sdp::wire {

void FuzzOne(const uint8_t* data, size_t size) {
  // Small limit sometimes, to exercise the length bound.
  Limits limits;
  if (size > 0 && (data[0] & 1)) limits.max_len = 1024;
  auto m = Decode(std::span<const uint8_t>(data, size), limits);
  if (!m.ok()) {
    if (m.status().message().empty()) std::abort();
    return;
  }
  // Whatever decodes must re-encode to the same bytes (no field is lost or
  // invented), and decode again.
  std::string again = EncodeToString(*m, m->payload);
  if (again.size() != size || std::memcmp(again.data(), data, size) != 0) {
    std::fprintf(stderr, "wire fuzz: %s does not round-trip (%zu -> %zu bytes)\n",
                 std::string(MessageName(m->header.mid)).c_str(), size, again.size());
    std::abort();
  }
  auto m2 = Decode(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(again.data()),
                                            again.size()),
                   limits);
  if (!m2.ok()) std::abort();
}

}  // namespace zsock::sdp::wire

#ifdef ZSOCK_LIBFUZZER
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zsock::sdp::wire::FuzzOne(data, size);
  return 0;
}
#endif
