// The skinny tensor-core GEMM's shared pieces (rows_gemm.cu runs it; the FP8 head on wgmma in head.cu
// shares its tiles, epilogue and grid-level argmax): the block's shape, the launch parameters, the
// tile epilogue. The design and invariants: rows_gemm.cu.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/argmax.cuh"
#include "ops/cuda/batch_common.cuh"
#include "ops/cuda/dense.hpp"
#include "ops/cuda/device_common.cuh"
#include "ops/cuda/kernels.hpp"

namespace mtplab::ops::cuda {

using batch::kChunkK;

constexpr int kGemmWarps = 8;
constexpr int kGemmThreads = kGemmWarps * kWarp;
constexpr int kTileRows = kGemmWarps * 16;  // W rows per block tile
constexpr int kXStages = 3;                 // batch-row chunks in the cp.async ring
constexpr int kXStride = kChunkK + 8;       // BF16 per staged row: 144 bytes, conflict-free 16-byte reads
constexpr int kWBuf = 3;                    // W chunks in the register ring: two ahead of the one computed

enum class Epi { head, bf16_out };

struct GemmParams {
  const uint8_t* W = nullptr;  // BF16 or FP8 rows of k
  const float* row_scale = nullptr;
  const bf16* x = nullptr;
  int64_t ldx = 0;
  const int32_t* slot = nullptr;  // null: every row is live
  int rows = 0;
  int k = 0;
  GemvRowMap map;
  int tiles_per_group = 0;
  int total_tiles = 0;
  void* y = nullptr;  // Y (BF16), or the head's logits (may be null)
  int64_t ldy = 0;
  HeadArgmaxOut head;  // the head epilogue's argmax
};

/// The epilogue of one tile of the skinny GEMM (rows_gemm and the wgmma head; the grid-level argmax
/// after the last tile: rows_grid_finish, argmax.cuh): acc[j][e] is (W row r0 or r1 of the group,
/// batch row 8j + 2t + (e & 1)). BF16 outputs, or the head's logits and their keys, reduced
/// over the warp's 16 rows into s_best (shared atomics). s_shift (FP16 operands,
/// batch::f16_row_shift; nullptr for BF16 ones): batch row b's x was scaled by 2^s_shift[b],
/// multiplied back out after the row scale (both exact: the BF16 operands' bits).
template <bool kFp8, int kNT, Epi kEpi>
__device__ __forceinline__ void tile_epilogue(const GemmParams& p, const float (&acc)[kNT][4], int group,
                                              int r0, int r1, bool ok0, bool ok1, int g, int t,
                                              const uint8_t* s_live, unsigned long long* s_best,
                                              const int* s_shift = nullptr) {
  const int rpg = p.map.rows_per_group;
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
    unsigned long long key_c[2] = {0ull, 0ull};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int rl = e < 2 ? r0 : r1;
      const bool ok = e < 2 ? ok0 : ok1;
      const int b = 8 * j + 2 * t + (e & 1);
      if (!ok || !s_live[b]) continue;
      const int64_t r = static_cast<int64_t>(group) * rpg + rl;  // output row
      float v = acc[j][e];
      if constexpr (kFp8) {
        v = __fmul_rn(p.row_scale[r], v);
        if (s_shift) v = ldexpf(v, -s_shift[b]);
      }
      const bf16 lv = f_to_bf16(v);
      if constexpr (kEpi == Epi::bf16_out) {
        static_cast<bf16*>(p.y)[b * p.ldy + r] = lv;
      } else {
        if (p.y) static_cast<bf16*>(p.y)[b * p.ldy + r] = lv;
        const unsigned long long key = argmax_key(bf16_to_f(lv), static_cast<int32_t>(p.head.index_base + r));
        key_c[e & 1] = key > key_c[e & 1] ? key : key_c[e & 1];
      }
    }
    if constexpr (kEpi == Epi::head) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        unsigned long long kc = key_c[c];
#pragma unroll
        for (int o = 4; o < kWarp; o <<= 1) {  // over g: the warp's 16 rows of this batch row
          const unsigned long long other = __shfl_xor_sync(0xffffffffu, kc, o);
          kc = other > kc ? other : kc;
        }
        if (g == 0 && kc != 0) atomicMax(&s_best[8 * j + 2 * t + c], kc);
      }
    }
  }
}

/// The W register ring of the skinny GEMM's chunk loops (rows_gemm_kernel, head_wgmma_kernel): W is
/// kept kBuf - 1 chunks ahead in registers. w_ring_fill loads chunks 0 .. kBuf - 2; w_ring_run then
/// walks chunks 0 .. nchunks - 1 in order, issuing the loads of chunk c + kBuf - 1 (load(slot, c))
/// before computing chunk c (step(slot, c)). The slots rotate with the unrolled u, so every register
/// index is static.
template <int kBuf, typename W, typename Load>
__device__ __forceinline__ void w_ring_fill(int nchunks, W (&wr)[kBuf], Load&& load) {
#pragma unroll
  for (int u = 0; u < kBuf - 1; ++u)
    if (u < nchunks) load(wr[u], u);
}
template <int kBuf, typename W, typename Load, typename Step>
__device__ __forceinline__ void w_ring_run(int nchunks, W (&wr)[kBuf], Load&& load, Step&& step) {
  for (int c0 = 0; c0 < nchunks; c0 += kBuf) {
#pragma unroll
    for (int u = 0; u < kBuf; ++u) {
      const int c = c0 + u;
      if (c >= nchunks) break;  // uniform
      if (c + kBuf - 1 < nchunks) load(wr[(u + kBuf - 1) % kBuf], c + kBuf - 1);
      step(wr[u], c);
    }
  }
}

/// Column tiles of 8 for `rows` batch rows: 1, 2, 4, 8 or 16.
inline int column_tiles(int rows) {
  int nt = 1;
  while (8 * nt < rows) nt *= 2;
  return nt;
}

/// What every rows_gemm launch sets: W's rows of k (BF16 or FP8 bytes), x [rows][ldx], the n output
/// rows through the row map and the tile counts that follow from it.
inline GemmParams gemm_params(const void* W, const bf16* x, int64_t ldx, int rows, int n, int k,
                              const GemvRowMap& map) {
  GemmParams p;
  p.W = static_cast<const uint8_t*>(W);
  p.x = x;
  p.ldx = ldx;
  p.rows = rows;
  p.k = k;
  p.map = map;
  p.tiles_per_group = (map.rows_per_group + kTileRows - 1) / kTileRows;
  p.total_tiles = p.tiles_per_group * (n / map.rows_per_group);
  return p;
}

inline void require_aligned16(const char* op, const char* what, const void* ptr) {
  MTP_REQUIRE(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, "ops::cuda::", op, ": ", what,
              " is not 16-byte aligned (the batched GEMM loads 16-byte vectors)");
}

/// The skinny GEMM with the head's epilogue (its argmax fused) over p's batch rows: the mma head
/// of head_argmax_batch (head.cu), FP8 or BF16 rows of W.
void launch_rows_gemm_head(const LaunchCtx& ctx, const GemmParams& p, bool fp8);

}  // namespace mtplab::ops::cuda
