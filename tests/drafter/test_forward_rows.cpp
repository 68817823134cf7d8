// The pure selection comparison of the batch_qidx check, on the host.
#include <gtest/gtest.h>

#include <vector>

#include "drafter/selection_check.hpp"

using namespace mtplab;

namespace {

// ---- the pure comparison ------------------------------------------------------------------------

TEST(SelectionCheck, SameSetInAnotherOrderIsNotADifference) {
  const int width = 7;
  // Two rows; row 0 the same entries permuted (padding in other places), row 1 identical.
  const std::vector<int32_t> b = {0, 1, 2, 3, 8, -1, -1, /**/ 4, 5, 6, 7, -1, -1, -1};
  const std::vector<int32_t> r = {8, -1, 3, 2, 1, 0, -1, /**/ 4, 5, 6, 7, -1, -1, -1};
  const auto c = drafter::compare_selections(b.data(), r.data(), 2, width);
  EXPECT_EQ(c.rows_checked, 2);
  EXPECT_EQ(c.rows_differ, 0);
  EXPECT_EQ(c.entries_differ, 0);
}

TEST(SelectionCheck, PlantedDifferencesAreCounted) {
  const int width = 7;
  const std::vector<int32_t> b = {
      0,  1,  2,  3,  8,  9,  -1,  // row 0: pool {0..3} vs {4..7} swapped: 4 entries differ
      0,  1,  2,  3,  4,  -1, -1,  // row 1: same set
      12, 13, 14, 15, 16, -1, -1,  // row 2: one entry differs (16 vs 17), other order
      0,  1,  2,  3,  -1, -1, -1,  // row 3: a strict subset of the per-row set: 1 entry
  };
  const std::vector<int32_t> r = {
      4,  5,  6,  7,  8,  9,  -1,  //
      4,  3,  2,  1,  0,  -1, -1,  //
      17, 15, 14, 13, 12, -1, -1,  //
      0,  1,  2,  3,  5,  -1, -1,  //
  };
  const auto c = drafter::compare_selections(b.data(), r.data(), 4, width);
  EXPECT_EQ(c.rows_checked, 4);
  EXPECT_EQ(c.rows_differ, 3);
  EXPECT_EQ(c.entries_differ, 4 + 1 + 1);
  EXPECT_DOUBLE_EQ(c.differ_rate(), 3.0 / 4);
  // Symmetric in its arguments.
  const auto d = drafter::compare_selections(r.data(), b.data(), 4, width);
  EXPECT_EQ(d.rows_differ, c.rows_differ);
  EXPECT_EQ(d.entries_differ, c.entries_differ);
  // No rows: nothing counted, rate 0.
  EXPECT_EQ(drafter::compare_selections(b.data(), r.data(), 0, width).rows_checked, 0);
}

}  // namespace
