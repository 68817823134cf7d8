// One row of one sequence through the ragged entries of ops::Backend: the single-row forms that
// tests, benchmarks and the reference checks state their cases in. The backend has one entry per
// op, taking ragged rows (ops.hpp); a OneRow is a batch of one row, its sequence's caches given as
// slot 0 of a pool of one (its own block table, its own indexer arrays), so each call here is
// exactly the ragged op on that row (on CUDA the dispatch runs the kernels it picks at one row).
// A OneRow owns a backend int32 holding 0 (the row's slot): make it outside a graph capture.
#pragma once
#include <cstdint>
#include <span>

#include "ops/ops.hpp"

namespace mtplab::ops {

class OneRow {
 public:
  explicit OneRow(Backend& be);
  /// linear_rows_group of one row.
  void linear_group(std::span<const LinearOut> outs, const bf16* x, int k);
  /// embed_rmsnorm_batch of one row: y = rmsnorm(table[token[0]]).
  void embed_rmsnorm(const bf16* table, const int32_t* token, const bf16* w, bf16* y, int n, float eps);
  /// residual_add_rmsnorm_rows of one row.
  void residual_add_rmsnorm(const bf16* x, const float* delta, bf16* y, const bf16* w, bf16* normed, int n,
                            float eps);
  /// kv_norm_write_batch of one row at pos[0] through `block_table` (cache.num_blocks entries at most).
  void kv_norm_write(const bf16* ckv_pre, const bf16* w, float eps, const int32_t* block_table,
                     const int32_t* pos, KvCache cache);
  /// indexer_norm_store_batch of one row at pos[0] into one sequence's arrays (indexer_store's).
  void indexer_norm_store(const bf16* k_pre, const bf16* w, const bf16* b, float eps, const float* gate,
                          const float* ape, const int32_t* pos, bf16* k_cache, float* gate_cache,
                          uint8_t* valid, float* pool_keys, int D, int P);
  /// moe_route_batch of one row.
  void moe_route(const float* logits, const float* bias, int num_experts, int top_k, int n_group,
                 int topk_group, float scaling, int32_t* idx, float* weights);
  /// moe_experts_grouped of one row, without and with the shared expert.
  void moe_experts(const bf16* x, const ExpertWeights& w, const int32_t* idx, const float* weights, int top_k,
                   float limit, float* out);
  void moe_experts_shared(const bf16* x, const ExpertWeights& routed, const int32_t* idx,
                          const float* weights, int top_k, const ExpertWeights& shared, float limit,
                          float* out);
  /// mla_absorb_q_batch, mla_out_v_batch of one row.
  void mla_absorb_q(const bf16* q, const bf16* W_kvb, bf16* q_abs, int n_heads, int dqk, int dv, int kv_lora);
  void mla_out_v(const bf16* o_lat, const bf16* W_kvb, bf16* o, int n_heads, int dqk, int dv, int kv_lora);
  /// mla_decode_batch of one row through `block_table` (cache.num_blocks entries at most).
  void mla_decode(const bf16* q_abs, const int32_t* selection, int width, const int32_t* block_table,
                  KvCache cache, bf16* o_lat, int n_heads, float softmax_scale);

 private:
  RowBatch row(const int32_t* pos = nullptr) const { return RowBatch{slot_.data(), pos, 1, 1}; }
  Backend& be_;
  Array<int32_t> slot_;
};

}  // namespace mtplab::ops
