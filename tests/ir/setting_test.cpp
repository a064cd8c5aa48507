// env_setting (ir/setting.h): the fallback when unset, an allowed value as given, and an error
// naming the variable, every allowed value and the value it got otherwise.
#include "ir/setting.h"
#include "test_util.h"

#include <cstdlib>

namespace loom {
namespace {

constexpr const char* kName = "LOOM_TEST_SETTING_OF_SETTING_TEST";

TEST(EnvSetting, FallbackAllowedValueAndError) {
  ::unsetenv(kName);
  EXPECT_EQ(ir::env_setting(kName, "auto", {"auto", "nchw", "channels_last"}), "auto");
  ::setenv(kName, "nchw", 1);
  EXPECT_EQ(ir::env_setting(kName, "auto", {"auto", "nchw", "channels_last"}), "nchw");
  ::setenv(kName, "NCHW", 1);
  const auto message =
      test::error_of([] { ir::env_setting(kName, "auto", {"auto", "nchw", "channels_last"}); });
  EXPECT_EQ(message, std::string(kName) + ": expected auto, nchw or channels_last, got 'NCHW'");
  ::setenv(kName, "", 1);
  EXPECT_EQ(test::error_of([] { ir::env_setting(kName, "1", {"0", "1"}); }),
            std::string(kName) + ": expected 0 or 1, got ''");
  ::unsetenv(kName);
}

}  // namespace
}  // namespace loom
