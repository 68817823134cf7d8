// The single-row GEMV family (the CPU reference: cpu/dense.cpp): BF16 and FP8 (per-row scaled)
// GEMV, the draft head with its argmax fused (head_argmax), several GEMVs of one x in one launch
// (linear_group). The kernels: gemv.cuh; their invariants there. Which instance a launch runs:
// dispatch.cu (gemv_plan).
#include <algorithm>
#include <cstdint>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dense.hpp"
#include "ops/cuda/device_common.cuh"
#include "ops/cuda/gemv.cuh"
#include "ops/cuda/launch.cuh"

namespace mtplab::ops::cuda {

namespace {

/// The launch of `op` (gemv_bf16, gemv_fp8, head_argmax): dispatch.cu's plan, noted in the record.
template <bool kFp8, OutKind kOut, bool kArgmax>
void launch_gemv(const LaunchCtx& ctx, const char* op, const GemvParams& p, int grid_cap) {
  const GemvPlan plan = gemv_plan(ctx, kFp8, kArgmax, kOut == OutKind::f32, p.n, p.k, p.map.rows_per_group);
  record_kernel(ctx, op, kernel_text(plan));
  if constexpr (kOut != OutKind::f32) {
    switch (plan.kernel) {
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

}  // namespace

int gemv_max_grid(int num_sms) { return num_sms * kMaxBlocksPerSm; }

void gemv_bf16(const LaunchCtx& ctx, const bf16* W, const bf16* x, void* y, bool f32_out, int n, int k,
               const GemvRowMap& map) {
  const GemvParams p = gemv_params("gemv_bf16", false, W, nullptr, x, y, n, k, map);
  if (f32_out) {
    launch_gemv<false, OutKind::f32, false>(ctx, "gemv_bf16", p, 0);
  } else {
    launch_gemv<false, OutKind::bf16, false>(ctx, "gemv_bf16", p, 0);
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
    g.split = gemv_split(ctx, o.n_out, k / 8);
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
  launch_gemv<true, OutKind::bf16, false>(ctx, "gemv_fp8", p, 0);
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
    launch_gemv<true, OutKind::bf16, true>(ctx, "head_argmax", p, scratch.capacity);
  } else {
    launch_gemv<false, OutKind::bf16, true>(ctx, "head_argmax", p, scratch.capacity);
  }
}

}  // namespace mtplab::ops::cuda
