// What a reader needs beside an acceptance figure to judge it: the accepted-length histogram, a
// bootstrap confidence interval over the independent units (sequences), and the resolution of a
// BF16 logit, against which a draft's top-1 minus top-2 margin tells a near-tie from a real flip.
//
// Invariants:
// - The units of a bootstrap are sequences, not steps: the steps of one sequence share its
//   prompt and topic and are correlated, so a steps bootstrap understates the spread whenever
//   sequences differ (tests/harness/test_uncertainty.cpp shows one case).
// - Intervals are percentile bootstraps of the ratio estimator sum(numerators) / sum(denominators),
//   recomputed on each resample; the resamples depend on the seed alone (splitmix64), so a rerun
//   of a point reproduces its interval bit for bit.
// - Units with a zero denominator (a sequence too short for a step) carry no information about the
//   ratio and are left out of the resampling.
#pragma once
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace mtplab::harness {

/// Steps with exactly j accepted drafts, j = 0..k ([k + 1]). An accepted count outside 0..k is an
/// Error.
std::vector<int64_t> accepted_histogram(std::span<const int32_t> accepted, int k);

/// A two-sided interval; NaN bounds when there was nothing to resample.
struct Interval {
  double lo = std::numeric_limits<double>::quiet_NaN();
  double hi = std::numeric_limits<double>::quiet_NaN();
};

/// Default resamples of the acceptance intervals (docs/results-schema.md).
inline constexpr int kBootstrapResamples = 2000;

/// Percentile bootstrap intervals of several ratios over the same units: ratio q is
/// sum_u numerators[q][u] / sum_u denominators[u]. Each resample draws units.size() units with
/// replacement (the same draws for every ratio), and the interval of ratio q is the
/// ((1 - level) / 2, (1 + level) / 2) quantiles of its resampled values (linear interpolation,
/// core/stats.hpp). numerators[q].size() must equal denominators.size(); denominators >= 0. A
/// resample whose denominator sum is 0 cannot occur (zero-denominator units are left out).
std::vector<Interval> bootstrap_ratio_intervals(std::span<const double> denominators,
                                                const std::vector<std::vector<double>>& numerators,
                                                uint64_t seed, int resamples = kBootstrapResamples,
                                                double level = 0.95);

/// The seed of a point's acceptance intervals: fixed by the point's index, so a rerun reproduces
/// them (below 2^63).
uint64_t acceptance_bootstrap_seed(int64_t point_index);

/// Per sequence (the bootstrap's unit) the sums of its steps, in the order first seen.
struct SequenceSums {
  std::vector<int32_t> sequence;  ///< TraceSequence::index
  std::vector<double> steps;      ///< steps of the sequence
  std::vector<double> accepted;   ///< sum of accepted drafts over its steps
  /// Sum of the steps' expected accepted lengths (sampling verification: sum_i prod_{j<=i} a_j of
  /// each step, expected_accepted()); empty when the point has none.
  std::vector<double> expected;
};
/// Groups step rows (parallel spans: sequence index, accepted count, and optionally each step's
/// expected accepted length) by sequence.
SequenceSums sums_by_sequence(std::span<const int32_t> sequence, std::span<const int32_t> accepted,
                              std::span<const double> expected = {});

/// The expected accepted length of one step from its per-draft acceptance probabilities a_1..a_k
/// (the chance the verifier accepts draft i given drafts 1..i-1 were): sum_i prod_{j<=i} a_j.
double expected_accepted(std::span<const float> accept_prob);

/// The 95% intervals of acceptance rate (accepted / (k steps)) and tau (1 + accepted / steps),
/// from one bootstrap of accepted / steps over sequences (the two are affine maps of that ratio),
/// and, when the sums have expected lengths, of the expected rate and tau from the same resamples
/// (NaN otherwise). k = 0 (nothing drafted): NaN rate intervals.
struct AcceptanceIntervals {
  Interval acceptance_rate, tau;
  Interval expected_acceptance_rate, expected_tau;
};
AcceptanceIntervals acceptance_intervals(const SequenceSums& s, int k, uint64_t seed,
                                         int resamples = kBootstrapResamples);

/// The throughput of an online point (docs/results-schema.md, "Online points") over its measured
/// steps (warm-up excluded, every repeat). A step row emits accepted + 1 tokens; its sequence spent
/// the step's step_ms on it, and the step's rows share that time. Per sequence u: tokens_u, time_u
/// (the sum of its steps' step_ms) and share_u (the sum of step_ms / batch_rows).
///   per_sequence = sum tokens_u / sum time_u      tokens per second one sequence sees
///   per_gpu      = sum tokens_u / sum share_u / world   (sum share_u: the measured steps' time)
/// with 95% intervals of the same percentile bootstrap over sequences (the same resamples for both).
struct Throughput {
  double per_sequence = std::numeric_limits<double>::quiet_NaN();
  double per_gpu = std::numeric_limits<double>::quiet_NaN();
  Interval per_sequence_ci, per_gpu_ci;
  int64_t tokens = 0;  ///< tokens emitted by the measured steps
  double seconds = 0;  ///< the measured steps' time
};
/// Parallel spans over step rows; step_ms in milliseconds.
Throughput online_throughput(std::span<const int32_t> sequence, std::span<const int32_t> accepted,
                             std::span<const uint8_t> warmup, std::span<const double> step_ms,
                             std::span<const int32_t> batch_rows, int world, uint64_t seed,
                             int resamples = kBootstrapResamples);

/// The spacing of BF16 values at the magnitude of v: 2^(e - 7) for |v| in [2^e, 2^(e + 1))
/// (BF16 keeps 7 fraction bits), 2^-133 (the subnormal spacing) below the smallest normal, NaN for
/// a non-finite v. A margin of two BF16 logits in the same binade is a multiple of it.
double bf16_spacing(double v);

/// Whether a top-1 minus top-2 margin of BF16 logits is below one BF16 step at the top-1 logit's
/// magnitude (bf16_spacing(top_logit)): the two logits are then too close for BF16 to order them.
/// With the top-1 logit unknown (NaN; drafter::DraftStats carries the margin only) the rule is
/// decided from the margin alone: two BF16 values closer than the spacing at the larger one are
/// either equal (margin 0: below) or, when the larger is exactly a power of two and the other its
/// BF16 predecessor, half a step apart; that case cannot be told from a margin of one step at a
/// smaller magnitude, so a positive margin then counts as not below (docs/numerics.md).
bool margin_below_bf16_step(double margin, double top_logit = std::numeric_limits<double>::quiet_NaN());

}  // namespace mtplab::harness
