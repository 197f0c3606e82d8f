#include "core/sdp/wire.h"

#include <cstring>
#include <functional>
#include <string>

#include "core/sdp/wire_test_util.h"
#include "gtest/gtest.h"

namespace zsock::sdp::wire {
namespace {

absl::StatusOr<Message> DecodeString(const std::string& s, size_t max_len = kMaxBufSize) {
  return Decode(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size()),
                Limits{max_len});
}

TEST(Wire, EveryMessageRoundTrips) {
  for (const std::string& bytes : SampleMessages()) {
    auto m = DecodeString(bytes);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->header.len, bytes.size());
    EXPECT_EQ(m->header.bufs, 7);
    EXPECT_EQ(m->header.mseq, 42u);
    EXPECT_EQ(m->header.mseq_ack, 41u);
    EXPECT_EQ(EncodeToString(*m, m->payload), bytes) << MessageName(m->header.mid);
  }
}

TEST(Wire, FieldsSurvive) {
  auto samples = SampleMessages();
  auto hello = DecodeString(samples[0]);
  ASSERT_TRUE(hello.ok());
  const auto& h = std::get<Hello>(hello->body);
  EXPECT_EQ(h.buf_size, 65536u);
  EXPECT_EQ(h.max_bufs, 16);
  EXPECT_EQ(h.mode, Mode::kZcopy);
  ASSERT_EQ(h.extensions.size(), 1u);
  EXPECT_EQ(h.extensions[0].value, "lock-table");
  auto data = DecodeString(samples[2]);
  ASSERT_TRUE(data.ok());
  EXPECT_EQ(std::string(data->payload.begin(), data->payload.end()), "hello, stream");
  auto src = DecodeString(samples[6]);
  ASSERT_TRUE(src.ok());
  const auto& a = std::get<Advert>(src->body);
  EXPECT_EQ(a.addr, 0x10100u);
  EXPECT_EQ(a.length, 4096u);
  EXPECT_EQ(a.stream_pos, 12345u);
  EXPECT_EQ(a.az_slot, kNoSlot);
  EXPECT_EQ(a.key.blob, (std::vector<uint8_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(a.key.access, static_cast<uint32_t>(kRemoteRead));
  auto rd = DecodeString(samples[8]);
  ASSERT_TRUE(rd.ok());
  EXPECT_EQ(rd->header.flags, kFlagCancelReply);
  EXPECT_EQ(std::get<Completed>(rd->body).bytes, 100u);
}

// Autocork (1.1): Data may ask for an acknowledgement; a Hello extension
// (empty) announces that its sender answers.
TEST(Wire, AckRequestOnDataAndItsExtension) {
  auto samples = SampleMessages();
  std::string data = samples[2];
  data[1] = static_cast<char>(kFlagAckReq);
  auto d = DecodeString(data);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->header.flags, kFlagAckReq);
  EXPECT_EQ(EncodeToString(*d, d->payload), data);
  Hello with;
  with.buf_size = 65536;
  with.max_bufs = 16;
  with.extensions.push_back({kExtAckReq, ""});
  wire::Message m{{MessageId::kHello}, with};
  m.header.mseq = 1;
  std::string hello = EncodeToString(m);
  auto h = DecodeString(hello);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(std::get<Hello>(h->body).extensions.size(), 1u);
  EXPECT_EQ(std::get<Hello>(h->body).extensions[0].type, kExtAckReq);
  EXPECT_EQ(std::get<Hello>(h->body).extensions[0].value, "");
  EXPECT_EQ(Hello{}.minor, 2);
  // A later minor version's unknown capabilities are kept (and ignored by
  // the engine), not refused.
  std::string later = samples[0];
  later[kHeaderSize + 1] = kVersionMinor + 1;
  later[kHeaderSize + 2] = static_cast<char>(0x80 | kCapRdmaRead);
  auto l = DecodeString(later);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(std::get<Hello>(l->body).caps, 0x80 | kCapRdmaRead);
  EXPECT_EQ(EncodeToString(*l, l->payload), later);
}

// One invalid variant per validation rule: (name, sample index, mutation,
// field the error must name).
struct Case {
  const char* name;
  int sample;
  std::function<void(std::string&)> mutate;
  const char* field;
  size_t max_len = kMaxBufSize;
};

template <typename T>
void Put(std::string& s, size_t off, T v) {
  std::memcpy(s.data() + off, &v, sizeof(T));
}

void FixLen(std::string& s) { Put<uint32_t>(s, 4, static_cast<uint32_t>(s.size())); }

TEST(Wire, EveryValidationErrorNamesItsField) {
  const size_t B = kHeaderSize;
  const std::vector<Case> cases = {
      {"short header", 0, [](std::string& s) { s.resize(10); }, "base header"},
      {"unknown id", 4, [](std::string& s) { s[0] = 0x42; }, "mid"},
      {"SendSm reserved", 4, [](std::string& s) { s[0] = 0x04; }, "mid"},
      {"len mismatch", 4, [](std::string& s) { Put<uint32_t>(s, 4, 99); }, "len"},
      {"len above limit", 2, [](std::string&) {}, "len", 20},
      {"bad flags", 4, [](std::string& s) { s[1] = 0x01; }, "flags"},
      {"flags on Data", 2, [](std::string& s) { s[1] = kFlagCancelReply; }, "flags"},
      {"AckReq off Data", 4, [](std::string& s) { s[1] = kFlagAckReq; }, "flags"},
      {"bufs too large", 4, [](std::string& s) { Put<uint16_t>(s, 2, 5000); }, "bufs"},
      {"mseq zero", 4, [](std::string& s) { Put<uint32_t>(s, 8, 0); }, "mseq"},
      {"hello short", 0, [&](std::string& s) { s.resize(B + 8); FixLen(s); }, "len"},
      {"hello version", 0, [&](std::string& s) { s[B] = 2; }, "version"},
      {"hello caps", 0, [&](std::string& s) { s[B + 2] = static_cast<char>(0x80); }, "caps"},
      {"hello adverts", 0, [&](std::string& s) { s[B + 3] = 0; }, "max_adverts"},
      {"hello buf small", 0, [&](std::string& s) { Put<uint32_t>(s, B + 4, 100); }, "buf_size"},
      {"hello buf large", 0, [&](std::string& s) { Put<uint32_t>(s, B + 4, 1u << 30); },
       "buf_size"},
      {"hello bufs few", 0, [&](std::string& s) { Put<uint16_t>(s, B + 8, 1); }, "max_bufs"},
      {"hello bufs many", 0, [&](std::string& s) { Put<uint16_t>(s, B + 8, 9999); }, "max_bufs"},
      {"hello mode", 0, [&](std::string& s) { s[B + 10] = 9; }, "mode"},
      {"hello reserved", 0, [&](std::string& s) { s[B + 11] = 1; }, "reserved"},
      {"hello ext_len", 0, [&](std::string& s) { Put<uint16_t>(s, B + 12, 3); }, "ext_len"},
      {"ext truncated", 0,
       [&](std::string& s) {
         s.resize(B + 16 + 2);
         Put<uint16_t>(s, B + 12, 2);
         FixLen(s);
       },
       "extension"},
      {"ext type 0", 0, [&](std::string& s) { Put<uint16_t>(s, B + 16, 0); }, "extension.type"},
      {"ext overrun", 0, [&](std::string& s) { Put<uint16_t>(s, B + 18, 200); },
       "extension.len"},
      {"disconn body", 4, [&](std::string& s) { s.push_back(0); FixLen(s); }, "len"},
      {"abort body", 5, [&](std::string& s) { s.pop_back(); FixLen(s); }, "len"},
      {"advert short", 6, [&](std::string& s) { s.resize(B + 10); FixLen(s); }, "len"},
      {"advert reserved", 6, [&](std::string& s) { Put<uint16_t>(s, B + 26, 1); }, "reserved"},
      {"advert length 0", 6, [&](std::string& s) { Put<uint32_t>(s, B + 8, 0); }, "length"},
      {"advert wraps", 6, [&](std::string& s) { Put<uint64_t>(s, B, ~uint64_t{0} - 10); },
       "addr"},
      {"key_len small", 6, [&](std::string& s) { Put<uint16_t>(s, B + 24, 10); }, "key_len"},
      {"key_len large", 6, [&](std::string& s) { Put<uint16_t>(s, B + 24, 1000); }, "key_len"},
      {"key_len mismatch", 6, [&](std::string& s) { Put<uint16_t>(s, B + 24, 30); }, "key_len"},
      {"key version", 6, [&](std::string& s) { s[B + 28] = 7; }, "key.version"},
      {"key blob_len", 6, [&](std::string& s) { s[B + 29] = 9; }, "key.blob_len"},
      {"key wraps", 6, [&](std::string& s) { Put<uint64_t>(s, B + 28 + 16, ~uint64_t{0}); },
       "key.length"},
      {"advert outside key", 6, [&](std::string& s) { Put<uint64_t>(s, B, 0x30000); }, "addr"},
      {"srcavail no read", 6, [&](std::string& s) { Put<uint32_t>(s, B + 28 + 4, kRemoteWrite); },
       "key.access"},
      {"sinkavail no write", 7, [&](std::string& s) { Put<uint32_t>(s, B + 28 + 4, kRemoteRead); },
       "key.access"},
      {"compl body", 8, [&](std::string& s) { s.resize(B + 4); FixLen(s); }, "len"},
      {"compl advert 0", 8, [&](std::string& s) { Put<uint32_t>(s, B, 0); }, "advert"},
      {"wrcompl bytes 0", 9, [&](std::string& s) { Put<uint32_t>(s, B + 4, 0); }, "bytes"},
      {"cancel body", 10, [&](std::string& s) { s.push_back(0); FixLen(s); }, "len"},
      {"cancel advert 0", 11, [&](std::string& s) { Put<uint32_t>(s, B, 0); }, "advert"},
      {"ack advert 0", 12, [&](std::string& s) { Put<uint32_t>(s, B, 0); }, "advert"},
      {"mode value", 13, [&](std::string& s) { s[B] = 5; }, "mode"},
      {"mode reserved", 13, [&](std::string& s) { s[B + 2] = 1; }, "reserved"},
  };
  auto samples = SampleMessages();
  for (const Case& c : cases) {
    std::string s = samples[c.sample];
    c.mutate(s);
    auto m = DecodeString(s, c.max_len);
    ASSERT_FALSE(m.ok()) << c.name;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(m.status().message().find(c.field), absl::string_view::npos)
        << c.name << ": " << m.status().message();
  }
}

}  // namespace
}  // namespace zsock::sdp::wire
