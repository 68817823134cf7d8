// Batched drafting on the CPU backend (one rank): a sequence's drafts at batch B must equal, bit
// for bit, the single-sequence drafter's drafts of that sequence alone, at B = 1, 3 and 16, with
// sequences of different prompt lengths, accepted counts that differ per sequence and step (so
// the rows of one batch sit at diverging positions), rows in a changing order, more sequences
// than slots (a released slot takes the next sequence), for every arm that touches the step:
// skip none / head / block, context_rows cache_only / full, head_fp8 off / on, draft_rows rewrite
// / keep, an FP8 latent cache, and batches padded to their graph bucket. Then the batch's own
// rules: slots, refusals, the timed phases.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "batch_replay.hpp"
#include "common/drafter.hpp"

using namespace mtplab;
using drafter::DrafterOptions;

namespace {

constexpr int kDraft = 3;

using Fixture = test::TinyCpuDrafterOf<kDraft>;

/// 20 sequences of 64 tokens from the synthetic target, shared by every test.
const std::vector<io::TraceSequence>& shared_trace() { return test::shared_tiny_trace(20, 16, 48, 9); }

/// Prompt lengths 3 .. 45: some sequences start inside the dense window (K + P - 1 = 19 rows), most
/// past it, where the selection is sparse.
std::vector<int> prompts(size_t count) { return test::spread_prompts(count, 3, 17, 43); }

using Arm = test::DrafterArm;

std::vector<Arm> arms() {
  using drafter::ContextRows, drafter::DraftRows, drafter::Skip;
  return {
      {"default", {}},
      {"skip head", {.skip = Skip::head}},
      {"skip block", {.skip = Skip::block}},
      {"context_rows full", {.context_rows = ContextRows::full}},
      {"head_fp8", {.head_fp8 = true}},
      {"draft_rows keep", {.draft_rows = DraftRows::keep}},
      {"full + fp8 + keep + context_gemm + batch_qidx",
       {.head_fp8 = true,
        .context_rows = ContextRows::full,
        .draft_rows = DraftRows::keep,
        .batch_qidx = true,
        .context_gemm = true}},
      {"FP8 latent cache", {}, ops::KvDtype::fp8},
  };
}

/// The first sequence whose drafts differ, for the failure message.
std::string first_difference(const test::SequenceDrafts& got, const test::SequenceDrafts& want) {
  for (size_t s = 0; s < want.size(); ++s) {
    if (got[s] == want[s]) continue;
    size_t i = 0;
    while (i < std::min(got[s].size(), want[s].size()) && got[s][i] == want[s][i]) ++i;
    return "sequence " + std::to_string(s) + " (prompt " + std::to_string(prompts(want.size())[s]) +
           ") first differs at draft " + std::to_string(i) + " (step " + std::to_string(i / kDraft) +
           ") of " + std::to_string(want[s].size());
  }
  return "none";
}

void expect_batch_equals_single(const Arm& arm, int slots, size_t sequences,
                                std::optional<drafter::BatchPadding> padding = std::nullopt) {
  Fixture f;
  const auto& all = shared_trace();
  const std::vector<io::TraceSequence> trace(all.begin(), all.begin() + static_cast<ptrdiff_t>(sequences));
  const auto p = prompts(sequences);
  auto single = f.make(arm.opt, arm.kv);
  const auto want = test::replay_single(*single, trace, p, kDraft, f.cfg.hidden);
  auto batched = f.make(arm.opt, arm.kv);
  const auto got = test::replay_batched(*batched, trace, p, kDraft, f.cfg.hidden, slots, padding);
  const std::string where = std::string(arm.name) + ", " + std::to_string(slots) + " slots, " +
                            std::to_string(sequences) + " sequences" +
                            (padding == drafter::BatchPadding::bucket ? ", padded to buckets" : "");
  size_t drafted = 0;
  for (const auto& d : want) drafted += d.size();
  ASSERT_GT(drafted, 0u) << where;
  EXPECT_TRUE(got.drafts == want) << where << ": " << first_difference(got.drafts, want);
  // The batch really held `slots` rows at once, and released slots were taken again.
  EXPECT_EQ(got.max_rows, slots) << where;
  if (sequences > static_cast<size_t>(slots)) {
    EXPECT_GT(got.slot_reuses, 0) << where;
  }
  if (arm.opt.skip == drafter::Skip::head) {
    for (const auto& d : got.drafts) {
      for (int32_t t : d) {
        EXPECT_EQ(t, 0) << where;
      }
    }
  }
}

}  // namespace

TEST(DrafterBatch, EveryArmDraftsAsTheSingleSequenceDrafterAtBatch1) {
  for (const Arm& arm : arms()) expect_batch_equals_single(arm, 1, 2);
}

TEST(DrafterBatch, EveryArmDraftsAsTheSingleSequenceDrafterAtBatch3) {
  for (const Arm& arm : arms()) expect_batch_equals_single(arm, 3, 5);
}

TEST(DrafterBatch, EveryArmDraftsAsTheSingleSequenceDrafterAtBatch16) {
  for (const Arm& arm : arms()) expect_batch_equals_single(arm, 16, 20);
}

TEST(DrafterBatch, PaddedToTheBucketDraftsTheSame) {
  // 3 rows padded to 4, 5 to 8, 16 exactly a bucket: padded rows (slot -1) read and write nothing,
  // so the live rows' drafts (and the caches later steps read) are unchanged.
  const Arm plain{"default", {}};
  Arm full{"context_rows full + fp8 head", {}};
  full.opt.context_rows = drafter::ContextRows::full;
  full.opt.head_fp8 = true;
  for (const Arm& arm : {plain, full}) {
    expect_batch_equals_single(arm, 3, 5, drafter::BatchPadding::bucket);
    expect_batch_equals_single(arm, 5, 7, drafter::BatchPadding::bucket);
  }
  expect_batch_equals_single(plain, 16, 18, drafter::BatchPadding::bucket);
}

TEST(DrafterBatch, BucketsArePowersOfTwoUpTo128) {
  EXPECT_EQ(drafter::batch_bucket(1), 1);
  EXPECT_EQ(drafter::batch_bucket(2), 2);
  EXPECT_EQ(drafter::batch_bucket(3), 4);
  EXPECT_EQ(drafter::batch_bucket(9), 16);
  EXPECT_EQ(drafter::batch_bucket(64), 64);
  EXPECT_EQ(drafter::batch_bucket(65), 128);
  EXPECT_EQ(drafter::batch_bucket(128), 128);
  EXPECT_THROW(drafter::batch_bucket(0), Error);
  EXPECT_THROW(drafter::batch_bucket(129), Error);
}

TEST(DrafterBatch, SlotsAreTakenLowestFirstAndReleased) {
  Fixture f;
  auto d = f.make({});
  auto batch = d->new_batch(3);
  EXPECT_EQ(batch->padding(), drafter::BatchPadding::exact);  // cuda_graph off
  EXPECT_EQ(d->new_sequence(*batch), 0);
  EXPECT_EQ(d->new_sequence(*batch), 1);
  EXPECT_EQ(d->new_sequence(*batch), 2);
  EXPECT_THROW(d->new_sequence(*batch), Error);  // full
  EXPECT_EQ(batch->live_count(), 3);
  const auto& t = shared_trace()[0];
  d->append_rows(*batch, 1, t.tokens.data() + 1, t.hiddens.data(), 10, 0);
  EXPECT_EQ(batch->seq_len(1), 10);
  d->release(*batch, 1);
  EXPECT_FALSE(batch->live(1));
  EXPECT_THROW(d->release(*batch, 1), Error);
  EXPECT_THROW(batch->seq_len(1), Error);
  EXPECT_EQ(d->new_sequence(*batch), 1);  // the freed slot, empty again
  EXPECT_EQ(batch->seq_len(1), 0);
}

TEST(DrafterBatch, BadBatchesAreRefused) {
  Fixture f;
  auto d = f.make({});
  auto batch = d->new_batch(4);
  const auto& t = shared_trace()[0];
  const int H = f.cfg.hidden;
  for (int s = 0; s < 3; ++s) {
    ASSERT_EQ(d->new_sequence(*batch), s);
    d->append_rows(*batch, s, t.tokens.data() + 1, t.hiddens.data(), 8, 0);
  }
  const bf16* h = t.hiddens.data() + 7 * H;
  using Rows = std::vector<drafter::BatchRow>;
  EXPECT_THROW(d->propose_batch(*batch, Rows{{3, 1, h}}, 2), Error);             // slot 3 holds no sequence
  EXPECT_THROW(d->propose_batch(*batch, Rows{{0, 1, h}, {0, 2, h}}, 2), Error);  // slot 0 twice
  EXPECT_THROW(d->propose_batch(*batch, Rows{{0, 4096, h}}, 2), Error);          // token outside the vocab
  EXPECT_THROW(d->propose_batch(*batch, Rows{{0, 1, nullptr}}, 2), Error);       // no hidden
  EXPECT_THROW(d->propose_batch(*batch, Rows{{0, 1, h}}, kDraft + 1), Error);    // k > draft_len
  EXPECT_THROW(d->propose_batch(*batch, Rows{}, 2), Error);                      // no rows
  // Refused calls leave no propose pending: a correct batch goes through.
  const auto drafts = d->propose_batch(*batch, Rows{{2, 5, h}, {0, 6, h}}, 2);
  EXPECT_EQ(drafts.size(), 4u);
  EXPECT_EQ(batch->seq_len(0), 10);
  EXPECT_EQ(batch->propose_start(0), 8);
  EXPECT_THROW(d->propose_batch(*batch, Rows{{0, 1, h}}, 2), Error);  // pending after_verify
  EXPECT_THROW(d->after_verify(*batch, 1, 0), Error);                 // slot 1 has no propose
  EXPECT_THROW(d->after_verify(*batch, 0, 3), Error);                 // 3 of 2 drafts
  d->after_verify(*batch, 0, 1);
  EXPECT_EQ(batch->seq_len(0), 9);  // rewrite: the row of the true hidden stays
  // Context rows at a row other than the slot's length are refused and counted for that slot.
  EXPECT_THROW(d->append_rows(*batch, 0, t.tokens.data() + 1, t.hiddens.data(), 1, 4), Error);
  EXPECT_EQ(batch->refused_writes(0), 1);
  EXPECT_EQ(batch->refused_writes(1), 0);
  // More rows than a step takes.
  auto big = d->new_batch(drafter::kMaxBatch + 1);
  Rows many;
  for (int s = 0; s <= drafter::kMaxBatch; ++s) many.push_back({d->new_sequence(*big), 1, h});
  EXPECT_THROW(d->propose_batch(*big, many, 1), Error);
}

TEST(DrafterBatch, PhasesAreTimedOncePerBatchedStep) {
  struct Counter : drafter::PhaseTimer {
    std::map<drafter::Phase, int> begins, ends;
    void begin(drafter::Phase p, int) override { ++begins[p]; }
    void end(drafter::Phase p, int) override { ++ends[p]; }
  };
  Fixture f;
  auto d = f.make({});
  auto batch = d->new_batch(5);
  const auto& t = shared_trace()[0];
  const int H = f.cfg.hidden;
  std::vector<drafter::BatchRow> rows;
  for (int s = 0; s < 5; ++s) {
    d->new_sequence(*batch);
    d->append_rows(*batch, s, t.tokens.data() + 1, t.hiddens.data(), 6 + s, 0);
    rows.push_back({s, t.tokens[7 + s], t.hiddens.data() + (5 + s) * H});
  }
  Counter c;
  d->set_timer(&c);
  d->propose_batch(*batch, rows, kDraft);
  d->set_timer(nullptr);
  EXPECT_EQ(c.begins[drafter::Phase::propose], 1);
  EXPECT_EQ(c.begins[drafter::Phase::block], kDraft);
  EXPECT_EQ(c.begins[drafter::Phase::head], kDraft);
  EXPECT_EQ(c.begins.count(drafter::Phase::exchange), 0u);  // one rank: no exchange
  EXPECT_EQ(c.begins, c.ends);
}

// fork_sequence copies a slot's rows: the forks draft exactly as the original, and as the
// single-sequence drafter after the same prefill; a fork then diverges on its own.
TEST(DrafterBatch, ForkedSequencesDraftAsTheirOrigin) {
  Fixture f;
  const auto& seq = shared_trace().at(3);
  const int H = f.cfg.hidden;
  const int P = 40;  // past the dense window: sparse selections, complete pools copied
  auto single = f.make({});
  auto st = single->new_sequence();
  single->append_rows(*st, seq.tokens.data() + 1, seq.hiddens.data(), P - 1, 0);
  const auto want =
      single->propose(*st, seq.tokens[P], seq.hiddens.data() + static_cast<size_t>(P - 1) * H, kDraft);

  auto d = f.make({});
  auto batch = d->new_batch(3);
  const int s0 = d->new_sequence(*batch);
  d->append_rows(*batch, s0, seq.tokens.data() + 1, seq.hiddens.data(), P - 1, 0);
  const int s1 = d->fork_sequence(*batch, s0);
  const int s2 = d->fork_sequence(*batch, s0);
  EXPECT_EQ(batch->seq_len(s1), P - 1);
  EXPECT_EQ(batch->seq_len(s2), P - 1);
  const bf16* h = seq.hiddens.data() + static_cast<size_t>(P - 1) * H;
  const std::vector<drafter::BatchRow> rows = {
      {s2, seq.tokens[P], h}, {s0, seq.tokens[P], h}, {s1, seq.tokens[P], h}};
  const auto got = d->propose_batch(*batch, rows, kDraft);
  for (size_t b = 0; b < rows.size(); ++b)
    EXPECT_EQ(std::vector<int32_t>(got.begin() + b * kDraft, got.begin() + (b + 1) * kDraft), want)
        << "row " << b;
  // A fork with a pending propose is refused (with a free slot to take).
  d->release(*batch, s2);
  EXPECT_THROW(d->fork_sequence(*batch, s0), Error);
  d->after_verify(*batch, s0, 0);
  EXPECT_EQ(d->fork_sequence(*batch, s0), s2);
}

// last_experts: the distinct routed experts of the last draft, single-sequence and batched. On the
// CPU a row routes the same at any batch, so a batch's experts are the union of its sequences'.
TEST(DrafterBatch, LastExpertsAreTheUnionOfTheRowsRoutes) {
  Fixture f;
  const int H = f.cfg.hidden, top_k = f.cfg.num_experts_per_tok;
  const int P = 40;
  const std::vector<int> picks = {3, 5, 8};
  auto single = f.make({});
  EXPECT_TRUE(single->last_experts(1).empty()) << "before any propose";
  std::vector<int32_t> want;
  for (int i : picks) {
    const auto& seq = shared_trace().at(static_cast<size_t>(i));
    auto st = single->new_sequence();
    single->append_rows(*st, seq.tokens.data() + 1, seq.hiddens.data(), P - 1, 0);
    single->propose(*st, seq.tokens[P], seq.hiddens.data() + static_cast<size_t>(P - 1) * H, kDraft);
    const auto mine = single->last_experts(1);
    EXPECT_EQ(static_cast<int>(mine.size()), top_k) << "one row's top_k picks are distinct";
    EXPECT_TRUE(std::is_sorted(mine.begin(), mine.end()));
    want.insert(want.end(), mine.begin(), mine.end());
  }
  std::sort(want.begin(), want.end());
  want.erase(std::unique(want.begin(), want.end()), want.end());
  ASSERT_GT(want.size(), static_cast<size_t>(top_k)) << "the picked sequences should not all route alike";

  auto d = f.make({});
  auto batch = d->new_batch(4);  // a bucket of 4: one padded row the count must not read
  std::vector<drafter::BatchRow> rows;
  for (int i : picks) {
    const auto& seq = shared_trace().at(static_cast<size_t>(i));
    const int s = d->new_sequence(*batch);
    d->append_rows(*batch, s, seq.tokens.data() + 1, seq.hiddens.data(), P - 1, 0);
    rows.push_back({s, seq.tokens[P], seq.hiddens.data() + static_cast<size_t>(P - 1) * H});
  }
  d->propose_batch(*batch, rows, kDraft);
  EXPECT_EQ(d->last_experts(3), want);
  EXPECT_EQ(d->last_distinct_experts(3), static_cast<int>(want.size()));
  EXPECT_THROW(d->last_experts(4), Error) << "more rows than the batched propose drafted for";

  auto skip = f.make({.skip = drafter::Skip::block});
  auto st = skip->new_sequence();
  const auto& seq = shared_trace().at(3);
  skip->append_rows(*st, seq.tokens.data() + 1, seq.hiddens.data(), P - 1, 0);
  skip->propose(*st, seq.tokens[P], seq.hiddens.data() + static_cast<size_t>(P - 1) * H, kDraft);
  EXPECT_TRUE(skip->last_experts(1).empty()) << "skip: block runs no router";
}
