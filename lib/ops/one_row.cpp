// ops::OneRow: one row of one sequence through the ragged entries (one_row.hpp).
#include "ops/one_row.hpp"

namespace mtplab::ops {

namespace {
// Rows per slot of a sequence's own indexer arrays seen as a pool of one: only a bound (slot 0
// has no offset), a whole number of pools.
int indexer_rows_bound(int P) { return P * (1 << 20); }
}  // namespace

OneRow::OneRow(Backend& be) : be_(be), slot_(be, 1) { be_.fill_bytes(slot_.data(), 0, slot_.bytes()); }

void OneRow::linear_group(std::span<const LinearOut> outs, const bf16* x, int k) {
  be_.linear_rows_group(outs, x, 1, k);
}

void OneRow::embed_rmsnorm(const bf16* table, const int32_t* token, const bf16* w, bf16* y, int n,
                           float eps) {
  be_.embed_rmsnorm_batch(table, token, row(), w, y, n, n, eps);
}

void OneRow::residual_add_rmsnorm(const bf16* x, const float* delta, bf16* y, const bf16* w, bf16* normed,
                                  int n, float eps) {
  be_.residual_add_rmsnorm_rows(x, delta, y, w, normed, 1, n, eps);
}

void OneRow::kv_norm_write(const bf16* ckv_pre, const bf16* w, float eps, const int32_t* block_table,
                           const int32_t* pos, KvCache cache) {
  be_.kv_norm_write_batch(ckv_pre, w, eps, row(pos), KvSlots{cache, block_table, 1, cache.num_blocks});
}

void OneRow::indexer_norm_store(const bf16* k_pre, const bf16* w, const bf16* b, float eps, const float* gate,
                                const float* ape, const int32_t* pos, bf16* k_cache, float* gate_cache,
                                uint8_t* valid, float* pool_keys, int D, int P) {
  be_.indexer_norm_store_batch(
      k_pre, w, b, eps, gate, ape, row(pos),
      IndexerSlots{k_cache, gate_cache, valid, pool_keys, 1, indexer_rows_bound(P), D, P});
}

void OneRow::moe_route(const float* logits, const float* bias, int num_experts, int top_k, int n_group,
                       int topk_group, float scaling, int32_t* idx, float* weights) {
  be_.moe_route_batch(logits, bias, row(), num_experts, top_k, n_group, topk_group, scaling, idx, weights);
}

void OneRow::moe_experts(const bf16* x, const ExpertWeights& w, const int32_t* idx, const float* weights,
                         int top_k, float limit, float* out) {
  be_.moe_experts_grouped(x, w, idx, weights, row(), top_k, nullptr, limit, out);
}

void OneRow::moe_experts_shared(const bf16* x, const ExpertWeights& routed, const int32_t* idx,
                                const float* weights, int top_k, const ExpertWeights& shared, float limit,
                                float* out) {
  be_.moe_experts_grouped(x, routed, idx, weights, row(), top_k, &shared, limit, out);
}

void OneRow::mla_absorb_q(const bf16* q, const bf16* W_kvb, bf16* q_abs, int n_heads, int dqk, int dv,
                          int kv_lora) {
  be_.mla_absorb_q_batch(q, W_kvb, q_abs, 1, n_heads, dqk, dv, kv_lora);
}

void OneRow::mla_out_v(const bf16* o_lat, const bf16* W_kvb, bf16* o, int n_heads, int dqk, int dv,
                       int kv_lora) {
  be_.mla_out_v_batch(o_lat, W_kvb, o, 1, n_heads, dqk, dv, kv_lora);
}

void OneRow::mla_decode(const bf16* q_abs, const int32_t* selection, int width, const int32_t* block_table,
                        KvCache cache, bf16* o_lat, int n_heads, float softmax_scale) {
  be_.mla_decode_batch(q_abs, selection, width, row(), KvSlots{cache, block_table, 1, cache.num_blocks},
                       o_lat, n_heads, softmax_scale);
}

}  // namespace mtplab::ops
