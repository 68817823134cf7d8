// Teacher-forced replay (harness/replay_teacher.hpp) on the CPU backend: every position once, the
// drafter's state at each position that of a fresh prefill of the trace's rows, the chain fed the
// trace's tokens, the accepted prefix that of a speculative step at the same position, batched
// rows equal to single ones, and per-depth accuracy on a trace whose first drafts are right. Also
// the speculative replay's draft_stats hook (harness/replay.hpp): the stats of every step are
// those of a propose with stats from the same state, at batch 1 and 3.
#include <gtest/gtest.h>

#include <algorithm>

#include "common/drafter.hpp"
#include "common/trace.hpp"
#include "drafter/factory.hpp"
#include "harness/replay.hpp"
#include "harness/replay_teacher.hpp"
#include "model/weights.hpp"

using namespace mtplab;
using drafter::DrafterOptions;
using harness::StepRecord;

namespace {

constexpr int kHidden = 128;  // the tiny preset
constexpr int kDrafts = 3;

using Fixture = test::TinyCpuDrafterOf<kDrafts>;

const std::vector<io::TraceSequence>& shared_trace() { return test::shared_tiny_trace(3, 20, 24, 5); }

const bf16* row(const io::TraceSequence& s, int r) {
  return s.hiddens.data() + static_cast<size_t>(r) * kHidden;
}

// The drafts at position L from a fresh sequence holding the trace's rows 0 .. L - 2, with `chain`
// tokens (empty: the drafter's own drafts).
std::vector<int32_t> fresh_drafts(drafter::MtpDrafter& d, const io::TraceSequence& s, int L,
                                  std::span<const int32_t> chain) {
  auto st = d.new_sequence();
  d.append_rows(*st, s.tokens.data() + 1, row(s, 0), L - 1, 0);
  drafter::ProposeExtras x;
  x.chain_tokens = chain;
  return d.propose(*st, s.tokens[L], row(s, L - 1), kDrafts, x);
}

std::vector<StepRecord> teacher(drafter::MtpDrafter& d, const io::TraceSequence& s, bool stats = false) {
  harness::ReplayHooks hooks;
  hooks.draft_stats = stats;
  return harness::replay_teacher_forced(d, s, 0, kDrafts, kHidden, hooks);
}

}  // namespace

TEST(TeacherForced, EveryPositionOnceFromTheTraceState) {
  Fixture f;
  auto d = f.make();
  const io::TraceSequence& s = shared_trace()[0];
  const auto steps = teacher(*d, s);
  const int P = s.prompt_length, N = static_cast<int>(s.tokens.size());
  ASSERT_EQ(static_cast<int>(steps.size()), N - 1 - kDrafts - P + 1);
  int chain_mattered = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const StepRecord& r = steps[i];
    const int L = P + static_cast<int>(i);
    ASSERT_EQ(r.position, L);
    for (int j = 0; j < kDrafts; ++j)
      EXPECT_EQ(r.targets[static_cast<size_t>(j)], s.tokens[static_cast<size_t>(L + 1 + j)]);
    EXPECT_EQ(r.accepted, harness::accepted_prefix(r.drafts, r.targets));
    // The state at L is the trace's rows (rollback to the true row after every position), and the
    // chain is the trace's tokens t_{L+1} .. t_{L+k-1}.
    const std::vector<int32_t> chain(s.tokens.begin() + L + 1, s.tokens.begin() + L + kDrafts);
    EXPECT_EQ(r.drafts, fresh_drafts(*d, s, L, chain)) << "position " << L;
    // Up to and including the first miss the drafts are those of an unforced (speculative) propose
    // at the same position, so `accepted` is what a speculative step at L accepts.
    const std::vector<int32_t> own = fresh_drafts(*d, s, L, {});
    const size_t same = static_cast<size_t>(std::min(r.accepted + 1, kDrafts));
    EXPECT_TRUE(std::equal(own.begin(), own.begin() + static_cast<std::ptrdiff_t>(same), r.drafts.begin()))
        << "position " << L;
    EXPECT_EQ(harness::accepted_prefix(own, r.targets), r.accepted);
    chain_mattered += own != r.drafts;
  }
  // With random weights the first draft misses almost everywhere, so the forced chain (the trace's
  // token instead of the miss) changes later drafts at some positions.
  EXPECT_GT(chain_mattered, 0);
}

TEST(TeacherForced, KeepRowsCatchUpToTheSameDrafts) {
  // draft_rows keep: after_verify(0) keeps no row of the propose and the replay catches up the
  // true row L - 1; the drafts must equal those under rewrite (which keeps it).
  Fixture f;
  DrafterOptions keep;
  keep.draft_rows = drafter::DraftRows::keep;
  auto a = f.make(), b = f.make(keep);
  const io::TraceSequence& s = shared_trace()[1];
  const auto x = teacher(*a, s), y = teacher(*b, s);
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i].drafts, y[i].drafts) << "step " << i;
}

TEST(TeacherForced, StatsAreRecordedPerDraft) {
  Fixture f;
  auto d = f.make();
  const io::TraceSequence& s = shared_trace()[0];
  const auto with = teacher(*d, s, true), without = teacher(*d, s, false);
  ASSERT_EQ(with.size(), without.size());
  for (size_t i = 0; i < with.size(); ++i) {
    EXPECT_EQ(with[i].drafts, without[i].drafts);  // stats do not change the drafts
    ASSERT_EQ(with[i].stats.size(), static_cast<size_t>(kDrafts));
    EXPECT_TRUE(without[i].stats.empty());
    for (const auto& st : with[i].stats) {
      EXPECT_GE(st.margin, 0.0f);
      EXPECT_LE(st.logprob, 0.0f);
    }
  }
}

TEST(TeacherForced, BatchedRowsEqualSingleSequences) {
  Fixture f;
  auto d = f.make();
  const auto& trace = shared_trace();
  std::vector<StepRecord> single;
  for (const auto& s : trace) {
    harness::ReplayHooks hooks;
    hooks.draft_stats = true;
    auto steps = harness::replay_teacher_forced(*d, s, static_cast<int>(s.index), kDrafts, kHidden, hooks);
    single.insert(single.end(), steps.begin(), steps.end());
  }
  for (int B : {1, 2, 3}) {
    std::vector<StepRecord> batched;
    std::vector<int> steps_of(trace.size(), -1);
    harness::BatchReplayHooks hooks;
    hooks.draft_stats = true;
    hooks.after_step = [&](const std::vector<StepRecord>& rows) {
      for (const auto& r : rows) EXPECT_LE(r.batch_rows, B);
      batched.insert(batched.end(), rows.begin(), rows.end());
      return true;
    };
    hooks.after_sequence = [&](int i, int steps) { steps_of[static_cast<size_t>(i)] = steps; };
    harness::replay_teacher_forced_batched(*d, trace, B, kDrafts, kHidden, hooks);
    ASSERT_EQ(batched.size(), single.size()) << "B = " << B;
    auto key = [](const StepRecord& r) { return std::make_pair(r.sequence, r.position); };
    std::sort(batched.begin(), batched.end(), [&](auto& x, auto& y) { return key(x) < key(y); });
    for (size_t i = 0; i < single.size(); ++i) {
      ASSERT_EQ(key(batched[i]), key(single[i]));
      EXPECT_EQ(batched[i].drafts, single[i].drafts) << "B = " << B << ", step " << i;
      EXPECT_EQ(batched[i].accepted, single[i].accepted);
      for (int j = 0; j < kDrafts; ++j) {
        EXPECT_EQ(batched[i].stats[static_cast<size_t>(j)].margin,
                  single[i].stats[static_cast<size_t>(j)].margin);
        EXPECT_EQ(batched[i].stats[static_cast<size_t>(j)].logprob,
                  single[i].stats[static_cast<size_t>(j)].logprob);
      }
    }
    for (size_t i = 0; i < trace.size(); ++i)
      EXPECT_EQ(steps_of[i],
                static_cast<int>(trace[i].tokens.size()) - 1 - kDrafts - trace[i].prompt_length + 1);
  }
}

// A trace whose every continuation token is the drafter's own first draft at that position (the
// hiddens stay the synthetic target's): teacher forcing must find depth 1 right at every
// position, so every position accepts at least one draft; deeper drafts are conditioned on the
// drafter's own hidden, not the trace's, and need not be right.
TEST(TeacherForced, DepthOneIsRightEverywhereOnASelfDraftedTrace) {
  Fixture f;
  auto d = f.make();
  io::TraceSequence s = shared_trace()[2];
  const int P = s.prompt_length, N = static_cast<int>(s.tokens.size());
  for (int L = P; L + 1 <= N - 1; ++L) {
    auto st = d->new_sequence();
    d->append_rows(*st, s.tokens.data() + 1, row(s, 0), L - 1, 0);
    s.tokens[static_cast<size_t>(L + 1)] =
        d->propose(*st, s.tokens[static_cast<size_t>(L)], row(s, L - 1), 1)[0];
  }
  const auto steps = teacher(*d, s);
  ASSERT_FALSE(steps.empty());
  std::vector<int32_t> drafts, targets;
  for (const auto& r : steps) {
    EXPECT_GE(r.accepted, 1) << "position " << r.position;
    drafts.insert(drafts.end(), r.drafts.begin(), r.drafts.end());
    targets.insert(targets.end(), r.targets.begin(), r.targets.end());
  }
  const std::vector<double> rate = harness::depth_hit_rates(drafts, targets, kDrafts);
  ASSERT_EQ(rate.size(), static_cast<size_t>(kDrafts));
  EXPECT_EQ(rate[0], 1.0);
  // Against the definition, counted by hand from the records.
  for (int j = 1; j < kDrafts; ++j) {
    int hits = 0;
    for (const auto& r : steps) hits += r.drafts[static_cast<size_t>(j)] == r.targets[static_cast<size_t>(j)];
    EXPECT_DOUBLE_EQ(rate[static_cast<size_t>(j)],
                     static_cast<double>(hits) / static_cast<double>(steps.size()));
  }
}

TEST(TeacherForced, DepthHitRatesCountSelectedRows) {
  const std::vector<int32_t> drafts = {1, 2, 3, 4, 5, 6};
  const std::vector<int32_t> targets = {1, 0, 3, 4, 5, 0};
  EXPECT_EQ(harness::depth_hit_rates(drafts, targets, 3), (std::vector<double>{1.0, 0.5, 0.5}));
  const std::vector<uint8_t> only_second = {0, 1};
  EXPECT_EQ(harness::depth_hit_rates(drafts, targets, 3, only_second), (std::vector<double>{1.0, 1.0, 0.0}));
  const std::vector<uint8_t> none = {0, 0};
  EXPECT_TRUE(harness::depth_hit_rates(drafts, targets, 3, none).empty());
}

TEST(ReplayStats, SpeculativeStepsRecordTheStatsOfTheirPropose) {
  Fixture f;
  auto d = f.make();
  const auto& trace = shared_trace();
  std::vector<StepRecord> single;
  for (const auto& s : trace) {
    harness::AcceptanceStats unused;
    harness::ReplayHooks hooks;
    hooks.draft_stats = true;
    hooks.after_step = [&](const StepRecord& r) {
      single.push_back(r);
      return true;
    };
    const auto plain = harness::replay_sequence(*d, s, static_cast<int>(s.index), kDrafts, kHidden, unused);
    const auto with =
        harness::replay_sequence(*d, s, static_cast<int>(s.index), kDrafts, kHidden, unused, hooks);
    ASSERT_EQ(plain.size(), with.size());
    for (size_t i = 0; i < with.size(); ++i) {
      EXPECT_EQ(with[i].drafts, plain[i].drafts);  // stats change nothing else
      EXPECT_TRUE(plain[i].stats.empty());
      ASSERT_EQ(with[i].stats.size(), static_cast<size_t>(kDrafts));
      // The same state (the trace's rows up to L - 1, draft_rows rewrite), a propose with stats.
      auto st = d->new_sequence();
      const int L = with[i].position;
      d->append_rows(*st, s.tokens.data() + 1, row(s, 0), L - 1, 0);
      std::vector<drafter::DraftStats> want;
      drafter::ProposeExtras x;
      x.stats = &want;
      d->propose(*st, s.tokens[static_cast<size_t>(L)], row(s, L - 1), kDrafts, x);
      for (int j = 0; j < kDrafts; ++j) {
        EXPECT_EQ(with[i].stats[static_cast<size_t>(j)].margin, want[static_cast<size_t>(j)].margin);
        EXPECT_EQ(with[i].stats[static_cast<size_t>(j)].logprob, want[static_cast<size_t>(j)].logprob);
      }
    }
  }
  std::vector<StepRecord> batched;
  harness::BatchReplayHooks hooks;
  hooks.draft_stats = true;
  hooks.after_step = [&](const std::vector<StepRecord>& rows) {
    batched.insert(batched.end(), rows.begin(), rows.end());
    return true;
  };
  harness::replay_batched(*d, trace, 3, kDrafts, kHidden, hooks);
  ASSERT_EQ(batched.size(), single.size());
  auto key = [](const StepRecord& r) { return std::make_pair(r.sequence, r.position); };
  std::sort(batched.begin(), batched.end(), [&](auto& x, auto& y) { return key(x) < key(y); });
  std::sort(single.begin(), single.end(), [&](auto& x, auto& y) { return key(x) < key(y); });
  for (size_t i = 0; i < single.size(); ++i) {
    ASSERT_EQ(key(batched[i]), key(single[i]));
    ASSERT_EQ(batched[i].stats.size(), static_cast<size_t>(kDrafts));
    for (int j = 0; j < kDrafts; ++j)
      EXPECT_EQ(batched[i].stats[static_cast<size_t>(j)].margin,
                single[i].stats[static_cast<size_t>(j)].margin);
  }
}
