#include "drafter/factory.hpp"

#include "core/error.hpp"

namespace mtplab::drafter {

namespace {

/// The attention and MoE tensors (shared by the MTP layer and a trunk layer).
void upload_attention_moe(ops::Backend& be, const model::AttentionWeights& attn,
                          const model::IndexerWeights& idx, const model::MoeWeights& moe,
                          const model::ShardPlan& plan, BlockWeights& b) {
  b.q_a = upload(be, attn.q_a_proj);
  b.q_a_norm = upload(be, attn.q_a_layernorm);
  b.q_b = upload(be, attn.q_b_proj);
  b.kv_a = upload(be, attn.kv_a_proj_with_mqa);
  b.kv_a_norm = upload(be, attn.kv_a_layernorm);
  b.kv_b = upload(be, attn.kv_b_proj);
  b.o_proj = upload(be, attn.o_proj);
  b.idx_wq_b = upload(be, idx.wq_b);
  b.idx_wk = upload(be, idx.wk);
  b.idx_k_norm_w = upload(be, idx.k_norm_weight);
  b.idx_k_norm_b = upload(be, idx.k_norm_bias);
  b.idx_weights_proj = upload(be, idx.weights_proj);
  b.idx_gate = upload(be, idx.compress_gate);
  b.idx_ape = upload(be, idx.compress_ape);
  b.router = upload(be, moe.gate);
  b.router_bias = upload(be, moe.e_score_correction_bias);
  b.exp_gate = upload(be, moe.experts_gate);
  b.exp_up = upload(be, moe.experts_up);
  b.exp_down = upload(be, moe.experts_down);
  b.first_expert = static_cast<int>(plan.experts.begin);
  b.num_local_experts = static_cast<int>(plan.experts.count);
  b.sh_gate = upload(be, moe.shared_gate);
  b.sh_up = upload(be, moe.shared_up);
  b.sh_down = upload(be, moe.shared_down);
}

}  // namespace

BlockWeights upload_block_weights(ops::Backend& be, const model::LayerWeights& w) {
  BlockWeights b;
  b.input_norm = upload(be, w.input_layernorm);
  b.post_norm = upload(be, w.post_attention_layernorm);
  upload_attention_moe(be, w.attn, w.indexer, w.moe, w.plan, b);
  if (w.dense) {
    b.num_local_experts = 0;
    b.mlp_gate = upload(be, w.mlp.gate_proj);
    b.mlp_up = upload(be, w.mlp.up_proj);
    b.mlp_down = upload(be, w.mlp.down_proj);
  }
  return b;
}

BlockWeights upload_block_weights(ops::Backend& be, const model::MtpWeights& w) {
  BlockWeights b;
  b.input_norm = upload(be, w.input_layernorm);
  b.post_norm = upload(be, w.post_attention_layernorm);
  upload_attention_moe(be, w.attn, w.indexer, w.moe, w.plan, b);
  return b;
}

std::unique_ptr<MtpDrafter> make_drafter(ops::Backend& be, dist::Communicator* comm,
                                         const model::ModelConfig& cfg, model::MtpWeights& w,
                                         const DrafterOptions& options) {
  const int world = comm ? comm->size() : 1;
  const int rank = comm ? comm->rank() : 0;
  MTP_REQUIRE(w.plan.world == world && w.plan.rank == rank, "drafter: weights were sharded for rank ",
              w.plan.rank, " of ", w.plan.world, " but this is rank ", rank, " of ", world);
  MTP_REQUIRE(w.plan.head_sharding == options.head_sharding,
              "drafter: weights were sharded for head_sharding ", model::to_string(w.plan.head_sharding),
              " but the options say ", model::to_string(options.head_sharding));
  BlockDims dims = block_dims(cfg, world, rank, options.kv_cache_dtype);
  dims.n_heads_local = static_cast<int>(w.plan.heads.count);
  dims.shared_inter_local =
      static_cast<int>(w.moe.shared_gate.shape.empty() ? 0 : w.moe.shared_gate.shape[0]);
  const VocabShard shard = vocab_shard(w.plan);
  if (options.head_fp8 && w.lm_head_fp8.empty()) model::quantize_head_fp8(w);
  FrontWeights f;
  f.embed = upload(be, w.embed_tokens);
  f.enorm = upload(be, w.enorm);
  f.hnorm = upload(be, w.hnorm);
  f.eh_proj = upload(be, w.eh_proj);
  f.shared_head_norm = upload(be, w.shared_head_norm);
  f.lm_head = upload(be, w.lm_head);
  if (options.head_fp8) {
    f.lm_head_fp8 = upload(be, w.lm_head_fp8.weight);
    f.lm_head_scale = upload(be, w.lm_head_fp8.scale);
  }
  return std::make_unique<MtpDrafter>(be, comm, cfg, dims, std::move(f), upload_block_weights(be, w), shard,
                                      options);
}

}  // namespace mtplab::drafter
