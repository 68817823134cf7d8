// The argmax family (the CPU reference: cpu/dense.cpp): the argmax of a BF16 vector over a grid,
// its pack / unpack / pick helpers, and the same over rows (argmax_batch: a block a row, or a
// few long rows in parts). The epilogue they share with the heads: argmax.cuh.
#include <algorithm>
#include <cstdint>

#include "ops/cuda/argmax.cuh"
#include "ops/cuda/batch_common.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dense.hpp"
#include "ops/cuda/device_common.cuh"
#include "ops/cuda/launch.cuh"

namespace mtplab::ops::cuda {

namespace {

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
  *token = argmax_of_key(*key).index;
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

/// The largest key of this thread's share of part `part` of `parts` of a row (a contiguous run of
/// its 16-byte vectors when vec, of its values otherwise; the last part also takes the tail past
/// the last whole vector). One part: the whole row.
__device__ __forceinline__ unsigned long long row_part_best_key(const bf16* row, int n, int64_t index_base,
                                                                int part, int parts, int vec) {
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
  return best;
}

/// Block b: the argmax of row b (16-byte loads when the rows are aligned), ties to the lowest index.
__global__ void __launch_bounds__(kArgmaxRowThreads)
    argmax_rows_kernel(const bf16* x, int ld_x, int n, int64_t index_base, ArgMax* out, int vec) {
  pdl_begin();
  __shared__ unsigned long long s_best[kArgmaxRowThreads / kWarp];
  const bf16* row = x + static_cast<size_t>(blockIdx.x) * ld_x;
  const unsigned long long best = block_max_key(row_part_best_key(row, n, index_base, 0, 1, vec), s_best);
  if (threadIdx.x == 0) out[blockIdx.x] = argmax_of_key(best);
}

/// Block (part, row): the largest key of part `part` of row `row` (row_part_best_key) into
/// keys[row * parts + part]; argmax_parts_reduce_kernel finishes the rows.
__global__ void __launch_bounds__(kArgmaxRowThreads)
    argmax_row_parts_kernel(const bf16* x, int ld_x, int n, int64_t index_base, unsigned long long* keys,
                            int vec) {
  pdl_begin();
  __shared__ unsigned long long s_best[kArgmaxRowThreads / kWarp];
  const int part = blockIdx.x, parts = gridDim.x;
  const bf16* row = x + static_cast<size_t>(blockIdx.y) * ld_x;
  const unsigned long long best =
      block_max_key(row_part_best_key(row, n, index_base, part, parts, vec), s_best);
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
  if (lane == 0) out[b] = argmax_of_key(best);
}

__global__ void unpack_key_rows_kernel(const uint64_t* key, int32_t* token, int rows) {
  pdl_begin();
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b < rows) token[b] = argmax_of_key(key[b]).index;
}

/// Row b: the largest value among pairs[i * rows + b], lowest index on ties (argmax_pick's rule).
__global__ void pick_rows_kernel(const ArgMax* pairs, int n, int rows, int32_t* token) {
  pdl_begin();
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  token[b] = pick_index(pairs + b, n, rows);
}

}  // namespace

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
    argmax_parts_reduce(ctx, single_row.partials, parts, rows, out);
    return;
  }
  launch(ctx, argmax_rows_kernel, rows, kArgmaxRowThreads, 0, x, ld_x, n, index_base, out, vec);
  MTP_CUDA_LAUNCH_CHECK();
}

void argmax_parts_reduce(const LaunchCtx& ctx, const unsigned long long* keys, int parts, int rows,
                         ArgMax* out) {
  constexpr int kReduceWarps = 4;
  launch(ctx, argmax_parts_reduce_kernel, (rows + kReduceWarps - 1) / kReduceWarps, kReduceWarps * kWarp, 0,
         keys, parts, rows, out);
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
