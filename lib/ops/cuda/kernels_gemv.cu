// The memory-bound GEMV family: BF16 and FP8 (per-row scaled) GEMV, the draft head with its
// argmax fused, the standalone argmax and its pack / unpack / pick helpers, and the routed
// experts (two launches, expert ids read on the device).
//
// Invariants:
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
#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/device_common.cuh"
#include "ops/cuda/kernels.hpp"
#include "ops/cuda/launch.cuh"

namespace mtplab::ops::cuda {
namespace {

constexpr int kGemvThreads = 256;
constexpr int kGemvWarps = kGemvThreads / kWarp;
constexpr int kUnroll = 8;          // 16-byte weight loads in flight per lane
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

/// This lane's share of the dot products of kRows rows with the same activation x over 16-byte
/// chunks [c_begin, c_end) of each row, kU loads per row and lane in flight: the weight loads of
/// every row are issued before the first FMA, and each activation chunk is read once for all rows.
/// acc[j] gets row j's chunks in ascending order (one accumulator per row: a row's bits do not
/// depend on kRows or kU); rows with !ok[j] (past n) load and add nothing.
template <bool kFp8, int kRows, int kU>
__device__ __forceinline__ void slice_dot_rows(const uint8_t* const (&wrow)[kRows], const bf16* x,
                                               const bool (&ok)[kRows], int c_begin, int c_end, int lane,
                                               float (&acc)[kRows]) {
  for (int c = c_begin + lane; c < c_end; c += kWarp * kU) {
    uint4 wv[kRows][kU];
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int cc = c + u * kWarp;
        wv[j][u] = ok[j] && cc < c_end ? load_stream(wrow[j] + static_cast<size_t>(cc) * 16)
                                       : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int cc = c + u * kWarp;
      if (cc < c_end) {
        if constexpr (kFp8) {
          const uint4 xa = load_cached(x + static_cast<size_t>(cc) * 16);
          const uint4 xb = load_cached(x + static_cast<size_t>(cc) * 16 + 8);
#pragma unroll
          for (int j = 0; j < kRows; ++j)
            if (ok[j]) acc[j] = dot_fp8x16(wv[j][u], xa, xb, acc[j]);
        } else {
          const uint4 xv = load_cached(x + static_cast<size_t>(cc) * 8);
#pragma unroll
          for (int j = 0; j < kRows; ++j)
            if (ok[j]) acc[j] = dot_bf16x8(wv[j][u], xv, acc[j]);
        }
      }
    }
  }
}

/// slice_dot_rows of one row: this lane's share of a row dot product over chunks [c_begin, c_end).
template <bool kFp8, int kU = kUnroll>
__device__ __forceinline__ float slice_dot(const uint8_t* wrow, const bf16* x, int c_begin, int c_end,
                                           int lane) {
  const uint8_t* const rows[1] = {wrow};
  const bool ok[1] = {true};
  float acc[1] = {0.0f};
  slice_dot_rows<kFp8, 1, kU>(rows, x, ok, c_begin, c_end, lane, acc);
  return acc[0];
}

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
/// Filled from scripts/device/gemv_sweep.sh (docs/kernels.md), e.g.
/// {false, 8192, int64_t{1} << 40, 512, 2048, GemvVariant::rows2} for BF16 rows of k 512..2048 and
/// n >= 8192.
struct AutoRule {
  bool fp8;
  int64_t n_min, n_max;
  int k_min, k_max;
  GemvVariant variant;
};
// From the sweep on one H200 (docs/performance.md, 2026-11-30 session 3; graph mode, % of copy):
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

void require_aligned(const char* op, const char* what, const void* p) {
  MTP_REQUIRE(reinterpret_cast<uintptr_t>(p) % 16 == 0, "ops::cuda::", op, ": ", what,
              " is not 16-byte aligned (the GEMV kernels load 16-byte vectors)");
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
/// Largest value, lowest index on ties (the CPU's comparison, applied to pairs in any order).
__global__ void pick_kernel(const ArgMax* pairs, int n, int32_t* token) {
  pdl_begin();
  ArgMax best = pairs[0];
  for (int i = 1; i < n; ++i) {
    const ArgMax p = pairs[i];
    if (p.value > best.value || (p.value == best.value && p.index < best.index)) best = p;
  }
  *token = best.index;
}

// ---- routed experts ---------------------------------------------------------------------------------

constexpr int kMoeThreads = 256;
constexpr int kMoeUnroll = 4;

/// The shared expert's slice when it runs in the routed experts' launches (moe_experts_shared):
/// its rows follow the routed slots' (act[top_k * I + i]), with weight 1. inter 0: none.
struct SharedExpert {
  const bf16* gate = nullptr;
  const bf16* up = nullptr;
  const bf16* down = nullptr;
  int inter = 0;
};

/// act[s, i] = bf16(silu(min(g, L)) * clamp(u, -L, L)), g / u the BF16-rounded gate / up rows of
/// the expert in slot s; zero for slots whose expert another rank owns; then the shared expert's
/// rows, if any. One warp per (s, i).
__global__ void __launch_bounds__(kMoeThreads)
    moe_gate_up_kernel(const bf16* x, const bf16* gate, const bf16* up, int first_expert, int num_local,
                       int H, int I, const int32_t* idx, int top_k, float limit, bf16* act, SharedExpert sh) {
  pdl_begin();
  const int lane = threadIdx.x % kWarp;
  const int64_t warps_total = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  const int n_chunks = H / 8;
  const int64_t routed_tasks = static_cast<int64_t>(top_k) * I;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
       t < routed_tasks + sh.inter; t += warps_total) {
    const bf16* g_row;
    const bf16* u_row;
    if (t < routed_tasks) {
      const int s = static_cast<int>(t / I);
      const int i = static_cast<int>(t - static_cast<int64_t>(s) * I);
      const int local = idx[s] - first_expert;
      if (local < 0 || local >= num_local) {
        if (lane == 0) act[t] = bf16{0};
        continue;
      }
      const size_t row = (static_cast<size_t>(local) * I + i) * H;
      g_row = gate + row;
      u_row = up + row;
    } else {
      const size_t row = static_cast<size_t>(t - routed_tasks) * H;
      g_row = sh.gate + row;
      u_row = sh.up + row;
    }
    float g = 0.0f, u = 0.0f;
    for (int c = lane; c < n_chunks; c += kWarp * kMoeUnroll) {
      uint4 gv[kMoeUnroll], uv[kMoeUnroll];
#pragma unroll
      for (int q = 0; q < kMoeUnroll; ++q) {
        const int cc = c + q * kWarp;
        gv[q] = cc < n_chunks ? load_stream(g_row + static_cast<size_t>(cc) * 8) : make_uint4(0, 0, 0, 0);
        uv[q] = cc < n_chunks ? load_stream(u_row + static_cast<size_t>(cc) * 8) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int q = 0; q < kMoeUnroll; ++q) {
        const int cc = c + q * kWarp;
        if (cc < n_chunks) {
          const uint4 xv = load_cached(x + static_cast<size_t>(cc) * 8);
          g = dot_bf16x8(gv[q], xv, g);
          u = dot_bf16x8(uv[q], xv, u);
        }
      }
    }
    g = warp_sum(g);
    u = warp_sum(u);
    if (lane == 0) {
      g = round_to_bf16(g);
      u = round_to_bf16(u);
      if (limit > 0.0f) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
      }
      act[t] = f_to_bf16(g / (1.0f + expf(-g)) * u);
    }
  }
}

/// out[h] = sum over owned slots s, in slot order, of weights[s] * bf16(W_down,s[h] . act[s]).
/// One warp per output h; the slots' rows are read back to back.
__global__ void __launch_bounds__(kMoeThreads)
    moe_down_kernel(const bf16* down, int first_expert, int num_local, int H, int I, const int32_t* idx,
                    const float* weights, int top_k, const bf16* act, float* out) {
  pdl_begin();
  const int lane = threadIdx.x % kWarp;
  const int warps_total = gridDim.x * (blockDim.x / kWarp);
  const int n_chunks = I / 8;
  for (int h = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp; h < H; h += warps_total) {
    float total = 0.0f;
    for (int s = 0; s < top_k; ++s) {
      const int local = idx[s] - first_expert;
      if (local < 0 || local >= num_local) continue;
      const bf16* d_row = down + (static_cast<size_t>(local) * H + h) * I;
      const bf16* a = act + static_cast<size_t>(s) * I;
      const float d =
          warp_sum(slice_dot<false>(reinterpret_cast<const uint8_t*>(d_row), a, 0, n_chunks, lane));
      total += weights[s] * round_to_bf16(d);
    }
    if (lane == 0) out[h] = total;
  }
}

/// moe_down_kernel with the slots of an output spread over warps: a block holds `per_block`
/// outputs x `slots` warps; warp (o, s) computes bf16(W_down,s[h] . act[s]) for output h of the
/// block, and one lane per output sums the slots in slot order, as moe_down_kernel does (same
/// products, same order: the same bits). moe_down_kernel walked the slots one after the other in
/// one warp, a chain of top_k memory round trips per output; here the whole block's rows are in
/// flight at once and finished blocks are replaced by new ones.
__global__ void __launch_bounds__(1024)
    moe_down_slots_kernel(const bf16* down, int first_expert, int num_local, int H, int I, const int32_t* idx,
                          const float* weights, int top_k, int per_block, const bf16* act, float* out,
                          SharedExpert sh) {
  pdl_begin();
  __shared__ float part[32];
  const int slots = top_k + (sh.inter > 0 ? 1 : 0);  // the shared expert is the last slot
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int s = warp % slots;
  const int o = warp / slots;
  const int h = blockIdx.x * per_block + o;
  if (h < H) {
    const bf16* d_row = nullptr;
    const bf16* a = nullptr;
    int n_chunks = 0;
    if (s < top_k) {
      const int local = idx[s] - first_expert;
      if (local >= 0 && local < num_local) {
        d_row = down + (static_cast<size_t>(local) * H + h) * I;
        a = act + static_cast<size_t>(s) * I;
        n_chunks = I / 8;
      }
    } else {
      d_row = sh.down + static_cast<size_t>(h) * sh.inter;
      a = act + static_cast<size_t>(top_k) * I;
      n_chunks = sh.inter / 8;
    }
    float d = 0.0f;
    if (d_row) d = warp_sum(slice_dot<false>(reinterpret_cast<const uint8_t*>(d_row), a, 0, n_chunks, lane));
    if (lane == 0) part[warp] = d;
  }
  __syncthreads();
  if (s == 0 && lane == 0 && h < H) {
    float total = 0.0f;
    for (int t = 0; t < top_k; ++t) {
      const int local = idx[t] - first_expert;
      if (local < 0 || local >= num_local) continue;
      total += weights[t] * round_to_bf16(part[o * slots + t]);
    }
    // The shared expert (weight 1) last, one IEEE add: what accumulate_f32 of its own output did.
    if (sh.inter > 0) total = __fadd_rn(total, round_to_bf16(part[o * slots + top_k]));
    out[h] = total;
  }
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

void moe_experts(const LaunchCtx& ctx, const bf16* x, const ExpertWeights& w, const int32_t* idx,
                 const float* weights, int top_k, float limit, bf16* act, float* out,
                 const ExpertWeights* shared) {
  const int H = w.hidden;
  const int I = w.inter;
  MTP_REQUIRE(H % 8 == 0 && I % 8 == 0, "ops::cuda::moe_experts: hidden ", H, " and inter ", I,
              " must be multiples of 8");
  require_aligned("moe_experts", "x", x);
  SharedExpert sh;
  if (shared) {
    MTP_REQUIRE(shared->hidden == H && shared->inter >= 8 && shared->inter % 8 == 0 && top_k + 1 <= 32 &&
                    shared->gate && shared->up && shared->down,
                "ops::cuda::moe_experts: shared expert (hidden ", shared->hidden, ", inter ", shared->inter,
                ") must match hidden ", H,
                ", have an inter that is a multiple of 8, and at most 31 routed slots");
    sh = SharedExpert{shared->gate, shared->up, shared->down, shared->inter};
  }
  const int warps_per_block = kMoeThreads / kWarp;
  if (top_k == 0 && !shared) {
    MTP_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float) * static_cast<size_t>(H), ctx.stream));
    return;
  }
  const int64_t tasks = static_cast<int64_t>(top_k) * I + sh.inter;
  const int grid1 = static_cast<int>(std::min<int64_t>((tasks + warps_per_block - 1) / warps_per_block,
                                                       static_cast<int64_t>(ctx.num_sms) * 8));
  launch(ctx, moe_gate_up_kernel, grid1, kMoeThreads, 0, x, w.gate, w.up, w.first_expert, w.num_local, H, I,
         idx, top_k, limit, act, sh);
  MTP_CUDA_LAUNCH_CHECK();
  const int slots = top_k + (shared ? 1 : 0);
  if (slots <= 32) {
    // One warp per (output, slot); at least 8 warps a block (e.g. 1 output x 8 slots, 8 x 1).
    const int per_block = std::max(1, warps_per_block / slots);
    const int grid2 = (H + per_block - 1) / per_block;
    launch(ctx, moe_down_slots_kernel, grid2, per_block * slots * kWarp, 0, w.down, w.first_expert,
           w.num_local, H, I, idx, weights, top_k, per_block, act, out, sh);
  } else {
    const int grid2 = std::min((H + warps_per_block - 1) / warps_per_block, ctx.num_sms * 8);
    launch(ctx, moe_down_kernel, grid2, kMoeThreads, 0, w.down, w.first_expert, w.num_local, H, I, idx,
           weights, top_k, act, out);
  }
  MTP_CUDA_LAUNCH_CHECK();
}

}  // namespace mtplab::ops::cuda
