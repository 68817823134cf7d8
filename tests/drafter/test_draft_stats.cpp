// Sampling statistics and forced draft chains on the CPU backend, one rank:
// - the stats ops (logit_stats_batch, logit_stats_combine) on random logit rows, whole, split into
//   shards and combined, and gathered into segments, against a direct fp64 recomputation by
//   sorting (stats_reference.hpp), ties at the thresholds included;
// - the drafter's DraftStats (propose and propose_batch with ProposeExtras) against the same
//   recomputation from its head inputs (keep_head_inputs) and the host's head logits, at T in
//   {0.7, 1.0}, top_k in {0, 5}, top_p in {1.0, 0.9}, BF16 and FP8 heads, requested tokens inside
//   and outside the support;
// - chain tokens: the drafter's own drafts change nothing; other tokens give what a propose of one
//   draft at a time fed with those tokens (and the kept head inputs) gives, rollback included;
// - target_logprobs against the recomputation from the trace's hiddens.
// Tolerance: the ops sum exp in fp64 and round the sum to fp32 once, so log q is within ~1e-7 of
// the fp64 value; 1e-5 relative (+1e-5 absolute near 0) leaves room and still catches a wrong
// threshold, temperature or normaliser (those move log q by 1e-3 or more).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/drafter.hpp"
#include "common/trace.hpp"
#include "drafter/exchange.hpp"
#include "drafter/factory.hpp"
#include "forced_rows.hpp"
#include "model/sharding.hpp"
#include "model/weights.hpp"
#include "stats_reference.hpp"

using namespace mtplab;
using drafter::DraftStats;
using drafter::SamplingTransform;

namespace {

constexpr double kRel = 1e-5, kAbs = 1e-5;

std::vector<SamplingTransform> transforms() {
  std::vector<SamplingTransform> out;
  for (double T : {0.7, 1.0})
    for (int top_k : {0, 5})
      for (double top_p : {1.0, 0.9}) out.push_back(SamplingTransform{T, top_k, top_p});
  return out;
}

std::string name_of(const SamplingTransform& t) {
  return str("T=", t.temperature, " top_k=", t.top_k, " top_p=", t.top_p);
}

/// Random BF16 logits with std `sd`; with `ties`, rounded to multiples of 0.5 (many equal values,
/// so the top-k and top-p thresholds fall on ties).
std::vector<bf16> random_logits(std::mt19937& rng, size_t n, float sd, bool ties) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<bf16> out(n);
  for (auto& x : out) {
    float v = d(rng);
    if (ties) v = std::round(v * 2.0f) / 2.0f;
    x = to_bf16(v);
  }
  return out;
}

std::vector<float> widen(const bf16* x, size_t n) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = to_float(x[i]);
  return out;
}

void expect_stats(const ops::TokenStats& got, const test::RefStats& ref, const std::string& what) {
  EXPECT_NEAR(got.margin, ref.margin, 1e-6) << what;
  EXPECT_TRUE(test::close(got.logprob, ref.logprob, kRel, kAbs))
      << what << ": logprob " << got.logprob << " vs " << ref.logprob;
  EXPECT_TRUE(test::close(got.req_logprob, ref.req_logprob, kRel, kAbs))
      << what << ": req_logprob " << got.req_logprob << " vs " << ref.req_logprob;
}

void expect_stats(const DraftStats& got, const test::RefStats& ref, const std::string& what) {
  expect_stats(ops::TokenStats{got.margin, got.logprob, got.req_logprob}, ref, what);
}

}  // namespace

TEST(DraftStatsOps, VocabSegmentIsTheShardPlansSplit) {
  for (int64_t V : {7, 4096, 38912, 154880, 154881})
    for (int world : {1, 2, 3, 4, 7})
      for (int r = 0; r < world; ++r) {
        const model::Range want = model::split_range(V, r, world);
        const ops::VocabSegment got = ops::vocab_segment(V, world, r);
        EXPECT_EQ(got.begin, want.begin) << V << " / " << world << " rank " << r;
        EXPECT_EQ(got.count, want.count) << V << " / " << world << " rank " << r;
      }
}

TEST(DraftStatsOps, LogitKeysOrderBf16Values) {
  std::mt19937 rng(3);
  auto xs = random_logits(rng, 2000, 40.0f, false);
  xs.push_back(bf16{0x8000});  // -0
  xs.push_back(bf16{0x0000});  // +0
  xs.push_back(bf16{0xFF80});  // -inf
  xs.push_back(bf16{0x7F80});  // +inf
  for (size_t i = 0; i + 1 < xs.size(); ++i) {
    const float a = to_float(xs[i]), b = to_float(xs[i + 1]);
    const uint16_t ka = ops::logit_key(xs[i].bits), kb = ops::logit_key(xs[i + 1].bits);
    EXPECT_EQ(a < b, ka < kb) << a << " " << b;
    EXPECT_EQ(a == b, ka == kb) << a << " " << b;
    EXPECT_EQ(to_float(bf16{ops::logit_of_key(ka)}), a);
  }
}

// The ops on rows of fresh random logits: the whole row at once, the row split into shards whose
// partials are combined (no truncation: what a vocab-sharded head does), and the shards gathered
// rank-major with padding (truncation: what a sharded head gathers).
TEST(DraftStatsOps, RowsShardsAndSegmentsMatchTheReference) {
  auto be = ops::make_cpu_backend();
  std::mt19937 rng(17);
  const int rows = 5;
  for (int V : {4096, 1001}) {
    for (bool ties : {false, true}) {
      std::vector<bf16> logits;
      for (int b = 0; b < rows; ++b) {
        auto row = random_logits(rng, static_cast<size_t>(V), 3.0f, ties);
        logits.insert(logits.end(), row.begin(), row.end());
      }
      std::vector<int32_t> requested(rows);
      for (int b = 0; b < rows; ++b) {
        const auto row = widen(logits.data() + static_cast<size_t>(b) * V, static_cast<size_t>(V));
        requested[static_cast<size_t>(b)] = b % 2 ? test::lowest_token(row) : test::runner_up(row);
      }
      for (const SamplingTransform& t : transforms()) {
        const ops::SampleParams p = drafter::sample_params(t);
        const std::string what = str("V=", V, ties ? " ties " : " ", name_of(t));
        std::vector<ops::LogitStats> parts(static_cast<size_t>(rows) * 3);
        std::vector<ops::TokenStats> whole(rows), split(rows), segs(rows);
        ops::LogitRows v;
        v.data = logits.data();
        v.rows = rows;
        v.ld = V;
        v.n = V;
        be->logit_stats_batch(v, requested.data(), &p, parts.data());
        be->logit_stats_combine(parts.data(), 1, rows, &p, whole.data());
        // Gathered segments: 3 shards, each padded to the largest, rank-major [3, rows, stride].
        const int world = 3;
        const int64_t stride = ops::vocab_segment(V, world, 0).count;
        std::vector<bf16> gathered(static_cast<size_t>(world * rows * stride),
                                   bf16{0x7F80});  // +inf: must not be read
        for (int s = 0; s < world; ++s) {
          const ops::VocabSegment seg = ops::vocab_segment(V, world, s);
          for (int b = 0; b < rows; ++b)
            std::copy_n(logits.data() + static_cast<size_t>(b) * V + seg.begin, seg.count,
                        gathered.data() + (static_cast<size_t>(s) * rows + b) * stride);
        }
        ops::LogitRows g;
        g.data = gathered.data();
        g.rows = rows;
        g.ld = static_cast<int>(stride);
        g.segments = world;
        g.seg_stride = rows * stride;
        g.vocab = V;
        std::vector<ops::LogitStats> one(rows);
        be->logit_stats_batch(g, requested.data(), &p, one.data());
        be->logit_stats_combine(one.data(), 1, rows, &p, segs.data());
        if (!drafter::truncates(t)) {
          // Each shard's partials (candidate-major [world, rows]), then the combine.
          for (int s = 0; s < world; ++s) {
            const ops::VocabSegment seg = ops::vocab_segment(V, world, s);
            ops::LogitRows sv;
            sv.data = logits.data() + seg.begin;
            sv.rows = rows;
            sv.ld = V;
            sv.n = static_cast<int>(seg.count);
            sv.index_base = seg.begin;
            be->logit_stats_batch(sv, requested.data(), &p, parts.data() + static_cast<size_t>(s) * rows);
          }
          be->logit_stats_combine(parts.data(), world, rows, &p, split.data());
        }
        int inside = 0, outside = 0;
        for (int b = 0; b < rows; ++b) {
          const auto row = widen(logits.data() + static_cast<size_t>(b) * V, static_cast<size_t>(V));
          const test::RefStats ref = test::reference_stats(row, requested[static_cast<size_t>(b)], t);
          (ref.in_support ? inside : outside)++;
          expect_stats(whole[static_cast<size_t>(b)], ref, what + str(" whole row ", b));
          expect_stats(segs[static_cast<size_t>(b)], ref, what + str(" segments row ", b));
          if (!drafter::truncates(t)) {
            expect_stats(split[static_cast<size_t>(b)], ref, what + str(" shards row ", b));
          }
        }
        EXPECT_GT(inside, 0) << what;
        if (drafter::truncates(t)) {
          EXPECT_GT(outside, 0) << what;
        }
      }
    }
  }
}

TEST(DraftStatsOps, TopKKeepsEveryTieAtTheThreshold) {
  // Logits 5, 4, 3, 3, 3, 2, ...: top_k = 3 keeps the three 3s (five tokens).
  auto be = ops::make_cpu_backend();
  std::vector<bf16> row = {to_bf16(3), to_bf16(5), to_bf16(3), to_bf16(2),
                           to_bf16(4), to_bf16(3), to_bf16(1), to_bf16(2)};
  ops::LogitRows v;
  v.data = row.data();
  v.rows = 1;
  v.ld = v.n = static_cast<int>(row.size());
  ops::SampleParams p;
  p.top_k = 3;
  ops::LogitStats st{};
  for (int32_t req : {5, 3}) {
    be->logit_stats_batch(v, &req, &p, &st);
    const double Z = 1 + std::exp(-1.0) + 3 * std::exp(-2.0);
    EXPECT_FLOAT_EQ(st.max, 5.0f);
    EXPECT_FLOAT_EQ(st.second, 4.0f);
    EXPECT_NEAR(st.sum, Z, 1e-6);
    if (req == 5) {
      EXPECT_FLOAT_EQ(st.requested, 3.0f);
    } else {
      EXPECT_EQ(st.requested, -std::numeric_limits<float>::infinity());
    }
  }
  // top_p: 5 and 4 hold 1 + e^-1 of 1 + e^-1 + 3e^-2 + ... ; a cut inside the 3s keeps all of them.
  p.top_k = 0;
  const double all = 1 + std::exp(-1.0) + 3 * std::exp(-2.0) + 2 * std::exp(-3.0) + std::exp(-4.0);
  p.top_p = static_cast<float>((1 + std::exp(-1.0) + std::exp(-2.0)) / all);
  int32_t req = 0;  // a 3
  be->logit_stats_batch(v, &req, &p, &st);
  EXPECT_NEAR(st.sum, 1 + std::exp(-1.0) + 3 * std::exp(-2.0), 1e-6);
  EXPECT_FLOAT_EQ(st.requested, 3.0f);
}

TEST(DraftStatsOps, BadParametersAreRefused) {
  auto be = ops::make_cpu_backend();
  std::vector<bf16> row(8, to_bf16(1));
  ops::LogitRows v;
  v.data = row.data();
  v.rows = 1;
  v.ld = v.n = 8;
  ops::LogitStats st{};
  for (ops::SampleParams p : {ops::SampleParams{0.0f, 0, 1.0f, 0}, ops::SampleParams{1.0f, -1, 1.0f, 0},
                              ops::SampleParams{1.0f, 0, 0.0f, 0}, ops::SampleParams{1.0f, 0, 1.5f, 0}})
    EXPECT_THROW(be->logit_stats_batch(v, nullptr, &p, &st), Error);
  for (SamplingTransform t :
       {SamplingTransform{0.0, 0, 1.0}, SamplingTransform{-1.0, 0, 1.0}, SamplingTransform{1.0, -2, 1.0},
        SamplingTransform{1.0, 0, 0.0}, SamplingTransform{1.0, 0, 1.01}, SamplingTransform{NAN, 0, 1.0}})
    EXPECT_THROW(drafter::check_transform(t), Error) << name_of(t);
  EXPECT_NO_THROW(drafter::check_transform(SamplingTransform{0.7, 5, 0.9}));
}

// ---- the drafter ---------------------------------------------------------------------------------

namespace {

struct Fixture : test::TinyCpuDrafter {
  io::TraceSequence seq = test::make_trace(*be, cfg, 1, 24, 48, 5)[0];
  int H = cfg.hidden;
  int V = static_cast<int>(cfg.vocab);
  std::unique_ptr<drafter::MtpDrafter> make(drafter::DrafterOptions opt) {
    return make_with(opt, std::max(opt.draft_len, 4));
  }
  /// The host head's logits of head input y (BF16 or, when fp8, the FP8 head the drafter uses).
  std::vector<float> logits(const bf16* y, bool fp8) {
    return test::head_logits(*be, w.lm_head.data.data(), fp8 ? w.lm_head_fp8.weight.data.data() : nullptr,
                             fp8 ? w.lm_head_fp8.scale.data.data() : nullptr, y, V, H);
  }
};

/// Requested tokens per draft: the runner-up of even drafts (inside any support but the narrowest),
/// the lowest-logit token of odd ones (outside whenever the transform truncates).
std::vector<int32_t> pick_requested(Fixture& f, const std::vector<bf16>& ys, int k, bool fp8) {
  std::vector<int32_t> req(static_cast<size_t>(k));
  for (int i = 0; i < k; ++i) {
    const auto l = f.logits(ys.data() + static_cast<size_t>(i) * f.H, fp8);
    req[static_cast<size_t>(i)] = i % 2 ? test::lowest_token(l) : test::runner_up(l);
  }
  return req;
}

}  // namespace

TEST(DraftStats, ProposeStatsMatchTheReferenceFromTheHeadInputs) {
  Fixture f;
  const int k = 4, L = 30;
  for (bool fp8 : {false, true}) {
    drafter::DrafterOptions opt;
    opt.head_fp8 = fp8;
    auto d = f.make(opt);
    d->keep_head_inputs(true);
    int inside = 0, outside = 0;
    for (const SamplingTransform& t : transforms()) {
      auto first = d->new_sequence(), st = d->new_sequence();
      for (auto* s : {first.get(), st.get()})
        d->append_rows(*s, f.seq.tokens.data() + 1, f.seq.hiddens.data(), L - 1, 0);
      // A plain propose on an identical sequence first: its head inputs pick the requested tokens
      // of the one with stats (the same rows, so the same drafts).
      const auto plain = d->propose(*first, f.seq.tokens[L], f.seq.hiddens.data() + (L - 1) * f.H, k);
      const auto requested = pick_requested(f, d->head_inputs(), k, fp8);
      std::vector<DraftStats> stats;
      drafter::ProposeExtras x;
      x.requested = requested;
      x.transform = t;
      x.stats = &stats;
      const auto drafts = d->propose(*st, f.seq.tokens[L], f.seq.hiddens.data() + (L - 1) * f.H, k, x);
      EXPECT_EQ(drafts, plain) << "stats must not change the drafts";
      ASSERT_EQ(stats.size(), static_cast<size_t>(k));
      const auto ys = d->head_inputs();
      for (int i = 0; i < k; ++i) {
        const auto l = f.logits(ys.data() + static_cast<size_t>(i) * f.H, fp8);
        const auto ref = test::reference_stats(l, requested[static_cast<size_t>(i)], t);
        EXPECT_EQ(ref.argmax, drafts[static_cast<size_t>(i)]) << "the host's logits are the head's";
        (ref.in_support ? inside : outside)++;
        expect_stats(stats[static_cast<size_t>(i)], ref,
                     str(fp8 ? "fp8 " : "bf16 ", name_of(t), " draft ", i));
      }
    }
    EXPECT_GT(inside, 0);
    EXPECT_GT(outside, 0);
  }
}

TEST(DraftStats, StatsWithoutRequestedTokensReportNaN) {
  Fixture f;
  auto d = f.make({});
  auto st = d->new_sequence();
  d->append_rows(*st, f.seq.tokens.data() + 1, f.seq.hiddens.data(), 20, 0);
  std::vector<DraftStats> stats;
  drafter::ProposeExtras x;
  x.stats = &stats;
  d->propose(*st, f.seq.tokens[21], f.seq.hiddens.data() + 20 * f.H, 3, x);
  ASSERT_EQ(stats.size(), 3u);
  for (const auto& s : stats) {
    EXPECT_TRUE(std::isnan(s.req_logprob));
    EXPECT_GT(s.margin, 0.0f);  // random logits: no exact tie at the top here
    EXPECT_LT(s.logprob, 0.0f);
  }
}

TEST(DraftStats, BatchedRowsEqualSingleRows) {
  Fixture f;
  const int k = 3;
  const auto trace = test::make_trace(*f.be, f.cfg, 3, 24, 48, 9);
  const int lens[3] = {22, 31, 27};
  for (bool fp8 : {false, true})
    for (const SamplingTransform& t : {SamplingTransform{0.7, 0, 1.0}, SamplingTransform{1.0, 5, 0.9}}) {
      drafter::DrafterOptions opt;
      opt.head_fp8 = fp8;
      auto d = f.make(opt);
      auto batch = d->new_batch(3);
      d->keep_head_inputs(true);
      const test::ForcedRows one = test::forced_rows(*d, *batch, trace, lens, k, f.H, t, true);
      std::vector<DraftStats> stats;
      const auto drafts = test::propose_forced(*d, *batch, one, k, t, stats);
      ASSERT_EQ(stats.size(), static_cast<size_t>(3 * k));
      EXPECT_EQ(d->batch_head_inputs(), one.single_ys) << "[B, k, H]: row b's draft i at (b * k + i) * H";
      for (int s = 0; s < 3; ++s)
        for (int i = 0; i < k; ++i) {
          const size_t j = static_cast<size_t>(s * k + i);
          const std::string what = str(fp8 ? "fp8 " : "bf16 ", name_of(t), " row ", s, " draft ", i);
          EXPECT_EQ(drafts[j], one.single_drafts[j]) << what;
          // Bit for bit: the same logits, the same op per row.
          test::expect_same_bits(stats[j], one.single_stats[j], what);
        }
    }
}

TEST(DraftStats, OwnDraftsAsChainTokensChangeNothing) {
  Fixture f;
  const int k = 4, L = 28;
  auto d = f.make({});
  const SamplingTransform t{0.7, 5, 0.9};
  auto a = d->new_sequence(), b = d->new_sequence();
  for (auto* st : {a.get(), b.get()})
    d->append_rows(*st, f.seq.tokens.data() + 1, f.seq.hiddens.data(), L - 1, 0);
  std::vector<int32_t> req(f.seq.tokens.begin() + L + 1, f.seq.tokens.begin() + L + 1 + k);
  std::vector<DraftStats> sa, sb;
  drafter::ProposeExtras xa;
  xa.requested = req;
  xa.transform = t;
  xa.stats = &sa;
  const auto da = d->propose(*a, f.seq.tokens[L], f.seq.hiddens.data() + (L - 1) * f.H, k, xa);
  std::vector<int32_t> chain(da.begin(), da.end() - 1);
  drafter::ProposeExtras xb = xa;
  xb.chain_tokens = chain;
  xb.stats = &sb;
  const auto db = d->propose(*b, f.seq.tokens[L], f.seq.hiddens.data() + (L - 1) * f.H, k, xb);
  EXPECT_EQ(da, db);
  for (int i = 0; i < k; ++i) {
    EXPECT_EQ(float_to_bits(sa[static_cast<size_t>(i)].logprob),
              float_to_bits(sb[static_cast<size_t>(i)].logprob));
    EXPECT_EQ(float_to_bits(sa[static_cast<size_t>(i)].req_logprob),
              float_to_bits(sb[static_cast<size_t>(i)].req_logprob));
    EXPECT_EQ(float_to_bits(sa[static_cast<size_t>(i)].margin),
              float_to_bits(sb[static_cast<size_t>(i)].margin));
  }
}

// Chain tokens that differ from the drafts: draft i + 1 must be what a propose of ONE draft at
// position base + i + 1 fed (chain_tokens[i], head input of draft i) gives, with the rows of the
// earlier one-draft proposes kept; and after rollback the state must equal that reference's.
TEST(DraftStats, OtherChainTokensMatchOneDraftAtATime) {
  Fixture f;
  const int k = 4, L = 28;
  for (auto rows_policy : {drafter::DraftRows::keep, drafter::DraftRows::rewrite}) {
    drafter::DrafterOptions opt;
    opt.draft_rows = rows_policy;
    auto d = f.make(opt);
    d->keep_head_inputs(true);
    const SamplingTransform t{1.0, 0, 0.9};
    std::vector<int32_t> own;
    std::vector<bf16> own_ys;
    {
      auto o = d->new_sequence();
      d->append_rows(*o, f.seq.tokens.data() + 1, f.seq.hiddens.data(), L - 1, 0);
      own = d->propose(*o, f.seq.tokens[L], f.seq.hiddens.data() + (L - 1) * f.H, k);
      own_ys = d->head_inputs();
    }
    auto st = d->new_sequence();
    d->append_rows(*st, f.seq.tokens.data() + 1, f.seq.hiddens.data(), L - 1, 0);
    // The trace's continuation, made to differ from the own drafts everywhere.
    std::vector<int32_t> chain(f.seq.tokens.begin() + L + 1, f.seq.tokens.begin() + L + k);
    for (size_t i = 0; i < chain.size(); ++i)
      if (chain[i] == own[i]) chain[i] = (chain[i] + 1) % f.V;
    std::vector<int32_t> req(f.seq.tokens.begin() + L + 1, f.seq.tokens.begin() + L + 1 + k);
    std::vector<DraftStats> stats;
    drafter::ProposeExtras x;
    x.chain_tokens = chain;
    x.requested = req;
    x.transform = t;
    x.stats = &stats;
    const auto drafts = d->propose(*st, f.seq.tokens[L], f.seq.hiddens.data() + (L - 1) * f.H, k, x);
    const auto ys = d->head_inputs();
    EXPECT_EQ(drafts[0], own[0]);
    EXPECT_NE(std::vector<bf16>(ys.begin() + f.H, ys.end()),
              std::vector<bf16>(own_ys.begin() + f.H, own_ys.end()))
        << "other chain tokens must change the later drafts' head inputs";
    // The reference: one draft per propose, each kept (after_verify(1) keeps its one row under
    // either policy).
    auto ref = d->new_sequence();
    d->append_rows(*ref, f.seq.tokens.data() + 1, f.seq.hiddens.data(), L - 1, 0);
    std::vector<bf16> y(f.seq.hiddens.begin() + (L - 1) * f.H, f.seq.hiddens.begin() + L * f.H);
    int32_t token = f.seq.tokens[L];
    for (int i = 0; i < k; ++i) {
      std::vector<DraftStats> s1;
      drafter::ProposeExtras x1;
      const int32_t r1 = req[static_cast<size_t>(i)];
      x1.requested = std::span<const int32_t>(&r1, 1);
      x1.transform = t;
      x1.stats = &s1;
      const auto d1 = d->propose(*ref, token, y.data(), 1, x1);
      EXPECT_EQ(d1[0], drafts[static_cast<size_t>(i)]) << "draft " << i;
      EXPECT_EQ(float_to_bits(s1[0].logprob), float_to_bits(stats[static_cast<size_t>(i)].logprob)) << i;
      EXPECT_EQ(float_to_bits(s1[0].req_logprob), float_to_bits(stats[static_cast<size_t>(i)].req_logprob))
          << i;
      y = d->head_inputs();
      EXPECT_EQ(y, std::vector<bf16>(ys.begin() + static_cast<ptrdiff_t>(i) * f.H,
                                     ys.begin() + static_cast<ptrdiff_t>(i + 1) * f.H))
          << "draft " << i;
      d->after_verify(*ref, 1);
      if (i + 1 < k) token = chain[static_cast<size_t>(i)];
    }
    // Rollback: keep 3 accepted rows (keep) or the first row (rewrite); the reference's rows
    // past that go too. The next propose from both states must agree.
    const int accepted = 3;
    d->after_verify(*st, accepted);
    const int kept = st->seq_len(0);
    EXPECT_EQ(kept, rows_policy == drafter::DraftRows::keep ? L - 1 + accepted : L);
    // Trim the reference to the same rows: a propose of 0 more rows is not possible, so rebuild
    // the reference's rows from its one-draft proposes up to `kept`.
    auto ref2 = d->new_sequence();
    d->append_rows(*ref2, f.seq.tokens.data() + 1, f.seq.hiddens.data(), L - 1, 0);
    y.assign(f.seq.hiddens.begin() + (L - 1) * f.H, f.seq.hiddens.begin() + L * f.H);
    token = f.seq.tokens[L];
    for (int i = 0; i < kept - (L - 1); ++i) {
      d->propose(*ref2, token, y.data(), 1);
      y = d->head_inputs();
      d->after_verify(*ref2, 1);
      token = chain[static_cast<size_t>(i)];
    }
    ASSERT_EQ(ref2->seq_len(0), kept);
    const int next = kept + 1;
    const auto p1 = d->propose(*st, f.seq.tokens[next], f.seq.hiddens.data() + (next - 1) * f.H, k);
    const auto p2 = d->propose(*ref2, f.seq.tokens[next], f.seq.hiddens.data() + (next - 1) * f.H, k);
    EXPECT_EQ(p1, p2) << drafter::to_string(rows_policy);
    EXPECT_EQ(d->head_inputs().size(), static_cast<size_t>(k * f.H));
  }
}

TEST(DraftStats, TargetLogprobsMatchTheReference) {
  Fixture f;
  auto d = f.make({});
  // 70 rows: two head chunks (64 + 6).
  const int n = 70;
  const std::vector<int32_t> tokens(f.seq.tokens.begin() + 1, f.seq.tokens.begin() + 1 + n);
  int inside = 0, outside = 0;
  for (const SamplingTransform& t : transforms()) {
    const auto got = d->target_logprobs(f.seq.hiddens.data(), tokens.data(), n, t);
    ASSERT_EQ(got.size(), static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      const auto l = f.logits(f.seq.hiddens.data() + static_cast<size_t>(r) * f.H, false);
      const auto ref = test::reference_stats(l, tokens[static_cast<size_t>(r)], t);
      (ref.in_support ? inside : outside)++;
      EXPECT_TRUE(test::close(got[static_cast<size_t>(r)], ref.req_logprob, kRel, kAbs))
          << name_of(t) << " row " << r << ": " << got[static_cast<size_t>(r)] << " vs " << ref.req_logprob;
    }
  }
  EXPECT_GT(inside, 0);
  EXPECT_GT(outside, 0);
  // The FP8 drafter head does not touch the target's: the same BF16 values.
  drafter::DrafterOptions opt;
  opt.head_fp8 = true;
  auto d8 = f.make(opt);
  EXPECT_EQ(d8->target_logprobs(f.seq.hiddens.data(), tokens.data(), n, SamplingTransform{}),
            d->target_logprobs(f.seq.hiddens.data(), tokens.data(), n, SamplingTransform{}));
  EXPECT_TRUE(d->target_logprobs(f.seq.hiddens.data(), tokens.data(), 0, SamplingTransform{}).empty());
}

TEST(DraftStats, BadExtrasAreRefused) {
  Fixture f;
  const int k = 3;
  auto d = f.make({});
  auto st = d->new_sequence();
  d->append_rows(*st, f.seq.tokens.data() + 1, f.seq.hiddens.data(), 20, 0);
  const int32_t tok = f.seq.tokens[21];
  const bf16* h = f.seq.hiddens.data() + 20 * f.H;
  std::vector<DraftStats> stats;
  std::vector<int32_t> two = {1, 2}, three = {1, 2, 3}, bad = {1, f.V};
  auto expect_refused = [&](const drafter::ProposeExtras& x, const char* what) {
    EXPECT_THROW(d->propose(*st, tok, h, k, x), Error) << what;
    EXPECT_EQ(st->propose_start(0), -1) << what << ": a refused call leaves no pending propose";
  };
  drafter::ProposeExtras x;
  x.chain_tokens = three;
  expect_refused(x, "chain of k tokens");
  x = {};
  x.chain_tokens = bad;
  expect_refused(x, "chain token outside the vocab");
  x = {};
  x.requested = three;
  expect_refused(x, "requested without stats");
  x.stats = &stats;
  x.requested = two;
  expect_refused(x, "requested of k - 1 tokens");
  x.requested = {};
  x.transform.temperature = 0;
  expect_refused(x, "temperature 0");
  const auto trace = test::make_trace(*f.be, f.cfg, 1, 24, 48, 5);
  EXPECT_THROW(d->target_logprobs(f.seq.hiddens.data(), bad.data(), 2, SamplingTransform{}), Error);
  EXPECT_THROW(d->target_logprobs(f.seq.hiddens.data(), two.data(), 2, SamplingTransform{1.0, 0, 2.0}),
               Error);
  drafter::DrafterOptions skip_head;
  skip_head.skip = drafter::Skip::head;
  auto ds = f.make(skip_head);
  auto s2 = ds->new_sequence();
  ds->append_rows(*s2, f.seq.tokens.data() + 1, f.seq.hiddens.data(), 20, 0);
  x = {};
  x.stats = &stats;
  EXPECT_THROW(ds->propose(*s2, tok, h, k, x), Error);
  // Valid extras still work after the refusals.
  x = {};
  x.chain_tokens = two;
  EXPECT_EQ(d->propose(*st, tok, h, k, x).size(), static_cast<size_t>(k));
}
