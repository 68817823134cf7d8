// The pooled lightning indexer's cache row store, shared by the single-row and the batched store
// kernels: once row p's k is in k_cache, the gate row and the valid flag, and when p completes its
// pool, the pool key. Column c of a key depends on nothing else, so the thread layout does not change
// the bits; the arithmetic is the CPU's, with explicit round-to-nearest steps.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

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

}  // namespace mtplab::ops::cuda::indexer
