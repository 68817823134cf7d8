// Absorbed sparse MLA over the paged latent cache: the latent row write (BF16 / FP8), the query
// absorption q_abs = W_k^T q, and the split-row decode with its combine. mla_out_v is a GEMV
// over W_kvb's V rows (kernels_gemv.cu, through a row map).
//
// Invariants:
// - Row t lives at slot block_table[t / block_size] * block_size + t % block_size (the CPU
//   reference's cache_slot); a kernel cannot throw, so block ids are trusted here and checked by
//   the CPU reference in tests.
// - FP8 cache: stored as E4M3(x / scale) with a true division and RNE + satfinite, read back as
//   float(fp8) * scale: bit-identical to the CPU.
// - Decode: one block per (head, row split), each warp an online softmax over its rows in fp32,
//   merged with max-rescaling inside the block and then across splits; o_lat is rounded to BF16
//   once, after dividing by the softmax denominator, as the CPU does. No selected rows -> zeros.
#include <algorithm>
#include <cmath>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/device_common.cuh"
#include "ops/cuda/kernels.hpp"

namespace mtplab::ops::cuda {
namespace {

// ---- kv_write -----------------------------------------------------------------------------------------

__global__ void kv_write_kernel(const bf16* c_kv, const int32_t* block_table, const int32_t* pos, void* data,
                                bool fp8, float scale, int block_size, int kv_lora) {
  const int32_t p = pos[0];
  const int64_t slot = static_cast<int64_t>(block_table[p / block_size]) * block_size + p % block_size;
  const size_t base = static_cast<size_t>(slot) * kv_lora;
  for (int c = threadIdx.x; c < kv_lora; c += blockDim.x) {
    if (fp8) {
      const __nv_fp8_storage_t v =
          __nv_cvt_float_to_fp8(bf16_to_f(c_kv[c]) / scale, __NV_SATFINITE, __NV_E4M3);
      static_cast<uint8_t*>(data)[base + c] = v;
    } else {
      static_cast<bf16*>(data)[base + c] = c_kv[c];
    }
  }
}

// ---- absorb_q -----------------------------------------------------------------------------------------

constexpr int kAbsorbThreads = 256;
constexpr int kAbsorbCols = 64;                                    // columns per block: 8 threads x 8 BF16
constexpr int kAbsorbGroups = kAbsorbThreads / (kAbsorbCols / 8);  // 32 row groups over d
constexpr int kAbsorbUnroll = 8;

/// q_abs[h, c] = bf16(sum_d W_kvb[h*(dqk+dv) + d, c] * q[h, d]). Block (h, column tile): 32 row
/// groups each stream rows d = g, g+32, ... of the tile with 16-byte loads, then a fixed-order sum.
__global__ void __launch_bounds__(kAbsorbThreads)
    absorb_q_kernel(const bf16* q, const bf16* W_kvb, bf16* q_abs, int dqk, int dv, int kv_lora) {
  __shared__ float red[kAbsorbGroups][kAbsorbCols + 1];
  const int h = blockIdx.x;
  const int col8 = threadIdx.x % (kAbsorbCols / 8);
  const int g = threadIdx.x / (kAbsorbCols / 8);
  const int col = blockIdx.y * kAbsorbCols + col8 * 8;
  float acc[8] = {};
  if (col < kv_lora) {
    const bf16* Wk = W_kvb + static_cast<size_t>(h) * (dqk + dv) * kv_lora + col;
    const bf16* qh = q + static_cast<size_t>(h) * dqk;
    for (int d0 = g; d0 < dqk; d0 += kAbsorbGroups * kAbsorbUnroll) {
      uint4 wv[kAbsorbUnroll];
      float qd[kAbsorbUnroll];
#pragma unroll
      for (int u = 0; u < kAbsorbUnroll; ++u) {
        const int d = d0 + u * kAbsorbGroups;
        wv[u] = d < dqk ? load_stream(Wk + static_cast<size_t>(d) * kv_lora) : make_uint4(0, 0, 0, 0);
        qd[u] = d < dqk ? bf16_to_f(qh[d]) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kAbsorbUnroll; ++u) {
        const uint32_t w4[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          acc[2 * j] = fmaf(bf16_lo(w4[j]), qd[u], acc[2 * j]);
          acc[2 * j + 1] = fmaf(bf16_hi(w4[j]), qd[u], acc[2 * j + 1]);
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) red[g][col8 * 8 + j] = acc[j];
  __syncthreads();
  if (threadIdx.x < kAbsorbCols) {
    const int c = blockIdx.y * kAbsorbCols + threadIdx.x;
    if (c < kv_lora) {
      float s = 0.0f;
      for (int gg = 0; gg < kAbsorbGroups; ++gg) s += red[gg][threadIdx.x];
      q_abs[static_cast<size_t>(h) * kv_lora + c] = f_to_bf16(s);
    }
  }
}

// ---- decode -------------------------------------------------------------------------------------------

constexpr int kDecodeThreads = 256;
constexpr int kDecodeWarps = kDecodeThreads / kWarp;
constexpr int kDecodeRows = 4;  // rows in flight per warp

/// This lane's kCpl consecutive latent values of a cache row, as fp32 (FP8: times the scale).
template <int kCpl, bool kFp8>
__device__ __forceinline__ void load_latent(const void* row, float scale, float (&v)[kCpl]) {
  if constexpr (!kFp8) {
    const bf16* p = static_cast<const bf16*>(row);
    uint32_t w[kCpl / 2];
    if constexpr (kCpl % 8 == 0) {
#pragma unroll
      for (int q = 0; q < kCpl / 8; ++q) {
        const uint4 u = __ldg(reinterpret_cast<const uint4*>(p) + q);
        w[4 * q] = u.x;
        w[4 * q + 1] = u.y;
        w[4 * q + 2] = u.z;
        w[4 * q + 3] = u.w;
      }
    } else if constexpr (kCpl == 4) {
      const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
      w[0] = u.x;
      w[1] = u.y;
    } else {
      w[0] = __ldg(reinterpret_cast<const unsigned int*>(p));
    }
#pragma unroll
    for (int j = 0; j < kCpl / 2; ++j) {
      v[2 * j] = bf16_lo(w[j]);
      v[2 * j + 1] = bf16_hi(w[j]);
    }
  } else {
    const uint8_t* p = static_cast<const uint8_t*>(row);
    uint32_t w[(kCpl + 3) / 4];
    if constexpr (kCpl % 16 == 0) {
#pragma unroll
      for (int q = 0; q < kCpl / 16; ++q) {
        const uint4 u = __ldg(reinterpret_cast<const uint4*>(p) + q);
        w[4 * q] = u.x;
        w[4 * q + 1] = u.y;
        w[4 * q + 2] = u.z;
        w[4 * q + 3] = u.w;
      }
    } else if constexpr (kCpl == 8) {
      const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
      w[0] = u.x;
      w[1] = u.y;
    } else if constexpr (kCpl == 4) {
      w[0] = __ldg(reinterpret_cast<const unsigned int*>(p));
    } else {
      w[0] = __ldg(reinterpret_cast<const unsigned short*>(p));
    }
#pragma unroll
    for (int j = 0; j < kCpl / 2; ++j) {
      const float2 f = fp8x2_to_float2(w[j / 2] >> (16 * (j % 2)));
      v[2 * j] = __fmul_rn(f.x, scale);
      v[2 * j + 1] = __fmul_rn(f.y, scale);
    }
  }
}

struct DecodeParams {
  const bf16* q_abs;
  const int32_t* selection;
  int width;
  const int32_t* block_table;
  const void* cache;
  float cache_scale;
  int block_size;
  int kv_lora;
  int n_heads;
  float softmax_scale;
  int splits;
  float* scratch;  // [n_heads][splits][2 + kv_lora]: m, l, acc
  bf16* o_lat;
};

/// Block (h, split): an online softmax per warp over its rows of the split, merged in shared
/// memory; the block's (max, denominator, weighted sum) goes to scratch.
template <int kCpl, bool kFp8>
__global__ void __launch_bounds__(kDecodeThreads) mla_decode_kernel(DecodeParams p) {
  __shared__ float s_m[kDecodeWarps];
  __shared__ float s_l[kDecodeWarps];
  extern __shared__ float4 s_acc_vec[];  // [kDecodeWarps][kv_lora] floats
  float* s_acc = reinterpret_cast<float*>(s_acc_vec);
  const int h = blockIdx.x;
  const int split = blockIdx.y;
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int L = p.kv_lora;
  const int per_split = (p.width + p.splits - 1) / p.splits;
  const int i0 = split * per_split;
  const int i1 = min(p.width, i0 + per_split);
  const size_t elem = kFp8 ? 1 : 2;

  float q[kCpl];
  {
    const bf16* qh = p.q_abs + static_cast<size_t>(h) * L + lane * kCpl;
#pragma unroll
    for (int j = 0; j < kCpl; ++j) q[j] = bf16_to_f(qh[j]);
  }
  float acc[kCpl] = {};
  float m = -INFINITY;
  float l = 0.0f;
  for (int i = i0 + warp; i < i1; i += kDecodeWarps * kDecodeRows) {
    float v[kDecodeRows][kCpl];
    bool ok[kDecodeRows];
#pragma unroll
    for (int r = 0; r < kDecodeRows; ++r) {
      const int ii = i + r * kDecodeWarps;
      const int32_t t = ii < i1 ? p.selection[ii] : -1;
      ok[r] = t >= 0;
      if (ok[r]) {
        const int64_t slot =
            static_cast<int64_t>(p.block_table[t / p.block_size]) * p.block_size + t % p.block_size;
        const uint8_t* row =
            static_cast<const uint8_t*>(p.cache) + (static_cast<size_t>(slot) * L + lane * kCpl) * elem;
        load_latent<kCpl, kFp8>(row, p.cache_scale, v[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kDecodeRows; ++r) {
      if (!ok[r]) continue;  // uniform across the warp: t is the same for every lane
      float s = 0.0f;
#pragma unroll
      for (int j = 0; j < kCpl; ++j) s = fmaf(q[j], v[r][j], s);
      s = p.softmax_scale * warp_sum(s);
      const float m_new = fmaxf(m, s);
      const float corr = expf(m - m_new);
      const float e = expf(s - m_new);
      l = l * corr + e;
#pragma unroll
      for (int j = 0; j < kCpl; ++j) acc[j] = fmaf(e, v[r][j], acc[j] * corr);
      m = m_new;
    }
  }
  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l;
  }
#pragma unroll
  for (int j = 0; j < kCpl; ++j) s_acc[warp * L + lane * kCpl + j] = acc[j];
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kDecodeWarps; ++w) M = fmaxf(M, s_m[w]);
  float* out = p.scratch + (static_cast<size_t>(h) * p.splits + split) * (2 + L);
  float f[kDecodeWarps];
#pragma unroll
  for (int w = 0; w < kDecodeWarps; ++w) f[w] = (M == -INFINITY) ? 0.0f : expf(s_m[w] - M);
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kDecodeWarps; ++w) total += s_l[w] * f[w];
    out[0] = M;
    out[1] = total;
  }
  for (int c = threadIdx.x; c < L; c += blockDim.x) {
    float a = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) a = fmaf(s_acc[w * L + c], f[w], a);
    out[2 + c] = a;
  }
}

/// o_lat[h] = bf16(sum_s acc_s e^{m_s - M} / sum_s l_s e^{m_s - M}); zeros when no row was selected.
__global__ void mla_combine_kernel(const float* scratch, int splits, int kv_lora, bf16* o_lat) {
  const int h = blockIdx.x;
  const float* part = scratch + static_cast<size_t>(h) * splits * (2 + kv_lora);
  float M = -INFINITY;
  for (int s = 0; s < splits; ++s) M = fmaxf(M, part[s * (2 + kv_lora)]);
  float denom = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float ms = part[s * (2 + kv_lora)];
    if (ms != -INFINITY) denom += part[s * (2 + kv_lora) + 1] * expf(ms - M);
  }
  for (int c = threadIdx.x; c < kv_lora; c += blockDim.x) {
    float a = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float ms = part[s * (2 + kv_lora)];
      if (ms != -INFINITY) a = fmaf(part[s * (2 + kv_lora) + 2 + c], expf(ms - M), a);
    }
    o_lat[static_cast<size_t>(h) * kv_lora + c] = denom > 0.0f ? f_to_bf16(a / denom) : bf16{0};
  }
}

template <int kCpl, bool kFp8>
void launch_decode(const LaunchCtx& ctx, const DecodeParams& p) {
  const size_t smem = sizeof(float) * kDecodeWarps * static_cast<size_t>(p.kv_lora);
  static const bool configured = [smem] {
    MTP_CUDA_CHECK(cudaFuncSetAttribute(mla_decode_kernel<kCpl, kFp8>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    return true;
  }();
  (void)configured;
  mla_decode_kernel<kCpl, kFp8><<<dim3(p.n_heads, p.splits), kDecodeThreads, smem, ctx.stream>>>(p);
  MTP_CUDA_LAUNCH_CHECK();
}

}  // namespace

void kv_write(const LaunchCtx& ctx, const bf16* c_kv, const int32_t* block_table, const int32_t* pos,
              const KvCache& cache) {
  MTP_REQUIRE(cache.data && cache.block_size >= 1 && cache.kv_lora >= 1, "ops::cuda::kv_write: bad cache");
  kv_write_kernel<<<1, 256, 0, ctx.stream>>>(c_kv, block_table, pos, cache.data, cache.dtype == KvDtype::fp8,
                                             cache.scale, cache.block_size, cache.kv_lora);
  MTP_CUDA_LAUNCH_CHECK();
}

void mla_absorb_q(const LaunchCtx& ctx, const bf16* q, const bf16* W_kvb, bf16* q_abs, int n_heads, int dqk,
                  int dv, int kv_lora) {
  MTP_REQUIRE(n_heads >= 1 && dqk >= 1 && dv >= 0 && kv_lora >= 8 && kv_lora % 8 == 0,
              "ops::cuda::mla_absorb_q: n_heads ", n_heads, ", dqk ", dqk, ", dv ", dv, ", kv_lora ", kv_lora,
              " (kv_lora must be a multiple of 8)");
  MTP_REQUIRE(reinterpret_cast<uintptr_t>(W_kvb) % 16 == 0,
              "ops::cuda::mla_absorb_q: W_kvb not 16-byte aligned");
  const dim3 grid(n_heads, (kv_lora + kAbsorbCols - 1) / kAbsorbCols);
  absorb_q_kernel<<<grid, kAbsorbThreads, 0, ctx.stream>>>(q, W_kvb, q_abs, dqk, dv, kv_lora);
  MTP_CUDA_LAUNCH_CHECK();
}

int mla_decode_splits(const LaunchCtx& ctx, int width, int n_heads) {
  const int want = (2 * ctx.num_sms + n_heads - 1) / n_heads;
  return std::max(1, std::min(want, width / 64));
}

size_t mla_decode_scratch_floats(int splits, int n_heads, int kv_lora) {
  return static_cast<size_t>(splits) * n_heads * (2 + static_cast<size_t>(kv_lora));
}

void mla_decode(const LaunchCtx& ctx, const bf16* q_abs, const int32_t* selection, int width,
                const int32_t* block_table, const KvCache& cache, bf16* o_lat, int n_heads,
                float softmax_scale, int splits, float* scratch) {
  const int L = cache.kv_lora;
  MTP_REQUIRE(L == 64 || L == 128 || L == 256 || L == 512, "ops::cuda::mla_decode: kv_lora ", L,
              " is not supported (64, 128, 256 or 512: each lane holds kv_lora/32 latent values)");
  MTP_REQUIRE(cache.data && cache.block_size >= 1 && n_heads >= 1 && width >= 0 && splits >= 1,
              "ops::cuda::mla_decode: bad arguments");
  DecodeParams p{q_abs, selection, width,         block_table, cache.data, cache.scale, cache.block_size,
                 L,     n_heads,   softmax_scale, splits,      scratch,    o_lat};
  const bool fp8 = cache.dtype == KvDtype::fp8;
  switch (L / 32) {
    case 2:
      fp8 ? launch_decode<2, true>(ctx, p) : launch_decode<2, false>(ctx, p);
      break;
    case 4:
      fp8 ? launch_decode<4, true>(ctx, p) : launch_decode<4, false>(ctx, p);
      break;
    case 8:
      fp8 ? launch_decode<8, true>(ctx, p) : launch_decode<8, false>(ctx, p);
      break;
    default:
      fp8 ? launch_decode<16, true>(ctx, p) : launch_decode<16, false>(ctx, p);
      break;
  }
  mla_combine_kernel<<<n_heads, 256, 0, ctx.stream>>>(scratch, splits, L, o_lat);
  MTP_CUDA_LAUNCH_CHECK();
}

}  // namespace mtplab::ops::cuda
