// What the pooled lightning indexer's kernels share (indexer.cu; the comparison kernels of
// dev/cuda/indexer.cu include it too):
// - the cache row store of the single-row and the batched store kernels: once row p's k is in
//   k_cache, the gate row and the valid flag, and when p completes its pool, the pool key. Column c
//   of a key depends on nothing else, so the thread layout does not change the bits; the arithmetic
//   is the CPU's, with explicit round-to-nearest steps;
// - the pool scores' query staging and a warp's pool totals;
// - the selection's 8-bit histogram pass and its tail rows and padding.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ops/cuda/batch_common.cuh"
#include "ops/cuda/device_common.cuh"

namespace mtplab::ops::cuda::indexer {

/// Pool key column c of the pool whose rows are first .. first + P - 1 (every row already in the
/// caches): K[c] = sum_m softmax_m(gate[first+m, c] + ape[m, c]) * k[first+m, c], the CPU's order.
__device__ __forceinline__ float pool_key_column(const bf16* k_cache, const float* gate_cache,
                                                 const float* ape, int64_t first, int c, int D, int P) {
  float max_logit = -INFINITY;
  for (int m = 0; m < P; ++m)
    max_logit = fmaxf(max_logit, __fadd_rn(gate_cache[static_cast<size_t>(first + m) * D + c],
                                           ape[static_cast<size_t>(m) * D + c]));
  float denom = 0.0f;
  for (int m = 0; m < P; ++m)
    denom = __fadd_rn(denom, expf(__fsub_rn(__fadd_rn(gate_cache[static_cast<size_t>(first + m) * D + c],
                                                      ape[static_cast<size_t>(m) * D + c]),
                                            max_logit)));
  float acc = 0.0f;
  for (int m = 0; m < P; ++m) {
    const float e = expf(__fsub_rn(
        __fadd_rn(gate_cache[static_cast<size_t>(first + m) * D + c], ape[static_cast<size_t>(m) * D + c]),
        max_logit));
    acc = __fadd_rn(
        acc, __fmul_rn(__fdiv_rn(e, denom), bf16_to_f(k_cache[static_cast<size_t>(first + m) * D + c])));
  }
  return acc;
}

/// Row p's gate row and valid flag, then its pool's key when p completes the pool (p % P == P - 1):
/// k_cache row p must be written (by this block) before the call; every thread of the block calls it.
__device__ __forceinline__ void finish_row(const float* gate, const float* ape, int64_t p,
                                           const bf16* k_cache, float* gate_cache, uint8_t* valid,
                                           float* pool_keys, int D, int P) {
  const size_t row = static_cast<size_t>(p) * D;
  for (int c = threadIdx.x; c < D; c += blockDim.x) gate_cache[row + c] = gate[c];
  if (threadIdx.x == 0) valid[p] = 1;
  if (p % P != P - 1) return;  // uniform over the block
  __syncthreads();             // the k and gate rows just written are read back for the key
  const int64_t j = p / P;
  for (int c = threadIdx.x; c < D; c += blockDim.x)
    pool_keys[static_cast<size_t>(j) * D + c] = pool_key_column(k_cache, gate_cache, ape, j * P, c, D, P);
}

// ---- pool scores ---------------------------------------------------------------------------------------

constexpr int kScoreThreads = 256;
constexpr int kScoreWarps = kScoreThreads / kWarp;
constexpr int kPoolsPerWarp = 4;

/// The query rows (16-byte loads, unrolled so that many are in flight: a scalar loop here was a
/// chain of dependent round trips) into q_s [n_heads][qstride] and the head weights into w_s.
/// D % 4 == 0 and q 16-byte aligned (checked at launch). Whole block; the caller syncs.
__device__ __forceinline__ void stage_queries(const float* q, const float* w, float* q_s, float* w_s,
                                              int n_heads, int D, int qstride) {
  const int q_vecs = n_heads * D / 4;
#pragma unroll 4
  for (int i = threadIdx.x; i < q_vecs; i += blockDim.x) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(q) + i);
    const int h = (4 * i) / D, c = (4 * i) % D;
    *reinterpret_cast<float4*>(q_s + static_cast<size_t>(h) * qstride + c) = v;
  }
  for (int i = threadIdx.x; i < n_heads; i += blockDim.x) w_s[i] = w[i];
}

/// The warp's 4 pool totals (each lane's partial over its heads) summed over the warp and written
/// to out[j0 + i] by lane i: -inf past n_cand, nothing past max_pools. Whole warp.
__device__ __forceinline__ void write_pool_totals(float (&total)[kPoolsPerWarp], int j0, int n_cand,
                                                  int max_pools, int lane, float* out) {
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
}

// The tiled scores kernel's block (indexer.cu, "scores on register tiles"; its rule: dispatch.cu).
constexpr int kTileHeads = 32;  // the kernel's head count (others run pools4)
constexpr int kTilePools = 16;  // pools per warp group
constexpr int kTileThreads = 256;
constexpr int kTileWarps = kTileThreads / kWarp;
/// The tiled scores kernel's dynamic shared memory: the 32 query rows and weights, then every warp's
/// 2-stage ring of 16 key rows, rows padded to D + 4 floats.
inline size_t tiled_scores_smem(int D) {
  return sizeof(float) * (static_cast<size_t>(kTileHeads) * (D + 4) + kTileHeads +
                          static_cast<size_t>(kTileWarps) * 2 * kTilePools * (D + 4));
}
constexpr size_t kTiledScoresMaxSmem = 200 * 1024;

// ---- selection -----------------------------------------------------------------------------------------

constexpr int kSelectThreads = 1024;

/// The selection's end (every select kernel, whole block): after the n_sel selected pools, the
/// rows of the incomplete tail pool(s) up to p, then -1 to `width`.
__device__ __forceinline__ void write_tail_and_padding(int32_t* selection, int64_t p, int n_cand, int n_sel,
                                                       int P, int width) {
  const int64_t tail_first = static_cast<int64_t>(n_cand) * P;
  const int64_t base = static_cast<int64_t>(n_sel) * P;
  int64_t n_tail = p + 1 - tail_first;
  if (n_tail > width - base) n_tail = width - base;
  if (n_tail < 0) n_tail = 0;
  for (int64_t i = threadIdx.x; i < n_tail; i += blockDim.x)
    selection[base + i] = static_cast<int32_t>(tail_first + i);
  for (int64_t i = base + n_tail + threadIdx.x; i < width; i += blockDim.x) selection[i] = -1;
}

/// One 8-bit pass of the 4-pass radix select (the batched one, whole block):
/// hist[d] = how many of the n_cand keys match `prefix` above bit shift + 8 and have digit d at
/// `shift`. The loop bound is uniform across the block, so every warp is converged at the match;
/// lanes with the same bin add once (the lowest), which spares the atomics on heavy ties. Returns
/// with hist complete (synced).
template <typename KeyOf>
__device__ __forceinline__ void radix_histogram(unsigned int* hist, int n_cand, KeyOf&& key_of,
                                                uint32_t prefix, int shift) {
  const int tid = threadIdx.x;
  const uint32_t high_mask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
  for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
  __syncthreads();
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
}

}  // namespace mtplab::ops::cuda::indexer
