// Runs the fuzz body (wire_fuzz.cc) over the seed corpus, every single-byte
// mutation of it, and random inputs, so CI exercises the parser the fuzzer
// covers (tools/fuzz.sh sdp-wire runs the real libFuzzer target).
#include <cstring>
#include <random>
#include <string>

#include "core/sdp/wire_fuzz.h"
#include "core/sdp/wire_test_util.h"
#include "gtest/gtest.h"

namespace zsock::sdp::wire {
namespace {

void FuzzString(const std::string& s) {
  FuzzOne(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

TEST(WireFuzz, SeedCorpus) {
  for (const auto& s : SampleMessages()) FuzzString(s);
}

TEST(WireFuzz, EveryByteOfEverySeedMutated) {
  for (const auto& seed : SampleMessages()) {
    for (size_t i = 0; i < seed.size(); ++i) {
      for (int v : {0x00, 0x01, 0x7f, 0x80, 0xff}) {
        std::string s = seed;
        s[i] = static_cast<char>(v);
        FuzzString(s);
      }
    }
    for (size_t n = 0; n < seed.size(); ++n) FuzzString(seed.substr(0, n));
  }
}

TEST(WireFuzz, RandomInputs) {
  std::mt19937_64 rng(20261121);
  auto seeds = SampleMessages();
  for (int i = 0; i < 200000; ++i) {
    std::string s;
    if (i % 2 == 0) {
      s = seeds[rng() % seeds.size()];
      int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips && !s.empty(); ++f) s[rng() % s.size()] = static_cast<char>(rng());
    } else {
      s.resize(rng() % 256);
      for (auto& ch : s) ch = static_cast<char>(rng());
      if (s.size() >= 8 && (rng() & 1)) {  // a consistent len makes it deeper
        uint32_t len = static_cast<uint32_t>(s.size());
        std::memcpy(s.data() + 4, &len, 4);
      }
    }
    FuzzString(s);
  }
}

}  // namespace
}  // namespace zsock::sdp::wire
