// Batched absorbed sparse MLA over the pool of slots (ops::KvSlots: one block pool, one block table
// per slot), every row of the batch in one launch:
// - kv_norm_write_batch: block b rms-norms ckv_pre row b and stores it (BF16 copy or FP8 code) at
//   row pos[b] of slot slot[b], through that slot's block table.
// - mla_absorb_q_batch: q_abs[b, h] = W_k,h^T q[b, h] on the CUDA cores. Block (head, 64 columns,
//   32 rows): W_k,h's slab of 64 d-rows and the rows' q slab go through shared memory, each thread
//   keeps 8 rows x 1 column of fp32 sums over d in ascending order. (W_k,h's d is its row index, so
//   the reduction is not along contiguous memory; the MMA path would need a transpose.)
// - mla_decode_batch: grid (head tiles of 16, row splits, rows); each block is the single-row
//   decode's v1 chunk step (kernels_mla.cu): 4 warps each owning kv_lora/4 columns, chunks of 16
//   selected rows through the slot's block table on the tensor cores (S = Q C^T, O += P C, the
//   probabilities split into BF16 hi + lo), an online fp32 softmax. One split per row writes o_lat
//   itself; more write partials that a combine launch merges per (row, head) in split order.
// - mla_out_v_batch: the skinny tensor-core GEMM (dense_batch.cu) over W_kvb's V rows, one group of
//   dv rows per head, x = each row's o_lat[h].
//
// Invariants: padded rows (slot[b] < 0) read and write nothing; the FP8 cache stores E4M3(x / scale)
// (true division, RNE, satfinite) and reads back float(fp8) * scale, bit-identical to the CPU; the
// decode's rounding is one BF16 rounding of o_lat after dividing by the softmax denominator; no
// selected rows give zeros.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/batch_common.cuh"
#include "ops/cuda/batch_kernels.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/device_common.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mla_chunk.cuh"

namespace mtplab::ops::cuda {
namespace {

using batch::kRowThreads;

// ---- kv_norm_write_batch ------------------------------------------------------------------------------

/// The FP8 store of a normed octet: 8 codes in one 8-byte store.
struct StoreFp8Octets {
  uint8_t* row;
  float scale;
  __device__ __forceinline__ void operator()(int v, const uint4& octet) const {
    float f[8];
    batch::unpack8(octet, f);
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      lo |= static_cast<uint32_t>(kv_fp8_code(f[e], scale)) << (8 * e);
      hi |= static_cast<uint32_t>(kv_fp8_code(f[e + 4], scale)) << (8 * e);
    }
    *reinterpret_cast<uint2*>(row + static_cast<size_t>(v) * 8) = make_uint2(lo, hi);
  }
};
struct StoreFp8Elems {
  uint8_t* row;
  float scale;
  __device__ __forceinline__ void operator()(int i, bf16 v) const {
    row[i] = kv_fp8_code(bf16_to_f(v), scale);
  }
};

template <int V>
__global__ void __launch_bounds__(kRowThreads)
    kv_norm_write_batch_kernel(const bf16* ckv_pre, const bf16* w, float eps, const int32_t* slot,
                               const int32_t* pos, const int32_t* block_tables, int max_blocks, void* data,
                               bool fp8, float scale, int block_size, int L) {
  pdl_begin();
  const int b = blockIdx.x;
  const int s = slot ? slot[b] : 0;  // no slots: the single sequence's block table
  if (s < 0) return;                 // padded row
  const int32_t* table = block_tables + static_cast<size_t>(s) * max_blocks;
  const size_t base = static_cast<size_t>(kv_slot(table, pos[b], block_size)) * L;
  const bf16* x = ckv_pre + static_cast<size_t>(b) * L;
  if (fp8) {
    uint8_t* row = static_cast<uint8_t*>(data) + base;
    if constexpr (V == 0) {
      batch::rmsnorm_row_scalar(x, w, L, eps, StoreFp8Elems{row, scale});
    } else {
      batch::rmsnorm_row_vec<V>(x, w, L, eps, StoreFp8Octets{row, scale});
    }
  } else {
    bf16* row = static_cast<bf16*>(data) + base;
    if constexpr (V == 0) {
      batch::rmsnorm_row_scalar(x, w, L, eps, batch::StoreElems{row});
    } else {
      batch::rmsnorm_row_vec<V>(x, w, L, eps, batch::StoreOctets{row});
    }
  }
}

// ---- absorb_q -------------------------------------------------------------------------------------------

constexpr int kAbsorbThreads = 256;
constexpr int kAbsorbCols = 64;  // columns of kv_lora per block (one per thread, 4 row groups)
constexpr int kAbsorbRows = 32;  // batch rows per block: 8 per thread
constexpr int kAbsorbSlab = 64;  // d rows of W_k,h per shared-memory slab
constexpr int kAbsorbRowGroups = kAbsorbThreads / kAbsorbCols;
constexpr int kAbsorbPerThread = kAbsorbRows / kAbsorbRowGroups;

/// Block (h, column tile, row tile); thread (column c, row group rg) sums rows rg, rg + 4, ...
__global__ void __launch_bounds__(kAbsorbThreads)
    absorb_q_batch_kernel(const bf16* q, const bf16* W_kvb, bf16* q_abs, int rows, int n_heads, int dqk,
                          int dv, int L) {
  pdl_begin();
  __shared__ __align__(16) bf16 w_s[kAbsorbSlab][kAbsorbCols];
  __shared__ __align__(16) float q_s[kAbsorbRows][kAbsorbSlab + 4];
  const int h = blockIdx.x;
  const int col0 = blockIdx.y * kAbsorbCols;
  const int row0 = blockIdx.z * kAbsorbRows;
  const int c = threadIdx.x % kAbsorbCols;
  const int rg = threadIdx.x / kAbsorbCols;  // uniform per warp (64 columns = 2 warps)
  const int n_rows = min(kAbsorbRows, rows - row0);
  // This thread's rows: rg + 4i < n_rows.
  const int mine = n_rows > rg ? (n_rows - rg + kAbsorbRowGroups - 1) / kAbsorbRowGroups : 0;
  const bf16* Wk = W_kvb + static_cast<size_t>(h) * (dqk + dv) * L;
  float acc[kAbsorbPerThread] = {};
  for (int d0 = 0; d0 < dqk; d0 += kAbsorbSlab) {
    // W_k,h rows d0 .. d0 + 63, columns col0 .. col0 + 63: 64 x 8 vectors of 8.
    for (int v = threadIdx.x; v < kAbsorbSlab * (kAbsorbCols / 8); v += blockDim.x) {
      const int dd = v / (kAbsorbCols / 8);
      const int c8 = (v % (kAbsorbCols / 8)) * 8;
      const bool ok = d0 + dd < dqk && col0 + c8 < L;
      const uint4 wv =
          ok ? load_stream(Wk + static_cast<size_t>(d0 + dd) * L + col0 + c8) : make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(&w_s[dd][c8]) = wv;
    }
    // q rows row0 .. row0 + 31, head h's d0 .. d0 + 63, widened.
    for (int v = threadIdx.x; v < kAbsorbRows * (kAbsorbSlab / 8); v += blockDim.x) {
      const int r = v / (kAbsorbSlab / 8);
      const int d8 = (v % (kAbsorbSlab / 8)) * 8;
      float f[8] = {};
      if (r < n_rows && d0 + d8 < dqk) {
        batch::unpack8(load_cached(q + (static_cast<size_t>(row0 + r) * n_heads + h) * dqk + d0 + d8), f);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) q_s[r][d8 + e] = f[e];
    }
    __syncthreads();
    const int slab = min(kAbsorbSlab, dqk - d0);
    for (int dd = 0; dd < slab; dd += 4) {
      const float w4[4] = {bf16_to_f(w_s[dd][c]), bf16_to_f(w_s[dd + 1][c]), bf16_to_f(w_s[dd + 2][c]),
                           bf16_to_f(w_s[dd + 3][c])};
#pragma unroll
      for (int i = 0; i < kAbsorbPerThread; ++i) {
        if (i >= mine) break;  // uniform per warp
        const float4 q4 = *reinterpret_cast<const float4*>(&q_s[rg + kAbsorbRowGroups * i][dd]);
        acc[i] = fmaf(w4[0], q4.x, acc[i]);
        acc[i] = fmaf(w4[1], q4.y, acc[i]);
        acc[i] = fmaf(w4[2], q4.z, acc[i]);
        acc[i] = fmaf(w4[3], q4.w, acc[i]);
      }
    }
    __syncthreads();  // the slabs are restaged
  }
  if (col0 + c >= L) return;
#pragma unroll
  for (int i = 0; i < kAbsorbPerThread; ++i) {
    if (i >= mine) break;
    const int r = row0 + rg + kAbsorbRowGroups * i;
    q_abs[(static_cast<size_t>(r) * n_heads + h) * L + col0 + c] = f_to_bf16(acc[i]);
  }
}

// ---- decode
// ------------------------------------------------------------------------------------------------

using namespace mla;  // the decode chunk step every decode path shares (ops/cuda/mla_chunk.cuh)

/// Block (head tile, split, row); kCw = kv_lora / 4 columns per warp.
template <int kCw, bool kFp8>
__global__ void __launch_bounds__(kDecodeThreads) mla_decode_batch_kernel(DecodeParams p) {
  pdl_begin();
  constexpr int kKSteps = kCw / 16;
  constexpr int kNTiles = kCw / 8;
  constexpr int kRowStride = kCw + 8;  // BF16 elements: +16 bytes, conflict-free fragment reads
  constexpr int kVecPerRow = kCw / 8;  // 16-byte vectors of a row slice (8 values)
  constexpr int kLoads = kChunk * kVecPerRow / kWarp;
  static_assert(kLoads >= 1 && kChunk * kVecPerRow % kWarp == 0,
                "a chunk's slice must split evenly over a warp");
  __shared__ __align__(16) uint16_t s_rows[kDecodeWarps][kChunk][kRowStride];
  __shared__ ScoreExchange s_score;

  const int row = blockIdx.z;
  const int slot = p.slot ? p.slot[row] : 0;  // no slots: the single sequence of a KvCache
  if (slot < 0) return;                       // padded row: nothing read, nothing written
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int g = lane >> 2;  // MMA group: head row g and g + 8, row / column index of B
  const int t = lane & 3;
  const int h0 = blockIdx.x * kHeadTile;
  const int split = blockIdx.y;
  const int L = p.kv_lora;
  const int col0 = warp * kCw;
  const int chunks = (p.width + kChunk - 1) / kChunk;
  const int per_split = (chunks + p.splits - 1) / p.splits * kChunk;
  const int i0 = split * per_split;
  const int i1 = min(p.width, i0 + per_split);
  const bool lo_ok = h0 + g < p.n_heads;
  const bool hi_ok = h0 + g + 8 < p.n_heads;
  const bf16* q_abs = p.q_abs + static_cast<size_t>(row) * p.n_heads * L;
  const int32_t* selection = p.selection + static_cast<size_t>(row) * p.width;
  const int32_t* block_table = p.block_tables + static_cast<size_t>(slot) * p.max_blocks;

  // Q as the A operand (row-major heads x columns), this warp's columns, fixed for the block.
  uint32_t qa[kKSteps][4];
  load_q_fragments<kKSteps>(q_abs, h0, g, t, L, col0, lo_ok, hi_ok, qa);

  float o[kNTiles][4];
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY;
  float l_lo = 0.0f, l_hi = 0.0f;  // this thread's columns only; summed over the quad at the end

  // Chunk rows: lane r < 16 holds the cache slot of row c0 + r (-1: padding or past the split).
  auto row_slot = [&](int c0) {
    int64_t cs = -1;
    if (lane < kChunk) {
      const int ii = c0 + lane;
      const int32_t ts = ii < i1 ? selection[ii] : -1;
      if (ts >= 0) cs = kv_slot(block_table, ts, p.block_size);
    }
    return cs;
  };
  // This warp's slice of the chunk's rows into registers (FP8: 8 bytes per vector, in .x/.y).
  auto fetch = [&](int64_t my_slot, uint4(&dst)[kLoads]) {
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int v = lane + u * kWarp;
      const int64_t cs = __shfl_sync(0xffffffffu, my_slot, v / kVecPerRow);
      const size_t off = static_cast<size_t>(cs) * L + col0 + (v % kVecPerRow) * 8;
      dst[u] = make_uint4(0u, 0u, 0u, 0u);
      if (cs >= 0) {
        if constexpr (kFp8) {
          const uint2 f = __ldg(reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(p.cache) + off));
          dst[u].x = f.x;
          dst[u].y = f.y;
        } else {
          dst[u] = __ldg(reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.cache) + off));
        }
      }
    }
  };
  // Software pipeline: the next chunk's rows are loaded while this chunk is computed.
  uint4 next[kLoads];
  int64_t next_slot = row_slot(i0);
  fetch(next_slot, next);
  unsigned next_valid = __ballot_sync(0xffffffffu, next_slot >= 0);  // bit r: chunk row r is selected

  for (int c0 = i0; c0 < i1; c0 += kChunk) {
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int v = lane + u * kWarp;
      const uint4 val = kFp8 ? fp8x8_to_bf16x8(make_uint2(next[u].x, next[u].y)) : next[u];
      *reinterpret_cast<uint4*>(&s_rows[warp][v / kVecPerRow][(v % kVecPerRow) * 8]) = val;
    }
    const unsigned valid_rows = next_valid;
    __syncwarp();
    if (c0 + kChunk < i1) {
      next_slot = row_slot(c0 + kChunk);
      fetch(next_slot, next);
      next_valid = __ballot_sync(0xffffffffu, next_slot >= 0);
    }

    // Partial S over this warp's columns: tile j holds rows 8j .. 8j+7 of the chunk.
    float sc[2][4] = {};
    chunk_scores<kKSteps, kRowStride>(&s_rows[warp][0][0], qa, g, t, sc);
    stage_scores(s_score, warp, g, t, sc);
    __syncthreads();
    float s[2][4];
    sum_scores<kFp8>(s_score, g, t, valid_rows, p.cache_scale, p.softmax_scale, s);
    __syncthreads();  // s_score is rewritten by the next chunk

    uint32_t ah[4], al[4];
    online_softmax_step<kNTiles>(s, m_lo, m_hi, l_lo, l_hi, o, ah, al);
    accumulate_pv<kNTiles, kRowStride>(&s_rows[warp][0][0], ah, al, g, t, o);
    __syncwarp();  // s_rows is restaged by the next chunk
  }

  l_lo = quad_sum(l_lo);
  l_hi = quad_sum(l_hi);
  const float out_scale = kFp8 ? p.cache_scale : 1.0f;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (!(half ? hi_ok : lo_ok)) continue;
    const int h = h0 + g + 8 * half;
    if (p.splits == 1) {
      // The combine of one split: o_lat = bf16(acc / l), zeros when nothing was selected.
      const float l = half ? l_hi : l_lo;
      bf16* out = p.o_lat + (static_cast<size_t>(row) * p.n_heads + h) * L;
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        const int c = col0 + n * 8 + 2 * t;
        out[c] = l > 0.0f ? f_to_bf16((o[n][2 * half] * out_scale) / l) : bf16{0};
        out[c + 1] = l > 0.0f ? f_to_bf16((o[n][2 * half + 1] * out_scale) / l) : bf16{0};
      }
      continue;
    }
    float* out = p.scratch + ((static_cast<size_t>(row) * p.n_heads + h) * p.splits + split) * (2 + L);
    if (warp == 0 && t == 0) {
      out[0] = half ? m_hi : m_lo;
      out[1] = half ? l_hi : l_lo;
    }
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      const int c = col0 + n * 8 + 2 * t;
      out[2 + c] = o[n][2 * half] * out_scale;
      out[2 + c + 1] = o[n][2 * half + 1] * out_scale;
    }
  }
}

constexpr int kCombineThreads = 128;

/// o_lat[b, h] = bf16(sum_s acc_s e^{m_s - M} / sum_s l_s e^{m_s - M}), splits in order; zeros when
/// no row was selected. Block (head, 128 columns, row).
__global__ void __launch_bounds__(kCombineThreads)
    mla_combine_batch_kernel(const float* scratch, const int32_t* slot, int splits, int n_heads, int kv_lora,
                             bf16* o_lat) {
  pdl_begin();
  extern __shared__ float s_w[];  // [splits]
  __shared__ float s_red[kCombineThreads / kWarp];
  __shared__ float s_max, s_denom;
  const int row = blockIdx.z;
  if (slot && slot[row] < 0) return;  // padded row
  const int h = blockIdx.x;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const size_t stride = 2 + static_cast<size_t>(kv_lora);
  const float* part = scratch + (static_cast<size_t>(row) * n_heads + h) * splits * stride;
  float M = -INFINITY;
  for (int sp = threadIdx.x; sp < splits; sp += blockDim.x) M = fmaxf(M, part[sp * stride]);
  M = warp_max(M);
  if (lane == 0) s_red[warp] = M;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = s_red[0];
    for (int w = 1; w < kCombineThreads / kWarp; ++w) m = fmaxf(m, s_red[w]);
    s_max = m;
  }
  __syncthreads();
  M = s_max;
  float d = 0.0f;
  for (int sp = threadIdx.x; sp < splits; sp += blockDim.x) {
    const float ms = part[sp * stride];
    const float wgt = ms == -INFINITY ? 0.0f : expf(ms - M);
    s_w[sp] = wgt;
    d = fmaf(part[sp * stride + 1], wgt, d);
  }
  d = warp_sum(d);
  __syncthreads();  // s_red is reused
  if (lane == 0) s_red[warp] = d;
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0.0f;
    for (int w = 0; w < kCombineThreads / kWarp; ++w) t += s_red[w];
    s_denom = t;
  }
  __syncthreads();
  const float denom = s_denom;
  const int c = blockIdx.y * kCombineThreads + threadIdx.x;
  if (c >= kv_lora) return;
  float a = 0.0f;
#pragma unroll 16
  for (int sp = 0; sp < splits; ++sp) a = fmaf(part[sp * stride + 2 + c], s_w[sp], a);
  o_lat[(static_cast<size_t>(row) * n_heads + h) * kv_lora + c] =
      denom > 0.0f ? f_to_bf16(a / denom) : bf16{0};
}

template <int kCw, bool kFp8>
void launch_decode_batch(const LaunchCtx& ctx, const DecodeParams& p, int rows) {
  const dim3 grid((p.n_heads + kHeadTile - 1) / kHeadTile, p.splits, rows);
  launch(ctx, mla_decode_batch_kernel<kCw, kFp8>, grid, kDecodeThreads, 0, p);
  MTP_CUDA_LAUNCH_CHECK();
}

}  // namespace

void kv_norm_write_batch(const LaunchCtx& ctx, const bf16* ckv_pre, const bf16* w, float eps,
                         const int32_t* slot, const int32_t* pos, int rows, const KvSlots& kv) {
  const KvCache& cache = kv.cache;
  const int L = cache.kv_lora;
  MTP_REQUIRE(reinterpret_cast<uintptr_t>(cache.data) % 16 == 0,
              "ops::cuda::kv_norm_write_batch: the cache must be 16-byte aligned");
  // ckv_pre rows at multiples of L; cache rows at multiples of L (BF16 or FP8): both aligned when
  // L is a whole number of octets (batch::row_vecs) and the bases are.
  const int v = batch::row_vecs(L, {ckv_pre, w});
  const bool fp8 = cache.dtype == KvDtype::fp8;
  batch::with_vecs(v, [&](auto V) {
    launch(ctx, kv_norm_write_batch_kernel<decltype(V)::value>, rows, kRowThreads, 0, ckv_pre, w, eps, slot,
           pos, kv.block_tables, kv.max_blocks, cache.data, fp8, cache.scale, cache.block_size, L);
  });
  MTP_CUDA_LAUNCH_CHECK();
}

void mla_absorb_q_batch(const LaunchCtx& ctx, const bf16* q, const bf16* W_kvb, bf16* q_abs, int rows,
                        int n_heads, int dqk, int dv, int kv_lora) {
  MTP_REQUIRE(n_heads >= 1 && dqk >= 8 && dqk % 8 == 0 && dv >= 0 && kv_lora >= 8 && kv_lora % 8 == 0,
              "ops::cuda::mla_absorb_q_batch: n_heads ", n_heads, ", dqk ", dqk, ", dv ", dv, ", kv_lora ",
              kv_lora, " (dqk and kv_lora must be multiples of 8)");
  MTP_REQUIRE(reinterpret_cast<uintptr_t>(W_kvb) % 16 == 0 && reinterpret_cast<uintptr_t>(q) % 16 == 0,
              "ops::cuda::mla_absorb_q_batch: q and W_kvb must be 16-byte aligned");
  const dim3 grid(n_heads, (kv_lora + kAbsorbCols - 1) / kAbsorbCols, (rows + kAbsorbRows - 1) / kAbsorbRows);
  launch(ctx, absorb_q_batch_kernel, grid, kAbsorbThreads, 0, q, W_kvb, q_abs, rows, n_heads, dqk, dv,
         kv_lora);
  MTP_CUDA_LAUNCH_CHECK();
}

int mla_decode_batch_splits(const LaunchCtx& ctx, int width, int n_heads, int rows) {
  const int chunks = std::max(1, (width + kChunk - 1) / kChunk);
  if (ctx.policy.mla_batch_splits > 0) return std::min(ctx.policy.mla_batch_splits, chunks);  // forced
  const int tiles = (n_heads + kHeadTile - 1) / kHeadTile;
  // At least two chunks of 16 rows per block, and about two blocks per multiprocessor over the
  // whole batch: a large batch fills the chip with one split per row (no combine).
  const int64_t work = static_cast<int64_t>(chunks) * tiles * rows;
  const int per_split =
      static_cast<int>(std::max<int64_t>(2, (work + 2 * ctx.num_sms - 1) / (2 * ctx.num_sms)));
  return std::max(1, (chunks + per_split - 1) / per_split);
}

size_t mla_decode_batch_scratch_floats(int splits, int n_heads, int kv_lora, int rows) {
  if (splits <= 1) return 0;
  return static_cast<size_t>(rows) * n_heads * splits * (2 + static_cast<size_t>(kv_lora));
}

void mla_decode_batch(const LaunchCtx& ctx, const bf16* q_abs, const int32_t* selection, int width,
                      const int32_t* slot, int rows, const KvSlots& kv, bf16* o_lat, int n_heads,
                      float softmax_scale, int splits, float* scratch) {
  const KvCache& cache = kv.cache;
  const int L = cache.kv_lora;
  MTP_REQUIRE(
      L == 64 || L == 128 || L == 256 || L == 512, "ops::cuda::mla_decode_batch: kv_lora ", L,
      " is not supported (64, 128, 256 or 512: each of 4 warps takes kv_lora/4 columns, a multiple of 16)");
  MTP_REQUIRE(splits >= 1 && splits <= 8192 && (splits == 1 || scratch),
              "ops::cuda::mla_decode_batch: ", splits, " splits without scratch");
  MTP_REQUIRE(
      reinterpret_cast<uintptr_t>(cache.data) % 16 == 0 && reinterpret_cast<uintptr_t>(q_abs) % 4 == 0,
      "ops::cuda::mla_decode_batch: the cache must be 16-byte and q_abs 4-byte aligned");
  DecodeParams p{q_abs,       selection,        width, slot,    kv.block_tables, kv.max_blocks, cache.data,
                 cache.scale, cache.block_size, L,     n_heads, softmax_scale,   splits,        scratch,
                 o_lat};
  const bool fp8 = cache.dtype == KvDtype::fp8;
  switch (L) {
    case 64:
      fp8 ? launch_decode_batch<16, true>(ctx, p, rows) : launch_decode_batch<16, false>(ctx, p, rows);
      break;
    case 128:
      fp8 ? launch_decode_batch<32, true>(ctx, p, rows) : launch_decode_batch<32, false>(ctx, p, rows);
      break;
    case 256:
      fp8 ? launch_decode_batch<64, true>(ctx, p, rows) : launch_decode_batch<64, false>(ctx, p, rows);
      break;
    default:
      fp8 ? launch_decode_batch<128, true>(ctx, p, rows) : launch_decode_batch<128, false>(ctx, p, rows);
      break;
  }
  if (splits > 1) mla_combine_rows(ctx, scratch, slot, rows, splits, n_heads, L, o_lat);
}

void mla_combine_rows(const LaunchCtx& ctx, const float* scratch, const int32_t* slot, int rows, int partials,
                      int n_heads, int kv_lora, bf16* o_lat) {
  const dim3 grid(n_heads, (kv_lora + kCombineThreads - 1) / kCombineThreads, rows);
  launch(ctx, mla_combine_batch_kernel, grid, kCombineThreads, sizeof(float) * static_cast<size_t>(partials),
         scratch, slot, partials, n_heads, kv_lora, o_lat);
  MTP_CUDA_LAUNCH_CHECK();
}

void mla_out_v_batch(const LaunchCtx& ctx, const bf16* o_lat, const bf16* W_kvb, bf16* o, int rows,
                     int n_heads, int dqk, int dv, int kv_lora) {
  MTP_REQUIRE(dv >= 1 && kv_lora >= 16 && kv_lora % 16 == 0, "ops::cuda::mla_out_v_batch: dv ", dv,
              ", kv_lora ", kv_lora, " (kv_lora must be a positive multiple of 16)");
  // Output row r = h * dv + i reads W_kvb row h * (dqk + dv) + dqk + i and x = o_lat[b, h].
  const GemvRowMap map{dv, static_cast<int64_t>(dqk) + dv, dqk, kv_lora};
  rows_gemm(ctx, W_kvb, o_lat, static_cast<int64_t>(n_heads) * kv_lora, o, false,
            static_cast<int64_t>(n_heads) * dv, rows, n_heads * dv, kv_lora, map);
}

}  // namespace mtplab::ops::cuda
