// Test helpers: every tensor of two MtpWeights (or two TargetWeights), bit for bit.
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "model/weights.hpp"

namespace mtplab::model::test_util {

template <typename T>
void expect_same_tensor(const HostTensor<T>& a, const HostTensor<T>& b, const std::string& what) {
  ASSERT_EQ(a.shape, b.shape) << what;
  ASSERT_EQ(a.data.size(), b.data.size()) << what;
  for (size_t i = 0; i < a.data.size(); ++i)
    ASSERT_EQ(std::memcmp(&a.data[i], &b.data[i], sizeof(T)), 0) << what << " element " << i;
}

inline void expect_same_weights(const MtpWeights& a, const MtpWeights& b) {
  expect_same_tensor(a.embed_tokens, b.embed_tokens, "embed_tokens");
  expect_same_tensor(a.lm_head, b.lm_head, "lm_head");
  expect_same_tensor(a.enorm, b.enorm, "enorm");
  expect_same_tensor(a.hnorm, b.hnorm, "hnorm");
  expect_same_tensor(a.eh_proj, b.eh_proj, "eh_proj");
  expect_same_tensor(a.input_layernorm, b.input_layernorm, "input_layernorm");
  expect_same_tensor(a.post_attention_layernorm, b.post_attention_layernorm, "post_attention_layernorm");
  expect_same_tensor(a.shared_head_norm, b.shared_head_norm, "shared_head_norm");
  expect_same_tensor(a.attn.q_a_proj, b.attn.q_a_proj, "q_a_proj");
  expect_same_tensor(a.attn.q_a_layernorm, b.attn.q_a_layernorm, "q_a_layernorm");
  expect_same_tensor(a.attn.q_b_proj, b.attn.q_b_proj, "q_b_proj");
  expect_same_tensor(a.attn.kv_a_proj_with_mqa, b.attn.kv_a_proj_with_mqa, "kv_a_proj_with_mqa");
  expect_same_tensor(a.attn.kv_a_layernorm, b.attn.kv_a_layernorm, "kv_a_layernorm");
  expect_same_tensor(a.attn.kv_b_proj, b.attn.kv_b_proj, "kv_b_proj");
  expect_same_tensor(a.attn.o_proj, b.attn.o_proj, "o_proj");
  expect_same_tensor(a.indexer.wq_b, b.indexer.wq_b, "indexer.wq_b");
  expect_same_tensor(a.indexer.wk, b.indexer.wk, "indexer.wk");
  expect_same_tensor(a.indexer.k_norm_weight, b.indexer.k_norm_weight, "indexer.k_norm_weight");
  expect_same_tensor(a.indexer.k_norm_bias, b.indexer.k_norm_bias, "indexer.k_norm_bias");
  expect_same_tensor(a.indexer.weights_proj, b.indexer.weights_proj, "indexer.weights_proj");
  expect_same_tensor(a.indexer.compress_gate, b.indexer.compress_gate, "indexer.compress_gate");
  expect_same_tensor(a.indexer.compress_ape, b.indexer.compress_ape, "indexer.compress_ape");
  expect_same_tensor(a.moe.gate, b.moe.gate, "moe.gate");
  expect_same_tensor(a.moe.e_score_correction_bias, b.moe.e_score_correction_bias,
                     "moe.e_score_correction_bias");
  expect_same_tensor(a.moe.experts_gate, b.moe.experts_gate, "moe.experts_gate");
  expect_same_tensor(a.moe.experts_up, b.moe.experts_up, "moe.experts_up");
  expect_same_tensor(a.moe.experts_down, b.moe.experts_down, "moe.experts_down");
  expect_same_tensor(a.moe.shared_gate, b.moe.shared_gate, "moe.shared_gate");
  expect_same_tensor(a.moe.shared_up, b.moe.shared_up, "moe.shared_up");
  expect_same_tensor(a.moe.shared_down, b.moe.shared_down, "moe.shared_down");
}

inline void expect_same_layer(const LayerWeights& a, const LayerWeights& b, const std::string& layer) {
  ASSERT_EQ(a.index, b.index) << layer;
  ASSERT_EQ(a.dense, b.dense) << layer;
  const std::string p = layer + " ";
  expect_same_tensor(a.input_layernorm, b.input_layernorm, p + "input_layernorm");
  expect_same_tensor(a.post_attention_layernorm, b.post_attention_layernorm, p + "post_attention_layernorm");
  expect_same_tensor(a.attn.q_a_proj, b.attn.q_a_proj, p + "q_a_proj");
  expect_same_tensor(a.attn.q_a_layernorm, b.attn.q_a_layernorm, p + "q_a_layernorm");
  expect_same_tensor(a.attn.q_b_proj, b.attn.q_b_proj, p + "q_b_proj");
  expect_same_tensor(a.attn.kv_a_proj_with_mqa, b.attn.kv_a_proj_with_mqa, p + "kv_a_proj_with_mqa");
  expect_same_tensor(a.attn.kv_a_layernorm, b.attn.kv_a_layernorm, p + "kv_a_layernorm");
  expect_same_tensor(a.attn.kv_b_proj, b.attn.kv_b_proj, p + "kv_b_proj");
  expect_same_tensor(a.attn.o_proj, b.attn.o_proj, p + "o_proj");
  expect_same_tensor(a.indexer.wq_b, b.indexer.wq_b, p + "indexer.wq_b");
  expect_same_tensor(a.indexer.wk, b.indexer.wk, p + "indexer.wk");
  expect_same_tensor(a.indexer.k_norm_weight, b.indexer.k_norm_weight, p + "indexer.k_norm_weight");
  expect_same_tensor(a.indexer.k_norm_bias, b.indexer.k_norm_bias, p + "indexer.k_norm_bias");
  expect_same_tensor(a.indexer.weights_proj, b.indexer.weights_proj, p + "indexer.weights_proj");
  expect_same_tensor(a.indexer.compress_gate, b.indexer.compress_gate, p + "indexer.compress_gate");
  expect_same_tensor(a.indexer.compress_ape, b.indexer.compress_ape, p + "indexer.compress_ape");
  expect_same_tensor(a.moe.gate, b.moe.gate, p + "moe.gate");
  expect_same_tensor(a.moe.e_score_correction_bias, b.moe.e_score_correction_bias,
                     p + "moe.e_score_correction_bias");
  expect_same_tensor(a.moe.experts_gate, b.moe.experts_gate, p + "moe.experts_gate");
  expect_same_tensor(a.moe.experts_up, b.moe.experts_up, p + "moe.experts_up");
  expect_same_tensor(a.moe.experts_down, b.moe.experts_down, p + "moe.experts_down");
  expect_same_tensor(a.moe.shared_gate, b.moe.shared_gate, p + "moe.shared_gate");
  expect_same_tensor(a.moe.shared_up, b.moe.shared_up, p + "moe.shared_up");
  expect_same_tensor(a.moe.shared_down, b.moe.shared_down, p + "moe.shared_down");
  expect_same_tensor(a.mlp.gate_proj, b.mlp.gate_proj, p + "mlp.gate_proj");
  expect_same_tensor(a.mlp.up_proj, b.mlp.up_proj, p + "mlp.up_proj");
  expect_same_tensor(a.mlp.down_proj, b.mlp.down_proj, p + "mlp.down_proj");
}

inline void expect_same_target(const TargetWeights& a, const TargetWeights& b) {
  expect_same_tensor(a.embed_tokens, b.embed_tokens, "embed_tokens");
  expect_same_tensor(a.lm_head, b.lm_head, "lm_head");
  expect_same_tensor(a.final_norm, b.final_norm, "final_norm");
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t i = 0; i < a.layers.size(); ++i)
    expect_same_layer(a.layers[i], b.layers[i], "layer " + std::to_string(i));
}

}  // namespace mtplab::model::test_util
