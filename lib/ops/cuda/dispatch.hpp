// Every rule of the CUDA backend that picks a kernel (dispatch.cu holds them, each with the
// measured table behind it): the GEMV variant and k-split, the batched head and its launch size,
// the batched linears, the batched MLA decode and its split count, the batched pool scores, and
// the grouped experts' pipeline and launch size. The launchers and the backend ask here and run
// what they are told; the kernel policy (ops/kernel_policy.hpp) forces a choice, `auto` takes the
// rule's.
//
// Invariants:
// - A rule is a function of the policy, the shape and the device's size: the same inputs give the
//   same kernel, so a captured graph and the eager calls before it run the same kernels.
// - A rule never picks a kernel kept only for comparison: those live in dev/cuda (docs/kernels.md,
//   "Playgrounds"); the parameterised helpers the playgrounds share (unroll_for, rows_kernel_fits,
//   shared_decode_splits) are declared here too.
// - A new value of a KernelPolicy field is its enumerator and table entry (kernel_policy.hpp) and
//   its case in the rule here.
#pragma once
#include <cstdint>
#include <functional>

#include "ops/cuda/kernels.hpp"
#include "ops/kernel_policy.hpp"

namespace mtplab::ops::cuda {

// ---- GEMV (gemv.cu) ---------------------------------------------------------------------------------

/// What one GEMV launch runs: the kernel (v1 = gemv_kernel; rows4, occ = gemv_rows_kernel), the
/// k-split and the loads per lane and row in flight.
struct GemvPlan {
  GemvVariant kernel = GemvVariant::v1;
  int split = 1;
  int unroll = 8;
};

/// The k-split of a GEMV of n rows of n_chunks 16-byte chunks: the policy's gemv_split when not 0,
/// else by the rule in dispatch.cu (1 .. 8).
int gemv_split(const LaunchCtx& ctx, int64_t n, int n_chunks);
/// The launch of gemv_bf16 / gemv_fp8 / head_argmax for [n x k] (argmax: the head; rows_per_group:
/// the row map's group, n for a plain GEMV): the policy's variant (automatic: the per-shape table
/// of dispatch.cu), run as v1 where the variant has no instance for the shape.
GemvPlan gemv_plan(const LaunchCtx& ctx, bool fp8, bool argmax, bool f32_out, int64_t n, int k,
                   int rows_per_group);
/// The smallest of 2, 4, 8 that covers `per_lane` chunks, at most `cap`.
int unroll_for(int per_lane, int cap);
/// Whether gemv_rows_kernel with `rows` rows per warp covers a shape at this k-split: every resident
/// warp has its rows (n x split >= rows x 16 warps per SM, split <= 4) and the rows of a block's
/// iteration share their activation (one group, or groups of a multiple of its rows: mla_out_v's
/// 256).
bool rows_kernel_fits(int rows, int split, int64_t n, int rows_per_group, int num_sms);

// ---- the batched head (cuda_backend.cpp, head.cu) -------------------------------------------------

/// Fewest rows the FP8 head takes the wgmma kernel at under head_gemm auto (dispatch.cu).
inline constexpr int kMinRowsWgmmaHead = 17;
/// Most rows head_gemm auto gives the multi-row GEMV head (dispatch.cu).
inline constexpr int kMaxRowsGemvHeadAuto = 3;

/// Whether head_argmax_batch of `rows` rows runs on cuBLASLt (the GEMM, then the argmax and the
/// finish; HeadGemm::cublaslt) rather than a fused kernel. FP8 rows only where cuBLASLt has an FP8
/// algorithm for every launch of the call (fp8_plans_exist, asked only when the rule would take it).
bool head_on_cublaslt(const KernelPolicy& policy, bool fp8, int rows,
                      const std::function<bool()>& fp8_plans_exist);
/// The fused kernel of one head_argmax_batch launch of `rows` rows (1 .. kMaxBatchRows) of k:
/// the multi-row GEMV head (FP8, where it fits), the wgmma head (FP8; an Error under head_gemm
/// wgmma where the build lacks sm_90a) or the skinny MMA GEMM.
enum class HeadKernel { mma, gemv, wgmma };
HeadKernel head_fused_kernel(const KernelPolicy& policy, bool fp8, int rows, int k);
/// The same rule for a build with (wgmma_built) or without the sm_90a device code, whatever this
/// build has (the generated tables of docs/kernels.md).
HeadKernel head_fused_kernel(const KernelPolicy& policy, bool fp8, int rows, int k, bool wgmma_built);
/// Rows of one launch of the cuBLASLt head for a batch of `rows` rows: kMaxBatchRows for a batch of
/// at most that many (the draft step's), else kHeadLtWideRows (a verification's B x (k + 1) rows).
int head_lt_launch_rows(int rows);

// ---- batched linears (cuda_backend.cpp) -------------------------------------------------------------

/// Whether a batched linear of `rows` rows (>= 2) of [n x k] runs the multi-row GEMV (rows_gemv)
/// rather than cuBLASLt (KernelPolicy::rows_linear). aligned: W and X 16-byte aligned.
bool rows_linear_on_gemv(const KernelPolicy& policy, int rows, int64_t n, int k, bool aligned);

// ---- the batched MLA decode (mla.cu) --------------------------------------------------------------

/// The kernels of the batched decode (mla.cu): the tiles rule's v1 / v2, the shared kernels.
enum class BatchDecodeKernel { v1, v2, shared2, shared32 };
/// The kernel a batch of `rows` rows runs (KernelPolicy::mla_batch, mla_decode).
BatchDecodeKernel mla_batch_kernel(const KernelPolicy& policy, bool fp8_cache, int rows);
/// The split count of the batched decode of `rows` rows of `width` selected rows and n_heads heads
/// under the policy (mla_batch_splits forces it; the kernel's rule otherwise).
int mla_batch_splits(const LaunchCtx& ctx, int width, int n_heads, int rows, bool fp8_cache);
/// The split count of a shared decode (head tiles of a row in one block): at least what the slot
/// table's bound (max_split_rows) needs; a forced count capped at the chunks; else as many splits
/// as keep the launch within one wave at blocks_per_sm blocks per multiprocessor, with at least 4
/// chunks of 16 rows per split. tiles_per_block: head tiles of 16 a block.
int shared_decode_splits(int num_sms, int chunks, int n_heads, int rows, int forced, int tiles_per_block,
                         int blocks_per_sm, int max_split_rows);
/// Clusters of 8 splits per (row, head tile) of the v2 decode, for rows of `chunks` chunks and
/// `units` (row, head tile) pairs in the launch; `forced` (not 0) is the count asked for.
int v2_decode_clusters(int num_sms, int chunks, int64_t units, int forced);

// ---- the grouped experts (moe.cu, cuda_backend.cpp) ---------------------------------------------------

/// Most rows moe_pipeline auto gives the single-row kernels (slots; dispatch.cu).
inline constexpr int kMaxRowsSlotsMoeAuto = 3;
/// The kernels of one moe_experts_grouped launch: the single-row kernels over its rows (slots), the
/// grouped plan's one-warp items under one memory pipeline (v1 or ringpf; KernelPolicy::moe_pipeline),
/// or past kMaxBatchRows rows the block items (the 8 warps of a block share each chunk's rows; moe.cu).
enum class MoeKernel { slots, v1, ringpf, block_items };
struct MoePlan {
  MoeKernel kernel = MoeKernel::v1;
  /// More rows than kMaxBatchRows: a third launch builds the plan once in global memory, and d is
  /// kept there too (moe.cu, "wide batches").
  bool wide = false;
};
/// What one moe_experts_grouped launch of `rows` rows (1 .. kMaxMoeLaunchRows, moe.hpp) runs.
/// slots_fit: the single-row kernels take these rows and routes (moe.hpp's moe_slots_fit);
/// ring_fits: ringpf's rings with the plan and d fit a block's shared memory (asked of a narrow
/// launch only; moe.cu computes it).
MoePlan moe_grouped_plan(const KernelPolicy& policy, int rows, bool slots_fit, bool ring_fits);

// ---- the indexer (indexer.cu) -----------------------------------------------------------------------

/// Whether indexer_scores_batch runs the tiled kernel: the policy's choice where the shape has 32
/// heads, D % 4 == 0 and the tiled kernel's rings fit (D <= 172; else pools4); automatic from
/// kMinRowsTiledScores rows.
bool indexer_scores_tiled(const KernelPolicy& policy, int rows, int n_heads, int D);
inline constexpr int kMinRowsTiledScores = 16;

// ---- what ran ----------------------------------------------------------------------------------------

/// Notes in ctx's record (Backend::kernels_chosen) that `op` ran `kernel` (static texts).
inline void record_kernel(const LaunchCtx& ctx, const char* op, const char* kernel) {
  if (ctx.record) ctx.record->note(op, kernel);
}
/// The record's texts of the choices: "rows4 split 1", "mma", "shared2", ...
const char* kernel_text(const GemvPlan& plan);
const char* kernel_text(HeadKernel kernel);
const char* kernel_text(BatchDecodeKernel kernel);
const char* kernel_text(const MoePlan& plan);  ///< "slots", "ringpf", "ringpf wide", "block items", ...

}  // namespace mtplab::ops::cuda
