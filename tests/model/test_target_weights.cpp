// The target's weights (lib/model/weights.hpp, docs/target.md): synthetic layers hold the values
// of the MTP block under the same seed (what keeps the synthetic traces' bits), a dense layer has
// the dense MLP and no experts, a checkpoint written under the trunk's names loads back at one and
// two ranks as the synthetic shards, and a missing or misshapen tensor is an error naming the
// tensor and the file.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "common/error_of.hpp"
#include "common/temp_dir.hpp"
#include "model/config.hpp"
#include "model/safetensors.hpp"
#include "model/sharding.hpp"
#include "model/weights.hpp"
#include "weights_compare.hpp"

using namespace mtplab;
using namespace mtplab::model;
using test::error_of;
using test::expect_has;

namespace {

/// The tiny preset with a trunk of 45 layers whose first two have a dense MLP of 256 columns.
ModelConfig dense_tiny(int dense = 2) {
  ModelConfig cfg = load_model_preset("tiny");
  cfg.first_k_dense_replace = dense;
  EXPECT_EQ(cfg.intermediate_size, 256);
  EXPECT_EQ(cfg.num_hidden_layers, 45);
  return cfg;
}

std::set<std::string> names_of(const std::vector<TensorView>& views) {
  std::set<std::string> names;
  for (const TensorView& v : views) EXPECT_TRUE(names.insert(v.name).second) << "twice: " << v.name;
  return names;
}

}  // namespace

// Layer i of the synthetic target is the MTP block's tensors under seed target_seed + 1 + i, its
// final norm the MTP shared_head.norm under target_seed, its embedding and head the MTP weights'
// under weight_seed: the scheme the synthetic traces were made with.
TEST(TargetWeights, SyntheticLayersAreTheMtpBlockUnderTheSameSeed) {
  const ModelConfig cfg = dense_tiny(1);
  for (int world : {1, 2}) {
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE(str("rank ", rank, " of ", world));
      const ShardPlan plan = make_shard_plan(cfg, rank, world, HeadSharding::vocab);
      const TargetWeights t = synthesize_target_weights(cfg, plan, 3, 7, 5);
      ASSERT_EQ(t.layers.size(), 3u);
      const MtpWeights trunk = synthesize_mtp_weights(cfg, plan, 7, kEmbedPart | kHeadPart);
      test_util::expect_same_tensor(t.embed_tokens, trunk.embed_tokens, "embed_tokens");
      test_util::expect_same_tensor(t.lm_head, trunk.lm_head, "lm_head");
      const MtpWeights norms = synthesize_mtp_weights(cfg, plan, 5, kNormParts);
      test_util::expect_same_tensor(t.final_norm, norms.shared_head_norm, "final_norm");
      for (int i = 1; i < 3; ++i) {  // the routed-expert layers: every block tensor of the MTP weights
        const LayerWeights& l = t.layers[static_cast<size_t>(i)];
        EXPECT_FALSE(l.dense);
        EXPECT_EQ(l.index, i);
        const MtpWeights m =
            synthesize_mtp_weights(cfg, plan, 5 + 1 + static_cast<uint64_t>(i), kNormParts | kLayerPart);
        LayerWeights as_layer;
        as_layer.index = i;
        as_layer.input_layernorm = m.input_layernorm;
        as_layer.post_attention_layernorm = m.post_attention_layernorm;
        as_layer.attn = m.attn;
        as_layer.indexer = m.indexer;
        as_layer.moe = m.moe;
        test_util::expect_same_layer(l, as_layer, str("layer ", i));
      }
      // The dense layer: the same attention as an MTP block under its seed, a dense MLP of this
      // rank's columns, no router and no experts.
      const LayerWeights& d = t.layers[0];
      EXPECT_TRUE(d.dense);
      const MtpWeights m0 = synthesize_mtp_weights(cfg, plan, 6, kLayerPart);
      test_util::expect_same_tensor(d.attn.o_proj, m0.attn.o_proj, "o_proj");
      test_util::expect_same_tensor(d.indexer.wq_b, m0.indexer.wq_b, "indexer.wq_b");
      EXPECT_TRUE(d.moe.gate.empty() && d.moe.experts_gate.empty() && d.moe.shared_gate.empty());
      EXPECT_EQ(d.mlp.gate_proj.shape, (std::vector<int64_t>{plan.dense_inter.count, cfg.hidden}));
      EXPECT_EQ(d.mlp.down_proj.shape, (std::vector<int64_t>{cfg.hidden, plan.dense_inter.count}));
      EXPECT_EQ(plan.dense_inter.count, 256 / world);
    }
  }
  // A shard's dense MLP is the slice of the whole one (values are a function of seed, name, index).
  const LayerWeights whole =
      synthesize_layer_weights(cfg, make_shard_plan(cfg, 0, 1, HeadSharding::none), 0, 6);
  const LayerWeights half =
      synthesize_layer_weights(cfg, make_shard_plan(cfg, 1, 2, HeadSharding::none), 0, 6);
  const size_t H = static_cast<size_t>(cfg.hidden);
  for (size_t r = 0; r < 128; ++r)
    for (size_t c = 0; c < H; ++c)
      ASSERT_EQ(half.mlp.gate_proj.data[r * H + c].bits, whole.mlp.gate_proj.data[(128 + r) * H + c].bits);
  for (size_t r = 0; r < H; ++r)
    for (size_t c = 0; c < 128; ++c)
      ASSERT_EQ(half.mlp.down_proj.data[r * 128 + c].bits, whole.mlp.down_proj.data[r * 256 + 128 + c].bits);
}

// The checkpoint names: the trunk under checkpoint.layers_prefix, the final norm as
// checkpoint.final_norm; a written checkpoint loads back, whole and as two ranks' shards.
TEST(TargetWeights, CheckpointNamesLoadBackAtOneAndTwoRanks) {
  const ModelConfig cfg = dense_tiny(1);
  test::TempDir tmp("mtplab-target-weights");
  const TargetWeights whole =
      synthesize_target_weights(cfg, make_shard_plan(cfg, 0, 1, HeadSharding::none), 2, 7, 5);
  const std::vector<TensorView> views = target_checkpoint_views(cfg, whole);
  const std::set<std::string> names = names_of(views);
  for (const char* n :
       {"model.language_model.embed_tokens.weight", "lm_head.weight", "model.language_model.norm.weight",
        "model.language_model.layers.0.input_layernorm.weight",
        "model.language_model.layers.0.self_attn.indexer.index_kpool_compress_ape",
        "model.language_model.layers.0.mlp.gate_proj.weight",
        "model.language_model.layers.0.mlp.up_proj.weight",
        "model.language_model.layers.0.mlp.down_proj.weight", "model.language_model.layers.1.mlp.gate.weight",
        "model.language_model.layers.1.mlp.gate.e_score_correction_bias",
        "model.language_model.layers.1.mlp.experts.7.down_proj.weight",
        "model.language_model.layers.1.mlp.shared_experts.up_proj.weight"})
    EXPECT_TRUE(names.count(n)) << n;
  for (const char* n :
       {"model.language_model.layers.0.mlp.gate.weight",
        "model.language_model.layers.0.mlp.experts.0.gate_proj.weight",
        "model.language_model.layers.1.mlp.gate_proj.weight", "model.language_model.layers.0.eh_proj.weight",
        "model.language_model.layers.0.shared_head.norm.weight"})
    EXPECT_FALSE(names.count(n)) << n;
  // 3 trunk tensors; per layer 2 norms + 14 attention / indexer, then 3 (dense) or 2 + 24 + 3.
  EXPECT_EQ(views.size(), 3u + 16 + 3 + 16 + 2 + 3 * 8 + 3);

  const std::string file = tmp / "target.safetensors";
  write_safetensors(file, views);
  for (int world : {1, 2})
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE(str("rank ", rank, " of ", world));
      const ShardPlan plan = make_shard_plan(cfg, rank, world, HeadSharding::vocab);
      test_util::expect_same_target(load_target_weights(cfg, plan, 2, file),
                                    synthesize_target_weights(cfg, plan, 2, 7, 5));
    }
  // Fewer layers than the checkpoint holds: the first ones.
  const TargetWeights one = load_target_weights(cfg, make_shard_plan(cfg, 0, 1, HeadSharding::none), 1, file);
  ASSERT_EQ(one.layers.size(), 1u);
  test_util::expect_same_layer(one.layers[0], whole.layers[0], "layer 0");
  // More than the model has.
  expect_has(
      error_of([&] { load_target_weights(cfg, make_shard_plan(cfg, 0, 1, HeadSharding::none), 46, file); }),
      "46 layers of a model whose trunk has 45 (num_hidden_layers)");
}

TEST(TargetWeights, MissingOrMisshapenTensorsNameTheTensorAndTheFile) {
  const ModelConfig cfg = dense_tiny(1);
  test::TempDir tmp("mtplab-target-weights");
  const TargetWeights whole =
      synthesize_target_weights(cfg, make_shard_plan(cfg, 0, 1, HeadSharding::none), 2, 7, 5);
  const ShardPlan plan = make_shard_plan(cfg, 0, 1, HeadSharding::none);
  for (const std::string missing :
       {"model.language_model.layers.1.self_attn.o_proj.weight",
        "model.language_model.layers.0.mlp.down_proj.weight", "model.language_model.norm.weight"}) {
    SCOPED_TRACE(missing);
    std::vector<TensorView> views = target_checkpoint_views(cfg, whole);
    views.erase(
        std::remove_if(views.begin(), views.end(), [&](const TensorView& v) { return v.name == missing; }),
        views.end());
    const std::string file = tmp / "missing.safetensors";
    write_safetensors(file, views);
    const std::string msg = error_of([&] { load_target_weights(cfg, plan, 2, file); });
    expect_has(msg, "tensor \"" + missing + "\" not found");
    expect_has(msg, file);
  }
  // A dense layer where the config says routed experts: its router is missing.
  {
    const std::string file = tmp / "dense.safetensors";
    write_safetensors(file, target_checkpoint_views(cfg, whole));
    ModelConfig moe_cfg = cfg;
    moe_cfg.first_k_dense_replace = 0;
    expect_has(error_of([&] {
                 load_target_weights(moe_cfg, make_shard_plan(moe_cfg, 0, 1, HeadSharding::none), 1, file);
               }),
               "tensor \"model.language_model.layers.0.mlp.gate.weight\" not found");
  }
  // A misshapen dense MLP: the error names the tensor, its file and both shapes.
  {
    ModelConfig narrow = cfg;
    narrow.intermediate_size = 128;
    const TargetWeights small =
        synthesize_target_weights(narrow, make_shard_plan(narrow, 0, 1, HeadSharding::none), 1, 7, 5);
    const std::string file = tmp / "narrow.safetensors";
    write_safetensors(file, target_checkpoint_views(narrow, small));
    const std::string msg = error_of([&] { load_target_weights(cfg, plan, 1, file); });
    expect_has(msg, "model.language_model.layers.0.mlp.gate_proj.weight");
    expect_has(msg, file);
    expect_has(msg, "expected shape [256, 128], found [128, 128]");
  }
}

// A checkpoint in another layout: the names follow the config's layers_prefix and final_norm.
TEST(TargetWeights, NamesFollowTheConfig) {
  ModelConfig cfg = dense_tiny(0);
  cfg.layers_prefix = "model.layers.";
  cfg.final_norm_name = "model.norm.weight";
  cfg.embed_tokens_name = "model.embed_tokens.weight";
  cfg.lm_head_name = cfg.embed_tokens_name;  // tied: one tensor
  const TargetWeights w =
      synthesize_target_weights(cfg, make_shard_plan(cfg, 0, 1, HeadSharding::none), 1, 7, 5);
  const std::set<std::string> names = names_of(target_checkpoint_views(cfg, w));
  EXPECT_TRUE(names.count("model.layers.0.mlp.experts.3.up_proj.weight"));
  EXPECT_TRUE(names.count("model.norm.weight"));
  EXPECT_TRUE(names.count("model.embed_tokens.weight"));
  EXPECT_FALSE(names.count("lm_head.weight"));
}
