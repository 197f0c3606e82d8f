// The verbs wire formats (wire.h): the remote key blob, the connection
// hello and the message header, each round trip and hostile input.
#include "providers/verbs/wire.h"

#include <cerrno>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "core/provider.h"
#include "core/status.h"
#include "gtest/gtest.h"

namespace zsock::verbs {
namespace {

// ------------------------------------------------------------ remote keys

TEST(RemoteKeys, BlobRoundTripThroughSerialize) {
  RemoteKey k;
  k.addr = 0x7f0012345000;
  k.length = 65536;
  k.access = kRemoteRead | kRemoteWrite;
  k.blob = EncodeKeyBlob({0xdeadbeef, {0x123456, 0x89abcdef}});
  EXPECT_EQ(k.blob.size(), 16u);
  EXPECT_EQ(k.blob[0], 2);  // the version
  auto parsed = RemoteKey::Parse(k.Serialize());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->addr, k.addr);
  EXPECT_EQ(parsed->length, k.length);
  EXPECT_EQ(parsed->access, k.access);
  auto blob = DecodeKeyBlob(parsed->blob);
  ASSERT_TRUE(blob.ok());
  EXPECT_EQ(blob->rkey, 0xdeadbeefu);
  EXPECT_EQ(blob->key.slot, 0x123456u);
  EXPECT_EQ(blob->key.gen, 0x89abcdefu);
}

TEST(RemoteKeys, HostileBlobsAreRefused) {
  std::vector<uint8_t> good = EncodeKeyBlob({7, {1, 1}});
  EXPECT_FALSE(DecodeKeyBlob({}).ok());
  EXPECT_FALSE(DecodeKeyBlob(std::vector<uint8_t>(good.begin(), good.end() - 1)).ok());
  auto longer = good;
  longer.push_back(0);
  EXPECT_FALSE(DecodeKeyBlob(longer).ok());
  for (size_t i = 0; i < 4; ++i) {
    auto bad = good;
    bad[i] ^= 0x40;
    EXPECT_FALSE(DecodeKeyBlob(bad).ok()) << "byte " << i;
  }
  // A version 1 key (no table key) is refused.
  std::vector<uint8_t> v1(8, 0);
  v1[0] = 1;
  EXPECT_FALSE(DecodeKeyBlob(v1).ok());
  // Random bytes never crash; they decode only when they look like a key.
  std::mt19937 rng(1);
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> b(rng() % 20);
    for (auto& x : b) x = static_cast<uint8_t>(rng() % 3 == 0 ? (rng() % 3) : rng());
    auto r = DecodeKeyBlob(b);
    EXPECT_EQ(r.ok(), b.size() == 16 && b[0] == 2 && b[1] == 0 && b[2] == 0 && b[3] == 0);
    std::string s(reinterpret_cast<const char*>(b.data()), b.size());
    (void)RemoteKey::Parse(s);
  }
}

// ------------------------------------------------------------ private data

TEST(Hello, RoundTripAndPadding) {
  Hello h;
  h.flags = kHelloAtomics;
  h.credits = 128;
  h.eager_size = 8192;
  h.max_inline = 220;
  h.fabric_id = 0x0123456789abcdefULL;
  std::string bytes = EncodeHello(h);
  EXPECT_EQ(bytes.size(), Hello::kSize);
  EXPECT_LE(bytes.size(), 56u) << "must fit an InfiniBand connect request's private data";
  bytes.resize(56, '\0');  // rdma_cm pads what it delivers
  auto d = DecodeHello(bytes.data(), bytes.size());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->flags, h.flags);
  EXPECT_EQ(d->credits, 128u);
  EXPECT_EQ(d->eager_size, 8192u);
  EXPECT_EQ(d->max_inline, 220u);
  EXPECT_EQ(d->fabric_id, h.fabric_id);
  Hello srq;
  srq.flags = kHelloSrq;
  srq.credits = 0;  // unlimited with a shared receive queue
  srq.eager_size = 4096;
  std::string b = EncodeHello(srq);
  EXPECT_TRUE(DecodeHello(b.data(), b.size()).ok());
}

TEST(Hello, HostileInputIsRefused) {
  Hello h;
  h.credits = 16;
  h.eager_size = 4096;
  const std::string good = EncodeHello(h);
  EXPECT_FALSE(DecodeHello(nullptr, 0).ok());
  EXPECT_FALSE(DecodeHello(good.data(), good.size() - 1).ok());
  auto mutate = [&](size_t at, uint8_t v) {
    std::string b = good;
    b[at] = static_cast<char>(v);
    return DecodeHello(b.data(), b.size());
  };
  EXPECT_FALSE(mutate(0, 'x').ok());    // magic
  auto version = mutate(4, 2);
  ASSERT_FALSE(version.ok());
  EXPECT_EQ(version.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(version.status().message(), "version 2"));
  EXPECT_FALSE(mutate(5, 0x80).ok());   // unknown flag
  EXPECT_FALSE(mutate(6, 40).ok());     // length field
  EXPECT_FALSE(mutate(20, 1).ok());     // reserved
  Hello zero = h;
  zero.credits = 0;  // no credits without SRQ: the peer could never send
  std::string z = EncodeHello(zero);
  EXPECT_FALSE(DecodeHello(z.data(), z.size()).ok());
  Hello huge = h;
  huge.eager_size = 64u << 20;
  std::string g = EncodeHello(huge);
  EXPECT_FALSE(DecodeHello(g.data(), g.size()).ok());
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::string b = good;
    for (int j = 0; j < 3; ++j) b[rng() % b.size()] = static_cast<char>(rng());
    auto d = DecodeHello(b.data(), b.size());
    if (d.ok()) {
      EXPECT_GE(d->eager_size, 256u);
      EXPECT_LE(d->eager_size, 1u << 20);
    }
  }
}

// ------------------------------------------------------------ framing

TEST(Framing, HeaderRoundTripAndValidation) {
  uint8_t buf[kHeaderSize + kRtsBodySize + 16] = {};
  Header h;
  h.type = MsgType::kEager;
  h.flags = kMsgControl;
  h.credits = 17;
  h.length = 16;
  h.cookie = 0x1122334455667788ULL;
  h.aux = 9;
  EncodeHeader(h, buf);
  auto d = DecodeHeader(buf, kHeaderSize + 16, 8192);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->type, MsgType::kEager);
  EXPECT_EQ(d->flags, kMsgControl);
  EXPECT_EQ(d->credits, 17);
  EXPECT_EQ(d->length, 16u);
  EXPECT_EQ(d->cookie, h.cookie);
  EXPECT_EQ(d->aux, 9u);
  // The announced length must match what arrived.
  EXPECT_FALSE(DecodeHeader(buf, kHeaderSize + 15, 8192).ok());
  EXPECT_FALSE(DecodeHeader(buf, kHeaderSize - 1, 8192).ok());
  EXPECT_FALSE(DecodeHeader(buf, kHeaderSize + 16, 32).ok());  // above the buffer size

  h.type = MsgType::kRts;
  h.length = 0;
  EncodeHeader(h, buf);
  RtsBody r{0x7fff0000, 16u << 20, 0xabcdef};
  EncodeRts(r, buf + kHeaderSize);
  ASSERT_TRUE(DecodeHeader(buf, kHeaderSize + kRtsBodySize, 8192).ok());
  RtsBody back = DecodeRts(buf + kHeaderSize);
  EXPECT_EQ(back.addr, r.addr);
  EXPECT_EQ(back.length, r.length);
  EXPECT_EQ(back.rkey, r.rkey);
  EXPECT_FALSE(DecodeHeader(buf, kHeaderSize, 8192).ok());

  for (MsgType t : {MsgType::kFin, MsgType::kCredit, MsgType::kClose}) {
    h.type = t;
    h.length = 0;
    EncodeHeader(h, buf);
    EXPECT_TRUE(DecodeHeader(buf, kHeaderSize, 8192).ok());
    EXPECT_FALSE(DecodeHeader(buf, kHeaderSize + 1, 8192).ok());
  }
  buf[0] = 0;
  EXPECT_EQ(DecodeHeader(buf, kHeaderSize, 8192).status().code(), absl::StatusCode::kDataLoss);
  buf[0] = 99;
  EXPECT_FALSE(DecodeHeader(buf, kHeaderSize, 8192).ok());
  buf[0] = static_cast<uint8_t>(MsgType::kFin);
  buf[1] = 0x80;
  EXPECT_FALSE(DecodeHeader(buf, kHeaderSize, 8192).ok());
}

TEST(Framing, RandomBytesNeverCrash) {
  std::mt19937 rng(3);
  std::vector<uint8_t> b(kHeaderSize + 64);
  for (int i = 0; i < 50000; ++i) {
    size_t len = rng() % b.size();
    for (auto& x : b) x = static_cast<uint8_t>(rng() % 4 == 0 ? rng() % 6 : rng());
    auto h = DecodeHeader(b.data(), len, 8192);
    if (h.ok() && h->type == MsgType::kEager) {
      EXPECT_EQ(h->length + kHeaderSize, len);
    }
  }
}

}  // namespace
}  // namespace zsock::verbs
