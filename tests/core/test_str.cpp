// core/str: strict number parsing (what command lines and files hand to it) and the closest-name
// suggestion that error messages offer.
#include <gtest/gtest.h>

#include <limits>
#include <set>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/str.hpp"

using namespace mtplab;

TEST(Str, ParseInt64TakesTheWholeTextOnly) {
  EXPECT_EQ(parse_int64("42"), 42);
  EXPECT_EQ(parse_int64("-7"), -7);
  EXPECT_EQ(parse_int64("9223372036854775807"), INT64_MAX);
  EXPECT_FALSE(parse_int64("9223372036854775808"));  // one past the largest
  EXPECT_FALSE(parse_int64(""));
  EXPECT_FALSE(parse_int64("12x"));
  EXPECT_FALSE(parse_int64("1.5"));
  EXPECT_FALSE(parse_int64("0x10"));  // base 10 only
  EXPECT_FALSE(parse_int64("x"));
}

TEST(Str, ParseDoubleIsFiniteAndWhole) {
  EXPECT_EQ(parse_double("1.5"), 1.5);
  EXPECT_EQ(parse_double("-2e3"), -2000.0);
  EXPECT_FALSE(parse_double("1.5GB"));
  EXPECT_FALSE(parse_double(""));
  EXPECT_FALSE(parse_double("inf"));
  EXPECT_FALSE(parse_double("nan"));
  EXPECT_FALSE(parse_double("1e999"));
}

TEST(Str, EditDistance) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("point", "point"), 0u);
  EXPECT_EQ(edit_distance("pont", "point"), 1u);     // deletion
  EXPECT_EQ(edit_distance("poinnt", "point"), 1u);   // insertion
  EXPECT_EQ(edit_distance("hidden", "hiddne"), 2u);  // a swap is two edits
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
}

TEST(Str, ClosestMatch) {
  const std::vector<std::string> names = {"--point", "--set", "--out"};
  EXPECT_EQ(closest_match("--pont", names), "--point");
  EXPECT_EQ(closest_match("--ot", names), "--out");
  EXPECT_EQ(closest_match("--backend", names), "");  // nothing within 2 edits
  EXPECT_EQ(closest_match("--set", names), "--set");
  EXPECT_EQ(closest_match("x", std::vector<std::string>{}), "");
  // A tie goes to the first candidate in order.
  const std::set<std::string> keys = {"hidden", "hiddex"};
  EXPECT_EQ(closest_match("hiddeq", keys), "hidden");
}

// Messages print floating values exactly: two values that differ never read the same, however
// close (the stream's default 6 digits would print 0.7000001 as 0.7).
TEST(Str, MessagesPrintFloatingValuesExactly) {
  EXPECT_EQ(message("t ", 0.1 + 0.2), "t 0.30000000000000004");
  EXPECT_EQ(message(0.7000001, " vs ", 0.7), "0.7000001 vs 0.7");
  EXPECT_EQ(message(1.0, " ", 2.5f, " ", 1234567.0, " ", 1e-05), "1 2.5 1234567 1e-05");
  EXPECT_EQ(message(0.1f), "0.1");  // a float's own shortest text, not its double widening's
  EXPECT_EQ(message(std::numeric_limits<double>::infinity(), " ", -std::numeric_limits<double>::infinity()),
            "inf -inf");
  EXPECT_EQ(message("n ", 3, " s ", std::string("x")), "n 3 s x");  // other arguments as str()
  try {
    MTP_FAIL("temperature ", 0.7000001, " is not the trace's ", 0.7);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("temperature 0.7000001 is not the trace's 0.7"), std::string::npos)
        << e.what();
  }
}
