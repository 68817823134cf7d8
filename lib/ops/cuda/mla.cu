// Absorbed sparse MLA over the paged latent cache (the CPU reference: cpu/mla.cpp): the latent row
// write (BF16 / FP8), the query absorption q_abs = W_k^T q, and the split-row decode with its
// combine.
// - One row: kv_write, absorb_q; kv_norm_write and the decode run the batched ops at one row
//   (the decode: the backend's mla_decode_batch with one row). mla_out_v is a GEMV over W_kvb's V
//   rows (gemv.cu, through a row map).
// - Batched rows, over the pool of slots (ops::KvSlots: one block pool, one block table per slot),
//   every row of the batch in one launch:
//   - kv_norm_write_batch: block b rms-norms ckv_pre row b and stores it (BF16 copy or FP8 code) at
//     row pos[b] of slot slot[b], through that slot's block table.
//   - mla_absorb_q_batch: q_abs[b, h] = W_k,h^T q[b, h]: from two rows per-head GEMMs on the tensor
//     cores ("absorb_q on the tensor cores"); one row runs the single-row absorb_q kernel.
//   - mla_decode_batch, by the policy's mla_batch and mla_decode: the tiles rule's v2 (the decode
//     v2 kernel below, grid (splits, head tiles, rows)) or v1 (mla_decode_batch_kernel, grid (head
//     tiles of 16, row splits, rows)), each block the decode's v1 chunk step (mla_chunk.cuh): 4
//     warps each owning kv_lora/4 columns, chunks of 16 selected rows through the slot's block
//     table on the tensor cores (S = Q C^T, O += P C, the probabilities split into BF16 hi + lo), an
//     online fp32 softmax; or the shared kernels (mla_shared.cuh), the head tiles of a row in one
//     block. One split (v1, shared) or cluster (v2) per (row, head tile) writes o_lat itself; more
//     write partials that a combine launch merges per (row, head) in split order.
//   - mla_out_v_batch: the skinny tensor-core GEMM (rows_gemm.cu) over W_kvb's V rows, one group of dv
//     rows per head, x = each row's o_lat[h].
//
// Invariants:
// - Row t lives at slot block_table[t / block_size] * block_size + t % block_size (the CPU
//   reference's cache_slot); a kernel cannot throw, so block ids are trusted here and checked by
//   the CPU reference in tests. Padded rows (slot[b] < 0) read and write nothing.
// - FP8 cache: stored as E4M3(x / scale) with a true division and RNE + satfinite, read back as
//   float(fp8) * scale: bit-identical to the CPU.
// - Decode: one block per (16-head tile, row split) on the tensor cores (mla_chunk.cuh), an
//   online softmax in fp32 over chunks of 16 rows, merged across splits with max-rescaling in a
//   fixed order (deterministic); o_lat is rounded to BF16 once, after dividing by the softmax
//   denominator, as the CPU does. No selected rows -> zeros. q_abs rows must be 4-byte aligned
//   (BF16 pairs are read as u32), cache rows 16-byte aligned. Two paths with the same chunk step
//   (the policy's mla_decode, ops/kernel_policy.hpp), one row or a batch: v1
//   (mla_decode_batch_kernel, every split merged by its combine) and v2 (mla_decode_v2_kernel,
//   "decode v2" below), the default; both combine through mla_combine_rows.
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/batch_common.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dense.hpp"
#include "ops/cuda/device_common.cuh"
#include "ops/cuda/dispatch.hpp"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mla.hpp"
#include "ops/cuda/mla_chunk.cuh"
#include "ops/cuda/mla_shared.cuh"

namespace mtplab::ops::cuda {

// ==== one row ==========================================================================================

namespace {

// The device helpers the batched kernels share (ops/cuda/batch_common.cuh).
using batch::cp_async16;
using batch::cp_async_commit;
using batch::cp_async_wait;
using batch::mma_16816;
using batch::pack_bf16x2;
// The decode chunk step every decode path shares (ops/cuda/mla_chunk.cuh).
using namespace mla;

// ---- kv_write -----------------------------------------------------------------------------------------

__global__ void kv_write_kernel(const bf16* c_kv, const int32_t* block_table, const int32_t* pos, void* data,
                                bool fp8, float scale, int block_size, int kv_lora) {
  pdl_begin();
  const size_t base = static_cast<size_t>(kv_slot(block_table, pos[0], block_size)) * kv_lora;
  for (int c = threadIdx.x; c < kv_lora; c += blockDim.x) {
    if (fp8) {
      static_cast<uint8_t*>(data)[base + c] = kv_fp8_code(bf16_to_f(c_kv[c]), scale);
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
  pdl_begin();
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

// ---- decode v2 -----------------------------------------------------------------------------------------
//
// The same chunk step as the v1 decode (mla_decode_batch_kernel) (head tile of 16, 4 warps each owning
// kv_lora/4 columns, chunks of 16 rows, the same MMAs, softmax and rounding points), organised for a short
// critical path and few partials:
// - Grid (split, head tile, row): about one block per multiprocessor over the whole launch, split s of
//   S owns chunks [s*C/S, (s+1)*C/S) of the row's C chunks (balanced to one chunk), at most
//   kMaxSplitChunks. The row (blockIdx.z) reads the batch's layout as the v1 kernel does (q_abs,
//   selection and o_lat rows, its slot's block table); a padded row's blocks return at once, the
//   whole cluster together (it lies along x, inside one row), so no cluster barrier is left waiting.
//   One row with no slot array reads slot 0: offsets 0, the same arithmetic.
// - The split's row slots (selection -> block table) are resolved once into shared memory, every
//   thread resolving a few rows in parallel: two round trips per block instead of two per chunk.
// - Each warp streams its slice of the rows into a ring of kStages chunks with cp.async (16 bytes,
//   zero-filled for padding: a padded row must be 0, not stale shared memory, as P = 0 times NaN
//   is NaN), kStages - 1 chunks ahead of the one it computes.
// - The partial scores go through a double-buffered s_score: one __syncthreads per chunk.
// - The kCluster splits of a thread-block cluster merge their (max, denominator, sums) over
//   distributed shared memory, block rank r taking columns [r*L/8, (r+1)*L/8), peers in rank
//   order (deterministic). One cluster per (row, head tile) writes o_lat itself; more write one
//   partial per cluster, which mla_combine_rows merges (S / 8 partials per head instead of S).

// kCluster, kMaxSplitChunks: mla_chunk.cuh (dispatch.cu's split rule reads them too).
constexpr int kStages = 4;  // cp.async ring depth per warp, in chunks
constexpr int kMaxSplitRows = kMaxSplitChunks * kChunk;
constexpr int kGatherPerThread = kMaxSplitRows / kDecodeThreads;
static_assert(kMaxSplitRows % kDecodeThreads == 0, "the slot gather must split evenly over the block");
static_assert(kHeadTile * kCluster == kDecodeThreads, "the cluster merge gives one thread per (head, rank)");

/// Dynamic shared memory of mla_decode_v2_kernel (bytes; every region a multiple of 16).
template <int kCw, bool kFp8>
struct DecodeV2Smem {
  static constexpr int kL = kDecodeWarps * kCw;
  static constexpr int kRowStride = kCw + 8;                             // BF16 rows, as the v1 decode
  static constexpr int kStageStride = kFp8 ? kCw + 16 : 2 * kRowStride;  // bytes per staged row
  static constexpr int kStageBytes = kChunk * kStageStride;
  static constexpr int kRingBytes = kDecodeWarps * kStages * kStageBytes;
  static constexpr int kConvBytes = kFp8 ? kDecodeWarps * kChunk * kRowStride * 2 : 0;
  // The merge's exchange (after the loop, over the ring): [16][kXStride] sums, then [16][2] (m, l).
  static constexpr int kXStride = kL + 8;  // floats: conflict-free float2 stores of the fragments
  static constexpr int kXBytes = (kHeadTile * kXStride + 2 * kHeadTile) * 4;
  static constexpr int kBytes = (kRingBytes > kXBytes ? kRingBytes : kXBytes) + kConvBytes;
  static_assert(kStageStride % 16 == 0 && kRingBytes % 16 == 0, "cp.async needs 16-byte rows");
};

/// Block (split, head tile, row) of a cluster of kCluster splits; see "decode v2" above. p.splits is
/// S (a multiple of kCluster); p.scratch holds [rows][n_heads][S / kCluster][2 + kv_lora] when
/// S > kCluster.
template <int kCw, bool kFp8>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kDecodeThreads)
    mla_decode_v2_kernel(DecodeParams p) {
  pdl_begin();
  using Smem = DecodeV2Smem<kCw, kFp8>;
  constexpr int kL = Smem::kL;
  constexpr int kKSteps = kCw / 16;
  constexpr int kNTiles = kCw / 8;
  constexpr int kRowStride = Smem::kRowStride;
  constexpr int kElem = kFp8 ? 1 : 2;
  constexpr int kVecPerRow = kCw * kElem / 16;  // 16-byte copies per row slice
  constexpr int kColsPerRank = kL / kCluster;
  static_assert(kVecPerRow >= 1 && kL % kCluster == 0, "row slices must be whole 16-byte copies");
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int64_t s_slot[kMaxSplitRows];  // cache slot of the split's row r, -1: padding
  __shared__ ScoreExchange s_score[2];
  __shared__ float s_w[kHeadTile][kCluster];   // merge weights e^{m_k - M} per (head, rank)
  __shared__ float s_lw[kHeadTile][kCluster];  // l_k e^{m_k - M}
  __shared__ float s_m[kHeadTile];             // M per head

  const int row = blockIdx.z;
  const int slot = p.slot ? p.slot[row] : 0;  // no slots: the single sequence of a KvCache
  if (slot < 0) return;  // padded row: the row's every cluster returns whole, nothing read or written
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int h0 = blockIdx.y * kHeadTile;
  const int split = blockIdx.x;
  const int col0 = warp * kCw;
  const int chunks = (p.width + kChunk - 1) / kChunk;
  const int c_begin = static_cast<int>(static_cast<int64_t>(split) * chunks / p.splits);
  const int c_end = static_cast<int>(static_cast<int64_t>(split + 1) * chunks / p.splits);
  const int n_chunks = c_end - c_begin;  // <= kMaxSplitChunks (checked on the host)
  const int i0 = c_begin * kChunk;
  const int i1 = min(p.width, c_end * kChunk);
  const bool lo_ok = h0 + g < p.n_heads;
  const bool hi_ok = h0 + g + 8 < p.n_heads;
  const auto [q_abs, selection, block_table] = decode_row(p, row, slot, kL);

  // Q as the A operand, this warp's columns (as the v1 decode).
  uint32_t qa[kKSteps][4];
  load_q_fragments<kKSteps>(q_abs, h0, g, t, kL, col0, lo_ok, hi_ok, qa);

  // Slots of the split's rows, all selection loads first, then all block-table loads. Rows past
  // i1 up to the last chunk's end are padding.
  {
    int32_t ts[kGatherPerThread];
#pragma unroll
    for (int u = 0; u < kGatherPerThread; ++u) {
      const int ii = i0 + static_cast<int>(threadIdx.x) + u * kDecodeThreads;
      ts[u] = ii < i1 ? selection[ii] : -1;
    }
#pragma unroll
    for (int u = 0; u < kGatherPerThread; ++u) {
      int64_t cs = -1;
      if (ts[u] >= 0)
        cs = static_cast<int64_t>(block_table[ts[u] / p.block_size]) * p.block_size + ts[u] % p.block_size;
      s_slot[threadIdx.x + u * kDecodeThreads] = cs;
    }
  }
  __syncthreads();

  unsigned char* ring = smem + warp * kStages * Smem::kStageBytes;  // this warp's stages
  uint16_t* conv = reinterpret_cast<uint16_t*>(smem + (Smem::kBytes - Smem::kConvBytes)) +
                   warp * kChunk * kRowStride;  // FP8: the chunk widened to BF16
  const unsigned char* cache = static_cast<const unsigned char*>(p.cache);
  // Chunk k of the split (this warp's slice) into stage k % kStages; always one commit group, empty
  // past the last chunk, so the group count is the chunk count.
  auto issue = [&](int k) {
    if (k < n_chunks) {
      unsigned char* stage = ring + (k % kStages) * Smem::kStageBytes;
      for (int v = lane; v < kChunk * kVecPerRow; v += kWarp) {
        const int r = v / kVecPerRow;
        const int64_t cs = s_slot[k * kChunk + r];
        const unsigned char* src =
            cs >= 0 ? cache + (static_cast<size_t>(cs) * kL + col0) * kElem + (v % kVecPerRow) * 16 : cache;
        cp_async16(stage + r * Smem::kStageStride + (v % kVecPerRow) * 16, src, cs >= 0 ? 16 : 0);
      }
    }
    cp_async_commit();
  };

  float o[kNTiles][4];
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY;
  float l_lo = 0.0f, l_hi = 0.0f;  // this thread's score columns only; summed over the quad at the end

#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) issue(k);
  for (int k = 0; k < n_chunks; ++k) {
    // Refill the stage chunk k - 1 used (released by the __syncwarp ending that iteration), then
    // wait for chunk k: groups 0 .. k of the k + kStages committed.
    issue(k + kStages - 1);
    cp_async_wait<kStages - 1>();
    __syncwarp();  // every lane's copies of chunk k are visible to the warp
    const uint16_t* rows;
    if constexpr (kFp8) {
      const unsigned char* stage = ring + (k % kStages) * Smem::kStageBytes;
      for (int v = lane; v < kChunk * (kCw / 8); v += kWarp) {
        const int r = v / (kCw / 8), c8 = v % (kCw / 8);
        const uint2 f = *reinterpret_cast<const uint2*>(stage + r * Smem::kStageStride + c8 * 8);
        *reinterpret_cast<uint4*>(conv + r * kRowStride + c8 * 8) = fp8x8_to_bf16x8(f);
      }
      __syncwarp();
      rows = conv;
    } else {
      rows = reinterpret_cast<const uint16_t*>(ring + (k % kStages) * Smem::kStageBytes);
    }
    const unsigned valid_rows =
        __ballot_sync(0xffffffffu, lane < kChunk && s_slot[k * kChunk + (lane % kChunk)] >= 0);

    float sc[2][4] = {};
    chunk_scores<kKSteps, kRowStride>(rows, qa, g, t, sc);
    // s_score[k & 1] was last read in chunk k - 2, before every warp passed chunk k - 1's barrier.
    ScoreExchange& score = s_score[k & 1];
    stage_scores(score, warp, g, t, sc);
    __syncthreads();
    float s[2][4];
    sum_scores<kFp8>(score, g, t, valid_rows, p.cache_scale, p.softmax_scale, s);

    // Online softmax per head row (quad-wide max), then rescale the running sums; P's fragments.
    uint32_t ah[4], al[4];
    online_softmax_step<kNTiles>(s, m_lo, m_hi, l_lo, l_hi, o, ah, al);
    accumulate_pv<kNTiles, kRowStride>(rows, ah, al, g, t, o);
    __syncwarp();  // this stage (and conv) is rewritten by the next iteration
  }

  l_lo = quad_sum(l_lo);
  l_hi = quad_sum(l_hi);

  // The block's (m, l, sums) into the exchange, over the ring: every copy has landed (only empty
  // groups can be pending) and every warp is done with its stages.
  cp_async_wait<0>();
  __syncthreads();
  float* x_o = reinterpret_cast<float*>(smem);     // [kHeadTile][kXStride]
  float* x_ml = x_o + kHeadTile * Smem::kXStride;  // [kHeadTile][2]
  const float out_scale = kFp8 ? p.cache_scale : 1.0f;
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) {
    const int c = col0 + n * 8 + 2 * t;
    *reinterpret_cast<float2*>(x_o + g * Smem::kXStride + c) =
        make_float2(o[n][0] * out_scale, o[n][1] * out_scale);
    *reinterpret_cast<float2*>(x_o + (g + 8) * Smem::kXStride + c) =
        make_float2(o[n][2] * out_scale, o[n][3] * out_scale);
  }
  if (warp == 0 && t == 0) {
    x_ml[2 * g] = m_lo;
    x_ml[2 * g + 1] = l_lo;
    x_ml[2 * (g + 8)] = m_hi;
    x_ml[2 * (g + 8) + 1] = l_hi;
  }
  cluster.sync();  // the cluster's exchanges are written and visible

  // Merge weights: thread (head h, rank k); the max over the 8 ranks is over 8 adjacent lanes.
  {
    const int h = threadIdx.x / kCluster, k = threadIdx.x % kCluster;
    const float* peer_ml = cluster.map_shared_rank(x_ml, k);
    const float mk = peer_ml[2 * h], lk = peer_ml[2 * h + 1];
    float M = mk;
    M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, 1));
    M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, 2));
    M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, 4));
    const float w = mk == -INFINITY ? 0.0f : expf(mk - M);  // 0 for an empty split (l_k = 0, sums 0)
    s_w[h][k] = w;
    s_lw[h][k] = lk * w;
    if (k == 0) s_m[h] = M;
  }
  __syncthreads();

  const int rank = static_cast<int>(cluster.block_rank());
  const int clusters = p.splits / kCluster;
  const int cl = split / kCluster;
  const float* peer_o[kCluster];
#pragma unroll
  for (int k = 0; k < kCluster; ++k) peer_o[k] = cluster.map_shared_rank(x_o, k);
  for (int e = threadIdx.x; e < kHeadTile * kColsPerRank; e += kDecodeThreads) {
    const int h = e / kColsPerRank;
    const int c = rank * kColsPerRank + e % kColsPerRank;
    if (h0 + h >= p.n_heads) continue;
    float a = 0.0f, d = 0.0f;
#pragma unroll
    for (int k = 0; k < kCluster; ++k) {
      a = fmaf(peer_o[k][h * Smem::kXStride + c], s_w[h][k], a);
      d += s_lw[h][k];
    }
    const size_t rh = static_cast<size_t>(row) * p.n_heads + h0 + h;  // (row, head)
    if (clusters == 1) {
      p.o_lat[rh * kL + c] = d > 0.0f ? f_to_bf16(a / d) : bf16{0};
    } else {
      float* out = p.scratch + (rh * clusters + cl) * (2 + kL);
      out[2 + c] = a;
      if (c == 0) {  // rank 0's first column
        out[0] = s_m[h];
        out[1] = d;
      }
    }
  }
  cluster.sync();  // no block leaves while a peer may still read its exchange
}

/// The v2 decode kernel for kCw = kv_lora / 4 columns per warp and the cache type, over `rows` rows.
template <int kCw, bool kFp8>
void launch_decode_v2(const LaunchCtx& ctx, const DecodeParams& p, int rows) {
  const int tiles = (p.n_heads + kHeadTile - 1) / kHeadTile;
  constexpr int kBytes = DecodeV2Smem<kCw, kFp8>::kBytes;
  // Above the 48 KB default at kv_lora 512; a host-side attribute, allowed while capturing.
  MTP_CUDA_CHECK(cudaFuncSetAttribute(mla_decode_v2_kernel<kCw, kFp8>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
  launch(ctx, mla_decode_v2_kernel<kCw, kFp8>, dim3(p.splits, tiles, rows), kDecodeThreads,
         static_cast<size_t>(kBytes), p);
  MTP_CUDA_LAUNCH_CHECK();
}

/// The v2 decode of `rows` rows (64, 128, 256 or 512 kv_lora, checked by the callers), then the
/// combine of its clusters' partials when there is more than one cluster per (row, head tile).
void decode_v2(const LaunchCtx& ctx, const DecodeParams& p, bool fp8, int rows) {
  with_decode_shape(p.kv_lora, fp8, [&](auto cw, auto f8) { launch_decode_v2<cw(), f8()>(ctx, p, rows); });
  // One cluster per (row, head tile) wrote o_lat itself: nothing to merge.
  const int partials = p.splits / kCluster;
  if (partials > 1) mla_combine_rows(ctx, p.scratch, p.slot, rows, partials, p.n_heads, p.kv_lora, p.o_lat);
}

/// The v2 checks of a split count (mla_decode_batch): a multiple of 8, at most
/// kMaxSplitChunks chunks per split, scratch for more than one cluster, a 16-byte aligned cache.
void require_v2_splits(const char* op, const char* splits_fn, int width, int splits, const float* scratch,
                       const void* cache) {
  const int chunks = (width + kChunk - 1) / kChunk;
  MTP_REQUIRE(splits % kCluster == 0 && (chunks + splits - 1) / splits <= kMaxSplitChunks, "ops::cuda::", op,
              ": ", splits, " splits for ", chunks,
              " chunks (v2 needs a multiple of 8 and at most 32 chunks per split: use ", splits_fn, ")");
  MTP_REQUIRE(splits == kCluster || scratch, "ops::cuda::", op, ": ", splits, " splits without scratch");
  MTP_REQUIRE(reinterpret_cast<uintptr_t>(cache) % 16 == 0, "ops::cuda::", op, ": cache not 16-byte aligned");
}

}  // namespace

void kv_write(const LaunchCtx& ctx, const bf16* c_kv, const int32_t* block_table, const int32_t* pos,
              const KvCache& cache) {
  MTP_REQUIRE(cache.data && cache.block_size >= 1 && cache.kv_lora >= 1, "ops::cuda::kv_write: bad cache");
  launch(ctx, kv_write_kernel, 1, 256, 0, c_kv, block_table, pos, cache.data, cache.dtype == KvDtype::fp8,
         cache.scale, cache.block_size, cache.kv_lora);
  MTP_CUDA_LAUNCH_CHECK();
}

void kv_norm_write(const LaunchCtx& ctx, const bf16* x, const bf16* w, float eps, const int32_t* block_table,
                   const int32_t* pos, const KvCache& cache) {
  const int n = cache.kv_lora;
  MTP_REQUIRE(cache.data && cache.block_size >= 1 && n >= 1, "ops::cuda::kv_norm_write: bad cache");
  // The batched kernel at one row, the sequence's block table as slot 0's (below).
  kv_norm_write_batch(ctx, x, w, eps, nullptr, pos, 1, KvSlots{cache, block_table, 1, 0});
}

void mla_absorb_q(const LaunchCtx& ctx, const bf16* q, const bf16* W_kvb, bf16* q_abs, int n_heads, int dqk,
                  int dv, int kv_lora) {
  MTP_REQUIRE(n_heads >= 1 && dqk >= 1 && dv >= 0 && kv_lora >= 8 && kv_lora % 8 == 0,
              "ops::cuda::mla_absorb_q: n_heads ", n_heads, ", dqk ", dqk, ", dv ", dv, ", kv_lora ", kv_lora,
              " (kv_lora must be a multiple of 8)");
  MTP_REQUIRE(reinterpret_cast<uintptr_t>(W_kvb) % 16 == 0,
              "ops::cuda::mla_absorb_q: W_kvb not 16-byte aligned");
  const dim3 grid(n_heads, (kv_lora + kAbsorbCols - 1) / kAbsorbCols);
  launch(ctx, absorb_q_kernel, grid, kAbsorbThreads, 0, q, W_kvb, q_abs, dqk, dv, kv_lora);
  MTP_CUDA_LAUNCH_CHECK();
}

// ==== batched rows =====================================================================================

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

// ---- absorb_q on the tensor cores ------------------------------------------------------------------------
//
// q_abs[b, h] = W_k,h^T q[b, h] as per-head GEMMs: C[b][c] = sum_d q[b][d] W_k,h[d][c] with M = the
// batch rows, N = kv_lora, K = dqk. Block (head, 128 columns, 64 rows), 4 warps: warp w owns
// columns 32w .. 32w+31 (4 n-tiles of 8) for the block's 4 m-tiles of 16 rows. K walks in chunks
// of 32 through a 3-stage cp.async ring in shared memory (two chunks in flight while one is
// multiplied): the rows' q slab [64][32] (A, row-major: ldmatrix) and W_k,h's slab
// [32][128] as stored, d-major (B: ldmatrix .trans turns its d-runs into the MMA's k pairs), rows
// padded by 16 bytes so the 8 row addresses of every 8x8 matrix fall in distinct banks. Zero-filled
// past dqk, L and the batch's rows. Each output is its 16-wide k-steps summed in ascending chunk
// order in fp32, then rounded to BF16 once: the same arithmetic for a row whatever B or the other
// rows (an MMA row is independent of the others).

constexpr int kAbsorbMmaThreads = 128;
constexpr int kAbsorbMmaRows = 64;                  // batch rows per block (4 m-tiles)
constexpr int kAbsorbMmaCols = 128;                 // kv_lora columns per block (4 warps x 4 n-tiles)
constexpr int kAbsorbMmaK = 32;                     // d per shared-memory chunk (2 k-steps)
constexpr int kAbsorbQStride = kAbsorbMmaK + 8;     // BF16 per staged q row (80 bytes)
constexpr int kAbsorbWStride = kAbsorbMmaCols + 8;  // BF16 per staged W row (272 bytes)
constexpr int kAbsorbStages = 3;                    // chunks in the cp.async ring (41.5 KB)

/// Block (h, column tile, row tile); see "absorb_q on the tensor cores".
__global__ void __launch_bounds__(kAbsorbMmaThreads)
    absorb_q_mma_kernel(const bf16* q, const bf16* W_kvb, bf16* q_abs, int rows, int n_heads, int dqk, int dv,
                        int L) {
  pdl_begin();
  __shared__ __align__(16) bf16 q_ring[kAbsorbStages][kAbsorbMmaRows][kAbsorbQStride];
  __shared__ __align__(16) bf16 w_ring[kAbsorbStages][kAbsorbMmaK][kAbsorbWStride];
  const int h = blockIdx.x;
  const int col0 = blockIdx.y * kAbsorbMmaCols;
  const int row0 = blockIdx.z * kAbsorbMmaRows;
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int g = lane >> 2, t = lane & 3;
  const int n_rows = min(kAbsorbMmaRows, rows - row0);
  const int m_tiles = (n_rows + 15) / 16;  // uniform over the block
  const bf16* Wk = W_kvb + static_cast<size_t>(h) * (dqk + dv) * L;
  float acc[4][4][4];
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int n = 0; n < 4; ++n) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.0f;

  // Chunk c of q and W_k,h into ring stage st: q 64 rows x 4 vectors of 8, W 32 d-rows x 16
  // vectors of 8 (16-byte copies, zero past the ends).
  auto stage = [&](int c, int st) {
    const int d0 = c * kAbsorbMmaK;
    for (int v = threadIdx.x; v < kAbsorbMmaRows * (kAbsorbMmaK / 8); v += blockDim.x) {
      const int r = v / (kAbsorbMmaK / 8), d8 = (v % (kAbsorbMmaK / 8)) * 8;
      const bool ok = r < n_rows && d0 + d8 < dqk;
      const bf16* src = ok ? q + (static_cast<size_t>(row0 + r) * n_heads + h) * dqk + d0 + d8 : q;
      batch::cp_async16(&q_ring[st][r][d8], src, ok ? 16 : 0);
    }
    for (int v = threadIdx.x; v < kAbsorbMmaK * (kAbsorbMmaCols / 8); v += blockDim.x) {
      const int dd = v / (kAbsorbMmaCols / 8), c8 = (v % (kAbsorbMmaCols / 8)) * 8;
      const bool ok = d0 + dd < dqk && col0 + c8 < L;
      const bf16* src = ok ? Wk + static_cast<size_t>(d0 + dd) * L + col0 + c8 : Wk;
      batch::cp_async16(&w_ring[st][dd][c8], src, ok ? 16 : 0);
    }
  };
  const int n_chunks = (dqk + kAbsorbMmaK - 1) / kAbsorbMmaK;
  // A ring of kAbsorbStages chunks: kAbsorbStages - 1 in flight while one is multiplied.
#pragma unroll
  for (int c = 0; c < kAbsorbStages - 1; ++c) {
    if (c < n_chunks) stage(c, c);
    batch::cp_async_commit();
  }
  for (int c = 0; c < n_chunks; ++c) {
    if (c + kAbsorbStages - 1 < n_chunks)
      stage(c + kAbsorbStages - 1, (c + kAbsorbStages - 1) % kAbsorbStages);
    batch::cp_async_commit();
    batch::cp_async_wait<kAbsorbStages - 1>();
    __syncthreads();
    const auto& q_s = q_ring[c % kAbsorbStages];
    const auto& w_s = w_ring[c % kAbsorbStages];
#pragma unroll
    for (int ks = 0; ks < kAbsorbMmaK / 16; ++ks) {
      // B: two x4.trans loads, each the fragments of two n-tiles (matrices: k 0-7 / 8-15 of tile
      // j, then of tile j + 1); lane i addresses row k = ks*16 + (i % 8) + 8 * ((i / 8) % 2).
      uint32_t bfr[4][2];
#pragma unroll
      for (int jp = 0; jp < 2; ++jp) {
        uint32_t r4[4];
        const int kr = ks * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
        const int cc = warp * 32 + (2 * jp + lane / 16) * 8;
        ldmatrix_x4_trans(r4, &w_s[kr][cc]);
        bfr[2 * jp][0] = r4[0];
        bfr[2 * jp][1] = r4[1];
        bfr[2 * jp + 1][0] = r4[2];
        bfr[2 * jp + 1][1] = r4[3];
      }
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        if (m >= m_tiles) break;  // uniform
        uint32_t a[4];
        ldmatrix_x4(a, &q_s[m * 16 + (lane % 16)][ks * 16 + 8 * (lane / 16)]);
#pragma unroll
        for (int n = 0; n < 4; ++n) batch::mma_16816(acc[m][n], a, bfr[n][0], bfr[n][1]);
      }
    }
    __syncthreads();  // the stage is refilled by a later iteration's copies
  }
  // acc[m][n][e]: row m*16 + g + 8*(e >= 2), column warp*32 + n*8 + 2t + (e & 1).
#pragma unroll
  for (int m = 0; m < 4; ++m) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = m * 16 + g + (e >= 2 ? 8 : 0);
      if (r >= n_rows) continue;
      bf16* out = q_abs + (static_cast<size_t>(row0 + r) * n_heads + h) * L;
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int c = col0 + warp * 32 + n * 8 + 2 * t + (e & 1);
        if (c < L) out[c] = f_to_bf16(acc[m][n][e]);
      }
    }
  }
}

// ---- decode
// ------------------------------------------------------------------------------------------------

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
  const auto [q_abs, selection, block_table] = decode_row(p, row, slot, L);

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
  write_decode_out<kNTiles>(p, row, split, h0, g, t, col0, lo_ok, hi_ok, warp == 0, m_lo, m_hi, l_lo, l_hi,
                            kFp8 ? p.cache_scale : 1.0f, o);
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
  record_kernel(ctx, "mla_absorb_q_batch", rows >= 2 ? "absorb_q_mma" : "absorb_q");
  if (rows >= 2) {
    // Two rows and more: the per-head GEMMs on the tensor cores. One row is the single-row op itself
    // (its kernel, its bits), so a batch of one drafts as the single-sequence path.
    const dim3 grid(n_heads, (kv_lora + kAbsorbMmaCols - 1) / kAbsorbMmaCols,
                    (rows + kAbsorbMmaRows - 1) / kAbsorbMmaRows);
    launch(ctx, absorb_q_mma_kernel, grid, kAbsorbMmaThreads, 0, q, W_kvb, q_abs, rows, n_heads, dqk, dv,
           kv_lora);
    MTP_CUDA_LAUNCH_CHECK();
    return;
  }
  mla_absorb_q(ctx, q, W_kvb, q_abs, n_heads, dqk, dv, kv_lora);
}

size_t mla_decode_batch_scratch_floats(const LaunchCtx& ctx, int splits, int n_heads, int kv_lora, int rows,
                                       bool fp8_cache) {
  // v1, shared2 and shared32: a partial per split; v2: a partial per cluster of 8 splits. None when one
  // (split or cluster) per (row, head tile) writes o_lat itself.
  const int partials =
      mla_batch_kernel(ctx.policy, fp8_cache, rows) == BatchDecodeKernel::v2 ? splits / kCluster : splits;
  if (partials <= 1) return 0;
  return static_cast<size_t>(rows) * n_heads * partials * (2 + static_cast<size_t>(kv_lora));
}

void mla_decode_batch(const LaunchCtx& ctx, const bf16* q_abs, const int32_t* selection, int width,
                      const int32_t* slot, int rows, const KvSlots& kv, bf16* o_lat, int n_heads,
                      float softmax_scale, int splits, float* scratch) {
  const KvCache& cache = kv.cache;
  const int L = cache.kv_lora;
  MTP_REQUIRE(
      L == 64 || L == 128 || L == 256 || L == 512, "ops::cuda::mla_decode_batch: kv_lora ", L,
      " is not supported (64, 128, 256 or 512: each of 4 warps takes kv_lora/4 columns, a multiple of 16)");
  MTP_REQUIRE(rows >= 1 && rows <= 65535, "ops::cuda::mla_decode_batch: rows ", rows, " (1 .. 65535)");
  MTP_REQUIRE(splits >= 1 && splits <= 8192, "ops::cuda::mla_decode_batch: ", splits, " splits (1 .. 8192)");
  MTP_REQUIRE(
      reinterpret_cast<uintptr_t>(cache.data) % 16 == 0 && reinterpret_cast<uintptr_t>(q_abs) % 4 == 0,
      "ops::cuda::mla_decode_batch: the cache must be 16-byte and q_abs 4-byte aligned");
  DecodeParams p{q_abs,       selection,        width, slot,    kv.block_tables, kv.max_blocks, cache.data,
                 cache.scale, cache.block_size, L,     n_heads, softmax_scale,   splits,        scratch,
                 o_lat};
  const bool fp8 = cache.dtype == KvDtype::fp8;
  const BatchDecodeKernel kernel = mla_batch_kernel(ctx.policy, fp8, rows);  // dispatch.cu
  record_kernel(ctx, "mla_decode_batch", kernel_text(kernel));
  if (kernel == BatchDecodeKernel::v2) {
    require_v2_splits("mla_decode_batch", "mla_batch_splits", width, splits, scratch, cache.data);
    return decode_v2(ctx, p, fp8, rows);
  }
  MTP_REQUIRE(splits == 1 || scratch, "ops::cuda::mla_decode_batch: ", splits, " splits without scratch");
  if (kernel == BatchDecodeKernel::shared2 || kernel == BatchDecodeKernel::shared32) {
    MTP_REQUIRE(reinterpret_cast<uintptr_t>(o_lat) % 4 == 0 &&
                    (!scratch || reinterpret_cast<uintptr_t>(scratch) % 8 == 0),
                "ops::cuda::mla_decode_batch: o_lat must be 4-byte and the scratch 8-byte aligned");
    const int bound = kernel == BatchDecodeKernel::shared32 ? kShared32MaxSplitRows : kSharedMaxSplitRows;
    MTP_REQUIRE(split_rows(width, splits) <= bound,
                "ops::cuda::mla_decode_batch: ", split_rows(width, splits), " rows per split (the ",
                kernel == BatchDecodeKernel::shared32 ? "shared32" : "shared2", " kernel takes at most ",
                bound, ": use mla_batch_splits)");
    auto run = [&](auto tiles, auto chunk_rows) {
      with_decode_shape(L, fp8, [&](auto cw, auto f8) {
        launch_decode_shared<cw(), f8(), decltype(tiles)::value, decltype(chunk_rows)::value>(ctx, p, rows);
      });
    };
    if (kernel == BatchDecodeKernel::shared2) {
      run(std::integral_constant<int, 2>{}, std::integral_constant<int, 16>{});
    } else {
      run(std::integral_constant<int, 4>{}, std::integral_constant<int, 32>{});
    }
    if (splits > 1) mla_combine_rows(ctx, scratch, slot, rows, splits, n_heads, L, o_lat);
    return;
  }
  with_decode_shape(L, fp8, [&](auto cw, auto f8) { launch_decode_batch<cw(), f8()>(ctx, p, rows); });
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
  record_kernel(ctx, "mla_out_v_batch", rows == 1 ? "gemv" : "rows_gemm");
  if (rows == 1) {
    // One row: the single-row op's GEMV, its kernel and bits (the skinny GEMM would spend 15 of its
    // 16 MMA rows on padding; docs/kernels.md has both timed).
    gemv_bf16(ctx, W_kvb, o_lat, o, false, n_heads * dv, kv_lora, map);
    return;
  }
  rows_gemm(ctx, W_kvb, o_lat, static_cast<int64_t>(n_heads) * kv_lora, o, static_cast<int64_t>(n_heads) * dv,
            rows, n_heads * dv, kv_lora, map);
}

}  // namespace mtplab::ops::cuda
