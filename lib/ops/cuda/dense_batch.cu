// Batched dense ops: the skinny tensor-core GEMM (W rows x up to 128 batch rows) behind
// head_argmax_batch (its argmax fused), the batched linears' small-M path and mla_out_v_batch, and
// the argmax family over rows.
//
// The skinny GEMM (rows_gemm_kernel). A block of 8 warps owns a tile of 128 W rows (16 per warp, the
// MMA's M) and every batch row (the MMA's N, 8 per column tile, kNT tiles); it walks k in chunks of
// 64 columns. Each W element is loaded exactly once, by the one lane whose fragment holds it, with
// 16-byte streaming loads two chunks ahead in registers; the batch rows' chunk is shared by the 8
// warps through a 3-stage cp.async ring in shared memory (padded rows are zero-filled, never read).
// Tiles are spread over a persistent grid. Epilogues: BF16 / fp32 outputs (the linears), or the
// head: each logit rounded to BF16, written when wanted, keyed as argmax_key(value, index), reduced
// per batch row over the warp's 16 rows (shuffles), the block (shared atomics), then the grid
// (global atomicMax into HeadBatchScratch::best); the last block to finish writes out / extras and
// resets the keys and the counter (one launch, no memset between calls, graph-safe).
//
// Invariants:
// - A logit's fp32 sum is the MMA's: products exact, accumulation in fp32 in the tensor core's
//   order (batch_common.cuh's column relabelling); FP8 rows are widened to BF16 exactly and the row
//   scale multiplies the finished sum, as the CPU does. Ties go to the lowest index (the key).
// - Nothing of a padded row (slot[b] < 0) is read or written.
#include <algorithm>
#include <cstdint>

#include "ops/cuda/batch_common.cuh"
#include "ops/cuda/batch_kernels.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/device_common.cuh"
#include "ops/cuda/launch.cuh"

namespace mtplab::ops::cuda {
namespace {

using batch::kChunkK;

constexpr int kGemmWarps = 8;
constexpr int kGemmThreads = kGemmWarps * kWarp;
constexpr int kTileRows = kGemmWarps * 16;  // W rows per block tile
constexpr int kXStages = 3;                 // batch-row chunks in the cp.async ring
constexpr int kXStride = kChunkK + 8;       // BF16 per staged row: 144 bytes, conflict-free 16-byte reads
constexpr int kWBuf = 3;                    // W chunks in the register ring: two ahead of the one computed

enum class Epi { head, bf16_out, f32_out };

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
  void* y = nullptr;  // Y (BF16 / fp32), or the head's logits (may be null)
  int64_t ldy = 0;
  int64_t index_base = 0;
  ArgMax* out = nullptr;
  HeadExtras extras;
  unsigned long long* best = nullptr;
  unsigned int* counter = nullptr;
};

template <bool kFp8, int kNT, Epi kEpi>
__global__ void __launch_bounds__(kGemmThreads) rows_gemm_kernel(GemmParams p) {
  pdl_begin();
  constexpr int NB = 8 * kNT;          // batch rows (MMA columns) held by the block
  constexpr int kWVec = kFp8 ? 1 : 2;  // 16-byte W vectors per row, chunk and lane
  extern __shared__ __align__(16) uint8_t gemm_smem[];
  bf16* xs = reinterpret_cast<bf16*>(gemm_smem);  // [kXStages][NB][kXStride]
  __shared__ uint8_t s_live[NB];
  __shared__ unsigned long long s_best[kEpi == Epi::head ? NB : 1];
  __shared__ bool s_last;
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

    float acc[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    for (int s = 0; s < kXStages - 1; ++s) {
      if (s < nchunks) stage(s, s);
      batch::cp_async_commit();
    }
    uint4 wr[kWBuf][2 * kWVec];
#pragma unroll
    for (int u = 0; u < kWBuf - 1; ++u)
      if (u < nchunks) load_w(wr[u], u);

    for (int c0 = 0; c0 < nchunks; c0 += kWBuf) {
#pragma unroll
      for (int u = 0; u < kWBuf; ++u) {
        const int c = c0 + u;
        if (c >= nchunks) break;  // uniform
        if (c + kWBuf - 1 < nchunks) load_w(wr[(u + kWBuf - 1) % kWBuf], c + kWBuf - 1);
        if (c + kXStages - 1 < nchunks) stage(c + kXStages - 1, (c + kXStages - 1) % kXStages);
        batch::cp_async_commit();
        batch::cp_async_wait<kXStages - 1>();  // chunk c's group has landed
        __syncthreads();
        uint32_t wa[8], wb[8];
        if constexpr (kFp8) {
          batch::fp8x16_to_bf16x16(wr[u][0], wa);
          batch::fp8x16_to_bf16x16(wr[u][1], wb);
        } else {
          batch::words8(wr[u][0], wr[u][1], wa);
          batch::words8(wr[u][2], wr[u][3], wb);
        }
        uint32_t a[4][4];
        batch::a_frags(wa, wb, a);
        const bf16* xst = xs + static_cast<size_t>(c % kXStages) * NB * kXStride;
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
          const bf16* xr = xst + (8 * j + g) * kXStride + 16 * t;
          uint32_t bw[8];
          batch::words8(*reinterpret_cast<const uint4*>(xr), *reinterpret_cast<const uint4*>(xr + 8), bw);
          batch::mma_chunk(acc[j], a, bw);
        }
        __syncthreads();  // stage c % kXStages is refilled by the next iteration's copy
      }
    }

    // Epilogue: acc[j][e] is (row r0 or r1, batch row 8j + 2t + (e & 1)).
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
        if constexpr (kFp8) v = __fmul_rn(p.row_scale[r], v);
        if constexpr (kEpi == Epi::f32_out) {
          static_cast<float*>(p.y)[b * p.ldy + r] = v;
        } else {
          const bf16 lv = f_to_bf16(v);
          if constexpr (kEpi == Epi::bf16_out) {
            static_cast<bf16*>(p.y)[b * p.ldy + r] = lv;
          } else {
            if (p.y) static_cast<bf16*>(p.y)[b * p.ldy + r] = lv;
            const unsigned long long key = argmax_key(bf16_to_f(lv), static_cast<int32_t>(p.index_base + r));
            key_c[e & 1] = key > key_c[e & 1] ? key : key_c[e & 1];
          }
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

  if constexpr (kEpi == Epi::head) {
    __syncthreads();
    for (int b = threadIdx.x; b < NB; b += blockDim.x)
      if (s_best[b] != 0) atomicMax(p.best + b, s_best[b]);
    __threadfence();  // publish the keys before counting this block as done
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(p.counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    for (int b = threadIdx.x; b < NB; b += blockDim.x) {
      if (!s_live[b]) continue;
      // Read and reset in one step (the next launch starts from zeros).
      const unsigned long long key = atomicExch(p.best + b, 0ull);
      ArgMax a;
      a.value = from_order_preserving_u32(static_cast<uint32_t>(key >> 32));
      a.index = static_cast<int32_t>(~static_cast<uint32_t>(key & 0xffffffffull));
      p.out[b] = a;
      // key is argmax_key of the pair just written (-0 is keyed as +0 and comes back as +0), so
      // it is argmax_pack_key's.
      if (p.extras.key) p.extras.key[b] = key;
      if (p.extras.token) p.extras.token[b] = a.index;
    }
    if (threadIdx.x == 0) *p.counter = 0;
  }
}

/// Column tiles of 8 for `rows` batch rows: 1, 2, 4, 8 or 16.
int column_tiles(int rows) {
  int nt = 1;
  while (8 * nt < rows) nt *= 2;
  return nt;
}

template <bool kFp8, int kNT, Epi kEpi>
void launch_rows_gemm(const LaunchCtx& ctx, const GemmParams& p) {
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

void require_aligned16(const char* op, const char* what, const void* ptr) {
  MTP_REQUIRE(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, "ops::cuda::", op, ": ", what,
              " is not 16-byte aligned (the batched GEMM loads 16-byte vectors)");
}

// ---- argmax family over rows ------------------------------------------------------------------------

constexpr int kArgmaxRowThreads = 512;

/// Block b: the argmax of row b (16-byte loads when the rows are aligned), ties to the lowest index.
__global__ void __launch_bounds__(kArgmaxRowThreads)
    argmax_rows_kernel(const bf16* x, int ld_x, int n, int64_t index_base, ArgMax* out, int vec) {
  pdl_begin();
  __shared__ unsigned long long s_best[kArgmaxRowThreads / kWarp];
  const bf16* row = x + static_cast<size_t>(blockIdx.x) * ld_x;
  unsigned long long best = 0;
  int tail = 0;
  if (vec) {
    const int nv = n / 8;
    for (int v = threadIdx.x; v < nv; v += blockDim.x) {
      float f[8];
      batch::unpack8(load_cached(row + static_cast<size_t>(v) * 8), f);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const unsigned long long key = argmax_key(f[e], static_cast<int32_t>(index_base + 8 * v + e));
        best = key > best ? key : best;
      }
    }
    tail = nv * 8;
  }
  for (int i = tail + threadIdx.x; i < n; i += blockDim.x) {
    const unsigned long long key = argmax_key(bf16_to_f(row[i]), static_cast<int32_t>(index_base + i));
    best = key > best ? key : best;
  }
  best = warp_max_u64(best);
  if (threadIdx.x % kWarp == 0) s_best[threadIdx.x / kWarp] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 0; w < kArgmaxRowThreads / kWarp; ++w) best = s_best[w] > best ? s_best[w] : best;
    ArgMax a;
    a.value = from_order_preserving_u32(static_cast<uint32_t>(best >> 32));
    a.index = static_cast<int32_t>(~static_cast<uint32_t>(best & 0xffffffffull));
    out[blockIdx.x] = a;
  }
}

__global__ void unpack_key_rows_kernel(const uint64_t* key, int32_t* token, int rows) {
  pdl_begin();
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b < rows) token[b] = static_cast<int32_t>(~static_cast<uint32_t>(key[b] & 0xffffffffull));
}

/// Row b: the largest value among pairs[i * rows + b], lowest index on ties (argmax_pick's rule).
__global__ void pick_rows_kernel(const ArgMax* pairs, int n, int rows, int32_t* token) {
  pdl_begin();
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  ArgMax best = pairs[b];
  for (int i = 1; i < n; ++i) {
    const ArgMax q = pairs[static_cast<size_t>(i) * rows + b];
    if (q.value > best.value || (q.value == best.value && q.index < best.index)) best = q;
  }
  token[b] = best.index;
}

/// What every rows_gemm launch sets: W's rows of k (BF16 or FP8 bytes), x [rows][ldx], the n output
/// rows through the row map and the tile counts that follow from it.
GemmParams gemm_params(const void* W, const bf16* x, int64_t ldx, int rows, int n, int k,
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

}  // namespace

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
  GemmParams p = gemm_params(Wp, x, k, rows, n, k, GemvRowMap{n, 0, 0, 0});
  p.row_scale = row_scale;
  p.slot = slot;
  p.y = logits;
  p.ldy = ld_logits;
  p.index_base = index_base;
  p.out = out;
  p.extras = extras;
  p.best = s.best;
  p.counter = s.counter;
  if (fp8) {
    dispatch_rows_gemm<true, Epi::head>(ctx, p);
  } else {
    dispatch_rows_gemm<false, Epi::head>(ctx, p);
  }
}

void rows_gemm(const LaunchCtx& ctx, const bf16* W, const bf16* x, int64_t ldx, void* y, bool f32_out,
               int64_t ldy, int rows, int n, int k, const GemvRowMap& map) {
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
  if (f32_out) {
    dispatch_rows_gemm<false, Epi::f32_out>(ctx, p);
  } else {
    dispatch_rows_gemm<false, Epi::bf16_out>(ctx, p);
  }
}

bool rows_gemm_wanted(int rows, int n, int k, bool f32_out) {
  (void)n;
  (void)f32_out;
  if (rows < 2 || rows > kMaxBatchRows || k % 16 != 0) return false;
  // The measured table (docs/kernels.md, "Batched kernels"): cuBLASLt until rows_gemm wins a shape.
  return false;
}

void argmax_batch(const LaunchCtx& ctx, const bf16* x, int ld_x, int rows, int n, int64_t index_base,
                  ArgMax* out, const ArgmaxScratch& single_row) {
  if (rows == 1) {
    argmax(ctx, x, n, index_base, out, single_row);  // the multi-block kernel: one row fills the chip
    return;
  }
  const int vec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && ld_x % 8 == 0 ? 1 : 0;
  launch(ctx, argmax_rows_kernel, rows, kArgmaxRowThreads, 0, x, ld_x, n, index_base, out, vec);
  MTP_CUDA_LAUNCH_CHECK();
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
}  // namespace

void head_finish_rows(const LaunchCtx& ctx, const ArgMax* pairs, const int32_t* slot, int rows,
                      const bf16* logits, int n, bf16* dst, int ld_dst, ArgMax* out, HeadExtras extras) {
  launch(ctx, head_finish_rows_kernel, rows, kFinishThreads, 0, pairs, slot, logits, n, dst, ld_dst, out,
         extras);
  MTP_CUDA_LAUNCH_CHECK();
}

void argmax_unpack_key_batch(const LaunchCtx& ctx, const uint64_t* key, int32_t* token, int rows) {
  launch(ctx, unpack_key_rows_kernel, (rows + 127) / 128, 128, 0, key, token, rows);
  MTP_CUDA_LAUNCH_CHECK();
}

void argmax_pick_batch(const LaunchCtx& ctx, const ArgMax* pairs, int n, int rows, int32_t* token) {
  launch(ctx, pick_rows_kernel, (rows + 127) / 128, 128, 0, pairs, n, rows, token);
  MTP_CUDA_LAUNCH_CHECK();
}

}  // namespace mtplab::ops::cuda
