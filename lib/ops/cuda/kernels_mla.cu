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
// - Decode: one block per (16-head tile, row split) on the tensor cores (see "decode" below), an
//   online softmax in fp32 over chunks of 16 rows, merged across splits with max-rescaling in a
//   fixed order (deterministic); o_lat is rounded to BF16 once, after dividing by the softmax
//   denominator, as the CPU does. No selected rows -> zeros. q_abs rows must be 4-byte aligned
//   (BF16 pairs are read as u32), cache rows 16-byte aligned. Two paths with the same chunk step
//   (the policy's mla_decode, ops/kernel_policy.hpp): v1 (mla_batch.cu's decode kernel at one row,
//   every split merged by its combine) and v2 (mla_decode_v2_kernel, "decode v2" below), the
//   default; both combine through mla_combine_rows.
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "ops/cuda/batch_common.cuh"
#include "ops/cuda/batch_kernels.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/device_common.cuh"
#include "ops/cuda/kernels.hpp"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mla_chunk.cuh"

namespace mtplab::ops::cuda {
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
// - Grid (split, head tile), about one block per multiprocessor: split s of S owns chunks
//   [s*C/S, (s+1)*C/S) of the C chunks (balanced to one chunk), at most kMaxSplitChunks.
// - The split's row slots (selection -> block table) are resolved once into shared memory, every
//   thread resolving a few rows in parallel: two round trips per block instead of two per chunk.
// - Each warp streams its slice of the rows into a ring of kStages chunks with cp.async (16 bytes,
//   zero-filled for padding: a padded row must be 0, not stale shared memory, as P = 0 times NaN
//   is NaN), kStages - 1 chunks ahead of the one it computes.
// - The partial scores go through a double-buffered s_score: one __syncthreads per chunk.
// - The kCluster splits of a thread-block cluster merge their (max, denominator, sums) over
//   distributed shared memory, block rank r taking columns [r*L/8, (r+1)*L/8), peers in rank
//   order (deterministic). One cluster per head tile writes o_lat itself; more write one partial
//   per cluster, which mla_combine_rows merges (S / 8 partials per head instead of S).

constexpr int kCluster = 8;          // splits per thread-block cluster (the portable maximum)
constexpr int kStages = 4;           // cp.async ring depth per warp, in chunks
constexpr int kMaxSplitChunks = 32;  // chunks one split may own (the slot table's size)
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

/// Block (split, head tile) of a cluster of kCluster splits; see "decode v2" above. p.splits is S
/// (a multiple of kCluster); p.scratch holds [n_heads][S / kCluster][2 + kv_lora] when S > kCluster.
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

  // Q as the A operand, this warp's columns (as the v1 decode).
  uint32_t qa[kKSteps][4];
  load_q_fragments<kKSteps>(p.q_abs, h0, g, t, kL, col0, lo_ok, hi_ok, qa);

  // Slots of the split's rows, all selection loads first, then all block-table loads. Rows past
  // i1 up to the last chunk's end are padding.
  {
    int32_t ts[kGatherPerThread];
#pragma unroll
    for (int u = 0; u < kGatherPerThread; ++u) {
      const int ii = i0 + static_cast<int>(threadIdx.x) + u * kDecodeThreads;
      ts[u] = ii < i1 ? p.selection[ii] : -1;
    }
#pragma unroll
    for (int u = 0; u < kGatherPerThread; ++u) {
      int64_t slot = -1;
      if (ts[u] >= 0)
        slot =
            static_cast<int64_t>(p.block_tables[ts[u] / p.block_size]) * p.block_size + ts[u] % p.block_size;
      s_slot[threadIdx.x + u * kDecodeThreads] = slot;
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
        const int64_t slot = s_slot[k * kChunk + r];
        const unsigned char* src =
            slot >= 0 ? cache + (static_cast<size_t>(slot) * kL + col0) * kElem + (v % kVecPerRow) * 16
                      : cache;
        cp_async16(stage + r * Smem::kStageStride + (v % kVecPerRow) * 16, src, slot >= 0 ? 16 : 0);
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
    if (clusters == 1) {
      p.o_lat[static_cast<size_t>(h0 + h) * kL + c] = d > 0.0f ? f_to_bf16(a / d) : bf16{0};
    } else {
      float* out = p.scratch + (static_cast<size_t>(h0 + h) * clusters + cl) * (2 + kL);
      out[2 + c] = a;
      if (c == 0) {  // rank 0's first column
        out[0] = s_m[h];
        out[1] = d;
      }
    }
  }
  cluster.sync();  // no block leaves while a peer may still read its exchange
}

/// The v2 decode kernel for kCw = kv_lora / 4 columns per warp and the cache type.
template <int kCw, bool kFp8>
void launch_decode_v2(const LaunchCtx& ctx, const DecodeParams& p) {
  const int tiles = (p.n_heads + kHeadTile - 1) / kHeadTile;
  constexpr int kBytes = DecodeV2Smem<kCw, kFp8>::kBytes;
  // Above the 48 KB default at kv_lora 512; a host-side attribute, allowed while capturing.
  MTP_CUDA_CHECK(cudaFuncSetAttribute(mla_decode_v2_kernel<kCw, kFp8>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
  launch(ctx, mla_decode_v2_kernel<kCw, kFp8>, dim3(p.splits, tiles), kDecodeThreads,
         static_cast<size_t>(kBytes), p);
  MTP_CUDA_LAUNCH_CHECK();
}

/// launch_decode_v2 for the kv_lora of p (64, 128, 256 or 512; checked by mla_decode).
void launch_decode_v2_for(const LaunchCtx& ctx, const DecodeParams& p, bool fp8) {
  switch (p.kv_lora) {
    case 64:
      return fp8 ? launch_decode_v2<16, true>(ctx, p) : launch_decode_v2<16, false>(ctx, p);
    case 128:
      return fp8 ? launch_decode_v2<32, true>(ctx, p) : launch_decode_v2<32, false>(ctx, p);
    case 256:
      return fp8 ? launch_decode_v2<64, true>(ctx, p) : launch_decode_v2<64, false>(ctx, p);
    default:
      return fp8 ? launch_decode_v2<128, true>(ctx, p) : launch_decode_v2<128, false>(ctx, p);
  }
}

}  // namespace

void kv_write(const LaunchCtx& ctx, const bf16* c_kv, const int32_t* block_table, const int32_t* pos,
              const KvCache& cache) {
  MTP_REQUIRE(cache.data && cache.block_size >= 1 && cache.kv_lora >= 1, "ops::cuda::kv_write: bad cache");
  launch(ctx, kv_write_kernel, 1, 256, 0, c_kv, block_table, pos, cache.data, cache.dtype == KvDtype::fp8,
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
  launch(ctx, absorb_q_kernel, grid, kAbsorbThreads, 0, q, W_kvb, q_abs, dqk, dv, kv_lora);
  MTP_CUDA_LAUNCH_CHECK();
}

int mla_decode_splits(const LaunchCtx& ctx, int width, int n_heads) {
  const int chunks = std::max(1, (width + kChunk - 1) / kChunk);
  const int tiles = (n_heads + kHeadTile - 1) / kHeadTile;
  if (ctx.policy.mla_decode == MlaDecode::v1) {
    // Two chunks of 16 rows per block at least (the combine reads splits x kv_lora per head), and
    // about two blocks per multiprocessor.
    const int per_split = std::max(2, (chunks * tiles + 2 * ctx.num_sms - 1) / (2 * ctx.num_sms));
    return std::max(1, (chunks + per_split - 1) / per_split);
  }
  // v2: about one block per multiprocessor (each streams its rows kStages - 1 chunks ahead, so a
  // longer split costs chunk steps, not round trips), no more clusters than it takes to give every
  // split a chunk, and at most kMaxSplitChunks chunks per split. The policy's mla_clusters, when not
  // 0, forces the clusters per head tile (a tuning experiment; still raised to that chunk limit).
  const int per_cluster = kCluster * kMaxSplitChunks;
  int clusters = ctx.policy.mla_clusters;
  if (clusters == 0) {
    clusters = std::max(1, (ctx.num_sms + tiles * kCluster / 2) / (tiles * kCluster));
    clusters = std::min(clusters, (chunks + kCluster - 1) / kCluster);
  }
  clusters = std::max(clusters, (chunks + per_cluster - 1) / per_cluster);
  return clusters * kCluster;
}

size_t mla_decode_scratch_floats(const LaunchCtx& ctx, int splits, int n_heads, int kv_lora) {
  // v2 keeps one partial per cluster (none is read when there is one cluster per head tile).
  const int partials = ctx.policy.mla_decode == MlaDecode::v1 ? splits : std::max(1, splits / kCluster);
  return static_cast<size_t>(partials) * n_heads * (2 + static_cast<size_t>(kv_lora));
}

void mla_decode(const LaunchCtx& ctx, const bf16* q_abs, const int32_t* selection, int width,
                const int32_t* block_table, const KvCache& cache, bf16* o_lat, int n_heads,
                float softmax_scale, int splits, float* scratch) {
  const int L = cache.kv_lora;
  MTP_REQUIRE(
      L == 64 || L == 128 || L == 256 || L == 512, "ops::cuda::mla_decode: kv_lora ", L,
      " is not supported (64, 128, 256 or 512: each of 4 warps takes kv_lora/4 columns, a multiple of 16)");
  MTP_REQUIRE(
      cache.data && cache.block_size >= 1 && n_heads >= 1 && width >= 0 && splits >= 1 && splits <= 8192,
      "ops::cuda::mla_decode: bad arguments");
  if (ctx.policy.mla_decode == MlaDecode::v1) {
    // v1: the batched decode's kernel at one row (the same chunk step; every split merged by the
    // combine, or o_lat written directly by a single split).
    const KvSlots kv{cache, block_table, 1, 0};
    return mla_decode_batch(ctx, q_abs, selection, width, nullptr, 1, kv, o_lat, n_heads, softmax_scale,
                            splits, scratch);
  }
  const int chunks = (width + kChunk - 1) / kChunk;
  MTP_REQUIRE(splits % kCluster == 0 && (chunks + splits - 1) / splits <= kMaxSplitChunks,
              "ops::cuda::mla_decode: ", splits, " splits for ", chunks,
              " chunks (v2 needs a multiple of 8 and at most 32 chunks per split: use mla_decode_splits)");
  MTP_REQUIRE(reinterpret_cast<uintptr_t>(cache.data) % 16 == 0,
              "ops::cuda::mla_decode: cache not 16-byte aligned");
  const DecodeParams p{q_abs,   selection,     width,       nullptr,          block_table,
                       0,       cache.data,    cache.scale, cache.block_size, L,
                       n_heads, softmax_scale, splits,      scratch,          o_lat};
  launch_decode_v2_for(ctx, p, cache.dtype == KvDtype::fp8);
  // v2 merges within each cluster, then the clusters' partials (none to merge with one cluster per
  // head tile: the cluster wrote o_lat).
  const int partials = splits / kCluster;
  if (partials > 1) mla_combine_rows(ctx, scratch, nullptr, 1, partials, n_heads, L, o_lat);
}

}  // namespace mtplab::ops::cuda
