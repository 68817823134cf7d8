// Summaries of latency samples: order statistics, a bootstrap confidence interval of the median
// and a noise figure, so that every reported time says how noisy it was. One definition for the
// results files (harness) and the benchmarks (bench/), so their medians and percentiles agree.
//
// Definitions (docs/results-schema.md): quantiles interpolate linearly between order statistics
// (numpy's default, "linear"): q(p) = x[floor(h)] + (h - floor(h)) (x[floor(h)+1] - x[floor(h)]),
// h = (n - 1) p. The 95% CI of the median is the percentile bootstrap: `resamples` resamples of n
// drawn with replacement by a seeded generator, the 2.5% and 97.5% quantiles of their medians.
// rel_spread = (p90 - p10) / median. An empty sample gives NaN everywhere and n = 0.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace mtplab {

struct Summary {
  int64_t n = 0;
  double mean = 0, median = 0, p10 = 0, p90 = 0, p99 = 0, min = 0, max = 0;
  double ci95_lo = 0, ci95_hi = 0;  ///< bootstrap 95% CI of the median
  double rel_spread = 0;            ///< (p90 - p10) / median
};

/// Quantile p in [0, 1] of sorted values (linear interpolation); NaN when empty.
double quantile_sorted(std::span<const double> sorted, double p);
/// The same quantile of values in any order (sorts a copy).
double quantile(std::span<const double> values, double p);
/// The summary of `values` (any order); `seed` makes the bootstrap reproducible.
Summary summarize(std::span<const double> values, uint64_t seed, int resamples = 1000);

}  // namespace mtplab
