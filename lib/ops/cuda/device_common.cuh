// Device helpers shared by the kernels of lib/ops/cuda: BF16 / FP8 unpacking from 16-byte
// vectors, streaming loads, a lane's share of row dot products (the GEMV family's and the
// single-row experts'), warp reductions (sums, the reduce-scatter butterfly, maxima) and the
// order-preserving argmax key.
//
// Invariants:
// - The argmax key is the CPU reference's (ops/cpu/cpu_math.hpp): high 32 bits map the float
//   to an unsigned whose order is the float order (-0 canonicalised to +0), low 32 bits ~index,
//   so an unsigned MAX over keys picks the largest value and, among equals, the lowest index.
// - Warp sums use a fixed xor butterfly, so a result does not depend on scheduling.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/numeric.hpp"

namespace mtplab::ops::cuda {

/// Programmatic dependent launch. Every kernel of lib/ops/cuda calls this before anything else.
/// The wait returns once the grids this one depends on have completed and their memory writes are
/// visible (at once when the launch was an ordinary one); then this grid lets the next kernel of
/// the stream be scheduled, so that kernel's launch and block scheduling overlap this one's run
/// and tail instead of following them. Correctness never depends on the overlap: a dependent
/// reads nothing before its own wait.
__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

constexpr int kWarp = 32;

/// Barrier among `threads` threads (whole warps) of the block on named barrier `id` (1 .. 15; 0 is
/// __syncthreads'): groups of warps that share a row or a tile wait for each other only.
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

/// 16-byte load of data read once (weights): skips L1 so the small reused vectors stay there.
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}
/// 16-byte load of a small, reused, read-only vector (activations).
__device__ __forceinline__ uint4 load_cached(const void* p) { return __ldg(static_cast<const uint4*>(p)); }

__device__ __forceinline__ float bf16_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ float bf16_to_f(bf16 v) {
  return __uint_as_float(static_cast<uint32_t>(v.bits) << 16);
}

/// acc + sum of the 8 products of two packed BF16 octets.
__device__ __forceinline__ float dot_bf16x8(const uint4& w, const uint4& x, float acc) {
  acc = fmaf(bf16_lo(w.x), bf16_lo(x.x), acc);
  acc = fmaf(bf16_hi(w.x), bf16_hi(x.x), acc);
  acc = fmaf(bf16_lo(w.y), bf16_lo(x.y), acc);
  acc = fmaf(bf16_hi(w.y), bf16_hi(x.y), acc);
  acc = fmaf(bf16_lo(w.z), bf16_lo(x.z), acc);
  acc = fmaf(bf16_hi(w.z), bf16_hi(x.z), acc);
  acc = fmaf(bf16_lo(w.w), bf16_lo(x.w), acc);
  acc = fmaf(bf16_hi(w.w), bf16_hi(x.w), acc);
  return acc;
}

/// acc + a.x b.x + a.y b.y + a.z b.z + a.w b.w: one fmaf per term, in that order.
__device__ __forceinline__ float fma4(float4 a, float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

/// Two E4M3 values (low byte first) to floats; exact (E4M3 -> half is exact).
__device__ __forceinline__ float2 fp8x2_to_float2(uint32_t two) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  return __half22float2(__half2(h));
}

/// acc + sum of 4 products: 4 E4M3 weights (one u32) against 4 BF16 activations (two u32).
__device__ __forceinline__ float dot_fp8x4(uint32_t w, uint32_t x01, uint32_t x23, float acc) {
  const float2 a = fp8x2_to_float2(w);
  const float2 b = fp8x2_to_float2(w >> 16);
  acc = fmaf(a.x, bf16_lo(x01), acc);
  acc = fmaf(a.y, bf16_hi(x01), acc);
  acc = fmaf(b.x, bf16_lo(x23), acc);
  acc = fmaf(b.y, bf16_hi(x23), acc);
  return acc;
}

/// acc + sum of 16 products: 16 E4M3 weights against 16 BF16 activations (xa: 0..7, xb: 8..15).
__device__ __forceinline__ float dot_fp8x16(const uint4& w, const uint4& xa, const uint4& xb, float acc) {
  acc = dot_fp8x4(w.x, xa.x, xa.y, acc);
  acc = dot_fp8x4(w.y, xa.z, xa.w, acc);
  acc = dot_fp8x4(w.z, xb.x, xb.y, acc);
  acc = dot_fp8x4(w.w, xb.z, xb.w, acc);
  return acc;
}

constexpr int kUnroll = 8;  // 16-byte weight loads in flight per lane (slice_dot's default)

/// A lane's walk over kRows rows of 16-byte chunks [c0, c_end), kWarp * kU chunks a step: each
/// step loads wv[j][u] = chunk c + u kWarp of row j (rows[j], chunks of 16 / sizeof(T) elements;
/// zeros for a row with !ok[j] or a chunk at or past c_end), every load issued before any is used,
/// then calls use(wv, u, cc) for each of its chunks cc = c + u kWarp below c_end, u ascending (the
/// dot products below and moe.cu's pairs).
template <int kRows, int kU, typename T, typename Use>
__device__ __forceinline__ void walk_chunks(const T* const (&rows)[kRows], const bool (&ok)[kRows], int c0,
                                            int c_end, Use&& use) {
  constexpr size_t kChunkElems = 16 / sizeof(T);
  for (int c = c0; c < c_end; c += kWarp * kU) {
    uint4 wv[kRows][kU];
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int cc = c + u * kWarp;
        wv[j][u] = ok[j] && cc < c_end ? load_stream(rows[j] + static_cast<size_t>(cc) * kChunkElems)
                                       : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int cc = c + u * kWarp;
      if (cc < c_end) use(wv, u, cc);
    }
  }
}

/// This lane's share of the dot products of kRows rows with the same activation x over 16-byte
/// chunks [c_begin, c_end) of each row, kU loads per row and lane in flight: the weight loads of
/// every row are issued before the first FMA, and each activation chunk is read once for all rows.
/// acc[j] gets row j's chunks in ascending order (one accumulator per row: a row's bits do not
/// depend on kRows or kU); rows with !ok[j] (past n) load and add nothing.
template <bool kFp8, int kRows, int kU>
__device__ __forceinline__ void slice_dot_rows(const uint8_t* const (&wrow)[kRows], const bf16* x,
                                               const bool (&ok)[kRows], int c_begin, int c_end, int lane,
                                               float (&acc)[kRows]) {
  walk_chunks<kRows, kU>(wrow, ok, c_begin + lane, c_end, [&](const uint4(&wv)[kRows][kU], int u, int cc) {
    if constexpr (kFp8) {
      const uint4 xa = load_cached(x + static_cast<size_t>(cc) * 16);
      const uint4 xb = load_cached(x + static_cast<size_t>(cc) * 16 + 8);
#pragma unroll
      for (int j = 0; j < kRows; ++j)
        if (ok[j]) acc[j] = dot_fp8x16(wv[j][u], xa, xb, acc[j]);
    } else {
      const uint4 xv = load_cached(x + static_cast<size_t>(cc) * 8);
#pragma unroll
      for (int j = 0; j < kRows; ++j)
        if (ok[j]) acc[j] = dot_bf16x8(wv[j][u], xv, acc[j]);
    }
  });
}

/// slice_dot_rows of one row: this lane's share of a row dot product over chunks [c_begin, c_end).
template <bool kFp8, int kU = kUnroll>
__device__ __forceinline__ float slice_dot(const uint8_t* wrow, const bf16* x, int c_begin, int c_end,
                                           int lane) {
  const uint8_t* const rows[1] = {wrow};
  const bool ok[1] = {true};
  float acc[1] = {0.0f};
  slice_dot_rows<kFp8, 1, kU>(rows, x, ok, c_begin, c_end, lane, acc);
  return acc[0];
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// A split row's parts summed in part order, parts[0] first: the combine of every GEMV kernel
/// (and of the multi-row GEMV's parts and tiles).
__device__ __forceinline__ float sum_parts(const float* parts, int split) {
  float acc = parts[0];
#pragma unroll
  for (int s = 1; s < split; ++s) acc += parts[s];
  return acc;
}

/// The warp's kM values per lane (kM a power of two, at most 32) summed over the 32 lanes: at each
/// xor offset 16, 8, .. a lane keeps half of its values and adds its partner's copy of that half
/// (while halves remain; then the plain butterfly), so every sum is bit for bit warp_sum's of that
/// value. On return v[0] of lane l is value l / (32 / kM)'s sum.
template <int kM, int kLen, int kO>
__device__ __forceinline__ void warp_reduce_scatter_from(float (&v)[kM], int lane) {
  if constexpr (kO >= 1) {
    if constexpr (kLen >= 2) {
      constexpr int kHalf = kLen / 2;
      const bool upper = (lane & kO) != 0;
#pragma unroll
      for (int i = 0; i < kHalf; ++i) {
        const float send = upper ? v[i] : v[i + kHalf];
        const float keep = upper ? v[i + kHalf] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kO);
      }
      warp_reduce_scatter_from<kM, kHalf, kO / 2>(v, lane);
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], kO);
      warp_reduce_scatter_from<kM, 1, kO / 2>(v, lane);
    }
  }
}
template <int kM>
__device__ __forceinline__ void warp_reduce_scatter(float (&v)[kM], int lane) {
  static_assert(kM >= 1 && kM <= kWarp && (kM & (kM - 1)) == 0, "kM: a power of two up to 32");
  warp_reduce_scatter_from<kM, kM, kWarp / 2>(v, lane);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ unsigned long long warp_max_u64(unsigned long long v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xffffffffu, v, o);
    v = other > v ? other : v;
  }
  return v;
}

__device__ __forceinline__ uint32_t order_preserving_u32(float v) {
  if (v == 0.0f) v = 0.0f;
  const uint32_t bits = __float_as_uint(v);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}
__device__ __forceinline__ float from_order_preserving_u32(uint32_t o) {
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}
__device__ __forceinline__ unsigned long long argmax_key(float v, int32_t index) {
  return (static_cast<unsigned long long>(order_preserving_u32(v)) << 32) |
         static_cast<unsigned long long>(~static_cast<uint32_t>(index));
}

/// Round-to-nearest-even to BF16 (same result as mtplab::to_bf16 on finite values).
__device__ __forceinline__ bf16 f_to_bf16(float f) {
  const __nv_bfloat16 h = __float2bfloat16_rn(f);
  return bf16{__bfloat16_as_ushort(h)};
}
__device__ __forceinline__ float round_to_bf16(float f) { return bf16_to_f(f_to_bf16(f)); }

/// Slot of logical row p of a paged latent cache: block_table[p / block_size] * block_size +
/// p % block_size (the CPU's cache_slot, unchecked: a kernel cannot throw).
__device__ __forceinline__ int64_t kv_slot(const int32_t* block_table, int32_t p, int block_size) {
  return static_cast<int64_t>(block_table[p / block_size]) * block_size + p % block_size;
}
/// The FP8 latent cache's code of a (BF16-valued) v: E4M3(v / scale), a true division, RNE and
/// satfinite, as the CPU's to_fp8e4m3(v / scale). Every writer of an FP8 cache row uses this.
__device__ __forceinline__ uint8_t kv_fp8_code(float v, float scale) {
  return __nv_cvt_float_to_fp8(v / scale, __NV_SATFINITE, __NV_E4M3);
}

}  // namespace mtplab::ops::cuda
