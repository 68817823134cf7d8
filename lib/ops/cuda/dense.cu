// The dense ops (the CPU reference: cpu/dense.cpp): linear layers, the draft head with its argmax
// fused, and the argmax family.
// - One row: the memory-bound GEMV family: BF16 and FP8 (per-row scaled) GEMV, the draft head with
//   its argmax fused, several GEMVs of one x (linear_group), the standalone argmax and its pack /
//   unpack / pick helpers.
// - Batched rows: the skinny tensor-core GEMM (W rows x up to 128 batch rows) behind
//   head_argmax_batch (its argmax fused), the batched linears' small-M path and mla_out_v_batch,
//   and the argmax family over rows; the multi-row GEMV of the batched linears at a few rows
//   (rows_gemv) and of the FP8 head at 2 .. kMaxRowsGemvHead rows (head_gemv, its argmax fused):
//   their designs and invariance above the kernels.
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
//
// The skinny GEMM (rows_gemm_kernel). A block of 8 warps owns a tile of 128 W rows (16 per warp, the
// MMA's M) and every batch row (the MMA's N, 8 per column tile, kNT tiles); it walks k in chunks of
// 64 columns. Each W element is loaded exactly once, by the one lane whose fragment holds it, with
// 16-byte streaming loads two chunks ahead in registers; the batch rows' chunk is shared by the 8
// warps through a 3-stage cp.async ring in shared memory (padded rows are zero-filled, never read).
// Tiles are spread over a persistent grid. Epilogues: BF16 / fp32 outputs (the linears), or the
// head: each logit rounded to BF16, written when wanted, keyed as argmax_key(value, index), reduced
// per batch row over the warp's 16 rows (shuffles), the block (shared atomics), then the grid
// (global atomicMax into HeadBatchScratch::best); the last block to finish writes out / extras and
// resets the keys and the counter (one launch, no memset between calls, graph-safe).
//
// Invariants of the skinny GEMM:
// - A logit's fp32 sum is the MMA's: products exact, accumulation in fp32 in the tensor core's
//   order (batch_common.cuh's column relabelling); FP8 rows are widened to BF16 exactly and the row
//   scale multiplies the finished sum, as the CPU does. Ties go to the lowest index (the key).
// - Nothing of a padded row (slot[b] < 0) is read or written.
#include <algorithm>
#include <array>
#include <atomic>
#include <cfloat>
#include <cstdint>

#include "ops/cuda/batch_common.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dense.hpp"
#include "ops/cuda/device_common.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/wgmma.cuh"

namespace mtplab::ops::cuda {

// ==== one row ==========================================================================================

namespace {

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
  HeadExtras extras;  // written with out by the last block (head_argmax)
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

/// A split row's parts summed in part order, parts[0] first: the combine of every GEMV kernel.
__device__ __forceinline__ float sum_parts(const float* parts, int split) {
  float acc = parts[0];
#pragma unroll
  for (int s = 1; s < split; ++s) acc += parts[s];
  return acc;
}

/// Block-wide MAX of the packed keys, then the last block reduces all blocks' keys into `out`.
__device__ void finish_argmax(unsigned long long best, unsigned long long* partials, unsigned int* counter,
                              ArgMax* out, HeadExtras extras = {}) {
  __shared__ unsigned long long warp_best[32];
  __shared__ bool is_last;
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int n_warps = blockDim.x / kWarp;
  best = warp_max_u64(best);
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long b = 0;
    for (int w = 0; w < n_warps; ++w) b = warp_best[w] > b ? warp_best[w] : b;
    partials[blockIdx.x] = b;
    __threadfence();  // publish the partial before counting this block as done
    const unsigned int done = atomicAdd(counter, 1u);
    is_last = (done == gridDim.x - 1);
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  unsigned long long b = 0;
  for (unsigned int i = threadIdx.x; i < gridDim.x; i += blockDim.x) {
    const unsigned long long v = __ldcg(partials + i);
    b = v > b ? v : b;
  }
  b = warp_max_u64(b);
  __syncthreads();
  if (lane == 0) warp_best[warp] = b;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 0; w < n_warps; ++w) b = warp_best[w] > b ? warp_best[w] : b;
    out->value = from_order_preserving_u32(static_cast<uint32_t>(b >> 32));
    out->index = static_cast<int32_t>(~static_cast<uint32_t>(b & 0xffffffffull));
    // b is argmax_key(value, index) of the pair just written (the key is a bijection on the
    // values that occur: -0 is keyed as +0 and comes back as +0), so this is argmax_pack_key's.
    if (extras.key) *extras.key = b;
    if (extras.token) *extras.token = out->index;
    *counter = 0;  // ready for the next launch (stream order)
  }
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

/// Barrier among the `threads` threads of the warps that share one output row (named barrier `id`,
/// 1..8; 0 is __syncthreads'): the row groups of a block do not wait for each other.
__device__ __forceinline__ void row_group_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

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
      row_group_sync(1 + local_row, kSplit * kWarp);
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

/// Warps that keep the chip's memory system busy: below that, split each row across warps. The
/// policy's gemv_split, when not 0, forces the split (a tuning experiment; docs/kernels.md).
int choose_split(int64_t n, int n_chunks, const LaunchCtx& ctx) {
  if (ctx.policy.gemv_split != 0) return ctx.policy.gemv_split;
  const int num_sms = ctx.num_sms;
  // Long rows (k >= 8192 BF16: eh_proj, o_proj) aim at two warps per resident slot: measured on
  // the H200, split 4 instead of 2 took eh_proj 20.9 -> 19.8 us and o_proj 38.3 -> 36.1 us
  // (docs/performance.md), while shorter rows lost with more splits.
  const int64_t target_warps = static_cast<int64_t>(num_sms) * 32 * (n_chunks >= 1024 ? 2 : 1);
  int split = 1;
  while (split < 8 && n * split < target_warps && n_chunks / (split * 2) >= 2 * kWarp) split *= 2;
  return split;
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

template <bool kFp8, int kSplit, OutKind kOut, bool kArgmax, int kU = kUnroll>
void launch_gemv_split(const LaunchCtx& ctx, const GemvParams& p, int grid_cap) {
  launch_persistent<gemv_kernel<kFp8, kSplit, kOut, kArgmax, kU>>(ctx, p, kGemvWarps / kSplit, grid_cap);
}

// ---- variant selection ------------------------------------------------------------------------------

/// The automatic variant per shape: the first rule whose kind and ranges hold wins; none: v1.
/// Filled from the gemv-sweep task of scripts/device/run.sh (docs/kernels.md), e.g.
/// {false, 8192, int64_t{1} << 40, 512, 2048, GemvVariant::rows2} for BF16 rows of k 512..2048 and
/// n >= 8192.
struct AutoRule {
  bool fp8;
  int64_t n_min, n_max;
  int k_min, k_max;
  GemvVariant variant;
};
// From the sweep on one H200 (docs/kernels.md, "Variants"; 2026-11-30; graph mode, % of copy):
// the heads gain from 4 rows per warp (one activation load feeds 4 rows: FP8 head 89.9 -> 95.1%,
// BF16 100.9 -> 102.1%); the FP8 eh_proj (56.4 -> 68.4%), q_b (76.8 -> 84.5%) and the k >= 8192
// BF16 GEMVs (eh_proj 80.7 -> 81.8%, o_proj 88.3 -> 88.7%) from the 64-warp occ kernel; kv_b and
// mla_out_v stay on v1 (every variant was slower or equal). All of these give v1's bits.
constexpr int64_t kAnyN = int64_t{1} << 40;
constexpr int kAnyK = 1 << 30;
constexpr std::array<AutoRule, 5> kAutoRules{{
    {false, 65536, kAnyN, 1, kAnyK, GemvVariant::rows4},  // the BF16 head
    {true, 65536, kAnyN, 1, kAnyK, GemvVariant::rows4},   // the FP8 head
    {true, 1, 65535, 1, kAnyK, GemvVariant::occ},         // FP8 eh_proj
    {false, 8192, 65535, 1024, 2048, GemvVariant::occ},   // q_b
    {false, 1, 16384, 8192, kAnyK, GemvVariant::occ},     // eh_proj, o_proj
}};

GemvVariant automatic_variant(bool fp8, int64_t n, int k) {
  for (const AutoRule& r : kAutoRules)
    if (r.fp8 == fp8 && n >= r.n_min && n <= r.n_max && k >= r.k_min && k <= r.k_max) return r.variant;
  return GemvVariant::v1;
}

/// What one GEMV launch runs: the kernel (v1 = gemv_kernel; rows2, rows4, occ = gemv_rows_kernel),
/// the k-split and the loads per lane and row in flight.
struct GemvPlan {
  GemvVariant kernel = GemvVariant::v1;
  int split = 1;
  int unroll = kUnroll;
};

/// The smallest of 2, 4, 8 that covers `per_lane` chunks, at most `cap`.
int unroll_for(int per_lane, int cap) {
  int u = 2;
  while (u < per_lane && u < cap) u *= 2;
  return u;
}

/// The instances that exist (launch_gemv): the rows kernels for splits 1, 2, 4 and occ for every
/// split, with the argmax only unsplit (the head's shapes), no fp32 output (router-sized GEMVs);
/// rows2 / rows4 only where every resident warp has its rows (n x split >= rows x 16 warps per SM)
/// and the rows of a block's iteration share their activation (one group, or groups of a multiple
/// of its rows: mla_out_v's 256). Anything else runs v1.
GemvPlan plan_gemv(const LaunchCtx& ctx, bool fp8, bool argmax, bool f32_out, int64_t n, int k,
                   int rows_per_group) {
  const int n_chunks = k / (fp8 ? 16 : 8);
  const int num_sms = ctx.num_sms;
  GemvVariant v = ctx.policy.gemv_variant;
  if (v == GemvVariant::automatic) v = automatic_variant(fp8, n, k);
  GemvPlan plan;
  plan.split = choose_split(n, n_chunks, ctx);
  // Rows of at most 2 chunks per lane (k <= 512 BF16 unsplit: mla_out_v, kv_b) need no 8-deep
  // unroll; the 2-deep kernel holds fewer registers, so twice the warps (and bytes) are in flight.
  // Each lane still adds its chunks in ascending order: the same bits as the 8-deep kernel.
  if (plan.split == 1 && n_chunks <= 2 * kWarp) plan.unroll = 2;
  if (v == GemvVariant::v1) return plan;
  if (v == GemvVariant::fp8split) {
    if (!fp8) return plan;
    // The split BF16 rows of k elements take (k / 8 chunks): for k >= 8192 two warps per resident
    // slot, so FP8 eh_proj runs 4 parts of 128 chunks instead of 2 of 256.
    plan.split = choose_split(n, k / 8, ctx);
    const int per_lane = (n_chunks + plan.split * kWarp - 1) / (plan.split * kWarp);
    plan.unroll = unroll_for(per_lane, kUnroll);
    return plan;
  }
  if (f32_out || (argmax && plan.split != 1)) return plan;
  const int per_lane = (n_chunks + plan.split * kWarp - 1) / (plan.split * kWarp);
  if (v == GemvVariant::occ) {
    // 2 loads per lane: at 4 the 32-register bound spills (ptxas, sm_90).
    plan.kernel = v;
    plan.unroll = 2;
    return plan;
  }
  const int rows = v == GemvVariant::rows2 ? 2 : 4;
  const int block_rows = kGemvWarps / std::min(plan.split, kGemvWarps) * rows;
  if (plan.split > 4 || n * plan.split < static_cast<int64_t>(rows) * num_sms * 16) return plan;
  if (rows_per_group < n && rows_per_group % block_rows != 0) return plan;
  plan.kernel = v;
  plan.unroll = unroll_for(per_lane, rows == 2 ? kUnroll : 4);
  return plan;
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

template <bool kFp8, OutKind kOut, bool kArgmax>
void launch_gemv(const LaunchCtx& ctx, const GemvParams& p, int grid_cap) {
  const GemvPlan plan = plan_gemv(ctx, kFp8, kArgmax, kOut == OutKind::f32, p.n, p.k, p.map.rows_per_group);
  if constexpr (kOut != OutKind::f32) {
    switch (plan.kernel) {
      case GemvVariant::rows2:
        return launch_rows_split<kFp8, kOut, kArgmax, 2, 1, 8, false>(ctx, p, grid_cap, plan);
      case GemvVariant::rows4:
        return launch_rows_split<kFp8, kOut, kArgmax, 4, 1, 4, false>(ctx, p, grid_cap, plan);
      case GemvVariant::occ:
        return launch_rows_split<kFp8, kOut, kArgmax, 1, kMaxBlocksPerSm, 2, true>(ctx, p, grid_cap, plan);
      default:
        break;
    }
  }
  if (plan.split == 1 && plan.unroll == 2)
    return launch_gemv_split<kFp8, 1, kOut, kArgmax, 2>(ctx, p, grid_cap);
  if constexpr (kFp8) {
    // fp8split: parts of at most 4 chunks per lane.
    if (plan.unroll == 4) {
      switch (plan.split) {
        case 1:
          return launch_gemv_split<kFp8, 1, kOut, kArgmax, 4>(ctx, p, grid_cap);
        case 2:
          return launch_gemv_split<kFp8, 2, kOut, kArgmax, 4>(ctx, p, grid_cap);
        case 4:
          return launch_gemv_split<kFp8, 4, kOut, kArgmax, 4>(ctx, p, grid_cap);
        default:
          return launch_gemv_split<kFp8, 8, kOut, kArgmax, 4>(ctx, p, grid_cap);
      }
    }
  }
  switch (plan.split) {
    case 1:
      return launch_gemv_split<kFp8, 1, kOut, kArgmax>(ctx, p, grid_cap);
    case 2:
      return launch_gemv_split<kFp8, 2, kOut, kArgmax>(ctx, p, grid_cap);
    case 4:
      return launch_gemv_split<kFp8, 4, kOut, kArgmax>(ctx, p, grid_cap);
    default:
      return launch_gemv_split<kFp8, 8, kOut, kArgmax>(ctx, p, grid_cap);
  }
}

/// The checked parameters of one GEMV launch of the launcher `op`: n >= 1, k a positive multiple of
/// a chunk (8 BF16 or 16 FP8 weights), W and x 16-byte aligned.
GemvParams gemv_params(const char* op, bool fp8, const void* W, const float* row_scale, const bf16* x,
                       void* y, int n, int k, const GemvRowMap& map) {
  const int chunk = fp8 ? 16 : 8;
  MTP_REQUIRE(n >= 1 && k >= 1 && k % chunk == 0, "ops::cuda::", op, ": n = ", n, ", k = ", k,
              " (k must be a positive multiple of ", chunk, ")");
  require_aligned(op, "W", W);
  require_aligned(op, "x", x);
  GemvParams p;
  p.W = W;
  p.row_scale = row_scale;
  p.x = x;
  p.y = y;
  p.n = n;
  p.k = k;
  p.map = map;
  return p;
}

// ---- several GEMVs of one x in one launch (linear_group) -----------------------------------------

/// One output of the group: its rows occupy virtual blocks [block_begin, block_begin + blocks).
struct GroupSegment {
  const uint8_t* W = nullptr;
  void* y = nullptr;
  int n = 0;
  int split = 1;  // the k-split gemv_bf16 would choose for this n alone: same order, same bits
  int block_begin = 0;
  int f32_out = 0;
  float scale = 1.0f;
};

struct GroupParams {
  GroupSegment seg[kMaxLinearGroup];
  int count = 0;
  int total_blocks = 0;
  const bf16* x = nullptr;
  int k = 0;
};

/// gemv_kernel with a run-time split chosen per output: a virtual block belongs to one output, so
/// the split (and the barriers of its combine) is uniform over the block. Per row: the same
/// chunk ranges per part, the same slice_dot, warp_sum and part order as gemv_kernel<kSplit>.
__global__ void __launch_bounds__(kGemvThreads) gemv_group_kernel(GroupParams p) {
  pdl_begin();
  const int n_chunks = p.k / 8;
  const size_t row_bytes = static_cast<size_t>(p.k) * 2;
  __shared__ float partial[kGemvWarps];
  for (int vb = blockIdx.x; vb < p.total_blocks; vb += gridDim.x) {
    int s = 0;
#pragma unroll
    for (int i = 1; i < kMaxLinearGroup; ++i)
      if (i < p.count && vb >= p.seg[i].block_begin) s = i;
    const GroupSegment& g = p.seg[s];
    const int split = g.split;
    const auto [warp, lane, part, local_row, c_begin, c_end] = warp_part(split, n_chunks);
    const int64_t r = static_cast<int64_t>(vb - g.block_begin) * (kGemvWarps / split) + local_row;
    float acc = 0.0f;
    if (r < g.n) {
      acc = slice_dot<false>(g.W + r * row_bytes, p.x, c_begin, c_end, lane);
      acc = warp_sum(acc);
    }
    if (split > 1) {
      if (lane == 0) partial[warp] = acc;
      __syncthreads();
      if (part == 0) acc = sum_parts(&partial[warp], split);
      __syncthreads();
    }
    if (part == 0 && lane == 0 && r < g.n) {
      if (g.f32_out) {
        static_cast<float*>(g.y)[r] = __fmul_rn(acc, g.scale);
      } else {
        static_cast<bf16*>(g.y)[r] = f_to_bf16(acc);
      }
    }
  }
}

// ---- argmax of a BF16 vector ----------------------------------------------------------------------

constexpr int kArgmaxThreads = 256;

__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_kernel(const bf16* x, int n, int64_t index_base, ArgMax* out, unsigned long long* partials,
                  unsigned int* counter) {
  pdl_begin();
  unsigned long long best = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const unsigned long long key = argmax_key(bf16_to_f(x[i]), static_cast<int32_t>(index_base + i));
    best = key > best ? key : best;
  }
  finish_argmax(best, partials, counter, out);
}

__global__ void pack_key_kernel(const ArgMax* in, uint64_t* key) {
  pdl_begin();
  *key = argmax_key(in->value, in->index);
}
__global__ void unpack_key_kernel(const uint64_t* key, int32_t* token) {
  pdl_begin();
  *token = static_cast<int32_t>(~static_cast<uint32_t>(*key & 0xffffffffull));
}
/// The index of the pair with the largest value among pairs[i * stride], i < n, the lowest index on
/// ties (pick_kernel, pick_rows_kernel).
__device__ __forceinline__ int32_t pick_index(const ArgMax* pairs, int n, size_t stride) {
  ArgMax best = pairs[0];
  for (int i = 1; i < n; ++i) {
    const ArgMax p = pairs[static_cast<size_t>(i) * stride];
    if (p.value > best.value || (p.value == best.value && p.index < best.index)) best = p;
  }
  return best.index;
}

/// Largest value, lowest index on ties (the CPU's comparison, applied to pairs in any order).
__global__ void pick_kernel(const ArgMax* pairs, int n, int32_t* token) {
  pdl_begin();
  *token = pick_index(pairs, n, 1);
}

}  // namespace

int gemv_max_grid(int num_sms) { return num_sms * kMaxBlocksPerSm; }

void gemv_bf16(const LaunchCtx& ctx, const bf16* W, const bf16* x, void* y, bool f32_out, int n, int k,
               const GemvRowMap& map) {
  const GemvParams p = gemv_params("gemv_bf16", false, W, nullptr, x, y, n, k, map);
  if (f32_out) {
    launch_gemv<false, OutKind::f32, false>(ctx, p, 0);
  } else {
    launch_gemv<false, OutKind::bf16, false>(ctx, p, 0);
  }
}

void gemv_group(const LaunchCtx& ctx, std::span<const LinearOut> outs, const bf16* x, int k) {
  MTP_REQUIRE(!outs.empty() && static_cast<int>(outs.size()) <= kMaxLinearGroup,
              "ops::cuda::linear_group: ", outs.size(), " outputs (1 .. ", kMaxLinearGroup, " allowed)");
  MTP_REQUIRE(k >= 1 && k % 8 == 0, "ops::cuda::linear_group: k = ", k,
              " (k must be a positive multiple of 8)");
  require_aligned("linear_group", "x", x);
  GroupParams p;
  p.x = x;
  p.k = k;
  p.count = static_cast<int>(outs.size());
  int blocks = 0;
  for (int i = 0; i < p.count; ++i) {
    const LinearOut& o = outs[static_cast<size_t>(i)];
    MTP_REQUIRE(o.W && o.y && o.n_out >= 1, "ops::cuda::linear_group: output ", i, " has W ", o.W, ", y ",
                o.y, ", n_out ", o.n_out);
    MTP_REQUIRE(o.f32_out || o.f32_scale == 1.0f, "ops::cuda::linear_group: output ", i,
                " is BF16 but has f32_scale ", o.f32_scale, " (only fp32 outputs are scaled)");
    require_aligned("linear_group", "W", o.W);
    GroupSegment& g = p.seg[i];
    g.W = reinterpret_cast<const uint8_t*>(o.W);
    g.y = o.y;
    g.n = o.n_out;
    g.split = choose_split(o.n_out, k / 8, ctx);
    g.block_begin = blocks;
    g.f32_out = o.f32_out ? 1 : 0;
    g.scale = o.f32_scale;
    const int rows_per_block = kGemvWarps / g.split;
    blocks += (o.n_out + rows_per_block - 1) / rows_per_block;
  }
  p.total_blocks = blocks;
  const int grid = std::min(blocks, resident_blocks_per_sm<gemv_group_kernel>() * ctx.num_sms);
  launch(ctx, gemv_group_kernel, static_cast<unsigned>(grid), kGemvThreads, 0, p);
  MTP_CUDA_LAUNCH_CHECK();
}

void gemv_fp8(const LaunchCtx& ctx, const fp8e4m3* W, const float* row_scale, const bf16* x, bf16* y, int n,
              int k) {
  const GemvParams p = gemv_params("gemv_fp8", true, W, row_scale, x, y, n, k, GemvRowMap{n, 0, 0, 0});
  launch_gemv<true, OutKind::bf16, false>(ctx, p, 0);
}

void head_argmax(const LaunchCtx& ctx, const bf16* W, const fp8e4m3* W_fp8, const float* row_scale,
                 const bf16* x, int n, int k, int64_t index_base, bf16* logits, ArgMax* out,
                 HeadExtras extras, const ArgmaxScratch& scratch) {
  const bool fp8 = W_fp8 != nullptr;
  GemvParams p =
      gemv_params("head_argmax", fp8, fp8 ? static_cast<const void*>(W_fp8) : static_cast<const void*>(W),
                  row_scale, x, logits, n, k, GemvRowMap{n, 0, 0, 0});
  p.index_base = index_base;
  p.out = out;
  p.extras = extras;
  p.partials = scratch.partials;
  p.counter = scratch.counter;
  if (fp8) {
    launch_gemv<true, OutKind::bf16, true>(ctx, p, scratch.capacity);
  } else {
    launch_gemv<false, OutKind::bf16, true>(ctx, p, scratch.capacity);
  }
}

void argmax(const LaunchCtx& ctx, const bf16* x, int n, int64_t index_base, ArgMax* out,
            const ArgmaxScratch& scratch) {
  MTP_REQUIRE(n >= 1, "ops::cuda::argmax: n = ", n);
  const int per_block = kArgmaxThreads * 16;
  const int grid =
      std::max(1, std::min({(n + per_block - 1) / per_block, 2 * ctx.num_sms, scratch.capacity}));
  launch(ctx, argmax_kernel, grid, kArgmaxThreads, 0, x, n, index_base, out, scratch.partials,
         scratch.counter);
  MTP_CUDA_LAUNCH_CHECK();
}

void argmax_pack_key(const LaunchCtx& ctx, const ArgMax* in, uint64_t* key) {
  launch(ctx, pack_key_kernel, 1, 1, 0, in, key);
  MTP_CUDA_LAUNCH_CHECK();
}

void argmax_unpack_key(const LaunchCtx& ctx, const uint64_t* key, int32_t* token) {
  launch(ctx, unpack_key_kernel, 1, 1, 0, key, token);
  MTP_CUDA_LAUNCH_CHECK();
}

void argmax_pick(const LaunchCtx& ctx, const ArgMax* pairs, int n, int32_t* token) {
  MTP_REQUIRE(n >= 1, "ops::cuda::argmax_pick: n = ", n);
  launch(ctx, pick_kernel, 1, 1, 0, pairs, n, token);
  MTP_CUDA_LAUNCH_CHECK();
}

// ==== batched rows =====================================================================================

namespace {

using batch::kChunkK;

constexpr int kGemmWarps = 8;
constexpr int kGemmThreads = kGemmWarps * kWarp;
constexpr int kTileRows = kGemmWarps * 16;  // W rows per block tile
constexpr int kXStages = 3;                 // batch-row chunks in the cp.async ring
constexpr int kXStride = kChunkK + 8;       // BF16 per staged row: 144 bytes, conflict-free 16-byte reads
constexpr int kWBuf = 3;                    // W chunks in the register ring: two ahead of the one computed

enum class Epi { head, bf16_out, f32_out };

struct GemmParams {
  const uint8_t* W = nullptr;  // BF16 or FP8 rows of k
  const float* row_scale = nullptr;
  const bf16* x = nullptr;
  int64_t ldx = 0;
  const int32_t* slot = nullptr;  // null: every row is live
  int rows = 0;
  int k = 0;
  GemvRowMap map;
  int tiles_per_group = 0;
  int total_tiles = 0;
  void* y = nullptr;  // Y (BF16 / fp32), or the head's logits (may be null)
  int64_t ldy = 0;
  int64_t index_base = 0;
  ArgMax* out = nullptr;
  HeadExtras extras;
  unsigned long long* best = nullptr;
  unsigned int* counter = nullptr;
};

/// Blocks per multiprocessor the register budget is set for: two for the widest FP8 tile (136
/// registers would leave one block, 8 warps, too few to hide the MMA chain's latency), else one.
template <bool kFp8, int kNT>
constexpr int rows_gemm_min_blocks() {
  return kFp8 && kNT == 16 ? 2 : 1;
}

// The resident mode (kRes) of the FP8 head at up to 16 batch rows: every batch row's whole x
// [NB][k] is staged into shared memory once per block, before the tile loop, so the chunk loop
// has no barrier and no copy to wait for, and W is kept kResWBuf - 1 chunks ahead in registers
// (the block holding up to 131 KB of x, fewer blocks share a multiprocessor, so each warp keeps
// more of W in flight). The staged rows are then rewritten in place as scaled FP16 (batch::
// f16_row_shift) and W is widened to FP16, one conversion a pair instead of two: the MMAs' order is
// the ring mode's and the products and sums are the BF16 operands' times the power of two the
// epilogue takes out again. Rows of k + 8 values (padded past k with zeros): the 16-byte reads of a
// quarter warp fall in distinct banks, as the ring's 72-value rows do.
constexpr int kResWBuf = 6;
/// Bytes of the resident x for `rows_padded` batch rows of k.
size_t resident_x_bytes(int rows_padded, int k) {
  const int kpad = (k + batch::kChunkK - 1) / batch::kChunkK * batch::kChunkK;
  return static_cast<size_t>(rows_padded) * (kpad + 8) * sizeof(bf16);
}

/// The epilogue of one tile of the skinny GEMM (rows_gemm and the wgmma head): acc[j][e] is (W row
/// r0 or r1 of the group, batch row 8j + 2t + (e & 1)). BF16 / fp32 outputs, or the head's logits
/// and their keys, reduced over the warp's 16 rows into s_best (shared atomics). s_shift (FP16
/// operands, batch::f16_row_shift; nullptr for BF16 ones): batch row b's x was scaled by
/// 2^s_shift[b], multiplied back out after the row scale (both exact: the BF16 operands' bits).
template <bool kFp8, int kNT, Epi kEpi>
__device__ __forceinline__ void tile_epilogue(const GemmParams& p, const float (&acc)[kNT][4], int group, int r0,
                                              int r1, bool ok0, bool ok1, int g, int t, const uint8_t* s_live,
                                              unsigned long long* s_best, const int* s_shift = nullptr) {
  const int rpg = p.map.rows_per_group;
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
    unsigned long long key_c[2] = {0ull, 0ull};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int rl = e < 2 ? r0 : r1;
      const bool ok = e < 2 ? ok0 : ok1;
      const int b = 8 * j + 2 * t + (e & 1);
      if (!ok || !s_live[b]) continue;
      const int64_t r = static_cast<int64_t>(group) * rpg + rl;  // output row
      float v = acc[j][e];
      if constexpr (kFp8) {
        v = __fmul_rn(p.row_scale[r], v);
        if (s_shift) v = ldexpf(v, -s_shift[b]);
      }
      if constexpr (kEpi == Epi::f32_out) {
        static_cast<float*>(p.y)[b * p.ldy + r] = v;
      } else {
        const bf16 lv = f_to_bf16(v);
        if constexpr (kEpi == Epi::bf16_out) {
          static_cast<bf16*>(p.y)[b * p.ldy + r] = lv;
        } else {
          if (p.y) static_cast<bf16*>(p.y)[b * p.ldy + r] = lv;
          const unsigned long long key = argmax_key(bf16_to_f(lv), static_cast<int32_t>(p.index_base + r));
          key_c[e & 1] = key > key_c[e & 1] ? key : key_c[e & 1];
        }
      }
    }
    if constexpr (kEpi == Epi::head) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        unsigned long long kc = key_c[c];
#pragma unroll
        for (int o = 4; o < kWarp; o <<= 1) {  // over g: the warp's 16 rows of this batch row
          const unsigned long long other = __shfl_xor_sync(0xffffffffu, kc, o);
          kc = other > kc ? other : kc;
        }
        if (g == 0 && kc != 0) atomicMax(&s_best[8 * j + 2 * t + c], kc);
      }
    }
  }
}

/// The head's grid-level argmax, after the block's last tile (the whole block calls it): the
/// block's keys into p.best (global atomicMax); the last block to finish writes out / extras and
/// resets the keys and the counter (the next launch starts from zeros: no memset, graph-safe).
template <int NB>
__device__ __forceinline__ void head_grid_finish(const GemmParams& p, const uint8_t* s_live,
                                                 const unsigned long long* s_best) {
  __shared__ bool s_last;
  __syncthreads();
  for (int b = threadIdx.x; b < NB; b += blockDim.x)
    if (s_best[b] != 0) atomicMax(p.best + b, s_best[b]);
  __threadfence();  // publish the keys before counting this block as done
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(p.counter, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  for (int b = threadIdx.x; b < NB; b += blockDim.x) {
    if (!s_live[b]) continue;
    // Read and reset in one step (the next launch starts from zeros).
    const unsigned long long key = atomicExch(p.best + b, 0ull);
    ArgMax a;
    a.value = from_order_preserving_u32(static_cast<uint32_t>(key >> 32));
    a.index = static_cast<int32_t>(~static_cast<uint32_t>(key & 0xffffffffull));
    p.out[b] = a;
    // key is argmax_key of the pair just written (-0 is keyed as +0 and comes back as +0), so
    // it is argmax_pack_key's.
    if (p.extras.key) p.extras.key[b] = key;
    if (p.extras.token) p.extras.token[b] = a.index;
  }
  if (threadIdx.x == 0) *p.counter = 0;
}

template <bool kFp8, int kNT, Epi kEpi, bool kRes = false>
__global__ void __launch_bounds__(kGemmThreads, rows_gemm_min_blocks<kFp8, kNT>())
    rows_gemm_kernel(GemmParams p) {
  pdl_begin();
  constexpr int NB = 8 * kNT;          // batch rows (MMA columns) held by the block
  constexpr int kWVec = kFp8 ? 1 : 2;  // 16-byte W vectors per row, chunk and lane
  extern __shared__ __align__(16) uint8_t gemm_smem[];
  bf16* xs = reinterpret_cast<bf16*>(gemm_smem);  // ring: [kXStages][NB][kXStride]; kRes: [NB][ldr]
  __shared__ uint8_t s_live[NB];
  __shared__ unsigned long long s_best[kEpi == Epi::head ? NB : 1];
  __shared__ int s_shift[kRes ? NB : 1];  // kRes: FP16 operands (batch::f16_row_shift)
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int g = lane >> 2;
  const int t = lane & 3;
  for (int b = threadIdx.x; b < NB; b += blockDim.x) {
    s_live[b] = b < p.rows && (p.slot == nullptr || p.slot[b] >= 0);
    if constexpr (kEpi == Epi::head) s_best[b] = 0;
  }
  __syncthreads();
  const int nchunks = (p.k + kChunkK - 1) / kChunkK;
  const size_t row_bytes = static_cast<size_t>(p.k) * (kFp8 ? 1 : 2);
  const int rpg = p.map.rows_per_group;
  const int ldr = nchunks * kChunkK + 8;  // kRes: BF16 per resident x row
  if constexpr (kRes) {
    // One group (checked at launch): every live row's x, zeros past k and for padded rows.
    const int vecs = nchunks * kChunkK / 8;
    for (int v = threadIdx.x; v < NB * vecs; v += blockDim.x) {
      const int b = v / vecs;
      const int c8 = (v - b * vecs) * 8;
      const bool ok = s_live[b] && c8 < p.k;
      batch::cp_async16(xs + static_cast<size_t>(b) * ldr + c8, ok ? p.x + b * p.ldx + c8 : p.x, ok ? 16 : 0);
    }
    batch::cp_async_commit();
    batch::cp_async_wait<0>();
    __syncthreads();
    // Each row as scaled FP16 in place (a warp a row): the widening of W is then one conversion a
    // pair (batch::fp8x16_to_f16x16), which is what bounds this kernel.
    for (int b = warp; b < NB; b += kGemmThreads / kWarp) {
      uint4* row = reinterpret_cast<uint4*>(xs + static_cast<size_t>(b) * ldr);
      float m = 0.0f;
      for (int v = lane; v < vecs; v += kWarp) {
        const uint4 q = row[v];
        m = batch::bf16x2_max_abs(q.x, batch::bf16x2_max_abs(q.y, batch::bf16x2_max_abs(q.z, batch::bf16x2_max_abs(q.w, m))));
      }
#pragma unroll
      for (int o = kWarp / 2; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      const int sh = batch::f16_row_shift(m);
      for (int v = lane; v < vecs; v += kWarp) {
        const uint4 q = row[v];
        row[v] = make_uint4(batch::bf16x2_to_f16x2_shifted(q.x, sh), batch::bf16x2_to_f16x2_shifted(q.y, sh),
                            batch::bf16x2_to_f16x2_shifted(q.z, sh), batch::bf16x2_to_f16x2_shifted(q.w, sh));
      }
      if (lane == 0) s_shift[b] = sh;
    }
    __syncthreads();
  }

  for (int tile = blockIdx.x; tile < p.total_tiles; tile += gridDim.x) {
    const int group = tile / p.tiles_per_group;
    const int r0 = (tile - group * p.tiles_per_group) * kTileRows + warp * 16 + g;  // rows within the group
    const int r1 = r0 + 8;
    const bool ok0 = r0 < rpg;
    const bool ok1 = r1 < rpg;
    const int64_t wrow0 = group * p.map.group_stride_rows + p.map.row_offset + r0;
    const uint8_t* w0 = p.W + static_cast<size_t>(wrow0) * row_bytes;
    const uint8_t* w1 = w0 + 8 * row_bytes;
    const bf16* xg = p.x + group * p.map.x_group_stride;

    // Chunk c of every batch row into stage st (16-byte copies; padded rows and columns past k
    // are zero-filled without a read).
    auto stage = [&](int c, int st) {
      bf16* dst = xs + static_cast<size_t>(st) * NB * kXStride;
      const int col0 = c * kChunkK;
      for (int v = threadIdx.x; v < NB * 8; v += blockDim.x) {
        const int b = v >> 3;
        const int c8 = (v & 7) * 8;
        const bool ok = s_live[b] && col0 + c8 < p.k;
        const bf16* src = ok ? xg + b * p.ldx + col0 + c8 : p.x;
        batch::cp_async16(dst + b * kXStride + c8, src, ok ? 16 : 0);
      }
    };
    // This lane's 16 physical columns of chunk c of its two W rows.
    auto load_w = [&](uint4(&dst)[2 * kWVec], int c) {
      const int col = c * kChunkK + 16 * t;
      const bool in = col < p.k;
      const size_t off = static_cast<size_t>(col) * (kFp8 ? 1 : 2);
#pragma unroll
      for (int v = 0; v < kWVec; ++v) {
        dst[v] = ok0 && in ? load_stream(w0 + off + 16 * v) : make_uint4(0, 0, 0, 0);
        dst[kWVec + v] = ok1 && in ? load_stream(w1 + off + 16 * v) : make_uint4(0, 0, 0, 0);
      }
    };

    // One chunk's MMAs: the lane's W vectors widened (FP8) or taken as BF16 pairs into the A
    // fragments, every column tile's B fragments from the staged rows (x_rows: the chunk's column 0
    // of batch row 0, row_stride values apart).
    auto mma_w_chunk = [&](const uint4(&w)[2 * kWVec], const bf16* x_rows, int row_stride,
                           float(&acc)[kNT][4]) {
      uint32_t wa[8], wb[8];
      if constexpr (kFp8 && kRes) {
        batch::fp8x16_to_f16x16(w[0], wa);
        batch::fp8x16_to_f16x16(w[1], wb);
      } else if constexpr (kFp8) {
        batch::fp8x16_to_bf16x16(w[0], wa);
        batch::fp8x16_to_bf16x16(w[1], wb);
      } else {
        batch::words8(w[0], w[1], wa);
        batch::words8(w[2], w[3], wb);
      }
      uint32_t a[4][4];
      batch::a_frags(wa, wb, a);
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        const bf16* xr = x_rows + static_cast<size_t>(8 * j + g) * row_stride + 16 * t;
        uint32_t bw[8];
        batch::words8(*reinterpret_cast<const uint4*>(xr), *reinterpret_cast<const uint4*>(xr + 8), bw);
        batch::mma_chunk<kRes>(acc[j], a, bw);
      }
    };

    float acc[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    if constexpr (kRes) {
      uint4 wr[kResWBuf][2 * kWVec];
#pragma unroll
      for (int u = 0; u < kResWBuf - 1; ++u)
        if (u < nchunks) load_w(wr[u], u);
      for (int c0 = 0; c0 < nchunks; c0 += kResWBuf) {
#pragma unroll
        for (int u = 0; u < kResWBuf; ++u) {
          const int c = c0 + u;
          if (c >= nchunks) break;  // uniform
          if (c + kResWBuf - 1 < nchunks) load_w(wr[(u + kResWBuf - 1) % kResWBuf], c + kResWBuf - 1);
          mma_w_chunk(wr[u], xs + c * kChunkK, ldr, acc);
        }
      }
    } else {
      for (int s = 0; s < kXStages - 1; ++s) {
        if (s < nchunks) stage(s, s);
        batch::cp_async_commit();
      }
      uint4 wr[kWBuf][2 * kWVec];
#pragma unroll
      for (int u = 0; u < kWBuf - 1; ++u)
        if (u < nchunks) load_w(wr[u], u);

      for (int c0 = 0; c0 < nchunks; c0 += kWBuf) {
#pragma unroll
        for (int u = 0; u < kWBuf; ++u) {
          const int c = c0 + u;
          if (c >= nchunks) break;  // uniform
          if (c + kWBuf - 1 < nchunks) load_w(wr[(u + kWBuf - 1) % kWBuf], c + kWBuf - 1);
          if (c + kXStages - 1 < nchunks) stage(c + kXStages - 1, (c + kXStages - 1) % kXStages);
          batch::cp_async_commit();
          batch::cp_async_wait<kXStages - 1>();  // chunk c's group has landed
          __syncthreads();
          mma_w_chunk(wr[u], xs + static_cast<size_t>(c % kXStages) * NB * kXStride, kXStride, acc);
          __syncthreads();  // stage c % kXStages is refilled by the next iteration's copy
        }
      }
    }

    tile_epilogue<kFp8, kNT, kEpi>(p, acc, group, r0, r1, ok0, ok1, g, t, s_live, s_best,
                                   kRes ? s_shift : nullptr);
  }
  if constexpr (kEpi == Epi::head) head_grid_finish<NB>(p, s_live, s_best);
}

/// Column tiles of 8 for `rows` batch rows: 1, 2, 4, 8 or 16.
int column_tiles(int rows) {
  int nt = 1;
  while (8 * nt < rows) nt *= 2;
  return nt;
}

template <bool kFp8, int kNT, Epi kEpi>
void launch_rows_gemm_resident(const LaunchCtx& ctx, const GemmParams& p) {
  constexpr auto kernel = rows_gemm_kernel<kFp8, kNT, kEpi, true>;
  const size_t smem = resident_x_bytes(8 * kNT, p.k);
  static const int max_smem = opt_in_dynamic_smem(kernel);
  MTP_REQUIRE(smem <= static_cast<size_t>(max_smem), "ops::cuda::rows_gemm: resident x of ", smem,
              " bytes (at most ", max_smem, ")");
  int per_sm = 0;
  MTP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kGemmThreads, smem));
  const int grid = std::max(1, std::min(p.total_tiles, std::max(1, per_sm) * ctx.num_sms));
  launch(ctx, kernel, static_cast<unsigned>(grid), kGemmThreads, smem, p);
  MTP_CUDA_LAUNCH_CHECK();
}

/// Whether a launch takes the resident mode: the FP8 head at up to 16 rows (1 or 2 column tiles),
/// one group of rows, and x fitting in shared memory (kRes above).
template <bool kFp8, int kNT, Epi kEpi>
bool rows_gemm_resident(const GemmParams& p) {
  if constexpr (!kFp8 || kEpi != Epi::head || kNT > 2) {
    return false;
  } else {
    return p.total_tiles == p.tiles_per_group && resident_x_bytes(8 * kNT, p.k) <= 160 * 1024;
  }
}

template <bool kFp8, int kNT, Epi kEpi>
void launch_rows_gemm(const LaunchCtx& ctx, const GemmParams& p) {
  if (rows_gemm_resident<kFp8, kNT, kEpi>(p)) return launch_rows_gemm_resident<kFp8, kNT, kEpi>(ctx, p);
  constexpr auto kernel = rows_gemm_kernel<kFp8, kNT, kEpi>;
  constexpr int kSmem = kXStages * 8 * kNT * kXStride * 2;
  static const int blocks_per_sm = [] {
    if (kSmem > 48 * 1024)
      MTP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    int b = 0;
    MTP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kGemmThreads, kSmem));
    return std::max(1, b);
  }();
  const int grid = std::max(1, std::min(p.total_tiles, blocks_per_sm * ctx.num_sms));
  launch(ctx, kernel, static_cast<unsigned>(grid), kGemmThreads, static_cast<size_t>(kSmem), p);
  MTP_CUDA_LAUNCH_CHECK();
}


// ---- the FP8 head on wgmma (head_wgmma_kernel) -------------------------------------------------------
//
// From 16 batch rows the FP8 head's mma.sync kernel is bound by its shared-memory reads: each warp
// reads every batch row's chunk for its own 16 W rows (256 bytes of B per MMA), and at 128 rows it
// took 688 us for a 150 us byte floor. Here a block of two warpgroups owns a tile of 128 W rows
// (64 a warpgroup, 16 a warp: the rows and loads of rows_gemm_kernel, so every W element is
// loaded once, by the lane whose A fragment holds it, and widened to FP16 there) and every batch row (kNB of them, the
// wgmma's N). The widened W rows are the A operand in registers; the batch rows' chunk is B, read
// by the tensor cores straight from shared memory, once per warpgroup.
// - x is packed once per launch (head_pack_x_kernel) into the wgmma's canonical no-swizzle layout,
//   chunk after chunk of 64 columns, with the column relabelling of the A fragments built into it
//   (docs/kernels.md, "The FP8 head on wgmma"); the block stages a chunk with plain 16-byte copies
//   into a kWgStages-chunk cp.async ring, kWgAhead chunks ahead.
// - W is kept kWgWBuf - 1 chunks ahead in registers; a chunk's four wgmmas (one a k-step of 16)
//   are one group, retired (wait_group 0) before the next chunk is widened into the same A
//   registers (a second A buffer with wait_group 1 made ptxas serialize every wgmma, C7513); two
//   blocks a multiprocessor overlap one block's widening with the other's MMAs.
// - The epilogue and the grid-level argmax are rows_gemm_kernel's (tile_epilogue,
//   head_grid_finish).
// x is packed as FP16 scaled per row by a power of two (batch::f16_row_shift), taken out in the
// epilogue. A logit is the full fp32 dot product of its widened W row and x row, times the row
// scale, in the wgmma's summation order (on an H200 byte-equal to the mma.sync kernel's; not
// promised); a batch row's logits do not depend on the other rows.

constexpr int kWgStages = 5;
constexpr int kWgAhead = kWgStages - 2;  // chunks c + 1 .. c + kWgAhead in flight while c computes
/// W chunks in registers (kWgWBuf - 1 ahead): 4, or 3 at 128 batch rows (two blocks a
/// multiprocessor leave 128 registers a thread; the 64 accumulators take half).
template <int kNB>
constexpr int wgmma_wbuf() {
  return kNB >= 128 ? 3 : 4;
}

/// Packed x of kNB batch rows: chunk c, k-step s, half h, batch row n, 8 values. Value 2t + e of
/// (c, s, h, n) is x[n][64c + 16t + 4s + 2h + e]: the A fragments' pairing (batch::a_frags), so the
/// k index of a k-step's core matrices matches the W columns a lane widened. Zeros for padded
/// rows and past k.
__device__ __forceinline__ size_t packed_x_index(int c, int s, int h, int n, int nb) {
  return ((static_cast<size_t>(c) * 4 + s) * 2 + h) * static_cast<size_t>(nb) * 8 + static_cast<size_t>(n) * 8;
}

/// The shifts of the packed rows (batch::f16_row_shift), after the largest packed x.
__device__ __forceinline__ int* packed_x_shifts(bf16* xp, int k) {
  return reinterpret_cast<int*>(xp + static_cast<size_t>((k + kChunkK - 1) / kChunkK) * kChunkK * kMaxBatchRows);
}

/// One block a batch row n (grid nb): the row's largest magnitude, its shift, then the row as
/// scaled FP16 pairs in the packed layout.
__global__ void __launch_bounds__(256) head_pack_x_kernel(const bf16* x, int64_t ldx, const int32_t* slot,
                                                          int rows, int k, int nb, bf16* xp) {
  pdl_begin();
  __shared__ float s_max[256 / kWarp];
  const int n = blockIdx.x;
  const bool live = n < rows && (slot == nullptr || slot[n] >= 0);
  const bf16* xr = x + n * ldx;
  float m = 0.0f;
  if (live)
    for (int col = 2 * threadIdx.x; col < k; col += 2 * blockDim.x)
      m = batch::bf16x2_max_abs(*reinterpret_cast<const uint32_t*>(xr + col), m);
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (threadIdx.x % kWarp == 0) s_max[threadIdx.x / kWarp] = m;
  __syncthreads();
  m = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) m = fmaxf(m, s_max[w]);
  const int shift = batch::f16_row_shift(m);
  if (threadIdx.x == 0) packed_x_shifts(xp, k)[n] = shift;
  const int nchunks = (k + kChunkK - 1) / kChunkK;
  for (int u = threadIdx.x; u < nchunks * 8; u += blockDim.x) {  // this row's 16-byte units
    const int c = u / 8, s = (u % 8) / 2, h = u % 2;
    uint32_t w[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int col = c * kChunkK + 16 * t + 4 * s + 2 * h;
      w[t] = live && col < k ? batch::bf16x2_to_f16x2_shifted(*reinterpret_cast<const uint32_t*>(xr + col), shift)
                             : 0u;
    }
    *reinterpret_cast<uint4*>(xp + packed_x_index(c, s, h, n, nb)) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

template <int kNB>
__global__ void __launch_bounds__(kGemmThreads, 2) head_wgmma_kernel(GemmParams p, const bf16* xp) {
  pdl_begin();
#if MTPLAB_WGMMA
  constexpr int kNT = kNB / 8;
  constexpr int kWgWBuf = wgmma_wbuf<kNB>();
  constexpr size_t kStageElems = static_cast<size_t>(kNB) * kChunkK;
  constexpr uint32_t kLbo = 16 * kNB;  // bytes between the two K-halves of a k-step
  constexpr uint32_t kSbo = 128;       // bytes between groups of 8 batch rows
  extern __shared__ __align__(128) uint8_t wg_smem[];
  bf16* xs = reinterpret_cast<bf16*>(wg_smem);  // [kWgStages][kStageElems]
  __shared__ uint8_t s_live[kNB];
  __shared__ unsigned long long s_best[kNB];
  __shared__ int s_shift[kNB];
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int* shifts = packed_x_shifts(const_cast<bf16*>(xp), p.k);
  for (int b = threadIdx.x; b < kNB; b += blockDim.x) {
    s_live[b] = b < p.rows && (p.slot == nullptr || p.slot[b] >= 0);
    s_best[b] = 0;
    s_shift[b] = shifts[b];
  }
  const int nchunks = (p.k + kChunkK - 1) / kChunkK;
  const size_t row_bytes = static_cast<size_t>(p.k);
  const int rpg = p.map.rows_per_group;

  for (int tile = blockIdx.x; tile < p.total_tiles; tile += gridDim.x) {
    __syncthreads();  // s_live is set; the last tile's wgmmas of both warpgroups have retired
    const int r0 = tile * kTileRows + warp * 16 + g;
    const int r1 = r0 + 8;
    const bool ok0 = r0 < rpg;
    const bool ok1 = r1 < rpg;
    const uint8_t* w0 = p.W + static_cast<size_t>(r0) * row_bytes;
    const uint8_t* w1 = w0 + 8 * row_bytes;
    auto stage = [&](int c) {
      const bf16* src = xp + static_cast<size_t>(c) * kStageElems;
      bf16* dst = xs + static_cast<size_t>(c % kWgStages) * kStageElems;
      for (int v = threadIdx.x; v < kNB * 8; v += blockDim.x) batch::cp_async16(dst + 8 * v, src + 8 * v, 16);
    };
    auto load_w = [&](uint4(&dst)[2], int c) {
      const int col = c * kChunkK + 16 * t;
      const bool in = col < p.k;
      dst[0] = ok0 && in ? load_stream(w0 + col) : make_uint4(0, 0, 0, 0);
      dst[1] = ok1 && in ? load_stream(w1 + col) : make_uint4(0, 0, 0, 0);
    };
    for (int c = 0; c < kWgAhead; ++c) {
      if (c < nchunks) stage(c);
      batch::cp_async_commit();
    }
    uint4 wr[kWgWBuf][2];
#pragma unroll
    for (int u = 0; u < kWgWBuf - 1; ++u)
      if (u < nchunks) load_w(wr[u], u);
    float acc[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    uint32_t a[4][4];
    for (int c0 = 0; c0 < nchunks; c0 += kWgWBuf) {
#pragma unroll
      for (int u = 0; u < kWgWBuf; ++u) {
        const int c = c0 + u;
        if (c >= nchunks) break;  // uniform
        if (c + kWgWBuf - 1 < nchunks) load_w(wr[(u + kWgWBuf - 1) % kWgWBuf], c + kWgWBuf - 1);
        {  // chunk c's A fragments (chunk c - 1's group has retired)
          uint32_t wa[8], wb[8];
          batch::fp8x16_to_f16x16(wr[u][0], wa);
          batch::fp8x16_to_f16x16(wr[u][1], wb);
          batch::a_frags(wa, wb, a);
        }
        batch::cp_async_wait<kWgAhead - 1>();  // this thread's copies of chunk c have landed
        wg::fence_proxy_shared();
        __syncthreads();  // everyone's copies of c; every warpgroup past chunk c - 2's group
        if (c + kWgAhead < nchunks) stage(c + kWgAhead);  // into chunk c - 2's stage
        batch::cp_async_commit();
        const bf16* xc = xs + static_cast<size_t>(c % kWgStages) * kStageElems;
        wg::fence();
#pragma unroll
        for (int s = 0; s < 4; ++s)
          wg::mma_f16<kNB>(&acc[0][0], a[s], wg::desc(xc + static_cast<size_t>(s) * 2 * kNB * 8, kLbo, kSbo));
        wg::commit();
        wg::wait<0>();  // A is rewritten next (ptxas serializes every wgmma if A is defined while one is pending)
      }
    }
    wg::wait<0>();
    wg::fence_acc<kNB / 2>(&acc[0][0]);
    tile_epilogue<true, kNT, Epi::head>(p, acc, 0, r0, r1, ok0, ok1, g, t, s_live, s_best, s_shift);
  }
  head_grid_finish<kNB>(p, s_live, s_best);
#endif
}

/// Bytes of the wgmma head's ring at kNB batch rows.
constexpr size_t wgmma_ring_bytes(int nb) { return static_cast<size_t>(kWgStages) * nb * kChunkK * sizeof(bf16); }

template <int kNB>
void launch_head_wgmma(const LaunchCtx& ctx, const GemmParams& p, bf16* xp) {
  constexpr auto kernel = head_wgmma_kernel<kNB>;
  constexpr size_t smem = wgmma_ring_bytes(kNB);
  static const int per_sm = [] {
    MTP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    int b = 0;
    MTP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kGemmThreads, smem));
    return std::max(1, b);
  }();
  launch(ctx, head_pack_x_kernel, static_cast<unsigned>(kNB), 256, 0, p.x, p.ldx, p.slot, p.rows, p.k, kNB, xp);
  MTP_CUDA_LAUNCH_CHECK();
  const int grid = std::max(1, std::min(p.total_tiles, per_sm * ctx.num_sms));
  launch(ctx, kernel, static_cast<unsigned>(grid), kGemmThreads, smem, p, static_cast<const bf16*>(xp));
  MTP_CUDA_LAUNCH_CHECK();
}

void dispatch_head_wgmma(const LaunchCtx& ctx, const GemmParams& p, bf16* xp) {
  switch (column_tiles(p.rows)) {
    case 1:
    case 2:
      return launch_head_wgmma<16>(ctx, p, xp);
    case 4:
      return launch_head_wgmma<32>(ctx, p, xp);
    case 8:
      return launch_head_wgmma<64>(ctx, p, xp);
    default:
      return launch_head_wgmma<128>(ctx, p, xp);
  }
}

template <bool kFp8, Epi kEpi>
void dispatch_rows_gemm(const LaunchCtx& ctx, const GemmParams& p) {
  switch (column_tiles(p.rows)) {
    case 1:
      return launch_rows_gemm<kFp8, 1, kEpi>(ctx, p);
    case 2:
      return launch_rows_gemm<kFp8, 2, kEpi>(ctx, p);
    case 4:
      return launch_rows_gemm<kFp8, 4, kEpi>(ctx, p);
    case 8:
      return launch_rows_gemm<kFp8, 8, kEpi>(ctx, p);
    default:
      return launch_rows_gemm<kFp8, 16, kEpi>(ctx, p);
  }
}

void require_aligned16(const char* op, const char* what, const void* ptr) {
  MTP_REQUIRE(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, "ops::cuda::", op, ": ", what,
              " is not 16-byte aligned (the batched GEMM loads 16-byte vectors)");
}

// ---- the multi-row GEMV (rows_gemv) -----------------------------------------------------------------
//
// Y[r, n] = W[n] . X[r] for R = 2 .. kMaxRowsGemv rows, every W element loaded once for all rows.
// A warp owns one part of k: 32 chunks of 8 columns, one chunk per lane, whose R activation chunks
// the lane holds in registers as fp32 for the whole launch. A block is a tile of up to kRgWarps
// consecutive parts (2048 columns; blockIdx.y is the tile) and walks groups of kU output rows
// (blockIdx.x, grid-stride): each lane streams its chunk of the kU weight rows (16-byte loads, the
// next group's issued before the current group is reduced), does kR x 8 FMAs per chunk, the warp
// reduces its kU x kR sums with a reduce-scatter butterfly, the tile's parts are summed in shared
// memory in part order, and the tiles in tile order: directly into Y when k fits one tile, else
// through a workspace [tiles][rows][n] whose last-arriving block (a per-group counter that the
// same block resets) adds the tiles' sums and writes Y.
//
// Invariance: output (r, n) is the same fp32 function of W[n] and X[r] whatever R, the other rows
// or the grid: the lane that owns a chunk depends only on k, each lane's 8 products are summed in
// column order into an accumulator of row r alone, the butterfly adds the same pairs as warp_sum
// (same xor order 16 .. 1, each pair the lane's own partial plus its partner's), and the parts and
// tiles are summed in index order. kR, kU and the grid only decide which rows share a launch, a
// group or a block, so a row's bits at B = 2 are its bits at B = 16. (It is not gemv_bf16's order:
// the single-row GEMV splits k per shape, this kernel always in parts of 256 columns.)

constexpr int kRgWarps = 8;             // parts per tile = warps per block
constexpr int kRgPartCols = 8 * kWarp;  // columns of a part: one 16-byte chunk per lane
constexpr int kRgTileCols = kRgWarps * kRgPartCols;

/// One output of a rows_gemv launch: W [n, k] rows, y [rows][n]; virtual rows first .. first + n - 1
/// of the launch. BF16 y rounded once; fp32 y times `scale` in fp32 when scale != 1 (as scale_f32).
struct RowsGemvOut {
  const bf16* W = nullptr;
  void* y = nullptr;
  int n = 0;
  int first = 0;
  int f32 = 0;
  float scale = 1.0f;
};
inline constexpr int kMaxRowsGemvOuts = kMaxLinearGroup;

struct RowsGemvParams {
  RowsGemvOut out[kMaxRowsGemvOuts];
  int n_outs = 0;
  const bf16* x = nullptr;
  int rows = 0;
  int n = 0;  // virtual rows: every output's n, in output order
  int k = 0;
  int tiles = 1;
  float* ws = nullptr;              // [tiles][rows][n] tile sums (tiles > 1)
  unsigned int* counter = nullptr;  // per row group, zero between launches (tiles > 1)
};

/// The output holding virtual row `row` (row < p.n).
__device__ __forceinline__ int rows_gemv_out_of(const RowsGemvParams& p, int row) {
  int o = 0;
  while (o + 1 < p.n_outs && row >= p.out[o + 1].first) ++o;
  return o;
}

/// The warp's kM values per lane (kM a power of two, at most 32) summed over the 32 lanes: at each
/// xor offset 16, 8, .. a lane keeps half of its values and adds its partner's copy of that half
/// (while halves remain; then the plain butterfly), so every sum is bit for bit warp_sum's of that
/// value. On return v[0] of lane l is value l / (32 / kM)'s sum.
template <int kM, int kLen, int kO>
__device__ __forceinline__ void warp_reduce_scatter_from(float (&v)[kM], int lane) {
  if constexpr (kO >= 1) {
    if constexpr (kLen >= 2) {
      constexpr int kHalf = kLen / 2;
      const bool upper = (lane & kO) != 0;
#pragma unroll
      for (int i = 0; i < kHalf; ++i) {
        const float send = upper ? v[i] : v[i + kHalf];
        const float keep = upper ? v[i + kHalf] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kO);
      }
      warp_reduce_scatter_from<kM, kHalf, kO / 2>(v, lane);
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], kO);
      warp_reduce_scatter_from<kM, 1, kO / 2>(v, lane);
    }
  }
}
template <int kM>
__device__ __forceinline__ void warp_reduce_scatter(float (&v)[kM], int lane) {
  static_assert(kM >= 1 && kM <= kWarp && (kM & (kM - 1)) == 0, "kM: a power of two up to 32");
  warp_reduce_scatter_from<kM, kM, kWarp / 2>(v, lane);
}

__device__ __forceinline__ void rows_gemv_store(const RowsGemvParams& p, int r, int row, float v) {
  const RowsGemvOut& o = p.out[rows_gemv_out_of(p, row)];
  const size_t at = static_cast<size_t>(r) * o.n + (row - o.first);
  if (o.f32) {
    static_cast<float*>(o.y)[at] = o.scale != 1.0f ? __fmul_rn(v, o.scale) : v;
  } else {
    static_cast<bf16*>(o.y)[at] = f_to_bf16(v);
  }
}

template <int kR, int kU, int kW>
__global__ void __launch_bounds__(kW* kWarp) rows_gemv_kernel(RowsGemvParams p) {
  static_assert(kW % kRgWarps == 0, "a block is whole tiles of kRgWarps parts");
  pdl_begin();
  constexpr int kM = kR * kU;  // sums per warp and group: value u * kR + r
  constexpr int kLanesPerValue = kWarp / kM;
  __shared__ float s_part[kM][kW];
  __shared__ bool s_last;
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int tile = blockIdx.y;  // of kW parts (kW / kRgWarps tiles of kRgWarps parts, one launch tile)
  const int n_chunks = p.k / 8;
  const int n_parts = (n_chunks + kWarp - 1) / kWarp;
  const int tile_parts = min(kW, n_parts - tile * kW);
  const int chunk = (tile * kW + warp) * kWarp + lane;
  const bool active = warp < tile_parts && chunk < n_chunks;

  // This lane's chunk of every row of X, as fp32 (zeros past the rows or k).
  float xf[kR][8];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const uint4 v = active && r < p.rows ? load_cached(p.x + static_cast<size_t>(r) * p.k + chunk * 8)
                                         : make_uint4(0, 0, 0, 0);
    batch::unpack8(v, xf[r]);
  }

  const size_t row_bytes = static_cast<size_t>(p.k) * 2;
  const int groups = (p.n + kU - 1) / kU;
  auto load_group = [&](uint4(&w)[kU], int g) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int row = g * kU + u;
      if (active && row < p.n) {
        const RowsGemvOut& o = p.out[rows_gemv_out_of(p, row)];
        w[u] = load_stream(reinterpret_cast<const uint8_t*>(o.W) + static_cast<size_t>(row - o.first) * row_bytes +
                           static_cast<size_t>(chunk) * 16);
      } else {
        w[u] = make_uint4(0, 0, 0, 0);
      }
    }
  };
  uint4 w[kU];
  if (static_cast<int>(blockIdx.x) < groups) load_group(w, blockIdx.x);

  for (int g = blockIdx.x; g < groups; g += gridDim.x) {
    float v[kM];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      float wf[8];
      batch::unpack8(w[u], wf);
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        float acc = 0.0f;
        if (kR == 2 || r < p.rows) {
#pragma unroll
          for (int e = 0; e < 8; ++e) acc = fmaf(wf[e], xf[r][e], acc);
        }
        v[u * kR + r] = acc;
      }
    }
    // The next group's weights are in flight while this group is reduced and combined.
    if (g + static_cast<int>(gridDim.x) < groups) load_group(w, g + gridDim.x);
    warp_reduce_scatter<kM>(v, lane);
    if (warp < tile_parts && lane % kLanesPerValue == 0) s_part[lane / kLanesPerValue][warp] = v[0];
    __syncthreads();
    // Thread t < kM: value t of the group, its tile's parts in part order.
    const int t = threadIdx.x;
    const int r = t % kR;
    const int row = g * kU + t / kR;
    const bool ok = t < kM && r < p.rows && row < p.n;
    float sum = 0.0f;
    if (ok) {
      // Each kRgWarps parts summed in part order, then those sums in order: the association of
      // kRgWarps-part tiles summed in tile order, whatever kW.
      sum = sum_parts(&s_part[t][0], min(kRgWarps, tile_parts));
      for (int q0 = kRgWarps; q0 < tile_parts; q0 += kRgWarps)
        sum += sum_parts(&s_part[t][q0], min(kRgWarps, tile_parts - q0));
    }
    __syncthreads();  // s_part is rewritten by the next group
    if (p.tiles == 1) {
      if (ok) rows_gemv_store(p, r, row, sum);
      continue;
    }
    float* ws_at = p.ws + static_cast<size_t>(r) * p.n + row;  // + tile * rows * n
    const size_t tile_stride = static_cast<size_t>(p.rows) * p.n;
    if (ok) ws_at[tile * tile_stride] = sum;
    __threadfence();  // publish the tile's sums before counting this block as done with the group
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(p.counter + g, 1u) == static_cast<unsigned>(p.tiles - 1);
    __syncthreads();
    if (!s_last) continue;
    if (threadIdx.x == 0) p.counter[g] = 0;  // ready for the next launch (stream order)
    __threadfence();
    if (ok) {
      float total = __ldcg(ws_at);
      for (int tt = 1; tt < p.tiles; ++tt) total += __ldcg(ws_at + tt * tile_stride);
      rows_gemv_store(p, r, row, total);
    }
  }
}

/// Blocks of `kernel` with `warps` warps resident per SM, asked of the occupancy calculator once.
template <int kR, int kU, int kW>
int rows_gemv_resident(int warps) {
  static std::array<std::atomic<int>, kW + 1> cache{};
  int b = cache[static_cast<size_t>(warps)].load(std::memory_order_relaxed);
  if (b == 0) {
    MTP_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, rows_gemv_kernel<kR, kU, kW>, warps * kWarp, 0));
    b = std::max(1, b);
    cache[static_cast<size_t>(warps)].store(b, std::memory_order_relaxed);
  }
  return b;
}

template <int kR, int kU, int kW>
void launch_rows_gemv(const LaunchCtx& ctx, RowsGemvParams p) {
  const int n_parts = (p.k / 8 + kWarp - 1) / kWarp;
  const int warps = std::min(kW, n_parts);
  p.tiles = (n_parts + kW - 1) / kW;
  const int groups = (p.n + kU - 1) / kU;
  const int resident = rows_gemv_resident<kR, kU, kW>(warps) * ctx.num_sms;
  const int gx = std::max(1, std::min(groups, resident / p.tiles));
  launch(ctx, rows_gemv_kernel<kR, kU, kW>, dim3(static_cast<unsigned>(gx), static_cast<unsigned>(p.tiles)),
         dim3(static_cast<unsigned>(warps * kWarp)), 0, p);
  MTP_CUDA_LAUNCH_CHECK();
}

/// kR: the rows rounded up to a power of two (the padded rows load nothing and
/// skip their FMAs); kU: 4 weight
/// rows per group up to 8 rows, 2 at 16 (the activations then hold 128 registers).
/// kW: a block of two tiles (16 warps) where k spans exactly two (2048 < k <= 4096) and the rows'
/// activations leave the registers for it (up to 8 rows): one block sums the whole row, with no
/// workspace, fence or counter between two blocks (the same association: dense.cu above).
void dispatch_rows_gemv(const LaunchCtx& ctx, const RowsGemvParams& p) {
  const bool two_tiles = p.k > kRgTileCols && p.k <= 2 * kRgTileCols;
  if (p.rows <= 2) {
    return two_tiles ? launch_rows_gemv<2, 4, 2 * kRgWarps>(ctx, p) : launch_rows_gemv<2, 4, kRgWarps>(ctx, p);
  }
  if (p.rows <= 4) {
    return two_tiles ? launch_rows_gemv<4, 4, 2 * kRgWarps>(ctx, p) : launch_rows_gemv<4, 4, kRgWarps>(ctx, p);
  }
  if (p.rows <= 8) {
    return two_tiles ? launch_rows_gemv<8, 4, 2 * kRgWarps>(ctx, p) : launch_rows_gemv<8, 4, kRgWarps>(ctx, p);
  }
  return launch_rows_gemv<16, 2, kRgWarps>(ctx, p);
}

int rows_gemv_tiles(int k) { return (k + kRgTileCols - 1) / kRgTileCols; }

// ---- the multi-row GEMV head (head_gemv) ------------------------------------------------------------
//
// The FP8 head of R = 1 .. kMaxRowsGemvHead batch rows with its argmax fused, every weight element
// loaded once for all rows. A block of kHgWarps warps first stages the R live rows of x into shared
// memory as fp32 (padded rows as zeros, never read), laid out [chunk / 32][row][quad][chunk % 32]:
// lane l's 16-byte reads of quad q of its chunks are conflict-free (consecutive lanes, consecutive
// addresses) and every (row, quad) is a fixed offset from the lane's base. Each
// warp then owns groups of kHgRowsPerWarp consecutive W rows (grid-stride over groups) and the
// whole k of each: lane l takes the 16-byte chunks (16 E4M3 weights) l, l + 32, l + 64, ... of every
// row of the group, kHgUnroll of them per row in flight (streaming loads), widens each pair of
// weights to fp32 exactly (E4M3 -> half -> float) and does R x 16 FMAs per chunk into one fp32
// accumulator per (W row, batch row). The warp adds its lanes with the reduce-scatter butterfly;
// the lane left with the sum of (W row, batch row) multiplies it by the row scale, rounds it to
// BF16, stores it when logits are wanted and keeps the best argmax_key(value, index) of its batch
// row. The keys meet per batch row over the warp (shuffles), the block (shared atomicMax) and the
// grid (global atomicMax into HeadBatchScratch::best); the last block to finish writes out / extras
// and resets the keys and the counter: one launch, no workspace, no memset (graph-safe), the
// scratch rows_gemm's head uses.
//
// Invariance: logit (b, r) is the same fp32 function of W[r] and x[b] whatever R and the other
// rows: the lane that owns a chunk depends only on k, each lane adds its chunks in ascending order
// and a chunk's 16 products in column order into an accumulator of (r, b) alone, the butterfly adds
// the same pairs as warp_sum, and the scale multiplies the finished sum. So a row's logits and pick
// at B = 2 are its logits and pick at B = 3 and 4. (Not the skinny GEMM's order, nor the
// single-row GEMV's: that one splits k per shape.) Padded rows (slot < 0) read and write nothing.

constexpr int kHgWarps = 8;
constexpr int kHgThreads = kHgWarps * kWarp;
constexpr int kHgRowsPerWarp = 4;       // W rows per warp and group: each x read from shared memory feeds 4
constexpr int kHgUnroll = 2;            // chunks per W row and lane in flight (8 16-byte loads per lane)
constexpr int kHgChunk = 16;            // E4M3 weights per 16-byte chunk
constexpr int kHgMaxSmem = 112 * 1024;  // two blocks per SM; head_gemv_smem must fit

/// The staged activations of head_gemv_kernel: rows x k fp32, k rounded up to whole blocks of 32
/// chunks (512 columns).
constexpr int64_t head_gemv_smem(int rows, int k) {
  return static_cast<int64_t>(rows) * ((k + kWarp * kHgChunk - 1) / (kWarp * kHgChunk)) * kWarp * kHgChunk *
         static_cast<int64_t>(sizeof(float));
}

struct HeadGemvParams {
  const uint8_t* W = nullptr;  // [n][k] E4M3
  const float* row_scale = nullptr;
  const bf16* x = nullptr;        // [rows][k]
  const int32_t* slot = nullptr;  // null: every row is live
  int n = 0;
  int k = 0;
  bf16* y = nullptr;  // logits [rows][ldy], may be null
  int64_t ldy = 0;
  int64_t index_base = 0;
  ArgMax* out = nullptr;
  HeadExtras extras;
  unsigned long long* best = nullptr;
  unsigned int* counter = nullptr;
};

constexpr int pow2_at_least(int v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

/// acc[r] += the 4 products of weights 4q .. 4q+3 of a chunk (one u32 of E4M3 codes) with batch row
/// r's activations xq[r] (fp32), in column order.
template <int kR>
__device__ __forceinline__ void fma_fp8x4_rows(uint32_t w, const float4 (&xq)[kR], float (&acc)[kR]) {
  const float2 a = fp8x2_to_float2(w);
  const float2 b = fp8x2_to_float2(w >> 16);
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    acc[r] = fmaf(a.x, xq[r].x, acc[r]);
    acc[r] = fmaf(a.y, xq[r].y, acc[r]);
    acc[r] = fmaf(b.x, xq[r].z, acc[r]);
    acc[r] = fmaf(b.y, xq[r].w, acc[r]);
  }
}

template <int kR>
__global__ void __launch_bounds__(kHgThreads, 2) head_gemv_kernel(HeadGemvParams p) {
  pdl_begin();
  constexpr int kV = kHgRowsPerWarp;
  constexpr int kM = pow2_at_least(kV * kR);  // values per warp and group (padded with zeros)
  constexpr int kLanesPerValue = kWarp / kM;
  static_assert(kM <= kWarp, "one value per lane at least");
  constexpr int kBlockF4 = kR * 4 * kWarp;  // float4 of one block of 32 chunks
  extern __shared__ __align__(16) uint8_t hg_smem[];
  float4* xs = reinterpret_cast<float4*>(hg_smem);  // [n_chunks / 32][kR][4][32]
  __shared__ uint8_t s_live[kR];
  __shared__ unsigned long long s_best[kR];
  __shared__ bool s_last;
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int n_chunks = p.k / kHgChunk;
  if (threadIdx.x < kR) {
    s_live[threadIdx.x] = p.slot == nullptr || p.slot[threadIdx.x] >= 0;
    s_best[threadIdx.x] = 0;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kR * n_chunks; i += blockDim.x) {
    const int r = i / n_chunks;
    const int c = i - r * n_chunks;
    float lo[8], hi[8];
    const bf16* src = p.x + static_cast<size_t>(r) * p.k + static_cast<size_t>(c) * kHgChunk;
    batch::unpack8(s_live[r] ? load_cached(src) : make_uint4(0, 0, 0, 0), lo);
    batch::unpack8(s_live[r] ? load_cached(src + 8) : make_uint4(0, 0, 0, 0), hi);
    float4* dst = xs + (c / kWarp) * kBlockF4 + r * 4 * kWarp + c % kWarp;
    dst[0] = make_float4(lo[0], lo[1], lo[2], lo[3]);
    dst[kWarp] = make_float4(lo[4], lo[5], lo[6], lo[7]);
    dst[2 * kWarp] = make_float4(hi[0], hi[1], hi[2], hi[3]);
    dst[3 * kWarp] = make_float4(hi[4], hi[5], hi[6], hi[7]);
  }
  __syncthreads();

  // After the butterfly, this lane holds value m = (W row mj of the group, batch row mr).
  const int m = lane / kLanesPerValue;
  const int mj = m / kR;
  const int mr = m % kR;
  const bool holder = m < kV * kR && lane % kLanesPerValue == 0;
  const bool holder_live = holder && s_live[mr];
  const size_t row_bytes = static_cast<size_t>(p.k);
  const int groups = (p.n + kV - 1) / kV;
  unsigned long long best = 0;  // batch row mr's best key over this lane's values

  for (int g = blockIdx.x * kHgWarps + warp; g < groups; g += gridDim.x * kHgWarps) {
    const int row0 = g * kV;
    bool ok[kV];
#pragma unroll
    for (int j = 0; j < kV; ++j) ok[j] = row0 + j < p.n;
    // This lane's chunk of step i of row row0 (row j: + j * row_bytes, formed only for rows < n).
    const uint8_t* wp = p.W + static_cast<size_t>(row0) * row_bytes + static_cast<size_t>(lane) * kHgChunk;
    float acc[kV][kR];
#pragma unroll
    for (int j = 0; j < kV; ++j)
#pragma unroll
      for (int r = 0; r < kR; ++r) acc[j][r] = 0.0f;
    // Step i: chunks lane + 32 (i + u), u < kHgUnroll, of every row of the group (whole: all of
    // them inside k). The weights are loaded first, then each chunk's x from shared memory feeds the
    // group's rows.
    auto step = [&](int i, bool whole) {
      uint4 wv[kV][kHgUnroll];
#pragma unroll
      for (int j = 0; j < kV; ++j) {
#pragma unroll
        for (int u = 0; u < kHgUnroll; ++u) {
          const bool in = whole || lane + (i + u) * kWarp < n_chunks;
          wv[j][u] =
              ok[j] && in ? load_stream(wp + j * row_bytes + u * kWarp * kHgChunk) : make_uint4(0, 0, 0, 0);
        }
      }
      const float4* xl = xs + static_cast<size_t>(i) * kBlockF4 + lane;
#pragma unroll
      for (int u = 0; u < kHgUnroll; ++u) {
        if (!whole && lane + (i + u) * kWarp >= n_chunks) break;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          float4 xq[kR];
#pragma unroll
          for (int r = 0; r < kR; ++r) xq[r] = xl[u * kBlockF4 + (r * 4 + q) * kWarp];
#pragma unroll
          for (int j = 0; j < kV; ++j) {
            const uint4& w = wv[j][u];
            fma_fp8x4_rows<kR>(q == 0 ? w.x : q == 1 ? w.y : q == 2 ? w.z : w.w, xq, acc[j]);
          }
        }
      }
    };
    // The whole steps, then at most one partial one (k not a multiple of 32 x kHgUnroll chunks).
    int st = 0;
    for (; lane + (st + kHgUnroll - 1) * kWarp < n_chunks;
         st += kHgUnroll, wp += kHgUnroll * kWarp * kHgChunk)
      step(st, true);
    if (lane + st * kWarp < n_chunks) step(st, false);

    float v[kM];
#pragma unroll
    for (int e = 0; e < kM; ++e) v[e] = e < kV * kR ? acc[e / kR][e % kR] : 0.0f;
    warp_reduce_scatter<kM>(v, lane);
    const int row = row0 + mj;
    if (holder_live && row < p.n) {
      const bf16 lv = f_to_bf16(__fmul_rn(__ldg(p.row_scale + row), v[0]));
      if (p.y) p.y[static_cast<size_t>(mr) * p.ldy + row] = lv;
      const unsigned long long key = argmax_key(bf16_to_f(lv), static_cast<int32_t>(p.index_base + row));
      best = key > best ? key : best;
    }
  }

  // Per batch row: the warp's best over the lanes holding its values, then the block's, the grid's.
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const unsigned long long kb = warp_max_u64(mr == r ? best : 0ull);
    if (lane == 0 && kb != 0) atomicMax(&s_best[r], kb);
  }
  __syncthreads();
  if (threadIdx.x < kR && s_best[threadIdx.x] != 0) atomicMax(p.best + threadIdx.x, s_best[threadIdx.x]);
  __threadfence();  // publish the keys before counting this block as done
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(p.counter, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  if (threadIdx.x < kR && s_live[threadIdx.x]) {
    const int b = threadIdx.x;
    // Read and reset in one step (the next launch starts from zeros).
    const unsigned long long key = atomicExch(p.best + b, 0ull);
    ArgMax a;
    a.value = from_order_preserving_u32(static_cast<uint32_t>(key >> 32));
    a.index = static_cast<int32_t>(~static_cast<uint32_t>(key & 0xffffffffull));
    p.out[b] = a;
    // key is argmax_key of the pair just written, so it is argmax_pack_key's (as rows_gemm's).
    if (p.extras.key) p.extras.key[b] = key;
    if (p.extras.token) p.extras.token[b] = a.index;
  }
  if (threadIdx.x == 0) *p.counter = 0;
}

/// Blocks of head_gemv_kernel<kR> resident per SM at `smem` bytes of staged activations: asked of
/// the occupancy calculator when the size changes (one size per head in practice).
template <int kR>
int head_gemv_resident(int smem) {
  static std::atomic<int64_t> cache{0};  // smem << 8 | blocks
  const int64_t c = cache.load(std::memory_order_relaxed);
  if (c != 0 && (c >> 8) == smem) return static_cast<int>(c & 0xff);
  static const bool attr = [] {
    MTP_CUDA_CHECK(
        cudaFuncSetAttribute(head_gemv_kernel<kR>, cudaFuncAttributeMaxDynamicSharedMemorySize, kHgMaxSmem));
    return true;
  }();
  (void)attr;
  int b = 0;
  MTP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, head_gemv_kernel<kR>, kHgThreads, smem));
  b = std::max(1, std::min(b, 255));
  cache.store(static_cast<int64_t>(smem) << 8 | b, std::memory_order_relaxed);
  return b;
}

template <int kR>
void launch_head_gemv(const LaunchCtx& ctx, const HeadGemvParams& p) {
  const int smem = static_cast<int>(head_gemv_smem(kR, p.k));
  const int groups = (p.n + kHgRowsPerWarp - 1) / kHgRowsPerWarp;
  const int needed = (groups + kHgWarps - 1) / kHgWarps;
  const int grid = std::max(1, std::min(needed, head_gemv_resident<kR>(smem) * ctx.num_sms));
  launch(ctx, head_gemv_kernel<kR>, static_cast<unsigned>(grid), kHgThreads, static_cast<size_t>(smem), p);
  MTP_CUDA_LAUNCH_CHECK();
}

static_assert(kMaxRowsGemvHead == 4, "dispatch_head_gemv instantiates 1, 2, 3 and 4 rows");
static_assert(head_gemv_smem(kMaxRowsGemvHead, 7168) <= kHgMaxSmem &&
                  head_gemv_smem(kMaxRowsGemvHead, 7169) > kHgMaxSmem,
              "head_gemv_fits' documented k limit");

void dispatch_head_gemv(const LaunchCtx& ctx, const HeadGemvParams& p, int rows) {
  switch (rows) {
    case 1:
      return launch_head_gemv<1>(ctx, p);
    case 2:
      return launch_head_gemv<2>(ctx, p);
    case 3:
      return launch_head_gemv<3>(ctx, p);
    default:
      return launch_head_gemv<4>(ctx, p);
  }
}

// ---- argmax family over rows ------------------------------------------------------------------------

constexpr int kArgmaxRowThreads = 512;

/// The largest of every thread's key in a block of kArgmaxRowThreads (s: one slot a warp); valid
/// in thread 0.
__device__ __forceinline__ unsigned long long block_max_key(unsigned long long best, unsigned long long* s) {
  best = warp_max_u64(best);
  if (threadIdx.x % kWarp == 0) s[threadIdx.x / kWarp] = best;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 0; w < kArgmaxRowThreads / kWarp; ++w) best = s[w] > best ? s[w] : best;
  return best;
}

/// Block b: the argmax of row b (16-byte loads when the rows are aligned), ties to the lowest index.
__global__ void __launch_bounds__(kArgmaxRowThreads)
    argmax_rows_kernel(const bf16* x, int ld_x, int n, int64_t index_base, ArgMax* out, int vec) {
  pdl_begin();
  __shared__ unsigned long long s_best[kArgmaxRowThreads / kWarp];
  const bf16* row = x + static_cast<size_t>(blockIdx.x) * ld_x;
  unsigned long long best = 0;
  int tail = 0;
  if (vec) {
    const int nv = n / 8;
    for (int v = threadIdx.x; v < nv; v += blockDim.x) {
      float f[8];
      batch::unpack8(load_cached(row + static_cast<size_t>(v) * 8), f);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const unsigned long long key = argmax_key(f[e], static_cast<int32_t>(index_base + 8 * v + e));
        best = key > best ? key : best;
      }
    }
    tail = nv * 8;
  }
  for (int i = tail + threadIdx.x; i < n; i += blockDim.x) {
    const unsigned long long key = argmax_key(bf16_to_f(row[i]), static_cast<int32_t>(index_base + i));
    best = key > best ? key : best;
  }
  best = block_max_key(best, s_best);
  if (threadIdx.x == 0) {
    ArgMax a;
    a.value = from_order_preserving_u32(static_cast<uint32_t>(best >> 32));
    a.index = static_cast<int32_t>(~static_cast<uint32_t>(best & 0xffffffffull));
    out[blockIdx.x] = a;
  }
}

/// Block (part, row): the largest key of part `part` of row `row` (a contiguous run of its 16-byte
/// vectors when vec, of its values otherwise; the last part also takes the tail past the last
/// whole vector) into keys[row * parts + part]; argmax_parts_reduce_kernel finishes the rows.
__global__ void __launch_bounds__(kArgmaxRowThreads)
    argmax_row_parts_kernel(const bf16* x, int ld_x, int n, int64_t index_base, unsigned long long* keys,
                            int vec) {
  pdl_begin();
  __shared__ unsigned long long s_best[kArgmaxRowThreads / kWarp];
  const int part = blockIdx.x, parts = gridDim.x;
  const bf16* row = x + static_cast<size_t>(blockIdx.y) * ld_x;
  const int units = vec ? n / 8 : n;
  const int u0 = static_cast<int>(static_cast<int64_t>(part) * units / parts);
  const int u1 = static_cast<int>(static_cast<int64_t>(part + 1) * units / parts);
  unsigned long long best = 0;
  if (vec) {
    for (int v = u0 + static_cast<int>(threadIdx.x); v < u1; v += blockDim.x) {
      float f[8];
      batch::unpack8(load_cached(row + static_cast<size_t>(v) * 8), f);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const unsigned long long key = argmax_key(f[e], static_cast<int32_t>(index_base + 8 * v + e));
        best = key > best ? key : best;
      }
    }
    if (part == parts - 1) {
      for (int i = units * 8 + static_cast<int>(threadIdx.x); i < n; i += blockDim.x) {
        const unsigned long long key = argmax_key(bf16_to_f(row[i]), static_cast<int32_t>(index_base + i));
        best = key > best ? key : best;
      }
    }
  } else {
    for (int i = u0 + static_cast<int>(threadIdx.x); i < u1; i += blockDim.x) {
      const unsigned long long key = argmax_key(bf16_to_f(row[i]), static_cast<int32_t>(index_base + i));
      best = key > best ? key : best;
    }
  }
  best = block_max_key(best, s_best);
  if (threadIdx.x == 0) keys[static_cast<size_t>(blockIdx.y) * parts + part] = best;
}

/// Warp b: row b's largest key over its parts, as the ArgMax pair (ties: lowest index, the key's).
__global__ void argmax_parts_reduce_kernel(const unsigned long long* keys, int parts, int rows, ArgMax* out) {
  pdl_begin();
  const int b = static_cast<int>(blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp);
  const int lane = threadIdx.x % kWarp;
  if (b >= rows) return;
  unsigned long long best = 0;
  for (int i = lane; i < parts; i += kWarp) {
    const unsigned long long k = keys[static_cast<size_t>(b) * parts + i];
    best = k > best ? k : best;
  }
  best = warp_max_u64(best);
  if (lane == 0) {
    ArgMax a;
    a.value = from_order_preserving_u32(static_cast<uint32_t>(best >> 32));
    a.index = static_cast<int32_t>(~static_cast<uint32_t>(best & 0xffffffffull));
    out[b] = a;
  }
}

__global__ void unpack_key_rows_kernel(const uint64_t* key, int32_t* token, int rows) {
  pdl_begin();
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b < rows) token[b] = static_cast<int32_t>(~static_cast<uint32_t>(key[b] & 0xffffffffull));
}

/// Row b: the largest value among pairs[i * rows + b], lowest index on ties (argmax_pick's rule).
__global__ void pick_rows_kernel(const ArgMax* pairs, int n, int rows, int32_t* token) {
  pdl_begin();
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  token[b] = pick_index(pairs + b, n, rows);
}

/// What every rows_gemm launch sets: W's rows of k (BF16 or FP8 bytes), x [rows][ldx], the n output
/// rows through the row map and the tile counts that follow from it.
GemmParams gemm_params(const void* W, const bf16* x, int64_t ldx, int rows, int n, int k,
                       const GemvRowMap& map) {
  GemmParams p;
  p.W = static_cast<const uint8_t*>(W);
  p.x = x;
  p.ldx = ldx;
  p.rows = rows;
  p.k = k;
  p.map = map;
  p.tiles_per_group = (map.rows_per_group + kTileRows - 1) / kTileRows;
  p.total_tiles = p.tiles_per_group * (n / map.rows_per_group);
  return p;
}

/// Whether the FP8 head of `rows` rows runs the multi-row GEMV (KernelPolicy::head_gemm): under
/// gemv where it fits, under auto up to kMaxRowsGemvHeadAuto rows where it fits, never under mma
/// (the skinny GEMM at every B), wgmma, or cublaslt (which has no FP8 head: the skinny GEMM).
bool head_gemv_wanted(HeadGemm policy, int rows, int k) {
  return (policy == HeadGemm::gemv || (policy == HeadGemm::automatic && rows <= kMaxRowsGemvHeadAuto)) &&
         head_gemv_fits(rows, k);
}

/// Whether the FP8 head of `rows` rows runs the wgmma kernel: always under wgmma (an error where
/// the build lacks it), from kMinRowsWgmmaHead rows under auto where the build has it.
bool head_wgmma_wanted(HeadGemm policy, int rows) {
  if (policy == HeadGemm::wgmma) {
    MTP_REQUIRE(have_wgmma(), "ops::cuda::head_argmax_batch: head_gemm wgmma needs the sm_90a device code; "
                "this build's CUDA architectures have no 90a (configure with CMAKE_CUDA_ARCHITECTURES=90a)");
    return true;
  }
  return policy == HeadGemm::automatic && have_wgmma() && rows >= kMinRowsWgmmaHead;
}

}  // namespace

size_t head_packed_x_elems(int k) {  // the packed rows, then an int shift a row (packed_x_shifts)
  return static_cast<size_t>((k + kChunkK - 1) / kChunkK) * kChunkK * kMaxBatchRows +
         kMaxBatchRows * sizeof(int) / sizeof(bf16);
}

bool have_wgmma() {
#if defined(MTPLAB_CUDA_SM90A)
  return true;
#else
  return false;
#endif
}

bool head_gemv_fits(int rows, int k) {
  return rows >= 1 && rows <= kMaxRowsGemvHead && k >= kHgChunk && k % kHgChunk == 0 &&
         head_gemv_smem(rows, k) <= kHgMaxSmem;
}

void head_argmax_batch(const LaunchCtx& ctx, const bf16* W, const fp8e4m3* W_fp8, const float* row_scale,
                       const bf16* x, const int32_t* slot, int rows, int n, int k, int64_t index_base,
                       bf16* logits, int ld_logits, ArgMax* out, HeadExtras extras,
                       const HeadBatchScratch& s) {
  const bool fp8 = W_fp8 != nullptr;
  MTP_REQUIRE(rows >= 1 && rows <= kMaxBatchRows && n >= 1 && k >= 16 && k % 16 == 0,
              "ops::cuda::head_argmax_batch: rows ", rows, " (1 .. ", kMaxBatchRows, " per launch), n ", n,
              ", k ", k, " (a positive multiple of 16)");
  const void* Wp = fp8 ? static_cast<const void*>(W_fp8) : static_cast<const void*>(W);
  require_aligned16("head_argmax_batch", "W", Wp);
  require_aligned16("head_argmax_batch", "x", x);
  if (fp8 && head_gemv_wanted(ctx.policy.head_gemm, rows, k)) {
    HeadGemvParams g;
    g.W = reinterpret_cast<const uint8_t*>(W_fp8);
    g.row_scale = row_scale;
    g.x = x;
    g.slot = slot;
    g.n = n;
    g.k = k;
    g.y = logits;
    g.ldy = ld_logits;
    g.index_base = index_base;
    g.out = out;
    g.extras = extras;
    g.best = s.best;
    g.counter = s.counter;
    dispatch_head_gemv(ctx, g, rows);
    return;
  }
  GemmParams p = gemm_params(Wp, x, k, rows, n, k, GemvRowMap{n, 0, 0, 0});
  p.row_scale = row_scale;
  p.slot = slot;
  p.y = logits;
  p.ldy = ld_logits;
  p.index_base = index_base;
  p.out = out;
  p.extras = extras;
  p.best = s.best;
  p.counter = s.counter;
  if (fp8 && head_wgmma_wanted(ctx.policy.head_gemm, rows)) {
    MTP_REQUIRE(s.packed_x != nullptr && s.packed_elems >= head_packed_x_elems(k),
                "ops::cuda::head_argmax_batch: the wgmma head's packed-x scratch holds ", s.packed_elems,
                " values, ", head_packed_x_elems(k), " needed at k = ", k);
    dispatch_head_wgmma(ctx, p, s.packed_x);
    return;
  }
  if (fp8) {
    dispatch_rows_gemm<true, Epi::head>(ctx, p);
  } else {
    dispatch_rows_gemm<false, Epi::head>(ctx, p);
  }
}

void rows_gemm(const LaunchCtx& ctx, const bf16* W, const bf16* x, int64_t ldx, void* y, bool f32_out,
               int64_t ldy, int rows, int n, int k, const GemvRowMap& map) {
  MTP_REQUIRE(rows >= 1 && rows <= kMaxBatchRows && n >= 1 && k >= 16 && k % 16 == 0 &&
                  map.rows_per_group >= 1 && n % map.rows_per_group == 0,
              "ops::cuda::rows_gemm: rows ", rows, " (1 .. ", kMaxBatchRows, "), n ", n, ", k ", k,
              " (a positive multiple of 16), ", map.rows_per_group, " rows per group");
  MTP_REQUIRE(ldx % 8 == 0 && map.x_group_stride % 8 == 0, "ops::cuda::rows_gemm: row stride ", ldx,
              " and group stride ", map.x_group_stride, " of x must be multiples of 8 (16-byte rows)");
  require_aligned16("rows_gemm", "W", W);
  require_aligned16("rows_gemm", "x", x);
  GemmParams p = gemm_params(W, x, ldx, rows, n, k, map);
  p.y = y;
  p.ldy = ldy;
  if (f32_out) {
    dispatch_rows_gemm<false, Epi::f32_out>(ctx, p);
  } else {
    dispatch_rows_gemm<false, Epi::bf16_out>(ctx, p);
  }
}

bool rows_gemm_wanted(int rows, int n, int k, bool f32_out) {
  (void)n;
  (void)f32_out;
  if (rows < 2 || rows > kMaxBatchRows || k % 16 != 0) return false;
  // The measured table (docs/kernels.md, "Batched kernels"): cuBLASLt until rows_gemm wins a shape.
  return false;
}

size_t rows_gemv_ws_floats(int n, int k) {
  const int tiles = rows_gemv_tiles(k);
  return tiles > 1 ? static_cast<size_t>(tiles) * kMaxRowsGemv * static_cast<size_t>(n) : 0;
}

int rows_gemv_counters(int n, int k) { return rows_gemv_tiles(k) > 1 ? n : 0; }

void rows_gemv_group(const LaunchCtx& ctx, std::span<const LinearOut> outs, const bf16* x, int rows, int k,
                     const RowsGemvScratch& s) {
  MTP_REQUIRE(!outs.empty() && static_cast<int>(outs.size()) <= kMaxRowsGemvOuts, "ops::cuda::rows_gemv: ",
              outs.size(), " outputs (1 .. ", kMaxRowsGemvOuts, " per launch)");
  MTP_REQUIRE(rows >= 1 && rows <= kMaxRowsGemv && k >= 8 && k % 8 == 0, "ops::cuda::rows_gemv: rows ", rows,
              " (1 .. ", kMaxRowsGemv, "), k ", k,
              " (k must be a positive multiple of 8: the kernel loads 16-byte chunks of 8 columns)");
  require_aligned("rows_gemv", "x", x);
  RowsGemvParams p;
  int64_t n = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    const LinearOut& o = outs[i];
    MTP_REQUIRE(o.W && o.y && o.n_out >= 1, "ops::cuda::rows_gemv: output ", i, " has W ", o.W, ", y ", o.y,
                ", n ", o.n_out);
    MTP_REQUIRE(o.f32_out || o.f32_scale == 1.0f, "ops::cuda::rows_gemv: output ", i, " is BF16 but has f32_scale ",
                o.f32_scale, " (only fp32 outputs are scaled)");
    require_aligned("rows_gemv", "W", o.W);
    p.out[i] = RowsGemvOut{o.W, o.y, o.n_out, static_cast<int>(n), o.f32_out ? 1 : 0, o.f32_scale};
    n += o.n_out;
  }
  MTP_REQUIRE(n <= (int64_t{1} << 30), "ops::cuda::rows_gemv: ", n, " output rows in one launch");
  p.n_outs = static_cast<int>(outs.size());
  p.x = x;
  p.rows = rows;
  p.n = static_cast<int>(n);
  p.k = k;
  p.tiles = rows_gemv_tiles(k);
  if (p.tiles > 1) {
    MTP_REQUIRE(s.ws && s.ws_floats >= static_cast<size_t>(p.tiles) * rows * p.n && s.counter &&
                    s.counters >= rows_gemv_counters(p.n, k),
                "ops::cuda::rows_gemv: k ", k, " spans ", p.tiles, " tiles and needs ",
                static_cast<size_t>(p.tiles) * rows * p.n, " workspace floats and ", rows_gemv_counters(p.n, k),
                " counters; the scratch has ", s.ws_floats, " and ", s.counters);
    p.ws = s.ws;
    p.counter = s.counter;
  }
  dispatch_rows_gemv(ctx, p);
}

void rows_gemv(const LaunchCtx& ctx, const bf16* W, const bf16* x, void* y, bool f32_out, int rows, int n,
               int k, const RowsGemvScratch& s) {
  MTP_REQUIRE(n >= 1, "ops::cuda::rows_gemv: n ", n);
  const LinearOut out{W, y, n, f32_out, 1.0f};
  rows_gemv_group(ctx, std::span<const LinearOut>(&out, 1), x, rows, k, s);
}

void argmax_batch(const LaunchCtx& ctx, const bf16* x, int ld_x, int rows, int n, int64_t index_base,
                  ArgMax* out, const ArgmaxScratch& single_row) {
  if (rows == 1) {
    argmax(ctx, x, n, index_base, out, single_row);  // the multi-block kernel: one row fills the chip
    return;
  }
  const int vec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && ld_x % 8 == 0 ? 1 : 0;
  // A few long rows: each row in parts (about two blocks per multiprocessor over the batch, at
  // least 4 vectors per thread of a part), then one warp per row reduces the parts' keys.
  // The argmax is exact, so the parts change nothing but the time.
  const int per_part = kArgmaxRowThreads * 4 * (vec ? 8 : 1);
  const int parts = std::min(
      {(2 * ctx.num_sms + rows - 1) / rows, (n + per_part - 1) / per_part, single_row.capacity / rows, 64});
  if (parts >= 2) {
    launch(ctx, argmax_row_parts_kernel, dim3(parts, rows), kArgmaxRowThreads, 0, x, ld_x, n, index_base,
           single_row.partials, vec);
    MTP_CUDA_LAUNCH_CHECK();
    constexpr int kReduceWarps = 4;
    launch(ctx, argmax_parts_reduce_kernel, (rows + kReduceWarps - 1) / kReduceWarps, kReduceWarps * kWarp, 0,
           single_row.partials, parts, rows, out);
    MTP_CUDA_LAUNCH_CHECK();
    return;
  }
  launch(ctx, argmax_rows_kernel, rows, kArgmaxRowThreads, 0, x, ld_x, n, index_base, out, vec);
  MTP_CUDA_LAUNCH_CHECK();
}

namespace {
constexpr int kFinishThreads = 256;
/// Block b: row b of head_finish_rows (nothing for a padded row).
__global__ void __launch_bounds__(kFinishThreads)
    head_finish_rows_kernel(const ArgMax* pairs, const int32_t* slot, const bf16* logits, int n, bf16* dst,
                            int ld_dst, ArgMax* out, HeadExtras extras) {
  pdl_begin();
  const int b = blockIdx.x;
  if (slot && slot[b] < 0) return;
  if (threadIdx.x == 0) {
    const ArgMax a = pairs[b];
    out[b] = a;
    if (extras.key) extras.key[b] = argmax_key(a.value, a.index);
    if (extras.token) extras.token[b] = a.index;
  }
  if (!dst) return;
  const bf16* src = logits + static_cast<size_t>(b) * n;
  bf16* row = dst + static_cast<size_t>(b) * ld_dst;
  for (int i = threadIdx.x; i < n; i += blockDim.x) row[i] = src[i];
}
}  // namespace

namespace {
constexpr int kSplitThreads = 256;
/// Block b: batch row b's largest magnitude (a non-finite entry counts as infinite), its shift,
/// then its two E4M3 parts as rows 2b and 2b + 1 of `parts` (k bytes each); a padded row's parts
/// are zeros.
__global__ void __launch_bounds__(kSplitThreads) head_split_e4m3_kernel(const bf16* x, const int32_t* slot, int k,
                                                                         uint8_t* parts, int* shifts) {
  pdl_begin();
  __shared__ float s_max[kSplitThreads / kWarp];
  const int b = blockIdx.x;
  const bool live = slot == nullptr || slot[b] >= 0;
  const bf16* xr = x + static_cast<size_t>(b) * k;
  float m = 0.0f;
  if (live)
    for (int col = 2 * threadIdx.x; col < k; col += 2 * blockDim.x) {
      const uint32_t two = *reinterpret_cast<const uint32_t*>(xr + col);
      const float a = fabsf(__uint_as_float(two << 16)), c = fabsf(__uint_as_float(two & 0xffff0000u));
      m = !(a <= FLT_MAX) || !(c <= FLT_MAX) ? INFINITY : fmaxf(m, fmaxf(a, c));  // NaN or inf: not finite
    }
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (threadIdx.x % kWarp == 0) s_max[threadIdx.x / kWarp] = m;
  __syncthreads();
  m = 0.0f;
  for (int w = 0; w < kSplitThreads / kWarp; ++w) m = fmaxf(m, s_max[w]);
  const int shift = batch::e4m3_row_shift(m);
  if (threadIdx.x == 0) shifts[b] = live ? shift : 0;
  uint8_t* hi = parts + static_cast<size_t>(2 * b) * k;
  uint8_t* lo = hi + k;
  for (int c4 = 4 * threadIdx.x; c4 < k; c4 += 4 * blockDim.x) {  // k % 16 == 0
    uint32_t h = 0, l = 0;
    if (live) {
      const uint2 four = *reinterpret_cast<const uint2*>(xr + c4);
      const float v[4] = {__uint_as_float(four.x << 16), __uint_as_float(four.x & 0xffff0000u),
                          __uint_as_float(four.y << 16), __uint_as_float(four.y & 0xffff0000u)};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t p2 = batch::e4m3_parts(v[e], shift);
        h |= (p2 & 0xffu) << (8 * e);
        l |= (p2 >> 8) << (8 * e);
      }
    }
    *reinterpret_cast<uint32_t*>(hi + c4) = h;
    *reinterpret_cast<uint32_t*>(lo + c4) = l;
  }
}

/// Grid (parts, rows): part p of live row b's logits, logit j = BF16(scale[j] (D[2b][j] +
/// D[2b + 1][j])) with the row's shift taken out (exact), NaN for a row marked not finite; stored
/// to dst (row b at dst + b * ld_dst) when dst is not null, and the part's best argmax_key into
/// keys[b * parts + p] (argmax_parts_reduce_kernel finishes the rows). Padded rows: nothing.
__global__ void __launch_bounds__(kArgmaxRowThreads)
    head_combine_argmax_e4m3_kernel(const float* D, int n, const float* row_scale, const int* shifts,
                                    const int32_t* slot, int64_t index_base, bf16* dst, int ld_dst,
                                    unsigned long long* keys) {
  pdl_begin();
  __shared__ unsigned long long s_best[kArgmaxRowThreads / kWarp];
  const int b = blockIdx.y, part = blockIdx.x, parts = gridDim.x;
  if (slot && slot[b] < 0) return;  // the whole block
  const int sh = shifts[b];
  const float* hi = D + static_cast<size_t>(2 * b) * n;
  const float* lo = hi + n;
  bf16* out = dst ? dst + static_cast<size_t>(b) * ld_dst : nullptr;
  const int j0 = static_cast<int>(static_cast<int64_t>(part) * n / parts);
  const int j1 = static_cast<int>(static_cast<int64_t>(part + 1) * n / parts);
  unsigned long long best = 0;
  for (int j = j0 + static_cast<int>(threadIdx.x); j < j1; j += blockDim.x) {
    const float v = __fmul_rn(row_scale[j], __fadd_rn(hi[j], lo[j]));
    const bf16 lv = f_to_bf16(sh == batch::kE4m3NonFinite ? __int_as_float(0x7fffffff) : ldexpf(v, -sh));
    if (out) out[j] = lv;
    const unsigned long long key = argmax_key(bf16_to_f(lv), static_cast<int32_t>(index_base + j));
    best = key > best ? key : best;
  }
  best = block_max_key(best, s_best);
  if (threadIdx.x == 0) keys[static_cast<size_t>(b) * parts + part] = best;
}
}  // namespace

void head_split_e4m3(const LaunchCtx& ctx, const bf16* x, const int32_t* slot, int rows, int k, uint8_t* parts,
                     int* shifts) {
  MTP_REQUIRE(rows >= 1 && k >= 16 && k % 16 == 0, "ops::cuda::head_split_e4m3: rows ", rows, ", k ", k,
              " (a positive multiple of 16)");
  require_aligned16("head_split_e4m3", "x", x);
  launch(ctx, head_split_e4m3_kernel, static_cast<unsigned>(rows), kSplitThreads, 0, x, slot, k, parts, shifts);
  MTP_CUDA_LAUNCH_CHECK();
}

void head_combine_argmax_e4m3(const LaunchCtx& ctx, const float* D, int rows, int n, const float* row_scale,
                              const int* shifts, const int32_t* slot, int64_t index_base, bf16* dst, int ld_dst,
                              ArgMax* pairs, const ArgmaxScratch& scratch) {
  // About two blocks per multiprocessor over the batch, at least 4 values per thread of a part (as
  // argmax_batch), then one warp per row reduces the parts' keys.
  MTP_REQUIRE(rows >= 1 && rows <= scratch.capacity, "ops::cuda::head_combine_argmax_e4m3: rows ", rows,
              " (1 .. ", scratch.capacity, ", the argmax scratch's keys)");
  const int per_part = kArgmaxRowThreads * 4;
  const int parts = std::max(1, std::min({(2 * ctx.num_sms + rows - 1) / rows, (n + per_part - 1) / per_part,
                                          scratch.capacity / rows, 64}));
  launch(ctx, head_combine_argmax_e4m3_kernel, dim3(static_cast<unsigned>(parts), static_cast<unsigned>(rows)),
         kArgmaxRowThreads, 0, D, n, row_scale, shifts, slot, index_base, dst, ld_dst, scratch.partials);
  MTP_CUDA_LAUNCH_CHECK();
  constexpr int kReduceWarps = 4;
  launch(ctx, argmax_parts_reduce_kernel, (rows + kReduceWarps - 1) / kReduceWarps, kReduceWarps * kWarp, 0,
         static_cast<const unsigned long long*>(scratch.partials), parts, rows, pairs);
  MTP_CUDA_LAUNCH_CHECK();
}

void head_finish_rows(const LaunchCtx& ctx, const ArgMax* pairs, const int32_t* slot, int rows,
                      const bf16* logits, int n, bf16* dst, int ld_dst, ArgMax* out, HeadExtras extras) {
  launch(ctx, head_finish_rows_kernel, rows, kFinishThreads, 0, pairs, slot, logits, n, dst, ld_dst, out,
         extras);
  MTP_CUDA_LAUNCH_CHECK();
}

void argmax_unpack_key_batch(const LaunchCtx& ctx, const uint64_t* key, int32_t* token, int rows) {
  launch(ctx, unpack_key_rows_kernel, (rows + 127) / 128, 128, 0, key, token, rows);
  MTP_CUDA_LAUNCH_CHECK();
}

void argmax_pick_batch(const LaunchCtx& ctx, const ArgMax* pairs, int n, int rows, int32_t* token) {
  launch(ctx, pick_rows_kernel, (rows + 127) / 128, 128, 0, pairs, n, rows, token);
  MTP_CUDA_LAUNCH_CHECK();
}

}  // namespace mtplab::ops::cuda
