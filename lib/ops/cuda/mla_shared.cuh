// The shared decode of the batched MLA decode (mla_batch: shared2, shared32; mla.cu launches it):
// v1's chunk step with the head tiles of a row in one block, so a chunk of selected rows is staged
// once for all of them. A kernel template, so that a launcher instantiates the shapes it runs; the
// comparison instance of dev/cuda/mla.cu (4 tiles on 16-row chunks) instantiates its own from here.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ops/cuda/batch_common.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/device_common.cuh"
#include "ops/cuda/kernels.hpp"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mla_chunk.cuh"

namespace mtplab::ops::cuda::mla {

using batch::cp_async16;
using batch::cp_async_commit;
using batch::cp_async_wait;

// ---- the shared decode (mla_batch: shared2, shared32)
// ------------------------------------------------------
//
// v1's chunk step with the head tiles of a row in one block, so a chunk of selected rows is
// gathered once for all of them instead of once per head tile:
// - Block (head group of kTiles tiles = 64 or 32 heads, split, row), kTiles x 4 warps: warp
//   w is column warp w % 4 (kv_lora/4 columns, as in v1) of head tile w / 4. The split's rows are
//   v1's ([s * per_split, (s + 1) * per_split) in chunks of 16), so at one split count the two
//   kernels merge the same partials.
// - The split's cache slots (selection -> block table) are resolved once into shared memory by the
//   whole block (two round trips per block, not per chunk), then the chunks stream through a ring
//   of shared_stages<kRows>() stages with cp.async (16-byte copies; rows not selected are zero-filled, never
//   stale: P = 0 times NaN is NaN), all but one stage ahead of the chunk computed. One
//   __syncthreads per chunk frees the oldest stage; an FP8 chunk is widened to BF16 (exactly) into
//   one conversion buffer behind a second one.
// - Per head tile, the 4 column warps compute their partial scores as v1 does (the same MMAs; B
//   fragments through ldmatrix, .trans for O += P C) and stage them (mla_chunk.cuh's exchange);
//   after a named barrier (1 + tile), the tile's softmax is computed once: warp w sums the 4
//   partials in warp order for heads 4w .. 4w + 3 (8 lanes per head, 2 chunk rows per lane), takes
//   each head's max, rescale factor and P = exp(s - m) as BF16 hi + lo, and stores P (the A
//   operand) and the factors (TileSoftmax); after a second barrier each column warp reads P through
//   ldmatrix, rescales its outputs (skipped where every factor is 1) and accumulates O += P C.
//   Scores, maxima and P are v1's; the denominator is summed per owner lane then over the head's 8
//   lanes, another order than v1's, so outputs are v1's within rounding. shared and shared2 run the
//   same step on the same split boundaries: at one split count their bytes are equal.
// shared32 (mla_batch: shared32) runs the same step on chunks of 32 rows (kRows): two 16-row
// halves of scores are staged into one exchange of 32 columns, then one softmax step per tile over
// the 32 rows (each owner lane 4 rows), and O += P C in two k-steps. So a chunk's barriers, maxima,
// rescale factors and ring waits are shared by twice the rows. The running max then moves per 32
// rows instead of 16, so P (and the output's rounding) differ from shared's: its own bits, within
// the tolerances, and again the same bytes for a row alone as in the batch.
constexpr int kSharedMaxSplitRows = 8192;    // the slot table's bound (16-row chunks)
constexpr int kShared32MaxSplitRows = 4096;  // the slot table's bound (32-row chunks)

/// The ring's stages: 4 chunks of 16 rows, 3 of 32 (the same 48 to 64 rows in flight; 3 keep the
/// BF16 ring of 32-row chunks and a 4096-row slot table within one multiprocessor's memory).
template <int kRows>
constexpr int shared_stages() {
  return kRows == 16 ? 4 : 3;
}

template <int kRows>
constexpr int shared_max_split_rows() {
  return kRows == 16 ? kSharedMaxSplitRows : kShared32MaxSplitRows;
}

/// A tile's softmax of one chunk of kRows rows, computed once (warp w for heads 4w .. 4w + 3) and
/// read by its 4 column warps: P's BF16 hi / lo parts as the A operand ([head][chunk row], rows of
/// kRows + 8: the 8 row addresses of an ldmatrix fall in distinct banks), each head's rescale
/// factor, and at the end its running max and denominator.
template <int kRows>
struct TileSoftmax {
  uint16_t p_hi[kHeadTile][kRows + 8];
  uint16_t p_lo[kHeadTile][kRows + 8];
  float corr[kHeadTile];
  float m[kHeadTile];
  float l[kHeadTile];
  float pad[4];
};
static_assert(sizeof(TileSoftmax<16>) % 16 == 0 && sizeof(TileSoftmax<32>) % 16 == 0,
              "TileSoftmax: 16-byte multiple");

/// The 4 column warps' partial scores of a chunk of kRows rows, [warp][head row][chunk row]; rows
/// of kRows + 8 floats (at 16 rows mla_chunk.cuh's ScoreExchange): the 8-byte accesses of a
/// half-warp fall in distinct banks.
template <int kRows>
using SharedScores = float[kDecodeWarps][kHeadTile][kRows + 8];
static_assert(sizeof(SharedScores<16>) == sizeof(ScoreExchange), "16-row chunks: v1's exchange");

/// Dynamic shared memory of mla_decode_shared_kernel for `split_rows` rows per split (bytes; each
/// region a multiple of 16).
template <int kCw, bool kFp8, int kTiles, int kRows>
struct DecodeSharedSmem {
  static constexpr int kL = kDecodeWarps * kCw;
  static constexpr int kRowStride = kL + 8;                             // BF16 per staged row
  static constexpr int kStageStride = kFp8 ? kL + 16 : 2 * kRowStride;  // bytes per staged row
  static constexpr int kStageBytes = kRows * kStageStride;
  static constexpr int kRingBytes = shared_stages<kRows>() * kStageBytes;
  static constexpr int kConvBytes = kFp8 ? kRows * kRowStride * 2 : 0;
  static constexpr int kScoreBytes = kTiles * static_cast<int>(sizeof(SharedScores<kRows>));
  static constexpr int kSoftBytes = kTiles * static_cast<int>(sizeof(TileSoftmax<kRows>));
  static constexpr int kFixedBytes = kRingBytes + kConvBytes + kScoreBytes + kSoftBytes;
  static_assert(kStageBytes % 16 == 0 && kConvBytes % 16 == 0 && kScoreBytes % 16 == 0 &&
                    kSoftBytes % 16 == 0,
                "16-byte regions");
  static constexpr size_t bytes(int split_rows) {
    const size_t padded = (static_cast<size_t>(split_rows) + kRows - 1) / kRows * kRows;  // whole chunks
    return kFixedBytes + (padded * sizeof(int64_t) + 15) / 16 * 16;
  }
};

/// Block (head group, split, row); see "the shared decode" above. kCw = kv_lora / 4; kRows = 16
/// (shared, shared2) or 32 (shared32) rows per chunk.
template <int kCw, bool kFp8, int kTiles, int kRows>
__global__ void __launch_bounds__(kTiles* kDecodeThreads, 4 / kTiles)
    mla_decode_shared_kernel(DecodeParams p) {
  pdl_begin();
  using Smem = DecodeSharedSmem<kCw, kFp8, kTiles, kRows>;
  constexpr int kStages = shared_stages<kRows>();
  constexpr int kSub = kRows / 16;  // 16-row halves: k-steps of P C, score MMA pairs
  constexpr int kPer = kRows / 8;   // chunk rows per softmax owner lane (8 lanes per head)
  constexpr int kKSteps = kCw / 16;
  constexpr int kNTiles = kCw / 8;
  constexpr int kL = Smem::kL;
  constexpr int kRowStride = Smem::kRowStride;
  constexpr int kVecs = kFp8 ? kL / 16 : kL / 8;  // 16-byte copies per row
  static_assert(kNTiles % 2 == 0, "P C loads two column tiles per ldmatrix");
  static_assert(kRows == 16 || kRows == 32, "chunks of 16 or 32 rows (the ballot covers a warp)");
  extern __shared__ __align__(16) uint8_t shared_smem[];
  uint8_t* ring = shared_smem;
  uint16_t* conv = reinterpret_cast<uint16_t*>(shared_smem + Smem::kRingBytes);
  SharedScores<kRows>* s_score =
      reinterpret_cast<SharedScores<kRows>*>(shared_smem + Smem::kRingBytes + Smem::kConvBytes);
  TileSoftmax<kRows>* s_soft = reinterpret_cast<TileSoftmax<kRows>*>(shared_smem + Smem::kRingBytes +
                                                                     Smem::kConvBytes + Smem::kScoreBytes);
  int64_t* s_slot = reinterpret_cast<int64_t*>(shared_smem + Smem::kFixedBytes);

  const int row = blockIdx.z;
  const int slot = p.slot ? p.slot[row] : 0;
  if (slot < 0) return;  // padded row: the whole block, nothing read, nothing written
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int tile = warp / kDecodeWarps;
  const int wc = warp % kDecodeWarps;  // column warp, v1's `warp`
  const int h0 = (blockIdx.x * kTiles + tile) * kHeadTile;
  const bool tile_live = h0 < p.n_heads;  // warp-uniform; dead tiles still copy and meet barriers
  const int split = blockIdx.y;
  const int col0 = wc * kCw;
  const int chunks_all = (p.width + kChunk - 1) / kChunk;
  const int per_split = (chunks_all + p.splits - 1) / p.splits * kChunk;  // whole 16-row chunks
  const int i0 = split * per_split;
  const int i1 = min(p.width, i0 + per_split);
  const int n_local = max(0, i1 - i0);
  const int nchunks = (n_local + kRows - 1) / kRows;
  const bool lo_ok = tile_live && h0 + g < p.n_heads;
  const bool hi_ok = tile_live && h0 + g + 8 < p.n_heads;
  const auto [q_abs, selection, block_table] = decode_row(p, row, slot, kL);

  // The split's cache slots, padded to whole chunks with -1.
  for (int i = threadIdx.x; i < nchunks * kRows; i += blockDim.x) {
    int64_t cs = -1;
    if (i < n_local) {
      const int32_t ts = selection[i0 + i];
      if (ts >= 0) cs = kv_slot(block_table, ts, p.block_size);
    }
    s_slot[i] = cs;
  }
  uint32_t qa[kKSteps][4];
  load_q_fragments<kKSteps>(q_abs, h0, g, t, kL, col0, lo_ok, hi_ok, qa);
  __syncthreads();

  // Chunk c's rows into ring stage st.
  auto issue = [&](int c, int st) {
    uint8_t* dst = ring + static_cast<size_t>(st) * Smem::kStageBytes;
    for (int v = threadIdx.x; v < kRows * kVecs; v += blockDim.x) {
      const int r = v / kVecs;
      const int e = v % kVecs;
      const int64_t cs = s_slot[c * kRows + r];
      const uint8_t* src = static_cast<const uint8_t*>(p.cache);
      if (cs >= 0) src += (static_cast<size_t>(cs) * kL) * (kFp8 ? 1 : 2) + static_cast<size_t>(e) * 16;
      cp_async16(dst + r * Smem::kStageStride + e * 16, src, cs >= 0 ? 16 : 0);
    }
  };

  float o[kNTiles][4];
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  // The softmax this lane owns: head hs of the tile, chunk rows rs .. rs + kPer - 1 (8 lanes per
  // head); its running max (the same on the head's 8 lanes) and its partial denominator.
  const int hs = kDecodeWarps * wc + (lane >> 3);
  const int rs = kPer * (lane & 7);
  float m_run = -INFINITY, l_run = 0.0f;
  TileSoftmax<kRows>& soft = s_soft[tile];

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nchunks) issue(s, s);
    cp_async_commit();
  }
  for (int c = 0; c < nchunks; ++c) {
    cp_async_wait<kStages - 2>();  // this thread's copies of chunk c have landed
    __syncthreads();               // everyone's have, and chunk c - 1's stage is free
    if (c + kStages - 1 < nchunks) issue(c + kStages - 1, (c + kStages - 1) % kStages);
    cp_async_commit();
    const uint8_t* stage = ring + static_cast<size_t>(c % kStages) * Smem::kStageBytes;
    const uint16_t* rows;
    if constexpr (kFp8) {
      for (int v = threadIdx.x; v < kRows * kVecs; v += blockDim.x) {
        const int r = v / kVecs;
        const int e = v % kVecs;
        const uint4 f = *reinterpret_cast<const uint4*>(stage + r * Smem::kStageStride + e * 16);
        uint4* d = reinterpret_cast<uint4*>(conv + r * kRowStride + e * 16);
        d[0] = fp8x8_to_bf16x8(make_uint2(f.x, f.y));
        d[1] = fp8x8_to_bf16x8(make_uint2(f.z, f.w));
      }
      __syncthreads();
      rows = conv;
    } else {
      rows = reinterpret_cast<const uint16_t*>(stage);
    }
    // Bit r: chunk row r is selected (the slot table is -1 past the split and for padding).
    const unsigned valid_rows =
        __ballot_sync(0xffffffffu, lane < kRows && s_slot[c * kRows + (lane % kRows)] >= 0);
    if (!tile_live) continue;  // warp-uniform; the named barrier below is the live tiles' own

      // Partial S over this warp's columns, one 16-row half at a time (chunk_scores' MMAs, B through
      // ldmatrix: matrices rows 0-7 / 8-15 of the half at k-columns ks*16 and ks*16 + 8), each half
      // staged at once (the m16n8 accumulator layout: [0..1] head row g, [2..3] row g + 8); one
      // half at a time (not unrolled), so only one half's accumulators are live beside o.
#pragma unroll 1
    for (int j = 0; j < kSub; ++j) {
      float sc[2][4] = {};
      const uint16_t* rb =
          rows + (16 * j + (lane & 7) + 8 * (lane >> 4)) * kRowStride + col0 + 8 * ((lane >> 3) & 1);
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        uint32_t b4[4];
        ldmatrix_x4(b4, rb + ks * 16);
        mma_16816(sc[0], qa[ks], b4[0], b4[1]);
        mma_16816(sc[1], qa[ks], b4[2], b4[3]);
      }
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        *reinterpret_cast<float2*>(&s_score[tile][wc][g][16 * j + 8 * jj + 2 * t]) =
            make_float2(sc[jj][0], sc[jj][1]);
        *reinterpret_cast<float2*>(&s_score[tile][wc][g + 8][16 * j + 8 * jj + 2 * t]) =
            make_float2(sc[jj][2], sc[jj][3]);
      }
    }
    named_barrier(1 + tile, kDecodeThreads);
    {
      // This lane's kPer scores: the 4 column warps' partials summed in warp order, scaled, -inf
      // where the row is not selected; the head's max over the chunk (its 8 lanes), the rescale,
      // P = exp(s - m) split into BF16 hi + lo, once per (head, row).
      float sv[kPer];
      {
        // Warp w's partials added in warp order as they are read (few registers live beside o).
#pragma unroll
        for (int w = 0; w < kDecodeWarps; ++w) {
          float v[kPer];
          if constexpr (kPer == 2) {
            const float2 f = *reinterpret_cast<const float2*>(&s_score[tile][w][hs][rs]);
            v[0] = f.x;
            v[1] = f.y;
          } else {
            const float4 f = *reinterpret_cast<const float4*>(&s_score[tile][w][hs][rs]);
            v[0] = f.x;
            v[1] = f.y;
            v[2] = f.z;
            v[3] = f.w;
          }
#pragma unroll
          for (int e = 0; e < kPer; ++e) sv[e] = w == 0 ? v[e] : sv[e] + v[e];
        }
#pragma unroll
        for (int e = 0; e < kPer; ++e) {
          float a = sv[e];
          if constexpr (kFp8) a *= p.cache_scale;
          sv[e] = (valid_rows >> (rs + e)) & 1u ? p.softmax_scale * a : -INFINITY;
        }
      }
      float mx = sv[0];
#pragma unroll
      for (int e = 1; e < kPer; ++e) mx = fmaxf(mx, sv[e]);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      const float mn = fmaxf(m_run, mx);
      const float corr = mn == -INFINITY ? 1.0f : expf(m_run - mn);
      float pr[kPer];
#pragma unroll
      for (int e = 0; e < kPer; ++e) pr[e] = sv[e] == -INFINITY ? 0.0f : expf(sv[e] - mn);
      if constexpr (kPer == 2) {
        l_run = l_run * corr + (pr[0] + pr[1]);
      } else {
        l_run = l_run * corr + ((pr[0] + pr[1]) + (pr[2] + pr[3]));
      }
      m_run = mn;
#pragma unroll
      for (int e = 0; e < kPer; e += 2) {
        uint32_t hi, lo;
        split_bf16x2(pr[e], pr[e + 1], hi, lo);
        *reinterpret_cast<uint32_t*>(&soft.p_hi[hs][rs + e]) = hi;
        *reinterpret_cast<uint32_t*>(&soft.p_lo[hs][rs + e]) = lo;
      }
      if ((lane & 7) == 0) soft.corr[hs] = corr;
    }
    named_barrier(1 + tile, kDecodeThreads);
    rescale_outputs<kNTiles>(o, soft.corr[g], soft.corr[g + 8]);
    // O += P C, a k-step per 16-row half (accumulate_pv's MMAs; A = P through ldmatrix, B through
    // ldmatrix .trans: k = rows 0-7 / 8-15 of the half, column tiles 2np and 2np + 1).
#pragma unroll
    for (int j = 0; j < kSub; ++j) {
      uint32_t ah[4], al[4];
      ldmatrix_x4(ah, &soft.p_hi[lane & 15][16 * j + 8 * (lane >> 4)]);
      ldmatrix_x4(al, &soft.p_lo[lane & 15][16 * j + 8 * (lane >> 4)]);
      const uint16_t* rb =
          rows + (16 * j + (lane & 7) + 8 * ((lane >> 3) & 1)) * kRowStride + col0 + 8 * (lane >> 4);
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        uint32_t b4[4];
        ldmatrix_x4_trans(b4, rb + np * 16);
        mma_16816(o[2 * np], ah, b4[0], b4[1]);
        mma_16816(o[2 * np], al, b4[0], b4[1]);
        mma_16816(o[2 * np + 1], ah, b4[2], b4[3]);
        mma_16816(o[2 * np + 1], al, b4[2], b4[3]);
      }
    }
  }
  cp_async_wait<0>();  // no copy left in flight at exit
  if (!tile_live) return;

  // Each head's denominator (its 8 owner lanes' partials, butterfly), published with its max for
  // the tile's 4 column warps; then v1's epilogue (column warp wc in v1's warp's place).
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 4);
  if ((lane & 7) == 0) {
    soft.m[hs] = m_run;
    soft.l[hs] = l_run;
  }
  named_barrier(1 + tile, kDecodeThreads);
  const float l_lo = soft.l[g], l_hi = soft.l[g + 8];
  const float m_lo = soft.m[g], m_hi = soft.m[g + 8];
  write_decode_out<kNTiles>(p, row, split, h0, g, t, col0, lo_ok, hi_ok, wc == 0, m_lo, m_hi, l_lo, l_hi,
                            kFp8 ? p.cache_scale : 1.0f, o);
}

/// Rows per split of the decode at `splits` splits of `width` selected rows (v1's rule).
inline int split_rows(int width, int splits) {
  const int chunks = (width + kChunk - 1) / kChunk;
  return (chunks + splits - 1) / splits * kChunk;
}

template <int kCw, bool kFp8, int kTiles, int kRows>
void launch_decode_shared(const LaunchCtx& ctx, const DecodeParams& p, int rows) {
  using Smem = DecodeSharedSmem<kCw, kFp8, kTiles, kRows>;
  constexpr auto kernel = mla_decode_shared_kernel<kCw, kFp8, kTiles, kRows>;
  const size_t smem = Smem::bytes(split_rows(p.width, p.splits));
  static const int max_smem = opt_in_dynamic_smem(kernel);
  MTP_REQUIRE(smem <= static_cast<size_t>(max_smem), "ops::cuda::mla_decode_batch (shared): ", smem,
              " bytes of shared memory for ", split_rows(p.width, p.splits), " rows per split (at most ",
              max_smem, ")");
  const dim3 grid((p.n_heads + kTiles * kHeadTile - 1) / (kTiles * kHeadTile), p.splits, rows);
  launch(ctx, kernel, grid, kTiles * kDecodeThreads, smem, p);
  MTP_CUDA_LAUNCH_CHECK();
}

}  // namespace mtplab::ops::cuda::mla
