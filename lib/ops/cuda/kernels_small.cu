// Small kernels: norms (one block per row), elementwise ops, device-side scalars, the MoE
// router (one warp), the pooled lightning indexer (row store + pool key, pool scores, the
// top-k pool selection), and the fused cache writes (a norm and its row's store in one block:
// kv_norm_write, indexer_norm_store).
//
// Invariants:
// - Elementwise arithmetic after a reduction uses the CPU reference's operation order with
//   explicit round-to-nearest intrinsics (no FMA contraction), so outputs differ from the CPU
//   only through the reduction order and the device expf.
// - The selection is exact: a block-wide radix select on the order-preserving 32-bit score key
//   finds the K/P-th largest score; all larger ones are taken, and the lowest-index equals fill
//   the rest, so ties go to the lower pool index as the CPU's nth_element comparison does. Both
//   selection kernels (v2, the default, and v1; the policy's indexer_select) write the same selection.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "ops/cuda/batch_common.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/device_common.cuh"
#include "ops/cuda/kernels.hpp"
#include "ops/cuda/launch.cuh"

namespace mtplab::ops::cuda {
namespace {

// The device helpers the batched kernels share (ops/cuda/batch_common.cuh).
using batch::pack2;
using batch::pack8;
using batch::unpack8;

constexpr int kNormThreads = 256;

/// Sum over the block (any blockDim multiple of 32, up to 1024); every thread gets the result.
__device__ float block_sum(float v) {
  __shared__ float s_part[32];
  __shared__ float s_total;
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  v = warp_sum(v);
  if (lane == 0) s_part[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0.0f;
    for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) t += s_part[w];
    s_total = t;
  }
  __syncthreads();
  const float total = s_total;
  __syncthreads();  // s_part / s_total may be reused by the next call
  return total;
}

/// 1 / sqrt(sum / n + eps) in IEEE-rounded steps, the sum over the block of each thread's `part`
/// (block_sum: every thread of the block calls this): the scale of RMSNorm (from the sum of
/// squares) and of LayerNorm (from the sum of squared deviations).
__device__ __forceinline__ float inv_root_mean(float part, int n, float eps) {
  const float mean = __fdiv_rn(block_sum(part), static_cast<float>(n));
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

/// y_i = bf16(w * (x * r)), r = 1 / sqrt(mean(x^2) + eps), handed to store(i, y_i) by the thread
/// that owns element i (i = threadIdx.x + k * blockDim.x). A store may overwrite x (rmsnorm's x and
/// y may alias): all reads of x for the sum finish at the barrier inside block_sum, and each thread
/// then reads only x[i] before its own store(i).
template <typename Store>
__device__ __forceinline__ void rmsnorm_row(const bf16* x, const bf16* w, int n, float eps, Store&& store) {
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = bf16_to_f(x[i]);
    ss = fmaf(v, v, ss);
  }
  const float r = inv_root_mean(ss, n, eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    store(i, f_to_bf16(__fmul_rn(bf16_to_f(w[i]), __fmul_rn(bf16_to_f(x[i]), r))));
  }
}

__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_kernel(const bf16* x, const bf16* w, bf16* y, int n, float eps) {
  pdl_begin();
  const size_t off = static_cast<size_t>(blockIdx.x) * n;
  bf16* yr = y + off;
  rmsnorm_row(x + off, w, n, eps, [&](int i, bf16 v) { yr[i] = v; });
}

__global__ void __launch_bounds__(kNormThreads)
    embed_rmsnorm_kernel(const bf16* table, const int32_t* token, const bf16* w, bf16* y, int n, float eps) {
  pdl_begin();
  rmsnorm_row(table + static_cast<size_t>(token[0]) * n, w, n, eps, [&](int i, bf16 v) { y[i] = v; });
}

/// y_i = bf16(((x - mean) * r) * w + b), two-pass mean / biased variance, as the CPU; handed to
/// store(i, y_i) by the thread that owns element i, as rmsnorm_row (after the last barrier each
/// thread reads only x[i] before its own store(i)).
template <typename Store>
__device__ __forceinline__ void layernorm_row(const bf16* x, const bf16* w, const bf16* b, int n, float eps,
                                              Store&& store) {
  float s = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += bf16_to_f(x[i]);
  const float mean = __fdiv_rn(block_sum(s), static_cast<float>(n));
  float sq = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float d = __fsub_rn(bf16_to_f(x[i]), mean);
    sq = fmaf(d, d, sq);
  }
  const float r = inv_root_mean(sq, n, eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float d = __fsub_rn(bf16_to_f(x[i]), mean);
    store(i, f_to_bf16(__fadd_rn(__fmul_rn(__fmul_rn(d, r), bf16_to_f(w[i])), bf16_to_f(b[i]))));
  }
}

__global__ void __launch_bounds__(kNormThreads)
    layernorm_kernel(const bf16* x, const bf16* w, const bf16* b, bf16* y, int n, float eps) {
  pdl_begin();
  const size_t off = static_cast<size_t>(blockIdx.x) * n;
  bf16* yr = y + off;
  layernorm_row(x + off, w, b, n, eps, [&](int i, bf16 v) { yr[i] = v; });
}

// ---- register-resident norms (16-byte loads) ------------------------------------------------------
//
// The scalar kernels above walk a row with one 2-byte load per iteration; their loop-carried
// dependency made a 4096-wide RMSNorm cost ~14 us (16 dependent memory round trips per pass, two
// passes). These load the whole row into registers with one 16-byte load per 8 elements, all
// issued before the first use, keep it there for the second pass, and store 16 bytes at a time.
// Same element-wise arithmetic as the scalar kernels; the sum of squares is taken per thread over
// its contiguous octets, then over the block (another order of the same sum). Used when n is a
// multiple of 8, n <= kVecNormThreads * 8 * kMaxNormVecs, and every pointer is 16-byte aligned.

constexpr int kVecNormThreads = 256;
constexpr int kMaxNormVecs = 4;  // octets per thread: n <= 8192

/// This thread's octets j = 0..V-1 of a row of nv octets (octet threadIdx.x + j * kVecNormThreads),
/// zeros past the row; every load is issued before any is used.
template <int V>
__device__ __forceinline__ void load_octets(const bf16* row, int nv, uint4 (&r)[V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int v = threadIdx.x + j * kVecNormThreads;
    r[j] = v < nv ? load_cached(row + static_cast<size_t>(v) * 8) : make_uint4(0, 0, 0, 0);
  }
}

/// acc = add(acc, value) over every element of this thread's octets, in octet then element order
/// (padding octets are zeros and take part): this thread's share of a row sum.
template <int V, typename Add>
__device__ __forceinline__ float octets_sum(const uint4 (&r)[V], Add&& add) {
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    float f[8];
    unpack8(r[j], f);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc = add(acc, f[e]);
  }
  return acc;
}

/// f(j, v) for each of this thread's octets j = 0..V-1 inside the row: octet v = threadIdx.x +
/// j * kVecNormThreads < nv (load_octets' layout), in ascending j.
template <int V, typename F>
__device__ __forceinline__ void for_octets(int nv, F&& f) {
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int v = threadIdx.x + j * kVecNormThreads;
    if (v < nv) f(j, v);
  }
}

/// y = bf16(w * (x * r)) over one row of n = 8 * nv elements, the row in registers; octet v of y
/// (elements 8v .. 8v+7, packed BF16) is handed to store(v, octet) by the thread that loaded it.
template <int V, typename Store>
__device__ __forceinline__ void rmsnorm_row_vec(const bf16* x, const bf16* w, int nv, int n, float eps,
                                                Store&& store) {
  uint4 xr[V], wr[V];
  load_octets<V>(x, nv, xr);
  load_octets<V>(w, nv, wr);
  const float ss = octets_sum<V>(xr, [](float acc, float v) { return fmaf(v, v, acc); });
  const float r = inv_root_mean(ss, n, eps);
  for_octets<V>(nv, [&](int j, int v) {
    float f[8], g[8];
    unpack8(xr[j], f);
    unpack8(wr[j], g);
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = __fmul_rn(g[e], __fmul_rn(f[e], r));
    store(v, pack8(f));
  });
}

/// The octet store of a BF16 row y (16-byte aligned).
struct StoreOctets {
  bf16* y;
  __device__ __forceinline__ void operator()(int v, const uint4& octet) const {
    *reinterpret_cast<uint4*>(y + static_cast<size_t>(v) * 8) = octet;
  }
};

template <int V>
__global__ void __launch_bounds__(kVecNormThreads)
    rmsnorm_vec_kernel(const bf16* x, const bf16* w, bf16* y, int n, float eps) {
  pdl_begin();
  const size_t off = static_cast<size_t>(blockIdx.x) * n;
  rmsnorm_row_vec<V>(x + off, w, n / 8, n, eps, StoreOctets{y + off});
}

template <int V>
__global__ void __launch_bounds__(kVecNormThreads)
    embed_rmsnorm_vec_kernel(const bf16* table, const int32_t* token, const bf16* w, bf16* y, int n,
                             float eps) {
  pdl_begin();
  rmsnorm_row_vec<V>(table + static_cast<size_t>(token[0]) * n, w, n / 8, n, eps, StoreOctets{y});
}

/// layernorm_row with the row in registers: octet v of y is handed to store(v, octet) by the thread
/// that loaded it.
template <int V, typename Store>
__device__ __forceinline__ void layernorm_row_vec(const bf16* x, const bf16* w, const bf16* b, int nv, int n,
                                                  float eps, Store&& store) {
  uint4 xr[V], wr[V], br[V];
  load_octets<V>(x, nv, xr);
  load_octets<V>(w, nv, wr);
  load_octets<V>(b, nv, br);
  const float s = octets_sum<V>(xr, [](float acc, float v) { return acc + v; });
  const float mean = __fdiv_rn(block_sum(s), static_cast<float>(n));
  float sq = 0.0f;
  // Only the row's octets: padding octets are zeros, not values, and must not add mean^2.
  for_octets<V>(nv, [&](int j, int) {
    float f[8];
    unpack8(xr[j], f);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float d = __fsub_rn(f[e], mean);
      sq = fmaf(d, d, sq);
    }
  });
  const float r = inv_root_mean(sq, n, eps);
  for_octets<V>(nv, [&](int j, int v) {
    float f[8], g[8], c[8];
    unpack8(xr[j], f);
    unpack8(wr[j], g);
    unpack8(br[j], c);
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(f[e], mean), r), g[e]), c[e]);
    store(v, pack8(f));
  });
}

template <int V>
__global__ void __launch_bounds__(kVecNormThreads)
    layernorm_vec_kernel(const bf16* x, const bf16* w, const bf16* b, bf16* y, int n, float eps) {
  pdl_begin();
  const size_t off = static_cast<size_t>(blockIdx.x) * n;
  layernorm_row_vec<V>(x + off, w, b, n / 8, n, eps, StoreOctets{y + off});
}

/// residual_add_rmsnorm_kernel with the row in registers: y = bf16(x + delta) (written), then
/// normed = bf16(w * (y * r)). Each thread reads its own x / delta before writing y (x, y may alias).
template <int V>
__global__ void __launch_bounds__(kVecNormThreads)
    residual_add_rmsnorm_vec_kernel(const bf16* x, const float* delta, bf16* y, const bf16* w, bf16* normed,
                                    int n, float eps) {
  pdl_begin();
  const int nv = n / 8;
  uint4 xr[V], wr[V];
  float4 da[V], db[V];
  load_octets<V>(x, nv, xr);
  load_octets<V>(w, nv, wr);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int v = threadIdx.x + j * kVecNormThreads;
    const bool in = v < nv;
    da[j] = in ? __ldg(reinterpret_cast<const float4*>(delta) + 2 * static_cast<size_t>(v))
               : make_float4(0, 0, 0, 0);
    db[j] = in ? __ldg(reinterpret_cast<const float4*>(delta) + 2 * static_cast<size_t>(v) + 1)
               : make_float4(0, 0, 0, 0);
  }
  float yv[V][8];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    float f[8];
    unpack8(xr[j], f);
    const float d[8] = {da[j].x, da[j].y, da[j].z, da[j].w, db[j].x, db[j].y, db[j].z, db[j].w};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      yv[j][e] = round_to_bf16(__fadd_rn(f[e], d[e]));
      ss = fmaf(yv[j][e], yv[j][e], ss);
    }
  }
  const float r = inv_root_mean(ss, n, eps);
  for_octets<V>(nv, [&](int j, int v) {
    *reinterpret_cast<uint4*>(y + static_cast<size_t>(v) * 8) = pack8(yv[j]);
    float g[8], o[8];
    unpack8(wr[j], g);
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = __fmul_rn(g[e], __fmul_rn(yv[j][e], r));
    *reinterpret_cast<uint4*>(normed + static_cast<size_t>(v) * 8) = pack8(o);
  });
}

/// Calls f(std::integral_constant<int, V>{}) for V = v in 1..kMaxNormVecs.
template <typename F>
void with_norm_vecs(int v, F&& f) {
  switch (v) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    default:
      return f(std::integral_constant<int, 4>{});
  }
}

/// Octets per thread for a row of n, or 0 when the vector kernels do not apply.
int norm_vecs(int n, std::initializer_list<const void*> ptrs) {
  if (n % 8 != 0 || n > kVecNormThreads * 8 * kMaxNormVecs) return 0;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return 0;
  return (n / 8 + kVecNormThreads - 1) / kVecNormThreads;
}

// ---- elementwise -------------------------------------------------------------------------------

constexpr int kEltThreads = 256;

__global__ void residual_add_kernel(const bf16* x, const float* delta, bf16* y, int n) {
  pdl_begin();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = f_to_bf16(__fadd_rn(bf16_to_f(x[i]), delta[i]));
}
/// residual_add_kernel's y, then rmsnorm_row over it with the same block layout. Each thread
/// re-reads only the y elements it wrote itself (x and y may alias).
__global__ void __launch_bounds__(kNormThreads)
    residual_add_rmsnorm_kernel(const bf16* x, const float* delta, bf16* y, const bf16* w, bf16* normed,
                                int n, float eps) {
  pdl_begin();
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const bf16 yi = f_to_bf16(__fadd_rn(bf16_to_f(x[i]), delta[i]));
    y[i] = yi;
    const float v = bf16_to_f(yi);
    ss = fmaf(v, v, ss);
  }
  const float r = inv_root_mean(ss, n, eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    normed[i] = f_to_bf16(__fmul_rn(bf16_to_f(w[i]), __fmul_rn(bf16_to_f(y[i]), r)));
  }
}
__global__ void add_kernel(const bf16* a, const bf16* b, bf16* y, int n) {
  pdl_begin();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = f_to_bf16(__fadd_rn(bf16_to_f(a[i]), bf16_to_f(b[i])));
}
__global__ void to_bf16_kernel(const float* x, bf16* y, int n) {
  pdl_begin();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = f_to_bf16(x[i]);
}
__global__ void accumulate_f32_kernel(const float* x, float* y, int n) {
  pdl_begin();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = __fadd_rn(y[i], x[i]);
}
__global__ void scale_f32_kernel(float* x, float s, int n) {
  pdl_begin();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    x[i] = __fmul_rn(x[i], s);
}
__global__ void add_i32_kernel(const int32_t* src, int32_t add, int32_t* dst) {
  pdl_begin();
  dst[0] = static_cast<int32_t>(static_cast<int64_t>(src[0]) + add);
}

int elt_grid(const LaunchCtx& ctx, int n) {
  return std::max(1, std::min((n + kEltThreads - 1) / kEltThreads, ctx.num_sms * 8));
}

// ---- MoE router ----------------------------------------------------------------------------------

/// One block of up to kRouteThreads threads (one per expert). The choices are ranks, not rounds:
/// every expert's packed key (biased score, lower id wins ties) is compared with all others' in
/// shared memory, and the expert whose key has rank r < top_k goes to slot r. That is the order
/// the CPU's repeated argmax (and this kernel's former warp rounds) produce, with no serial chain
/// of top_k reductions. The group limit ranks the groups' (top1 + top2) scores the same way.
/// Shared memory: s[E], keys[E] (u64), group scores and flags.
constexpr int kRouteThreads = 1024;

__global__ void __launch_bounds__(kRouteThreads)
    moe_route_kernel(const float* logits, const float* bias, int E, int top_k, int n_group, int topk_group,
                     float scaling, int32_t* idx, float* weights) {
  pdl_begin();
  extern __shared__ unsigned long long route_smem[];
  unsigned long long* keys = route_smem;                               // [E]
  unsigned long long* gkeys = keys + E;                                // [n_group]
  float* s = reinterpret_cast<float*>(gkeys + n_group);                // [E]
  float* biased = s + E;                                               // [E]
  float* chosen_s = biased + E;                                        // [top_k]
  uint8_t* group_kept = reinterpret_cast<uint8_t*>(chosen_s + top_k);  // [n_group]
  const int tid = threadIdx.x;
  for (int e = tid; e < E; e += blockDim.x) {
    const float v = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-logits[e])));
    s[e] = v;
    biased[e] = __fadd_rn(v, bias ? bias[e] : 0.0f);
  }
  __syncthreads();
  if (n_group > 1) {
    const int gs = E / n_group;
    for (int g = tid; g < n_group; g += blockDim.x) {
      float top1 = -INFINITY, top2 = -INFINITY;
      for (int e = g * gs; e < (g + 1) * gs; ++e) {
        const float v = biased[e];
        if (v > top1) {
          top2 = top1;
          top1 = v;
        } else if (v > top2) {
          top2 = v;
        }
      }
      gkeys[g] = argmax_key(__fadd_rn(top1, top2), g);
    }
    __syncthreads();
    for (int g = tid; g < n_group; g += blockDim.x) {
      int rank = 0;
      for (int o = 0; o < n_group; ++o) rank += gkeys[o] > gkeys[g];
      group_kept[g] = rank < topk_group;
    }
    __syncthreads();
    for (int e = tid; e < E; e += blockDim.x)
      if (!group_kept[e / gs]) biased[e] = -INFINITY;
    __syncthreads();
  }
  for (int e = tid; e < E; e += blockDim.x) keys[e] = argmax_key(biased[e], e);
  __syncthreads();
  for (int e = tid; e < E; e += blockDim.x) {
    const unsigned long long mine = keys[e];
    int rank = 0;
#pragma unroll 16
    for (int o = 0; o < E; ++o) rank += keys[o] > mine;
    if (rank < top_k) {
      idx[rank] = e;
      chosen_s[rank] = s[e];
    }
  }
  __syncthreads();
  if (tid == 0) {
    float sum = 0.0f;
    for (int i = 0; i < top_k; ++i) sum = __fadd_rn(sum, chosen_s[i]);
    for (int i = 0; i < top_k; ++i) weights[i] = __fmul_rn(__fdiv_rn(chosen_s[i], sum), scaling);
  }
}

// ---- indexer: store + pool key ----------------------------------------------------------------------

/// Pool key column c of the pool whose rows are first .. first + P - 1:
/// K[c] = sum_m softmax_m(gate[first+m, c] + ape[m, c]) * k[first+m, c], the earlier rows' gate and k
/// from the caches, the last row's from g_last / k_last. Column c depends on nothing else, so the
/// thread layout does not change the bits.
__device__ __forceinline__ float pool_key_column(const bf16* k_cache, const float* gate_cache,
                                                 const float* ape, bf16 k_last, float g_last, int64_t first,
                                                 int c, int D, int P) {
  float max_logit = -INFINITY;
  for (int m = 0; m < P; ++m) {
    const float g = (m == P - 1) ? g_last : gate_cache[static_cast<size_t>(first + m) * D + c];
    max_logit = fmaxf(max_logit, __fadd_rn(g, ape[static_cast<size_t>(m) * D + c]));
  }
  float denom = 0.0f;
  for (int m = 0; m < P; ++m) {
    const float g = (m == P - 1) ? g_last : gate_cache[static_cast<size_t>(first + m) * D + c];
    denom = __fadd_rn(denom, expf(__fsub_rn(__fadd_rn(g, ape[static_cast<size_t>(m) * D + c]), max_logit)));
  }
  float acc = 0.0f;
  for (int m = 0; m < P; ++m) {
    const float g = (m == P - 1) ? g_last : gate_cache[static_cast<size_t>(first + m) * D + c];
    const float e = expf(__fsub_rn(__fadd_rn(g, ape[static_cast<size_t>(m) * D + c]), max_logit));
    const float k =
        (m == P - 1) ? bf16_to_f(k_last) : bf16_to_f(k_cache[static_cast<size_t>(first + m) * D + c]);
    acc = __fadd_rn(acc, __fmul_rn(__fdiv_rn(e, denom), k));
  }
  return acc;
}

__global__ void indexer_store_kernel(const bf16* k_normed, const float* gate, const float* ape,
                                     const int32_t* pos, bf16* k_cache, float* gate_cache, uint8_t* valid,
                                     float* pool_keys, int D, int P) {
  pdl_begin();
  const int64_t p = pos[0];
  const size_t row = static_cast<size_t>(p) * D;
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    k_cache[row + c] = k_normed[c];
    gate_cache[row + c] = gate[c];
  }
  if (threadIdx.x == 0) valid[p] = 1;
  if (p % P != P - 1) return;
  const int64_t j = p / P;
  const int64_t first = j * P;
  // Row p's own values come from the inputs, the pool's earlier rows from the cache.
  for (int c = threadIdx.x; c < D; c += blockDim.x)
    pool_keys[static_cast<size_t>(j) * D + c] =
        pool_key_column(k_cache, gate_cache, ape, k_normed[c], gate[c], first, c, D, P);
}

/// indexer_store once row p's k is in k_cache (written by this block, any thread layout): the gate
/// row, the valid flag and, when p completes its pool, the pool key. The barrier makes the k row
/// visible to the threads that read it for the key; every thread of the block must call this.
__device__ __forceinline__ void indexer_store_after_k(const float* gate, const float* ape, int64_t p,
                                                      bf16* k_cache, float* gate_cache, uint8_t* valid,
                                                      float* pool_keys, int D, int P) {
  const size_t row = static_cast<size_t>(p) * D;
  for (int c = threadIdx.x; c < D; c += blockDim.x) gate_cache[row + c] = gate[c];
  if (threadIdx.x == 0) valid[p] = 1;
  if (p % P != P - 1) return;  // uniform over the block
  __syncthreads();
  const int64_t j = p / P;
  const int64_t first = j * P;
  for (int c = threadIdx.x; c < D; c += blockDim.x)
    pool_keys[static_cast<size_t>(j) * D + c] =
        pool_key_column(k_cache, gate_cache, ape, k_cache[row + c], gate[c], first, c, D, P);
}

// ---- fused cache writes: a norm and the store of its row in one launch -----------------------------
//
// Each kernel runs the norm code of the standalone norm kernel it replaces (rmsnorm_row[_vec],
// layernorm_row[_vec]: the same thread layout, reduction order and rounding), picked by the same
// test (norm_vecs of the input and the weights; the standalone norm's output is a buffer from
// allocate(), always 16-byte aligned), and hands each rounded element to the store the second op
// would have made of it: kv_write's copy or kv_fp8_code, indexer_store's k row. So the cache bytes
// are those of the two ops.

/// kv_norm_write, row in registers: octet v of c_kv to the cache slot of pos[0] (BF16: one 16-byte
/// store; FP8: 8 codes in one 8-byte store; the row is 16- / 8-byte aligned as n % 8 == 0).
template <int V>
__global__ void __launch_bounds__(kVecNormThreads)
    kv_norm_write_vec_kernel(const bf16* x, const bf16* w, float eps, const int32_t* block_table,
                             const int32_t* pos, void* data, bool fp8, float scale, int block_size, int n) {
  pdl_begin();
  const size_t base = static_cast<size_t>(kv_slot(block_table, pos[0], block_size)) * n;
  if (fp8) {
    uint8_t* row = static_cast<uint8_t*>(data) + base;
    rmsnorm_row_vec<V>(x, w, n / 8, n, eps, [&](int v, const uint4& octet) {
      float f[8];
      unpack8(octet, f);
      uint32_t lo = 0, hi = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        lo |= static_cast<uint32_t>(kv_fp8_code(f[e], scale)) << (8 * e);
        hi |= static_cast<uint32_t>(kv_fp8_code(f[e + 4], scale)) << (8 * e);
      }
      *reinterpret_cast<uint2*>(row + static_cast<size_t>(v) * 8) = make_uint2(lo, hi);
    });
  } else {
    rmsnorm_row_vec<V>(x, w, n / 8, n, eps, StoreOctets{static_cast<bf16*>(data) + base});
  }
}

/// kv_norm_write, scalar norm: element i of c_kv to the cache slot of pos[0].
__global__ void __launch_bounds__(kNormThreads)
    kv_norm_write_kernel(const bf16* x, const bf16* w, float eps, const int32_t* block_table,
                         const int32_t* pos, void* data, bool fp8, float scale, int block_size, int n) {
  pdl_begin();
  const size_t base = static_cast<size_t>(kv_slot(block_table, pos[0], block_size)) * n;
  if (fp8) {
    uint8_t* row = static_cast<uint8_t*>(data) + base;
    rmsnorm_row(x, w, n, eps, [&](int i, bf16 v) { row[i] = kv_fp8_code(bf16_to_f(v), scale); });
  } else {
    bf16* row = static_cast<bf16*>(data) + base;
    rmsnorm_row(x, w, n, eps, [&](int i, bf16 v) { row[i] = v; });
  }
}

/// indexer_norm_store, row in registers: k_normed's octets to k_cache row pos[0], then the rest of
/// indexer_store.
template <int V>
__global__ void __launch_bounds__(kVecNormThreads)
    indexer_norm_store_vec_kernel(const bf16* x, const bf16* w, const bf16* b, float eps, const float* gate,
                                  const float* ape, const int32_t* pos, bf16* k_cache, float* gate_cache,
                                  uint8_t* valid, float* pool_keys, int D, int P) {
  pdl_begin();
  const int64_t p = pos[0];
  layernorm_row_vec<V>(x, w, b, D / 8, D, eps, StoreOctets{k_cache + static_cast<size_t>(p) * D});
  indexer_store_after_k(gate, ape, p, k_cache, gate_cache, valid, pool_keys, D, P);
}

/// indexer_norm_store, scalar norm.
__global__ void __launch_bounds__(kNormThreads)
    indexer_norm_store_kernel(const bf16* x, const bf16* w, const bf16* b, float eps, const float* gate,
                              const float* ape, const int32_t* pos, bf16* k_cache, float* gate_cache,
                              uint8_t* valid, float* pool_keys, int D, int P) {
  pdl_begin();
  const int64_t p = pos[0];
  bf16* row = k_cache + static_cast<size_t>(p) * D;
  layernorm_row(x, w, b, D, eps, [&](int i, bf16 v) { row[i] = v; });
  indexer_store_after_k(gate, ape, p, k_cache, gate_cache, valid, pool_keys, D, P);
}

// ---- indexer: pool scores ----------------------------------------------------------------------------

constexpr int kScoreThreads = 256;
constexpr int kScoreWarps = kScoreThreads / kWarp;
constexpr int kPoolsPerWarp = 4;

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
  // 16-byte loads, unrolled so that many are in flight (a scalar loop here was a chain of
  // dependent round trips). D % 4 == 0, and q is 16-byte aligned (checked at launch).
  const int q_vecs = n_heads * D / 4;
#pragma unroll 4
  for (int i = threadIdx.x; i < q_vecs; i += blockDim.x) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(q) + i);
    const int h = (4 * i) / D, c = (4 * i) % D;
    *reinterpret_cast<float4*>(q_s + static_cast<size_t>(h) * qstride + c) = v;
  }
  for (int i = threadIdx.x; i < n_heads; i += blockDim.x) w_s[i] = w[i];
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
#pragma unroll 4
    for (int i = lane; i < kPoolsPerWarp * D / 4; i += kWarp) {
      const int p = (4 * i) / D;
      const int c = (4 * i) % D;
      const float4 k4 =
          (j0 + p < n_cand)
              ? __ldg(reinterpret_cast<const float4*>(pool_keys + static_cast<size_t>(j0 + p) * D + c))
              : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      my_keys[(c + 0) * kPoolsPerWarp + p] = k4.x;
      my_keys[(c + 1) * kPoolsPerWarp + p] = k4.y;
      my_keys[(c + 2) * kPoolsPerWarp + p] = k4.z;
      my_keys[(c + 3) * kPoolsPerWarp + p] = k4.w;
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
      for (int p = 0; p < kPoolsPerWarp; ++p) total[p] += w_s[h] * fmaxf(dot[p] * inv_sqrt_d, 0.0f);
    }
#pragma unroll
    for (int p = 0; p < kPoolsPerWarp; ++p) total[p] = warp_sum(total[p]);
    if (lane < kPoolsPerWarp) {
      const int j = j0 + lane;
      float v = total[0];
#pragma unroll
      for (int p = 1; p < kPoolsPerWarp; ++p)
        if (lane == p) v = total[p];
      if (j < max_pools) scores[j] = j < n_cand ? v : -INFINITY;
    }
    __syncwarp();
  }
}

// ---- indexer: selection ------------------------------------------------------------------------------

constexpr int kSelectThreads = 1024;

/// Inclusive block scan of u64 over 1024 threads (every thread gets its prefix); also returns the total.
__device__ unsigned long long block_scan_u64(unsigned long long v, unsigned long long* total) {
  __shared__ unsigned long long s_warp[32];
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int o = 1; o < kWarp; o <<= 1) {
    const unsigned long long up = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += up;
  }
  if (lane == kWarp - 1) s_warp[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int n_warps = blockDim.x / kWarp;
    unsigned long long t = lane < n_warps ? s_warp[lane] : 0ull;
#pragma unroll
    for (int o = 1; o < kWarp; o <<= 1) {
      const unsigned long long up = __shfl_up_sync(0xffffffffu, t, o);
      if (lane >= o) t += up;
    }
    if (lane < n_warps) s_warp[lane] = t;
  }
  __syncthreads();
  if (warp > 0) v += s_warp[warp - 1];
  *total = s_warp[blockDim.x / kWarp - 1];
  __syncthreads();
  return v;
}

/// The selection's end (both select kernels, whole block): after the n_sel selected pools, the
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
      const uint32_t high_mask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
      for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      // The loop bound is uniform across the block, so every warp is converged at the match;
      // lanes with the same bin add once (the lowest), which spares the atomics on heavy ties.
      for (int j0 = 0; j0 < n_cand; j0 += blockDim.x) {
        const int j = j0 + tid;
        const uint32_t key = j < n_cand ? key_of(j) : 0u;
        const bool match = j < n_cand && (key & high_mask) == prefix;
        const unsigned int bin = (key >> shift) & 0xffu;
        const unsigned int peers = __match_any_sync(0xffffffffu, match ? bin : 0x100u);
        if (match && (__ffs(peers) - 1) == (tid % kWarp)) atomicAdd(&hist[bin], __popc(peers));
      }
      __syncthreads();
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

// ---- indexer: selection, radix kernel (the default; docs/kernels.md) ----------------------------------

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
    indexer_select_radix_kernel(const float* scores, const int32_t* pos, int32_t* selection, int K, int P,
                                int max_pools, int cached, int cand_cap) {
  extern __shared__ uint32_t radix_smem[];
  unsigned int* hist = radix_smem;           // [kRadixBins], zero outside a pass
  uint32_t* cand = radix_smem + kRadixBins;  // [cand_cap]
  uint32_t* key_cache = cand + cand_cap;     // [max_pools] when `cached`
  __shared__ unsigned int s_cand_count;
  __shared__ unsigned int s_gt[kWarp];
  __shared__ unsigned int s_eq[kWarp];
  pdl_begin();
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

void rmsnorm(const LaunchCtx& ctx, const bf16* x, const bf16* w, bf16* y, int rows, int n, float eps) {
  MTP_REQUIRE(rows >= 1 && n >= 1, "ops::cuda::rmsnorm: rows ", rows, ", n ", n);
  if (const int v = norm_vecs(n, {x, w, y}); v > 0) {
    with_norm_vecs(v, [&](auto V) {
      launch(ctx, rmsnorm_vec_kernel<decltype(V)::value>, rows, kVecNormThreads, 0, x, w, y, n, eps);
    });
  } else {
    launch(ctx, rmsnorm_kernel, rows, kNormThreads, 0, x, w, y, n, eps);
  }
  MTP_CUDA_LAUNCH_CHECK();
}

void embed_rmsnorm(const LaunchCtx& ctx, const bf16* table, const int32_t* token, const bf16* w, bf16* y,
                   int n, float eps) {
  MTP_REQUIRE(n >= 1, "ops::cuda::embed_rmsnorm: n ", n);
  if (const int v = norm_vecs(n, {table, w, y}); v > 0) {
    with_norm_vecs(v, [&](auto V) {
      launch(ctx, embed_rmsnorm_vec_kernel<decltype(V)::value>, 1, kVecNormThreads, 0, table, token, w, y, n,
             eps);
    });
  } else {
    launch(ctx, embed_rmsnorm_kernel, 1, kNormThreads, 0, table, token, w, y, n, eps);
  }
  MTP_CUDA_LAUNCH_CHECK();
}

void layernorm(const LaunchCtx& ctx, const bf16* x, const bf16* w, const bf16* b, bf16* y, int rows, int n,
               float eps) {
  MTP_REQUIRE(rows >= 1 && n >= 1, "ops::cuda::layernorm: rows ", rows, ", n ", n);
  if (const int v = norm_vecs(n, {x, w, b, y}); v > 0) {
    with_norm_vecs(v, [&](auto V) {
      launch(ctx, layernorm_vec_kernel<decltype(V)::value>, rows, kVecNormThreads, 0, x, w, b, y, n, eps);
    });
  } else {
    launch(ctx, layernorm_kernel, rows, kNormThreads, 0, x, w, b, y, n, eps);
  }
  MTP_CUDA_LAUNCH_CHECK();
}

void residual_add(const LaunchCtx& ctx, const bf16* x, const float* delta, bf16* y, int n) {
  launch(ctx, residual_add_kernel, elt_grid(ctx, n), kEltThreads, 0, x, delta, y, n);
  MTP_CUDA_LAUNCH_CHECK();
}
void residual_add_rmsnorm(const LaunchCtx& ctx, const bf16* x, const float* delta, bf16* y, const bf16* w,
                          bf16* normed, int n, float eps) {
  MTP_REQUIRE(n >= 1, "ops::cuda::residual_add_rmsnorm: n ", n);
  if (const int v = norm_vecs(n, {x, delta, y, w, normed}); v > 0) {
    with_norm_vecs(v, [&](auto V) {
      launch(ctx, residual_add_rmsnorm_vec_kernel<decltype(V)::value>, 1, kVecNormThreads, 0, x, delta, y, w,
             normed, n, eps);
    });
  } else {
    launch(ctx, residual_add_rmsnorm_kernel, 1, kNormThreads, 0, x, delta, y, w, normed, n, eps);
  }
  MTP_CUDA_LAUNCH_CHECK();
}
void add(const LaunchCtx& ctx, const bf16* a, const bf16* b, bf16* y, int n) {
  launch(ctx, add_kernel, elt_grid(ctx, n), kEltThreads, 0, a, b, y, n);
  MTP_CUDA_LAUNCH_CHECK();
}
void to_bf16(const LaunchCtx& ctx, const float* x, bf16* y, int n) {
  launch(ctx, to_bf16_kernel, elt_grid(ctx, n), kEltThreads, 0, x, y, n);
  MTP_CUDA_LAUNCH_CHECK();
}
void accumulate_f32(const LaunchCtx& ctx, const float* x, float* y, int n) {
  launch(ctx, accumulate_f32_kernel, elt_grid(ctx, n), kEltThreads, 0, x, y, n);
  MTP_CUDA_LAUNCH_CHECK();
}
void scale_f32(const LaunchCtx& ctx, float* x, float s, int n) {
  launch(ctx, scale_f32_kernel, elt_grid(ctx, n), kEltThreads, 0, x, s, n);
  MTP_CUDA_LAUNCH_CHECK();
}
void add_i32(const LaunchCtx& ctx, const int32_t* src, int32_t add, int32_t* dst) {
  launch(ctx, add_i32_kernel, 1, 1, 0, src, add, dst);
  MTP_CUDA_LAUNCH_CHECK();
}

void moe_route(const LaunchCtx& ctx, const float* logits, const float* bias, int num_experts, int top_k,
               int n_group, int topk_group, float scaling, int32_t* idx, float* weights) {
  MTP_REQUIRE(num_experts >= 1 && top_k >= 1 && top_k <= num_experts && n_group >= 1,
              "ops::cuda::moe_route: num_experts ", num_experts, ", top_k ", top_k, ", n_group ", n_group);
  if (n_group > 1) {
    MTP_REQUIRE(num_experts % n_group == 0 && num_experts / n_group >= 2 && topk_group >= 1 &&
                    topk_group <= n_group && top_k <= topk_group * (num_experts / n_group),
                "ops::cuda::moe_route: bad group limit (num_experts ", num_experts, ", n_group ", n_group,
                ", topk_group ", topk_group, ", top_k ", top_k, ")");
  }
  const size_t smem = sizeof(unsigned long long) * (static_cast<size_t>(num_experts) + n_group) +
                      sizeof(float) * (2 * static_cast<size_t>(num_experts) + top_k) + n_group;
  MTP_REQUIRE(smem <= 48 * 1024, "ops::cuda::moe_route: ", num_experts,
              " experts exceed the router's shared memory");
  // One thread per expert up to 1024 (each ranks its expert against all others).
  const int route_threads =
      std::min(kRouteThreads, std::max(kWarp, (num_experts + kWarp - 1) / kWarp * kWarp));
  launch(ctx, moe_route_kernel, 1, route_threads, smem, logits, bias, num_experts, top_k, n_group, topk_group,
         scaling, idx, weights);
  MTP_CUDA_LAUNCH_CHECK();
}

void indexer_store(const LaunchCtx& ctx, const bf16* k_normed, const float* gate, const float* ape,
                   const int32_t* pos, bf16* k_cache, float* gate_cache, uint8_t* valid, float* pool_keys,
                   int D, int P) {
  MTP_REQUIRE(D >= 1 && P >= 1, "ops::cuda::indexer_store: D ", D, ", P ", P);
  launch(ctx, indexer_store_kernel, 1, std::min(1024, ((D + 31) / 32) * 32), 0, k_normed, gate, ape, pos,
         k_cache, gate_cache, valid, pool_keys, D, P);
  MTP_CUDA_LAUNCH_CHECK();
}

void kv_norm_write(const LaunchCtx& ctx, const bf16* x, const bf16* w, float eps, const int32_t* block_table,
                   const int32_t* pos, const KvCache& cache) {
  const int n = cache.kv_lora;
  MTP_REQUIRE(cache.data && cache.block_size >= 1 && n >= 1, "ops::cuda::kv_norm_write: bad cache");
  MTP_REQUIRE(reinterpret_cast<uintptr_t>(cache.data) % 16 == 0,
              "ops::cuda::kv_norm_write: the cache must be 16-byte aligned");
  const bool fp8 = cache.dtype == KvDtype::fp8;
  // The path rmsnorm(x, w, y) takes for an allocate()d y (fused kernels above).
  if (const int v = norm_vecs(n, {x, w}); v > 0) {
    with_norm_vecs(v, [&](auto V) {
      launch(ctx, kv_norm_write_vec_kernel<decltype(V)::value>, 1, kVecNormThreads, 0, x, w, eps, block_table,
             pos, cache.data, fp8, cache.scale, cache.block_size, n);
    });
  } else {
    launch(ctx, kv_norm_write_kernel, 1, kNormThreads, 0, x, w, eps, block_table, pos, cache.data, fp8,
           cache.scale, cache.block_size, n);
  }
  MTP_CUDA_LAUNCH_CHECK();
}

void indexer_norm_store(const LaunchCtx& ctx, const bf16* x, const bf16* w, const bf16* b, float eps,
                        const float* gate, const float* ape, const int32_t* pos, bf16* k_cache,
                        float* gate_cache, uint8_t* valid, float* pool_keys, int D, int P) {
  MTP_REQUIRE(D >= 1 && P >= 1, "ops::cuda::indexer_norm_store: D ", D, ", P ", P);
  MTP_REQUIRE(reinterpret_cast<uintptr_t>(k_cache) % 16 == 0,
              "ops::cuda::indexer_norm_store: k_cache must be 16-byte aligned");
  // The path layernorm(x, w, b, y) takes for an allocate()d y (fused kernels above).
  if (const int v = norm_vecs(D, {x, w, b}); v > 0) {
    with_norm_vecs(v, [&](auto V) {
      launch(ctx, indexer_norm_store_vec_kernel<decltype(V)::value>, 1, kVecNormThreads, 0, x, w, b, eps,
             gate, ape, pos, k_cache, gate_cache, valid, pool_keys, D, P);
    });
  } else {
    launch(ctx, indexer_norm_store_kernel, 1, kNormThreads, 0, x, w, b, eps, gate, ape, pos, k_cache,
           gate_cache, valid, pool_keys, D, P);
  }
  MTP_CUDA_LAUNCH_CHECK();
}

void indexer_scores(const LaunchCtx& ctx, const float* q, const float* w, const float* pool_keys,
                    const int32_t* pos, float* scores, int n_heads, int D, int P, int max_pools) {
  MTP_REQUIRE(n_heads >= 1 && D >= 4 && D % 4 == 0 && P >= 1 && max_pools >= 1,
              "ops::cuda::indexer_scores: n_heads ", n_heads, ", D ", D, " (a multiple of 4), P ", P,
              ", max_pools ", max_pools);
  const size_t smem = sizeof(float) * (static_cast<size_t>(n_heads) * (D + 4) + ((n_heads + 3) / 4) * 4 +
                                       static_cast<size_t>(kScoreWarps) * D * kPoolsPerWarp);
  MTP_REQUIRE(smem <= 200 * 1024, "ops::cuda::indexer_scores: ", n_heads, " heads x ", D,
              " do not fit in shared memory");
  if (smem > 48 * 1024) {
    MTP_CUDA_CHECK(cudaFuncSetAttribute(indexer_scores_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
  }
  MTP_REQUIRE(reinterpret_cast<uintptr_t>(q) % 16 == 0 && reinterpret_cast<uintptr_t>(pool_keys) % 16 == 0,
              "ops::cuda::indexer_scores: q and pool_keys must be 16-byte aligned");
  const int pools_per_block = kScoreWarps * kPoolsPerWarp;
  const int grid =
      std::max(1, std::min((max_pools + pools_per_block - 1) / pools_per_block, ctx.num_sms * 4));
  launch(ctx, indexer_scores_kernel, grid, kScoreThreads, smem, q, w, pool_keys, pos, scores, n_heads, D, P,
         max_pools);
  MTP_CUDA_LAUNCH_CHECK();
}

void indexer_select(const LaunchCtx& ctx, const float* scores, const int32_t* pos, int32_t* selection, int K,
                    int P, int max_pools) {
  MTP_REQUIRE(K >= 1 && P >= 1 && max_pools >= 1, "ops::cuda::indexer_select: K ", K, ", P ", P,
              ", max_pools ", max_pools);
  // Keys in shared memory up to 160 KB of them (40960 pools); beyond, the passes read global memory.
  const size_t cache_bytes = sizeof(uint32_t) * static_cast<size_t>(max_pools);
  const int cached = cache_bytes <= 160 * 1024 ? 1 : 0;
  if (ctx.policy.indexer_select == IndexerSelect::v1) {
    const size_t smem = cached ? cache_bytes : 0;
    if (smem > 48 * 1024) {
      MTP_CUDA_CHECK(cudaFuncSetAttribute(indexer_select_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
    }
    launch(ctx, indexer_select_kernel, 1, kSelectThreads, smem, scores, pos, selection, K, P, max_pools,
           cached);
  } else {
    // The histogram, the candidate buffer (never more than the pools), then the cached keys: at most
    // 8 + 16 + 160 KB. Without the opt-in, static (400 bytes) plus dynamic must fit in 48 KB.
    const int cand_cap = std::min(max_pools, kRadixCandidates);
    const size_t smem =
        sizeof(uint32_t) * (static_cast<size_t>(kRadixBins) + cand_cap) + (cached ? cache_bytes : 0);
    if (smem > 47 * 1024) {
      MTP_CUDA_CHECK(cudaFuncSetAttribute(
          indexer_select_radix_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    }
    launch(ctx, indexer_select_radix_kernel, 1, kSelectThreads, smem, scores, pos, selection, K, P, max_pools,
           cached, cand_cap);
  }
  MTP_CUDA_LAUNCH_CHECK();
}

}  // namespace mtplab::ops::cuda
