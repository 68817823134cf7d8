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
  MTP_REQUIRE(k >= 0, "acceptance_intervals: k ", k);
  std::vector<std::vector<double>> numerators = {s.accepted};
  if (!s.expected.empty()) numerators.push_back(s.expected);
  const std::vector<Interval> per_step = bootstrap_ratio_intervals(s.steps, numerators, seed, resamples);
  AcceptanceIntervals out;
  // k = 0 (an online point with MTP off) drafts nothing: no rate, tau 1.
  auto rate = [k](const Interval& i) { return k > 0 ? Interval{i.lo / k, i.hi / k} : Interval{}; };
  auto tau = [](const Interval& i) { return Interval{1 + i.lo, 1 + i.hi}; };
  out.acceptance_rate = rate(per_step[0]);
  out.tau = tau(per_step[0]);
  if (per_step.size() > 1) {
    out.expected_acceptance_rate = rate(per_step[1]);
    out.expected_tau = tau(per_step[1]);
  }
  return out;
}

Throughput online_throughput(std::span<const int32_t> sequence, std::span<const int32_t> accepted,
                             std::span<const uint8_t> warmup, std::span<const double> step_ms,
                             std::span<const int32_t> batch_rows, int world, uint64_t seed, int resamples) {
  const size_t n = sequence.size();
  MTP_REQUIRE(accepted.size() == n && warmup.size() == n && step_ms.size() == n && batch_rows.size() == n,
              "online_throughput: columns of ", n, ", ", accepted.size(), ", ", warmup.size(), ", ",
              step_ms.size(), " and ", batch_rows.size(), " rows");
  MTP_REQUIRE(world >= 1, "online_throughput: world ", world);
  std::map<int32_t, size_t> at;
  std::vector<double> tokens, time, share;
  Throughput t;
  for (size_t i = 0; i < n; ++i) {
    if (warmup[i]) continue;
    MTP_REQUIRE(batch_rows[i] >= 1 && accepted[i] >= 0 && step_ms[i] >= 0, "online_throughput: row ", i,
                " has batch_rows ", batch_rows[i], ", accepted ", accepted[i], ", step_ms ", step_ms[i]);
    auto [it, fresh] = at.emplace(sequence[i], tokens.size());
    if (fresh) {
      tokens.push_back(0);
      time.push_back(0);
      share.push_back(0);
    }
    const double s = step_ms[i] / 1000.0;
    tokens[it->second] += accepted[i] + 1;
    time[it->second] += s;
    share[it->second] += s / batch_rows[i];
    t.tokens += accepted[i] + 1;
    t.seconds += s / batch_rows[i];
  }
  double total_time = 0;
  for (const double x : time) total_time += x;
  if (t.tokens == 0 || total_time <= 0 || t.seconds <= 0) return t;
  t.per_sequence = static_cast<double>(t.tokens) / total_time;
  t.per_gpu = static_cast<double>(t.tokens) / t.seconds / world;
  const Interval seq = bootstrap_ratio_intervals(time, {tokens}, seed, resamples)[0];
  const Interval gpu = bootstrap_ratio_intervals(share, {tokens}, seed, resamples)[0];
  t.per_sequence_ci = seq;
  t.per_gpu_ci = Interval{gpu.lo / world, gpu.hi / world};
  return t;
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
