#include "core/stats.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/hash.hpp"

namespace mtplab {

double quantile_sorted(std::span<const double> sorted, double p) {
  if (sorted.empty()) return std::numeric_limits<double>::quiet_NaN();
  const double h = static_cast<double>(sorted.size() - 1) * std::clamp(p, 0.0, 1.0);
  const size_t lo = static_cast<size_t>(std::floor(h));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (h - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

double quantile(std::span<const double> values, double p) {
  std::vector<double> sorted(values.begin(), values.end());
  std::sort(sorted.begin(), sorted.end());
  return quantile_sorted(sorted, p);
}

Summary summarize(std::span<const double> values, uint64_t seed, int resamples) {
  Summary s;
  s.n = static_cast<int64_t>(values.size());
  if (values.empty()) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    s.mean = s.median = s.p10 = s.p90 = s.p99 = s.min = s.max = s.ci95_lo = s.ci95_hi = s.rel_spread = nan;
    return s;
  }
  std::vector<double> x(values.begin(), values.end());
  std::sort(x.begin(), x.end());
  s.mean = std::accumulate(x.begin(), x.end(), 0.0) / static_cast<double>(x.size());
  s.median = quantile_sorted(x, 0.5);
  s.p10 = quantile_sorted(x, 0.10);
  s.p90 = quantile_sorted(x, 0.90);
  s.p99 = quantile_sorted(x, 0.99);
  s.min = x.front();
  s.max = x.back();
  s.rel_spread = s.median != 0 ? (s.p90 - s.p10) / s.median : std::numeric_limits<double>::quiet_NaN();
  uint64_t state = seed;  // splitmix64: the resamples depend on the seed alone
  std::vector<double> medians(static_cast<size_t>(std::max(resamples, 1)));
  std::vector<double> r(x.size());
  for (auto& m : medians) {
    for (auto& v : r) v = x[splitmix64_next(state) % x.size()];
    // The median by selection (linear time): the upper middle, and for an even count the
    // largest value below it.
    const size_t mid = r.size() / 2;
    std::nth_element(r.begin(), r.begin() + static_cast<std::ptrdiff_t>(mid), r.end());
    m = r[mid];
    if (r.size() % 2 == 0)
      m = 0.5 * (m + *std::max_element(r.begin(), r.begin() + static_cast<std::ptrdiff_t>(mid)));
  }
  std::sort(medians.begin(), medians.end());
  s.ci95_lo = quantile_sorted(medians, 0.025);
  s.ci95_hi = quantile_sorted(medians, 0.975);
  return s;
}

}  // namespace mtplab
