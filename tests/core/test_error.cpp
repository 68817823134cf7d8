#include <gtest/gtest.h>

#include "core/error.hpp"

using namespace mtplab;

TEST(Error, CarriesRankHostFileAndLine) {
  set_process_identity(3, 4);
  try {
    MTP_FAIL("bad thing ", 42);
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "bad thing 42");
    EXPECT_EQ(e.rank(), 3);
    EXPECT_EQ(e.file(), "test_error.cpp");
    EXPECT_GT(e.line(), 0);
    EXPECT_NE(e.describe().find("[rank 3@" + process_identity().host + "] bad thing 42 (test_error.cpp:"),
              std::string::npos)
        << e.describe();
    return;
  }
  FAIL() << "no exception";
}

TEST(Error, RequirePassesAndFails) {
  EXPECT_NO_THROW(MTP_REQUIRE(1 + 1 == 2, "math"));
  EXPECT_THROW(MTP_REQUIRE(1 + 1 == 3, "math is ", "broken"), Error);
}
