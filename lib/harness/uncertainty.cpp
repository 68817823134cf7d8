// Histograms, bootstrap intervals over sequences and the BF16 spacing (uncertainty.hpp).
#include "harness/uncertainty.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/stats.hpp"

namespace mtplab::harness {

std::vector<int64_t> accepted_histogram(std::span<const int32_t> accepted, int k) {
  MTP_REQUIRE(k >= 0, "accepted_histogram: k ", k, " < 0");
  std::vector<int64_t> h(static_cast<size_t>(k) + 1, 0);
  for (const int32_t a : accepted) {
    MTP_REQUIRE(a >= 0 && a <= k, "accepted_histogram: a step accepted ", a, " drafts of ", k);
    ++h[static_cast<size_t>(a)];
  }
  return h;
}

std::vector<Interval> bootstrap_ratio_intervals(std::span<const double> denominators,
                                                const std::vector<std::vector<double>>& numerators,
                                                uint64_t seed, int resamples, double level) {
  MTP_REQUIRE(resamples >= 1, "bootstrap: ", resamples, " resamples");
  MTP_REQUIRE(level > 0 && level < 1, "bootstrap: level ", level, " outside (0, 1)");
  for (const auto& num : numerators)
    MTP_REQUIRE(num.size() == denominators.size(), "bootstrap: ", num.size(), " numerators for ",
                denominators.size(), " denominators");
  // The units that carry information: a positive denominator.
  std::vector<size_t> units;
  for (size_t u = 0; u < denominators.size(); ++u) {
    MTP_REQUIRE(denominators[u] >= 0, "bootstrap: negative denominator ", denominators[u], " of unit ", u);
    if (denominators[u] > 0) units.push_back(u);
  }
  std::vector<Interval> out(numerators.size());
  if (units.empty()) return out;
  const size_t n = units.size(), q = numerators.size();
  std::vector<std::vector<double>> values(q, std::vector<double>(static_cast<size_t>(resamples)));
  std::vector<double> num(q);
  uint64_t state = seed;
  for (int r = 0; r < resamples; ++r) {
    double den = 0;
    std::fill(num.begin(), num.end(), 0.0);
    for (size_t i = 0; i < n; ++i) {
      const size_t u = units[splitmix64_next(state) % n];
      den += denominators[u];
      for (size_t j = 0; j < q; ++j) num[j] += numerators[j][u];
    }
    for (size_t j = 0; j < q; ++j) values[j][static_cast<size_t>(r)] = num[j] / den;
  }
  const double tail = (1 - level) / 2;
  for (size_t j = 0; j < q; ++j) {
    std::sort(values[j].begin(), values[j].end());
    out[j].lo = quantile_sorted(values[j], tail);
    out[j].hi = quantile_sorted(values[j], 1 - tail);
  }
  return out;
}

uint64_t acceptance_bootstrap_seed(int64_t point_index) {
  // 63 bits, so that the results file can record it as a (signed) int64 attribute.
  return splitmix64_mix(fnv1a64("acceptance bootstrap") ^ static_cast<uint64_t>(point_index)) >> 1;
}

SequenceSums sums_by_sequence(std::span<const int32_t> sequence, std::span<const int32_t> accepted,
                              std::span<const double> expected) {
  MTP_REQUIRE(sequence.size() == accepted.size(), "sums_by_sequence: ", sequence.size(), " sequence ids for ",
              accepted.size(), " accepted counts");
  MTP_REQUIRE(expected.empty() || expected.size() == sequence.size(), "sums_by_sequence: ", expected.size(),
              " expected lengths for ", sequence.size(), " steps");
  SequenceSums s;
  std::map<int32_t, size_t> at;
  for (size_t i = 0; i < sequence.size(); ++i) {
    auto [it, fresh] = at.emplace(sequence[i], s.sequence.size());
    if (fresh) {
      s.sequence.push_back(sequence[i]);
      s.steps.push_back(0);
      s.accepted.push_back(0);
      if (!expected.empty()) s.expected.push_back(0);
    }
    s.steps[it->second] += 1;
    s.accepted[it->second] += accepted[i];
    if (!expected.empty()) s.expected[it->second] += expected[i];
  }
  return s;
}

double expected_accepted(std::span<const float> accept_prob) {
  double prefix = 1, sum = 0;
  for (const float a : accept_prob) {
    MTP_REQUIRE(a >= 0 && a <= 1, "expected_accepted: acceptance probability ", a, " outside [0, 1]");
    prefix *= a;
    sum += prefix;
  }
  return sum;
}

AcceptanceIntervals acceptance_intervals(const SequenceSums& s, int k, uint64_t seed, int resamples) {
  MTP_REQUIRE(k >= 1, "acceptance_intervals: k ", k);
  std::vector<std::vector<double>> numerators = {s.accepted};
  if (!s.expected.empty()) numerators.push_back(s.expected);
  const std::vector<Interval> per_step = bootstrap_ratio_intervals(s.steps, numerators, seed, resamples);
  AcceptanceIntervals out;
  auto rate = [k](const Interval& i) { return Interval{i.lo / k, i.hi / k}; };
  auto tau = [](const Interval& i) { return Interval{1 + i.lo, 1 + i.hi}; };
  out.acceptance_rate = rate(per_step[0]);
  out.tau = tau(per_step[0]);
  if (per_step.size() > 1) {
    out.expected_acceptance_rate = rate(per_step[1]);
    out.expected_tau = tau(per_step[1]);
  }
  return out;
}

double bf16_spacing(double v) {
  if (!std::isfinite(v)) return std::numeric_limits<double>::quiet_NaN();
  const double a = std::fabs(v);
  if (a < 0x1p-126) return 0x1p-133;
  int e = 0;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1): a in [2^(e-1), 2^e)
  return std::ldexp(1.0, e - 1 - 7);
}

bool margin_below_bf16_step(double margin, double top_logit) {
  if (std::isnan(top_logit)) return margin == 0;
  return margin < bf16_spacing(top_logit);
}

}  // namespace mtplab::harness
