// MtpWeights: synthetic shards equal the slices of the whole, scales as documented, FP8 head.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "model/weights.hpp"

using namespace mtplab;
using namespace mtplab::model;

namespace {

bool same_bits(const bf16& a, const bf16& b) { return a.bits == b.bits; }
bool same_bits(const float& a, const float& b) { return std::memcmp(&a, &b, 4) == 0; }

/// The [rows) x [cols) block of a whole [R, C] tensor equals the shard [rows.count, cols.count].
template <typename T>
void expect_block(const HostTensor<T>& whole, const HostTensor<T>& shard, Range rows, Range cols,
                  const std::string& what) {
  const int64_t C = whole.numel() / whole.shape.at(0);
  ASSERT_EQ(shard.numel(), rows.count * cols.count) << what;
  for (int64_t r = 0; r < rows.count; ++r)
    for (int64_t c = 0; c < cols.count; ++c) {
      const T& a = whole.data[static_cast<size_t>((rows.begin + r) * C + cols.begin + c)];
      const T& b = shard.data[static_cast<size_t>(r * cols.count + c)];
      ASSERT_TRUE(same_bits(a, b)) << what << " at (" << r << ", " << c << ")";
    }
}

template <typename T>
void expect_equal(const HostTensor<T>& a, const HostTensor<T>& b, const std::string& what) {
  ASSERT_EQ(a.shape, b.shape) << what;
  for (size_t i = 0; i < a.data.size(); ++i)
    ASSERT_TRUE(same_bits(a.data[i], b.data[i])) << what << " at " << i;
}

double mean_of(const TensorBF16& t) {
  double s = 0;
  for (const bf16 v : t.data) s += to_float(v);
  return s / static_cast<double>(t.data.size());
}
double std_of(const TensorBF16& t) {
  const double m = mean_of(t);
  double s = 0;
  for (const bf16 v : t.data) s += (to_float(v) - m) * (to_float(v) - m);
  return std::sqrt(s / static_cast<double>(t.data.size()));
}

/// Checks a shard against the whole weights, tensor by tensor.
void expect_shard_of(const ModelConfig& c, const MtpWeights& whole, const MtpWeights& w) {
  const ShardPlan& p = w.plan;
  const std::string at = str("rank ", p.rank, "/", p.world, ": ");
  auto full = [](const auto& t) { return Range{0, t.numel() / t.shape.at(0)}; };
  // Replicated tensors.
  expect_equal(whole.embed_tokens, w.embed_tokens, at + "embed_tokens");
  for (auto [a, b, name] :
       {std::tuple{&whole.enorm, &w.enorm, "enorm"},
        {&whole.hnorm, &w.hnorm, "hnorm"},
        {&whole.eh_proj, &w.eh_proj, "eh_proj"},
        {&whole.input_layernorm, &w.input_layernorm, "input_layernorm"},
        {&whole.post_attention_layernorm, &w.post_attention_layernorm, "post_attention_layernorm"},
        {&whole.shared_head_norm, &w.shared_head_norm, "shared_head_norm"},
        {&whole.attn.q_a_proj, &w.attn.q_a_proj, "q_a_proj"},
        {&whole.attn.q_a_layernorm, &w.attn.q_a_layernorm, "q_a_layernorm"},
        {&whole.attn.kv_a_proj_with_mqa, &w.attn.kv_a_proj_with_mqa, "kv_a_proj_with_mqa"},
        {&whole.attn.kv_a_layernorm, &w.attn.kv_a_layernorm, "kv_a_layernorm"},
        {&whole.indexer.wq_b, &w.indexer.wq_b, "wq_b"},
        {&whole.indexer.wk, &w.indexer.wk, "wk"},
        {&whole.indexer.k_norm_weight, &w.indexer.k_norm_weight, "k_norm_weight"},
        {&whole.indexer.k_norm_bias, &w.indexer.k_norm_bias, "k_norm_bias"},
        {&whole.indexer.weights_proj, &w.indexer.weights_proj, "weights_proj"},
        {&whole.indexer.compress_gate, &w.indexer.compress_gate, "compress_gate"},
        {&whole.moe.gate, &w.moe.gate, "router"}})
    expect_equal(*a, *b, at + name);
  expect_equal(whole.indexer.compress_ape, w.indexer.compress_ape, at + "compress_ape");
  expect_equal(whole.moe.e_score_correction_bias, w.moe.e_score_correction_bias,
               at + "e_score_correction_bias");

  // Sharded tensors.
  const int64_t dqk = c.qk_head_dim(), dkv = c.kv_b_head_rows(), dv = c.v_head_dim;
  expect_block(whole.lm_head, w.lm_head, p.vocab, full(whole.lm_head), at + "lm_head");
  expect_block(whole.attn.q_b_proj, w.attn.q_b_proj, Range{p.heads.begin * dqk, p.heads.count * dqk},
               full(whole.attn.q_b_proj), at + "q_b_proj");
  expect_block(whole.attn.kv_b_proj, w.attn.kv_b_proj, Range{p.heads.begin * dkv, p.heads.count * dkv},
               full(whole.attn.kv_b_proj), at + "kv_b_proj");
  expect_block(whole.attn.o_proj, w.attn.o_proj, Range{0, c.hidden},
               Range{p.heads.begin * dv, p.heads.count * dv}, at + "o_proj");
  expect_block(whole.moe.shared_gate, w.moe.shared_gate, p.shared_inter, full(whole.moe.shared_gate),
               at + "shared_gate");
  expect_block(whole.moe.shared_up, w.moe.shared_up, p.shared_inter, full(whole.moe.shared_up),
               at + "shared_up");
  expect_block(whole.moe.shared_down, w.moe.shared_down, Range{0, c.hidden}, p.shared_inter,
               at + "shared_down");
  // Stacked experts: a [E, I, H] tensor viewed as [E, I*H] rows.
  for (auto [a, b, name] : {std::tuple{&whole.moe.experts_gate, &w.moe.experts_gate, "experts_gate"},
                            {&whole.moe.experts_up, &w.moe.experts_up, "experts_up"},
                            {&whole.moe.experts_down, &w.moe.experts_down, "experts_down"}}) {
    EXPECT_EQ(b->shape.at(0), p.experts.count);
    expect_block(*a, *b, p.experts, full(*a), at + name);
  }
}

}  // namespace

TEST(SyntheticWeights, ShardsEqualSlicesOfTheWhole) {
  const ModelConfig c = load_model_preset("tiny");
  const uint64_t seed = 0x5eed;
  const MtpWeights whole = synthesize_mtp_weights(c, make_shard_plan(c, 0, 1, HeadSharding::vocab), seed);
  for (int world : {2, 4}) {
    for (HeadSharding hs : {HeadSharding::vocab, HeadSharding::none}) {
      for (int rank = 0; rank < world; ++rank) {
        const ShardPlan p = make_shard_plan(c, rank, world, hs);
        const MtpWeights w = synthesize_mtp_weights(c, p, seed);
        expect_shard_of(c, whole, w);
      }
    }
  }
}

TEST(SyntheticWeights, UnevenShardsAlsoMatch) {
  // 13 experts and an odd vocab over 3 ranks exercise the uneven rule.
  ModelConfig c = load_model_preset("tiny");
  c.n_routed_experts = 13;
  c.vocab = 4099;
  c.n_heads = 6;
  const MtpWeights whole = synthesize_mtp_weights(c, make_shard_plan(c, 0, 1, HeadSharding::vocab), 7);
  for (int rank = 0; rank < 3; ++rank)
    expect_shard_of(c, whole, synthesize_mtp_weights(c, make_shard_plan(c, rank, 3, HeadSharding::vocab), 7));
}

TEST(SyntheticWeights, ShapesFollowThePlan) {
  const ModelConfig c = load_model_preset("tiny");
  const MtpWeights w = synthesize_mtp_weights(c, make_shard_plan(c, 1, 2, HeadSharding::vocab), 1);
  using S = std::vector<int64_t>;
  EXPECT_EQ(w.embed_tokens.shape, (S{4096, 128}));
  EXPECT_EQ(w.lm_head.shape, (S{2048, 128}));
  EXPECT_EQ(w.eh_proj.shape, (S{128, 256}));
  EXPECT_EQ(w.attn.q_a_proj.shape, (S{64, 128}));
  EXPECT_EQ(w.attn.q_b_proj.shape, (S{4 * 32, 64}));
  EXPECT_EQ(w.attn.kv_a_proj_with_mqa.shape, (S{64, 128}));
  EXPECT_EQ(w.attn.kv_b_proj.shape, (S{4 * 64, 64}));
  EXPECT_EQ(w.attn.o_proj.shape, (S{128, 4 * 32}));
  EXPECT_EQ(w.indexer.wq_b.shape, (S{4 * 32, 64}));
  EXPECT_EQ(w.indexer.wk.shape, (S{32, 128}));
  EXPECT_EQ(w.indexer.weights_proj.shape, (S{4, 128}));
  EXPECT_EQ(w.indexer.compress_gate.shape, (S{32, 128}));
  EXPECT_EQ(w.indexer.compress_ape.shape, (S{4, 32}));
  EXPECT_EQ(w.moe.gate.shape, (S{8, 128}));
  EXPECT_EQ(w.moe.e_score_correction_bias.shape, (S{8}));
  EXPECT_EQ(w.moe.experts_gate.shape, (S{4, 64, 128}));
  EXPECT_EQ(w.moe.experts_down.shape, (S{4, 128, 64}));
  EXPECT_EQ(w.moe.shared_gate.shape, (S{32, 128}));
  EXPECT_EQ(w.moe.shared_down.shape, (S{128, 32}));
  EXPECT_TRUE(w.lm_head_fp8.empty());
  EXPECT_GT(w.bytes(), w.embed_tokens.bytes());
  // A plan made for another config is refused, not silently sliced.
  ModelConfig other = c;
  other.vocab = 5000;
  EXPECT_THROW(synthesize_mtp_weights(c, make_shard_plan(other, 1, 2, HeadSharding::vocab), 1), Error);
  other = c;
  other.n_routed_experts = 16;
  EXPECT_THROW(synthesize_mtp_weights(c, make_shard_plan(other, 1, 2, HeadSharding::vocab), 1), Error);
}

TEST(SyntheticWeights, DeterministicAndSeedDependent) {
  const ModelConfig c = load_model_preset("tiny");
  const ShardPlan p = make_shard_plan(c, 0, 1, HeadSharding::none);
  const MtpWeights a = synthesize_mtp_weights(c, p, 11), b = synthesize_mtp_weights(c, p, 11),
                   d = synthesize_mtp_weights(c, p, 12);
  expect_equal(a.eh_proj, b.eh_proj, "same seed");
  expect_equal(a.moe.experts_down, b.moe.experts_down, "same seed");
  size_t same = 0;
  for (size_t i = 0; i < a.eh_proj.data.size(); ++i) same += a.eh_proj.data[i].bits == d.eh_proj.data[i].bits;
  // Two independent uniform BF16 draws collide rarely (~1 in a few hundred at this scale).
  EXPECT_LT(same, a.eh_proj.data.size() / 50);
  // Tensors of the same shape under one seed are independent, not copies.
  size_t same_gate_up = 0;
  for (size_t i = 0; i < a.moe.experts_gate.data.size(); ++i)
    same_gate_up += a.moe.experts_gate.data[i].bits == a.moe.experts_up.data[i].bits;
  EXPECT_LT(same_gate_up, a.moe.experts_gate.data.size() / 50);
  EXPECT_NE(synthetic_bits(1, "a", 0), synthetic_bits(1, "a", 1));
  EXPECT_NE(synthetic_bits(1, "a", 0), synthetic_bits(1, "b", 0));
  EXPECT_NE(synthetic_bits(1, "a", 0), synthetic_bits(2, "a", 0));
}

TEST(SyntheticWeights, ScalesAreAsDocumented) {
  const ModelConfig c = load_model_preset("small");  // wide enough for tight statistics
  const MtpWeights w = synthesize_mtp_weights(c, make_shard_plan(c, 0, 4, HeadSharding::vocab), 3);
  // Sample std of n uniform draws is within a few percent for n >= 1e5 (rel. s.e. ~ 0.9/sqrt(n)).
  EXPECT_NEAR(std_of(w.eh_proj) * std::sqrt(2.0 * c.hidden), 1.0, 0.03);
  EXPECT_NEAR(std_of(w.attn.q_b_proj) * std::sqrt(double(c.q_lora_rank)), 1.0, 0.03);
  EXPECT_NEAR(std_of(w.attn.o_proj) * std::sqrt(double(c.n_heads) * c.v_head_dim), 1.0, 0.03);
  EXPECT_NEAR(std_of(w.moe.experts_down) * std::sqrt(double(c.moe_intermediate_size)), 1.0, 0.03);
  EXPECT_NEAR(std_of(w.embed_tokens), 1.0, 0.03);
  EXPECT_NEAR(mean_of(w.eh_proj), 0.0, 0.01);
  EXPECT_NEAR(mean_of(w.input_layernorm), 1.0, 0.02);
  EXPECT_NEAR(std_of(w.input_layernorm), 0.1, 0.02);
  for (const bf16 v : w.enorm.data) EXPECT_NEAR(to_float(v), 1.0, 0.18);  // uniform: |x - 1| <= sqrt(3) * 0.1

  // Logits over this rank's vocab rows, for unit-RMS inputs: std ~3 (docs/weights.md).
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  double s2 = 0;
  int64_t n = 0;
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<float> y(static_cast<size_t>(c.hidden));
    for (float& v : y) v = normal(rng);
    for (int64_t r = 0; r < w.lm_head.shape[0]; ++r, ++n) {
      double logit = 0;
      for (int64_t k = 0; k < c.hidden; ++k)
        logit += to_float(w.lm_head.data[size_t(r * c.hidden + k)]) * y[size_t(k)];
      s2 += logit * logit;
    }
  }
  EXPECT_NEAR(std::sqrt(s2 / double(n)), 3.0, 0.3);
  // The router bias is small and centred.
  double bmax = 0;
  for (const float b : w.moe.e_score_correction_bias.data) bmax = std::max(bmax, double(std::fabs(b)));
  EXPECT_LT(bmax, 0.09);
  EXPECT_GT(bmax, 0.01);
}

TEST(HeadFp8, ErrorWithinTheE4M3Bound) {
  const ModelConfig c = load_model_preset("tiny");
  MtpWeights w = synthesize_mtp_weights(c, make_shard_plan(c, 1, 2, HeadSharding::vocab), 9);
  // Make one row all zero and one row with a single huge outlier.
  std::fill_n(w.lm_head.data.begin() + 3 * c.hidden, c.hidden, bf16{});
  w.lm_head.data[size_t(5 * c.hidden + 17)] = to_bf16(-1000.0f);
  quantize_head_fp8(w);
  const Fp8Rows& q = w.lm_head_fp8;
  ASSERT_EQ(q.weight.shape, w.lm_head.shape);
  ASSERT_EQ(q.scale.shape, (std::vector<int64_t>{w.lm_head.shape[0]}));
  EXPECT_EQ(q.scale.data[3], 1.0f);
  EXPECT_EQ(q.scale.data[5], 1000.0f / 448.0f);
  EXPECT_EQ(q.weight.data[size_t(5 * c.hidden + 17)].bits, 0xfe);  // -448
  for (int64_t r = 0; r < w.lm_head.shape[0]; ++r) {
    float amax = 0;
    for (int64_t k = 0; k < c.hidden; ++k)
      amax = std::max(amax, std::fabs(to_float(w.lm_head.data[size_t(r * c.hidden + k)])));
    const float scale = q.scale.data[size_t(r)];
    if (amax > 0) {
      ASSERT_EQ(scale, amax / 448.0f) << "row " << r;
    }
    for (int64_t k = 0; k < c.hidden; ++k) {
      const float x = to_float(w.lm_head.data[size_t(r * c.hidden + k)]);
      const float deq = to_float(q.weight.data[size_t(r * c.hidden + k)]) * scale;
      // E4M3 keeps 3 mantissa bits: round-to-nearest error <= 2^-4 relative for normals, and
      // half the subnormal step (2^-10 in scaled units) near zero; plus fp32 rounding slack.
      const float bound = std::fabs(x) / 16.0f + scale / 1024.0f + 1e-6f * std::fabs(x);
      ASSERT_LE(std::fabs(deq - x), bound) << "row " << r << " col " << k << " x " << x;
    }
  }
  EXPECT_THROW(quantize_rows_fp8(w.enorm), Error);  // 1-D
}

TEST(SyntheticWeights, PartsHoldTheWholesValuesAndNothingElse) {
  const ModelConfig c = load_model_preset("tiny");
  const ShardPlan p = make_shard_plan(c, 0, 1, HeadSharding::none);
  const MtpWeights whole = synthesize_mtp_weights(c, p, 77);
  const MtpWeights trunk = synthesize_mtp_weights(c, p, 77, kEmbedPart | kHeadPart);
  EXPECT_EQ(trunk.embed_tokens.data, whole.embed_tokens.data);
  EXPECT_EQ(trunk.lm_head.data, whole.lm_head.data);
  EXPECT_TRUE(trunk.enorm.empty());
  EXPECT_TRUE(trunk.eh_proj.empty());
  EXPECT_TRUE(trunk.moe.experts_gate.empty());
  const MtpWeights layer = synthesize_mtp_weights(c, p, 77, kNormParts | kLayerPart);
  EXPECT_TRUE(layer.embed_tokens.empty());
  EXPECT_TRUE(layer.lm_head.empty());
  EXPECT_EQ(layer.shared_head_norm.data, whole.shared_head_norm.data);
  EXPECT_EQ(layer.attn.kv_b_proj.data, whole.attn.kv_b_proj.data);
  EXPECT_EQ(layer.moe.experts_down.data, whole.moe.experts_down.data);
  EXPECT_EQ(layer.indexer.compress_ape.data, whole.indexer.compress_ape.data);
  EXPECT_EQ(layer.moe.e_score_correction_bias.data, whole.moe.e_score_correction_bias.data);
  EXPECT_THROW(synthesize_mtp_weights(c, p, 77, 0), Error);
  EXPECT_THROW(synthesize_mtp_weights(c, p, 77, 16), Error);
}
