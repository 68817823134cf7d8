// Host launchers of the dense kernels (the CPU reference: cpu/dense.cpp), one family header over
// the files that hold them: gemv.cu (the single-row GEMVs, linear_group and the single-row head),
// argmax.cu (the argmax family), head.cu (the batched head and the cuBLASLt head's launches),
// rows_gemm.cu (the skinny tensor-core GEMM), rows_gemv.cu (the multi-row GEMV). What every
// launcher shares (LaunchCtx, the invariants): kernels.hpp.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "ops/cuda/kernels.hpp"
#include "ops/ops.hpp"

namespace mtplab::ops::cuda {

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

// ---- one row ------------------------------------------------------------------------------------------
/// Largest grid any GEMV / argmax launch uses (so ArgmaxScratch::capacity can be sized once).
int gemv_max_grid(int num_sms);

// The GEMV launchers take their kernel from ctx.policy.gemv_variant (ops::GemvVariant,
// ops/kernel_policy.hpp): automatic is chosen per shape (a table in gemv.cu); rows2, rows4
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

// ---- batched rows -------------------------------------------------------------------------------------
/// The per-row best keys of head_argmax_batch (kMaxBatchRows of them, zero between launches) and
/// its completion counter: the last block turns the keys into the outputs and resets both.
struct HeadBatchScratch {
  unsigned long long* best = nullptr;
  unsigned int* counter = nullptr;
  /// The wgmma FP8 head's packed x (head_packed_x_elems), rewritten by every launch that uses it.
  bf16* packed_x = nullptr;
  size_t packed_elems = 0;
};
/// BF16 values of the wgmma FP8 head's packed x for up to kMaxBatchRows rows of k columns.
size_t head_packed_x_elems(int k);
/// Whether this build's device code has the warpgroup MMA (the sm_90a target): the wgmma FP8
/// head (KernelPolicy::head_gemm wgmma) needs it.
bool have_wgmma();
/// head_argmax_batch of up to kMaxBatchRows rows in one launch, the argmax fused, every weight row
/// read once: the kernel dispatch.cu's head_fused_kernel picks (the skinny GEMM, W rows x the
/// batch's rows on the tensor cores; for FP8 rows the multi-row GEMV head or the wgmma head).
/// k % 16 == 0; W (or W_fp8) and x 16-byte aligned.
void head_argmax_batch(const LaunchCtx& ctx, const bf16* W, const fp8e4m3* W_fp8, const float* row_scale,
                       const bf16* x, const int32_t* slot, int rows, int n, int k, int64_t index_base,
                       bf16* logits, int ld_logits, ArgMax* out, HeadExtras extras,
                       const HeadBatchScratch& s);
/// Y[b, r] = sum_j W[row(r), j] X[b, j] over the map's rows (GemvRowMap: group r / rows_per_group,
/// x row b at x + b * ldx + group * x_group_stride), rounded once to BF16 at y + b * ldy + r; up to
/// kMaxBatchRows rows. The small-M tensor-core GEMM of mla_out_v_batch. k % 16 == 0,
/// rows_per_group % 16 == 0 (or one group), W / x 16-byte aligned, ldx and x_group_stride
/// multiples of 8.
void rows_gemm(const LaunchCtx& ctx, const bf16* W, const bf16* x, int64_t ldx, bf16* y, int64_t ldy,
               int rows, int n, int k, const GemvRowMap& map);
/// Most rows one rows_gemv launch takes (the batch rows of a batched linear at small B).
inline constexpr int kMaxRowsGemv = 16;
/// Most rows the multi-row GEMV head takes (the FP8 head under KernelPolicy::head_gemm gemv); more
/// rows run the skinny GEMM.
inline constexpr int kMaxRowsGemvHead = 4;
/// Whether the multi-row GEMV head can run `rows` rows of k columns: 1 .. kMaxRowsGemvHead rows,
/// k % 16 == 0, and the rows' activations as fp32 (rows x k x 4 bytes, k rounded up to 512) within
/// its shared memory (112 KB: k <= 7168 at 4 rows). Otherwise the FP8 head runs the skinny GEMM
/// under any policy.
bool head_gemv_fits(int rows, int k);
/// rows_gemv's cross-tile workspace and per-row-group counters (zero between launches: the last
/// block of each group resets its counter). Only rows with k > 2048 use them.
struct RowsGemvScratch {
  float* ws = nullptr;
  size_t ws_floats = 0;
  unsigned int* counter = nullptr;
  int counters = 0;
};
/// The workspace floats and counters rows_gemv of [n x k] needs at up to kMaxRowsGemv rows (so a
/// graph captured at more rows than the eager call before it needs no growth); 0 when k <= 2048.
size_t rows_gemv_ws_floats(int n, int k);
int rows_gemv_counters(int n, int k);
/// Y[r, j] = sum_i W[j, i] X[r, i] for rows 1 .. kMaxRowsGemv (X [rows][k], Y [rows][n]; BF16 rounded
/// once, or fp32): the multi-row GEMV of the batched linears (KernelPolicy::rows_linear), every W
/// element loaded once for all rows. A row's result is bit for bit the same whatever the other rows
/// and their count (rows_gemv.cu). k % 8 == 0; W and X 16-byte aligned.
void rows_gemv(const LaunchCtx& ctx, const bf16* W, const bf16* x, void* y, bool f32_out, int rows, int n,
               int k, const RowsGemvScratch& s);
/// rows_gemv of several weights against the same X in one launch (ops::Backend::linear_rows_group):
/// outs[i].y [rows][n_out], each bit for bit the rows_gemv of that weight alone (fp32 outputs then
/// times f32_scale, as scale_f32). 1 .. kMaxLinearGroup outputs; the scratch sized for their summed n.
void rows_gemv_group(const LaunchCtx& ctx, std::span<const LinearOut> outs, const bf16* x, int rows, int k,
                     const RowsGemvScratch& s);
/// The FP8 head on cuBLASLt (KernelPolicy::head_gemm cublaslt; docs/kernels.md, "The
/// head"), first launch: each live row b of x [rows][k] as two E4M3 parts, rows 2b (hi) and
/// 2b + 1 (lo) of parts [2 rows][k] (batch::e4m3_parts: x times 2^shifts[b]), zeros for a padded
/// row. rows 1 .. kMaxBatchRows, k % 16 == 0, x 16-byte aligned.
void head_split_e4m3(const LaunchCtx& ctx, const bf16* x, const int32_t* slot, int rows, int k,
                     uint8_t* parts, int* shifts);
/// After cuBLASLt's FP8 GEMM D [2 rows][n] (fp32, W times the parts), for each live row b: its
/// logits BF16(row_scale[j] * (D[2b][j] + D[2b+1][j]) * 2^-shifts[b]) (NaN for a row the split
/// marked not finite), stored to dst + b * ld_dst when dst is not null, and its argmax into
/// pairs[b] (the lowest index on ties; scratch: argmax_batch's). Padded rows: nothing of theirs
/// is written (pairs[b] is then meaningless).
void head_combine_argmax_e4m3(const LaunchCtx& ctx, const float* D, int rows, int n, const float* row_scale,
                              const int* shifts, const int32_t* slot, int64_t index_base, bf16* dst,
                              int ld_dst, ArgMax* pairs, const ArgmaxScratch& scratch);
/// The last launch of the cuBLASLt head (KernelPolicy::head_gemm): for each live row b (slot[b] >= 0,
/// or every row when slot is null), out[b] = pairs[b], extras' key (argmax_key) and token, and, when
/// dst is not null, row b of logits [rows][n] copied to dst + b * ld_dst. Padded rows: nothing.
void head_finish_rows(const LaunchCtx& ctx, const ArgMax* pairs, const int32_t* slot, int rows,
                      const bf16* logits, int n, bf16* dst, int ld_dst, ArgMax* out, HeadExtras extras);
/// out[b] = argmax of row b (x + b * ld_x, n values): one block per row (rows = 1: the single-row
/// multi-block kernel).
void argmax_batch(const LaunchCtx& ctx, const bf16* x, int ld_x, int rows, int n, int64_t index_base,
                  ArgMax* out, const ArgmaxScratch& single_row);
void argmax_unpack_key_batch(const LaunchCtx& ctx, const uint64_t* key, int32_t* token, int rows);
void argmax_pick_batch(const LaunchCtx& ctx, const ArgMax* pairs, int n, int rows, int32_t* token);

}  // namespace mtplab::ops::cuda
