// harness/uncertainty: the accepted-length histogram, bootstrap intervals over sequences (a known
// answer, coverage of the truth over seeded repetitions, sequences rather than steps as the units)
// and the BF16 spacing against the rounding of core/numeric.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "common/error_of.hpp"
#include "core/numeric.hpp"
#include "harness/uncertainty.hpp"

using namespace mtplab;
using namespace mtplab::harness;
using mtplab::test::error_of;

TEST(Uncertainty, AcceptedHistogramCountsEachLength) {
  const std::vector<int32_t> a = {0, 3, 1, 1, 0, 3, 3, 2};
  EXPECT_EQ(accepted_histogram(a, 3), (std::vector<int64_t>{2, 2, 1, 3}));
  EXPECT_EQ(accepted_histogram({}, 2), (std::vector<int64_t>{0, 0, 0}));
  const std::vector<int32_t> bad = {0, 4};
  EXPECT_NE(error_of([&] { accepted_histogram(bad, 3); }).find("accepted 4 drafts of 3"), std::string::npos);
}

TEST(Uncertainty, SumsBySequenceGroupInFirstSeenOrder) {
  const std::vector<int32_t> seq = {7, 7, 2, 7, 2, 9};
  const std::vector<int32_t> acc = {1, 2, 0, 3, 1, 0};
  const SequenceSums s = sums_by_sequence(seq, acc);
  EXPECT_EQ(s.sequence, (std::vector<int32_t>{7, 2, 9}));
  EXPECT_EQ(s.steps, (std::vector<double>{3, 2, 1}));
  EXPECT_EQ(s.accepted, (std::vector<double>{6, 1, 0}));
}

// Every sequence alike: every resample is the same ratio, so the interval has zero width at the
// point estimate.
TEST(Uncertainty, IdenticalSequencesGiveAZeroWidthInterval) {
  SequenceSums s;
  for (int i = 0; i < 25; ++i) {
    s.sequence.push_back(i);
    s.steps.push_back(17);
    s.accepted.push_back(23);
  }
  const int k = 3;
  const AcceptanceIntervals ci = acceptance_intervals(s, k, acceptance_bootstrap_seed(4));
  EXPECT_EQ(ci.acceptance_rate.lo, ci.acceptance_rate.hi);
  EXPECT_DOUBLE_EQ(ci.acceptance_rate.lo, 23.0 / (17.0 * k));
  EXPECT_EQ(ci.tau.lo, ci.tau.hi);
  EXPECT_DOUBLE_EQ(ci.tau.lo, 1 + 23.0 / 17.0);
}

TEST(Uncertainty, NothingToResampleGivesNaN) {
  SequenceSums s;
  s.sequence = {0, 1};
  s.steps = {0, 0};  // two sequences too short for a step
  s.accepted = {0, 0};
  const AcceptanceIntervals ci = acceptance_intervals(s, 2, 1);
  EXPECT_TRUE(std::isnan(ci.tau.lo) && std::isnan(ci.tau.hi));
  const std::vector<double> den = {1, 2};
  EXPECT_NE(error_of([&] { bootstrap_ratio_intervals(den, {{1.0}}, 1); }).find("1 numerators for 2"),
            std::string::npos);
}

TEST(Uncertainty, SeededIntervalsReproduceAndBracketTheEstimate) {
  std::mt19937_64 gen(11);
  std::uniform_int_distribution<int> len(5, 40), acc(0, 3);
  SequenceSums s;
  for (int i = 0; i < 30; ++i) {
    const int n = len(gen);
    int a = 0;
    for (int j = 0; j < n; ++j) a += acc(gen) * (i % 3 == 0 ? 1 : 0);
    s.sequence.push_back(i);
    s.steps.push_back(n);
    s.accepted.push_back(a);
  }
  double steps = 0, accepted = 0;
  for (size_t i = 0; i < s.steps.size(); ++i) steps += s.steps[i], accepted += s.accepted[i];
  const double tau = 1 + accepted / steps;
  const AcceptanceIntervals a = acceptance_intervals(s, 3, 99), b = acceptance_intervals(s, 3, 99);
  EXPECT_EQ(a.tau.lo, b.tau.lo);
  EXPECT_EQ(a.tau.hi, b.tau.hi);
  EXPECT_LT(a.tau.lo, tau);
  EXPECT_GT(a.tau.hi, tau);
  // tau and the rate come from the same resamples: tau = 1 + k * rate at both ends.
  EXPECT_NEAR(a.tau.lo, 1 + 3 * a.acceptance_rate.lo, 1e-12);
  EXPECT_NEAR(a.tau.hi, 1 + 3 * a.acceptance_rate.hi, 1e-12);
  const AcceptanceIntervals c = acceptance_intervals(s, 3, 100);
  EXPECT_NE(a.tau.lo, c.tau.lo);  // another seed, other resamples
}

namespace {
// A sample of `m` sequences of `steps` steps from a two-valued population: an "easy" sequence
// (probability p_easy) accepts `easy` drafts at every step, a "hard" one `hard`.
struct TwoValued {
  double p_easy = 0.3;
  int steps = 20, easy = 2, hard = 0;
  double truth() const { return p_easy * easy + (1 - p_easy) * hard; }  // accepted per step
  SequenceSums draw(std::mt19937_64& gen, int m) const {
    std::bernoulli_distribution is_easy(p_easy);
    SequenceSums s;
    for (int i = 0; i < m; ++i) {
      s.sequence.push_back(i);
      s.steps.push_back(steps);
      s.accepted.push_back(static_cast<double>(steps) * (is_easy(gen) ? easy : hard));
    }
    return s;
  }
};
// The same sample bootstrapped with steps as the units.
Interval steps_bootstrap(const SequenceSums& s, uint64_t seed) {
  std::vector<double> den, num;
  for (size_t i = 0; i < s.steps.size(); ++i)
    for (int j = 0; j < static_cast<int>(s.steps[i]); ++j) {
      den.push_back(1);
      num.push_back(s.accepted[i] / s.steps[i]);  // the populations above accept alike at every step
    }
  return bootstrap_ratio_intervals(den, {num}, seed, 200)[0];
}
}  // namespace

// Over seeded repetitions of sampling 40 sequences, the 95% interval of accepted-per-step (tau - 1)
// must cover the population's value in about 95% of them (measured: 0.945). The percentile
// bootstrap of a mean of 40 Bernoulli-like units may undercover by a point or two (its known
// small-sample bias); with 400 repetitions the coverage's standard error is about 1.1 points, so
// [0.90, 0.98] is about 3 standard errors either side of 0.94 and still rejects a badly calibrated
// interval (the steps bootstrap below covers 0.40).
TEST(Uncertainty, IntervalCoversTheTruthInAbout95PercentOfRepetitions) {
  const TwoValued pop;
  const int k = 3, reps = 400, m = 40;
  std::mt19937_64 gen(2024);
  int covered = 0, steps_covered = 0;
  for (int r = 0; r < reps; ++r) {
    const SequenceSums s = pop.draw(gen, m);
    const AcceptanceIntervals ci = acceptance_intervals(s, k, acceptance_bootstrap_seed(r));
    const double tau = 1 + pop.truth();
    covered += ci.tau.lo <= tau && tau <= ci.tau.hi;
    const Interval st = steps_bootstrap(s, acceptance_bootstrap_seed(r));
    steps_covered += st.lo <= pop.truth() && pop.truth() <= st.hi;
  }
  const double coverage = static_cast<double>(covered) / reps;
  const double steps_coverage = static_cast<double>(steps_covered) / reps;
  std::printf("coverage of the 95%% interval over %d repetitions: sequences %.4f, steps %.4f\n", reps,
              coverage, steps_coverage);
  EXPECT_GE(coverage, 0.90) << "sequence bootstrap coverage";
  EXPECT_LE(coverage, 0.98) << "sequence bootstrap coverage";
  // Steps within a sequence are perfectly correlated here: resampling them as independent units
  // gives intervals about sqrt(20) times too narrow, which miss the truth most of the time.
  EXPECT_LT(steps_coverage, 0.6) << "steps bootstrap coverage";
}

// One long sequence that accepts everything and many short ones that accept nothing: whether the
// long one is drawn dominates the ratio, which only resampling sequences can see. Resampling
// steps treats its 1000 steps as 1000 independent draws and gives a far narrower interval.
TEST(Uncertainty, OneLongSequenceWidensTheIntervalBeyondAStepsBootstrap) {
  const int k = 3;
  SequenceSums s;
  s.sequence.push_back(0);
  s.steps.push_back(1000);
  s.accepted.push_back(1000.0 * k);
  for (int i = 1; i <= 30; ++i) {
    s.sequence.push_back(i);
    s.steps.push_back(10);
    s.accepted.push_back(0);
  }
  const AcceptanceIntervals seq = acceptance_intervals(s, k, 5);
  const Interval st = steps_bootstrap(s, 5);
  const double seq_width = seq.tau.hi - seq.tau.lo, steps_width = st.hi - st.lo;
  EXPECT_GT(steps_width, 0.0);
  EXPECT_GT(seq_width, 5 * steps_width) << "sequence interval [" << seq.tau.lo << ", " << seq.tau.hi
                                        << "], steps interval of tau - 1 [" << st.lo << ", " << st.hi << "]";
  // About a third of the resamples miss the long sequence entirely (P = (30/31)^31 ~ 0.36): the
  // interval reaches down to tau = 1.
  EXPECT_EQ(seq.tau.lo, 1.0);
}

TEST(Uncertainty, Bf16SpacingIsTheDistanceToTheNextBf16Value) {
  EXPECT_EQ(bf16_spacing(1.0), 0x1p-7);
  EXPECT_EQ(bf16_spacing(1.99), 0x1p-7);
  EXPECT_EQ(bf16_spacing(2.0), 0x1p-6);
  EXPECT_EQ(bf16_spacing(-3.0), 0x1p-6);
  EXPECT_EQ(bf16_spacing(0.75), 0x1p-8);
  EXPECT_EQ(bf16_spacing(20.0), 0x1p-3);
  EXPECT_EQ(bf16_spacing(0.0), 0x1p-133);
  EXPECT_TRUE(std::isnan(bf16_spacing(INFINITY)));
  // Against the BF16 rounding itself: for random BF16 values b (not the largest of their binade),
  // the next BF16 value up is b + spacing(b), and b + spacing / 4 rounds back to b.
  std::mt19937_64 gen(3);
  std::uniform_real_distribution<float> u(-300.0f, 300.0f);
  for (int i = 0; i < 2000; ++i) {
    const float b = round_bf16(u(gen));
    if (b == 0) continue;
    bf16 bits = to_bf16(b);
    bits.bits = static_cast<uint16_t>(bits.bits + 1);  // one unit in the last place, away from zero
    const double next = to_float(bits);
    if (std::ilogb(next) != std::ilogb(static_cast<double>(b))) continue;  // crossed into the next binade
    EXPECT_EQ(std::fabs(next - b), bf16_spacing(b)) << b;
    EXPECT_EQ(round_bf16(b + static_cast<float>(std::copysign(bf16_spacing(b) / 4, b))), b) << b;
  }
}

TEST(Uncertainty, MarginBelowOneBf16Step) {
  // Known top-1 logit: against the spacing at its magnitude.
  EXPECT_TRUE(margin_below_bf16_step(0.0, 10.0));
  EXPECT_FALSE(margin_below_bf16_step(0x1p-4, 10.0));  // one step in [8, 16)
  EXPECT_TRUE(margin_below_bf16_step(0x1p-5, 8.0));    // 8 - 2^-5 is 8's BF16 predecessor: half a step
  EXPECT_FALSE(margin_below_bf16_step(0x1p-5, 7.0));   // one step in [4, 8)
  // Unknown top-1 logit: only an exact tie is decided as below.
  EXPECT_TRUE(margin_below_bf16_step(0.0));
  EXPECT_FALSE(margin_below_bf16_step(0x1p-5));
  EXPECT_FALSE(margin_below_bf16_step(0.75));
  // Every pair of BF16 values: a margin below the spacing at the larger one is 0, or half a step
  // with the larger a power of two, so the margin-only rule never calls a pair below that is not.
  std::mt19937_64 gen(8);
  std::uniform_real_distribution<float> u(-40.0f, 40.0f);
  for (int i = 0; i < 5000; ++i) {
    const float a = round_bf16(u(gen));
    bf16 bits = to_bf16(a);
    bits.bits = static_cast<uint16_t>(bits.bits + (i % 3 == 0 ? 0 : i % 3 == 1 ? 1 : 3));
    const float b = to_float(bits);
    const double hi = std::max(a, b), margin = std::fabs(static_cast<double>(a) - b);
    if (margin_below_bf16_step(margin)) {
      EXPECT_TRUE(margin_below_bf16_step(margin, hi)) << a << " " << b;
    }
    if (margin_below_bf16_step(margin, hi) && margin > 0) {
      EXPECT_EQ(margin * 2, bf16_spacing(hi)) << a << " " << b;
    }
  }
}

// The expected accepted length of a step, and its intervals beside the realised ones: greedy
// probabilities (0 / 1) give the realised figures exactly, and the same resamples serve both.
TEST(Uncertainty, ExpectedLengthsShareTheResamples) {
  EXPECT_DOUBLE_EQ(expected_accepted(std::vector<float>{1, 1, 0}), 2.0);
  EXPECT_DOUBLE_EQ(expected_accepted(std::vector<float>{0.5f, 0.5f, 1}), 0.5 + 0.25 + 0.25);
  EXPECT_DOUBLE_EQ(expected_accepted(std::vector<float>{0, 1, 1}), 0.0);
  EXPECT_NE(error_of([] { expected_accepted(std::vector<float>{1.5f}); }).find("outside [0, 1]"),
            std::string::npos);
  std::mt19937_64 gen(21);
  std::uniform_int_distribution<int> len(3, 30), acc(0, 2);
  std::vector<int32_t> seq, accepted;
  std::vector<double> greedy, half;
  for (int q = 0; q < 12; ++q)
    for (int i = 0, n = len(gen); i < n; ++i) {
      seq.push_back(q);
      accepted.push_back(acc(gen) * (q % 2));
      greedy.push_back(accepted.back());  // a_i in {0, 1}: the expected length is the realised one
      half.push_back(0.5 * accepted.back());
    }
  const AcceptanceIntervals plain = acceptance_intervals(sums_by_sequence(seq, accepted), 2, 7);
  EXPECT_TRUE(std::isnan(plain.expected_tau.lo));
  const AcceptanceIntervals g = acceptance_intervals(sums_by_sequence(seq, accepted, greedy), 2, 7);
  EXPECT_EQ(g.expected_tau.lo, g.tau.lo);
  EXPECT_EQ(g.expected_tau.hi, g.tau.hi);
  EXPECT_EQ(g.expected_acceptance_rate.lo, g.acceptance_rate.lo);
  EXPECT_EQ(g.tau.lo, plain.tau.lo);  // adding a numerator leaves the resamples as they were
  // Half of every accepted length: the same resamples, so exactly half of (tau - 1) at both ends.
  const AcceptanceIntervals h = acceptance_intervals(sums_by_sequence(seq, accepted, half), 2, 7);
  EXPECT_DOUBLE_EQ(h.expected_tau.lo - 1, 0.5 * (h.tau.lo - 1));
  EXPECT_DOUBLE_EQ(h.expected_tau.hi - 1, 0.5 * (h.tau.hi - 1));
}
