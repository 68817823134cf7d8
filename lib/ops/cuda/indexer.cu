// The pooled lightning indexer (docs/model.md; the CPU reference: cpu/indexer.cpp): the row store
// and its pool key, the pool scores and the top-k pool selection.
// - One row: indexer_store (a normed row; the pool key when the row completes its pool),
//   indexer_select (an 11/11/10-bit radix select that stops at the first digit whose bin is taken
//   whole); indexer_norm_store and indexer_scores run the batched kernels at one row. (The former
//   single-row scores kernel and the v1 selection of four 8-bit passes are comparison kernels in
//   dev/cuda/indexer.cu.)
// - Batched rows, every row of the batch in one launch, each row on its own slot's slot-major
//   arrays (ops::IndexerSlots):
//   - indexer_norm_store_batch: block b layer-norms k_pre row b into k_cache row pos[b] of slot
//     slot[b], stores the gate row and the valid flag, and when the row completes its pool writes
//     the pool key from the pool's cached rows. Rows that share a slot (ragged rows) store in one
//     launch and write the keys in a second, so a key never reads a row another block is writing.
//   - indexer_scores_batch: grid (pool blocks, rows); by the policy's indexer_scores, pools4: a warp
//     scores 4 pools at once, lane h holding head h's query dot products (the query rows in shared
//     memory, the 4 keys broadcast from it); tiled: a warp scores 16 pools, each lane 4 heads x 4
//     pools on register tiles ("scores on register tiles"). The same bits.
//   - indexer_select_batch: block b selects row b's pools exactly: a 4-pass 8-bit radix select on
//     the order-preserving score keys finds the n_sel-th largest key; the larger ones and the first
//     equal ones in pool order are taken (ties to the lower pool index), written at their rank in
//     pool order by a block scan, then the tail rows and the -1 padding. A batch of one runs the
//     single-row radix kernel, which does nothing for a padded row.
//   - indexer_share_select (the index_share arm): block b copies anchor row b's pool entries, then
//     the rows from the anchor's tail to pos[b], then -1 (integer copies: the CPU's entries).
//
// Invariants:
// - Elementwise arithmetic after a reduction uses the CPU reference's operation order with
//   explicit round-to-nearest intrinsics (no FMA contraction), so outputs differ from the CPU
//   only through the reduction order and the device expf.
// - The selection is exact: a block-wide radix select on the order-preserving 32-bit score key
//   finds the K/P-th largest score; all larger ones are taken, and the lowest-index equals fill
//   the rest, so ties go to the lower pool index as the CPU's nth_element comparison does. Every
//   selection kernel (one row: the radix kernel; batched rows) writes the CPU's selection.
// - A padded row (slot[b] < 0) reads nothing and writes nothing.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "ops/cuda/batch_common.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/device_common.cuh"
#include "ops/cuda/dispatch.hpp"
#include "ops/cuda/indexer.hpp"
#include "ops/cuda/indexer_pool.cuh"
#include "ops/cuda/launch.cuh"

namespace mtplab::ops::cuda {

// ==== one row ==========================================================================================

namespace {

// The pieces the kernels share (indexer_pool.cuh).
using indexer::kPoolsPerWarp;
using indexer::kScoreThreads;
using indexer::kScoreWarps;
using indexer::kSelectThreads;
using indexer::kTileHeads;
using indexer::kTilePools;
using indexer::kTileThreads;
using indexer::kTileWarps;
using indexer::radix_histogram;
using indexer::stage_queries;
using indexer::tiled_scores_smem;
using indexer::write_pool_totals;
using indexer::write_tail_and_padding;

// ---- indexer: store + pool key ----------------------------------------------------------------------

__global__ void indexer_store_kernel(const bf16* k_normed, const float* gate, const float* ape,
                                     const int32_t* pos, bf16* k_cache, float* gate_cache, uint8_t* valid,
                                     float* pool_keys, int D, int P) {
  pdl_begin();
  const int64_t p = pos[0];
  const size_t row = static_cast<size_t>(p) * D;
  for (int c = threadIdx.x; c < D; c += blockDim.x) k_cache[row + c] = k_normed[c];
  indexer::finish_row(gate, ape, p, k_cache, gate_cache, valid, pool_keys, D, P);
}

// ---- indexer: selection, the radix kernel (docs/kernels.md) -------------------------------------------

// Three digits of the 32-bit key: bits 31..21, 20..10 (11 bits each), then 9..0.
constexpr int kRadixBins = 2048;
constexpr int kRadixLoad = 8;           // keys in flight per thread in the first pass (16 spill)
constexpr int kRadixCandidates = 4096;  // the first digit's bin is kept for the last pass up to this
static_assert(kSelectThreads == kWarp * kWarp, "32 warps: lane l of a warp reads warp l's total");
static_assert(2 * kSelectThreads == kRadixBins, "every thread reads two bins");

/// Adds one to hist[bin] for each lane with `counted`. Lanes in a run of equal bins (consecutive
/// lanes) add once, at the run's first lane, so heavy ties do not pile atomics onto one address.
/// All 32 lanes must call it together.
__device__ __forceinline__ void radix_count(unsigned int* hist, bool counted, unsigned int bin) {
  const int lane = threadIdx.x % kWarp;
  const unsigned int b = counted ? bin : 0xffffffffu;  // never a bin: uncounted lanes form their own runs
  const unsigned int left = __shfl_up_sync(0xffffffffu, b, 1);
  const bool head = lane == 0 || left != b;
  const unsigned int heads = __ballot_sync(0xffffffffu, head);
  const unsigned int later = heads & ~((2u << lane) - 1u);  // heads above this lane (2u << 31 == 0)
  const int next = later ? __ffs(later) - 1 : kWarp;
  if (counted && head) atomicAdd(&hist[bin], static_cast<unsigned int>(next - lane));
}

struct RadixDigit {
  unsigned int digit;  ///< the bin holding the need-th largest counted key
  unsigned int need;   ///< how many of that bin's keys are still to take (1 .. count)
  unsigned int count;  ///< that bin's count
};

/// Called by the whole block once `hist` (nbins <= 2048 counts, bins in ascending key order) is
/// complete and visible to every thread. `need` is >= 1 and at most the number of counted keys.
/// Thread t holds the bins of descending rank 2t and 2t + 1; a warp scan, then each warp's offset
/// from the other warps' totals, finds the one bin where the count from the top reaches `need`.
/// Three barriers; `hist` is zeroed between the first two (every read of it is done by the first)
/// and stays zero for the next pass; the third orders every read of the result before the
/// caller's next shared-memory writes (compute-sanitizer racecheck reported the result's read
/// against the output phase's writes without it). Every thread returns the same digit.
__device__ __forceinline__ RadixDigit radix_digit(unsigned int* hist, int nbins, unsigned int need) {
  __shared__ unsigned int s_warp[kWarp];
  __shared__ RadixDigit s_found;
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int r = 2 * static_cast<int>(threadIdx.x);
  const unsigned int c0 = r < nbins ? hist[nbins - 1 - r] : 0u;
  const unsigned int c1 = r + 1 < nbins ? hist[nbins - 2 - r] : 0u;
  unsigned int incl = c0 + c1;
#pragma unroll
  for (int o = 1; o < kWarp; o <<= 1) {
    const unsigned int up = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += up;
  }
  if (lane == kWarp - 1) s_warp[warp] = incl;
  __syncthreads();
  for (int i = threadIdx.x; i < kRadixBins; i += blockDim.x) hist[i] = 0;
  unsigned int warp_before = lane < warp ? s_warp[lane] : 0u;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) warp_before += __shfl_xor_sync(0xffffffffu, warp_before, o);
  const unsigned int before = warp_before + incl - c0 - c1;  // counted keys in higher bins
  if (c0 > 0 && before < need && before + c0 >= need) {
    s_found = {static_cast<unsigned int>(nbins - 1 - r), need - before, c0};
  } else if (c1 > 0 && before + c0 < need && before + c0 + c1 >= need) {
    s_found = {static_cast<unsigned int>(nbins - 2 - r), need - before - c0, c1};
  }
  __syncthreads();
  const RadixDigit found = s_found;
  __syncthreads();  // every thread has read s_found before any thread goes on to write shared memory
  return found;
}

/// The same selection as indexer_select_kernel in fewer barriers. The first pass counts the top
/// digit while loading the keys (loads issued before `pos` is known: the buffer holds max_pools
/// scores); each further pass counts only the keys whose digits so far equal the threshold's
/// (after the first, only the first digit's bin, kept in `cand` when it fits). A pass whose bin is
/// taken whole (need == count) ends the search: the threshold is then compared under the mask of
/// the digits found, and every key in its bin is taken. Then warp w owns pools
/// [w * span, (w + 1) * span): ballots count the keys above / equal to the threshold, the warps'
/// totals give each warp its offsets, and a second walk writes each taken pool at its rank in
/// pool order (equal keys: the lowest pools first, `need` of them).
__global__ void __launch_bounds__(kSelectThreads)
    indexer_select_radix_kernel(const float* scores, const int32_t* slot, const int32_t* pos,
                                int32_t* selection, int K, int P, int max_pools, int cached, int cand_cap) {
  extern __shared__ uint32_t radix_smem[];
  unsigned int* hist = radix_smem;           // [kRadixBins], zero outside a pass
  uint32_t* cand = radix_smem + kRadixBins;  // [cand_cap]
  uint32_t* key_cache = cand + cand_cap;     // [max_pools] when `cached`
  __shared__ unsigned int s_cand_count;
  __shared__ unsigned int s_gt[kWarp];
  __shared__ unsigned int s_eq[kWarp];
  pdl_begin();
  if (slot && slot[0] < 0) return;  // a batch of one whose row is padding: nothing read or written
  const int tid = threadIdx.x;
  const int warp = tid / kWarp;
  const int lane = tid % kWarp;
  const int64_t p = pos[0];
  uint32_t k[kRadixLoad];
#pragma unroll
  for (int u = 0; u < kRadixLoad; ++u) {
    const int j = u * kSelectThreads + tid;
    k[u] = j < max_pools ? order_preserving_u32(scores[j]) : 0u;
  }
  for (int i = tid; i < kRadixBins; i += blockDim.x) hist[i] = 0;
  if (tid == 0) s_cand_count = 0;
  __syncthreads();
  const int n_cand = static_cast<int>(min(static_cast<int64_t>(max_pools), (p + 1) / P));
  const int n_sel = min(K / P, n_cand);
  const int width = K + P - 1;
  auto key_of = [&](int j) { return cached ? key_cache[j] : order_preserving_u32(scores[j]); };

  if (n_sel > 0 && n_sel < n_cand) {
    // Pass 1: bits 31..21 of every candidate, kRadixLoad keys per thread at a time.
    for (int j0 = 0;;) {
#pragma unroll
      for (int u = 0; u < kRadixLoad; ++u) {
        if (j0 + u * kSelectThreads >= n_cand) break;  // uniform: the rest of the chunk is past the end
        const int j = j0 + u * kSelectThreads + tid;
        if (cached && j < n_cand) key_cache[j] = k[u];
        radix_count(hist, j < n_cand, k[u] >> 21);
      }
      j0 += kRadixLoad * kSelectThreads;
      if (j0 >= n_cand) break;
#pragma unroll
      for (int u = 0; u < kRadixLoad; ++u) {
        const int j = j0 + u * kSelectThreads + tid;
        k[u] = j < max_pools ? order_preserving_u32(scores[j]) : 0u;
      }
    }
    __syncthreads();
    // Invariant: the keys with (key & mask) > prefix are taken (n_sel - need of them), and `need`
    // of those with (key & mask) == prefix.
    RadixDigit d = radix_digit(hist, kRadixBins, static_cast<unsigned int>(n_sel));
    uint32_t mask = 0xffe00000u;
    uint32_t prefix = d.digit << 21;
    unsigned int need = d.need;
    if (d.count != need) {
      // Pass 2: bits 20..10 of the first digit's bin; its keys go to `cand` when they fit.
      const bool compact = d.count <= static_cast<unsigned int>(cand_cap);
      for (int j0 = 0; j0 < n_cand; j0 += kSelectThreads) {
        const int j = j0 + tid;
        const uint32_t key = j < n_cand ? key_of(j) : 0u;
        const bool in_bin = j < n_cand && (key & mask) == prefix;
        radix_count(hist, in_bin, (key >> 10) & 0x7ffu);
        if (compact) {
          const unsigned int ballot = __ballot_sync(0xffffffffu, in_bin);
          if (ballot) {  // warp-uniform
            const int leader = __ffs(ballot) - 1;
            unsigned int base = 0;
            if (lane == leader) base = atomicAdd(&s_cand_count, static_cast<unsigned int>(__popc(ballot)));
            base = __shfl_sync(0xffffffffu, base, leader);
            if (in_bin) cand[base + __popc(ballot & ((1u << lane) - 1u))] = key;
          }
        }
      }
      __syncthreads();
      d = radix_digit(hist, kRadixBins, need);
      mask = 0xfffffc00u;
      prefix |= d.digit << 10;
      need = d.need;
      if (d.count != need) {
        // Pass 3: bits 9..0 of the second digit's bin, from `cand` (all of the first digit's
        // bin) or, when it did not fit, from every candidate.
        const int len = compact ? static_cast<int>(s_cand_count) : n_cand;
        for (int i0 = 0; i0 < len; i0 += kSelectThreads) {
          const int i = i0 + tid;
          const uint32_t key = i < len ? (compact ? cand[i] : key_of(i)) : 0u;
          radix_count(hist, i < len && (key & mask) == prefix, key & 0x3ffu);
        }
        __syncthreads();
        d = radix_digit(hist, kRadixBins / 2, need);
        mask = 0xffffffffu;
        prefix |= d.digit;
        need = d.need;
      }
    }

    // Output: warp w's pools, counted, then written at their rank in pool order.
    const int span = (n_cand + kSelectThreads - 1) / kSelectThreads * kWarp;
    const int first = warp * span;
    unsigned int gt = 0, eq = 0;
    for (int c = 0; c < span; c += kWarp) {
      const int j = first + c + lane;
      const uint32_t key = j < n_cand ? key_of(j) & mask : 0u;
      gt += __popc(__ballot_sync(0xffffffffu, j < n_cand && key > prefix));
      eq += __popc(__ballot_sync(0xffffffffu, j < n_cand && key == prefix));
    }
    if (lane == 0) {
      s_gt[warp] = gt;
      s_eq[warp] = eq;
    }
    __syncthreads();
    unsigned int gt_before = lane < warp ? s_gt[lane] : 0u;
    unsigned int eq_before = lane < warp ? s_eq[lane] : 0u;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      gt_before += __shfl_xor_sync(0xffffffffu, gt_before, o);
      eq_before += __shfl_xor_sync(0xffffffffu, eq_before, o);
    }
    const unsigned int below = (1u << lane) - 1u;
    for (int c = 0; c < span; c += kWarp) {
      const int j = first + c + lane;
      const uint32_t key = j < n_cand ? key_of(j) & mask : 0u;
      const unsigned int gt_bits = __ballot_sync(0xffffffffu, j < n_cand && key > prefix);
      const unsigned int eq_bits = __ballot_sync(0xffffffffu, j < n_cand && key == prefix);
      const unsigned int g = gt_before + __popc(gt_bits & below);
      const unsigned int e = eq_before + __popc(eq_bits & below);
      if (j < n_cand && (key > prefix || (key == prefix && e < need))) {
        const int64_t out = static_cast<int64_t>(g) + static_cast<int64_t>(min(e, need));
        for (int m = 0; m < P; ++m)
          selection[out * P + m] = static_cast<int32_t>(static_cast<int64_t>(j) * P + m);
      }
      gt_before += __popc(gt_bits);
      eq_before += __popc(eq_bits);
    }
  } else if (n_sel == n_cand) {
    // Every candidate is taken: pool j at slot j, i.e. rows 0 .. n_cand * P - 1 in order.
    for (int64_t i = tid; i < static_cast<int64_t>(n_cand) * P; i += blockDim.x)
      selection[i] = static_cast<int32_t>(i);
  }
  write_tail_and_padding(selection, p, n_cand, n_sel, P, width);
}

}  // namespace

void indexer_store(const LaunchCtx& ctx, const bf16* k_normed, const float* gate, const float* ape,
                   const int32_t* pos, bf16* k_cache, float* gate_cache, uint8_t* valid, float* pool_keys,
                   int D, int P) {
  MTP_REQUIRE(D >= 1 && P >= 1, "ops::cuda::indexer_store: D ", D, ", P ", P);
  launch(ctx, indexer_store_kernel, 1, std::min(1024, ((D + 31) / 32) * 32), 0, k_normed, gate, ape, pos,
         k_cache, gate_cache, valid, pool_keys, D, P);
  MTP_CUDA_LAUNCH_CHECK();
}

void indexer_norm_store(const LaunchCtx& ctx, const bf16* x, const bf16* w, const bf16* b, float eps,
                        const float* gate, const float* ape, const int32_t* pos, bf16* k_cache,
                        float* gate_cache, uint8_t* valid, float* pool_keys, int D, int P) {
  MTP_REQUIRE(D >= 1 && P >= 1, "ops::cuda::indexer_norm_store: D ", D, ", P ", P);
  MTP_REQUIRE(reinterpret_cast<uintptr_t>(k_cache) % 16 == 0,
              "ops::cuda::indexer_norm_store: k_cache must be 16-byte aligned");
  // The batched kernel at one row, the sequence's caches as slot 0's (below); max_rows is
  // only a slot stride, unused for slot 0.
  IndexerSlots idx;
  idx.k_cache = k_cache;
  idx.gate_cache = gate_cache;
  idx.valid = valid;
  idx.pool_keys = pool_keys;
  idx.slots = 1;
  idx.max_rows = P;
  idx.D = D;
  idx.P = P;
  indexer_norm_store_batch(ctx, x, w, b, eps, gate, ape, nullptr, pos, 1, idx);
}

void indexer_scores(const LaunchCtx& ctx, const float* q, const float* w, const float* pool_keys,
                    const int32_t* pos, float* scores, int n_heads, int D, int P, int max_pools) {
  MTP_REQUIRE(n_heads >= 1 && D >= 4 && D % 4 == 0 && P >= 1 && max_pools >= 1,
              "ops::cuda::indexer_scores: n_heads ", n_heads, ", D ", D, " (a multiple of 4), P ", P,
              ", max_pools ", max_pools);
  MTP_REQUIRE(reinterpret_cast<uintptr_t>(q) % 16 == 0 && reinterpret_cast<uintptr_t>(pool_keys) % 16 == 0,
              "ops::cuda::indexer_scores: q and pool_keys must be 16-byte aligned");
  // The batched kernel at one row, the sequence's pool keys as slot 0's (below); the scores read
  // nothing else of the slot's arrays.
  IndexerSlots idx;
  idx.pool_keys = const_cast<float*>(pool_keys);
  idx.slots = 1;
  idx.max_rows = max_pools * P;
  idx.D = D;
  idx.P = P;
  indexer_scores_batch(ctx, q, w, nullptr, pos, 1, idx, scores, n_heads);
}

namespace {

/// The v2 selection of one row (slot: null, or a batch of one's slot: nothing done when < 0).
void launch_select_radix(const LaunchCtx& ctx, const float* scores, const int32_t* slot, const int32_t* pos,
                         int32_t* selection, int K, int P, int max_pools) {
  // The histogram, the candidate buffer (never more than the pools), then the cached keys: at most
  // 8 + 16 + 160 KB (keys in shared memory up to 40960 pools; beyond, the passes read global memory).
  // Without the opt-in, static (400 bytes) plus dynamic must fit in 48 KB.
  const size_t cache_bytes = sizeof(uint32_t) * static_cast<size_t>(max_pools);
  const int cached = cache_bytes <= 160 * 1024 ? 1 : 0;
  const int cand_cap = std::min(max_pools, kRadixCandidates);
  const size_t smem =
      sizeof(uint32_t) * (static_cast<size_t>(kRadixBins) + cand_cap) + (cached ? cache_bytes : 0);
  if (smem > 47 * 1024) {
    MTP_CUDA_CHECK(cudaFuncSetAttribute(indexer_select_radix_kernel,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  launch(ctx, indexer_select_radix_kernel, 1, kSelectThreads, smem, scores, slot, pos, selection, K, P,
         max_pools, cached, cand_cap);
}

}  // namespace

void indexer_select(const LaunchCtx& ctx, const float* scores, const int32_t* pos, int32_t* selection, int K,
                    int P, int max_pools) {
  MTP_REQUIRE(K >= 1 && P >= 1 && max_pools >= 1, "ops::cuda::indexer_select: K ", K, ", P ", P,
              ", max_pools ", max_pools);
  launch_select_radix(ctx, scores, nullptr, pos, selection, K, P, max_pools);
  MTP_CUDA_LAUNCH_CHECK();
}

// ==== batched rows =====================================================================================

namespace {

using batch::kRowThreads;

// ---- norm + store ------------------------------------------------------------------------------------

/// What one launch of the store kernel does: rows and their completed pools' keys (rows of distinct
/// slots), the rows only, or the keys only (a second launch after the rows: rows of one slot).
enum class StorePhase : int { rows_and_keys, rows, keys };

/// Block b: row b of the batch (see the file comment). V: the layernorm's path (0 scalar).
template <int V>
__global__ void __launch_bounds__(kRowThreads)
    indexer_norm_store_batch_kernel(const bf16* k_pre, const bf16* w, const bf16* bias, float eps,
                                    const float* gate, const float* ape, const int32_t* slot,
                                    const int32_t* pos, IndexerSlots idx, StorePhase phase) {
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
  if (phase == StorePhase::keys) {
    // Every row of the pool is stored (this batch's by the launch before): the key as finish_row
    // computes it.
    if (p % P != P - 1) return;
    const int64_t j = p / P;
    for (int c = threadIdx.x; c < D; c += blockDim.x)
      pool_keys[static_cast<size_t>(j) * D + c] =
          indexer::pool_key_column(k_cache, gate_cache, ape, j * P, c, D, P);
    return;
  }
  const bf16* x = k_pre + static_cast<size_t>(b) * D;
  const float* g = gate + static_cast<size_t>(b) * D;
  bf16* krow = k_cache + static_cast<size_t>(p) * D;
  if constexpr (V == 0) {
    batch::layernorm_row_scalar(x, w, bias, D, eps, batch::StoreElems{krow});
  } else {
    batch::layernorm_row_vec<V>(x, w, bias, D, eps, batch::StoreOctets{krow});
  }
  if (phase == StorePhase::rows) {
    const size_t row = static_cast<size_t>(p) * D;
    for (int c = threadIdx.x; c < D; c += blockDim.x) gate_cache[row + c] = g[c];
    if (threadIdx.x == 0) valid[p] = 1;
    return;
  }
  indexer::finish_row(g, ape, p, k_cache, gate_cache, valid, pool_keys, D, P);
}

// ---- scores ------------------------------------------------------------------------------------------

// The scores kernel's block (kScoreThreads, kScoreWarps, kPoolsPerWarp: indexer_pool.cuh).
constexpr int kPoolsPerBlock = kScoreWarps * kPoolsPerWarp;

/// Block row b = blockIdx.y of a batched scores launch: its slot (no slots: the single sequence's
/// pool keys, slot 0; < 0: a padded row, whose position is not read and whose other fields are 0),
/// the shape, its candidate pools and its row of the scores.
struct ScoreRow {
  int slot, D, P, max_pools, n_cand;
  float* out;
};
__device__ __forceinline__ ScoreRow score_row(const int32_t* slot, const int32_t* pos,
                                              const IndexerSlots& idx, float* scores) {
  const int b = blockIdx.y;
  const int s = slot ? slot[b] : 0;
  if (s < 0) return ScoreRow{s, 0, 0, 0, 0, nullptr};
  const int max_pools = idx.max_rows / idx.P;
  const int64_t p = pos[b];
  return ScoreRow{s,
                  idx.D,
                  idx.P,
                  max_pools,
                  static_cast<int>(min((p + 1) / idx.P, static_cast<int64_t>(max_pools))),
                  scores + static_cast<size_t>(b) * max_pools};
}

/// A warp's 4 consecutive pools' keys j0 .. j0 + 3 into dst [pool][D] (the rows as stored, so a
/// straight 16-byte copy; zero-filled past n_cand): cp.async, the caller commits. Whole warp.
__device__ __forceinline__ void issue_pool_keys(const float* keys, int D, int j0, int n_cand, int lane,
                                                float* dst) {
  const int vecs = kPoolsPerWarp * D / 4;
  const float* src0 = keys + static_cast<size_t>(j0) * D;
  for (int i = lane; i < vecs; i += kWarp) {
    const bool ok = j0 + (4 * i) / D < n_cand;
    batch::cp_async16(dst + 4 * i, ok ? src0 + 4 * i : keys, ok ? 16 : 0);
  }
}

/// The batched kernel's group of 4 pools from keys staged [pool][D] (issue_pool_keys): for each head
/// h = lane, lane + 32, ... the 4 dot products run over c ascending (one fmaf per term), the head's
/// term rounded step by step (the CPU's order, no contraction), then a warp sum per pool into
/// out[j0 + i] (-inf past n_cand, nothing past max_pools).
__device__ __forceinline__ void score_staged_pools(const float* staged, const float* q_s, const float* w_s,
                                                   int qstride, int n_heads, int D, int j0, int n_cand,
                                                   int max_pools, int lane, float inv_sqrt_d, float* out) {
  float total[kPoolsPerWarp] = {};
  for (int h = lane; h < n_heads; h += kWarp) {
    float dot[kPoolsPerWarp] = {};
    const float* qh = q_s + static_cast<size_t>(h) * qstride;
#pragma unroll 2
    for (int c = 0; c < D; c += 4) {
      const float4 q4 = *reinterpret_cast<const float4*>(qh + c);
      float4 k4[kPoolsPerWarp];
#pragma unroll
      for (int pl = 0; pl < kPoolsPerWarp; ++pl)
        k4[pl] = *reinterpret_cast<const float4*>(staged + static_cast<size_t>(pl) * D + c);  // broadcast
#pragma unroll
      for (int pl = 0; pl < kPoolsPerWarp; ++pl) {
        dot[pl] = fma4(q4, k4[pl], dot[pl]);
      }
    }
#pragma unroll
    for (int pl = 0; pl < kPoolsPerWarp; ++pl)
      total[pl] = __fadd_rn(total[pl], __fmul_rn(w_s[h], fmaxf(__fmul_rn(dot[pl], inv_sqrt_d), 0.0f)));
  }
  write_pool_totals(total, j0, n_cand, max_pools, lane, out);
}

/// Block (x, row b): pools j0 = (x * 8 + warp) * 4 + i * gridDim.x * 32 of row b; non-candidates
/// get -inf. A block with no candidate pool skips the query staging. Each warp's next group of
/// keys is copied (cp.async, a 2-stage ring per warp) while it scores the current one, so the
/// keys' round trip overlaps the arithmetic instead of preceding every group; the arithmetic and
/// its order are the unpipelined kernel's, so the scores are its bits.
__global__ void __launch_bounds__(kScoreThreads)
    indexer_scores_batch_kernel(const float* q, const float* w, const int32_t* slot, const int32_t* pos,
                                IndexerSlots idx, float* scores, int n_heads) {
  pdl_begin();
  extern __shared__ float4 score_smem_vec[];
  float* smem = reinterpret_cast<float*>(score_smem_vec);
  const int b = blockIdx.y;
  const auto [s, D, P, max_pools, n_cand, out] = score_row(slot, pos, idx, scores);
  if (s < 0) return;  // padded row
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
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  float* q_s = smem;                                          // [n_heads][D + 4]
  float* w_s = q_s + static_cast<size_t>(n_heads) * qstride;  // [n_heads, padded to 4]
  float* key_s = w_s + ((n_heads + 3) / 4) * 4;               // [warps][2 stages][4 pools][D]
  float* ring = key_s + static_cast<size_t>(warp) * 2 * kPoolsPerWarp * D;
  const int first = (blockIdx.x * kScoreWarps + warp) * kPoolsPerWarp;
  // The first group's keys are in flight while the queries are staged.
  if (first < n_cand) issue_pool_keys(keys, D, first, n_cand, lane, ring);
  batch::cp_async_commit();
  stage_queries(qb, wb, q_s, w_s, n_heads, D, qstride);
  __syncthreads();
  const float inv_sqrt_d = 1.0f / sqrtf(static_cast<float>(D));
  int st = 0;
  for (int j0 = first; j0 < max_pools; j0 += stride) {
    if (j0 >= n_cand) {
      if (lane < kPoolsPerWarp && j0 + lane < max_pools) out[j0 + lane] = -INFINITY;
      continue;
    }
    if (j0 + stride < n_cand)
      issue_pool_keys(keys, D, j0 + stride, n_cand, lane,
                      ring + static_cast<size_t>(st ^ 1) * kPoolsPerWarp * D);
    batch::cp_async_commit();
    batch::cp_async_wait<1>();  // this lane's copies of the current group have landed
    __syncwarp();               // and the warp's
    score_staged_pools(ring + static_cast<size_t>(st) * kPoolsPerWarp * D, q_s, w_s, qstride, n_heads, D, j0,
                       n_cand, max_pools, lane, inv_sqrt_d, out);
    __syncwarp();  // the stage is refilled two groups on
    st ^= 1;
  }
  batch::cp_async_wait<0>();  // no copy in flight at exit
}

// ---- scores on register tiles ----------------------------------------------------------------------
//
// indexer_scores: tiled (KernelPolicy::indexer_scores; the rule: dispatch.cu). The
// pools4 kernel above gives lane h one head and 4 pools, so every 4 FMAs of a lane wait on a
// shared-memory load of its query row (the 4 keys are broadcasts): at B = 128 its time went to
// shared-memory traffic, not to the FMAs or the keys' bytes. Here a warp scores 16 pools of one
// row against its 32 heads, lane = 8 pg + hg holding the 4 x 4 dot products of heads hg + 8i and
// pools pg + 4p (i, p < 4): per 4 columns 8 conflict-free 16-byte loads feed 64 FMAs. Each dot
// product is the same fmaf chain over c ascending, and the head sum follows warp_sum's butterfly
// (xor 16, 8, 4, 2, 1 on the head index): the levels 16 and 8 are i ^ 2 and i ^ 1 inside the lane,
// 4, 2, 1 are hg's bits, which are the lane's low bits. Floating-point addition commutes, so every
// pair is added as the butterfly adds it: the scores are pools4's bits. The keys of a group go
// through a 2-stage cp.async ring per warp ([pool][D + 4] floats: conflict-free key reads); the
// pools past n_cand of the last group are zero-filled and written -inf, and the rest of the row
// (n_cand rounded up to groups, to max_pools) is filled with -inf by all the row's blocks.

/// A warp group's 16 pools j0 .. j0 + 15 of keys into dst [pool][D + 4] (zeros past n_cand): cp.async,
/// the caller commits. Whole warp.
__device__ __forceinline__ void issue_tile_keys(const float* keys, int D, int j0, int n_cand, int lane,
                                                float* dst) {
  const int vpr = D / 4;  // 16-byte vectors per key row
  for (int i = lane; i < kTilePools * vpr; i += kWarp) {
    const int pl = i / vpr;
    const int c = 4 * (i - pl * vpr);
    const bool ok = j0 + pl < n_cand;
    batch::cp_async16(dst + static_cast<size_t>(pl) * (D + 4) + c,
                      ok ? keys + static_cast<size_t>(j0 + pl) * D + c : keys, ok ? 16 : 0);
  }
}

/// Scores of the warp's group of 16 pools from the staged keys (see above) into out[j0 + ..]:
/// -inf past n_cand, nothing past max_pools. Whole warp.
__device__ __forceinline__ void score_tile(const float* staged, const float* q_s, const float* w_s, int D,
                                           int j0, int n_cand, int max_pools, int lane, float inv_sqrt_d,
                                           float* out) {
  const int hg = lane & 7, pg = lane >> 3;
  const int ks = D + 4;
  const float* qr = q_s + static_cast<size_t>(hg) * ks;     // head hg + 8i at qr + 8i ks
  const float* kr = staged + static_cast<size_t>(pg) * ks;  // pool pg + 4p at kr + 4p ks
  float acc[4][4] = {};                                     // [head i][pool p]
#pragma unroll 2
  for (int c = 0; c < D; c += 4) {
    float4 q4[4], k4[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      q4[i] = *reinterpret_cast<const float4*>(qr + static_cast<size_t>(8 * i) * ks + c);
#pragma unroll
    for (int p = 0; p < 4; ++p)
      k4[p] = *reinterpret_cast<const float4*>(kr + static_cast<size_t>(4 * p) * ks + c);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        acc[i][p] = fma4(q4[i], k4[p], acc[i][p]);
      }
    }
  }
  float s[4];
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    float t[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      t[i] = __fadd_rn(0.0f, __fmul_rn(w_s[hg + 8 * i], fmaxf(__fmul_rn(acc[i][p], inv_sqrt_d), 0.0f)));
    s[p] = __fadd_rn(__fadd_rn(t[0], t[2]), __fadd_rn(t[1], t[3]));  // butterfly levels 16, 8
  }
#pragma unroll
  for (int o = 4; o > 0; o >>= 1) {  // levels 4, 2, 1: the lane's low bits are hg's
#pragma unroll
    for (int p = 0; p < 4; ++p) s[p] = __fadd_rn(s[p], __shfl_xor_sync(0xffffffffu, s[p], o));
  }
  if (hg < 4) {  // lane (pg, hg < 4) writes pool pg + 4 hg
    float v = s[0];
#pragma unroll
    for (int p = 1; p < 4; ++p)
      if (hg == p) v = s[p];
    const int j = j0 + pg + 4 * hg;
    if (j < max_pools) out[j] = j < n_cand ? v : -INFINITY;
  }
}

/// Block (x, row b): the warp groups g = x * 8 + warp + k * gridDim.x * 8 below n_cand, 16 pools each,
/// then this block's share of the -inf tail of the row. 32 heads, D % 4 == 0 (checked at launch).
__global__ void __launch_bounds__(kTileThreads)
    indexer_scores_tiled_kernel(const float* q, const float* w, const int32_t* slot, const int32_t* pos,
                                IndexerSlots idx, float* scores) {
  pdl_begin();
  const int b = blockIdx.y;
  const auto [s, D, P, max_pools, n_cand, out] = score_row(slot, pos, idx, scores);
  if (s < 0) return;  // padded row
  const int groups = (n_cand + kTilePools - 1) / kTilePools;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int gstride = gridDim.x * kTileWarps;
  if (static_cast<int>(blockIdx.x) * kTileWarps < groups) {  // uniform: the block has a group
    const float* keys = idx.pool_keys + static_cast<size_t>(s) * max_pools * D;
    const int ks = D + 4;
    extern __shared__ float4 tile_smem_vec[];
    float* q_s = reinterpret_cast<float*>(tile_smem_vec);                              // [32][D + 4]
    float* w_s = q_s + static_cast<size_t>(kTileHeads) * ks;                           // [32]
    float* ring = w_s + kTileHeads + static_cast<size_t>(warp) * 2 * kTilePools * ks;  // [2][16][D + 4]
    const int first = blockIdx.x * kTileWarps + warp;
    if (first < groups) issue_tile_keys(keys, D, first * kTilePools, n_cand, lane, ring);
    batch::cp_async_commit();
    stage_queries(q + static_cast<size_t>(b) * kTileHeads * D, w + static_cast<size_t>(b) * kTileHeads, q_s,
                  w_s, kTileHeads, D, ks);
    __syncthreads();
    const float inv_sqrt_d = 1.0f / sqrtf(static_cast<float>(D));
    int st = 0;
    for (int g = first; g < groups; g += gstride) {
      if (g + gstride < groups)
        issue_tile_keys(keys, D, (g + gstride) * kTilePools, n_cand, lane,
                        ring + static_cast<size_t>(st ^ 1) * kTilePools * ks);
      batch::cp_async_commit();
      batch::cp_async_wait<1>();  // this lane's copies of the current group have landed
      __syncwarp();               // and the warp's
      score_tile(ring + static_cast<size_t>(st) * kTilePools * ks, q_s, w_s, D, g * kTilePools, n_cand,
                 max_pools, lane, inv_sqrt_d, out);
      __syncwarp();  // the stage is refilled two groups on
      st ^= 1;
    }
    batch::cp_async_wait<0>();  // no copy in flight at exit
  }
  // -inf from the first pool no group covers to max_pools, the row's blocks interleaved.
  for (int j = groups * kTilePools + blockIdx.x * kTileThreads + threadIdx.x; j < max_pools;
       j += gridDim.x * kTileThreads)
    out[j] = -INFINITY;
}

// ---- selection ---------------------------------------------------------------------------------------

// kSelectThreads: every selection's block (indexer_pool.cuh).
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
      radix_histogram(hist, n_cand, key_of, prefix, shift);
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
  write_tail_and_padding(sel, p, n_cand, n_sel, P, width);
}

}  // namespace

void indexer_norm_store_batch(const LaunchCtx& ctx, const bf16* k_pre, const bf16* w, const bf16* b,
                              float eps, const float* gate, const float* ape, const int32_t* slot,
                              const int32_t* pos, int rows, const IndexerSlots& idx, bool keys_after_rows) {
  // k rows start at multiples of D in 16-byte aligned arrays: aligned when D is a whole number of octets.
  const int v = batch::row_vecs(idx.D, {k_pre, w, b, idx.k_cache});
  const StorePhase first = keys_after_rows ? StorePhase::rows : StorePhase::rows_and_keys;
  batch::with_vecs(v, [&](auto V) {
    launch(ctx, indexer_norm_store_batch_kernel<decltype(V)::value>, rows, kRowThreads, 0, k_pre, w, b, eps,
           gate, ape, slot, pos, idx, first);
    MTP_CUDA_LAUNCH_CHECK();
    if (keys_after_rows) {
      launch(ctx, indexer_norm_store_batch_kernel<decltype(V)::value>, rows, kRowThreads, 0, k_pre, w, b, eps,
             gate, ape, slot, pos, idx, StorePhase::keys);
      MTP_CUDA_LAUNCH_CHECK();
    }
  });
}

void indexer_scores_batch(const LaunchCtx& ctx, const float* q, const float* w, const int32_t* slot,
                          const int32_t* pos, int rows, const IndexerSlots& idx, float* scores, int n_heads) {
  const int D = idx.D, max_pools = (idx.max_rows / idx.P);
  const bool tiled = indexer_scores_tiled(ctx.policy, rows, n_heads, D);  // dispatch.cu
  record_kernel(ctx, "indexer_scores_batch", tiled ? "tiled" : "pools4");
  if (tiled) {
    const size_t tsmem = tiled_scores_smem(D);  // within kTiledScoresMaxSmem (indexer_scores_tiled)
    static int tiled_opted_in = 48 * 1024;
    if (static_cast<int>(tsmem) > tiled_opted_in) {
      MTP_CUDA_CHECK(cudaFuncSetAttribute(
          indexer_scores_tiled_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(tsmem)));
      tiled_opted_in = static_cast<int>(tsmem);
    }
    // One block per multiprocessor over the whole batch (the ring takes most of its shared memory);
    // a row's blocks deal its groups of 16 pools round-robin.
    const int groups_max = (max_pools + kTilePools - 1) / kTilePools;
    const int per_row_t =
        std::max(1, std::min((groups_max + kTileWarps - 1) / kTileWarps, ctx.num_sms / rows));
    launch(ctx, indexer_scores_tiled_kernel, dim3(per_row_t, rows), kTileThreads, tsmem, q, w, slot, pos, idx,
           scores);
    MTP_CUDA_LAUNCH_CHECK();
    return;
  }
  const size_t smem = sizeof(float) * (static_cast<size_t>(n_heads) * (D + 4) + ((n_heads + 3) / 4) * 4 +
                                       static_cast<size_t>(kScoreWarps) * 2 * D * kPoolsPerWarp);
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
  record_kernel(ctx, "indexer_select_batch", rows == 1 ? "radix" : "4-pass");
  if (rows == 1) {
    // A batch of one: the single-row radix kernel (the same exact selection; its digit search ends
    // early where the batched kernel's 4 passes of 8 bits do not).
    launch_select_radix(ctx, scores, slot, pos, selection, K, P, max_pools);
    MTP_CUDA_LAUNCH_CHECK();
    return;
  }
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
