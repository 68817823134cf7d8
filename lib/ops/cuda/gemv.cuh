// The single-row GEMV kernels (gemv.cu launches them; the CPU reference: cpu/dense.cpp): a warp per
// output row (or part of one), the head's argmax fused, and the variants of several rows per warp
// or more resident warps. Kernel templates, so that a launcher instantiates the shapes it runs;
// the comparison variants of dev/cuda/gemv.cu instantiate theirs from here too.
//
// Invariants of the GEMVs:
// - A warp owns one output row (or 1/kSplit of it); each lane streams 16-byte chunks of the
//   weight row with kUnroll loads in flight and reads the activation chunk at the same offset
//   (from L1: the weights bypass it). The split parts of a row are summed in a fixed order, so
//   results are deterministic; only the summation order differs from the CPU reference.
// - The grid is capped at what is resident at once (a persistent grid-stride loop over rows),
//   so a [154880, 4096] head and a [512, 4096] projection both fill the chip; small-n shapes
//   split k across warps instead of leaving multiprocessors idle.
// - The kernel variants (GemvVariant) that keep the v1 split give v1's bits: every lane adds its
//   chunks of a row in ascending order with one accumulator per row, and the parts of a split row
//   are summed in part order.
// - The fused argmax compares the BF16-rounded logits (as the CPU does) through the packed
//   64-bit key; the last block to finish reduces the per-block keys and resets the counter,
//   so the op is one launch and needs no memset between calls (CUDA-graph safe).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "ops/cuda/argmax.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dense.hpp"
#include "ops/cuda/device_common.cuh"
#include "ops/cuda/dispatch.hpp"
#include "ops/cuda/launch.cuh"

namespace mtplab::ops::cuda {

constexpr int kGemvThreads = 256;
constexpr int kGemvWarps = kGemvThreads / kWarp;
// kUnroll, the 16-byte weight loads in flight per lane: device_common.cuh, with slice_dot.
constexpr int kMaxBlocksPerSm = 8;  // 2048 resident threads / 256

enum class OutKind { bf16, f32 };

struct GemvParams {
  const void* W = nullptr;
  const float* row_scale = nullptr;
  const bf16* x = nullptr;
  void* y = nullptr;  // BF16 or fp32 outputs; may be null for the head (logits not wanted)
  int64_t n = 0;
  int k = 0;
  GemvRowMap map;
  int64_t index_base = 0;
  ArgMax* out = nullptr;
  HeadExtras extras{};  // written with out by the last block (head_argmax)
  unsigned long long* partials = nullptr;
  unsigned int* counter = nullptr;
};

/// This thread's warp and lane in a GEMV block, and the part of a row the warp computes when rows
/// are split across `split` warps: part warp % split of the block's row warp / split, chunks
/// [c_begin, c_end) of the row's n_chunks.
struct WarpPart {
  int warp;
  int lane;
  int part;
  int local_row;
  int c_begin;
  int c_end;
};
__device__ __forceinline__ WarpPart warp_part(int split, int n_chunks) {
  const int warp = threadIdx.x / kWarp;
  const int part = warp % split;
  return WarpPart{warp,
                  static_cast<int>(threadIdx.x % kWarp),
                  part,
                  warp / split,
                  static_cast<int>(static_cast<int64_t>(part) * n_chunks / split),
                  static_cast<int>(static_cast<int64_t>(part + 1) * n_chunks / split)};
}

/// The end of output row r once its sum is complete: the FP8 row scale, the store (fp32, or rounded
/// to BF16; the head's logits may be null) and, for the head, the row's argmax key of the rounded
/// logit into this lane's running best.
template <bool kFp8, OutKind kOut, bool kArgmax>
__device__ __forceinline__ void finish_row(const GemvParams& p, int64_t r, float acc,
                                           unsigned long long& best) {
  if constexpr (kFp8) acc = p.row_scale[r] * acc;
  if constexpr (kOut == OutKind::f32) {
    static_cast<float*>(p.y)[r] = acc;
  } else {
    const bf16 v = f_to_bf16(acc);
    if (p.y) static_cast<bf16*>(p.y)[r] = v;
    if constexpr (kArgmax) {
      const unsigned long long key = argmax_key(bf16_to_f(v), static_cast<int32_t>(p.index_base + r));
      best = key > best ? key : best;
    }
  }
}

template <bool kFp8, int kSplit, OutKind kOut, bool kArgmax, int kU = kUnroll>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(GemvParams p) {
  pdl_begin();
  constexpr int kRowsPerBlock = kGemvWarps / kSplit;
  constexpr int kElemsPerChunk = kFp8 ? 16 : 8;
  const auto [warp, lane, part, local_row, c_begin, c_end] = warp_part(kSplit, p.k / kElemsPerChunk);
  const size_t row_bytes = static_cast<size_t>(p.k) * (kFp8 ? 1 : 2);
  __shared__ float partial[kGemvWarps];
  unsigned long long best = 0;

  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock; base < p.n;
       base += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int64_t r = base + local_row;
    float acc = 0.0f;
    if (r < p.n) {
      const int64_t group = r / p.map.rows_per_group;
      const int64_t within = r - group * p.map.rows_per_group;
      const int64_t wrow = group * p.map.group_stride_rows + p.map.row_offset + within;
      acc = slice_dot<kFp8, kU>(static_cast<const uint8_t*>(p.W) + wrow * row_bytes,
                                p.x + group * p.map.x_group_stride, c_begin, c_end, lane);
      acc = warp_sum(acc);
    }
    if constexpr (kSplit > 1) {
      if (lane == 0) partial[warp] = acc;
      __syncthreads();
      if (part == 0) acc = sum_parts(&partial[warp], kSplit);
      __syncthreads();
    }
    if (part == 0 && lane == 0 && r < p.n) finish_row<kFp8, kOut, kArgmax>(p, r, acc, best);
  }
  if constexpr (kArgmax) finish_argmax(best, p.partials, p.counter, p.out, p.extras);
}

// ---- variants: several rows per warp, or more resident warps -------------------------------------

/// gemv_kernel with kRows rows per warp and iteration, and kMinBlocks resident blocks per SM asked of
/// the register allocator (occ: 8, i.e. at most 32 registers). An iteration of a block covers
/// kRows x (kGemvWarps / kSplit) rows; warp (local_row, part) takes rows
/// base + j * (kGemvWarps / kSplit) + local_row, j < kRows, so a partial last iteration still spreads
/// over every row group. The parts of a row meet in shared memory behind a barrier of their own row
/// group only; the partials alternate between two buffers, so one barrier per iteration suffices (a
/// buffer is rewritten two iterations later, after every part has passed the next barrier, which
/// part 0 reaches only after reading it). Same chunk ranges, per-row order and part order as
/// gemv_kernel<kSplit>: the same bits.
template <bool kFp8, int kSplit, OutKind kOut, bool kArgmax, int kRows, int kU, int kMinBlocks>
__global__ void __launch_bounds__(kGemvThreads, kMinBlocks) gemv_rows_kernel(GemvParams p) {
  pdl_begin();
  constexpr int kRowsPerBlock = kGemvWarps / kSplit;
  constexpr int kElemsPerChunk = kFp8 ? 16 : 8;
  const auto [warp, lane, part, local_row, c_begin, c_end] = warp_part(kSplit, p.k / kElemsPerChunk);
  const size_t row_bytes = static_cast<size_t>(p.k) * (kFp8 ? 1 : 2);
  __shared__ float partial[2][kRows][kGemvWarps];
  int buf = 0;
  unsigned long long best = 0;

  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock * kRows; base < p.n;
       base += static_cast<int64_t>(gridDim.x) * kRowsPerBlock * kRows) {
    // Every row of this warp is in the group of its first (plan_gemv: kRows == 1, or groups that
    // are whole multiples of a block's iteration, or one group for all rows).
    const int64_t first = base + local_row;
    const int64_t group = first < p.n ? first / p.map.rows_per_group : 0;
    const int64_t group_row0 = group * p.map.rows_per_group;
    const uint8_t* wrow[kRows];
    bool ok[kRows];
    float acc[kRows];
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const int64_t r = base + j * kRowsPerBlock + local_row;
      ok[j] = r < p.n;
      const int64_t w_index = group * p.map.group_stride_rows + p.map.row_offset + (r - group_row0);
      wrow[j] = static_cast<const uint8_t*>(p.W) + (ok[j] ? w_index : 0) * row_bytes;
      acc[j] = 0.0f;
    }
    slice_dot_rows<kFp8, kRows, kU>(wrow, p.x + group * p.map.x_group_stride, ok, c_begin, c_end, lane, acc);
#pragma unroll
    for (int j = 0; j < kRows; ++j)
      if (ok[j]) acc[j] = warp_sum(acc[j]);
    if constexpr (kSplit > 1) {
      if (lane == 0) {
#pragma unroll
        for (int j = 0; j < kRows; ++j) partial[buf][j][warp] = acc[j];
      }
      named_barrier(1 + local_row, kSplit * kWarp);  // the row's parts only
      if (part == 0) {
#pragma unroll
        for (int j = 0; j < kRows; ++j) acc[j] = sum_parts(&partial[buf][j][warp], kSplit);
      }
      buf ^= 1;
    }
    if (part == 0 && lane == 0) {
#pragma unroll
      for (int j = 0; j < kRows; ++j)
        if (ok[j]) finish_row<kFp8, kOut, kArgmax>(p, base + j * kRowsPerBlock + local_row, acc[j], best);
    }
  }
  if constexpr (kArgmax) finish_argmax(best, p.partials, p.counter, p.out, p.extras);
}

/// Blocks of kKernel (kGemvThreads threads) resident per SM, at most kMaxBlocksPerSm: asked of the
/// occupancy calculator once per kernel.
template <auto kKernel>
int resident_blocks_per_sm() {
  static const int blocks = [] {
    int b = 0;
    MTP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kKernel, kGemvThreads, 0));
    return std::max(1, std::min(b, kMaxBlocksPerSm));
  }();
  return blocks;
}

/// One persistent GEMV launch: the blocks resident at once (no more than the rows need at
/// rows_per_iteration rows per block and iteration, at most grid_cap when > 0), looping over rows.
template <auto kKernel>
void launch_persistent(const LaunchCtx& ctx, const GemvParams& p, int rows_per_iteration, int grid_cap) {
  const int64_t needed = (p.n + rows_per_iteration - 1) / rows_per_iteration;
  int64_t grid =
      std::min<int64_t>(needed, static_cast<int64_t>(resident_blocks_per_sm<kKernel>()) * ctx.num_sms);
  if (grid_cap > 0) grid = std::min<int64_t>(grid, grid_cap);
  launch(ctx, kKernel, static_cast<unsigned>(grid), kGemvThreads, 0, p);
  MTP_CUDA_LAUNCH_CHECK();
}

/// The checked parameters of one GEMV launch of the launcher `op`: n >= 1, k a positive multiple of
/// a chunk (8 BF16 or 16 FP8 weights), W and x 16-byte aligned.
inline GemvParams gemv_params(const char* op, bool fp8, const void* W, const float* row_scale, const bf16* x,
                              void* y, int n, int k, const GemvRowMap& map) {
  const int chunk = fp8 ? 16 : 8;
  MTP_REQUIRE(n >= 1 && k >= 1 && k % chunk == 0, "ops::cuda::", op, ": n = ", n, ", k = ", k,
              " (k must be a positive multiple of ", chunk, ")");
  require_aligned(op, "W", W);
  require_aligned(op, "x", x);
  return GemvParams{.W = W, .row_scale = row_scale, .x = x, .y = y, .n = n, .k = k, .map = map};
}

// ---- launching an instance (its plan: dispatch.hpp) ----------------------------------------------

template <bool kFp8, int kSplit, OutKind kOut, bool kArgmax, int kU = kUnroll>
void launch_gemv_split(const LaunchCtx& ctx, const GemvParams& p, int grid_cap) {
  launch_persistent<gemv_kernel<kFp8, kSplit, kOut, kArgmax, kU>>(ctx, p, kGemvWarps / kSplit, grid_cap);
}

template <bool kFp8, int kSplit, OutKind kOut, bool kArgmax, int kRows, int kU, int kMinBlocks>
void launch_rows(const LaunchCtx& ctx, const GemvParams& p, int grid_cap) {
  launch_persistent<gemv_rows_kernel<kFp8, kSplit, kOut, kArgmax, kRows, kU, kMinBlocks>>(
      ctx, p, kGemvWarps / kSplit * kRows, grid_cap);
}

/// gemv_rows_kernel by unroll (2, 4, 8; at most kMaxU).
template <bool kFp8, int kSplit, OutKind kOut, bool kArgmax, int kRows, int kMinBlocks, int kMaxU>
void launch_rows_unroll(const LaunchCtx& ctx, const GemvParams& p, int grid_cap, int unroll) {
  if constexpr (kMaxU >= 4) {
    if constexpr (kMaxU >= 8) {
      if (unroll > 4) return launch_rows<kFp8, kSplit, kOut, kArgmax, kRows, 8, kMinBlocks>(ctx, p, grid_cap);
    }
    if (unroll > 2) return launch_rows<kFp8, kSplit, kOut, kArgmax, kRows, 4, kMinBlocks>(ctx, p, grid_cap);
  }
  return launch_rows<kFp8, kSplit, kOut, kArgmax, kRows, 2, kMinBlocks>(ctx, p, grid_cap);
}

/// gemv_rows_kernel by split (1, 2, 4, and 8 when kSplit8; the argmax only unsplit).
template <bool kFp8, OutKind kOut, bool kArgmax, int kRows, int kMinBlocks, int kMaxU, bool kSplit8>
void launch_rows_split(const LaunchCtx& ctx, const GemvParams& p, int grid_cap, const GemvPlan& plan) {
  if constexpr (kArgmax) {
    return launch_rows_unroll<kFp8, 1, kOut, kArgmax, kRows, kMinBlocks, kMaxU>(ctx, p, grid_cap,
                                                                                plan.unroll);
  } else {
    switch (plan.split) {
      case 1:
        return launch_rows_unroll<kFp8, 1, kOut, kArgmax, kRows, kMinBlocks, kMaxU>(ctx, p, grid_cap,
                                                                                    plan.unroll);
      case 2:
        return launch_rows_unroll<kFp8, 2, kOut, kArgmax, kRows, kMinBlocks, kMaxU>(ctx, p, grid_cap,
                                                                                    plan.unroll);
      case 4:
        return launch_rows_unroll<kFp8, 4, kOut, kArgmax, kRows, kMinBlocks, kMaxU>(ctx, p, grid_cap,
                                                                                    plan.unroll);
      default:
        if constexpr (kSplit8) {
          return launch_rows_unroll<kFp8, 8, kOut, kArgmax, kRows, kMinBlocks, kMaxU>(ctx, p, grid_cap,
                                                                                      plan.unroll);
        } else {
          MTP_REQUIRE(false, "ops::cuda::gemv: no rows kernel for split ", plan.split);
        }
    }
  }
}

}  // namespace mtplab::ops::cuda
