// The drafter on one rank with the CPU backend: row-space rules, rollback, context-row arms,
// skip arms, and the synthetic target.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "common/drafter.hpp"
#include "common/trace.hpp"
#include "drafter/factory.hpp"
#include "harness/replay.hpp"
#include "model/weights.hpp"

using namespace mtplab;
using drafter::DrafterOptions;

namespace {

struct Fixture : test::TinyCpuDrafter {
  std::unique_ptr<drafter::MtpDrafter> make(DrafterOptions opt) {
    return make_with(opt, std::max(opt.draft_len, 4));  // these tests propose up to 4 drafts
  }
};

const io::TraceSequence& shared_sequence() {
  static io::TraceSequence seq = test::tiny_trace(1, 24, 48, 5)[0];
  return seq;
}

std::vector<bf16> download_kv(ops::Backend& be, drafter::BatchState& st, int rows, int kv_lora) {
  std::vector<bf16> out(static_cast<size_t>(rows) * kv_lora);
  be.download(out.data(), st.caches.kv_slots().cache.data,
              out.size() * sizeof(bf16));  // one slot: identity table
  return out;
}

}  // namespace

TEST(Drafter, SyntheticTargetIsDeterministicAndInVocab) {
  const auto& seq = shared_sequence();
  ASSERT_EQ(seq.tokens.size(), 72u);
  ASSERT_EQ(seq.hiddens.size(), 72u * 128);
  for (int32_t t : seq.tokens) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 4096);
  }
  Fixture f;
  auto again = test::make_trace(*f.be, f.cfg, 1, 24, 48, 5)[0];
  EXPECT_EQ(again.tokens, seq.tokens);
  // The hidden is post-final-norm: its RMS is near the norm weight's (about 1), never 0.
  double ss = 0;
  for (int i = 0; i < 128; ++i) ss += std::pow(to_float(seq.hiddens[40 * 128 + i]), 2);
  EXPECT_GT(std::sqrt(ss / 128), 0.3);
  EXPECT_LT(std::sqrt(ss / 128), 3.0);
}

// Batched generation: the same tokens and hiddens, bit for bit, as one sequence at a time on the
// CPU, with groups that do not divide the count (5 = 3 + 2, 2 + 2 + 1), greedy and sampled; and
// a cache capacity cut to the sequences' length changes nothing. 24 + 16 positions: past the
// tiny model's K + P - 1 = 19 rows, so the indexer's sparse selection runs.
TEST(SyntheticTrace, BatchedIsTheOneAtATimeTraceOnTheCpu) {
  auto be = ops::make_cpu_backend();
  const model::ModelConfig cfg = test::tiny_config(256);
  io::TraceSampling sampled;
  sampled.sampled = true;
  sampled.temperature = 1.0;
  sampled.top_k = 50;
  sampled.seed = 11;
  for (const io::TraceSampling& smp : {io::TraceSampling{}, sampled}) {
    SCOPED_TRACE(smp.sampled ? "sampled" : "greedy");
    drafter::SyntheticTarget full(*be, cfg, 2, 7, 3);
    const auto one = drafter::synthetic_trace(full, cfg.vocab, 5, 24, 16, 3, smp, 1);
    ASSERT_EQ(one.size(), 5u);
    // The sequences differ from each other (a batch that mixed up its rows would show).
    EXPECT_NE(one[0].tokens, one[1].tokens);
    int calls = 0;
    for (int batch : {2, 3, 5}) {
      SCOPED_TRACE(batch);
      int last = 0;
      drafter::SyntheticTarget cut(*be, cfg, 2, 7, 3, 40);
      EXPECT_EQ(cut.capacity(), 40);
      const auto many = drafter::synthetic_trace(cut, cfg.vocab, 5, 24, 16, 3, smp, batch, [&](int done) {
        ++calls;
        EXPECT_GT(done, last);  // sequences done so far, after each group
        last = done;
      });
      ASSERT_EQ(many.size(), 5u);
      EXPECT_EQ(last, 5);
      for (size_t s = 0; s < 5; ++s) {
        EXPECT_EQ(many[s].index, static_cast<int64_t>(s));
        EXPECT_EQ(many[s].prompt_length, 24);
        EXPECT_EQ(many[s].tokens, one[s].tokens) << "sequence " << s;
        ASSERT_EQ(many[s].hiddens.size(), one[s].hiddens.size());
        EXPECT_EQ(0, std::memcmp(many[s].hiddens.data(), one[s].hiddens.data(),
                                 one[s].hiddens.size() * sizeof(bf16)))
            << "sequence " << s;
      }
    }
    EXPECT_EQ(calls, 3 + 2 + 1);
  }
}

TEST(SyntheticTrace, BadBatchesAreRefused) {
  auto be = ops::make_cpu_backend();
  const model::ModelConfig cfg = test::tiny_config(256);
  drafter::SyntheticTarget t(*be, cfg, 1, 7, 3, 37);
  EXPECT_EQ(t.capacity(), 40);  // rounded up to whole pools of 4
  EXPECT_THROW(drafter::synthetic_trace(t, cfg.vocab, 2, 8, 4, 3, {}, 0), Error);
  EXPECT_THROW(drafter::synthetic_trace(t, cfg.vocab, 2, 8, 4, 3, {}, drafter::kMaxTargetBatch + 1), Error);
  EXPECT_THROW(t.generate_batch({{1, 2, 3}, {1, 2}}, 4, {}, 0), Error);        // prompt lengths differ
  EXPECT_THROW(t.generate_batch({{1, 2, 3}, {1, 4096, 3}}, 4, {}, 0), Error);  // token past the vocab
  EXPECT_THROW(t.generate_batch({{1, 2, 3}}, 38, {}, 0), Error);               // 41 positions > 40
  EXPECT_THROW(t.generate_batch({}, 4, {}, 0), Error);
  EXPECT_NO_THROW(t.generate_batch({{1, 2, 3}}, 37, {}, 0));
}

TEST(Drafter, WriteAtWrongRowIsRefusedAndCounted) {
  Fixture f;
  auto d = f.make({});
  auto st = d->new_sequence();
  const auto& seq = shared_sequence();
  d->append_rows(*st, seq.tokens.data() + 1, seq.hiddens.data(), 5, 0);
  EXPECT_EQ(st->seq_len(0), 5);
  EXPECT_THROW(d->append_rows(*st, seq.tokens.data() + 1, seq.hiddens.data(), 1, 7), Error);
  EXPECT_THROW(d->append_rows(*st, seq.tokens.data() + 1, seq.hiddens.data(), 1, 4), Error);
  EXPECT_EQ(st->refused_writes(0), 2);
  EXPECT_EQ(st->seq_len(0), 5);
  std::vector<int32_t> bad = {4096};
  EXPECT_THROW(d->append_rows(*st, bad.data(), seq.hiddens.data(), 1, 5), Error);
  EXPECT_THROW(d->propose(*st, -1, seq.hiddens.data(), 2), Error);
  EXPECT_THROW(d->after_verify(*st, 0), Error);  // no propose yet
}

TEST(Drafter, CacheOnlyAndFullContextRowsLeaveTheSameCacheAndDrafts) {
  Fixture f;
  DrafterOptions a, b;
  b.context_rows = drafter::ContextRows::full;
  auto da = f.make(a), db = f.make(b);
  const auto& seq = shared_sequence();
  auto sa = da->new_sequence(), sb = db->new_sequence();
  const int rows = 30;  // past K + P - 1 = 19: sparse selection in the full path
  da->append_rows(*sa, seq.tokens.data() + 1, seq.hiddens.data(), rows, 0);
  db->append_rows(*sb, seq.tokens.data() + 1, seq.hiddens.data(), rows, 0);
  EXPECT_EQ(download_kv(*f.be, *sa, rows, 64), download_kv(*f.be, *sb, rows, 64));
  auto pa = da->propose(*sa, seq.tokens[rows + 1], seq.hiddens.data() + rows * 128, 4);
  auto pb = db->propose(*sb, seq.tokens[rows + 1], seq.hiddens.data() + rows * 128, 4);
  EXPECT_EQ(pa, pb);
}

TEST(Drafter, RewriteRollbackEqualsAFreshPrefill) {
  // After propose / after_verify / catch-up, the state must be exactly what a fresh prefill of
  // the same true rows gives: the next drafts agree bit for bit.
  Fixture f;
  auto d = f.make({});
  const auto& seq = shared_sequence();
  const int H = 128;
  for (int accepted = 0; accepted <= 3; ++accepted) {
    auto st = d->new_sequence();
    const int L = 26;
    d->append_rows(*st, seq.tokens.data() + 1, seq.hiddens.data(), L - 1, 0);
    auto drafts = d->propose(*st, seq.tokens[L], seq.hiddens.data() + (L - 1) * H, 3);
    EXPECT_EQ(st->seq_len(0), L - 1 + 3);
    d->after_verify(*st, accepted);
    EXPECT_EQ(st->seq_len(0), L);
    const int next_L = L + accepted + 1;
    d->append_rows(*st, seq.tokens.data() + L + 1, seq.hiddens.data() + L * H, next_L - 1 - L, L,
                   drafter::Phase::catch_up);
    auto fresh = d->new_sequence();
    d->append_rows(*fresh, seq.tokens.data() + 1, seq.hiddens.data(), next_L - 1, 0);
    auto x = d->propose(*st, seq.tokens[next_L], seq.hiddens.data() + (next_L - 1) * H, 4);
    auto y = d->propose(*fresh, seq.tokens[next_L], seq.hiddens.data() + (next_L - 1) * H, 4);
    EXPECT_EQ(x, y) << "accepted " << accepted;
  }
}

TEST(Drafter, KeepRollbackKeepsAcceptedRows) {
  Fixture f;
  DrafterOptions opt;
  opt.draft_rows = drafter::DraftRows::keep;
  auto d = f.make(opt);
  const auto& seq = shared_sequence();
  auto st = d->new_sequence();
  d->append_rows(*st, seq.tokens.data() + 1, seq.hiddens.data(), 20, 0);
  d->propose(*st, seq.tokens[21], seq.hiddens.data() + 20 * 128, 4);
  d->after_verify(*st, 2);
  EXPECT_EQ(st->seq_len(0), 22);
}

TEST(Drafter, SkipArms) {
  Fixture f;
  const auto& seq = shared_sequence();
  DrafterOptions head, block;
  head.skip = drafter::Skip::head;
  block.skip = drafter::Skip::block;
  auto dh = f.make(head), db = f.make(block);
  auto sh = dh->new_sequence(), sb = db->new_sequence();
  dh->append_rows(*sh, seq.tokens.data() + 1, seq.hiddens.data(), 10, 0);
  db->append_rows(*sb, seq.tokens.data() + 1, seq.hiddens.data(), 10, 0);
  EXPECT_EQ(dh->propose(*sh, seq.tokens[11], seq.hiddens.data() + 10 * 128, 3),
            (std::vector<int32_t>{0, 0, 0}));
  EXPECT_EQ(sh->seq_len(0), 13);
  auto drafts = db->propose(*sb, seq.tokens[11], seq.hiddens.data() + 10 * 128, 3);
  EXPECT_EQ(sb->seq_len(0), 10);  // the block (and its cache writes) skipped
  for (int32_t t : drafts) EXPECT_TRUE(t >= 0 && t < 4096);
  db->after_verify(*sb, 1);
  EXPECT_EQ(sb->seq_len(0), 10);
}

TEST(Drafter, Fp8HeadDraftsAreMostlyTheBf16Drafts) {
  // FP8 changes logits by ~2^-4 relative per weight; on synthetic weights whose logits have
  // margins of several units most drafts survive. A rate under 50% would mean the FP8 path
  // computes something else (e.g. a missing scale), which is what this guards.
  Fixture f;
  DrafterOptions fp8;
  fp8.head_fp8 = true;
  auto d16 = f.make({}), d8 = f.make(fp8);
  const auto& seq = shared_sequence();
  harness::AcceptanceStats s16, s8;
  auto r16 = harness::replay_sequence(*d16, seq, 0, 2, 128, s16);
  auto r8 = harness::replay_sequence(*d8, seq, 0, 2, 128, s8);
  ASSERT_FALSE(r16.empty());
  int same = 0, total = 0;
  for (size_t i = 0; i < std::min(r16.size(), r8.size()); ++i) {
    if (r16[i].position != r8[i].position) break;
    same += r16[i].drafts[0] == r8[i].drafts[0];
    ++total;
  }
  ASSERT_GT(total, 0);
  EXPECT_GT(same * 2, total) << same << " of " << total;
}

TEST(Replay, StepsFollowTheRules) {
  Fixture f;
  auto d = f.make({});
  const auto& seq = shared_sequence();
  harness::AcceptanceStats stats;
  auto steps = harness::replay_sequence(*d, seq, 0, 3, 128, stats);
  ASSERT_FALSE(steps.empty());
  int L = seq.prompt_length;
  for (const auto& s : steps) {
    EXPECT_EQ(s.position, L);
    EXPECT_EQ(s.drafts.size(), 3u);
    EXPECT_EQ(s.accepted, harness::accepted_prefix(s.drafts, s.targets));
    for (int i = 0; i < 3; ++i) EXPECT_EQ(s.targets[i], seq.tokens[L + 1 + i]);
    L += s.accepted + 1;
  }
  EXPECT_GT(L + 3, static_cast<int>(seq.tokens.size()) - 1);  // stopped only when targets ran out
  EXPECT_EQ(stats.steps, static_cast<int64_t>(steps.size()));
  EXPECT_EQ(stats.drafted, 3 * stats.steps);
  EXPECT_NEAR(stats.tau(), 1.0 + static_cast<double>(stats.accepted) / stats.steps, 1e-12);
}

TEST(Replay, AcceptanceStatsDefinitions) {
  harness::AcceptanceStats s;
  s.add(3, 0);
  s.add(3, 2);
  s.add(3, 3);
  EXPECT_EQ(s.drafted, 9);
  EXPECT_EQ(s.accepted, 5);
  EXPECT_DOUBLE_EQ(s.rate(), 5.0 / 9);
  EXPECT_DOUBLE_EQ(s.tau(), 1.0 + 5.0 / 3);
  auto r = s.per_position();
  ASSERT_EQ(r.size(), 3u);
  EXPECT_DOUBLE_EQ(r[0], 2.0 / 3);
  EXPECT_DOUBLE_EQ(r[1], 2.0 / 3);
  EXPECT_DOUBLE_EQ(r[2], 1.0 / 3);
  EXPECT_EQ(harness::accepted_prefix({1, 2, 3}, {1, 2, 4}), 2);
  EXPECT_EQ(harness::accepted_prefix({5, 2, 3}, {1, 2, 3}), 0);
}
