// The norms, one block per row (the CPU reference: cpu/norm.cpp).
// - One row: layernorm (a scalar kernel, or a register-resident one with 16-byte loads, below);
//   rmsnorm, embed_rmsnorm and residual_add_rmsnorm run the batched row kernels at one row.
// - Batched rows, every row of the batch in one launch:
//   - embed_rmsnorm_batch (slot op): the table row of tokens[b] normed into row b of y; a padded row
//     reads neither its token nor the table.
//   - rmsnorm_strided, residual_add_rmsnorm_rows (row ops): each row from its own input row.
//
// Invariants: the norm code is batch_common.cuh's (register-resident when every row qualifies,
// scalar otherwise), the CPU reference's operation order element by element, with explicit
// round-to-nearest intrinsics after the reduction (no FMA contraction); the sums of squares differ
// from the CPU only in order. The batched row kernels' x and y may alias row for row: every element
// is read by the thread that writes it, before it writes it.
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "ops/cuda/batch_common.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/device_common.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/norm.hpp"

namespace mtplab::ops::cuda {

// ==== one row ==========================================================================================

namespace {

// The device helpers the batched kernels share (ops/cuda/batch_common.cuh).
using batch::layernorm_row_scalar;
using batch::layernorm_row_vec;
using batch::row_vecs;
using batch::StoreOctets;
using batch::with_vecs;

constexpr int kNormThreads = 256;

__global__ void __launch_bounds__(kNormThreads)
    layernorm_kernel(const bf16* x, const bf16* w, const bf16* b, bf16* y, int n, float eps) {
  pdl_begin();
  const size_t off = static_cast<size_t>(blockIdx.x) * n;
  bf16* yr = y + off;
  layernorm_row_scalar(x + off, w, b, n, eps, [&](int i, bf16 v) { yr[i] = v; });
}

// ---- register-resident norms (16-byte loads) ------------------------------------------------------
//
// The scalar kernel above walks a row with one 2-byte load per iteration; its loop-carried
// dependency made a 4096-wide norm cost ~14 us (16 dependent memory round trips per pass, two
// passes). This one loads the whole row into registers with one 16-byte load per 8 elements (the
// row helpers of batch_common.cuh), keeps it there for the second pass, and stores 16 bytes at a
// time. Used when n is a multiple of 8, n <= kVecNormThreads * 8 * batch::kMaxRowVecs, and every
// pointer is 16-byte aligned. RMSNorm runs the batched row kernels (below) at one row, the norms fused
// with a cache store those of mla.cu and indexer.cu.

constexpr int kVecNormThreads = batch::kRowThreads;  // load_octets' stride

template <int V>
__global__ void __launch_bounds__(kVecNormThreads)
    layernorm_vec_kernel(const bf16* x, const bf16* w, const bf16* b, bf16* y, int n, float eps) {
  pdl_begin();
  const size_t off = static_cast<size_t>(blockIdx.x) * n;
  layernorm_row_vec<V>(x + off, w, b, n, eps, StoreOctets{y + off});
}

}  // namespace

void rmsnorm(const LaunchCtx& ctx, const bf16* x, const bf16* w, bf16* y, int rows, int n, float eps) {
  MTP_REQUIRE(rows >= 1 && n >= 1, "ops::cuda::rmsnorm: rows ", rows, ", n ", n);
  rmsnorm_strided(ctx, x, n, w, y, n, rows, n, eps);  // the row kernel (below)
}

void embed_rmsnorm(const LaunchCtx& ctx, const bf16* table, const int32_t* token, const bf16* w, bf16* y,
                   int n, float eps) {
  MTP_REQUIRE(n >= 1, "ops::cuda::embed_rmsnorm: n ", n);
  embed_rmsnorm_batch(ctx, table, token, nullptr, w, y, n, 1, n, eps);  // the row kernel, one live row
}

void layernorm(const LaunchCtx& ctx, const bf16* x, const bf16* w, const bf16* b, bf16* y, int rows, int n,
               float eps) {
  MTP_REQUIRE(rows >= 1 && n >= 1, "ops::cuda::layernorm: rows ", rows, ", n ", n);
  with_vecs(row_vecs(n, {x, w, b, y}), [&](auto V) {
    if constexpr (decltype(V)::value > 0) {
      launch(ctx, layernorm_vec_kernel<decltype(V)::value>, rows, kVecNormThreads, 0, x, w, b, y, n, eps);
    } else {
      launch(ctx, layernorm_kernel, rows, kNormThreads, 0, x, w, b, y, n, eps);
    }
  });
  MTP_CUDA_LAUNCH_CHECK();
}

void residual_add_rmsnorm(const LaunchCtx& ctx, const bf16* x, const float* delta, bf16* y, const bf16* w,
                          bf16* normed, int n, float eps) {
  MTP_REQUIRE(n >= 1, "ops::cuda::residual_add_rmsnorm: n ", n);
  residual_add_rmsnorm_rows(ctx, x, delta, y, w, normed, 1, n, eps);  // the row kernel (below)
}

// ==== batched rows =====================================================================================

namespace {

using batch::kRowThreads;

/// rmsnorm of row x into y through the path V (0: scalar, 1..4: octets per thread).
template <int V>
__device__ __forceinline__ void rmsnorm_into(const bf16* x, const bf16* w, bf16* y, int n, float eps) {
  if constexpr (V == 0) {
    batch::rmsnorm_row_scalar(x, w, n, eps, batch::StoreElems{y});
  } else {
    batch::rmsnorm_row_vec<V>(x, w, n, eps, batch::StoreOctets{y});
  }
}

template <int V>
__global__ void __launch_bounds__(kRowThreads)
    embed_rmsnorm_batch_kernel(const bf16* table, const int32_t* tokens, const int32_t* slot, const bf16* w,
                               bf16* y, int ld_y, int n, float eps) {
  pdl_begin();
  const int b = blockIdx.x;
  if (slot && slot[b] < 0) return;  // padded row: its token is not read (no slots: every row is live)
  const bf16* x = table + static_cast<size_t>(tokens[b]) * n;
  rmsnorm_into<V>(x, w, y + static_cast<size_t>(b) * ld_y, n, eps);
}

template <int V>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_strided_kernel(const bf16* x, int ld_x, const bf16* w, bf16* y, int ld_y, int n, float eps) {
  pdl_begin();
  const size_t b = blockIdx.x;
  rmsnorm_into<V>(x + b * ld_x, w, y + b * ld_y, n, eps);
}

/// y = bf16(x + delta) (written), then normed = rmsnorm(y), for row blockIdx.x.
template <int V>
__global__ void __launch_bounds__(kRowThreads)
    residual_add_rmsnorm_rows_kernel(const bf16* x, const float* delta, bf16* y, const bf16* w, bf16* normed,
                                     int n, float eps) {
  pdl_begin();
  const size_t off = static_cast<size_t>(blockIdx.x) * n;
  x += off;
  delta += off;
  y += off;
  normed += off;
  if constexpr (V == 0) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const bf16 yi = f_to_bf16(__fadd_rn(bf16_to_f(x[i]), delta[i]));
      y[i] = yi;
      const float v = bf16_to_f(yi);
      ss = fmaf(v, v, ss);
    }
    const float r = batch::inv_root_mean(ss, n, eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
      normed[i] = f_to_bf16(__fmul_rn(bf16_to_f(w[i]), __fmul_rn(bf16_to_f(y[i]), r)));
  } else {
    const int nv = n / 8;
    uint4 xr[V], wr[V];
    float4 da[V], db[V];
    batch::load_octets<V>(x, nv, xr);
    batch::load_octets<V>(w, nv, wr);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int v = threadIdx.x + j * kRowThreads;
      const bool in = v < nv;
      const float4* d4 = reinterpret_cast<const float4*>(delta) + 2 * static_cast<size_t>(v);
      da[j] = in ? __ldg(d4) : make_float4(0, 0, 0, 0);
      db[j] = in ? __ldg(d4 + 1) : make_float4(0, 0, 0, 0);
    }
    float yv[V][8];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float f[8];
      batch::unpack8(xr[j], f);
      const float d[8] = {da[j].x, da[j].y, da[j].z, da[j].w, db[j].x, db[j].y, db[j].z, db[j].w};
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        yv[j][e] = round_to_bf16(__fadd_rn(f[e], d[e]));
        ss = fmaf(yv[j][e], yv[j][e], ss);
      }
    }
    const float r = batch::inv_root_mean(ss, n, eps);
    batch::for_octets<V>(nv, [&](int j, int v) {
      *reinterpret_cast<uint4*>(y + static_cast<size_t>(v) * 8) = batch::pack8(yv[j]);
      float g[8], o[8];
      batch::unpack8(wr[j], g);
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = __fmul_rn(g[e], __fmul_rn(yv[j][e], r));
      *reinterpret_cast<uint4*>(normed + static_cast<size_t>(v) * 8) = batch::pack8(o);
    });
  }
}

}  // namespace

void embed_rmsnorm_batch(const LaunchCtx& ctx, const bf16* table, const int32_t* tokens, const int32_t* slot,
                         const bf16* w, bf16* y, int ld_y, int rows, int n, float eps) {
  // Table rows start at token * n: aligned when the table is and n is a whole number of octets.
  const int v = batch::row_vecs(n, {table, w, y}, {n, ld_y});
  batch::with_vecs(v, [&](auto V) {
    launch(ctx, embed_rmsnorm_batch_kernel<decltype(V)::value>, rows, kRowThreads, 0, table, tokens, slot, w,
           y, ld_y, n, eps);
  });
  MTP_CUDA_LAUNCH_CHECK();
}

void rmsnorm_strided(const LaunchCtx& ctx, const bf16* x, int ld_x, const bf16* w, bf16* y, int ld_y,
                     int rows, int n, float eps) {
  const int v = batch::row_vecs(n, {x, w, y}, {ld_x, ld_y});
  batch::with_vecs(v, [&](auto V) {
    launch(ctx, rmsnorm_strided_kernel<decltype(V)::value>, rows, kRowThreads, 0, x, ld_x, w, y, ld_y, n,
           eps);
  });
  MTP_CUDA_LAUNCH_CHECK();
}

void residual_add_rmsnorm_rows(const LaunchCtx& ctx, const bf16* x, const float* delta, bf16* y,
                               const bf16* w, bf16* normed, int rows, int n, float eps) {
  // delta's rows are n floats: 16-byte aligned row starts when n % 4 == 0 (n % 8 == 0 here).
  const int v = batch::row_vecs(n, {x, delta, y, w, normed}, {n});
  batch::with_vecs(v, [&](auto V) {
    launch(ctx, residual_add_rmsnorm_rows_kernel<decltype(V)::value>, rows, kRowThreads, 0, x, delta, y, w,
           normed, n, eps);
  });
  MTP_CUDA_LAUNCH_CHECK();
}

}  // namespace mtplab::ops::cuda
