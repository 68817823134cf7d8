// The indexer's comparison kernels (the library runs neither): the single-row pool scores kernel
// (a warp scores 4 pools, the head's term left to the compiler's contraction into an FMA; the
// library scores one row with the batched kernel, indexer_scores_batch at one row) and the v1
// selection (four 8-bit radix passes; the library selects one row with the radix kernel of
// 11/11/10-bit digits). Each against the CPU reference (lib/ops/cpu/indexer.cpp) and timed against
// the library's kernel for the same row.
// - Scores: fp32, |got - want| <= 1e-5 |want| + 1e-5 max |want| (the CPU sums the heads in another
//   order; -inf past the candidates exactly).
// - Selection: exact (every selection kernel writes the CPU's selection), over the pool counts where
//   the kernel's paths change (keys in shared memory up to 40960 pools, global memory beyond) and
//   score kinds with heavy ties, one-ulp steps, signed zeros and -inf.
// Run: mtplab_dev_indexer [--reps N] [--seed S] [--device D] (playground.hpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "ops/cuda/batch_common.cuh"
#include "ops/cuda/device_common.cuh"
#include "ops/cuda/indexer.hpp"
#include "ops/cuda/indexer_pool.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/ops.hpp"
#include "playground.hpp"

namespace mtplab::ops::cuda {
namespace {

using indexer::kPoolsPerWarp;
using indexer::kScoreThreads;
using indexer::kScoreWarps;
using indexer::kSelectThreads;
using indexer::radix_histogram;
using indexer::stage_queries;
using indexer::write_pool_totals;
using indexer::write_tail_and_padding;

// ---- the single-row scores kernel ------------------------------------------------------------------

/// The scores of the warp's 4 pools j0 .. j0 + 3 (a group with a candidate: j0 < n_cand) into
/// out[j0 + i]: -inf past n_cand, nothing past max_pools. The 4 keys are staged in my_keys [c][pool]
/// (zeros past n_cand); for each head h = lane, lane + 32, ... the 4 dot products with the staged
/// query row run over c ascending (one fmaf per term), and total[i] = add(total[i], w_s[h], dot[i]);
/// then a warp sum per pool. Whole warp.
template <typename Add>
__device__ __forceinline__ void score_pool_group(const float* keys, const float* q_s, const float* w_s,
                                                 int qstride, int n_heads, int D, int j0, int n_cand,
                                                 int max_pools, int lane, float* my_keys, float* out,
                                                 Add&& add) {
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
    for (int pl = 0; pl < kPoolsPerWarp; ++pl) total[pl] = add(total[pl], w_s[h], dot[pl]);
  }
  write_pool_totals(total, j0, n_cand, max_pools, lane, out);
  __syncwarp();  // my_keys is restaged by the next group
}

/// A warp scores 4 pools at once: lane h holds head h's query row (shared memory, padded for
/// conflict-free 16-byte reads) and the 4 keys are broadcast [c][pool] from shared memory, so
/// each query load feeds 4 pools. Non-candidates get -inf.
__global__ void __launch_bounds__(kScoreThreads)
    indexer_scores_kernel(const float* q, const float* w, const float* pool_keys, const int32_t* pos,
                          float* scores, int n_heads, int D, int P, int max_pools) {
  pdl_begin();
  extern __shared__ float4 smem_vec[];  // float4: the 16-byte reads below need the alignment
  float* smem = reinterpret_cast<float*>(smem_vec);
  const int qstride = D + 4;
  float* q_s = smem;                                          // [n_heads][D + 4]
  float* w_s = q_s + static_cast<size_t>(n_heads) * qstride;  // [n_heads]
  float* key_s = w_s + ((n_heads + 3) / 4) * 4;               // [warps][D][4]
  // The position is loaded before the query rows, so its round trip overlaps theirs instead of
  // following the barrier (the pool keys' loads wait for it).
  const int64_t p = pos[0];
  stage_queries(q, w, q_s, w_s, n_heads, D, qstride);
  __syncthreads();
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int n_cand = static_cast<int>(min((p + 1) / P, static_cast<int64_t>(max_pools)));
  const float inv_sqrt_d = 1.0f / sqrtf(static_cast<float>(D));
  float* my_keys = key_s + static_cast<size_t>(warp) * D * kPoolsPerWarp;
  const int stride = gridDim.x * kScoreWarps * kPoolsPerWarp;
  for (int j0 = (blockIdx.x * kScoreWarps + warp) * kPoolsPerWarp; j0 < max_pools; j0 += stride) {
    if (j0 >= n_cand) {
      for (int p = lane; p < kPoolsPerWarp; p += kWarp)
        if (j0 + p < max_pools) scores[j0 + p] = -INFINITY;
      continue;
    }
    // A head's term as written: the compiler contracts the add into an FMA.
    score_pool_group(
        pool_keys, q_s, w_s, qstride, n_heads, D, j0, n_cand, max_pools, lane, my_keys, scores,
        [&](float total, float wh, float dot) { return total + wh * fmaxf(dot * inv_sqrt_d, 0.0f); });
  }
}

void indexer_scores_single(const LaunchCtx& ctx, const float* q, const float* w, const float* pool_keys,
                           const int32_t* pos, float* scores, int n_heads, int D, int P, int max_pools) {
  const size_t smem = sizeof(float) * (static_cast<size_t>(n_heads) * (D + 4) + ((n_heads + 3) / 4) * 4 +
                                       static_cast<size_t>(kScoreWarps) * D * kPoolsPerWarp);
  MTP_REQUIRE(smem <= 200 * 1024, "indexer_scores (single row): ", n_heads, " heads x ", D,
              " do not fit in shared memory");
  if (smem > 48 * 1024) {
    MTP_CUDA_CHECK(cudaFuncSetAttribute(indexer_scores_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
  }
  const int pools_per_block = kScoreWarps * kPoolsPerWarp;
  const int grid =
      std::max(1, std::min((max_pools + pools_per_block - 1) / pools_per_block, ctx.num_sms * 4));
  launch(ctx, indexer_scores_kernel, grid, kScoreThreads, smem, q, w, pool_keys, pos, scores, n_heads, D, P,
         max_pools);
  MTP_CUDA_LAUNCH_CHECK();
}

// ---- the v1 selection kernel -------------------------------------------------------------------------
/// Inclusive block scan of u64 (every thread gets its prefix); also returns the total.
__device__ __forceinline__ unsigned long long block_scan_u64(unsigned long long v,
                                                             unsigned long long* total) {
  return batch::block_exclusive_scan(v, total) + v;
}

__global__ void __launch_bounds__(kSelectThreads)
    indexer_select_kernel(const float* scores, const int32_t* pos, int32_t* selection, int K, int P,
                          int max_pools, int cached) {
  // The candidates' order-preserving keys, loaded once into shared memory when they fit
  // (`cached`, the dynamic shared memory holds max_pools keys): the five passes below then read
  // shared memory instead of going back to global memory each time.
  extern __shared__ uint32_t key_cache[];
  pdl_begin();
  __shared__ unsigned int hist[256];
  __shared__ unsigned int s_digit;
  __shared__ unsigned int s_need;
  const int tid = threadIdx.x;
  const int64_t p = pos[0];
  const int n_cand = static_cast<int>(min(static_cast<int64_t>(max_pools), (p + 1) / P));
  const int n_sel = min(K / P, n_cand);
  const int width = K + P - 1;
  const bool take_all = n_sel == n_cand;
  if (cached) {
#pragma unroll 4
    for (int j = tid; j < n_cand; j += blockDim.x) key_cache[j] = order_preserving_u32(scores[j]);
    __syncthreads();
  }
  auto key_of = [&](int j) { return cached ? key_cache[j] : order_preserving_u32(scores[j]); };

  // Radix select, 8 bits at a time from the top: threshold = key of the n_sel-th largest score.
  uint32_t prefix = 0;
  uint32_t need = static_cast<uint32_t>(n_sel);       // how many of the keys matching `prefix` to take
  if (!take_all && n_sel == 0) prefix = 0xffffffffu;  // K < P: nothing is selected (need stays 0)
  if (!take_all && n_sel > 0) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      radix_histogram(hist, n_cand, key_of, prefix, shift);
      // Descending digits: thread t < 256 looks at digit 255 - t; inclusive scan from the top.
      unsigned long long total;
      const unsigned long long cnt = tid < 256 ? hist[255 - tid] : 0ull;
      const unsigned long long incl = block_scan_u64(cnt, &total);
      if (tid < 256 && incl >= need && incl - cnt < need) {
        s_digit = 255u - tid;
        s_need = need - static_cast<uint32_t>(incl - cnt);
      }
      __syncthreads();
      prefix |= s_digit << shift;
      need = s_need;
      __syncthreads();
    }
  }
  // Now: keys > prefix are taken, and the first `need` keys == prefix in pool order.
  const int per = (n_cand + kSelectThreads - 1) / kSelectThreads;
  const int j_begin = min(n_cand, tid * per);
  const int j_end = min(n_cand, j_begin + per);
  unsigned long long gt = 0, eq = 0;
  if (!take_all) {
    for (int j = j_begin; j < j_end; ++j) {
      const uint32_t key = key_of(j);
      gt += key > prefix;
      eq += key == prefix;
    }
  }
  unsigned long long total;
  const unsigned long long incl = block_scan_u64(gt | (eq << 32), &total);
  unsigned long long gt_before = (incl - (gt | (eq << 32))) & 0xffffffffull;
  unsigned long long eq_before = (incl - (gt | (eq << 32))) >> 32;
  for (int j = j_begin; j < j_end; ++j) {
    bool take;
    int64_t out;
    if (take_all) {
      take = true;
      out = j;
    } else {
      const uint32_t key = key_of(j);
      out = static_cast<int64_t>(gt_before) + static_cast<int64_t>(eq_before < need ? eq_before : need);
      take = key > prefix || (key == prefix && eq_before < need);
      gt_before += key > prefix;
      eq_before += key == prefix;
    }
    if (take) {
      for (int m = 0; m < P; ++m)
        selection[out * P + m] = static_cast<int32_t>(static_cast<int64_t>(j) * P + m);
    }
  }
  write_tail_and_padding(selection, p, n_cand, n_sel, P, width);
}

void indexer_select_v1(const LaunchCtx& ctx, const float* scores, const int32_t* pos, int32_t* selection,
                       int K, int P, int max_pools) {
  // Keys in shared memory up to 160 KB of them (40960 pools); beyond, the passes read global memory.
  const size_t cache_bytes = sizeof(uint32_t) * static_cast<size_t>(max_pools);
  const int cached = cache_bytes <= 160 * 1024 ? 1 : 0;
  const size_t smem = cached ? cache_bytes : 0;
  if (smem > 48 * 1024) {
    MTP_CUDA_CHECK(cudaFuncSetAttribute(indexer_select_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
  }
  launch(ctx, indexer_select_kernel, 1, kSelectThreads, smem, scores, pos, selection, K, P, max_pools,
         cached);
  MTP_CUDA_LAUNCH_CHECK();
}

}  // namespace
}  // namespace mtplab::ops::cuda

namespace {

using namespace mtplab;
namespace cuda = mtplab::ops::cuda;
using dev::DeviceBuffer;

constexpr const char* kName = "mtplab_dev_indexer";

/// glm5.3-flash's indexer (32 heads of 128, pools of 4, top 2048) and a small model's (8 x 128).
struct ScoreShape {
  const char* name;
  int n_heads, D, P, max_pools;
};

void check_scores(const cuda::LaunchCtx& ctx, ops::Backend& cpu, dev::Rng& rng, dev::Report& report,
                  int reps) {
  for (const ScoreShape& s : {ScoreShape{"glm5.3-flash", 32, 128, 4, 16384},
                              ScoreShape{"small", 8, 128, 4, 2048}, ScoreShape{"tiny", 4, 32, 4, 64}}) {
    const std::vector<float> keys = rng.floats(static_cast<size_t>(s.max_pools) * s.D, -1.0f, 1.0f);
    const std::vector<float> q = rng.floats(static_cast<size_t>(s.n_heads) * s.D, -1.0f, 1.0f);
    std::vector<float> w = rng.floats(static_cast<size_t>(s.n_heads), -1.0f, 1.0f);
    for (auto& v : w) v /= std::sqrt(static_cast<float>(s.n_heads));
    // The last pool incomplete: the scores past the candidates must be -inf.
    const std::vector<int32_t> pos{s.P * s.max_pools - 3};
    std::vector<float> want(static_cast<size_t>(s.max_pools));
    cpu.indexer_scores(q.data(), w.data(), keys.data(), pos.data(), want.data(), s.n_heads, s.D, s.P,
                       s.max_pools);
    DeviceBuffer<float> d_keys(keys), d_q(q), d_w(w), out(static_cast<size_t>(s.max_pools));
    DeviceBuffer<int32_t> d_pos(pos);
    out.poison();
    cuda::indexer_scores_single(ctx, d_q.data(), d_w.data(), d_keys.data(), d_pos.data(), out.data(),
                                s.n_heads, s.D, s.P, s.max_pools);
    const std::string what = str("indexer_scores single-row kernel, ", s.name, " (", s.n_heads, " heads x ",
                                 s.D, ", ", s.max_pools, " pools)");
    report.f32_close(what, out.download(), want, 1e-5, 1e-5);
    const double ms = dev::median_ms(ctx.stream, reps, [&] {
      cuda::indexer_scores_single(ctx, d_q.data(), d_w.data(), d_keys.data(), d_pos.data(), out.data(),
                                  s.n_heads, s.D, s.P, s.max_pools);
    });
    const double lib_ms = dev::median_ms(ctx.stream, reps, [&] {
      cuda::indexer_scores(ctx, d_q.data(), d_w.data(), d_keys.data(), d_pos.data(), out.data(), s.n_heads,
                           s.D, s.P, s.max_pools);
    });
    dev::Report::timing(str("scores single-row kernel, ", s.name), ms, "library (batched at one row)",
                        lib_ms);
  }
}

/// The v1 selection against the CPU over pool counts, score kinds, K and positions.
void check_select(const cuda::LaunchCtx& ctx, ops::Backend& cpu, dev::Rng& rng, dev::Report& report,
                  int reps) {
  const int P = 4;
  const char* kinds[] = {"distinct", "levels", "all equal", "ulps apart", "signed zeros", "-inf"};
  for (int max_pools : {1, 5, 100, 1000, 1024, 1025, 4097, 16384, 16389, 40960, 40961, 50000}) {
    for (int kind = 0; kind < 6; ++kind) {
      std::vector<float> scores = rng.floats(static_cast<size_t>(max_pools), -4.0f, 4.0f);
      for (auto& v : scores) {
        if (kind == 1) v = std::floor(v);
        if (kind == 2) v = 0.5f;
        if (kind == 3) v = 1.0f + static_cast<float>(rng.next() % 8) * 0x1p-23f;  // exact: 1 + i ulps
        if (kind == 4) v = rng.next() % 2 ? 0.0f : -0.0f;
        if (kind == 5 && rng.next() % 4 == 0) v = -INFINITY;
      }
      DeviceBuffer<float> d_scores(scores);
      int bad = 0;
      std::string first;
      for (int K : {2048, P, P - 1, P * max_pools + P}) {
        const int32_t any = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(P * max_pools));
        for (int32_t p : {P * max_pools - 1, any, P - 1}) {
          const std::vector<int32_t> pos{p};
          const size_t width = static_cast<size_t>(K) + P - 1;
          std::vector<int32_t> want(width);
          cpu.indexer_select(scores.data(), pos.data(), want.data(), K, P, max_pools);
          DeviceBuffer<int32_t> d_pos(pos), sel(width);
          sel.poison(0x7F);
          cuda::indexer_select_v1(ctx, d_scores.data(), d_pos.data(), sel.data(), K, P, max_pools);
          if (sel.download() != want) {
            if (bad++ == 0) first = str(" (first: K ", K, " pos ", p, ")");
          }
        }
      }
      report.check(
          str("indexer_select v1, ", max_pools, " pools, ", kinds[kind], ": ",
              bad ? str(bad, " of 12 selections differ from the CPU's", first) : "12 of 12 selections exact"),
          bad == 0);
    }
  }
  // Timing: the bench's row (16384 pools, top 2048, the last pool's end).
  const int max_pools = 16384, K = 2048;
  DeviceBuffer<float> d_scores(rng.floats(static_cast<size_t>(max_pools), -4.0f, 4.0f));
  DeviceBuffer<int32_t> d_pos(std::vector<int32_t>{P * max_pools - 1}), sel(static_cast<size_t>(K) + P - 1);
  const double ms = dev::median_ms(ctx.stream, reps, [&] {
    cuda::indexer_select_v1(ctx, d_scores.data(), d_pos.data(), sel.data(), K, P, max_pools);
  });
  const double lib_ms = dev::median_ms(ctx.stream, reps, [&] {
    cuda::indexer_select(ctx, d_scores.data(), d_pos.data(), sel.data(), K, P, max_pools);
  });
  dev::Report::timing("select v1, 16384 pools, top 2048", ms, "library (radix)", lib_ms);
}

}  // namespace

int main(int argc, char** argv) {
  const dev::Options opt =
      dev::parse_options(argc, argv, kName, "the indexer's comparison kernels against the CPU reference");
  if (!dev::have_device(kName)) return 0;
  std::printf("%s: seed %llu, %d reps\n", kName, static_cast<unsigned long long>(opt.seed), opt.reps);
  const cuda::LaunchCtx ctx = dev::make_ctx(opt.device);
  const std::unique_ptr<ops::Backend> cpu = ops::make_cpu_backend();
  dev::Rng rng(opt.seed);
  dev::Report report(opt.seed);
  check_scores(ctx, *cpu, rng, report, opt.reps);
  check_select(ctx, *cpu, rng, report, opt.reps);
  return report.finish(kName);
}
