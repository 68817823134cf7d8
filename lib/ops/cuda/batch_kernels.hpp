// Host launchers of the batched kernels (lib/ops/cuda/*_batch.cu): the ops of ops.hpp's "batched
// rows" section, B rows per launch. The CudaBackend is the only caller: it validates arguments,
// owns the scratch and the stream, and passes them in here.
//
// Invariants:
// - One launch per op for all rows (the grouped experts: two, the split MLA decode: two), each
//   enqueued on ctx.stream; nothing synchronises or reads device memory on the host, so a step of
//   batched ops can be captured into a CUDA graph.
// - Slot ops read slot[b] on the device and skip a padded row (slot[b] < 0) entirely: no load of
//   its inputs, no store to its outputs or to any cache. Slots, positions, tokens, selections and
//   expert ids are trusted (a kernel cannot throw); the CPU reference checks them in tests.
// - Rounding points are the CPU reference's (lib/ops/cpu, docs/numerics.md); only summation order
//   differs (the tensor-core GEMMs sum in the MMA's order).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/kernels.hpp"
#include "ops/ops.hpp"

namespace mtplab::ops::cuda {

/// Most rows one skinny-GEMM or grouped-expert launch takes (16 column tiles of 8); the backend
/// splits larger batches into launches of this many rows.
inline constexpr int kMaxBatchRows = 128;

// ---- norm_batch.cu -----------------------------------------------------------------------------------
void embed_rmsnorm_batch(const LaunchCtx& ctx, const bf16* table, const int32_t* tokens, const int32_t* slot,
                         const bf16* w, bf16* y, int ld_y, int rows, int n, float eps);
void rmsnorm_strided(const LaunchCtx& ctx, const bf16* x, int ld_x, const bf16* w, bf16* y, int ld_y,
                     int rows, int n, float eps);
void residual_add_rmsnorm_rows(const LaunchCtx& ctx, const bf16* x, const float* delta, bf16* y,
                               const bf16* w, bf16* normed, int rows, int n, float eps);

// ---- dense_batch.cu ----------------------------------------------------------------------------------
/// The per-row best keys of head_argmax_batch (kMaxBatchRows of them, zero between launches) and
/// its completion counter: the last block turns the keys into the outputs and resets both.
struct HeadBatchScratch {
  unsigned long long* best = nullptr;
  unsigned int* counter = nullptr;
};
/// head_argmax_batch of up to kMaxBatchRows rows in one launch: the skinny GEMM (W rows x the
/// batch's rows on the tensor cores, every weight row read once) with the argmax fused.
/// k % 16 == 0; W (or W_fp8) and x 16-byte aligned.
void head_argmax_batch(const LaunchCtx& ctx, const bf16* W, const fp8e4m3* W_fp8, const float* row_scale,
                       const bf16* x, const int32_t* slot, int rows, int n, int k, int64_t index_base,
                       bf16* logits, int ld_logits, ArgMax* out, HeadExtras extras,
                       const HeadBatchScratch& s);
/// Y[b, r] = sum_j W[row(r), j] X[b, j] over the map's rows (GemvRowMap: group r / rows_per_group,
/// x row b at x + b * ldx + group * x_group_stride), BF16 (rounded once) or fp32 out at
/// y + b * ldy + r; up to kMaxBatchRows rows. The small-M tensor-core GEMM of the batched linears
/// and mla_out_v_batch. k % 16 == 0, rows_per_group % 16 == 0 (or one group), W / x 16-byte
/// aligned, ldx and x_group_stride multiples of 8.
void rows_gemm(const LaunchCtx& ctx, const bf16* W, const bf16* x, int64_t ldx, void* y, bool f32_out,
               int64_t ldy, int rows, int n, int k, const GemvRowMap& map);
/// Whether the batched linear of this shape (RowsMode::batched, rows >= 2) runs rows_gemm instead of
/// cuBLASLt: a fixed per-shape table (dense_batch.cu) from the measured comparison in
/// docs/kernels.md, so the choice is part of the code, not of the process.
bool rows_gemm_wanted(int rows, int n, int k, bool f32_out);
/// out[b] = argmax of row b (x + b * ld_x, n values): one block per row (rows = 1: the single-row
/// multi-block kernel).
/// The last launch of the cuBLASLt head (KernelPolicy::head_gemm): for each live row b (slot[b] >= 0,
/// or every row when slot is null), out[b] = pairs[b], extras' key (argmax_key) and token, and, when
/// dst is not null, row b of logits [rows][n] copied to dst + b * ld_dst. Padded rows: nothing.
void head_finish_rows(const LaunchCtx& ctx, const ArgMax* pairs, const int32_t* slot, int rows,
                      const bf16* logits, int n, bf16* dst, int ld_dst, ArgMax* out, HeadExtras extras);
void argmax_batch(const LaunchCtx& ctx, const bf16* x, int ld_x, int rows, int n, int64_t index_base,
                  ArgMax* out, const ArgmaxScratch& single_row);
void argmax_unpack_key_batch(const LaunchCtx& ctx, const uint64_t* key, int32_t* token, int rows);
void argmax_pick_batch(const LaunchCtx& ctx, const ArgMax* pairs, int n, int rows, int32_t* token);

// ---- indexer_batch.cu --------------------------------------------------------------------------------
void indexer_norm_store_batch(const LaunchCtx& ctx, const bf16* k_pre, const bf16* w, const bf16* b,
                              float eps, const float* gate, const float* ape, const int32_t* slot,
                              const int32_t* pos, int rows, const IndexerSlots& idx);
void indexer_scores_batch(const LaunchCtx& ctx, const float* q, const float* w, const int32_t* slot,
                          const int32_t* pos, int rows, const IndexerSlots& idx, float* scores, int n_heads);
void indexer_select_batch(const LaunchCtx& ctx, const float* scores, const int32_t* slot, const int32_t* pos,
                          int rows, int32_t* selection, int K, int P, int max_pools);
/// The index_share selection of each row (ops.hpp): block b copies anchor row b's pools, then the
/// rows from the anchor's tail to pos[b], then -1 up to width.
void indexer_share_select(const LaunchCtx& ctx, const int32_t* anchor, const int32_t* anchor_pos,
                          const int32_t* pos, int rows, int32_t* selection, int width, int K, int P);

// ---- mla_batch.cu ------------------------------------------------------------------------------------
void kv_norm_write_batch(const LaunchCtx& ctx, const bf16* ckv_pre, const bf16* w, float eps,
                         const int32_t* slot, const int32_t* pos, int rows, const KvSlots& kv);
void mla_absorb_q_batch(const LaunchCtx& ctx, const bf16* q, const bf16* W_kvb, bf16* q_abs, int rows,
                        int n_heads, int dqk, int dv, int kv_lora);
/// Row splits of mla_decode_batch for this batch (1: no scratch, no combine launch) and the fp32
/// scratch they need.
int mla_decode_batch_splits(const LaunchCtx& ctx, int width, int n_heads, int rows);
size_t mla_decode_batch_scratch_floats(int splits, int n_heads, int kv_lora, int rows);
/// slot == nullptr: every row reads slot 0 (the single-sequence decode's v1 path: one row, kv holding
/// that sequence's KvCache and block table).
void mla_decode_batch(const LaunchCtx& ctx, const bf16* q_abs, const int32_t* selection, int width,
                      const int32_t* slot, int rows, const KvSlots& kv, bf16* o_lat, int n_heads,
                      float softmax_scale, int splits, float* scratch);
/// o_lat[b, h] from `partials` fp32 partials [rows][n_heads][partials][2 + kv_lora] (m, l, acc), merged
/// in partial order; rows with slot[b] < 0 are skipped (slot may be nullptr: none).
void mla_combine_rows(const LaunchCtx& ctx, const float* scratch, const int32_t* slot, int rows, int partials,
                      int n_heads, int kv_lora, bf16* o_lat);
void mla_out_v_batch(const LaunchCtx& ctx, const bf16* o_lat, const bf16* W_kvb, bf16* o, int rows,
                     int n_heads, int dqk, int dv, int kv_lora);

// ---- moe_batch.cu ------------------------------------------------------------------------------------
void moe_route_batch(const LaunchCtx& ctx, const float* logits, const float* bias, const int32_t* slot,
                     int rows, int num_experts, int top_k, int n_group, int topk_group, float scaling,
                     int32_t* idx, float* weights);
/// BF16 scratch moe_experts_grouped needs for `rows` rows: one activation row per (row, route)
/// and per row for the shared expert.
size_t moe_grouped_act_elems(int rows, int top_k, int inter, int shared_inter);
/// The routed experts grouped over up to kMaxBatchRows rows (plus the shared expert), two launches
/// (docs/kernels.md, "Batched kernels"). `act` is moe_grouped_act_elems of scratch.
void moe_experts_grouped(const LaunchCtx& ctx, const bf16* x, const ExpertWeights& routed, const int32_t* idx,
                         const float* weights, const int32_t* slot, int rows, int top_k,
                         const ExpertWeights* shared, float limit, bf16* act, float* out);

// ---- sample_stats.cu ---------------------------------------------------------------------------------
/// Rows per launch pair of logit_stats_batch, and the most blocks one row's histogram is split over.
inline constexpr int kStatsRows = 128;
inline constexpr int kStatsMaxSplits = 64;
/// The scratch logit_stats_batch needs: a 65536-bin histogram per row of a launch (zero between
/// launches: zero it once when allocated, the kernels leave it zero) and the blocks' top-two keys.
size_t stats_scratch_bytes();
/// logit_stats_batch in launches of kStatsRows rows: the histogram kernel, then one block per row.
void logit_stats_batch(const LaunchCtx& ctx, const LogitRows& view, const int32_t* requested,
                       const SampleParams* params, LogitStats* out, void* scratch);
/// logit_stats_combine: one thread per row.
void logit_stats_combine(const LaunchCtx& ctx, const LogitStats* parts, int n, int rows,
                         const SampleParams* params, TokenStats* out);

}  // namespace mtplab::ops::cuda
