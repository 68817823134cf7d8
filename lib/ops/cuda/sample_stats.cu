// The sampling statistics of logit rows on the GPU (ops::Backend::logit_stats_batch and
// logit_stats_combine): a histogram of each row's 16-bit logit keys, then the thresholds, sums and
// the requested logit from the histogram, the method of the CPU reference (cpu/sample_stats.cpp).
//
// Invariants:
// - Two kernels per launch of up to kStatsRows rows. stats_hist_kernel: `splits` blocks per row,
//   each over a contiguous range of the row's tokens, counts every entry's key (ops::logit_key)
//   into the row's 65536-bin histogram (global scratch, integer atomics, warp-aggregated per key)
//   and writes its block's top two keys. stats_finish_kernel: one block per row merges the top
//   two, finds the top-k key (the count from the top reaching k) and the top-p key (the mass from
//   the top reaching top_p of the top-k mass), sums the kept mass, reads the requested logit, and
//   zeroes the histogram it read (the scratch is zero between launches).
// - Exact thresholds: counts are integers and every entry of one key has one value, so ties at a
//   threshold are kept, as on the CPU. A key's mass is count * exp((l - max) / T) in fp64, as on
//   the CPU; only the order in which the per-key masses are summed differs (a fixed tree, so the
//   result does not depend on scheduling), so a cut moves only when the cumulative mass lies
//   within fp64 rounding of top_p.
// - The parameters are read from device memory (one recorded graph serves every value); they are
//   checked on the host where they are written (drafter::sample_params), not here.
// - Nothing is read past a segment's count; nothing is written but out[b], the row's top-two
//   slots and (then zeroed) its histogram.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "ops/cuda/device_common.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/sample_stats.hpp"

namespace mtplab::ops::cuda {
namespace {

constexpr int kKeys = 1 << 16;
constexpr int kHistThreads = 512;
constexpr int kFinishThreads = 1024;
constexpr int kKeysPerThread = kKeys / kFinishThreads;  // 64 consecutive keys per finishing thread

__device__ __forceinline__ float neg_inf() { return __uint_as_float(0xff800000u); }
__device__ __forceinline__ float key_to_float(int key) {
  return __uint_as_float(static_cast<uint32_t>(logit_of_key(static_cast<uint16_t>(key))) << 16);
}

/// Top two of (a1 >= a2) and (b1 >= b2); -1 is "none".
__device__ __forceinline__ void merge_top2(int& a1, int& a2, int b1, int b2) {
  const int hi = max(a1, b1);
  const int lo = max(min(a1, b1), max(a2, b2));
  a1 = hi;
  a2 = lo;
}
__device__ __forceinline__ void warp_top2(int& k1, int& k2) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const int o1 = __shfl_xor_sync(0xffffffffu, k1, o), o2 = __shfl_xor_sync(0xffffffffu, k2, o);
    merge_top2(k1, k2, o1, o2);
  }
}

/// Counts the tokens [lo, hi) of one run of BF16 logits (token t at x[t - origin]) into `hist`,
/// and tracks this thread's top two keys. The loop's trip count is the same for every thread
/// (warp-uniform), so the lanes of a warp that share a key add it once.
__device__ __forceinline__ void count_run(const uint16_t* x, int64_t origin, int64_t lo, int64_t hi,
                                          uint32_t* hist, int& k1, int& k2) {
  const int lane = threadIdx.x % kWarp;
  for (int64_t t0 = lo; t0 < hi; t0 += blockDim.x) {
    const int64_t t = t0 + threadIdx.x;
    const bool valid = t < hi;
    const int key = valid ? static_cast<int>(logit_key(x[t - origin])) : -1;
    const unsigned same = __match_any_sync(0xffffffffu, key);
    if (valid) {
      if (lane == __ffs(same) - 1) atomicAdd(hist + key, static_cast<uint32_t>(__popc(same)));
      if (key > k1) {
        k2 = k1;
        k1 = key;
      } else if (key > k2) {
        k2 = key;
      }
    }
  }
}

/// grid (rows, splits): block (b, s) counts tokens [s * per, (s + 1) * per) of row b (in the row's
/// token order: index_base + i for one segment, the vocab's ids across segments).
__global__ void __launch_bounds__(kHistThreads)
    stats_hist_kernel(LogitRows v, int b0, uint32_t* hist, int2* top2) {
  pdl_begin();
  const int r = blockIdx.x, b = b0 + r, s = blockIdx.y, splits = gridDim.y;
  const int64_t total = v.segments == 1 ? v.n : v.vocab;
  const int64_t per = (total + splits - 1) / splits;
  const int64_t lo = s * per, hi = min(total, lo + per);
  uint32_t* h = hist + static_cast<size_t>(r) * kKeys;
  const uint16_t* data = reinterpret_cast<const uint16_t*>(v.data);
  int k1 = -1, k2 = -1;
  if (v.segments == 1) {
    count_run(data + static_cast<size_t>(b) * v.ld, 0, lo, hi, h, k1, k2);
  } else {
    for (int g = 0; g < v.segments; ++g) {
      const VocabSegment seg = vocab_segment(v.vocab, v.segments, g);
      const int64_t a = max(lo, seg.begin), e = min(hi, seg.begin + seg.count);
      if (a >= e) continue;  // block-uniform
      const uint16_t* row = data + static_cast<size_t>(g) * v.seg_stride + static_cast<size_t>(b) * v.ld;
      count_run(row, seg.begin, a, e, h, k1, k2);
    }
  }
  warp_top2(k1, k2);
  __shared__ int s_top[2 * (kHistThreads / kWarp)];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) {
    s_top[2 * warp] = k1;
    s_top[2 * warp + 1] = k2;
  }
  __syncthreads();
  if (warp == 0) {
    k1 = lane < kHistThreads / kWarp ? s_top[2 * lane] : -1;
    k2 = lane < kHistThreads / kWarp ? s_top[2 * lane + 1] : -1;
    warp_top2(k1, k2);
    if (lane == 0) top2[static_cast<size_t>(r) * splits + s] = make_int2(k1, k2);
  }
}

/// Sum of v over the threads >= this one (inclusive), in a fixed order; *all gets the block's total.
/// Every thread of the block must call it.
__device__ double block_suffix_sum(double v, double* warp_sums, double* all) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  double incl = v;
#pragma unroll
  for (int o = 1; o < kWarp; o <<= 1) {
    const double t = __shfl_down_sync(0xffffffffu, incl, o);
    if (lane + o < kWarp) incl += t;
  }
  if (lane == 0) warp_sums[warp] = incl;
  __syncthreads();
  double later = 0, total = 0;
  for (int w = warps - 1; w >= 0; --w) {
    if (w > warp) later += warp_sums[w];
    total += warp_sums[w];
  }
  __syncthreads();  // warp_sums is reused by the next call
  *all = total;
  return incl + later;
}

__global__ void __launch_bounds__(kFinishThreads)
    stats_finish_kernel(LogitRows v, int b0, const int32_t* requested, const SampleParams* params, int splits,
                        uint32_t* hist, const int2* top2, LogitStats* out) {
  pdl_begin();
  __shared__ double s_warp[kFinishThreads / kWarp];
  __shared__ int s_top[2];
  __shared__ int s_tau;
  const int r = blockIdx.x, b = b0 + r;
  const int tid = threadIdx.x, lane = tid % kWarp;
  const SampleParams p = *params;
  const int64_t total = v.segments == 1 ? v.n : v.vocab;
  uint32_t* h = hist + static_cast<size_t>(r) * kKeys;

  if (tid < kWarp) {
    int k1 = -1, k2 = -1;
    for (int s = lane; s < splits; s += kWarp) {
      const int2 t = top2[static_cast<size_t>(r) * splits + s];
      merge_top2(k1, k2, t.x, t.y);
    }
    warp_top2(k1, k2);
    if (lane == 0) {
      s_top[0] = k1;
      s_top[1] = k2;
      s_tau = 0;  // keep everything
    }
  }
  __syncthreads();
  const float M = key_to_float(s_top[0]);
  const double T = p.temperature;
  const int first = tid * kKeysPerThread, last = first + kKeysPerThread - 1;  // this thread's keys
  auto count_of = [&](int key) { return h[key]; };
  auto mass_of = [&](int key, uint32_t c) {
    return c ? static_cast<double>(c) * exp((static_cast<double>(key_to_float(key)) - M) / T) : 0.0;
  };
  double all = 0;

  // Top-k: the key at which the count from the top reaches k.
  if (p.top_k > 0 && p.top_k < total) {
    double mine = 0;
    for (int key = first; key <= last; ++key) mine += count_of(key);
    const double incl = block_suffix_sum(mine, s_warp, &all);
    const double above = incl - mine, k = p.top_k;
    if (above < k && k <= incl) {
      double cum = above;
      for (int key = last; key >= first; --key) {
        cum += count_of(key);
        if (cum >= k) {
          s_tau = key;
          break;
        }
      }
    }
    __syncthreads();
  }
  int tau = s_tau;
  // Top-p inside it: the key at which the mass from the top reaches top_p of the kept mass.
  if (p.top_p < 1.0f) {
    double mine = 0;
    for (int key = max(first, tau); key <= last; ++key) mine += mass_of(key, count_of(key));
    const double incl = block_suffix_sum(mine, s_warp, &all);
    const double above = incl - mine, target = static_cast<double>(p.top_p) * all;
    if (above < target && target <= incl) {
      double cum = above;
      int cut = -1, lowest = -1;
      for (int key = last; key >= max(first, tau); --key) {
        const uint32_t c = count_of(key);
        if (!c) continue;
        lowest = key;
        cum += mass_of(key, c);
        if (cum >= target) {
          cut = key;
          break;
        }
      }
      s_tau = cut >= 0 ? cut : lowest;  // rounding: keep this thread's whole run
    }
    __syncthreads();
    tau = s_tau;
  }
  // The kept mass.
  double mine = 0;
  for (int key = max(first, tau); key <= last; ++key) mine += mass_of(key, count_of(key));
  block_suffix_sum(mine, s_warp, &all);
  // Every read of this thread's keys is done: leave them zero for the next launch.
  for (int key = first; key <= last; ++key) h[key] = 0;
  if (tid == 0) {
    LogitStats st;
    st.max = M;
    st.second = s_top[1] >= 0 ? key_to_float(s_top[1]) : neg_inf();
    st.sum = static_cast<float>(all);
    st.requested = neg_inf();
    if (requested) {
      const int64_t y = requested[b];
      const uint16_t* e = nullptr;
      const uint16_t* data = reinterpret_cast<const uint16_t*>(v.data);
      if (v.segments == 1) {
        const int64_t i = y - v.index_base;
        if (i >= 0 && i < v.n) e = data + static_cast<size_t>(b) * v.ld + i;
      } else if (y >= 0 && y < v.vocab) {
        for (int g = 0; g < v.segments; ++g) {
          const VocabSegment seg = vocab_segment(v.vocab, v.segments, g);
          if (y < seg.begin + seg.count) {
            e = data + static_cast<size_t>(g) * v.seg_stride + static_cast<size_t>(b) * v.ld +
                (y - seg.begin);
            break;
          }
        }
      }
      if (e && logit_key(*e) >= tau) st.requested = __uint_as_float(static_cast<uint32_t>(*e) << 16);
    }
    out[b] = st;
  }
}

__global__ void logit_stats_combine_kernel(const LogitStats* parts, int n, int rows,
                                           const SampleParams* params, TokenStats* out) {
  pdl_begin();
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  const double T = params->temperature;
  float first = neg_inf(), second = neg_inf(), req = neg_inf();
  for (int i = 0; i < n; ++i) {
    const LogitStats p = parts[static_cast<size_t>(i) * rows + b];
    const float xs[2] = {p.max, p.second};
    for (float x : xs) {
      if (x > first) {
        second = first;
        first = x;
      } else if (x > second) {
        second = x;
      }
    }
    req = fmaxf(req, p.requested);
  }
  double Z = 0;
  for (int i = 0; i < n; ++i) {
    const LogitStats p = parts[static_cast<size_t>(i) * rows + b];
    Z += static_cast<double>(p.sum) * exp((static_cast<double>(p.max) - first) / T);
  }
  const double log_z = log(Z);
  TokenStats o;
  o.margin = first - second;
  o.logprob = static_cast<float>(-log_z);
  o.req_logprob =
      req == neg_inf() ? neg_inf() : static_cast<float>((static_cast<double>(req) - first) / T - log_z);
  out[b] = o;
}

}  // namespace

size_t stats_scratch_bytes() {
  return sizeof(uint32_t) * static_cast<size_t>(kStatsRows) * kKeys +
         sizeof(int2) * static_cast<size_t>(kStatsRows) * kStatsMaxSplits;
}

void logit_stats_batch(const LaunchCtx& ctx, const LogitRows& view, const int32_t* requested,
                       const SampleParams* params, LogitStats* out, void* scratch) {
  uint32_t* hist = static_cast<uint32_t*>(scratch);
  int2* top2 = reinterpret_cast<int2*>(hist + static_cast<size_t>(kStatsRows) * kKeys);
  const int64_t total = view.segments == 1 ? view.n : view.vocab;
  for (int b0 = 0; b0 < view.rows; b0 += kStatsRows) {
    const int rows = std::min(kStatsRows, view.rows - b0);
    // Enough blocks to fill the device twice over, none with fewer than 4096 tokens.
    const int64_t by_size = std::max<int64_t>(1, total / 4096);
    const int splits =
        static_cast<int>(std::min<int64_t>({kStatsMaxSplits, by_size, std::max(1, 2 * ctx.num_sms / rows)}));
    launch(ctx, stats_hist_kernel, dim3(rows, splits), kHistThreads, 0, view, b0, hist, top2);
    MTP_CUDA_LAUNCH_CHECK();
    launch(ctx, stats_finish_kernel, rows, kFinishThreads, 0, view, b0, requested, params, splits, hist, top2,
           out);
    MTP_CUDA_LAUNCH_CHECK();
  }
}

void logit_stats_combine(const LaunchCtx& ctx, const LogitStats* parts, int n, int rows,
                         const SampleParams* params, TokenStats* out) {
  launch(ctx, logit_stats_combine_kernel, (rows + 127) / 128, 128, 0, parts, n, rows, params, out);
  MTP_CUDA_LAUNCH_CHECK();
}

}  // namespace mtplab::ops::cuda
