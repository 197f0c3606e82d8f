#include "core/copy.h"

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "gtest/gtest.h"

namespace zsock {
namespace {

using copy_internal::CopyBackward;
using copy_internal::HaveBackwardCopy;
using copy_internal::kSmallCopy;
using copy_internal::LimitFor;
using copy_internal::WantsBackward;

TEST(CopyRule, OnlyLargeCopiesWithTheDestinationJustPastTheSourceGoBackwards) {
  const size_t limit = 512 * 1024;
  const uintptr_t src = 0x10000;
  // The skew that stalls rep movsb: 1-31 bytes, modulo 64.
  for (uintptr_t skew = 1; skew <= 31; ++skew) {
    EXPECT_TRUE(WantsBackward(src + skew, src, 4096, limit)) << skew;
    EXPECT_TRUE(WantsBackward(src + 4096 * 3 + 64 * 5 + skew, src, 4096, limit)) << skew;
  }
  // Same alignment, or the destination 32-63 bytes past (before) it: memcpy
  // below 24 KiB.
  for (uintptr_t skew : {0, 32, 40, 48, 63, 64, 4096}) {
    EXPECT_FALSE(WantsBackward(src + skew, src, 4096, limit)) << skew;
  }
  EXPECT_FALSE(WantsBackward(src, src + 16, 4096, limit));  // 48 past, modulo 64
  EXPECT_TRUE(WantsBackward(src, src + 48, 4096, limit));   // 16 past, modulo 64
  // From 24 KiB, 33-63 past go backwards too (SDP's receive: a page-aligned
  // buffer filled from after a 16-byte header); 0 and 32 never.
  for (uintptr_t skew = 33; skew <= 63; ++skew) {
    EXPECT_FALSE(WantsBackward(src + skew, src, copy_internal::kLargeCopy - 1, limit)) << skew;
    EXPECT_TRUE(WantsBackward(src + skew, src, copy_internal::kLargeCopy, limit)) << skew;
  }
  EXPECT_TRUE(WantsBackward(src, src + 16, 32752, limit));
  EXPECT_FALSE(WantsBackward(src + 32, src, 65536, limit));
  EXPECT_FALSE(WantsBackward(src + 64, src, 65536, limit));
  // Sizes: above 2 KiB and up to the limit.
  EXPECT_FALSE(WantsBackward(src + 16, src, kSmallCopy, limit));
  EXPECT_TRUE(WantsBackward(src + 16, src, kSmallCopy + 1, limit));
  EXPECT_TRUE(WantsBackward(src + 16, src, limit, limit));
  EXPECT_FALSE(WantsBackward(src + 16, src, limit + 1, limit));
  // Off: a limit of 0.
  EXPECT_FALSE(WantsBackward(src + 16, src, 4096, 0));
}

TEST(CopyRule, TheChoiceDecidesTheLimit) {
  EXPECT_EQ(LimitFor("off"), 0u);
  if (HaveBackwardCopy()) {
    EXPECT_GT(LimitFor("on"), kSmallCopy);
    EXPECT_LE(LimitFor("auto"), LimitFor("on"));
  } else {
    EXPECT_EQ(LimitFor("on"), 0u);
    EXPECT_EQ(LimitFor("auto"), 0u);
  }
}

TEST(CopyRule, AWrongValueIsAnErrorThatNamesTheChoices) {
  std::string no_file;
  auto config = Config::Load({{"ZSOCK_DATA_COPY", "fast"}}, &no_file);
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("data_copy"), std::string::npos)
      << config.status().message();
  EXPECT_NE(config.status().message().find("auto"), std::string::npos)
      << config.status().message();
  auto good = Config::Load({{"ZSOCK_DATA_COPY", "off"}}, &no_file);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->GetString("data_copy"), "off");
}

// Copies n bytes from src+so to dst+dof inside guard bytes and checks every
// byte of the destination buffer: the copy, and nothing outside it.
template <typename F>
void CheckCopy(F copy, size_t n, size_t so, size_t dof) {
  std::vector<uint8_t> src(n + 128), dst(n + 256, 0xEE);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7 + (i >> 8));
  copy(dst.data() + 64 + dof, src.data() + so, n);
  for (size_t i = 0; i < dst.size(); ++i) {
    const bool inside = i >= 64 + dof && i < 64 + dof + n;
    const uint8_t want = inside ? src[so + (i - 64 - dof)] : 0xEE;
    if (dst[i] != want) {
      FAIL() << "n=" << n << " src+" << so << " dst+" << dof << ": byte " << i << " is "
             << int{dst[i]} << ", want " << int{want};
    }
  }
}

const std::vector<size_t>& Sizes() {
  static const auto* sizes = new std::vector<size_t>{
      0, 1, 31, 127, 128, 129, 255, 2048, 2049, 2175, 4096, 4097, 24575, 24576, 32752,
      65536 + 13};
  return *sizes;
}

TEST(CopyBackward, CopiesEveryByteAndNothingElse) {
  if (!HaveBackwardCopy()) GTEST_SKIP() << "no AVX2 on this processor: the backward copy is off";
  for (size_t n : Sizes()) {
    for (size_t so : {0, 1, 16, 63}) {
      for (size_t dof = 0; dof < 64; dof += 5) CheckCopy(CopyBackward, n, so, dof);
    }
  }
}

TEST(CopyBytes, CopiesEveryByteAndNothingElseOnEitherPath) {
  for (size_t n : Sizes()) {
    for (size_t so : {0, 8, 16}) {
      for (size_t dof = 0; dof < 64; dof += 3) CheckCopy(CopyBytes, n, so, dof);
    }
  }
}

}  // namespace
}  // namespace zsock
