// The argmax epilogue every kernel with a fused argmax shares (the GEMV head, the batched heads,
// the argmax kernels): a key back to its pair, a block's largest key, and the grid-level finish
// that lets the last block to complete write the result and reset the scratch (one launch, no
// memset between calls, graph-safe).
//
// Invariants:
// - Keys are argmax_key(value, index) (device_common.cuh): an unsigned MAX picks the largest value
//   and, among equals, the lowest index, whatever the order the keys meet in, so every reduction
//   here gives the CPU's pick.
// - A key written beside its pair (HeadExtras::key) is argmax_key of the pair written: the key is a
//   bijection on the values that occur (-0 is keyed as +0 and comes back as +0), so it is
//   argmax_pack_key's.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/device_common.cuh"
#include "ops/cuda/kernels.hpp"
#include "ops/ops.hpp"

namespace mtplab::ops::cuda {

/// Threads of a block of the per-row argmax kernels (argmax.cu) and of the FP8 cuBLASLt head's
/// combine (head.cu).
constexpr int kArgmaxRowThreads = 512;

/// The pair argmax_key(value, index) stands for.
__device__ __forceinline__ ArgMax argmax_of_key(unsigned long long key) {
  ArgMax a;
  a.value = from_order_preserving_u32(static_cast<uint32_t>(key >> 32));
  a.index = static_cast<int32_t>(~static_cast<uint32_t>(key & 0xffffffffull));
  return a;
}

/// out = the pair of `key`, and extras' key and token (argmax_pack_key's and argmax_pick's).
__device__ __forceinline__ void store_argmax(unsigned long long key, ArgMax* out, uint64_t* key_out,
                                             int32_t* token_out) {
  const ArgMax a = argmax_of_key(key);
  *out = a;
  if (key_out) *key_out = key;
  if (token_out) *token_out = a.index;
}

/// The largest of every thread's key in the block (s: one slot per warp, blockDim.x / 32 of
/// them); valid in thread 0. Whole block (one barrier).
__device__ __forceinline__ unsigned long long block_max_key(unsigned long long best, unsigned long long* s) {
  best = warp_max_u64(best);
  if (threadIdx.x % kWarp == 0) s[threadIdx.x / kWarp] = best;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) best = s[w] > best ? s[w] : best;
  return best;
}

/// One row's argmax over a grid (the GEMV head, argmax): the block's largest key into
/// partials[blockIdx.x], then the last block to finish reduces every block's key into `out` (and
/// extras) and resets the counter for the next launch (stream order). Whole block.
__device__ __forceinline__ void finish_argmax(unsigned long long best, unsigned long long* partials,
                                              unsigned int* counter, ArgMax* out, HeadExtras extras = {}) {
  __shared__ unsigned long long warp_best[32];
  __shared__ bool is_last;
  best = block_max_key(best, warp_best);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = best;
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
  __syncthreads();  // warp_best is rewritten
  b = block_max_key(b, warp_best);
  if (threadIdx.x == 0) {
    store_argmax(b, out, extras.key, extras.token);
    *counter = 0;  // ready for the next launch (stream order)
  }
}

/// Where a batched head (the skinny GEMM's head epilogue, the wgmma head, the multi-row GEMV head)
/// puts its argmax: row b's token ids from index_base, its pair at out[b] and extras, through the
/// per-row best keys and the completion counter of HeadBatchScratch (zero between launches).
struct HeadArgmaxOut {
  int64_t index_base = 0;
  ArgMax* out = nullptr;
  HeadExtras extras;
  unsigned long long* best = nullptr;
  unsigned int* counter = nullptr;
};

/// The batched heads' grid-level argmax, after the block's last tile (the whole block calls it):
/// the block's keys of its NB batch rows (s_best) into h.best (global atomicMax); the last block to
/// finish writes h.out[b] and extras for every live row (s_live) and resets the keys and the counter
/// (the next launch starts from zeros: no memset, graph-safe).
template <int NB>
__device__ __forceinline__ void rows_grid_finish(const HeadArgmaxOut& h, const uint8_t* s_live,
                                                 const unsigned long long* s_best) {
  __shared__ bool s_last;
  __syncthreads();
  for (int b = threadIdx.x; b < NB; b += blockDim.x)
    if (s_best[b] != 0) atomicMax(h.best + b, s_best[b]);
  __threadfence();  // publish the keys before counting this block as done
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(h.counter, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  for (int b = threadIdx.x; b < NB; b += blockDim.x) {
    if (!s_live[b]) continue;
    // Read and reset in one step (the next launch starts from zeros).
    store_argmax(atomicExch(h.best + b, 0ull), h.out + b, h.extras.key ? h.extras.key + b : nullptr,
                 h.extras.token ? h.extras.token + b : nullptr);
  }
  if (threadIdx.x == 0) *h.counter = 0;
}

/// out[b] = row b's largest key over its `parts` keys keys[b * parts + i], as the pair (a warp a
/// row): the second launch of the parted argmax kernels (argmax_batch, the FP8 cuBLASLt head).
void argmax_parts_reduce(const LaunchCtx& ctx, const unsigned long long* keys, int parts, int rows,
                         ArgMax* out);

}  // namespace mtplab::ops::cuda
