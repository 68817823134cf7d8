// The decode chunk step of absorbed sparse MLA, shared by every decode kernel (v1, v2 and the
// shared kernels: mla.cu, mla_shared.cuh): every path runs exactly these helpers on a chunk of
// selected rows, so their arithmetic per chunk is the same.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/batch_common.cuh"
#include "ops/cuda/device_common.cuh"

namespace mtplab::ops::cuda::mla {

using batch::mma_16816;
using batch::pack_bf16x2;

// ---- decode ----------------------------------------------------------------------------------------
//
// The n_heads queries share the selected latent rows, so the decode is two small matrix products
// per chunk of 16 rows: S = Q C^T (heads x rows) and O += P C (heads x kv_lora), on the tensor
// cores (mma.sync m16n8k16, BF16 in, fp32 accumulate). Block (head tile of 16, row split), 4
// warps; warp w owns columns [w*L/4, (w+1)*L/4) of kv_lora: it stages only its slice of each row
// in shared memory, computes its partial S, and the 4 partials are summed in a fixed order (every
// warp gets the same S, hence the same softmax). The rows of chunk i+1 (selection -> block table
// -> 16-byte loads, a chain of three memory latencies) are fetched into registers while chunk i
// is computed. Precision is the CPU's up to summation order:
// BF16 x BF16 products are exact in fp32; an FP8 row is widened to BF16 exactly (E4M3 fits) and
// its scale applied to the fp32 sums; the fp32 probabilities are split into BF16 hi + lo parts
// (two MMAs), which carries them to ~2^-17 relative, far below the final BF16 rounding.

constexpr int kDecodeWarps = 4;
constexpr int kDecodeThreads = kDecodeWarps * kWarp;
constexpr int kHeadTile = 16;  // heads per block: the MMA's M
constexpr int kChunk = 16;     // selected rows per step: two n8 tiles of S, one k16 step of P C
// The v2 decode's (mla.cu, "decode v2"; its split rule: dispatch.cu).
constexpr int kCluster = 8;          // splits per thread-block cluster (the portable maximum)
constexpr int kMaxSplitChunks = 32;  // chunks one split may own (the slot table's size)

/// a ~= hi + lo with hi = bf16(a), lo = bf16(a - hi), for a pair of values.
__device__ __forceinline__ void split_bf16x2(float a0, float a1, uint32_t& hi, uint32_t& lo) {
  hi = pack_bf16x2(a0, a1);
  lo = pack_bf16x2(a0 - bf16_lo(hi), a1 - bf16_hi(hi));
}

/// 8 E4M3 values (two u32, low byte first) as 8 BF16 (exact).
__device__ __forceinline__ uint4 fp8x8_to_bf16x8(uint2 f) {
  const float2 a = fp8x2_to_float2(f.x), b = fp8x2_to_float2(f.x >> 16);
  const float2 c = fp8x2_to_float2(f.y), d = fp8x2_to_float2(f.y >> 16);
  return make_uint4(pack_bf16x2(a.x, a.y), pack_bf16x2(b.x, b.y), pack_bf16x2(c.x, c.y),
                    pack_bf16x2(d.x, d.y));
}

/// ldmatrix .x4 (and its transposed form) of four 8 x 8 BF16 matrices from shared memory: the
/// MMA fragments of the decodes' and of absorb_q's tensor-core kernels.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// The chunk step both decode kernels share: the warp's Q fragments, its partial scores S = Q C^T,
// their exchange and fixed-order sum over the 4 warps, the online softmax, and O += P C. Both
// kernels run exactly these helpers on a chunk, so their arithmetic per chunk is the same.

/// Q as the MMA's A operand (row-major heads x columns): this warp's kKSteps x 16 columns from col0
/// of q_abs rows h0 + g (lo) and h0 + g + 8 (hi), row stride L; zeros for heads past n_heads.
template <int kKSteps>
__device__ __forceinline__ void load_q_fragments(const bf16* q_abs, int h0, int g, int t, int L, int col0,
                                                 bool lo_ok, bool hi_ok, uint32_t (&qa)[kKSteps][4]) {
  const uint32_t* q_lo = reinterpret_cast<const uint32_t*>(q_abs + static_cast<size_t>(h0 + g) * L + col0);
  const uint32_t* q_hi =
      reinterpret_cast<const uint32_t*>(q_abs + static_cast<size_t>(h0 + g + 8) * L + col0);
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    const int c2 = (ks * 16 + 2 * t) / 2;
    qa[ks][0] = lo_ok ? q_lo[c2] : 0u;
    qa[ks][1] = hi_ok ? q_hi[c2] : 0u;
    qa[ks][2] = lo_ok ? q_lo[c2 + 4] : 0u;
    qa[ks][3] = hi_ok ? q_hi[c2 + 4] : 0u;
  }
}

/// This warp's partial S over its columns for one chunk, added into sc: `rows` is the warp's staged
/// BF16 slice of the chunk's 16 rows, kRowStride elements apart; tile j holds rows 8j .. 8j+7.
template <int kKSteps, int kRowStride>
__device__ __forceinline__ void chunk_scores(const uint16_t* rows, const uint32_t (&qa)[kKSteps][4], int g,
                                             int t, float (&sc)[2][4]) {
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint16_t* rb = rows + (8 * j + g) * kRowStride + ks * 16 + 2 * t;
      mma_16816(sc[j], qa[ks], *reinterpret_cast<const uint32_t*>(rb),
                *reinterpret_cast<const uint32_t*>(rb + 8));
    }
  }
}

/// The warps' partial scores of one chunk, [warp][head row][chunk row]. Rows of 24 floats: the
/// 8-byte accesses of a half-warp (rows g .. g + 3, 8 words each) fall in distinct banks.
constexpr int kScoreStride = kChunk + 8;
using ScoreExchange = float[kDecodeWarps][kHeadTile][kScoreStride];

/// This warp's partial scores (the m16n8 accumulator layout: [0..1] row g, [2..3] row g + 8) into
/// its slot of the exchange; a barrier must follow before sum_scores reads them.
__device__ __forceinline__ void stage_scores(ScoreExchange& score, int warp, int g, int t,
                                             const float (&sc)[2][4]) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    *reinterpret_cast<float2*>(&score[warp][g][8 * j + 2 * t]) = make_float2(sc[j][0], sc[j][1]);
    *reinterpret_cast<float2*>(&score[warp][g + 8][8 * j + 2 * t]) = make_float2(sc[j][2], sc[j][3]);
  }
}

/// The chunk's full scores in this thread's accumulator positions: the 4 warps' partials summed in
/// warp order, times the FP8 cache scale, times softmax_scale; -inf for rows not selected (bit r of
/// valid_rows: chunk row r).
template <bool kFp8>
__device__ __forceinline__ void sum_scores(const ScoreExchange& score, int g, int t, unsigned valid_rows,
                                           float cache_scale, float softmax_scale, float (&s)[2][4]) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    float2 part[kDecodeWarps][2];
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) {
      part[w][0] = *reinterpret_cast<const float2*>(&score[w][g][8 * j + 2 * t]);
      part[w][1] = *reinterpret_cast<const float2*>(&score[w][g + 8][8 * j + 2 * t]);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = 8 * j + 2 * t + (e & 1);
      auto at = [&](int w) { return (e & 1) ? part[w][e >> 1].y : part[w][e >> 1].x; };
      float sum = at(0);
#pragma unroll
      for (int w = 1; w < kDecodeWarps; ++w) sum += at(w);
      const bool valid = (valid_rows >> col) & 1u;
      if constexpr (kFp8) sum *= cache_scale;
      s[j][e] = valid ? softmax_scale * sum : -INFINITY;
    }
  }
}

/// o *= the rescale factor of its head row (corr_lo: row g, corr_hi: row g + 8), the whole warp.
/// Where no row of the warp's tile raised its max (corr == 1 everywhere: the common case once the
/// first chunks are in), o *= 1 is the identity: skipping it leaves the bits as they are.
template <int kNTiles>
__device__ __forceinline__ void rescale_outputs(float (&o)[kNTiles][4], float corr_lo, float corr_hi) {
  if (__all_sync(0xffffffffu, corr_lo == 1.0f && corr_hi == 1.0f)) return;
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) {
    o[n][0] *= corr_lo;
    o[n][1] *= corr_lo;
    o[n][2] *= corr_hi;
    o[n][3] *= corr_hi;
  }
}

/// One chunk's online-softmax step of the decode (both paths): the quad-wide row max of the
/// chunk's scores s (the m16n8 accumulator layout: [0..1] row g, [2..3] row g + 8), the rescale of
/// the running max m, denominator l and output accumulators o, and P = exp(s - m) split into BF16
/// hi / lo A fragments for O += P C. -inf scores (padding) give P = 0.
template <int kNTiles>
__device__ __forceinline__ void online_softmax_step(const float (&s)[2][4], float& m_lo, float& m_hi,
                                                    float& l_lo, float& l_hi, float (&o)[kNTiles][4],
                                                    uint32_t (&ah)[4], uint32_t (&al)[4]) {
  float mx_lo = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
  float mx_hi = fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]));
  mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
  mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
  mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
  mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
  const float mn_lo = fmaxf(m_lo, mx_lo);
  const float mn_hi = fmaxf(m_hi, mx_hi);
  const float corr_lo = mn_lo == -INFINITY ? 1.0f : expf(m_lo - mn_lo);
  const float corr_hi = mn_hi == -INFINITY ? 1.0f : expf(m_hi - mn_hi);
  float pr[2][4];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float mn = e >= 2 ? mn_hi : mn_lo;
      pr[j][e] = s[j][e] == -INFINITY ? 0.0f : expf(s[j][e] - mn);
    }
  }
  l_lo = l_lo * corr_lo + ((pr[0][0] + pr[0][1]) + (pr[1][0] + pr[1][1]));
  l_hi = l_hi * corr_hi + ((pr[0][2] + pr[0][3]) + (pr[1][2] + pr[1][3]));
  m_lo = mn_lo;
  m_hi = mn_hi;
  rescale_outputs<kNTiles>(o, corr_lo, corr_hi);
  split_bf16x2(pr[0][0], pr[0][1], ah[0], al[0]);
  split_bf16x2(pr[0][2], pr[0][3], ah[1], al[1]);
  split_bf16x2(pr[1][0], pr[1][1], ah[2], al[2]);
  split_bf16x2(pr[1][2], pr[1][3], ah[3], al[3]);
}

/// O += P C over this warp's kNTiles column tiles: S's accumulator layout is P's A layout (k = chunk
/// row), in two MMAs (P's BF16 hi, then lo parts), B from the staged rows as in chunk_scores.
template <int kNTiles, int kRowStride>
__device__ __forceinline__ void accumulate_pv(const uint16_t* rows, const uint32_t (&ah)[4],
                                              const uint32_t (&al)[4], int g, int t, float (&o)[kNTiles][4]) {
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) {
    const int col = n * 8 + g;
    const uint32_t b0 = static_cast<uint32_t>(rows[(2 * t) * kRowStride + col]) |
                        (static_cast<uint32_t>(rows[(2 * t + 1) * kRowStride + col]) << 16);
    const uint32_t b1 = static_cast<uint32_t>(rows[(2 * t + 8) * kRowStride + col]) |
                        (static_cast<uint32_t>(rows[(2 * t + 9) * kRowStride + col]) << 16);
    mma_16816(o[n], ah, b0, b1);
    mma_16816(o[n], al, b0, b1);
  }
}

/// Sum over the 4 lanes of a quad (the MMA's t), the same on each of them.
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}

/// One decode launch: rows of q_abs [rows][n_heads][kv_lora] over their selections [rows][width]
/// (row ids of slot slot[b], read through that slot's block table; slot nullptr: every row reads
/// block_tables as its table), into o_lat, or into scratch partials when the rows are split.
struct DecodeParams {
  const bf16* q_abs;
  const int32_t* selection;
  int width;
  const int32_t* slot;
  const int32_t* block_tables;
  int max_blocks;
  const void* cache;
  float cache_scale;
  int block_size;
  int kv_lora;
  int n_heads;
  float softmax_scale;
  int splits;
  float* scratch;  // [rows][n_heads][partials][2 + kv_lora]: m, l, acc
  bf16* o_lat;
};

/// f(std::integral_constant<int, kv_lora / 4>{}, std::bool_constant<fp8>{}): a decode kernel's
/// instance for kv_lora 64, 128, 256 or 512 (the callers check it; anything else takes 512) and the
/// cache type.
template <typename F>
void with_decode_shape(int kv_lora, bool fp8, F&& f) {
  auto by_type = [&](auto cw) { fp8 ? f(cw, std::true_type{}) : f(cw, std::false_type{}); };
  if (kv_lora == 64) return by_type(std::integral_constant<int, 16>{});
  if (kv_lora == 128) return by_type(std::integral_constant<int, 32>{});
  if (kv_lora == 256) return by_type(std::integral_constant<int, 64>{});
  by_type(std::integral_constant<int, 128>{});
}

/// Row `row`'s inputs of a decode launch (kv_lora L): its q_abs rows, its selection and its
/// slot's block table.
struct DecodeRow {
  const bf16* q_abs;
  const int32_t* selection;
  const int32_t* block_table;
};
__device__ __forceinline__ DecodeRow decode_row(const DecodeParams& p, int row, int slot, int L) {
  return DecodeRow{p.q_abs + static_cast<size_t>(row) * p.n_heads * L,
                   p.selection + static_cast<size_t>(row) * p.width,
                   p.block_tables + static_cast<size_t>(slot) * p.max_blocks};
}

/// A column warp's epilogue of the v1-layout decodes (v1, shared): this thread's outputs of head
/// rows h0 + g (lo) and h0 + g + 8 (hi) at columns col0 + 8n + 2t, +1. One split: o_lat =
/// bf16(acc * out_scale / l) (zeros when nothing was selected) in 4-byte pairs; several: the
/// split's partial (m, l by the warp owning column 0, then acc * out_scale in 8-byte pairs: a quad
/// writes 32 contiguous bytes, 2 + L being even) at scratch [row][n_heads][splits][2 + L].
template <int kNTiles>
__device__ __forceinline__ void write_decode_out(const DecodeParams& p, int row, int split, int h0, int g,
                                                 int t, int col0, bool lo_ok, bool hi_ok, bool owns_ml,
                                                 float m_lo, float m_hi, float l_lo, float l_hi,
                                                 float out_scale, const float (&o)[kNTiles][4]) {
  const int L = p.kv_lora;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (!(half ? hi_ok : lo_ok)) continue;
    const int h = h0 + g + 8 * half;
    if (p.splits == 1) {
      const float l = half ? l_hi : l_lo;
      bf16* out = p.o_lat + (static_cast<size_t>(row) * p.n_heads + h) * L;
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        const int c = col0 + n * 8 + 2 * t;
        const bf16 lo = l > 0.0f ? f_to_bf16((o[n][2 * half] * out_scale) / l) : bf16{0};
        const bf16 hi = l > 0.0f ? f_to_bf16((o[n][2 * half + 1] * out_scale) / l) : bf16{0};
        *reinterpret_cast<uint32_t*>(out + c) = lo.bits | (static_cast<uint32_t>(hi.bits) << 16);
      }
      continue;
    }
    float* out = p.scratch + ((static_cast<size_t>(row) * p.n_heads + h) * p.splits + split) * (2 + L);
    if (owns_ml && t == 0) {
      out[0] = half ? m_hi : m_lo;
      out[1] = half ? l_hi : l_lo;
    }
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      const int c = col0 + n * 8 + 2 * t;
      *reinterpret_cast<float2*>(out + 2 + c) =
          make_float2(o[n][2 * half] * out_scale, o[n][2 * half + 1] * out_scale);
    }
  }
}

}  // namespace mtplab::ops::cuda::mla
