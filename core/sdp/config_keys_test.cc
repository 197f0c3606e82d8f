// The SDP configuration keys: mode, zcopy_threshold and autocork (docs/configuration.md).
#include <map>
#include <string>

#include "core/config.h"
#include "gtest/gtest.h"

namespace zsock {
namespace {

TEST(SdpConfig, DefaultsAndEnvironment) {
  std::string no_file;
  auto def = Config::Load({}, &no_file);
  ASSERT_TRUE(def.ok()) << def.status();
  EXPECT_EQ(def->GetString("mode"), "bcopy");
  EXPECT_EQ(def->GetInt("zcopy_threshold"), 128 << 10);
  EXPECT_TRUE(def->GetBool("autocork"));
  std::string none;
  auto env = Config::Load({{"ZSOCK_MODE", "zcopy"}, {"ZSOCK_ZCOPY_THRESHOLD", "256K"},
                           {"ZSOCK_AUTOCORK", "off"}}, &none);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_FALSE(env->GetBool("autocork"));
  EXPECT_EQ(env->GetString("mode"), "zcopy");
  EXPECT_EQ(env->GetInt("zcopy_threshold"), 256 << 10);
  EXPECT_EQ(env->Get("mode").source, "env ZSOCK_MODE");
}

TEST(SdpConfig, BadValuesNameTheKey) {
  std::string none;
  auto mode = Config::Load({{"ZSOCK_MODE", "fast"}}, &none);
  ASSERT_FALSE(mode.ok());
  EXPECT_NE(mode.status().message().find("mode"), absl::string_view::npos);
  EXPECT_NE(mode.status().message().find("bcopy, zcopy"), absl::string_view::npos);
  auto small = Config::Load({{"ZSOCK_ZCOPY_THRESHOLD", "100"}}, &none);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("zcopy_threshold"), absl::string_view::npos);
}

}  // namespace
}  // namespace zsock
