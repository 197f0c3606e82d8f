// Runs the descriptor fuzz body (descriptor_fuzz.cc) over handmade hostile
// inputs, which the checks must refuse, well-formed ones, which they must
// accept, every single-byte mutation of the seeds, and random inputs, so
// that CI exercises what the libFuzzer target covers.
#include <cstring>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "providers/unet/descriptor.h"
#include "providers/unet/descriptor_fuzz.h"

namespace zsock::unet {
namespace {

// Whether the fuzz body accepted every record of `s`.
bool Accepted(const std::string& s) {
  return FuzzOne(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

// Layout 0: 8 ring entries, 8 user buffers (indices 0-7), control buffers
// 8-11, 4096-byte buffers. Receive size index 9: 8192 bytes.
std::string Input() { return MakeFuzzInput(0, 9); }

TEST(DescriptorFuzz, SeedsAreAccepted) {
  for (const auto& s : SampleFuzzInputs()) EXPECT_TRUE(Accepted(s));
}

TEST(DescriptorFuzz, EdgeCasesAreAccepted) {
  std::string s = Input();
  AppendDesc(&s, kFuzzUserDesc, kUserMsg, kFirst | kLast | kInlineData, 0, 0, 0);
  AppendDesc(&s, kFuzzUserDesc, kUserMsg, kFirst | kLast | kInlineData, kInline, 0, kInline);
  AppendDesc(&s, kFuzzUserDesc, kUserMsg, kFirst | kLast, 0, 7, 0);
  AppendDesc(&s, kFuzzUserDesc, kUserMsg, kFirst, 4096, 0, 8192);
  AppendDesc(&s, kFuzzUserDesc, kUserMsg, kLast, 4096, 7, 0);
  // Larger than the receive: discarded, still well formed.
  AppendDesc(&s, kFuzzUserDesc, kUserMsg, kFirst, 4096, 1, 12288);
  AppendDesc(&s, kFuzzUserDesc, kUserMsg, 0, 4096, 2, 0);
  AppendDesc(&s, kFuzzUserDesc, kUserMsg, kLast, 4096, 3, 0);
  AppendDesc(&s, kFuzzControlDesc, kControlMsg, kFirst, 4096, 11, 4097);
  AppendDesc(&s, kFuzzControlDesc, kControlMsg, kLast, 1, 8, 0);
  AppendFreeIndex(&s, false, 0);
  AppendFreeIndex(&s, false, 7);
  AppendFreeIndex(&s, true, 8);
  AppendFreeIndex(&s, true, 11);
  EXPECT_TRUE(Accepted(s));
}

// Each case: one hostile record after a well-formed prefix.
struct Hostile {
  const char* what;
  std::string input;
};

std::vector<Hostile> HostileInputs() {
  std::vector<Hostile> out;
  auto desc = [&](const char* what, uint8_t tag, uint8_t type, uint8_t flags, uint32_t len,
                  uint32_t buf, uint64_t total) {
    std::string s = Input();
    AppendDesc(&s, tag, type, flags, len, buf, total);
    out.push_back({what, s});
  };
  desc("control type in the user ring", kFuzzUserDesc, kControlMsg, kFirst | kLast | kInlineData,
       1, 0, 1);
  desc("user type in the control ring", kFuzzControlDesc, kUserMsg, kFirst | kLast | kInlineData,
       1, 0, 1);
  desc("unknown type", kFuzzUserDesc, 0, kFirst | kLast | kInlineData, 1, 0, 1);
  desc("inline data over kInline", kFuzzUserDesc, kUserMsg, kFirst | kLast | kInlineData,
       kInline + 1, 0, kInline + 1);
  desc("inline data without kLast", kFuzzUserDesc, kUserMsg, kFirst | kInlineData, 1, 0, 2);
  desc("inline data without kFirst", kFuzzUserDesc, kUserMsg, kLast | kInlineData, 1, 0, 1);
  desc("a control buffer in the user ring", kFuzzUserDesc, kUserMsg, kFirst | kLast, 1, 8, 1);
  desc("a user buffer in the control ring", kFuzzControlDesc, kControlMsg, kFirst | kLast, 1, 7,
       1);
  desc("a buffer past the control pool", kFuzzControlDesc, kControlMsg, kFirst | kLast, 1, 12, 1);
  desc("buffer index 2^32-1", kFuzzUserDesc, kUserMsg, kFirst | kLast, 1, 0xffffffffu, 1);
  desc("a chunk longer than a buffer", kFuzzUserDesc, kUserMsg, kFirst | kLast, 4097, 0, 4097);
  desc("a total over kMaxMessage", kFuzzUserDesc, kUserMsg, kFirst, 4096, 0, kMaxMessage + 1);
  desc("a total of 2^64-1", kFuzzControlDesc, kControlMsg, kFirst, 4096, 8, ~uint64_t{0});
  desc("a continuation with no message open", kFuzzUserDesc, kUserMsg, kLast, 1, 0, 1);
  desc("a chunk longer than announced", kFuzzUserDesc, kUserMsg, kFirst | kLast, 200, 0, 100);
  desc("a control chunk longer than announced", kFuzzControlDesc, kControlMsg, kFirst | kLast,
       200, 8, 100);
  desc("a last chunk short of the total", kFuzzUserDesc, kUserMsg, kFirst | kLast, 4096, 0, 5000);
  desc("a control message short of the total", kFuzzControlDesc, kControlMsg, kFirst | kLast, 10,
       8, 11);
  {
    std::string s = Input();
    AppendDesc(&s, kFuzzUserDesc, kUserMsg, kFirst, 4096, 0, 8192);
    AppendDesc(&s, kFuzzUserDesc, kUserMsg, kFirst | kLast, 4096, 1, 4096);
    out.push_back({"a first chunk while a message is open", s});
  }
  {
    std::string s = Input();
    AppendDesc(&s, kFuzzUserDesc, kUserMsg, kFirst, 4096, 0, 8192);
    AppendDesc(&s, kFuzzUserDesc, kUserMsg, 0, 4096, 1, 0);
    AppendDesc(&s, kFuzzUserDesc, kUserMsg, kLast, 1, 2, 0);
    out.push_back({"chunks adding up past the total", s});
  }
  for (auto [ctl, idx] : {std::pair{false, 8u}, std::pair{false, 0xffffffffu},
                          std::pair{true, 7u}, std::pair{true, 12u}}) {
    std::string s = Input();
    AppendFreeIndex(&s, ctl, idx);
    out.push_back({"a free index outside the pool", s});
  }
  return out;
}

TEST(DescriptorFuzz, HostileRecordsAreRefused) {
  for (const auto& h : HostileInputs()) EXPECT_FALSE(Accepted(h.input)) << h.what;
}

TEST(DescriptorFuzz, HostileHellosAreRefused) {
  auto valid = [] {
    Hello h{kSegmentMagic, kVersion, 64, 4096, 64, 16, 0, 0, 0, 0};
    h.segment_size = SegmentLayout::For(h.ring_entries, h.buffer_size, h.nbuffers).total;
    return h;
  };
  EXPECT_TRUE(ValidHelloParams(valid()));
  auto refused = [&](const char* what, auto edit) {
    Hello h = valid();
    edit(h);
    // The fuzz body checks what an accepted hello lays out; this one must
    // not be accepted at all.
    EXPECT_FALSE(ValidHelloParams(h)) << what;
    std::string s = MakeFuzzInput(0, 0);
    AppendHello(&s, h);
    EXPECT_TRUE(Accepted(s)) << what;
  };
  refused("7 ring entries", [](Hello& h) { h.ring_entries = 7; });
  refused("96 ring entries", [](Hello& h) { h.ring_entries = 96; });
  refused("2^17 ring entries", [](Hello& h) { h.ring_entries = 1u << 17; });
  refused("0 buffers", [](Hello& h) { h.nbuffers = 0; });
  refused("2^32-1 buffers", [](Hello& h) { h.nbuffers = 0xffffffffu; });
  refused("2^31 buffers", [](Hello& h) { h.nbuffers = 1u << 31; });
  refused("2 KiB buffers", [](Hello& h) { h.buffer_size = 2048; });
  refused("32 MiB buffers", [](Hello& h) { h.buffer_size = 32u << 20; });
  refused("no key slots", [](Hello& h) { h.key_slots = 0; });
  refused("2^20+1 key slots", [](Hello& h) { h.key_slots = (1u << 20) + 1; });
  refused("bell slot kBellSlots", [](Hello& h) { h.bell_slot = kBellSlots; });
  refused("a segment one byte short", [](Hello& h) { --h.segment_size; });
  refused("a segment one byte long", [](Hello& h) { ++h.segment_size; });
}

TEST(DescriptorFuzz, EveryByteOfEverySeedMutated) {
  auto seeds = SampleFuzzInputs();
  for (const auto& h : HostileInputs()) seeds.push_back(h.input);
  for (const auto& seed : seeds) {
    for (size_t i = 0; i < seed.size(); ++i) {
      for (int v : {0x00, 0x01, 0x08, 0x80, 0xff}) {
        std::string s = seed;
        s[i] = static_cast<char>(v);
        Accepted(s);
      }
    }
    for (size_t n = 0; n < seed.size(); n += 7) Accepted(seed.substr(0, n));
  }
}

TEST(DescriptorFuzz, RandomInputs) {
  std::mt19937_64 rng(20261129);
  auto seeds = SampleFuzzInputs();
  for (int i = 0; i < 30000; ++i) {
    std::string s;
    if (i % 2 == 0) {
      s = seeds[rng() % seeds.size()];
      int flips = 1 + static_cast<int>(rng() % 6);
      for (int f = 0; f < flips; ++f) s[rng() % s.size()] = static_cast<char>(rng());
    } else {
      // Records with random fields, kept small enough to be plausible.
      s = MakeFuzzInput(static_cast<uint8_t>(rng()), static_cast<uint8_t>(rng()));
      const int records = 1 + static_cast<int>(rng() % 8);
      for (int r = 0; r < records; ++r) {
        const uint8_t tag = static_cast<uint8_t>(rng() % 8);
        if ((tag & 3) == kFuzzFreeIndex) {
          AppendFreeIndex(&s, tag & kFuzzControlPool, static_cast<uint32_t>(rng() % 24));
        } else if ((tag & 3) == kFuzzHello) {
          s.push_back(static_cast<char>(tag));
          for (size_t k = 0; k < sizeof(Hello); ++k) s.push_back(static_cast<char>(rng()));
        } else {
          AppendDesc(&s, tag, static_cast<uint8_t>(rng() % 3), static_cast<uint8_t>(rng() % 8),
                     static_cast<uint32_t>(rng() % 5000), static_cast<uint32_t>(rng() % 24),
                     rng() % 20000);
        }
      }
    }
    Accepted(s);
  }
}

}  // namespace
}  // namespace zsock::unet
