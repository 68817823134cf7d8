// The skinny tensor-core GEMM (the CPU reference: cpu/dense.cpp): W rows x up to 128 batch rows,
// the small-M path of mla_out_v_batch, and the mma head of head_argmax_batch (its argmax fused;
// head.cu launches it where dispatch.cu picks it).
//
// The skinny GEMM (rows_gemm_kernel). A block of 8 warps owns a tile of 128 W rows (16 per warp, the
// MMA's M) and every batch row (the MMA's N, 8 per column tile, kNT tiles); it walks k in chunks of
// 64 columns. Each W element is loaded exactly once, by the one lane whose fragment holds it, with
// 16-byte streaming loads two chunks ahead in registers; the batch rows' chunk is shared by the 8
// warps through a 3-stage cp.async ring in shared memory (padded rows are zero-filled, never read).
// Tiles are spread over a persistent grid. Epilogues: BF16 outputs (mla_out_v_batch), or the
// head: each logit rounded to BF16, written when wanted, keyed as argmax_key(value, index), reduced
// per batch row over the warp's 16 rows (shuffles), the block (shared atomics), then the grid
// (global atomicMax into HeadBatchScratch::best); the last block to finish writes out / extras and
// resets the keys and the counter (one launch, no memset between calls, graph-safe).
//
// Invariants of the skinny GEMM:
// - A logit's fp32 sum is the MMA's: products exact, accumulation in fp32 in the tensor core's
//   order (batch_common.cuh's column relabelling); FP8 rows are widened to BF16 exactly and the row
//   scale multiplies the finished sum, as the CPU does. Ties go to the lowest index (the key).
// - Nothing of a padded row (slot[b] < 0) is read or written.
#include <algorithm>
#include <cstdint>

#include "ops/cuda/batch_common.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dense.hpp"
#include "ops/cuda/device_common.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/rows_gemm.cuh"

namespace mtplab::ops::cuda {

namespace {

/// Blocks per multiprocessor the register budget is set for: two for the widest FP8 tile (136
/// registers would leave one block, 8 warps, too few to hide the MMA chain's latency), else one.
template <bool kFp8, int kNT>
constexpr int rows_gemm_min_blocks() {
  return kFp8 && kNT == 16 ? 2 : 1;
}

// The resident mode (kRes) of the FP8 head at up to 16 batch rows: every batch row's whole x
// [NB][k] is staged into shared memory once per block, before the tile loop, so the chunk loop
// has no barrier and no copy to wait for, and W is kept kResWBuf - 1 chunks ahead in registers
// (the block holding up to 131 KB of x, fewer blocks share a multiprocessor, so each warp keeps
// more of W in flight). The staged rows are then rewritten in place as scaled FP16 (batch::
// f16_row_shift) and W is widened to FP16, one conversion a pair instead of two: the MMAs' order is
// the ring mode's and the products and sums are the BF16 operands' times the power of two the
// epilogue takes out again. Rows of k + 8 values (padded past k with zeros): the 16-byte reads of a
// quarter warp fall in distinct banks, as the ring's 72-value rows do.
constexpr int kResWBuf = 6;
/// Bytes of the resident x for `rows_padded` batch rows of k.
size_t resident_x_bytes(int rows_padded, int k) {
  const int kpad = (k + batch::kChunkK - 1) / batch::kChunkK * batch::kChunkK;
  return static_cast<size_t>(rows_padded) * (kpad + 8) * sizeof(bf16);
}

template <bool kFp8, int kNT, Epi kEpi, bool kRes = false>
__global__ void __launch_bounds__(kGemmThreads, rows_gemm_min_blocks<kFp8, kNT>())
    rows_gemm_kernel(GemmParams p) {
  pdl_begin();
  constexpr int NB = 8 * kNT;          // batch rows (MMA columns) held by the block
  constexpr int kWVec = kFp8 ? 1 : 2;  // 16-byte W vectors per row, chunk and lane
  extern __shared__ __align__(16) uint8_t gemm_smem[];
  bf16* xs = reinterpret_cast<bf16*>(gemm_smem);  // ring: [kXStages][NB][kXStride]; kRes: [NB][ldr]
  __shared__ uint8_t s_live[NB];
  __shared__ unsigned long long s_best[kEpi == Epi::head ? NB : 1];
  __shared__ int s_shift[kRes ? NB : 1];  // kRes: FP16 operands (batch::f16_row_shift)
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int g = lane >> 2;
  const int t = lane & 3;
  for (int b = threadIdx.x; b < NB; b += blockDim.x) {
    s_live[b] = b < p.rows && (p.slot == nullptr || p.slot[b] >= 0);
    if constexpr (kEpi == Epi::head) s_best[b] = 0;
  }
  __syncthreads();
  const int nchunks = (p.k + kChunkK - 1) / kChunkK;
  const size_t row_bytes = static_cast<size_t>(p.k) * (kFp8 ? 1 : 2);
  const int rpg = p.map.rows_per_group;
  const int ldr = nchunks * kChunkK + 8;  // kRes: BF16 per resident x row
  if constexpr (kRes) {
    // One group (checked at launch): every live row's x, zeros past k and for padded rows.
    const int vecs = nchunks * kChunkK / 8;
    for (int v = threadIdx.x; v < NB * vecs; v += blockDim.x) {
      const int b = v / vecs;
      const int c8 = (v - b * vecs) * 8;
      const bool ok = s_live[b] && c8 < p.k;
      batch::cp_async16(xs + static_cast<size_t>(b) * ldr + c8, ok ? p.x + b * p.ldx + c8 : p.x, ok ? 16 : 0);
    }
    batch::cp_async_commit();
    batch::cp_async_wait<0>();
    __syncthreads();
    // Each row as scaled FP16 in place (a warp a row): the widening of W is then one conversion a
    // pair (batch::fp8x16_to_f16x16), which is what bounds this kernel.
    for (int b = warp; b < NB; b += kGemmThreads / kWarp) {
      uint4* row = reinterpret_cast<uint4*>(xs + static_cast<size_t>(b) * ldr);
      float m = 0.0f;
      for (int v = lane; v < vecs; v += kWarp) {
        const uint4 q = row[v];
        m = batch::bf16x2_max_abs(
            q.x, batch::bf16x2_max_abs(q.y, batch::bf16x2_max_abs(q.z, batch::bf16x2_max_abs(q.w, m))));
      }
#pragma unroll
      for (int o = kWarp / 2; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      const int sh = batch::f16_row_shift(m);
      for (int v = lane; v < vecs; v += kWarp) {
        const uint4 q = row[v];
        row[v] = make_uint4(batch::bf16x2_to_f16x2_shifted(q.x, sh), batch::bf16x2_to_f16x2_shifted(q.y, sh),
                            batch::bf16x2_to_f16x2_shifted(q.z, sh), batch::bf16x2_to_f16x2_shifted(q.w, sh));
      }
      if (lane == 0) s_shift[b] = sh;
    }
    __syncthreads();
  }

  for (int tile = blockIdx.x; tile < p.total_tiles; tile += gridDim.x) {
    const int group = tile / p.tiles_per_group;
    const int r0 = (tile - group * p.tiles_per_group) * kTileRows + warp * 16 + g;  // rows within the group
    const int r1 = r0 + 8;
    const bool ok0 = r0 < rpg;
    const bool ok1 = r1 < rpg;
    const int64_t wrow0 = group * p.map.group_stride_rows + p.map.row_offset + r0;
    const uint8_t* w0 = p.W + static_cast<size_t>(wrow0) * row_bytes;
    const uint8_t* w1 = w0 + 8 * row_bytes;
    const bf16* xg = p.x + group * p.map.x_group_stride;

    // Chunk c of every batch row into stage st (16-byte copies; padded rows and columns past k
    // are zero-filled without a read).
    auto stage = [&](int c, int st) {
      bf16* dst = xs + static_cast<size_t>(st) * NB * kXStride;
      const int col0 = c * kChunkK;
      for (int v = threadIdx.x; v < NB * 8; v += blockDim.x) {
        const int b = v >> 3;
        const int c8 = (v & 7) * 8;
        const bool ok = s_live[b] && col0 + c8 < p.k;
        const bf16* src = ok ? xg + b * p.ldx + col0 + c8 : p.x;
        batch::cp_async16(dst + b * kXStride + c8, src, ok ? 16 : 0);
      }
    };
    // This lane's 16 physical columns of chunk c of its two W rows.
    auto load_w = [&](uint4(&dst)[2 * kWVec], int c) {
      const int col = c * kChunkK + 16 * t;
      const bool in = col < p.k;
      const size_t off = static_cast<size_t>(col) * (kFp8 ? 1 : 2);
#pragma unroll
      for (int v = 0; v < kWVec; ++v) {
        dst[v] = ok0 && in ? load_stream(w0 + off + 16 * v) : make_uint4(0, 0, 0, 0);
        dst[kWVec + v] = ok1 && in ? load_stream(w1 + off + 16 * v) : make_uint4(0, 0, 0, 0);
      }
    };

    // One chunk's MMAs: the lane's W vectors widened (FP8) or taken as BF16 pairs into the A
    // fragments, every column tile's B fragments from the staged rows (x_rows: the chunk's column 0
    // of batch row 0, row_stride values apart).
    auto mma_w_chunk = [&](const uint4(&w)[2 * kWVec], const bf16* x_rows, int row_stride,
                           float(&acc)[kNT][4]) {
      uint32_t wa[8], wb[8];
      if constexpr (kFp8 && kRes) {
        batch::fp8x16_to_f16x16(w[0], wa);
        batch::fp8x16_to_f16x16(w[1], wb);
      } else if constexpr (kFp8) {
        batch::fp8x16_to_bf16x16(w[0], wa);
        batch::fp8x16_to_bf16x16(w[1], wb);
      } else {
        batch::words8(w[0], w[1], wa);
        batch::words8(w[2], w[3], wb);
      }
      uint32_t a[4][4];
      batch::a_frags(wa, wb, a);
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        const bf16* xr = x_rows + static_cast<size_t>(8 * j + g) * row_stride + 16 * t;
        uint32_t bw[8];
        batch::words8(*reinterpret_cast<const uint4*>(xr), *reinterpret_cast<const uint4*>(xr + 8), bw);
        batch::mma_chunk<kRes>(acc[j], a, bw);
      }
    };

    float acc[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    if constexpr (kRes) {
      uint4 wr[kResWBuf][2 * kWVec];
      w_ring_fill(nchunks, wr, load_w);
      w_ring_run(nchunks, wr, load_w,
                 [&](const uint4(&w)[2 * kWVec], int c) { mma_w_chunk(w, xs + c * kChunkK, ldr, acc); });
    } else {
      for (int s = 0; s < kXStages - 1; ++s) {
        if (s < nchunks) stage(s, s);
        batch::cp_async_commit();
      }
      uint4 wr[kWBuf][2 * kWVec];
      w_ring_fill(nchunks, wr, load_w);

      w_ring_run(nchunks, wr, load_w, [&](const uint4(&w)[2 * kWVec], int c) {
        if (c + kXStages - 1 < nchunks) stage(c + kXStages - 1, (c + kXStages - 1) % kXStages);
        batch::cp_async_commit();
        batch::cp_async_wait<kXStages - 1>();  // chunk c's group has landed
        __syncthreads();
        mma_w_chunk(w, xs + static_cast<size_t>(c % kXStages) * NB * kXStride, kXStride, acc);
        __syncthreads();  // stage c % kXStages is refilled by the next iteration's copy
      });
    }

    tile_epilogue<kFp8, kNT, kEpi>(p, acc, group, r0, r1, ok0, ok1, g, t, s_live, s_best,
                                   kRes ? s_shift : nullptr);
  }
  if constexpr (kEpi == Epi::head) rows_grid_finish<NB>(p.head, s_live, s_best);
}

template <bool kFp8, int kNT, Epi kEpi>
void launch_rows_gemm_resident(const LaunchCtx& ctx, const GemmParams& p) {
  constexpr auto kernel = rows_gemm_kernel<kFp8, kNT, kEpi, true>;
  const size_t smem = resident_x_bytes(8 * kNT, p.k);
  static const int max_smem = opt_in_dynamic_smem(kernel);
  MTP_REQUIRE(smem <= static_cast<size_t>(max_smem), "ops::cuda::rows_gemm: resident x of ", smem,
              " bytes (at most ", max_smem, ")");
  int per_sm = 0;
  MTP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kGemmThreads, smem));
  const int grid = std::max(1, std::min(p.total_tiles, std::max(1, per_sm) * ctx.num_sms));
  launch(ctx, kernel, static_cast<unsigned>(grid), kGemmThreads, smem, p);
  MTP_CUDA_LAUNCH_CHECK();
}

/// Whether a launch takes the resident mode: the FP8 head at up to 16 rows (1 or 2 column tiles),
/// one group of rows, and x fitting in shared memory (kRes above).
template <bool kFp8, int kNT, Epi kEpi>
bool rows_gemm_resident(const GemmParams& p) {
  if constexpr (!kFp8 || kEpi != Epi::head || kNT > 2) {
    return false;
  } else {
    return p.total_tiles == p.tiles_per_group && resident_x_bytes(8 * kNT, p.k) <= 160 * 1024;
  }
}

template <bool kFp8, int kNT, Epi kEpi>
void launch_rows_gemm(const LaunchCtx& ctx, const GemmParams& p) {
  if (rows_gemm_resident<kFp8, kNT, kEpi>(p)) return launch_rows_gemm_resident<kFp8, kNT, kEpi>(ctx, p);
  constexpr auto kernel = rows_gemm_kernel<kFp8, kNT, kEpi>;
  constexpr int kSmem = kXStages * 8 * kNT * kXStride * 2;
  static const int blocks_per_sm = [] {
    if (kSmem > 48 * 1024)
      MTP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    int b = 0;
    MTP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kGemmThreads, kSmem));
    return std::max(1, b);
  }();
  const int grid = std::max(1, std::min(p.total_tiles, blocks_per_sm * ctx.num_sms));
  launch(ctx, kernel, static_cast<unsigned>(grid), kGemmThreads, static_cast<size_t>(kSmem), p);
  MTP_CUDA_LAUNCH_CHECK();
}

template <bool kFp8, Epi kEpi>
void dispatch_rows_gemm(const LaunchCtx& ctx, const GemmParams& p) {
  switch (column_tiles(p.rows)) {
    case 1:
      return launch_rows_gemm<kFp8, 1, kEpi>(ctx, p);
    case 2:
      return launch_rows_gemm<kFp8, 2, kEpi>(ctx, p);
    case 4:
      return launch_rows_gemm<kFp8, 4, kEpi>(ctx, p);
    case 8:
      return launch_rows_gemm<kFp8, 8, kEpi>(ctx, p);
    default:
      return launch_rows_gemm<kFp8, 16, kEpi>(ctx, p);
  }
}

}  // namespace

void launch_rows_gemm_head(const LaunchCtx& ctx, const GemmParams& p, bool fp8) {
  if (fp8) {
    dispatch_rows_gemm<true, Epi::head>(ctx, p);
  } else {
    dispatch_rows_gemm<false, Epi::head>(ctx, p);
  }
}

void rows_gemm(const LaunchCtx& ctx, const bf16* W, const bf16* x, int64_t ldx, bf16* y, int64_t ldy,
               int rows, int n, int k, const GemvRowMap& map) {
  MTP_REQUIRE(rows >= 1 && rows <= kMaxBatchRows && n >= 1 && k >= 16 && k % 16 == 0 &&
                  map.rows_per_group >= 1 && n % map.rows_per_group == 0,
              "ops::cuda::rows_gemm: rows ", rows, " (1 .. ", kMaxBatchRows, "), n ", n, ", k ", k,
              " (a positive multiple of 16), ", map.rows_per_group, " rows per group");
  MTP_REQUIRE(ldx % 8 == 0 && map.x_group_stride % 8 == 0, "ops::cuda::rows_gemm: row stride ", ldx,
              " and group stride ", map.x_group_stride, " of x must be multiples of 8 (16-byte rows)");
  require_aligned16("rows_gemm", "W", W);
  require_aligned16("rows_gemm", "x", x);
  GemmParams p = gemm_params(W, x, ldx, rows, n, k, map);
  p.y = y;
  p.ldy = ldy;
  dispatch_rows_gemm<false, Epi::bf16_out>(ctx, p);
}

}  // namespace mtplab::ops::cuda
