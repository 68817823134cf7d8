// mtplab::Error and the rank tag: what an error and a log line say, with and without a known
// rank, with and without source locations (MTPLAB_DEBUG=1 / `mtplab -v`).
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "core/log.hpp"

using namespace mtplab;

TEST(Error, CarriesRankHostFileAndLine) {
  set_process_identity(3, 4);
  set_error_locations(false);
  try {
    MTP_FAIL("bad thing ", 42);
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "bad thing 42");
    EXPECT_EQ(e.rank(), 3);
    EXPECT_EQ(e.file(), "test_error.cpp");
    EXPECT_GT(e.line(), 0);
    // The location is kept, but printed only when asked for.
    EXPECT_EQ(e.describe(), "[rank 3@" + process_identity().host + "] bad thing 42");
    set_error_locations(true);
    EXPECT_EQ(e.describe(),
              str("[rank 3@", process_identity().host, "] bad thing 42 (test_error.cpp:", e.line(), ")"));
    set_error_locations(false);
    return;
  }
  FAIL() << "no exception";
}

TEST(Error, NoRankTagBeforeTheRankIsKnown) {
  set_process_identity(-1, 1);
  set_error_locations(false);
  try {
    MTP_FAIL("mtplab run: unknown option \"--pont\"");
  } catch (const Error& e) {
    EXPECT_EQ(e.describe(), "mtplab run: unknown option \"--pont\"");
  }
  EXPECT_EQ(rank_tag(), "");
  testing::internal::CaptureStderr();
  log_line(LogLevel::warn, "before MPI");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "warn: before MPI\n");
  set_process_identity(1, 2);
  EXPECT_EQ(rank_tag(), "[rank 1@" + process_identity().host + "] ");
  testing::internal::CaptureStderr();
  log_line(LogLevel::info, "after");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "[rank 1@" + process_identity().host + "] info: after\n");
}

TEST(Error, RequirePassesAndFails) {
  EXPECT_NO_THROW(MTP_REQUIRE(1 + 1 == 2, "math"));
  EXPECT_THROW(MTP_REQUIRE(1 + 1 == 3, "math is ", "broken"), Error);
}
