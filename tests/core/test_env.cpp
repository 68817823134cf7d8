// Environment switches read strictly (core/env.hpp): a typo is an error that names the variable.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>

#include "common/error_of.hpp"
#include "core/env.hpp"
#include "core/error.hpp"

using namespace mtplab;

namespace {
constexpr const char* kVar = "MTPLAB_TEST_ENV_SWITCH";

using mtplab::test::error_of;
}  // namespace

TEST(Env, ChoiceUnsetOrEmptyIsTheDefault) {
  unsetenv(kVar);
  EXPECT_FALSE(env_choice(kVar, {"v1", "v2"}).has_value());
  setenv(kVar, "", 1);
  EXPECT_FALSE(env_choice(kVar, {"v1", "v2"}).has_value());
  unsetenv(kVar);
}

TEST(Env, ChoiceReturnsAnAllowedValueAndRefusesAnyOther) {
  setenv(kVar, "v2", 1);
  EXPECT_EQ(env_choice(kVar, {"v1", "v2"}).value(), "v2");
  for (const char* bad : {"V1", "v1 ", "v3", "2"}) {
    setenv(kVar, bad, 1);
    const std::string msg = error_of([] { (void)env_choice(kVar, {"v1", "v2"}); });
    EXPECT_NE(msg.find(std::string(kVar) + "=" + bad), std::string::npos) << msg;
    EXPECT_NE(msg.find("v1, v2"), std::string::npos) << msg;
  }
  unsetenv(kVar);
}

TEST(Env, IntInRangeOrAnError) {
  unsetenv(kVar);
  EXPECT_FALSE(env_int(kVar, 1, 1024).has_value());
  setenv(kVar, "16", 1);
  EXPECT_EQ(env_int(kVar, 1, 1024).value(), 16);
  for (const char* bad : {"0", "1025", "4x", "-3", "abc", " 8"}) {
    setenv(kVar, bad, 1);
    const std::string msg = error_of([] { (void)env_int(kVar, 1, 1024); });
    EXPECT_NE(msg.find("is not an integer in [1, 1024]"), std::string::npos) << bad << ": " << msg;
  }
  unsetenv(kVar);
}
