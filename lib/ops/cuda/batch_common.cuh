// Device helpers of the batched kernels (the batched rows of each family file of lib/ops/cuda) and
// of the single-row kernels that share their code: block reductions and scans, the row norms a
// block computes for one row (register-resident when the row fits, scalar otherwise), and the
// tensor-core fragments of the skinny GEMMs (mma.sync m16n8k16, BF16 in, fp32 accumulate).
//
// Invariants:
// - Element-wise arithmetic after a reduction uses explicit round-to-nearest intrinsics in the CPU
//   reference's operation order (docs/numerics.md), so a batched row differs from the CPU only
//   through its reductions' summation order and the device expf.
// - The skinny GEMMs permute the reduction index inside each 64-column chunk (see "fragments"
//   below) the same way for both operands, so every output element is the full dot product; the
//   permutation only changes the order the tensor core sums the products in.
// - Every helper that contains a barrier must be called by the whole block.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "ops/cuda/device_common.cuh"

namespace mtplab::ops::cuda::batch {

// ---- block reductions -------------------------------------------------------------------------------

/// Sum over the block (blockDim a multiple of 32, up to 1024): warps first, then warp 0's lane 0
/// adds the warps' sums in warp order. Every thread gets the total.
__device__ __forceinline__ float block_sum(float v) {
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

/// Exclusive prefix sum over the block in thread order (blockDim a multiple of 32, up to 1024);
/// `total` gets the sum of every thread's value.
__device__ __forceinline__ unsigned long long block_exclusive_scan(unsigned long long v,
                                                                   unsigned long long* total) {
  __shared__ unsigned long long s_warp[32];
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int n_warps = blockDim.x / kWarp;
  unsigned long long incl = v;
#pragma unroll
  for (int o = 1; o < kWarp; o <<= 1) {
    const unsigned long long up = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += up;
  }
  if (lane == kWarp - 1) s_warp[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    unsigned long long t = lane < n_warps ? s_warp[lane] : 0ull;
#pragma unroll
    for (int o = 1; o < kWarp; o <<= 1) {
      const unsigned long long up = __shfl_up_sync(0xffffffffu, t, o);
      if (lane >= o) t += up;
    }
    if (lane < n_warps) s_warp[lane] = t;  // inclusive over the warps
  }
  __syncthreads();
  const unsigned long long before = (warp > 0 ? s_warp[warp - 1] : 0ull) + incl - v;
  *total = s_warp[n_warps - 1];
  __syncthreads();  // s_warp may be reused by the next call
  return before;
}

// ---- BF16 octets --------------------------------------------------------------------------------------

__device__ __forceinline__ void unpack8(const uint4& u, float (&f)[8]) {
  f[0] = bf16_lo(u.x), f[1] = bf16_hi(u.x), f[2] = bf16_lo(u.y), f[3] = bf16_hi(u.y);
  f[4] = bf16_lo(u.z), f[5] = bf16_hi(u.z), f[6] = bf16_lo(u.w), f[7] = bf16_hi(u.w);
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  return static_cast<uint32_t>(f_to_bf16(lo).bits) | (static_cast<uint32_t>(f_to_bf16(hi).bits) << 16);
}
__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  return make_uint4(pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]), pack2(f[6], f[7]));
}

// ---- row norms (one block per row) --------------------------------------------------------------------
//
// A block of kRowThreads threads computes one row. Register-resident path (V octets per thread,
// every load issued before the first use) when the row is a whole number of octets, at most
// kRowThreads * 8 * kMaxRowVecs elements, and every pointer it touches is 16-byte aligned; the
// scalar path otherwise. Both hand each rounded element (scalar: element i; vector: octet v, 8
// packed BF16) to a store functor, so one norm serves every destination (a row, a cache slot, an
// FP8 code).

constexpr int kRowThreads = 256;
constexpr int kMaxRowVecs = 4;  // octets per thread: rows up to 8192 elements

/// This thread's octets j = 0..V-1 of a row of nv octets (octet threadIdx.x + j * kRowThreads),
/// zeros past the row.
template <int V>
__device__ __forceinline__ void load_octets(const bf16* row, int nv, uint4 (&r)[V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int v = threadIdx.x + j * kRowThreads;
    r[j] = v < nv ? load_cached(row + static_cast<size_t>(v) * 8) : make_uint4(0, 0, 0, 0);
  }
}

/// y = bf16(w * (x * r)), r = 1 / sqrt(mean(x^2) + eps), the row in registers; octet v is handed
/// to store(v, octet) by the thread that loaded it (so x may be the store's destination).
/// acc = add(acc, value) over every element of this thread's V octets, in octet then element order
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

/// f(j, v) for each of this thread's octets j = 0..V-1 inside the row (octet v = threadIdx.x +
/// j * kRowThreads < nv: load_octets' layout), in ascending j.
template <int V, typename F>
__device__ __forceinline__ void for_octets(int nv, F&& f) {
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int v = threadIdx.x + j * kRowThreads;
    if (v < nv) f(j, v);
  }
}

/// 1 / sqrt(sum / n + eps) in IEEE-rounded steps, the sum over the block of each thread's `part`
/// (block_sum: the whole block calls this): RMSNorm's scale from the squares, LayerNorm's from the
/// squared deviations.
__device__ __forceinline__ float inv_root_mean(float part, int n, float eps) {
  const float mean = __fdiv_rn(block_sum(part), static_cast<float>(n));
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

template <int V, typename Store>
__device__ __forceinline__ void rmsnorm_row_vec(const bf16* x, const bf16* w, int n, float eps,
                                                Store&& store) {
  const int nv = n / 8;
  uint4 xr[V], wr[V];
  load_octets<V>(x, nv, xr);
  load_octets<V>(w, nv, wr);
  const float r =
      inv_root_mean(octets_sum<V>(xr, [](float acc, float v) { return fmaf(v, v, acc); }), n, eps);
  for_octets<V>(nv, [&](int j, int v) {
    float f[8], g[8];
    unpack8(xr[j], f);
    unpack8(wr[j], g);
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = __fmul_rn(g[e], __fmul_rn(f[e], r));
    store(v, pack8(f));
  });
}

/// rmsnorm_row_vec with one element per iteration (any n, any alignment). Every read of x for the
/// sum finishes at block_sum's barrier; afterwards each thread reads x[i] just before store(i).
template <typename Store>
__device__ __forceinline__ void rmsnorm_row_scalar(const bf16* x, const bf16* w, int n, float eps,
                                                   Store&& store) {
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = bf16_to_f(x[i]);
    ss = fmaf(v, v, ss);
  }
  const float r = inv_root_mean(ss, n, eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    store(i, f_to_bf16(__fmul_rn(bf16_to_f(w[i]), __fmul_rn(bf16_to_f(x[i]), r))));
}

/// layernorm, row in registers: mean, then the biased variance of (x - mean) (two passes over the
/// registers), y = bf16(((x - mean) * r) * w + b).
template <int V, typename Store>
__device__ __forceinline__ void layernorm_row_vec(const bf16* x, const bf16* w, const bf16* b, int n,
                                                  float eps, Store&& store) {
  const int nv = n / 8;
  uint4 xr[V], wr[V], br[V];
  load_octets<V>(x, nv, xr);
  load_octets<V>(w, nv, wr);
  load_octets<V>(b, nv, br);
  const float mean = __fdiv_rn(block_sum(octets_sum<V>(xr, [](float acc, float v) { return acc + v; })),
                               static_cast<float>(n));
  float sq = 0.0f;
  // Only the row's octets: the zero padding is no value and must not add mean^2.
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

/// layernorm_row_vec with one element per iteration.
template <typename Store>
__device__ __forceinline__ void layernorm_row_scalar(const bf16* x, const bf16* w, const bf16* b, int n,
                                                     float eps, Store&& store) {
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

/// The octet store of a BF16 row (16-byte aligned).
struct StoreOctets {
  bf16* y;
  __device__ __forceinline__ void operator()(int v, const uint4& octet) const {
    *reinterpret_cast<uint4*>(y + static_cast<size_t>(v) * 8) = octet;
  }
};
/// The element store of a BF16 row.
struct StoreElems {
  bf16* y;
  __device__ __forceinline__ void operator()(int i, bf16 v) const { y[i] = v; }
};

// ---- tensor-core fragments ----------------------------------------------------------------------------
//
// mma.sync.m16n8k16 (row.col, BF16 x BF16 -> fp32). Lane l = 4g + t (g = l / 4, t = l % 4) holds
// A (16 x 16, row-major): a0 = (row g, k 2t..2t+1), a1 = (row g+8, k 2t..), a2 = (row g, k 2t+8..),
// a3 = (row g+8, k 2t+8..); B (16 x 8): b0 = (k 2t..2t+1, col g), b1 = (k 2t+8.., col g);
// C (16 x 8): c0, c1 = (row g, cols 2t, 2t+1), c2, c3 = (row g+8, cols 2t, 2t+1).
//
// The skinny GEMMs feed the MMA straight from 16-byte loads by relabelling the reduction index
// inside each chunk of 64 columns: lane (g, t) loads physical columns 16t .. 16t+15 of its rows
// (two 16-byte vectors, eight BF16 pairs w[0..7]), and k-step s (0..3) takes the pairs w[2s] as
// logical columns (2t, 2t+1) and w[2s+1] as (2t+8, 2t+9). Over t and s that is a bijection of the
// 64 columns, applied identically to A and B, so each output is the full sum.

constexpr int kChunkK = 64;  // reduction columns per chunk

__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// The same MMA on FP16 operands (fp32 accumulate).
__device__ __forceinline__ void mma_16816_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Two floats as a BF16 pair (RNE), the first in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

/// 16 E4M3 values (one 16-byte vector, low byte first) as 8 BF16 pairs: exact (E4M3 has 3 mantissa
/// bits and an exponent range inside BF16's).
__device__ __forceinline__ void fp8x16_to_bf16x16(const uint4& v, uint32_t (&w)[8]) {
  const uint32_t q[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = fp8x2_to_float2(q[i]);
    const float2 b = fp8x2_to_float2(q[i] >> 16);
    w[2 * i] = pack_bf16x2(a.x, a.y);
    w[2 * i + 1] = pack_bf16x2(b.x, b.y);
  }
}

/// 16 E4M3 values (one 16-byte vector, low byte first) as 8 FP16 pairs: exact (every E4M3 value,
/// subnormals included, is an FP16 value), one conversion instruction a pair where the BF16
/// widening above takes two (E4M3 -> FP16 -> fp32 pair -> BF16 pair).
__device__ __forceinline__ void fp8x16_to_f16x16(const uint4& v, uint32_t (&w)[8]) {
  const uint32_t q[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half2_raw a =
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(q[i] & 0xffffu), __NV_E4M3);
    const __half2_raw b =
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(q[i] >> 16), __NV_E4M3);
    w[2 * i] = static_cast<uint32_t>(a.x) | (static_cast<uint32_t>(a.y) << 16);
    w[2 * i + 1] = static_cast<uint32_t>(b.x) | (static_cast<uint32_t>(b.y) << 16);
  }
}

// FP16 activations for the FP8 weights (docs/kernels.md, "The head"): a batch
// row of x is scaled by 2^shift, shift = 14 - floor(log2 max|x|), so its largest magnitude falls in
// [2^14, 2^15), and rounded to FP16. FP16 holds BF16's 8 significant bits exactly from 2^-17 up, so
// every entry down to 2^-32 of the row's largest is exact, and the tensor core's products and fp32
// sums are the BF16 operands' times 2^shift; the epilogue multiplies the shift back out (exact, a
// power of two). Rows of zeros and rows with a non-finite maximum keep shift 0.
__device__ __forceinline__ int f16_row_shift(float max_abs) {
  return max_abs > 0.0f && isfinite(max_abs) ? 14 - ilogbf(max_abs) : 0;
}
/// BF16 pair `two` (low half first) times 2^shift as an FP16 pair.
__device__ __forceinline__ uint32_t bf16x2_to_f16x2_shifted(uint32_t two, int shift) {
  const __half2 h = __floats2half2_rn(ldexpf(__uint_as_float(two << 16), shift),
                                      ldexpf(__uint_as_float(two & 0xffff0000u), shift));
  return *reinterpret_cast<const uint32_t*>(&h);
}
// E4M3 activations for cuBLASLt's FP8 GEMM (the FP8 head under head_gemm cublaslt; docs/kernels.md,
// "The head"): a batch row of x is scaled by 2^shift, shift = 7 - floor(log2
// max|x|), so its largest magnitude falls in [2^7, 2^8) (E4M3's largest finite value is 448), and
// split into two E4M3 parts, hi = E4M3(x') and lo = E4M3(x' - hi), both round-to-nearest. hi holds
// x's 4 leading significant bits and lo the next 4, so hi + lo is x' exactly for every entry of
// magnitude >= 2^-2 (2^-10 of the row's largest; below that lo falls into E4M3's subnormals and
// rounds, by at most 2^-10). Rows of zeros keep shift 0; a row with a non-finite entry is marked
// (kE4m3NonFinite) and its parts are NaN, so its logits are NaN (E4M3 has no infinity).
constexpr int kE4m3NonFinite = 1 << 20;
__device__ __forceinline__ int e4m3_row_shift(float max_abs) {
  if (!isfinite(max_abs)) return kE4m3NonFinite;
  return max_abs > 0.0f ? 7 - ilogbf(max_abs) : 0;
}
/// The two E4M3 parts of value v at `shift` (e4m3_row_shift): hi in the low byte, lo above.
__device__ __forceinline__ uint32_t e4m3_parts(float v, int shift) {
  const float s = shift == kE4m3NonFinite ? __int_as_float(0x7fffffff) : ldexpf(v, shift);
  const __nv_fp8_storage_t hi = __nv_cvt_float_to_fp8(s, __NV_SATFINITE, __NV_E4M3);
  const float hv = __half2float(__half(__nv_cvt_fp8_to_halfraw(hi, __NV_E4M3)));
  const __nv_fp8_storage_t lo = __nv_cvt_float_to_fp8(s - hv, __NV_SATFINITE, __NV_E4M3);
  return static_cast<uint32_t>(hi) | (static_cast<uint32_t>(lo) << 8);
}
/// The largest magnitude of a BF16 pair and m.
__device__ __forceinline__ float bf16x2_max_abs(uint32_t two, float m) {
  return fmaxf(m, fmaxf(fabsf(__uint_as_float(two << 16)), fabsf(__uint_as_float(two & 0xffff0000u))));
}

/// The eight BF16 pairs of two 16-byte vectors.
__device__ __forceinline__ void words8(const uint4& lo, const uint4& hi, uint32_t (&w)[8]) {
  w[0] = lo.x, w[1] = lo.y, w[2] = lo.z, w[3] = lo.w;
  w[4] = hi.x, w[5] = hi.y, w[6] = hi.z, w[7] = hi.w;
}

/// The A fragments of the four k-steps of a chunk from the words of rows g (w0) and g+8 (w1).
__device__ __forceinline__ void a_frags(const uint32_t (&w0)[8], const uint32_t (&w1)[8],
                                        uint32_t (&a)[4][4]) {
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    a[s][0] = w0[2 * s];
    a[s][1] = w1[2 * s];
    a[s][2] = w0[2 * s + 1];
    a[s][3] = w1[2 * s + 1];
  }
}

/// acc += A (four k-steps) x B, the B words of this lane's column (8 BF16 pairs of its 16 physical
/// columns of the chunk).
/// kF16: FP16 operands.
template <bool kF16 = false>
__device__ __forceinline__ void mma_chunk(float (&acc)[4], const uint32_t (&a)[4][4],
                                          const uint32_t (&b)[8]) {
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    if constexpr (kF16) {
      mma_16816_f16(acc, a[s], b[2 * s], b[2 * s + 1]);
    } else {
      mma_16816(acc, a[s], b[2 * s], b[2 * s + 1]);
    }
  }
}

// ---- launch shapes of the row kernels (host) -----------------------------------------------------------

/// Octets per thread of the register-resident row path for rows of n whose starts are the `bases`
/// plus multiples of the `strides` (in elements), or 0 for the scalar path: n must be a whole number
/// of octets no longer than kRowThreads * 8 * kMaxRowVecs, every base 16-byte aligned and every
/// stride a whole number of octets.
inline int row_vecs(int n, std::initializer_list<const void*> bases,
                    std::initializer_list<long long> strides = {}) {
  if (n % 8 != 0 || n > kRowThreads * 8 * kMaxRowVecs) return 0;
  for (const void* p : bases)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return 0;
  for (long long s : strides)
    if (s % 8 != 0) return 0;
  return (n / 8 + kRowThreads - 1) / kRowThreads;
}

/// Calls f(std::integral_constant<int, V>{}) for V = v in 0..kMaxRowVecs (0: the scalar path).
template <typename F>
void with_vecs(int v, F&& f) {
  static_assert(kMaxRowVecs == 4, "one case per octet count");
  switch (v) {
    case 0:
      return f(std::integral_constant<int, 0>{});
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

// ---- cp.async -------------------------------------------------------------------------------------------

/// 16 bytes global -> shared; src_bytes 0 zero-fills (nothing is read; gmem must still be a valid
/// address).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes)
               : "memory");
}
/// cp_async16 with an L2 prefetch hint: the L2 fetches the whole aligned 256 bytes around the 16 bytes
/// copied (the next chunk of a row streamed 128 bytes at a time then comes from L2).
__device__ __forceinline__ void cp_async16_l2pf256(void* smem, const void* gmem, int src_bytes) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
/// Waits until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

}  // namespace mtplab::ops::cuda::batch
