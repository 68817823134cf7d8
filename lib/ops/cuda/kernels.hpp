// Host launchers of the CUDA kernels (lib/ops/cuda/*.cu). The CudaBackend is the only caller:
// it validates arguments, owns the scratch buffers and the stream, and passes them in here.
//
// Invariants:
// - Every launcher only enqueues on `ctx.stream` and checks the launch; none synchronises or
//   reads device memory on the host, so each op can be captured into a CUDA graph.
// - Positions, tokens, expert ids and selections are read on the device.
// - Rounding points are those of the CPU reference (lib/ops/cpu, docs/numerics.md): fp32
//   accumulation, one BF16 rounding per stated output; only summation order differs.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "ops/kernel_policy.hpp"
#include "ops/ops.hpp"

namespace mtplab::ops::cuda {

/// What every launcher reads: the stream, the device's size, the backend's kernel policy (the only
/// source of a launcher's kernel choice) and whether a graph is being recorded.
struct LaunchCtx {
  cudaStream_t stream = nullptr;
  int num_sms = 1;
  /// The backend's kernel choices (Backend::set_kernel_policy).
  KernelPolicy policy;
  /// The device supports programmatic dependent launch (sm_90 and later).
  bool pdl_capable = false;
  /// Set between begin_capture and end_capture.
  bool capturing = false;
  /// Launch with programmatic stream serialization (launch.cuh): the next kernel is scheduled
  /// while this one runs and waits at its start for this one's writes. Eager launches only: in a
  /// captured graph it measured slower (docs/kernels.md). policy.pdl = off turns it off.
  bool pdl() const { return policy.pdl && pdl_capable && !capturing; }
};

/// Per-block partial keys plus a self-resetting completion counter: the last block of a
/// multi-block argmax reduces the partials and writes the result (one launch, no memset).
struct ArgmaxScratch {
  unsigned long long* partials = nullptr;
  int capacity = 0;
  unsigned int* counter = nullptr;  ///< zero between launches (the last block resets it)
};

/// Output row r reads W row (r / rows_per_group) * group_stride_rows + row_offset + r % rows_per_group
/// and x + (r / rows_per_group) * x_group_stride. A plain GEMV is one group of n rows; mla_out_v is
/// n_heads groups of dv rows inside W_kvb.
struct GemvRowMap {
  int rows_per_group = 0;
  int64_t group_stride_rows = 0;
  int64_t row_offset = 0;
  int64_t x_group_stride = 0;
};

// ---- kernels_gemv.cu ----------------------------------------------------------------------------
/// Largest grid any GEMV / argmax launch uses (so ArgmaxScratch::capacity can be sized once).
int gemv_max_grid(int num_sms);

// The GEMV launchers take their kernel from ctx.policy.gemv_variant (ops::GemvVariant,
// ops/kernel_policy.hpp): automatic is chosen per shape (a table in kernels_gemv.cu); rows2, rows4
// and occ give the same bits as v1 (same k-split, each lane's chunks of a row summed in ascending
// order) and run v1 on shapes they do not cover; fp8split gives FP8 rows the k-split of BF16 rows of
// the same length (not v1's bits) and runs v1 for BF16. ctx.policy.gemv_split, when not 0, forces
// the k-split of every GEMV and of linear_group's outputs. linear_group is not affected by the
// variant.

/// y[r] = sum_j W[row(r), j] x[j]; y BF16 (rounded) or fp32. k % 8 == 0, 16-byte aligned rows.
void gemv_bf16(const LaunchCtx& ctx, const bf16* W, const bf16* x, void* y, bool f32_out, int n, int k,
               const GemvRowMap& map);
/// Several BF16 GEMVs of the same x in one launch (ops::Backend::linear_group). Each output's rows
/// are computed with the k-split its own gemv_bf16 launch would choose, so every output is
/// bit-identical to that launch (fp32 outputs then times f32_scale, as scale_f32).
void gemv_group(const LaunchCtx& ctx, std::span<const LinearOut> outs, const bf16* x, int k);
/// y[r] = bf16(scale[r] * sum_j W[r, j] x[j]) with FP8 E4M3 W. k % 16 == 0.
void gemv_fp8(const LaunchCtx& ctx, const fp8e4m3* W, const float* row_scale, const bf16* x, bf16* y, int n,
              int k);
/// GEMV (BF16 W, or FP8 W with row scales when W_fp8 != null) fused with the argmax of the
/// BF16-rounded logits; one launch (last-block reduction).
void head_argmax(const LaunchCtx& ctx, const bf16* W, const fp8e4m3* W_fp8, const float* row_scale,
                 const bf16* x, int n, int k, int64_t index_base, bf16* logits, ArgMax* out,
                 HeadExtras extras, const ArgmaxScratch& scratch);
void argmax(const LaunchCtx& ctx, const bf16* x, int n, int64_t index_base, ArgMax* out,
            const ArgmaxScratch& scratch);
void argmax_pack_key(const LaunchCtx& ctx, const ArgMax* in, uint64_t* key);
void argmax_unpack_key(const LaunchCtx& ctx, const uint64_t* key, int32_t* token);
void argmax_pick(const LaunchCtx& ctx, const ArgMax* pairs, int n, int32_t* token);
/// Routed experts in two launches (gate/up + activation, then down + weighted combine), expert
/// ids read on the device; with `shared`, the shared expert's rows run in the same two launches
/// as one more slot of weight 1, added last. `act` is scratch of top_k * inter (+ shared->inter)
/// BF16.
void moe_experts(const LaunchCtx& ctx, const bf16* x, const ExpertWeights& w, const int32_t* idx,
                 const float* weights, int top_k, float limit, bf16* act, float* out,
                 const ExpertWeights* shared = nullptr);

// ---- kernels_mla.cu -----------------------------------------------------------------------------
void mla_absorb_q(const LaunchCtx& ctx, const bf16* q, const bf16* W_kvb, bf16* q_abs, int n_heads, int dqk,
                  int dv, int kv_lora);
/// The sparse MLA decode's kernels (docs/kernels.md), by ctx.policy.mla_decode: v1, a block per two
/// or more chunks of 16 rows and a combine over every split; v2 (the default), longer splits
/// streamed through cp.async and merged per cluster of 8 over distributed shared memory
/// (ctx.policy.mla_clusters, when not 0, forces the clusters per head tile). The splits, the scratch
/// and mla_decode must be computed under the same policy.
/// Number of row splits mla_decode uses, and the fp32 scratch it needs for them.
int mla_decode_splits(const LaunchCtx& ctx, int width, int n_heads);
size_t mla_decode_scratch_floats(const LaunchCtx& ctx, int splits, int n_heads, int kv_lora);
void mla_decode(const LaunchCtx& ctx, const bf16* q_abs, const int32_t* selection, int width,
                const int32_t* block_table, const KvCache& cache, bf16* o_lat, int n_heads,
                float softmax_scale, int splits, float* scratch);
void kv_write(const LaunchCtx& ctx, const bf16* c_kv, const int32_t* block_table, const int32_t* pos,
              const KvCache& cache);

// ---- kernels_small.cu ---------------------------------------------------------------------------
void rmsnorm(const LaunchCtx& ctx, const bf16* x, const bf16* w, bf16* y, int rows, int n, float eps);
void embed_rmsnorm(const LaunchCtx& ctx, const bf16* table, const int32_t* token, const bf16* w, bf16* y,
                   int n, float eps);
void layernorm(const LaunchCtx& ctx, const bf16* x, const bf16* w, const bf16* b, bf16* y, int rows, int n,
               float eps);
void residual_add(const LaunchCtx& ctx, const bf16* x, const float* delta, bf16* y, int n);
/// residual_add then rmsnorm in one block: the rmsnorm kernel's thread layout and reduction.
void residual_add_rmsnorm(const LaunchCtx& ctx, const bf16* x, const float* delta, bf16* y, const bf16* w,
                          bf16* normed, int n, float eps);
void add(const LaunchCtx& ctx, const bf16* a, const bf16* b, bf16* y, int n);
void to_bf16(const LaunchCtx& ctx, const float* x, bf16* y, int n);
void accumulate_f32(const LaunchCtx& ctx, const float* x, float* y, int n);
void scale_f32(const LaunchCtx& ctx, float* x, float s, int n);
void add_i32(const LaunchCtx& ctx, const int32_t* src, int32_t add, int32_t* dst);
void moe_route(const LaunchCtx& ctx, const float* logits, const float* bias, int num_experts, int top_k,
               int n_group, int topk_group, float scaling, int32_t* idx, float* weights);
void indexer_store(const LaunchCtx& ctx, const bf16* k_normed, const float* gate, const float* ape,
                   const int32_t* pos, bf16* k_cache, float* gate_cache, uint8_t* valid, float* pool_keys,
                   int D, int P);
void indexer_scores(const LaunchCtx& ctx, const float* q, const float* w, const float* pool_keys,
                    const int32_t* pos, float* scores, int n_heads, int D, int P, int max_pools);
/// rmsnorm of one row of cache.kv_lora, stored as kv_write stores it; one block. The norm's path
/// (register-resident or scalar) is the one rmsnorm takes for the same x, w and an aligned output,
/// so the cache bytes are rmsnorm + kv_write's. cache.data 16-byte aligned.
void kv_norm_write(const LaunchCtx& ctx, const bf16* x, const bf16* w, float eps, const int32_t* block_table,
                   const int32_t* pos, const KvCache& cache);
/// layernorm of one row of D into k_cache row pos[0], then the rest of indexer_store; one block.
/// The norm's path is layernorm's for the same x, w, b and an aligned output (the same bits as
/// layernorm + indexer_store). k_cache 16-byte aligned.
void indexer_norm_store(const LaunchCtx& ctx, const bf16* x, const bf16* w, const bf16* b, float eps,
                        const float* gate, const float* ape, const int32_t* pos, bf16* k_cache,
                        float* gate_cache, uint8_t* valid, float* pool_keys, int D, int P);
/// indexer_select's kernels, by ctx.policy.indexer_select, same selection: v2 (the default) an
/// 11/11/10-bit radix select that stops at the first digit whose bin is taken whole; v1 the former
/// one, four 8-bit passes (docs/kernels.md), kept so that a device failure of v2 can be switched off
/// without a rebuild.
void indexer_select(const LaunchCtx& ctx, const float* scores, const int32_t* pos, int32_t* selection, int K,
                    int P, int max_pools);

}  // namespace mtplab::ops::cuda
