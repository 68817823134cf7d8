// The batched draft head with its argmax fused (head_argmax_batch; the CPU reference:
// cpu/dense.cpp) and the pieces of the cuBLASLt head: per launch the mma head (the skinny GEMM,
// rows_gemm.cu), the FP8 head on wgmma, or the FP8 multi-row GEMV head; for the cuBLASLt head
// (cuda_backend.cpp runs cuBLASLt between them) the E4M3 split of x, the combine of the FP8 parts
// with its argmax, and the finishing launch. Their designs and invariance above each kernel.
#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cstdint>

#include "ops/cuda/argmax.cuh"
#include "ops/cuda/batch_common.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dense.hpp"
#include "ops/cuda/device_common.cuh"
#include "ops/cuda/dispatch.hpp"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/rows_gemm.cuh"
#include "ops/cuda/wgmma.cuh"

namespace mtplab::ops::cuda {

namespace {

// ---- the FP8 head on wgmma (head_wgmma_kernel) -------------------------------------------------------
//
// From 16 batch rows the FP8 head's mma.sync kernel is bound by its shared-memory reads: each warp
// reads every batch row's chunk for its own 16 W rows (256 bytes of B per MMA), and at 128 rows it
// took 688 us for a 150 us byte floor. Here a block of two warpgroups owns a tile of 128 W rows
// (64 a warpgroup, 16 a warp: the rows and loads of rows_gemm_kernel, so every W element is
// loaded once, by the lane whose A fragment holds it, and widened to FP16 there) and every batch row (kNB of
// them, the wgmma's N). The widened W rows are the A operand in registers; the batch rows' chunk is B, read
// by the tensor cores straight from shared memory, once per warpgroup.
// - x is packed once per launch (head_pack_x_kernel) into the wgmma's canonical no-swizzle layout,
//   chunk after chunk of 64 columns, with the column relabelling of the A fragments built into it
//   (docs/kernels.md, "The head"); the block stages a chunk with plain 16-byte copies
//   into a kWgStages-chunk cp.async ring, kWgAhead chunks ahead.
// - W is kept kWgWBuf - 1 chunks ahead in registers; a chunk's four wgmmas (one a k-step of 16)
//   are one group, retired (wait_group 0) before the next chunk is widened into the same A
//   registers (a second A buffer with wait_group 1 made ptxas serialize every wgmma, C7513); two
//   blocks a multiprocessor overlap one block's widening with the other's MMAs.
// - The epilogue and the grid-level argmax are rows_gemm_kernel's (tile_epilogue, rows_gemm.cuh;
//   rows_grid_finish, argmax.cuh).
// x is packed as FP16 scaled per row by a power of two (batch::f16_row_shift), taken out in the
// epilogue. A logit is the full fp32 dot product of its widened W row and x row, times the row
// scale, in the wgmma's summation order (on an H200 byte-equal to the mma.sync kernel's; not
// promised); a batch row's logits do not depend on the other rows.

constexpr int kWgStages = 5;
constexpr int kWgAhead = kWgStages - 2;  // chunks c + 1 .. c + kWgAhead in flight while c computes
/// W chunks in registers (kWgWBuf - 1 ahead): 4, or 3 at 128 batch rows (two blocks a
/// multiprocessor leave 128 registers a thread; the 64 accumulators take half).
template <int kNB>
constexpr int wgmma_wbuf() {
  return kNB >= 128 ? 3 : 4;
}

/// Packed x of kNB batch rows: chunk c, k-step s, half h, batch row n, 8 values. Value 2t + e of
/// (c, s, h, n) is x[n][64c + 16t + 4s + 2h + e]: the A fragments' pairing (batch::a_frags), so the
/// k index of a k-step's core matrices matches the W columns a lane widened. Zeros for padded
/// rows and past k.
__device__ __forceinline__ size_t packed_x_index(int c, int s, int h, int n, int nb) {
  return ((static_cast<size_t>(c) * 4 + s) * 2 + h) * static_cast<size_t>(nb) * 8 +
         static_cast<size_t>(n) * 8;
}

/// The shifts of the packed rows (batch::f16_row_shift), after the largest packed x.
__device__ __forceinline__ int* packed_x_shifts(bf16* xp, int k) {
  return reinterpret_cast<int*>(xp +
                                static_cast<size_t>((k + kChunkK - 1) / kChunkK) * kChunkK * kMaxBatchRows);
}

/// One block a batch row n (grid nb): the row's largest magnitude, its shift, then the row as
/// scaled FP16 pairs in the packed layout.
__global__ void __launch_bounds__(256)
    head_pack_x_kernel(const bf16* x, int64_t ldx, const int32_t* slot, int rows, int k, int nb, bf16* xp) {
  pdl_begin();
  __shared__ float s_max[256 / kWarp];
  const int n = blockIdx.x;
  const bool live = n < rows && (slot == nullptr || slot[n] >= 0);
  const bf16* xr = x + n * ldx;
  float m = 0.0f;
  if (live)
    for (int col = 2 * threadIdx.x; col < k; col += 2 * blockDim.x)
      m = batch::bf16x2_max_abs(*reinterpret_cast<const uint32_t*>(xr + col), m);
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (threadIdx.x % kWarp == 0) s_max[threadIdx.x / kWarp] = m;
  __syncthreads();
  m = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) m = fmaxf(m, s_max[w]);
  const int shift = batch::f16_row_shift(m);
  if (threadIdx.x == 0) packed_x_shifts(xp, k)[n] = shift;
  const int nchunks = (k + kChunkK - 1) / kChunkK;
  for (int u = threadIdx.x; u < nchunks * 8; u += blockDim.x) {  // this row's 16-byte units
    const int c = u / 8, s = (u % 8) / 2, h = u % 2;
    uint32_t w[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int col = c * kChunkK + 16 * t + 4 * s + 2 * h;
      w[t] = live && col < k
                 ? batch::bf16x2_to_f16x2_shifted(*reinterpret_cast<const uint32_t*>(xr + col), shift)
                 : 0u;
    }
    *reinterpret_cast<uint4*>(xp + packed_x_index(c, s, h, n, nb)) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

template <int kNB>
__global__ void __launch_bounds__(kGemmThreads, 2) head_wgmma_kernel(GemmParams p, const bf16* xp) {
  pdl_begin();
#if MTPLAB_WGMMA
  constexpr int kNT = kNB / 8;
  constexpr int kWgWBuf = wgmma_wbuf<kNB>();
  constexpr size_t kStageElems = static_cast<size_t>(kNB) * kChunkK;
  constexpr uint32_t kLbo = 16 * kNB;  // bytes between the two K-halves of a k-step
  constexpr uint32_t kSbo = 128;       // bytes between groups of 8 batch rows
  extern __shared__ __align__(128) uint8_t wg_smem[];
  bf16* xs = reinterpret_cast<bf16*>(wg_smem);  // [kWgStages][kStageElems]
  __shared__ uint8_t s_live[kNB];
  __shared__ unsigned long long s_best[kNB];
  __shared__ int s_shift[kNB];
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int* shifts = packed_x_shifts(const_cast<bf16*>(xp), p.k);
  for (int b = threadIdx.x; b < kNB; b += blockDim.x) {
    s_live[b] = b < p.rows && (p.slot == nullptr || p.slot[b] >= 0);
    s_best[b] = 0;
    s_shift[b] = shifts[b];
  }
  const int nchunks = (p.k + kChunkK - 1) / kChunkK;
  const size_t row_bytes = static_cast<size_t>(p.k);
  const int rpg = p.map.rows_per_group;

  for (int tile = blockIdx.x; tile < p.total_tiles; tile += gridDim.x) {
    __syncthreads();  // s_live is set; the last tile's wgmmas of both warpgroups have retired
    const int r0 = tile * kTileRows + warp * 16 + g;
    const int r1 = r0 + 8;
    const bool ok0 = r0 < rpg;
    const bool ok1 = r1 < rpg;
    const uint8_t* w0 = p.W + static_cast<size_t>(r0) * row_bytes;
    const uint8_t* w1 = w0 + 8 * row_bytes;
    auto stage = [&](int c) {
      const bf16* src = xp + static_cast<size_t>(c) * kStageElems;
      bf16* dst = xs + static_cast<size_t>(c % kWgStages) * kStageElems;
      for (int v = threadIdx.x; v < kNB * 8; v += blockDim.x) batch::cp_async16(dst + 8 * v, src + 8 * v, 16);
    };
    auto load_w = [&](uint4(&dst)[2], int c) {
      const int col = c * kChunkK + 16 * t;
      const bool in = col < p.k;
      dst[0] = ok0 && in ? load_stream(w0 + col) : make_uint4(0, 0, 0, 0);
      dst[1] = ok1 && in ? load_stream(w1 + col) : make_uint4(0, 0, 0, 0);
    };
    for (int c = 0; c < kWgAhead; ++c) {
      if (c < nchunks) stage(c);
      batch::cp_async_commit();
    }
    uint4 wr[kWgWBuf][2];
    w_ring_fill(nchunks, wr, load_w);
    float acc[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    uint32_t a[4][4];
    w_ring_run(nchunks, wr, load_w, [&](const uint4(&w)[2], int c) {
      {  // chunk c's A fragments (chunk c - 1's group has retired)
        uint32_t wa[8], wb[8];
        batch::fp8x16_to_f16x16(w[0], wa);
        batch::fp8x16_to_f16x16(w[1], wb);
        batch::a_frags(wa, wb, a);
      }
      batch::cp_async_wait<kWgAhead - 1>();  // this thread's copies of chunk c have landed
      wg::fence_proxy_shared();
      __syncthreads();  // everyone's copies of c; every warpgroup past chunk c - 2's group
      if (c + kWgAhead < nchunks) stage(c + kWgAhead);  // into chunk c - 2's stage
      batch::cp_async_commit();
      const bf16* xc = xs + static_cast<size_t>(c % kWgStages) * kStageElems;
      wg::fence();
#pragma unroll
      for (int s = 0; s < 4; ++s)
        wg::mma_f16<kNB>(&acc[0][0], a[s], wg::desc(xc + static_cast<size_t>(s) * 2 * kNB * 8, kLbo, kSbo));
      wg::commit();
      wg::wait<0>();  // A is rewritten next (ptxas serializes every wgmma if A is defined while one is
                      // pending)
    });
    wg::wait<0>();
    wg::fence_acc<kNB / 2>(&acc[0][0]);
    tile_epilogue<true, kNT, Epi::head>(p, acc, 0, r0, r1, ok0, ok1, g, t, s_live, s_best, s_shift);
  }
  rows_grid_finish<kNB>(p.head, s_live, s_best);
#endif
}

/// Bytes of the wgmma head's ring at kNB batch rows.
constexpr size_t wgmma_ring_bytes(int nb) {
  return static_cast<size_t>(kWgStages) * nb * kChunkK * sizeof(bf16);
}

template <int kNB>
void launch_head_wgmma(const LaunchCtx& ctx, const GemmParams& p, bf16* xp) {
  constexpr auto kernel = head_wgmma_kernel<kNB>;
  constexpr size_t smem = wgmma_ring_bytes(kNB);
  static const int per_sm = [] {
    MTP_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    int b = 0;
    MTP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kGemmThreads, smem));
    return std::max(1, b);
  }();
  launch(ctx, head_pack_x_kernel, static_cast<unsigned>(kNB), 256, 0, p.x, p.ldx, p.slot, p.rows, p.k, kNB,
         xp);
  MTP_CUDA_LAUNCH_CHECK();
  const int grid = std::max(1, std::min(p.total_tiles, per_sm * ctx.num_sms));
  launch(ctx, kernel, static_cast<unsigned>(grid), kGemmThreads, smem, p, static_cast<const bf16*>(xp));
  MTP_CUDA_LAUNCH_CHECK();
}

void dispatch_head_wgmma(const LaunchCtx& ctx, const GemmParams& p, bf16* xp) {
  switch (column_tiles(p.rows)) {
    case 1:
    case 2:
      return launch_head_wgmma<16>(ctx, p, xp);
    case 4:
      return launch_head_wgmma<32>(ctx, p, xp);
    case 8:
      return launch_head_wgmma<64>(ctx, p, xp);
    default:
      return launch_head_wgmma<128>(ctx, p, xp);
  }
}

// ---- the multi-row GEMV head (head_gemv) ------------------------------------------------------------
//
// The FP8 head of R = 1 .. kMaxRowsGemvHead batch rows with its argmax fused, every weight element
// loaded once for all rows. A block of kHgWarps warps first stages the R live rows of x into shared
// memory as fp32 (padded rows as zeros, never read), laid out [chunk / 32][row][quad][chunk % 32]:
// lane l's 16-byte reads of quad q of its chunks are conflict-free (consecutive lanes, consecutive
// addresses) and every (row, quad) is a fixed offset from the lane's base. Each
// warp then owns groups of kHgRowsPerWarp consecutive W rows (grid-stride over groups) and the
// whole k of each: lane l takes the 16-byte chunks (16 E4M3 weights) l, l + 32, l + 64, ... of every
// row of the group, kHgUnroll of them per row in flight (streaming loads), widens each pair of
// weights to fp32 exactly (E4M3 -> half -> float) and does R x 16 FMAs per chunk into one fp32
// accumulator per (W row, batch row). The warp adds its lanes with the reduce-scatter butterfly;
// the lane left with the sum of (W row, batch row) multiplies it by the row scale, rounds it to
// BF16, stores it when logits are wanted and keeps the best argmax_key(value, index) of its batch
// row. The keys meet per batch row over the warp (shuffles), the block (shared atomicMax) and the
// grid (global atomicMax into HeadBatchScratch::best); the last block to finish writes out / extras
// and resets the keys and the counter: one launch, no workspace, no memset (graph-safe), the
// scratch rows_gemm's head uses (rows_grid_finish, argmax.cuh).
//
// Invariance: logit (b, r) is the same fp32 function of W[r] and x[b] whatever R and the other
// rows: the lane that owns a chunk depends only on k, each lane adds its chunks in ascending order
// and a chunk's 16 products in column order into an accumulator of (r, b) alone, the butterfly adds
// the same pairs as warp_sum, and the scale multiplies the finished sum. So a row's logits and pick
// at B = 2 are its logits and pick at B = 3 and 4. (Not the skinny GEMM's order, nor the
// single-row GEMV's: that one splits k per shape.) Padded rows (slot < 0) read and write nothing.

constexpr int kHgWarps = 8;
constexpr int kHgThreads = kHgWarps * kWarp;
constexpr int kHgRowsPerWarp = 4;       // W rows per warp and group: each x read from shared memory feeds 4
constexpr int kHgUnroll = 2;            // chunks per W row and lane in flight (8 16-byte loads per lane)
constexpr int kHgChunk = 16;            // E4M3 weights per 16-byte chunk
constexpr int kHgMaxSmem = 112 * 1024;  // two blocks per SM; head_gemv_smem must fit

/// The staged activations of head_gemv_kernel: rows x k fp32, k rounded up to whole blocks of 32
/// chunks (512 columns).
constexpr int64_t head_gemv_smem(int rows, int k) {
  return static_cast<int64_t>(rows) * ((k + kWarp * kHgChunk - 1) / (kWarp * kHgChunk)) * kWarp * kHgChunk *
         static_cast<int64_t>(sizeof(float));
}

struct HeadGemvParams {
  const uint8_t* W = nullptr;  // [n][k] E4M3
  const float* row_scale = nullptr;
  const bf16* x = nullptr;        // [rows][k]
  const int32_t* slot = nullptr;  // null: every row is live
  int n = 0;
  int k = 0;
  bf16* y = nullptr;  // logits [rows][ldy], may be null
  int64_t ldy = 0;
  HeadArgmaxOut head;
};

constexpr int pow2_at_least(int v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

/// acc[r] += the 4 products of weights 4q .. 4q+3 of a chunk (one u32 of E4M3 codes) with batch row
/// r's activations xq[r] (fp32), in column order.
template <int kR>
__device__ __forceinline__ void fma_fp8x4_rows(uint32_t w, const float4 (&xq)[kR], float (&acc)[kR]) {
  const float2 a = fp8x2_to_float2(w);
  const float2 b = fp8x2_to_float2(w >> 16);
#pragma unroll
  for (int r = 0; r < kR; ++r) acc[r] = fma4(make_float4(a.x, a.y, b.x, b.y), xq[r], acc[r]);
}

template <int kR>
__global__ void __launch_bounds__(kHgThreads, 2) head_gemv_kernel(HeadGemvParams p) {
  pdl_begin();
  constexpr int kV = kHgRowsPerWarp;
  constexpr int kM = pow2_at_least(kV * kR);  // values per warp and group (padded with zeros)
  constexpr int kLanesPerValue = kWarp / kM;
  static_assert(kM <= kWarp, "one value per lane at least");
  constexpr int kBlockF4 = kR * 4 * kWarp;  // float4 of one block of 32 chunks
  extern __shared__ __align__(16) uint8_t hg_smem[];
  float4* xs = reinterpret_cast<float4*>(hg_smem);  // [n_chunks / 32][kR][4][32]
  __shared__ uint8_t s_live[kR];
  __shared__ unsigned long long s_best[kR];
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int n_chunks = p.k / kHgChunk;
  if (threadIdx.x < kR) {
    s_live[threadIdx.x] = p.slot == nullptr || p.slot[threadIdx.x] >= 0;
    s_best[threadIdx.x] = 0;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kR * n_chunks; i += blockDim.x) {
    const int r = i / n_chunks;
    const int c = i - r * n_chunks;
    float lo[8], hi[8];
    const bf16* src = p.x + static_cast<size_t>(r) * p.k + static_cast<size_t>(c) * kHgChunk;
    batch::unpack8(s_live[r] ? load_cached(src) : make_uint4(0, 0, 0, 0), lo);
    batch::unpack8(s_live[r] ? load_cached(src + 8) : make_uint4(0, 0, 0, 0), hi);
    float4* dst = xs + (c / kWarp) * kBlockF4 + r * 4 * kWarp + c % kWarp;
    dst[0] = make_float4(lo[0], lo[1], lo[2], lo[3]);
    dst[kWarp] = make_float4(lo[4], lo[5], lo[6], lo[7]);
    dst[2 * kWarp] = make_float4(hi[0], hi[1], hi[2], hi[3]);
    dst[3 * kWarp] = make_float4(hi[4], hi[5], hi[6], hi[7]);
  }
  __syncthreads();

  // After the butterfly, this lane holds value m = (W row mj of the group, batch row mr).
  const int m = lane / kLanesPerValue;
  const int mj = m / kR;
  const int mr = m % kR;
  const bool holder = m < kV * kR && lane % kLanesPerValue == 0;
  const bool holder_live = holder && s_live[mr];
  const size_t row_bytes = static_cast<size_t>(p.k);
  const int groups = (p.n + kV - 1) / kV;
  unsigned long long best = 0;  // batch row mr's best key over this lane's values

  for (int g = blockIdx.x * kHgWarps + warp; g < groups; g += gridDim.x * kHgWarps) {
    const int row0 = g * kV;
    bool ok[kV];
#pragma unroll
    for (int j = 0; j < kV; ++j) ok[j] = row0 + j < p.n;
    // This lane's chunk of step i of row row0 (row j: + j * row_bytes, formed only for rows < n).
    const uint8_t* wp = p.W + static_cast<size_t>(row0) * row_bytes + static_cast<size_t>(lane) * kHgChunk;
    float acc[kV][kR];
#pragma unroll
    for (int j = 0; j < kV; ++j)
#pragma unroll
      for (int r = 0; r < kR; ++r) acc[j][r] = 0.0f;
    // Step i: chunks lane + 32 (i + u), u < kHgUnroll, of every row of the group (whole: all of
    // them inside k). The weights are loaded first, then each chunk's x from shared memory feeds the
    // group's rows.
    auto step = [&](int i, bool whole) {
      uint4 wv[kV][kHgUnroll];
#pragma unroll
      for (int j = 0; j < kV; ++j) {
#pragma unroll
        for (int u = 0; u < kHgUnroll; ++u) {
          const bool in = whole || lane + (i + u) * kWarp < n_chunks;
          wv[j][u] =
              ok[j] && in ? load_stream(wp + j * row_bytes + u * kWarp * kHgChunk) : make_uint4(0, 0, 0, 0);
        }
      }
      const float4* xl = xs + static_cast<size_t>(i) * kBlockF4 + lane;
#pragma unroll
      for (int u = 0; u < kHgUnroll; ++u) {
        if (!whole && lane + (i + u) * kWarp >= n_chunks) break;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          float4 xq[kR];
#pragma unroll
          for (int r = 0; r < kR; ++r) xq[r] = xl[u * kBlockF4 + (r * 4 + q) * kWarp];
#pragma unroll
          for (int j = 0; j < kV; ++j) {
            const uint4& w = wv[j][u];
            fma_fp8x4_rows<kR>(q == 0 ? w.x : q == 1 ? w.y : q == 2 ? w.z : w.w, xq, acc[j]);
          }
        }
      }
    };
    // The whole steps, then at most one partial one (k not a multiple of 32 x kHgUnroll chunks).
    int st = 0;
    for (; lane + (st + kHgUnroll - 1) * kWarp < n_chunks;
         st += kHgUnroll, wp += kHgUnroll * kWarp * kHgChunk)
      step(st, true);
    if (lane + st * kWarp < n_chunks) step(st, false);

    float v[kM];
#pragma unroll
    for (int e = 0; e < kM; ++e) v[e] = e < kV * kR ? acc[e / kR][e % kR] : 0.0f;
    warp_reduce_scatter<kM>(v, lane);
    const int row = row0 + mj;
    if (holder_live && row < p.n) {
      const bf16 lv = f_to_bf16(__fmul_rn(__ldg(p.row_scale + row), v[0]));
      if (p.y) p.y[static_cast<size_t>(mr) * p.ldy + row] = lv;
      const unsigned long long key = argmax_key(bf16_to_f(lv), static_cast<int32_t>(p.head.index_base + row));
      best = key > best ? key : best;
    }
  }

  // Per batch row: the warp's best over the lanes holding its values, then the block's, the grid's.
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const unsigned long long kb = warp_max_u64(mr == r ? best : 0ull);
    if (lane == 0 && kb != 0) atomicMax(&s_best[r], kb);
  }
  rows_grid_finish<kR>(p.head, s_live, s_best);
}

/// Blocks of head_gemv_kernel<kR> resident per SM at `smem` bytes of staged activations: asked of
/// the occupancy calculator when the size changes (one size per head in practice).
template <int kR>
int head_gemv_resident(int smem) {
  static std::atomic<int64_t> cache{0};  // smem << 8 | blocks
  const int64_t c = cache.load(std::memory_order_relaxed);
  if (c != 0 && (c >> 8) == smem) return static_cast<int>(c & 0xff);
  static const bool attr = [] {
    MTP_CUDA_CHECK(
        cudaFuncSetAttribute(head_gemv_kernel<kR>, cudaFuncAttributeMaxDynamicSharedMemorySize, kHgMaxSmem));
    return true;
  }();
  (void)attr;
  int b = 0;
  MTP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, head_gemv_kernel<kR>, kHgThreads, smem));
  b = std::max(1, std::min(b, 255));
  cache.store(static_cast<int64_t>(smem) << 8 | b, std::memory_order_relaxed);
  return b;
}

template <int kR>
void launch_head_gemv(const LaunchCtx& ctx, const HeadGemvParams& p) {
  const int smem = static_cast<int>(head_gemv_smem(kR, p.k));
  const int groups = (p.n + kHgRowsPerWarp - 1) / kHgRowsPerWarp;
  const int needed = (groups + kHgWarps - 1) / kHgWarps;
  const int grid = std::max(1, std::min(needed, head_gemv_resident<kR>(smem) * ctx.num_sms));
  launch(ctx, head_gemv_kernel<kR>, static_cast<unsigned>(grid), kHgThreads, static_cast<size_t>(smem), p);
  MTP_CUDA_LAUNCH_CHECK();
}

static_assert(kMaxRowsGemvHead == 4, "dispatch_head_gemv instantiates 1, 2, 3 and 4 rows");
static_assert(head_gemv_smem(kMaxRowsGemvHead, 7168) <= kHgMaxSmem &&
                  head_gemv_smem(kMaxRowsGemvHead, 7169) > kHgMaxSmem,
              "head_gemv_fits' documented k limit");

void dispatch_head_gemv(const LaunchCtx& ctx, const HeadGemvParams& p, int rows) {
  switch (rows) {
    case 1:
      return launch_head_gemv<1>(ctx, p);
    case 2:
      return launch_head_gemv<2>(ctx, p);
    case 3:
      return launch_head_gemv<3>(ctx, p);
    default:
      return launch_head_gemv<4>(ctx, p);
  }
}

}  // namespace

size_t head_packed_x_elems(int k) {  // the packed rows, then an int shift a row (packed_x_shifts)
  return static_cast<size_t>((k + kChunkK - 1) / kChunkK) * kChunkK * kMaxBatchRows +
         kMaxBatchRows * sizeof(int) / sizeof(bf16);
}

bool have_wgmma() {
#if defined(MTPLAB_CUDA_SM90A)
  return true;
#else
  return false;
#endif
}

bool head_gemv_fits(int rows, int k) {
  return rows >= 1 && rows <= kMaxRowsGemvHead && k >= kHgChunk && k % kHgChunk == 0 &&
         head_gemv_smem(rows, k) <= kHgMaxSmem;
}

void head_argmax_batch(const LaunchCtx& ctx, const bf16* W, const fp8e4m3* W_fp8, const float* row_scale,
                       const bf16* x, const int32_t* slot, int rows, int n, int k, int64_t index_base,
                       bf16* logits, int ld_logits, ArgMax* out, HeadExtras extras,
                       const HeadBatchScratch& s) {
  const bool fp8 = W_fp8 != nullptr;
  MTP_REQUIRE(rows >= 1 && rows <= kMaxBatchRows && n >= 1 && k >= 16 && k % 16 == 0,
              "ops::cuda::head_argmax_batch: rows ", rows, " (1 .. ", kMaxBatchRows, " per launch), n ", n,
              ", k ", k, " (a positive multiple of 16)");
  const void* Wp = fp8 ? static_cast<const void*>(W_fp8) : static_cast<const void*>(W);
  require_aligned16("head_argmax_batch", "W", Wp);
  require_aligned16("head_argmax_batch", "x", x);
  // What both parameter blocks name alike: the head's inputs beside W and x, its logits, its
  // argmax outputs and their scratch.
  auto set_head = [&](auto& p) {
    p.row_scale = row_scale;
    p.slot = slot;
    p.y = logits;
    p.ldy = ld_logits;
    p.head = HeadArgmaxOut{index_base, out, extras, s.best, s.counter};
  };
  const HeadKernel kernel = head_fused_kernel(ctx.policy, fp8, rows, k);  // dispatch.cu
  record_kernel(ctx, "head_argmax_batch", kernel_text(kernel));
  if (kernel == HeadKernel::gemv) {
    HeadGemvParams g;
    g.W = reinterpret_cast<const uint8_t*>(W_fp8);
    g.x = x;
    g.n = n;
    g.k = k;
    set_head(g);
    dispatch_head_gemv(ctx, g, rows);
    return;
  }
  GemmParams p = gemm_params(Wp, x, k, rows, n, k, GemvRowMap{n, 0, 0, 0});
  set_head(p);
  if (kernel == HeadKernel::wgmma) {
    MTP_REQUIRE(s.packed_x != nullptr && s.packed_elems >= head_packed_x_elems(k),
                "ops::cuda::head_argmax_batch: the wgmma head's packed-x scratch holds ", s.packed_elems,
                " values, ", head_packed_x_elems(k), " needed at k = ", k);
    dispatch_head_wgmma(ctx, p, s.packed_x);
    return;
  }
  launch_rows_gemm_head(ctx, p, fp8);
}

namespace {
constexpr int kFinishThreads = 256;
/// Block b: row b of head_finish_rows (nothing for a padded row).
__global__ void __launch_bounds__(kFinishThreads)
    head_finish_rows_kernel(const ArgMax* pairs, const int32_t* slot, const bf16* logits, int n, bf16* dst,
                            int ld_dst, ArgMax* out, HeadExtras extras) {
  pdl_begin();
  const int b = blockIdx.x;
  if (slot && slot[b] < 0) return;
  if (threadIdx.x == 0) {
    const ArgMax a = pairs[b];
    out[b] = a;
    if (extras.key) extras.key[b] = argmax_key(a.value, a.index);
    if (extras.token) extras.token[b] = a.index;
  }
  if (!dst) return;
  const bf16* src = logits + static_cast<size_t>(b) * n;
  bf16* row = dst + static_cast<size_t>(b) * ld_dst;
  for (int i = threadIdx.x; i < n; i += blockDim.x) row[i] = src[i];
}

constexpr int kSplitThreads = 256;
/// Block b: batch row b's largest magnitude (a non-finite entry counts as infinite), its shift,
/// then its two E4M3 parts as rows 2b and 2b + 1 of `parts` (k bytes each); a padded row's parts
/// are zeros.
__global__ void __launch_bounds__(kSplitThreads)
    head_split_e4m3_kernel(const bf16* x, const int32_t* slot, int k, uint8_t* parts, int* shifts) {
  pdl_begin();
  __shared__ float s_max[kSplitThreads / kWarp];
  const int b = blockIdx.x;
  const bool live = slot == nullptr || slot[b] >= 0;
  const bf16* xr = x + static_cast<size_t>(b) * k;
  float m = 0.0f;
  if (live)
    for (int col = 2 * threadIdx.x; col < k; col += 2 * blockDim.x) {
      const uint32_t two = *reinterpret_cast<const uint32_t*>(xr + col);
      const float a = fabsf(__uint_as_float(two << 16)), c = fabsf(__uint_as_float(two & 0xffff0000u));
      m = !(a <= FLT_MAX) || !(c <= FLT_MAX) ? INFINITY : fmaxf(m, fmaxf(a, c));  // NaN or inf: not finite
    }
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (threadIdx.x % kWarp == 0) s_max[threadIdx.x / kWarp] = m;
  __syncthreads();
  m = 0.0f;
  for (int w = 0; w < kSplitThreads / kWarp; ++w) m = fmaxf(m, s_max[w]);
  const int shift = batch::e4m3_row_shift(m);
  if (threadIdx.x == 0) shifts[b] = live ? shift : 0;
  uint8_t* hi = parts + static_cast<size_t>(2 * b) * k;
  uint8_t* lo = hi + k;
  for (int c4 = 4 * threadIdx.x; c4 < k; c4 += 4 * blockDim.x) {  // k % 16 == 0
    uint32_t h = 0, l = 0;
    if (live) {
      const uint2 four = *reinterpret_cast<const uint2*>(xr + c4);
      const float v[4] = {__uint_as_float(four.x << 16), __uint_as_float(four.x & 0xffff0000u),
                          __uint_as_float(four.y << 16), __uint_as_float(four.y & 0xffff0000u)};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t p2 = batch::e4m3_parts(v[e], shift);
        h |= (p2 & 0xffu) << (8 * e);
        l |= (p2 >> 8) << (8 * e);
      }
    }
    *reinterpret_cast<uint32_t*>(hi + c4) = h;
    *reinterpret_cast<uint32_t*>(lo + c4) = l;
  }
}

/// Grid (parts, rows): part p of live row b's logits, logit j = BF16(scale[j] (D[2b][j] +
/// D[2b + 1][j])) with the row's shift taken out (exact), NaN for a row marked not finite; stored
/// to dst (row b at dst + b * ld_dst) when dst is not null, and the part's best argmax_key into
/// keys[b * parts + p] (argmax_parts_reduce finishes the rows). Padded rows: nothing.
__global__ void __launch_bounds__(kArgmaxRowThreads)
    head_combine_argmax_e4m3_kernel(const float* D, int n, const float* row_scale, const int* shifts,
                                    const int32_t* slot, int64_t index_base, bf16* dst, int ld_dst,
                                    unsigned long long* keys) {
  pdl_begin();
  __shared__ unsigned long long s_best[kArgmaxRowThreads / kWarp];
  const int b = blockIdx.y, part = blockIdx.x, parts = gridDim.x;
  if (slot && slot[b] < 0) return;  // the whole block
  const int sh = shifts[b];
  const float* hi = D + static_cast<size_t>(2 * b) * n;
  const float* lo = hi + n;
  bf16* out = dst ? dst + static_cast<size_t>(b) * ld_dst : nullptr;
  const int j0 = static_cast<int>(static_cast<int64_t>(part) * n / parts);
  const int j1 = static_cast<int>(static_cast<int64_t>(part + 1) * n / parts);
  unsigned long long best = 0;
  for (int j = j0 + static_cast<int>(threadIdx.x); j < j1; j += blockDim.x) {
    const float v = __fmul_rn(row_scale[j], __fadd_rn(hi[j], lo[j]));
    const bf16 lv = f_to_bf16(sh == batch::kE4m3NonFinite ? __int_as_float(0x7fffffff) : ldexpf(v, -sh));
    if (out) out[j] = lv;
    const unsigned long long key = argmax_key(bf16_to_f(lv), static_cast<int32_t>(index_base + j));
    best = key > best ? key : best;
  }
  best = block_max_key(best, s_best);
  if (threadIdx.x == 0) keys[static_cast<size_t>(b) * parts + part] = best;
}
}  // namespace

void head_split_e4m3(const LaunchCtx& ctx, const bf16* x, const int32_t* slot, int rows, int k,
                     uint8_t* parts, int* shifts) {
  MTP_REQUIRE(rows >= 1 && k >= 16 && k % 16 == 0, "ops::cuda::head_split_e4m3: rows ", rows, ", k ", k,
              " (a positive multiple of 16)");
  require_aligned16("head_split_e4m3", "x", x);
  launch(ctx, head_split_e4m3_kernel, static_cast<unsigned>(rows), kSplitThreads, 0, x, slot, k, parts,
         shifts);
  MTP_CUDA_LAUNCH_CHECK();
}

void head_combine_argmax_e4m3(const LaunchCtx& ctx, const float* D, int rows, int n, const float* row_scale,
                              const int* shifts, const int32_t* slot, int64_t index_base, bf16* dst,
                              int ld_dst, ArgMax* pairs, const ArgmaxScratch& scratch) {
  // About two blocks per multiprocessor over the batch, at least 4 values per thread of a part (as
  // argmax_batch), then one warp per row reduces the parts' keys.
  MTP_REQUIRE(rows >= 1 && rows <= scratch.capacity, "ops::cuda::head_combine_argmax_e4m3: rows ", rows,
              " (1 .. ", scratch.capacity, ", the argmax scratch's keys)");
  const int per_part = kArgmaxRowThreads * 4;
  const int parts = std::max(1, std::min({(2 * ctx.num_sms + rows - 1) / rows, (n + per_part - 1) / per_part,
                                          scratch.capacity / rows, 64}));
  launch(ctx, head_combine_argmax_e4m3_kernel,
         dim3(static_cast<unsigned>(parts), static_cast<unsigned>(rows)), kArgmaxRowThreads, 0, D, n,
         row_scale, shifts, slot, index_base, dst, ld_dst, scratch.partials);
  MTP_CUDA_LAUNCH_CHECK();
  argmax_parts_reduce(ctx, scratch.partials, parts, rows, pairs);
}

void head_finish_rows(const LaunchCtx& ctx, const ArgMax* pairs, const int32_t* slot, int rows,
                      const bf16* logits, int n, bf16* dst, int ld_dst, ArgMax* out, HeadExtras extras) {
  launch(ctx, head_finish_rows_kernel, rows, kFinishThreads, 0, pairs, slot, logits, n, dst, ld_dst, out,
         extras);
  MTP_CUDA_LAUNCH_CHECK();
}

}  // namespace mtplab::ops::cuda
