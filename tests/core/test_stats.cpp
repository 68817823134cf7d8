// core/stats: quantiles against hand-computed values, a bootstrap CI that brackets the median,
// and the bits of a seeded summary pinned from before the summaries moved into core (the
// results files' figures must not change with where the code lives).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/stats.hpp"

using namespace mtplab;

TEST(Stats, QuantilesAndBootstrap) {
  const std::vector<double> x = {5, 1, 4, 2, 3};  // sorted: 1 2 3 4 5
  const Summary s = summarize(x, 42);
  EXPECT_EQ(s.n, 5);
  EXPECT_DOUBLE_EQ(s.median, 3.0);
  EXPECT_DOUBLE_EQ(s.p10, 1.4);   // h = 0.4
  EXPECT_DOUBLE_EQ(s.p90, 4.6);   // h = 3.6
  EXPECT_DOUBLE_EQ(s.p99, 4.96);  // h = 3.96
  EXPECT_DOUBLE_EQ(s.mean, 3.0);
  EXPECT_DOUBLE_EQ(s.rel_spread, (4.6 - 1.4) / 3.0);
  EXPECT_LE(s.ci95_lo, s.median);
  EXPECT_GE(s.ci95_hi, s.median);
  // Seeded: the same seed gives the same interval; a large sample gives a tight one.
  std::mt19937_64 gen(7);
  std::lognormal_distribution<double> dist(0.0, 0.3);
  std::vector<double> big(4000);
  for (auto& v : big) v = dist(gen);
  const Summary a = summarize(big, 9), b = summarize(big, 9);
  EXPECT_EQ(a.ci95_lo, b.ci95_lo);
  EXPECT_EQ(a.ci95_hi, b.ci95_hi);
  EXPECT_LT(a.ci95_lo, a.median);
  EXPECT_GT(a.ci95_hi, a.median);
  // The true median of lognormal(0, 0.3) is 1; 4000 samples put it well inside +-5%.
  EXPECT_NEAR(a.median, 1.0, 0.05);
  EXPECT_LT(a.ci95_hi - a.ci95_lo, 0.05);
  const Summary e = summarize(std::vector<double>{}, 1);
  EXPECT_EQ(e.n, 0);
  EXPECT_TRUE(std::isnan(e.median));
}

TEST(Stats, QuantileOfUnsortedValuesSortsACopy) {
  const std::vector<double> x = {9, 1, 7, 3};  // sorted: 1 3 7 9
  EXPECT_DOUBLE_EQ(quantile(x, 0.5), 5.0);     // h = 1.5
  EXPECT_DOUBLE_EQ(quantile(x, 0.1), 1.6);     // h = 0.3
  EXPECT_DOUBLE_EQ(quantile(x, 1.0), 9.0);
  EXPECT_DOUBLE_EQ(quantile(x, 0.0), 1.0);
  EXPECT_EQ(x[0], 9);  // the input is left as it was
  EXPECT_TRUE(std::isnan(quantile(std::vector<double>{}, 0.5)));
}

// The values below were printed (%a) by the summaries as they stood in lib/harness before the
// move, for this input and these seeds (the run loop's table uses seed 1 and 200 resamples; the
// results writer seeds 0x5EED0000 + 64 * point + column with 1000).
TEST(Stats, SeededSummaryIsBitIdenticalToTheHarnessOne) {
  std::vector<double> x;
  for (int i = 0; i < 37; ++i) x.push_back(1.0 + 0.01 * ((i * 7919) % 37) + (i % 5 == 0 ? 0.5 : 0));
  const Summary s = summarize(x, 1, 200);
  EXPECT_EQ(s.median, 0x1.3ae147ae147aep+0);
  EXPECT_EQ(s.p10, 0x1.0d4fdf3b645a2p+0);
  EXPECT_EQ(s.p90, 0x1.ab851eb851eb8p+0);
  EXPECT_EQ(s.ci95_lo, 0x1.28f5c28f5c28fp+0);
  EXPECT_EQ(s.ci95_hi, 0x1.4f5c28f5c28f6p+0);
  EXPECT_EQ(s.rel_spread, 0x1.013fb013fb013p-1);
  const Summary t = summarize(x, 0x5EED0000ull + 3 * 64 + 2);
  EXPECT_EQ(t.ci95_lo, 0x1.2b851eb851eb8p+0);
  EXPECT_EQ(t.ci95_hi, 0x1.4a3d70a3d70a4p+0);
}
