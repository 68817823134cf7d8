// The target (drafter/target.hpp, docs/target.md) on the CPU backend:
// - the verify forward of B sequences of R rows each (R = 1 .. 5, each sequence at its own
//   position, with rollbacks between the steps) gives every row's token, hidden, stats and logits
//   bit for bit as R forwards of one row of that sequence alone, also when the rows are cut into
//   forwards of a few rows (max_rows);
// - a rollback followed by a verify gives what a fresh run of the kept and the new rows gives;
// - a dense-MLP layer computes bf16(x1 + W_down a) from the post-attention residual x1, with the
//   clamped SwiGLU, as a direct computation of the formula with the ops' rounding points;
// - prefill equals one row at a time, stats equal the drafter's target_logprobs on the same
//   hiddens, and SyntheticTarget's traces are the target's greedy continuation.
// Each can fail: the rows of a verify that read a later row's cache, a rollback that left stale
// pool keys read, an MLP without the clamp or the wrong rounding show as a bit difference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "common/temp_dir.hpp"
#include "common/trace.hpp"
#include "drafter/factory.hpp"
#include "drafter/target.hpp"
#include "model/safetensors.hpp"
#include "model/weights.hpp"
#include "ops/cpu/cpu_math.hpp"

using namespace mtplab;
using drafter::Target;
using drafter::TargetState;
using drafter::VerifyExtras;
using drafter::VerifyResult;
using drafter::VerifySeq;

namespace {

/// The tiny preset (128 rows of context) with its first `dense` trunk layers dense (256 columns).
model::ModelConfig target_config(int dense = 1) {
  model::ModelConfig cfg = test::tiny_config(128);
  cfg.first_k_dense_replace = dense;
  return cfg;
}

std::unique_ptr<Target> make_target(ops::Backend& be, const model::ModelConfig& cfg, int layers = 3,
                                    int max_rows = 512) {
  drafter::TargetOptions o;
  o.max_rows = max_rows;
  return drafter::make_synthetic_target(be, nullptr, cfg, layers, 7, 5, o);
}

std::vector<int32_t> random_tokens(std::mt19937& rng, int n, int vocab) {
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

bool same_bits(const void* a, const void* b, size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

/// Row r of a result, as one-row results are kept.
struct RowOut {
  int32_t token = -1;
  std::vector<bf16> hidden;
  ops::TokenStats stats{};
  std::vector<bf16> logits;
};

RowOut row_of(const VerifyResult& r, int row, int H, int V) {
  RowOut o;
  o.hidden.assign(r.hiddens.begin() + static_cast<ptrdiff_t>(row) * H,
                  r.hiddens.begin() + static_cast<ptrdiff_t>(row + 1) * H);
  if (!r.tokens.empty()) o.token = r.tokens[static_cast<size_t>(row)];
  if (!r.stats.empty()) o.stats = r.stats[static_cast<size_t>(row)];
  if (!r.logits.empty())
    o.logits.assign(r.logits.begin() + static_cast<ptrdiff_t>(row) * V,
                    r.logits.begin() + static_cast<ptrdiff_t>(row + 1) * V);
  return o;
}

void expect_same_row(const RowOut& a, const RowOut& b, const std::string& what) {
  EXPECT_EQ(a.token, b.token) << what;
  EXPECT_TRUE(same_bits(a.hidden.data(), b.hidden.data(), a.hidden.size() * sizeof(bf16)) &&
              a.hidden.size() == b.hidden.size())
      << what << ": hidden";
  EXPECT_TRUE(same_bits(&a.stats, &b.stats, sizeof(ops::TokenStats)))
      << what << ": stats " << a.stats.logprob << " vs " << b.stats.logprob;
  EXPECT_TRUE(a.logits.size() == b.logits.size() &&
              same_bits(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(bf16)))
      << what << ": logits";
}

}  // namespace

// B = 4 sequences with prompts of 9, 17, 22 and 30 tokens, then 8 steps in which sequence b
// verifies R = 1 + (b + step) % 5 rows (1 .. 5, at its own position, past the 19 rows where the
// indexer's selection starts to be sparse), with the stats of a transform (truncated every other
// step), requested tokens and the logits; after each step every sequence keeps a random number of its rows.
// The reference runs each sequence's rows one at a time, alone, on the same weights; a second target cuts
// every forward at 7 rows (a sequence's rows split over two forwards).
TEST(Target, VerifyOfRaggedRowsIsOneRowStepsBitForBit) {
  auto be = ops::make_cpu_backend();
  const model::ModelConfig cfg = target_config(1);
  const int H = cfg.hidden, V = cfg.vocab;
  auto target = make_target(*be, cfg);
  auto chunked = make_target(*be, cfg, 3, 7);
  EXPECT_EQ(target->dense_layers(), 1);
  const int B = 4;
  auto batch = target->new_batch(B + 2);  // spare slots: the batch's slots need not be 0 .. B-1
  auto cut = chunked->new_batch(B);
  auto one = target->new_batch(B);
  std::vector<int> slot(B), cut_slot(B), one_slot(B);
  target->new_sequence(*batch);  // slot 0 stays empty
  for (int b = 0; b < B; ++b) {
    slot[static_cast<size_t>(b)] = target->new_sequence(*batch);
    cut_slot[static_cast<size_t>(b)] = chunked->new_sequence(*cut);
    one_slot[static_cast<size_t>(b)] = target->new_sequence(*one);
  }
  std::mt19937 rng(20261207);
  // Truncated (a random requested token is almost always outside the support: log p = -inf) and
  // not (every requested token has a finite log p).
  drafter::SamplingTransform truncated, t;
  truncated.temperature = 0.8;
  truncated.top_k = 40;
  truncated.top_p = 0.9;
  t.temperature = 0.8;
  // Prefill: the rows at once (head on the last, with stats of a requested token and the logits)
  // against one row at a time.
  const int prompt[B] = {9, 17, 22, 30};
  for (int b = 0; b < B; ++b) {
    const auto tokens = random_tokens(rng, prompt[b], V);
    const std::vector<int32_t> req = random_tokens(rng, 1, V);
    VerifyExtras px;
    px.transform = &t;
    px.requested = req;
    px.logits = true;
    const VerifyResult p = target->prefill(*batch, slot[static_cast<size_t>(b)], tokens, px);
    const VerifyResult pc = chunked->prefill(*cut, cut_slot[static_cast<size_t>(b)], tokens, px);
    ASSERT_EQ(p.rows, prompt[b]);
    ASSERT_EQ(p.tokens.size(), 1u);
    ASSERT_EQ(p.stats.size(), 1u);
    ASSERT_EQ(p.logits.size(), static_cast<size_t>(V));
    EXPECT_EQ(pc.tokens, p.tokens);
    EXPECT_TRUE(same_bits(pc.hiddens.data(), p.hiddens.data(), p.hiddens.size() * sizeof(bf16)));
    for (int j = 0; j < prompt[b]; ++j) {
      const VerifySeq s{one_slot[static_cast<size_t>(b)],
                        std::span<const int32_t>(&tokens[static_cast<size_t>(j)], 1)};
      const bool last = j + 1 == prompt[b];
      const VerifyResult r =
          target->verify(*one, std::span<const VerifySeq>(&s, 1), last ? px : VerifyExtras{});
      ASSERT_TRUE(
          same_bits(r.hiddens.data(), p.hiddens.data() + static_cast<size_t>(j) * H, H * sizeof(bf16)))
          << "sequence " << b << " prompt row " << j;
      if (last) {  // the prefill's head row: its token, stats and logits, with the last hidden
        RowOut got = row_of(p, 0, H, V);
        got.hidden.assign(p.hiddens.end() - H, p.hiddens.end());
        expect_same_row(got, row_of(r, 0, H, V), str("sequence ", b, " prefill's last row"));
      }
    }
    EXPECT_EQ(batch->seq_len(slot[static_cast<size_t>(b)]), prompt[b]);
  }
  int rows_checked = 0, max_pos = 0;
  for (int step = 0; step < 8; ++step) {
    SCOPED_TRACE(str("step ", step));
    std::vector<std::vector<int32_t>> tokens(B);
    std::vector<VerifySeq> seqs, cut_seqs;
    std::vector<int32_t> requested;
    for (int b = 0; b < B; ++b) {
      const int R = 1 + (b + step) % 5;
      tokens[static_cast<size_t>(b)] = random_tokens(rng, R, V);
      const auto req = random_tokens(rng, R, V);
      requested.insert(requested.end(), req.begin(), req.end());
    }
    // The batch's sequences in another order than their slots.
    for (int b : {2, 0, 3, 1}) {
      seqs.push_back(VerifySeq{slot[static_cast<size_t>(b)], tokens[static_cast<size_t>(b)]});
      cut_seqs.push_back(VerifySeq{cut_slot[static_cast<size_t>(b)], tokens[static_cast<size_t>(b)]});
    }
    std::vector<int32_t> req_in_order;
    std::vector<int> first_req(B + 1, 0);
    for (int b = 0; b < B; ++b)
      first_req[static_cast<size_t>(b) + 1] = first_req[static_cast<size_t>(b)] + 1 + (b + step) % 5;
    for (int b : {2, 0, 3, 1})
      req_in_order.insert(req_in_order.end(), requested.begin() + first_req[static_cast<size_t>(b)],
                          requested.begin() + first_req[static_cast<size_t>(b) + 1]);
    VerifyExtras x;
    x.transform = step % 2 ? &truncated : &t;
    x.requested = req_in_order;
    x.logits = true;
    std::vector<int> before(B);
    for (int b = 0; b < B; ++b) before[static_cast<size_t>(b)] = batch->seq_len(slot[static_cast<size_t>(b)]);
    const VerifyResult r = target->verify(*batch, seqs, x);
    const VerifyResult rc = chunked->verify(*cut, cut_seqs, x);
    ASSERT_EQ(r.first_row.size(), static_cast<size_t>(B) + 1);
    ASSERT_EQ(r.tokens.size(), static_cast<size_t>(r.rows));
    ASSERT_EQ(r.stats.size(), static_cast<size_t>(r.rows));
    ASSERT_EQ(r.logits.size(), static_cast<size_t>(r.rows) * V);
    for (int i = 0; i < B; ++i) {
      const int b = std::vector<int>{2, 0, 3, 1}[static_cast<size_t>(i)];
      const auto& tok = tokens[static_cast<size_t>(b)];
      const int R = static_cast<int>(tok.size());
      ASSERT_EQ(r.first_row[static_cast<size_t>(i) + 1] - r.first_row[static_cast<size_t>(i)], R);
      EXPECT_EQ(batch->seq_len(slot[static_cast<size_t>(b)]), before[static_cast<size_t>(b)] + R);
      for (int j = 0; j < R; ++j) {
        const int row = r.first_row[static_cast<size_t>(i)] + j;
        const VerifySeq s{one_slot[static_cast<size_t>(b)],
                          std::span<const int32_t>(&tok[static_cast<size_t>(j)], 1)};
        VerifyExtras x1 = x;
        x1.requested = std::span<const int32_t>(&req_in_order[static_cast<size_t>(row)], 1);
        const VerifyResult single = target->verify(*one, std::span<const VerifySeq>(&s, 1), x1);
        const std::string what =
            str("sequence ", b, " row ", j, " at position ", before[static_cast<size_t>(b)] + j);
        expect_same_row(row_of(r, row, H, V), row_of(single, 0, H, V), what);
        expect_same_row(row_of(rc, row, H, V), row_of(single, 0, H, V), what + " (forwards of 7 rows)");
        ++rows_checked;
        max_pos = std::max(max_pos, before[static_cast<size_t>(b)] + j);
      }
      // Keep the first a + 1 rows (a accepted drafts), in all three.
      const int keep =
          before[static_cast<size_t>(b)] + 1 + static_cast<int>(rng() % static_cast<unsigned>(R));
      target->rollback(*batch, slot[static_cast<size_t>(b)], keep);
      chunked->rollback(*cut, cut_slot[static_cast<size_t>(b)], keep);
      target->rollback(*one, one_slot[static_cast<size_t>(b)], keep);
    }
  }
  EXPECT_EQ(rows_checked, 97);  // the sum of R = 1 + (b + step) % 5 over the 4 sequences and 8 steps
  EXPECT_GT(max_pos, 40);
}

// A verify, a rollback into the middle of it, a verify of new rows, again and again (rollbacks
// inside and across index pools): the kept rows and the new ones are what a fresh sequence of the
// same tokens gives, run as one prefill and as one verify of every row.
TEST(Target, RollbackThenVerifyIsAFreshRun) {
  auto be = ops::make_cpu_backend();
  const model::ModelConfig cfg = target_config(2);
  const int H = cfg.hidden, V = cfg.vocab;
  auto target = make_target(*be, cfg);
  auto state = target->new_batch(3);
  const int s = target->new_sequence(*state);
  std::mt19937 rng(7);
  std::vector<int32_t> kept = random_tokens(rng, 21, V);
  VerifyResult p = target->prefill(*state, s, kept);
  std::vector<bf16> hiddens = p.hiddens;
  std::vector<int32_t> argmax(kept.size(), -1);
  argmax.back() = p.tokens[0];
  for (int step = 0; step < 12; ++step) {
    const int R = 2 + step % 5;
    const auto rows = random_tokens(rng, R, V);
    const VerifySeq q{s, rows};
    const VerifyResult r = target->verify(*state, std::span<const VerifySeq>(&q, 1));
    const int a = static_cast<int>(rng() % static_cast<unsigned>(R));  // accepted: keep a + 1 rows
    target->rollback(*state, s, static_cast<int>(kept.size()) + a + 1);
    EXPECT_EQ(state->seq_len(s), static_cast<int>(kept.size()) + a + 1);
    for (int j = 0; j <= a; ++j) {
      kept.push_back(rows[static_cast<size_t>(j)]);
      argmax.push_back(r.tokens[static_cast<size_t>(j)]);
      hiddens.insert(hiddens.end(), r.hiddens.begin() + static_cast<ptrdiff_t>(j) * H,
                     r.hiddens.begin() + static_cast<ptrdiff_t>(j + 1) * H);
    }
  }
  ASSERT_GT(kept.size(), 40u);
  // Fresh: one prefill, and one verify of every row (head on each), in a new slot.
  const int f = target->new_sequence(*state);
  const VerifyResult fp = target->prefill(*state, f, kept);
  EXPECT_TRUE(same_bits(fp.hiddens.data(), hiddens.data(), hiddens.size() * sizeof(bf16)));
  EXPECT_EQ(fp.tokens[0], argmax.back());
  const int g = target->new_sequence(*state);
  const VerifySeq all{g, kept};
  const VerifyResult fv = target->verify(*state, std::span<const VerifySeq>(&all, 1));
  EXPECT_TRUE(same_bits(fv.hiddens.data(), hiddens.data(), hiddens.size() * sizeof(bf16)));
  for (size_t i = 21; i < kept.size(); ++i) EXPECT_EQ(fv.tokens[i], argmax[i]) << "row " << i;
  // A rollback that would add rows, or of a free slot, is refused.
  EXPECT_THROW(target->rollback(*state, s, static_cast<int>(kept.size()) + 1), Error);
  target->release(*state, g);
  EXPECT_THROW(target->rollback(*state, g, 0), Error);
}

// The dense MLP against its formula: from the post-attention residual x1 (the block with a zero
// W_down gives exactly x1), v = rmsnorm(x1; post_norm), g = bf16(W_gate v), u = bf16(W_up v),
// a = bf16(silu(min(g, L)) * clamp(u, -L, L)), d = bf16(W_down a), out = bf16(x1 + d), every dot
// product in fp32 in the CPU reference's summation order. Rows of the gate and up are scaled so
// that the clamp acts; the same formula without it differs.
TEST(Target, DenseMlpLayerIsTheDirectComputation) {
  auto be = ops::make_cpu_backend();
  const model::ModelConfig cfg = target_config(1);
  const int H = cfg.hidden, I = cfg.intermediate_size;
  const model::ShardPlan plan = model::make_shard_plan(cfg, 0, 1, model::HeadSharding::none);
  model::LayerWeights w = model::synthesize_layer_weights(cfg, plan, 0, 9);
  ASSERT_TRUE(w.dense);
  for (int r = 0; r < I; r += 4)  // a quarter of the rows large enough for |g|, |u| > L
    for (int c = 0; c < H; ++c) {
      bf16& g = w.mlp.gate_proj.data[static_cast<size_t>(r) * H + c];
      bf16& u = w.mlp.up_proj.data[static_cast<size_t>(r) * H + c];
      g = to_bf16(to_float(g) * 24.0f);
      u = to_bf16(to_float(u) * 24.0f);
    }
  model::LayerWeights zero = w;
  std::fill(zero.mlp.down_proj.data.begin(), zero.mlp.down_proj.data.end(), bf16{});
  drafter::BlockDims d = drafter::block_dims(cfg, 1, 0, ops::KvDtype::bf16);
  d.dense_mlp = true;
  d.dense_inter_local = I;
  drafter::Block dense(*be, nullptr, d, drafter::upload_block_weights(*be, w));
  drafter::Block x1_block(*be, nullptr, d, drafter::upload_block_weights(*be, zero));
  const int n = 6;
  dense.reserve(n);
  x1_block.reserve(n);
  drafter::SlotCaches c1(*be, d, 1), c2(*be, d, 1);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u01(-2.0f, 2.0f);
  std::vector<bf16> x(static_cast<size_t>(n) * H);
  for (auto& v : x) v = to_bf16(u01(rng));
  const std::vector<int32_t> slot(n, 0), pos = {0, 1, 2, 3, 4, 5};
  ops::Array<int32_t> slot_d(*be, n), pos_d(*be, n);
  be->upload(slot_d.data(), slot.data(), n * sizeof(int32_t));
  be->upload(pos_d.data(), pos.data(), n * sizeof(int32_t));
  ops::Array<bf16> xd(*be, x.size()), out_d(*be, x.size()), x1_d(*be, x.size());
  be->upload(xd.data(), x.data(), x.size() * sizeof(bf16));
  const ops::RowBatch rb{slot_d.data(), pos_d.data(), n, n};
  dense.forward(rb, xd.data(), c1, out_d.data());
  x1_block.forward(rb, xd.data(), c2, x1_d.data());
  std::vector<bf16> out(x.size()), x1(x.size());
  be->download(out.data(), out_d.data(), out.size() * sizeof(bf16));
  be->download(x1.data(), x1_d.data(), x1.size() * sizeof(bf16));

  const float L = cfg.swiglu_limit, eps = cfg.rms_norm_eps;
  int clamped = 0, differ_unclamped = 0, moved = 0;
  for (int r = 0; r < n; ++r) {
    const bf16* xr = x1.data() + static_cast<size_t>(r) * H;
    // v = rmsnorm(x1): fp32 sum of squares in 8 lanes, one rounding.
    float acc[ops::cpu::kLanes] = {};
    for (int j = 0; j < H; ++j) acc[j % ops::cpu::kLanes] += to_float(xr[j]) * to_float(xr[j]);
    const float rs = 1.0f / std::sqrt(ops::cpu::fold_lanes(acc) / static_cast<float>(H) + eps);
    std::vector<float> v(static_cast<size_t>(H));
    for (int j = 0; j < H; ++j)
      v[static_cast<size_t>(j)] = to_float(to_bf16(
          to_float(w.post_attention_layernorm.data[static_cast<size_t>(j)]) * (to_float(xr[j]) * rs)));
    for (bool clamp : {true, false}) {
      std::vector<float> a(static_cast<size_t>(I));
      for (int i = 0; i < I; ++i) {
        float g = to_float(
            to_bf16(ops::cpu::dot(w.mlp.gate_proj.data.data() + static_cast<size_t>(i) * H, v.data(), H)));
        float u = to_float(
            to_bf16(ops::cpu::dot(w.mlp.up_proj.data.data() + static_cast<size_t>(i) * H, v.data(), H)));
        if (clamp) {
          clamped += (g > L) + (std::fabs(u) > L);
          g = std::min(g, L);
          u = std::clamp(u, -L, L);
        }
        a[static_cast<size_t>(i)] = to_float(to_bf16(g / (1.0f + std::exp(-g)) * u));
      }
      for (int h = 0; h < H; ++h) {
        const float dh = to_float(
            to_bf16(ops::cpu::dot(w.mlp.down_proj.data.data() + static_cast<size_t>(h) * I, a.data(), I)));
        const bf16 want = to_bf16(to_float(xr[h]) + (0.0f + 1.0f * dh));
        const bf16 got = out[static_cast<size_t>(r) * H + h];
        if (clamp) {
          ASSERT_EQ(got.bits, want.bits) << "row " << r << " column " << h;
          moved += got.bits != xr[h].bits;
        } else {
          differ_unclamped += got.bits != want.bits;
        }
      }
    }
  }
  EXPECT_GT(clamped, 0);
  EXPECT_GT(differ_unclamped, 0);
  EXPECT_GT(moved, n * H / 2);  // the MLP changes most of the residual
  // The same layer with routed experts (an MoE block of the same seed) gives another output.
  model::ModelConfig moe_cfg = cfg;
  moe_cfg.first_k_dense_replace = 0;
  const model::LayerWeights mw = model::synthesize_layer_weights(moe_cfg, plan, 0, 9);
  drafter::BlockDims md = drafter::block_dims(moe_cfg, 1, 0, ops::KvDtype::bf16);
  drafter::Block moe(*be, nullptr, md, drafter::upload_block_weights(*be, mw));
  moe.reserve(n);
  drafter::SlotCaches c3(*be, md, 1);
  moe.forward(rb, xd.data(), c3, out_d.data());
  std::vector<bf16> moe_out(x.size());
  be->download(moe_out.data(), out_d.data(), moe_out.size() * sizeof(bf16));
  EXPECT_FALSE(same_bits(moe_out.data(), out.data(), out.size() * sizeof(bf16)));
}

// Stats under a transform and the whole logits: the stats are those of the drafter's
// target_logprobs on the same hiddens (one head, one stats pass); the logits' argmax is the token.
TEST(Target, StatsAndLogitsAreTheHeadsOnTheHiddens) {
  auto be = ops::make_cpu_backend();
  const model::ModelConfig cfg = target_config(0);
  const int V = cfg.vocab;
  auto target = make_target(*be, cfg, 2);
  auto state = target->new_batch(2);
  const int s0 = target->new_sequence(*state), s1 = target->new_sequence(*state);
  std::mt19937 rng(11);
  target->prefill(*state, s0, random_tokens(rng, 13, V));
  target->prefill(*state, s1, random_tokens(rng, 26, V));
  const auto t0 = random_tokens(rng, 4, V), t1 = random_tokens(rng, 3, V);
  const std::vector<VerifySeq> seqs = {{s0, t0}, {s1, t1}};
  std::vector<int32_t> requested = random_tokens(rng, 7, V);
  drafter::SamplingTransform t;  // no truncation: every requested token has a finite log p
  t.temperature = 0.7;
  VerifyExtras x;
  x.transform = &t;
  x.requested = requested;
  x.logits = true;
  const VerifyResult r = target->verify(*state, seqs, x);
  ASSERT_EQ(r.rows, 7);
  // The drafter holds the same head (weight seed 7): its target_logprobs of the hiddens.
  auto w =
      model::synthesize_mtp_weights(cfg, model::make_shard_plan(cfg, 0, 1, model::HeadSharding::none), 7);
  auto drafter = drafter::make_drafter(*be, nullptr, cfg, w, drafter::DrafterOptions{});
  const std::vector<float> lp = drafter->target_logprobs(r.hiddens.data(), requested.data(), 7, t);
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(float_to_bits(lp[static_cast<size_t>(i)]),
              float_to_bits(r.stats[static_cast<size_t>(i)].req_logprob))
        << "row " << i;
    EXPECT_TRUE(std::isfinite(r.stats[static_cast<size_t>(i)].req_logprob)) << "row " << i;
    const bf16* row = r.logits.data() + static_cast<size_t>(i) * V;
    int best = 0;
    for (int v = 1; v < V; ++v)
      if (to_float(row[v]) > to_float(row[best])) best = v;
    EXPECT_EQ(r.tokens[static_cast<size_t>(i)], best) << "row " << i;
  }
  // Without requested tokens the requested log p is NaN; the other stats stay.
  target->rollback(*state, s0, 13);
  target->rollback(*state, s1, 26);
  VerifyExtras y;
  y.transform = &t;
  const VerifyResult q = target->verify(*state, seqs, y);
  for (int i = 0; i < 7; ++i) {
    EXPECT_TRUE(std::isnan(q.stats[static_cast<size_t>(i)].req_logprob));
    EXPECT_EQ(float_to_bits(q.stats[static_cast<size_t>(i)].logprob),
              float_to_bits(r.stats[static_cast<size_t>(i)].logprob));
  }
  EXPECT_TRUE(q.logits.empty());
  EXPECT_EQ(q.tokens, r.tokens);
}

// The synthetic trace is the target's greedy continuation: a prefill of the prompt, then one verify
// row per step fed the previous row's token, gives the trace's tokens and hiddens bit for bit.
TEST(Target, SyntheticTraceIsTheTargetsGreedyContinuation) {
  auto be = ops::make_cpu_backend();
  for (int dense : {0, 1}) {
    SCOPED_TRACE(str("first_k_dense_replace ", dense));
    const model::ModelConfig cfg = target_config(dense);
    const int H = cfg.hidden;
    drafter::SyntheticTarget gen(*be, cfg, 2, 7, 5);
    const auto trace = drafter::synthetic_trace(gen, cfg.vocab, 2, 20, 12, 5);
    auto target = make_target(*be, cfg, 2);
    auto state = target->new_batch(1);
    for (const io::TraceSequence& seq : trace) {
      const int s = target->new_sequence(*state);
      const std::vector<int32_t> prompt(seq.tokens.begin(), seq.tokens.begin() + seq.prompt_length);
      VerifyResult r = target->prefill(*state, s, prompt);
      ASSERT_TRUE(same_bits(r.hiddens.data(), seq.hiddens.data(), r.hiddens.size() * sizeof(bf16)));
      for (size_t p = static_cast<size_t>(seq.prompt_length); p < seq.tokens.size(); ++p) {
        ASSERT_EQ(r.tokens.back(), seq.tokens[p]) << "position " << p;
        const VerifySeq q{s, std::span<const int32_t>(&seq.tokens[p], 1)};
        r = target->verify(*state, std::span<const VerifySeq>(&q, 1));
        ASSERT_TRUE(same_bits(r.hiddens.data(), seq.hiddens.data() + p * H, H * sizeof(bf16)))
            << "position " << p;
      }
      target->release(*state, s);
    }
  }
}

// The target is its parts: the embedding row, each layer's Block::forward over its own caches in
// layer order (layer 0 dense), the final RMSNorm and the head, composed here op by op from the
// weights, one row at a time, against a verify of 6 rows after a prefill.
TEST(Target, IsTheEmbeddingTheLayersTheNormAndTheHead) {
  auto be = ops::make_cpu_backend();
  const model::ModelConfig cfg = target_config(1);
  const int H = cfg.hidden, V = cfg.vocab;
  const int L = 3;
  auto target = make_target(*be, cfg, L);
  const model::ShardPlan plan = model::make_shard_plan(cfg, 0, 1, model::HeadSharding::none);
  const model::TargetWeights w = model::synthesize_target_weights(cfg, plan, L, 7, 5);
  std::vector<std::unique_ptr<drafter::Block>> blocks;
  std::vector<std::unique_ptr<drafter::SlotCaches>> caches;
  for (int i = 0; i < L; ++i) {
    drafter::BlockDims d = drafter::block_dims(cfg, 1, 0, ops::KvDtype::bf16);
    d.dense_mlp = i == 0;
    d.dense_inter_local = i == 0 ? cfg.intermediate_size : 0;
    blocks.push_back(std::make_unique<drafter::Block>(
        *be, nullptr, d, drafter::upload_block_weights(*be, w.layers[static_cast<size_t>(i)])));
    blocks.back()->reserve(1);
    caches.push_back(std::make_unique<drafter::SlotCaches>(*be, d, 1));
  }
  ops::Array<bf16> embed = drafter::upload(*be, w.embed_tokens), head = drafter::upload(*be, w.lm_head),
                   norm = drafter::upload(*be, w.final_norm);
  ops::Array<bf16> x(*be, static_cast<size_t>(H)), y(*be, static_cast<size_t>(H));
  ops::Array<int32_t> slot(*be, 1), pos(*be, 1);
  ops::Array<ops::ArgMax> arg(*be, 1);
  const int32_t zero = 0;
  be->upload(slot.data(), &zero, sizeof zero);
  std::mt19937 rng(5);
  const auto tokens = random_tokens(rng, 30, V);
  std::vector<bf16> hiddens;
  std::vector<int32_t> argmax;
  for (int p = 0; p < 30; ++p) {
    be->upload(pos.data(), &p, sizeof p);
    be->copy(x.data(), embed.data() + static_cast<size_t>(tokens[static_cast<size_t>(p)]) * H,
             H * sizeof(bf16));
    for (int i = 0; i < L; ++i)
      blocks[static_cast<size_t>(i)]->forward(ops::RowBatch{slot.data(), pos.data(), 1, 1}, x.data(),
                                              *caches[static_cast<size_t>(i)], x.data());
    be->rmsnorm(x.data(), norm.data(), y.data(), 1, H, cfg.rms_norm_eps);
    be->head_argmax(head.data(), nullptr, nullptr, y.data(), V, H, 0, nullptr, arg.data());
    std::vector<bf16> h(static_cast<size_t>(H));
    ops::ArgMax a{};
    be->download(h.data(), y.data(), h.size() * sizeof(bf16));
    be->download(&a, arg.data(), sizeof a);
    hiddens.insert(hiddens.end(), h.begin(), h.end());
    argmax.push_back(a.index);
  }
  auto state = target->new_batch(1);
  const int s = target->new_sequence(*state);
  const VerifyResult p = target->prefill(*state, s, std::span<const int32_t>(tokens.data(), 24));
  const VerifySeq q{s, std::span<const int32_t>(tokens.data() + 24, 6)};
  const VerifyResult r = target->verify(*state, std::span<const VerifySeq>(&q, 1));
  EXPECT_TRUE(same_bits(p.hiddens.data(), hiddens.data(), 24 * H * sizeof(bf16)));
  EXPECT_EQ(p.tokens[0], argmax[23]);
  EXPECT_TRUE(same_bits(r.hiddens.data(), hiddens.data() + 24 * H, 6 * H * sizeof(bf16)));
  EXPECT_EQ(r.tokens, std::vector<int32_t>(argmax.begin() + 24, argmax.end()));
}

// A target loaded from a checkpoint of the synthetic weights (the trunk's names, layer 0 dense)
// generates the synthetic trace, greedy and sampled: load_target reads what the synthesis made.
TEST(Target, CheckpointTargetGeneratesTheSyntheticTrace) {
  auto be = ops::make_cpu_backend();
  const model::ModelConfig cfg = target_config(1);
  test::TempDir tmp("mtplab-target");
  const std::string file = tmp / "target.safetensors";
  const model::TargetWeights whole = model::synthesize_target_weights(
      cfg, model::make_shard_plan(cfg, 0, 1, model::HeadSharding::none), 2, 7, 5);
  model::write_safetensors(file, model::target_checkpoint_views(cfg, whole));
  auto loaded = drafter::load_target(*be, nullptr, cfg, 2, file);
  EXPECT_EQ(loaded->layers(), 2);
  EXPECT_EQ(loaded->dense_layers(), 1);
  drafter::SyntheticTarget synthetic(*be, cfg, 2, 7, 5);
  io::TraceSampling sampled;
  sampled.sampled = true;
  sampled.temperature = 0.9;
  sampled.top_p = 0.95;
  sampled.seed = 3;
  drafter::PromptGenerator gen(3, cfg.vocab);
  const std::vector<std::vector<int32_t>> prompts = {gen.next(21), gen.next(21), gen.next(21)};
  for (const io::TraceSampling& smp : {io::TraceSampling{}, sampled}) {
    SCOPED_TRACE(smp.sampled ? "sampled" : "greedy");
    const auto a = drafter::generate_batch(*loaded, prompts, 10, smp, 0);
    const auto b = synthetic.generate_batch(prompts, 10, smp, 0);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].tokens, b[i].tokens);
      EXPECT_TRUE(same_bits(a[i].hiddens.data(), b[i].hiddens.data(), a[i].hiddens.size() * sizeof(bf16)));
    }
  }
}

// VerifyExtras::routing: every row's routed experts at every layer, -1 at the dense layer, top_k
// distinct ids in [0, E) at the others, and, as a row's bits, independent of the forward the row
// runs in: 3 sequences verified together in one ragged forward (3, 5 and 2 rows after prompts of 6,
// 11 and 8) against each row run alone, and the prompt rows of prefill against generate_batch's.
TEST(Target, RoutingIsEachRowsOwnAtEveryLayer) {
  auto be = ops::make_cpu_backend();
  const model::ModelConfig cfg = target_config(1);
  const int K = cfg.num_experts_per_tok, E = cfg.n_routed_experts, L = 3, W = L * K;
  auto target = make_target(*be, cfg, L);
  std::mt19937 rng(20261208);
  const int prompt[3] = {6, 11, 8}, rows[3] = {3, 5, 2};
  auto together = target->new_batch(3);
  auto alone = target->new_batch(3);
  std::vector<std::vector<int32_t>> toks(3);
  VerifyExtras rx;
  rx.head = false;
  rx.routing = true;
  for (int b = 0; b < 3; ++b) {
    target->new_sequence(*together);
    target->new_sequence(*alone);
    toks[static_cast<size_t>(b)] = random_tokens(rng, prompt[b] + rows[b], cfg.vocab);
    const std::span<const int32_t> p(toks[static_cast<size_t>(b)].data(), static_cast<size_t>(prompt[b]));
    const VerifyResult pr = target->prefill(*together, b, p, rx);
    ASSERT_EQ(pr.routing.size(), static_cast<size_t>(prompt[b] * W));
    // The prompt rows one at a time give the same routing.
    for (int r = 0; r < prompt[b]; ++r) {
      const VerifySeq one{b, p.subspan(static_cast<size_t>(r), 1)};
      const VerifyResult o = target->verify(*alone, std::span<const VerifySeq>(&one, 1), rx);
      ASSERT_EQ(o.routing.size(), static_cast<size_t>(W));
      EXPECT_TRUE(std::equal(o.routing.begin(), o.routing.end(), pr.routing.begin() + r * W))
          << "sequence " << b << ", prompt row " << r;
    }
  }
  std::vector<VerifySeq> seqs;
  for (int b = 0; b < 3; ++b)
    seqs.push_back(VerifySeq{b, std::span<const int32_t>(toks[static_cast<size_t>(b)].data() + prompt[b],
                                                         static_cast<size_t>(rows[b]))});
  const VerifyResult v = target->verify(*together, seqs, rx);
  ASSERT_EQ(v.routing.size(), static_cast<size_t>(v.rows * W));
  for (int b = 0; b < 3; ++b)
    for (int r = 0; r < rows[b]; ++r) {
      const VerifySeq one{b, seqs[static_cast<size_t>(b)].tokens.subspan(static_cast<size_t>(r), 1)};
      const VerifyResult o = target->verify(*alone, std::span<const VerifySeq>(&one, 1), rx);
      const int row = v.first_row[static_cast<size_t>(b)] + r;
      EXPECT_TRUE(std::equal(o.routing.begin(), o.routing.end(), v.routing.begin() + row * W))
          << "sequence " << b << ", verify row " << r;
      for (int l = 0; l < L; ++l) {
        std::set<int32_t> ids;
        for (int j = 0; j < K; ++j) ids.insert(v.routing[static_cast<size_t>(row * W + l * K + j)]);
        if (l < target->dense_layers()) {
          EXPECT_EQ(ids, std::set<int32_t>{-1}) << "dense layer " << l;
        } else {
          EXPECT_EQ(ids.size(), static_cast<size_t>(K)) << "layer " << l << ": top_k distinct experts";
          EXPECT_TRUE(*ids.begin() >= 0 && *ids.rbegin() < E) << "layer " << l;
        }
      }
    }
  // Without the flag there is no routing.
  const VerifySeq first{0, std::span<const int32_t>(toks[0].data(), 1)};
  auto fresh = target->new_batch(1);
  target->new_sequence(*fresh);
  EXPECT_TRUE(target->verify(*fresh, std::span<const VerifySeq>(&first, 1)).routing.empty());
}

TEST(Target, BadCallsAreRefused) {
  auto be = ops::make_cpu_backend();
  const model::ModelConfig cfg = target_config(1);
  auto target = make_target(*be, cfg, 2);
  EXPECT_EQ(target->capacity(), 128);
  auto state = target->new_batch(2);
  const int s = target->new_sequence(*state);
  const std::vector<int32_t> ok = {1, 2, 3}, bad = {1, cfg.vocab};
  EXPECT_THROW(target->verify(*state, std::vector<VerifySeq>{}), Error);                  // nothing
  EXPECT_THROW(target->verify(*state, std::vector<VerifySeq>{{1, ok}}), Error);           // free slot
  EXPECT_THROW(target->verify(*state, std::vector<VerifySeq>{{s, ok}, {s, ok}}), Error);  // twice
  EXPECT_THROW(target->verify(*state, std::vector<VerifySeq>{{s, bad}}), Error);          // vocab
  EXPECT_THROW(target->verify(*state, std::vector<VerifySeq>{{s, {}}}), Error);           // no row
  const std::vector<int32_t> long_rows(129, 1);
  EXPECT_THROW(target->prefill(*state, s, long_rows), Error);  // capacity
  VerifyExtras x;
  x.requested = ok;  // without a transform
  EXPECT_THROW(target->verify(*state, std::vector<VerifySeq>{{s, ok}}, x), Error);
  drafter::SamplingTransform t;
  x.transform = &t;
  x.requested = std::span<const int32_t>(ok.data(), 2);  // 2 for 3 rows
  EXPECT_THROW(target->verify(*state, std::vector<VerifySeq>{{s, ok}}, x), Error);
  EXPECT_EQ(state->seq_len(s), 0);  // refused calls write no row
  target->new_sequence(*state);
  EXPECT_THROW(target->new_sequence(*state), Error);  // every slot live
  // Weights of another layer kind than the config says.
  model::ModelConfig moe_cfg = cfg;
  moe_cfg.first_k_dense_replace = 0;
  const auto plan = model::make_shard_plan(cfg, 0, 1, model::HeadSharding::none);
  const auto w = model::synthesize_target_weights(moe_cfg, plan, 1, 7, 5);
  EXPECT_THROW(Target(*be, nullptr, cfg, w), Error);
}
