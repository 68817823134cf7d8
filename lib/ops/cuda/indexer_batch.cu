// Batched pooled lightning indexer (docs/model.md), every row of the batch in one launch, each row on
// its own slot's slot-major arrays (ops::IndexerSlots):
// - indexer_norm_store_batch: block b layer-norms k_pre row b into k_cache row pos[b] of slot
//   slot[b], stores the gate row and the valid flag, and when the row completes its pool writes the
//   pool key from the pool's cached rows.
// - indexer_scores_batch: grid (pool blocks, rows); a warp scores 4 pools at once, lane h holding
//   head h's query dot products (the query rows in shared memory, the 4 keys broadcast from it).
// - indexer_select_batch: block b selects row b's pools exactly: a 4-pass 8-bit radix select on the
//   order-preserving score keys finds the n_sel-th largest key; the larger ones and the first equal
//   ones in pool order are taken (ties to the lower pool index), written at their rank in pool
//   order by a block scan, then the tail rows and the -1 padding.
// - indexer_share_select (the index_share arm): block b copies anchor row b's pool entries, then
//   the rows from the anchor's tail to pos[b], then -1 (integer copies: the CPU's entries).
//
// Invariants: a padded row (slot[b] < 0) reads nothing and writes nothing; the arithmetic of the
// pool key and the scores is the CPU reference's per element (device expf, summation order aside);
// the selection is exact (integer keys), so it equals the CPU's for the same scores.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "ops/cuda/batch_common.cuh"
#include "ops/cuda/batch_kernels.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/device_common.cuh"
#include "ops/cuda/indexer_pool.cuh"
#include "ops/cuda/launch.cuh"

namespace mtplab::ops::cuda {
namespace {

using batch::kRowThreads;

// ---- norm + store ------------------------------------------------------------------------------------

/// Block b: row b of the batch (see the file comment). V: the layernorm's path (0 scalar).
template <int V>
__global__ void __launch_bounds__(kRowThreads)
    indexer_norm_store_batch_kernel(const bf16* k_pre, const bf16* w, const bf16* bias, float eps,
                                    const float* gate, const float* ape, const int32_t* slot,
                                    const int32_t* pos, IndexerSlots idx) {
  pdl_begin();
  const int b = blockIdx.x;
  const int s = slot ? slot[b] : 0;  // no slots: the single sequence's caches
  if (s < 0) return;                 // padded row
  const int D = idx.D, P = idx.P;
  const int64_t p = pos[b];
  const size_t rows_per_slot = static_cast<size_t>(idx.max_rows);
  bf16* k_cache = idx.k_cache + static_cast<size_t>(s) * rows_per_slot * D;
  float* gate_cache = idx.gate_cache + static_cast<size_t>(s) * rows_per_slot * D;
  uint8_t* valid = idx.valid + static_cast<size_t>(s) * rows_per_slot;
  float* pool_keys = idx.pool_keys + static_cast<size_t>(s) * (idx.max_rows / idx.P) * D;
  const bf16* x = k_pre + static_cast<size_t>(b) * D;
  const float* g = gate + static_cast<size_t>(b) * D;
  bf16* krow = k_cache + static_cast<size_t>(p) * D;
  if constexpr (V == 0) {
    batch::layernorm_row_scalar(x, w, bias, D, eps, batch::StoreElems{krow});
  } else {
    batch::layernorm_row_vec<V>(x, w, bias, D, eps, batch::StoreOctets{krow});
  }
  indexer::finish_row(g, ape, p, k_cache, gate_cache, valid, pool_keys, D, P);
}

// ---- scores ------------------------------------------------------------------------------------------

constexpr int kScoreThreads = 256;
constexpr int kScoreWarps = kScoreThreads / kWarp;
constexpr int kPoolsPerWarp = 4;
constexpr int kPoolsPerBlock = kScoreWarps * kPoolsPerWarp;

/// Block (x, row b): pools j0 = (x * 8 + warp) * 4 + i * gridDim.x * 32 of row b; non-candidates
/// get -inf. A block with no candidate pool skips the query staging.
__global__ void __launch_bounds__(kScoreThreads)
    indexer_scores_batch_kernel(const float* q, const float* w, const int32_t* slot, const int32_t* pos,
                                IndexerSlots idx, float* scores, int n_heads) {
  pdl_begin();
  extern __shared__ float4 score_smem_vec[];
  float* smem = reinterpret_cast<float*>(score_smem_vec);
  const int b = blockIdx.y;
  const int s = slot[b];
  if (s < 0) return;  // padded row
  const int D = idx.D, P = idx.P, max_pools = (idx.max_rows / idx.P);
  const int64_t p = pos[b];
  const int n_cand = static_cast<int>(min((p + 1) / P, static_cast<int64_t>(max_pools)));
  float* out = scores + static_cast<size_t>(b) * max_pools;
  const int stride = gridDim.x * kPoolsPerBlock;
  if (static_cast<int>(blockIdx.x) * kPoolsPerBlock >= n_cand) {  // uniform: every pool of the block
    for (int j0 = blockIdx.x * kPoolsPerBlock; j0 < max_pools; j0 += stride)
      for (int i = threadIdx.x; i < kPoolsPerBlock && j0 + i < max_pools; i += blockDim.x)
        out[j0 + i] = -INFINITY;
    return;
  }
  const float* keys = idx.pool_keys + static_cast<size_t>(s) * max_pools * D;
  const float* qb = q + static_cast<size_t>(b) * n_heads * D;
  const float* wb = w + static_cast<size_t>(b) * n_heads;
  const int qstride = D + 4;
  float* q_s = smem;                                          // [n_heads][D + 4]
  float* w_s = q_s + static_cast<size_t>(n_heads) * qstride;  // [n_heads, padded to 4]
  float* key_s = w_s + ((n_heads + 3) / 4) * 4;               // [warps][D][4]
  const int q_vecs = n_heads * D / 4;
#pragma unroll 4
  for (int i = threadIdx.x; i < q_vecs; i += blockDim.x) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(qb) + i);
    const int h = (4 * i) / D, c = (4 * i) % D;
    *reinterpret_cast<float4*>(q_s + static_cast<size_t>(h) * qstride + c) = v;
  }
  for (int i = threadIdx.x; i < n_heads; i += blockDim.x) w_s[i] = wb[i];
  __syncthreads();
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const float inv_sqrt_d = 1.0f / sqrtf(static_cast<float>(D));
  float* my_keys = key_s + static_cast<size_t>(warp) * D * kPoolsPerWarp;
  for (int j0 = (blockIdx.x * kScoreWarps + warp) * kPoolsPerWarp; j0 < max_pools; j0 += stride) {
    if (j0 >= n_cand) {
      if (lane < kPoolsPerWarp && j0 + lane < max_pools) out[j0 + lane] = -INFINITY;
      continue;
    }
#pragma unroll 4
    for (int i = lane; i < kPoolsPerWarp * D / 4; i += kWarp) {
      const int pl = (4 * i) / D;
      const int c = (4 * i) % D;
      const float4 k4 =
          (j0 + pl < n_cand)
              ? __ldg(reinterpret_cast<const float4*>(keys + static_cast<size_t>(j0 + pl) * D + c))
              : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      my_keys[(c + 0) * kPoolsPerWarp + pl] = k4.x;
      my_keys[(c + 1) * kPoolsPerWarp + pl] = k4.y;
      my_keys[(c + 2) * kPoolsPerWarp + pl] = k4.z;
      my_keys[(c + 3) * kPoolsPerWarp + pl] = k4.w;
    }
    __syncwarp();
    float total[kPoolsPerWarp] = {};
    for (int h = lane; h < n_heads; h += kWarp) {
      float dot[kPoolsPerWarp] = {};
      const float* qh = q_s + static_cast<size_t>(h) * qstride;
#pragma unroll 4
      for (int c = 0; c < D; c += 4) {
        const float4 q4 = *reinterpret_cast<const float4*>(qh + c);
        const float qv[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) {
          const float4 k4 = *reinterpret_cast<const float4*>(my_keys + (c + cc) * kPoolsPerWarp);
          dot[0] = fmaf(qv[cc], k4.x, dot[0]);
          dot[1] = fmaf(qv[cc], k4.y, dot[1]);
          dot[2] = fmaf(qv[cc], k4.z, dot[2]);
          dot[3] = fmaf(qv[cc], k4.w, dot[3]);
        }
      }
#pragma unroll
      for (int pl = 0; pl < kPoolsPerWarp; ++pl)
        total[pl] = __fadd_rn(total[pl], __fmul_rn(w_s[h], fmaxf(__fmul_rn(dot[pl], inv_sqrt_d), 0.0f)));
    }
#pragma unroll
    for (int pl = 0; pl < kPoolsPerWarp; ++pl) total[pl] = warp_sum(total[pl]);
    if (lane < kPoolsPerWarp) {
      const int j = j0 + lane;
      float v = total[0];
#pragma unroll
      for (int pl = 1; pl < kPoolsPerWarp; ++pl)
        if (lane == pl) v = total[pl];
      if (j < max_pools) out[j] = j < n_cand ? v : -INFINITY;
    }
    __syncwarp();  // my_keys is restaged by the next group
  }
}

// ---- selection ---------------------------------------------------------------------------------------

constexpr int kSelectThreads = 1024;
constexpr int kShareThreads = 256;

/// Block b: row b's index_share selection (ops.hpp): the anchor's pool entries, then the rows
/// from the anchor's tail to pos[b], then -1. Entry e is written by thread e % blockDim.x, every
/// entry of the row once; nothing is read past the anchor's pool entries (<= K of K + P - 1).
__global__ void __launch_bounds__(kShareThreads)
    indexer_share_select_kernel(const int32_t* anchor, const int32_t* anchor_pos, const int32_t* pos,
                                int32_t* selection, int width, int K, int P) {
  pdl_begin();
  const int b = blockIdx.x;
  const int64_t a = anchor_pos[b], p = pos[b];
  const int64_t n_cand = a >= 0 ? (a + 1) / P : 0;
  const int64_t pool_entries = (n_cand < K / P ? n_cand : static_cast<int64_t>(K / P)) * P;
  const int64_t first_tail = n_cand * P;
  const int32_t* src = anchor + static_cast<size_t>(b) * (K + P - 1);
  int32_t* dst = selection + static_cast<size_t>(b) * width;
  for (int e = threadIdx.x; e < width; e += blockDim.x) {
    int32_t v = -1;
    if (e < pool_entries) {
      v = src[e];
    } else {
      const int64_t t = first_tail + (e - pool_entries);
      if (t <= p) v = static_cast<int32_t>(t);
    }
    dst[e] = v;
  }
}

/// Block b: row b's selection (see the file comment). `cached`: the dynamic shared memory holds
/// max_pools keys.
__global__ void __launch_bounds__(kSelectThreads)
    indexer_select_batch_kernel(const float* scores, const int32_t* slot, const int32_t* pos,
                                int32_t* selection, int K, int P, int max_pools, int cached) {
  pdl_begin();
  extern __shared__ uint32_t select_keys[];
  __shared__ unsigned int hist[256];
  __shared__ unsigned int s_digit, s_need;
  const int b = blockIdx.x;
  if (slot[b] < 0) return;  // padded row
  const int tid = threadIdx.x;
  const float* sc = scores + static_cast<size_t>(b) * max_pools;
  const int width = K + P - 1;
  int32_t* sel = selection + static_cast<size_t>(b) * width;
  const int64_t p = pos[b];
  const int n_cand = static_cast<int>(min(static_cast<int64_t>(max_pools), (p + 1) / P));
  const int n_sel = min(K / P, n_cand);
  if (cached) {
    for (int j = tid; j < n_cand; j += blockDim.x) select_keys[j] = order_preserving_u32(sc[j]);
    __syncthreads();
  }
  auto key_of = [&](int j) { return cached ? select_keys[j] : order_preserving_u32(sc[j]); };

  if (n_sel == n_cand) {
    // Every candidate: pool j at place j, i.e. rows 0 .. n_cand * P - 1 in order.
    for (int64_t i = tid; i < static_cast<int64_t>(n_cand) * P; i += blockDim.x)
      sel[i] = static_cast<int32_t>(i);
  } else if (n_sel > 0) {
    // Radix select from the top digit: prefix = the n_sel-th largest key's digits so far; `need` =
    // how many keys equal to the threshold are still to take.
    uint32_t prefix = 0;
    uint32_t need = static_cast<uint32_t>(n_sel);
    for (int shift = 24; shift >= 0; shift -= 8) {
      const uint32_t high_mask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
      for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      // Lanes of a warp with the same bin add once (the lowest), which spares the atomics on heavy
      // ties; the loop bound is uniform over the block, so every warp is converged at the match.
      for (int j0 = 0; j0 < n_cand; j0 += blockDim.x) {
        const int j = j0 + tid;
        const uint32_t key = j < n_cand ? key_of(j) : 0u;
        const bool match = j < n_cand && (key & high_mask) == prefix;
        const unsigned int bin = (key >> shift) & 0xffu;
        const unsigned int peers = __match_any_sync(0xffffffffu, match ? bin : 0x100u);
        if (match && (__ffs(peers) - 1) == (tid % kWarp))
          atomicAdd(&hist[bin], static_cast<unsigned int>(__popc(peers)));
      }
      __syncthreads();
      if (tid < kWarp) {
        // Lane l covers digits 255 - 8l .. 248 - 8l (descending); the lane whose range crosses
        // `need` walks it.
        unsigned int cnt = 0;
#pragma unroll
        for (int d = 0; d < 8; ++d) cnt += hist[255 - 8 * tid - d];
        unsigned int incl = cnt;
#pragma unroll
        for (int o = 1; o < kWarp; o <<= 1) {
          const unsigned int up = __shfl_up_sync(0xffffffffu, incl, o);
          if (tid >= o) incl += up;
        }
        const unsigned int before = incl - cnt;
        if (before < need && incl >= need) {
          unsigned int run = before;
          for (int d = 0; d < 8; ++d) {
            const unsigned int h = hist[255 - 8 * tid - d];
            if (run + h >= need) {
              s_digit = static_cast<unsigned int>(255 - 8 * tid - d);
              s_need = need - run;
              break;
            }
            run += h;
          }
        }
      }
      __syncthreads();
      prefix |= s_digit << shift;
      need = s_need;
      __syncthreads();  // s_digit / s_need / hist are rewritten by the next pass
    }
    // Keys > prefix are taken, and the first `need` keys == prefix in pool order. Thread t owns
    // pools [t * per, (t + 1) * per); a scan of (greater, equal) counts gives each its places.
    const int per = (n_cand + kSelectThreads - 1) / kSelectThreads;
    const int j_begin = min(n_cand, tid * per);
    const int j_end = min(n_cand, j_begin + per);
    unsigned long long gt = 0, eq = 0;
    for (int j = j_begin; j < j_end; ++j) {
      const uint32_t key = key_of(j);
      gt += key > prefix;
      eq += key == prefix;
    }
    unsigned long long total;
    const unsigned long long before = batch::block_exclusive_scan(gt | (eq << 32), &total);
    unsigned long long gt_before = before & 0xffffffffull;
    unsigned long long eq_before = before >> 32;
    for (int j = j_begin; j < j_end; ++j) {
      const uint32_t key = key_of(j);
      const bool take = key > prefix || (key == prefix && eq_before < need);
      if (take) {
        const int64_t place = static_cast<int64_t>(gt_before) +
                              static_cast<int64_t>(min(eq_before, static_cast<unsigned long long>(need)));
        for (int m = 0; m < P; ++m)
          sel[place * P + m] = static_cast<int32_t>(static_cast<int64_t>(j) * P + m);
      }
      gt_before += key > prefix;
      eq_before += key == prefix;
    }
  }
  // The tail rows P * n_cand .. p after the n_sel pools, then -1 to the width.
  const int64_t tail_first = static_cast<int64_t>(n_cand) * P;
  const int64_t base = static_cast<int64_t>(n_sel) * P;
  int64_t n_tail = p + 1 - tail_first;
  if (n_tail > width - base) n_tail = width - base;
  if (n_tail < 0) n_tail = 0;
  for (int64_t i = tid; i < n_tail; i += blockDim.x) sel[base + i] = static_cast<int32_t>(tail_first + i);
  for (int64_t i = base + n_tail + tid; i < width; i += blockDim.x) sel[i] = -1;
}

}  // namespace

void indexer_norm_store_batch(const LaunchCtx& ctx, const bf16* k_pre, const bf16* w, const bf16* b,
                              float eps, const float* gate, const float* ape, const int32_t* slot,
                              const int32_t* pos, int rows, const IndexerSlots& idx) {
  // k rows start at multiples of D in 16-byte aligned arrays: aligned when D is a whole number of octets.
  const int v = batch::row_vecs(idx.D, {k_pre, w, b, idx.k_cache});
  batch::with_vecs(v, [&](auto V) {
    launch(ctx, indexer_norm_store_batch_kernel<decltype(V)::value>, rows, kRowThreads, 0, k_pre, w, b, eps,
           gate, ape, slot, pos, idx);
  });
  MTP_CUDA_LAUNCH_CHECK();
}

void indexer_scores_batch(const LaunchCtx& ctx, const float* q, const float* w, const int32_t* slot,
                          const int32_t* pos, int rows, const IndexerSlots& idx, float* scores, int n_heads) {
  const int D = idx.D, max_pools = (idx.max_rows / idx.P);
  const size_t smem = sizeof(float) * (static_cast<size_t>(n_heads) * (D + 4) + ((n_heads + 3) / 4) * 4 +
                                       static_cast<size_t>(kScoreWarps) * D * kPoolsPerWarp);
  MTP_REQUIRE(smem <= 200 * 1024, "ops::cuda::indexer_scores_batch: ", n_heads, " heads x ", D,
              " do not fit in shared memory");
  static int opted_in = 48 * 1024;
  if (static_cast<int>(smem) > opted_in) {
    MTP_CUDA_CHECK(cudaFuncSetAttribute(indexer_scores_batch_kernel,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    opted_in = static_cast<int>(smem);
  }
  // About 4 blocks per multiprocessor over the whole batch; each block walks its pools.
  const int per_row = std::max(
      1, std::min((max_pools + kPoolsPerBlock - 1) / kPoolsPerBlock, (4 * ctx.num_sms + rows - 1) / rows));
  launch(ctx, indexer_scores_batch_kernel, dim3(per_row, rows), kScoreThreads, smem, q, w, slot, pos, idx,
         scores, n_heads);
  MTP_CUDA_LAUNCH_CHECK();
}

void indexer_share_select(const LaunchCtx& ctx, const int32_t* anchor, const int32_t* anchor_pos,
                          const int32_t* pos, int rows, int32_t* selection, int width, int K, int P) {
  launch(ctx, indexer_share_select_kernel, rows, kShareThreads, 0, anchor, anchor_pos, pos, selection, width,
         K, P);
  MTP_CUDA_LAUNCH_CHECK();
}

void indexer_select_batch(const LaunchCtx& ctx, const float* scores, const int32_t* slot, const int32_t* pos,
                          int rows, int32_t* selection, int K, int P, int max_pools) {
  const size_t cache_bytes = sizeof(uint32_t) * static_cast<size_t>(max_pools);
  const int cached = cache_bytes <= 160 * 1024 ? 1 : 0;
  const size_t smem = cached ? cache_bytes : 0;
  static int opted_in = 48 * 1024;
  if (static_cast<int>(smem) > opted_in) {
    MTP_CUDA_CHECK(cudaFuncSetAttribute(indexer_select_batch_kernel,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    opted_in = static_cast<int>(smem);
  }
  launch(ctx, indexer_select_batch_kernel, rows, kSelectThreads, smem, scores, slot, pos, selection, K, P,
         max_pools, cached);
  MTP_CUDA_LAUNCH_CHECK();
}

}  // namespace mtplab::ops::cuda
