// The grouped experts' one-warp work items (moe_experts_grouped; moe.cu launches them, and the
// comparison pipelines of dev/cuda/moe.cu instantiate theirs from here too): the plan every block
// builds from the routes, the memory pipelines' template (Pipe), one warp's small GEMM over a work
// item, the gate_up and down kernels and their launch. moe.cu's file comment describes the two
// launches and their bits; the wide batches' plan kernel and the block items are moe.cu's.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "ops/cuda/batch_common.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/device_common.cuh"
#include "ops/cuda/kernels.hpp"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/moe.hpp"

namespace mtplab::ops::cuda::grouped {

using batch::kChunkK;

/// act = bf16(silu(min(g, L)) * clamp(u, -L, L)) of the fp32 projections g, u (rounded to BF16
/// first); L = limit, none when limit <= 0. Every expert kernel's activation.
__device__ __forceinline__ bf16 swiglu_act(float g_acc, float u_acc, float limit) {
  float gv = round_to_bf16(g_acc);
  float uv = round_to_bf16(u_acc);
  if (limit > 0.0f) {
    gv = fminf(gv, limit);
    uv = fminf(fmaxf(uv, -limit), limit);
  }
  return f_to_bf16(__fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, expf(-gv))), uv));
}

// ---- grouped experts: the plan ---------------------------------------------------------------------------

constexpr int kMoeWarps = 8;
constexpr int kGroupedThreads = kMoeWarps * kWarp;
constexpr int kMoeNT = 2;                 // column tiles of a work item
constexpr int kPairGroup = 8 * kMoeNT;    // pairs per work item
constexpr int kMoeStages = 3;             // per-warp cp.async ring of input-row chunks
constexpr int kMoeXStride = kChunkK + 8;  // BF16 per staged row (144 bytes)
constexpr int kMoeWBuf = 2;               // weight chunks in registers: one ahead
constexpr int kDownCols = 16;             // output columns per down block (the MMA's M)
constexpr int kMaxLocalExperts = 4096;

/// One set of expert matrices: gate / up [inter, H] and down [H, inter] rows, BF16.
struct ExpertMats {
  const bf16* gate = nullptr;
  const bf16* up = nullptr;
  const bf16* down = nullptr;
  int inter = 0;  // 0: absent (the shared expert of a model without one)
};

/// The routes of the batch: row b's top_k (expert, weight) pairs, and which rows are live.
struct RoutePairs {
  const int32_t* idx = nullptr;    // [rows][top_k] global expert ids
  const float* weights = nullptr;  // [rows][top_k]
  const int32_t* slot = nullptr;   // [rows], < 0: padded row
  int rows = 0;
  int top_k = 0;
};

struct GroupedParams {
  const bf16* x = nullptr;  // [rows][H]
  ExpertMats routed;        // this rank's experts first_expert .. first_expert + num_local - 1
  int first_expert = 0;
  int num_local = 0;
  int H = 0;
  ExpertMats shared;
  RoutePairs routes;
  float limit = 0.0f;
  bf16* act = nullptr;  // [rows * top_k + rows][act_ld]
  int act_ld = 0;
  float* out = nullptr;
  // Wide launches only (more rows than kMaxBatchRows, "wide batches" below): the plans in global
  // memory (n_active, then the plan's ints), gate_up's and down's, and d per (output block, route).
  const int* plan_gu = nullptr;
  const int* plan_dn = nullptr;
  bf16* d = nullptr;  // [H / kDownCols][pairs + rows][kDownCols]; the block-item kernels: [pairs + rows][H]
};

/// f(j, e, q) for each of this lane's accumulator elements (n-tile j, element e of the m16n8
/// layout; lane = 4g + t) whose batch column q = 8j + 2t + (e & 1) is one of the n_rows live ones.
template <int kNT = kMoeNT, typename F>
__device__ __forceinline__ void for_live_acc(int t, int n_rows, F&& f) {
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int q = 8 * j + 2 * t + (e & 1);
      if (q < n_rows) f(j, e, q);
    }
  }
}

/// The plan's arrays in dynamic shared memory (ints), and the sizes that fix them.
struct PlanLayout {
  int nl, pairs, rows, a_max;
  __host__ __device__ size_t ints() const {
    return 2 * static_cast<size_t>(nl) + static_cast<size_t>(rows) + 2 * static_cast<size_t>(pairs + rows) +
           4 * static_cast<size_t>(a_max) + 1;
  }
};

struct Plan {
  int* counts;    // [nl] pairs per local expert, then the placement counters
  int* offsets;   // [nl] first pair of each expert
  int* live;      // [rows] the live rows, ascending
  int* pr_row;    // [pairs + rows] row of each placed pair
  int* pr_route;  // [pairs + rows] route: b * top_k + i, or pairs + b for the shared expert
  int* a_expert;  // [a_max] local expert id of active entry a, or -1 for the shared expert
  int* a_off;     // [a_max]
  int* a_cnt;     // [a_max]
  int* a_items;   // [a_max + 1] exclusive prefix of each entry's work items
};

__device__ __forceinline__ Plan carve_plan(int* base, const PlanLayout& l) {
  Plan p;
  p.counts = base;
  p.offsets = p.counts + l.nl;
  p.live = p.offsets + l.nl;
  p.pr_row = p.live + l.rows;
  p.pr_route = p.pr_row + l.pairs + l.rows;
  p.a_expert = p.pr_route + l.pairs + l.rows;
  p.a_off = p.a_expert + l.a_max;
  p.a_cnt = p.a_off + l.a_max;
  p.a_items = p.a_cnt + l.a_max;
  return p;
}

/// Exclusive prefix over values v(i), i < n, in index order, into out(i); returns the total. Each
/// thread sums a contiguous segment, a block scan gives the segments' offsets.
template <typename Get, typename Put>
__device__ __forceinline__ unsigned long long segment_scan(int n, Get&& get, Put&& put) {
  const int per = (n + blockDim.x - 1) / blockDim.x;
  const int i0 = min(n, static_cast<int>(threadIdx.x) * per);
  const int i1 = min(n, i0 + per);
  unsigned long long sum = 0;
  for (int i = i0; i < i1; ++i) sum += get(i);
  unsigned long long total;
  unsigned long long run = batch::block_exclusive_scan(sum, &total);
  for (int i = i0; i < i1; ++i) {
    const unsigned long long v = get(i);
    put(i, run, v);
    run += v;
  }
  return total;
}

/// Work items of active entry a: gate_up: 16-row tiles of its inter x pair groups; down: pair groups.
__device__ __forceinline__ int entry_items(const GroupedParams& p, int expert, int cnt, bool gate_up) {
  const int groups = (cnt + kPairGroup - 1) / kPairGroup;
  if (!gate_up) return groups;
  return (expert < 0 ? p.shared.inter : p.routed.inter) / 16 * groups;
}

/// The plan's a_items: the exclusive prefix of items_of(expert, pairs) over its n_active entries,
/// the total at a_items[n_active]; every thread of the block calls it, and it ends at a barrier.
template <typename ItemsOf>
__device__ __forceinline__ void count_items(const Plan& pl, int n_active, ItemsOf&& items_of) {
  const unsigned long long total = segment_scan(
      n_active, [&](int a) { return static_cast<unsigned long long>(items_of(pl.a_expert[a], pl.a_cnt[a])); },
      [&](int a, unsigned long long before, unsigned long long) {
        pl.a_items[a] = static_cast<int>(before);
      });
  if (threadIdx.x == 0) pl.a_items[n_active] = static_cast<int>(total);
  __syncthreads();
}

/// Builds the plan (moe.cu's file comment); every thread of the block must call it. Returns the
/// number of active entries (block-uniform). static: each file that includes this header compiles
/// its own copy, no symbol shared between them.
static __device__ int build_plan(const GroupedParams& p, const Plan& pl, bool gate_up) {
  __shared__ int s_n_live, s_n_active, s_pairs_owned;
  const int P = p.routes.rows * p.routes.top_k;
  const int NL = p.num_local;
  for (int e = threadIdx.x; e < NL; e += blockDim.x) pl.counts[e] = 0;
  // The live rows, ascending, blockDim rows at a time.
  {
    int n_live = 0;
    for (int b0 = 0; b0 < p.routes.rows; b0 += blockDim.x) {
      const int b = b0 + static_cast<int>(threadIdx.x);
      const bool is_live = b < p.routes.rows && p.routes.slot[b] >= 0;
      unsigned long long total;
      const unsigned long long before = batch::block_exclusive_scan(is_live ? 1ull : 0ull, &total);
      if (is_live) pl.live[n_live + static_cast<int>(before)] = b;
      n_live += static_cast<int>(total);
    }
    if (threadIdx.x == 0) s_n_live = n_live;
  }
  __syncthreads();
  auto owned = [&](int q, int& e) {  // pair q = b * top_k + i of a live row, its expert local?
    const int b = q / p.routes.top_k;
    if (p.routes.slot[b] < 0) return false;
    e = p.routes.idx[q] - p.first_expert;
    return e >= 0 && e < NL;
  };
  for (int q = threadIdx.x; q < P; q += blockDim.x) {
    int e;
    if (owned(q, e)) atomicAdd(&pl.counts[e], 1);
  }
  __syncthreads();
  // Offsets and the active list in one scan: low half pairs, high half active experts.
  const unsigned long long total = segment_scan(
      NL,
      [&](int e) {
        return static_cast<unsigned long long>(pl.counts[e]) | (pl.counts[e] > 0 ? 1ull << 32 : 0ull);
      },
      [&](int e, unsigned long long before, unsigned long long v) {
        const int off = static_cast<int>(before & 0xffffffffull);
        const int a = static_cast<int>(before >> 32);
        pl.offsets[e] = off;
        if (v != 0) {
          pl.a_expert[a] = e;
          pl.a_off[a] = off;
          pl.a_cnt[a] = static_cast<int>(v & 0xffffffffull);
        }
        pl.counts[e] = 0;  // the placement counter from here on (each thread resets its own entries)
      });
  if (threadIdx.x == 0) {
    const int owned_pairs = static_cast<int>(total & 0xffffffffull);
    int active = static_cast<int>(total >> 32);
    if (p.shared.inter > 0 && s_n_live > 0) {
      pl.a_expert[active] = -1;
      pl.a_off[active] = owned_pairs;
      pl.a_cnt[active] = s_n_live;
      ++active;
    }
    s_n_active = active;
    s_pairs_owned = owned_pairs;
  }
  __syncthreads();
  // Placement, stable: within an expert the pairs keep ascending q, so every block of both
  // launches cuts an expert's pairs into the same groups (an item's group must be the same set of
  // routes in every block that computes a piece of it). Warp 0 walks the pairs 32 at a time; the
  // lanes of one expert take consecutive places after that expert's count so far.
  if (threadIdx.x < kWarp) {
    const int lane = threadIdx.x;
    for (int q0 = 0; q0 < P; q0 += kWarp) {
      const int q = q0 + lane;
      int e = -1;
      if (q < P) {
        int local = -1;
        if (owned(q, local)) e = local;
      }
      const unsigned int peers = __match_any_sync(0xffffffffu, e);
      const int leader = __ffs(peers) - 1;
      int base = (e >= 0 && lane == leader) ? pl.counts[e] : 0;
      base = __shfl_sync(0xffffffffu, base, leader);
      if (e >= 0) {
        const int at = pl.offsets[e] + base + __popc(peers & ((1u << lane) - 1u));
        pl.pr_row[at] = q / p.routes.top_k;
        pl.pr_route[at] = q;
      }
      __syncwarp();
      if (e >= 0 && lane == leader) pl.counts[e] = base + __popc(peers);
      __syncwarp();
    }
  }
  if (p.shared.inter > 0) {
    for (int j = threadIdx.x; j < s_n_live; j += blockDim.x) {
      pl.pr_row[s_pairs_owned + j] = pl.live[j];
      pl.pr_route[s_pairs_owned + j] = P + pl.live[j];
    }
  }
  const int n_active = s_n_active;
  count_items(pl, n_active, [&](int expert, int cnt) { return entry_items(p, expert, cnt, gate_up); });
  return n_active;
}

/// The active entry holding work item w: the last a with a_items[a] <= w.
__device__ __forceinline__ int find_entry(const Plan& pl, int n_active, int w) {
  int lo = 0, hi = n_active - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (pl.a_items[mid] <= w) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// ---- grouped experts: the memory pipelines ---------------------------------------------------------------
//
// KernelPolicy::moe_pipeline picks how a warp brings its chunks in; the pipelines differ in where a
// weight chunk waits between its load and its MMA, and in which warp takes which gate_up item,
// never in what the MMAs compute: each of them hands the tensor cores the same A and B words of
// the same chunks in ascending chunk order, each item's pairs in the same columns, so they give
// v1's bits. Which warp computes an item changes nothing either: an item's numbers depend on its
// weights and its own group's rows only.
// - v1: the weights one 64-column chunk ahead in registers (two buffers), the input rows through a
//   3-stage per-warp cp.async ring; gate_up's items go to the blocks in runs of 8 (block b: items
//   8b .. 8b + 7, then the next grid's worth), a grid of at most two blocks a multiprocessor.
// - ringpf: the weight tile and the input rows of a chunk through one per-warp cp.async ring in
//   shared memory (gate_up 3 stages, down 4: two or three chunks ahead, no register cost, one block
//   a multiprocessor); the A fragments are read back from the ring, whose rows are padded to 144
//   bytes so that the 16-byte reads of a quarter-warp fall in distinct banks. gate_up's items are
//   dealt round-robin over a grid of every resident block (item w to block w % grid), and each
//   weight copy asks the L2 for the aligned 256 bytes around it.
// The comparison pipelines (spread, regs, ring without the L2 hint, split) instantiate Pipe in
// dev/cuda/moe.cu.

/// A chunk pipeline: kStages cp.async stages per warp, kWBuf register weight buffers (kRing: none,
/// the weights go through the ring too), gate_up items dealt round-robin over the blocks (kSpread),
/// and the blocks a multiprocessor the kernels are compiled for.
template <int kStages_, int kWBuf_, bool kRing_, bool kSpread_, int kMinBlocks_, bool kL2Pf_ = false>
struct Pipe {
  static constexpr int kStages = kStages_;
  static constexpr int kWBuf = kWBuf_;
  static constexpr bool kRing = kRing_;
  static constexpr bool kSpread = kSpread_;
  static constexpr int kMinBlocks = kMinBlocks_;
  /// The ring's weight copies ask the L2 for the 256 aligned bytes around each (ringpf).
  static constexpr bool kL2Pf = kL2Pf_;
  static_assert(kStages >= 2 && kWBuf >= 1 && kMinBlocks >= 1 && (kSpread || !kRing),
                "a ring needs two stages; the ring pipelines are dealt round-robin");
  /// Weight rows at the start of a stage (the kMats matrices' 16-row tiles), then the group's rows.
  template <int kMats>
  static constexpr int weight_rows() {
    return kRing ? 16 * kMats : 0;
  }
  template <int kMats>
  static constexpr size_t stage_elems() {
    return static_cast<size_t>(weight_rows<kMats>() + kPairGroup) * kMoeXStride;
  }
  /// The shared memory of the block's rings (BF16 elements), every warp's.
  template <int kMats>
  static constexpr size_t ring_elems() {
    return static_cast<size_t>(kMoeWarps) * kStages * stage_elems<kMats>();
  }
};
using PipeV1 = Pipe<kMoeStages, kMoeWBuf, false, false, 2>;
using PipeRingPfGateUp = Pipe<3, 1, true, true, 1, true>;
using PipeRingPfDown = Pipe<4, 1, true, true, 1, true>;

// ---- grouped experts: one warp's small GEMM ------------------------------------------------------------

/// This lane's A words of a chunk's weight tiles staged in a ring stage (rows 16m + g and
/// 16m + g + 8 of the stage, physical columns 16t .. 16t + 15).
template <int kMats>
__device__ __forceinline__ void stage_weight_words(const bf16* st, uint4 (&w)[kMats][4]) {
  const int lane = threadIdx.x % kWarp;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int m = 0; m < kMats; ++m) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const bf16* row = st + (16 * m + g + 8 * h) * kMoeXStride + 16 * t;
      w[m][2 * h] = *reinterpret_cast<const uint4*>(row);
      w[m][2 * h + 1] = *reinterpret_cast<const uint4*>(row + 8);
    }
  }
}

/// Copies the chunk of a work item whose first column is col0 into a ring stage (cp.async, this
/// lane's 16-byte pieces): with kWeights, the kMats 16-row weight tiles first (tile m's row i at
/// tile[m] + i K, m < kMats; row r = lane / 8 + 4i of the stage, matrix r / 16: one instruction copies 4
/// whole 128-byte row pieces), then the group's input rows (this lane's rows lane / 8 + 4i from src_row,
/// null: zeros), the first 8 n_tiles of them. Zeros past K (a multiple of 16, so the zero-filled
/// columns are the ones v1's register loads zero).
template <int kMats, bool kWeights, bool kL2Pf = false>
__device__ __forceinline__ void stage_chunk(bf16* dst, const bf16* const* tile, size_t K, int col0,
                                            const bf16* const (&src_row)[kPairGroup / 4], int n_tiles) {
  const int lane = threadIdx.x % kWarp;
  const int c8 = (lane % 8) * 8;
  const int col = col0 + c8;
  const bool ok = static_cast<size_t>(col) < K;
  constexpr int kWRows = kWeights ? 16 * kMats : 0;
  if constexpr (kWeights) {
#pragma unroll
    for (int i = 0; i < 4 * kMats; ++i) {
      const int r = lane / 8 + 4 * i;
      const bf16* src = ok ? tile[r / 16] + (r % 16) * K + col : tile[0];
      if constexpr (kL2Pf) {
        batch::cp_async16_l2pf256(dst + r * kMoeXStride + c8, src, ok ? 16 : 0);
      } else {
        batch::cp_async16(dst + r * kMoeXStride + c8, src, ok ? 16 : 0);
      }
    }
  }
  bf16* xdst = dst + kWRows * kMoeXStride;
#pragma unroll
  for (int i = 0; i < kPairGroup / 4; ++i) {
    const int r = lane / 8 + 4 * i;
    if (r >= 8 * n_tiles) continue;
    const bool okx = src_row[i] != nullptr && ok;
    batch::cp_async16(xdst + r * kMoeXStride + c8, okx ? src_row[i] + col : tile[0], okx ? 16 : 0);
  }
}

/// The MMAs of one chunk: acc[m][j] += the weight words w[m] (rows g, g + 8 of a 16-row tile) x
/// the staged input rows xs (8j + g: row of n-tile j, padded to kMoeXStride), n_tiles of them.
template <int kMats, int kNT = kMoeNT>
__device__ __forceinline__ void chunk_mma(const bf16* xs, const uint4 (&w)[kMats][4], int n_tiles,
                                          float (&acc)[kMats][kNT][4]) {
  const int lane = threadIdx.x % kWarp;
  const int g = lane >> 2, t = lane & 3;
  uint32_t a[kMats][4][4];
#pragma unroll
  for (int m = 0; m < kMats; ++m) {
    uint32_t w0[8], w1[8];
    batch::words8(w[m][0], w[m][1], w0);
    batch::words8(w[m][2], w[m][3], w1);
    batch::a_frags(w0, w1, a[m]);
  }
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
    if (j >= n_tiles) break;  // uniform over the warp
    const bf16* xr = xs + (8 * j + g) * kMoeXStride + 16 * t;
    uint32_t bw[8];
    batch::words8(*reinterpret_cast<const uint4*>(xr), *reinterpret_cast<const uint4*>(xr + 8), bw);
#pragma unroll
    for (int m = 0; m < kMats; ++m) batch::mma_chunk(acc[m][j], a[m], bw);
  }
}

//
// acc[m][j] += W_m (16 rows: row g at wrow[m][0], row g + 8 at wrow[m][1], row stride K, K columns) x the
// group's input rows (n_rows <= kPairGroup, row r at brow(r)), kMats weight matrices against the
// same rows (gate and up). The rows' chunks go through this warp's own cp.async ring (zero-filled
// past n_rows and past K); the weights one chunk or more ahead, in registers or in the ring (P).
// The sum over k is the same in every variant and for every B: chunk after chunk in ascending
// order, the four k-steps of a chunk in order, each MMA column (a pair) on its own.
// Warp-synchronous: no block barrier.
template <typename P, int kMats, typename RowPtr>
__device__ __forceinline__ void warp_gemm(const bf16* const (&wrow)[kMats][2], int K, int n_rows,
                                          RowPtr&& brow, bf16* ring, float (&acc)[kMats][kMoeNT][4]) {
  const int lane = threadIdx.x % kWarp;
  const int g = lane >> 2, t = lane & 3;
  const int nchunks = (K + kChunkK - 1) / kChunkK;
  const int n_tiles = (n_rows + 7) / 8;
  constexpr int kWRows = P::template weight_rows<kMats>();
  constexpr size_t kStageElems = P::template stage_elems<kMats>();
  // The rows this lane stages: r = lane / 8 + 4i (each row is 8 vectors of 16 bytes).
  constexpr int kStageRows = kPairGroup / 4;
  const bf16* src_row[kStageRows];
#pragma unroll
  for (int i = 0; i < kStageRows; ++i) {
    const int r = lane / 8 + 4 * i;
    src_row[i] = r < n_rows ? brow(r) : nullptr;
  }
  const size_t Ks = static_cast<size_t>(K);
  const bf16* tile[kMats];  // row 0 of each weight tile
#pragma unroll
  for (int m = 0; m < kMats; ++m) tile[m] = wrow[m][0] - g * Ks;
  auto stage = [&](int c, int st) {
    stage_chunk<kMats, P::kRing, P::kL2Pf>(ring + static_cast<size_t>(st) * kStageElems, tile, Ks,
                                           c * kChunkK, src_row, n_tiles);
  };
  auto mma_step = [&](const bf16* st, const uint4(&w)[kMats][4]) {
    chunk_mma<kMats>(st + kWRows * kMoeXStride, w, n_tiles, acc);
  };
#pragma unroll
  for (int m = 0; m < kMats; ++m)
#pragma unroll
    for (int j = 0; j < kMoeNT; ++j) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.0f;
  for (int s = 0; s < P::kStages - 1; ++s) {
    if (s < nchunks) stage(s, s);
    batch::cp_async_commit();
  }
  if constexpr (P::kRing) {
    for (int c = 0; c < nchunks; ++c) {
      if (c + P::kStages - 1 < nchunks) stage(c + P::kStages - 1, (c + P::kStages - 1) % P::kStages);
      batch::cp_async_commit();
      batch::cp_async_wait<P::kStages - 1>();
      __syncwarp();  // every lane's copies of chunk c are visible to the warp
      const bf16* st = ring + static_cast<size_t>(c % P::kStages) * kStageElems;
      uint4 w[kMats][4];
      stage_weight_words<kMats>(st, w);
      mma_step(st, w);
      __syncwarp();  // the stage is refilled by a later iteration's copies
    }
  } else {
    // Rows g and g + 8 of each tile, straight from memory into registers.
    auto load_w = [&](uint4(&dst)[kMats][4], int c) {
      const int col = c * kChunkK + 16 * t;
      const bool in = col < K;
#pragma unroll
      for (int m = 0; m < kMats; ++m) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          dst[m][2 * h] = in ? load_stream(wrow[m][h] + col) : make_uint4(0, 0, 0, 0);
          dst[m][2 * h + 1] = in ? load_stream(wrow[m][h] + col + 8) : make_uint4(0, 0, 0, 0);
        }
      }
    };
    constexpr int kWBuf = P::kWBuf;
    uint4 wr[kWBuf][kMats][4];
#pragma unroll
    for (int s = 0; s < kWBuf - 1; ++s) load_w(wr[s], s);  // past K: zeros, nothing read
    for (int c0 = 0; c0 < nchunks; c0 += kWBuf) {
#pragma unroll
      for (int u = 0; u < kWBuf; ++u) {
        const int c = c0 + u;
        if (c >= nchunks) break;
        if (c + kWBuf - 1 < nchunks) load_w(wr[(u + kWBuf - 1) % kWBuf], c + kWBuf - 1);
        if (c + P::kStages - 1 < nchunks) stage(c + P::kStages - 1, (c + P::kStages - 1) % P::kStages);
        batch::cp_async_commit();
        batch::cp_async_wait<P::kStages - 1>();
        __syncwarp();  // every lane's copies of chunk c are visible to the warp
        mma_step(ring + static_cast<size_t>(c % P::kStages) * kStageElems, wr[u]);
        __syncwarp();  // the stage is refilled by a later iteration's copies
      }
    }
  }
}

// ---- grouped experts: the work items ----------------------------------------------------------------------

/// A work item's operands: row 0 of its 16-row weight tile in each matrix (gate_up: gate, up;
/// down: w[0], the block's 16 output columns), the rows' length K, and its group of pairs.
struct ItemOperands {
  const bf16* w[2];
  int K;
  int first;   // the group's first placed pair
  int n_rows;  // pairs in the group (1 .. kPairGroup)
  int tile;    // gate_up: which 16 rows of inter; down: 0
};

/// gate_up item w: (active entry, 16-row tile of its inter, pair group), groups fastest.
__device__ __forceinline__ ItemOperands gate_up_item(const GroupedParams& p, const Plan& pl, int n_active,
                                                     int w) {
  const int a = find_entry(pl, n_active, w);
  const int expert = pl.a_expert[a];
  const bool shared = expert < 0;
  const int groups = (pl.a_cnt[a] + kPairGroup - 1) / kPairGroup;
  const int rem = w - pl.a_items[a];
  const int tile = rem / groups;
  const int grp = rem - tile * groups;
  ItemOperands it;
  it.K = p.H;
  it.first = pl.a_off[a] + grp * kPairGroup;
  it.n_rows = min(kPairGroup, pl.a_cnt[a] - grp * kPairGroup);
  it.tile = tile;
  const size_t eo = shared ? 0 : static_cast<size_t>(expert) * p.routed.inter * p.H;
  const size_t ro = static_cast<size_t>(tile) * 16 * p.H;
  it.w[0] = (shared ? p.shared.gate : p.routed.gate + eo) + ro;
  it.w[1] = (shared ? p.shared.up : p.routed.up + eo) + ro;
  return it;
}

/// down item w of the block whose output columns start at h0: (active entry, pair group).
__device__ __forceinline__ ItemOperands down_item(const GroupedParams& p, const Plan& pl, int n_active, int w,
                                                  int h0) {
  const int a = find_entry(pl, n_active, w);
  const int expert = pl.a_expert[a];
  const bool shared = expert < 0;
  const int grp = w - pl.a_items[a];
  ItemOperands it;
  it.K = shared ? p.shared.inter : p.routed.inter;
  it.first = pl.a_off[a] + grp * kPairGroup;
  it.n_rows = min(kPairGroup, pl.a_cnt[a] - grp * kPairGroup);
  it.tile = 0;
  it.w[0] = (shared ? p.shared.down : p.routed.down + static_cast<size_t>(expert) * p.H * p.routed.inter) +
            static_cast<size_t>(h0) * it.K;
  it.w[1] = it.w[0];
  return it;
}

/// The down kernels' last step, after every item of the block wrote d_s: each live row sums its own
/// routes in idx order, as moe_experts sums them, then the shared expert; block-wide.
__device__ __forceinline__ void combine_rows(const GroupedParams& p, const Plan& pl, const bf16* d_s,
                                             int h0) {
  const int P_ = p.routes.rows * p.routes.top_k;
  __shared__ int s_live_count;
  if (threadIdx.x == 0) {
    int c = 0;
    for (int b = 0; b < p.routes.rows; ++b) c += p.routes.slot[b] >= 0;
    s_live_count = c;
  }
  __syncthreads();
  for (int v = threadIdx.x; v < s_live_count * kDownCols; v += blockDim.x) {
    const int b = pl.live[v / kDownCols];
    const int hh = v % kDownCols;
    float o = 0.0f;
    for (int i = 0; i < p.routes.top_k; ++i) {
      const int q = b * p.routes.top_k + i;
      const int e = p.routes.idx[q] - p.first_expert;
      if (e < 0 || e >= p.num_local) continue;
      o = __fadd_rn(o,
                    __fmul_rn(p.routes.weights[q], bf16_to_f(d_s[static_cast<size_t>(q) * kDownCols + hh])));
    }
    if (p.shared.inter > 0) {
      const float sh =
          __fadd_rn(0.0f, __fmul_rn(1.0f, bf16_to_f(d_s[static_cast<size_t>(P_ + b) * kDownCols + hh])));
      o = __fadd_rn(o, sh);
    }
    p.out[static_cast<size_t>(b) * p.H + h0 + hh] = o;
  }
}

// ---- grouped experts: the kernels -----------------------------------------------------------------------

/// The plan of a launch: built in shared memory by this block, or (kWide) read from the global
/// plan that moe_plan_wide_kernel built (n_active first).
template <bool kWide>
__device__ __forceinline__ Plan launch_plan(const GroupedParams& p, const PlanLayout& layout, int* smem_plan,
                                            bool gate_up, int& n_active) {
  if constexpr (kWide) {
    int* g = const_cast<int*>(gate_up ? p.plan_gu : p.plan_dn);
    n_active = g[0];
    return carve_plan(g + 1, layout);
  } else {
    const Plan pl = carve_plan(smem_plan, layout);
    n_active = build_plan(p, pl, gate_up);
    return pl;
  }
}

/// Launch 1: act for every (active entry, 16 inter rows, pair group) item, one warp per item.
template <typename P, bool kWide>
__global__ void __launch_bounds__(kGroupedThreads, P::kMinBlocks)
    moe_gate_up_grouped_kernel(GroupedParams p, PlanLayout layout) {
  pdl_begin();
  extern __shared__ __align__(16) uint8_t moe_smem[];
  bf16* rings = reinterpret_cast<bf16*>(moe_smem);  // [warps][stages][stage rows][kMoeXStride]
  int n_active;
  const Plan pl = launch_plan<kWide>(p, layout, reinterpret_cast<int*>(rings + P::template ring_elems<2>()),
                                     true, n_active);
  if (n_active == 0) return;
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int g = lane >> 2, t = lane & 3;
  bf16* ring = rings + warp * P::kStages * P::template stage_elems<2>();
  const int total = pl.a_items[n_active];
  // v1: block b's warps take items 8b .. 8b + 7; spread: item w goes to block w % gridDim.
  const int w0 = P::kSpread ? warp * gridDim.x + blockIdx.x : blockIdx.x * kMoeWarps + warp;
  for (int w = w0; w < total; w += gridDim.x * kMoeWarps) {
    const ItemOperands it = gate_up_item(p, pl, n_active, w);
    const size_t H = p.H;
    const bf16* const wrow[2][2] = {{it.w[0] + g * H, it.w[0] + (g + 8) * H},
                                    {it.w[1] + g * H, it.w[1] + (g + 8) * H}};
    float acc[2][kMoeNT][4];
    warp_gemm<P, 2>(
        wrow, p.H, it.n_rows, [&](int r) { return p.x + static_cast<size_t>(pl.pr_row[it.first + r]) * p.H; },
        ring, acc);
    for_live_acc(t, it.n_rows, [&](int j, int e, int q) {
      const int i = it.tile * 16 + g + (e >= 2 ? 8 : 0);
      p.act[static_cast<size_t>(pl.pr_route[it.first + q]) * p.act_ld + i] =
          swiglu_act(acc[0][j][e], acc[1][j][e], p.limit);
    });
  }
}

/// Launch 2: block = output columns [16 * blockIdx.x, + 16) of every live row.
template <typename P, bool kWide>
__global__ void __launch_bounds__(kGroupedThreads, P::kMinBlocks)
    moe_down_grouped_kernel(GroupedParams p, PlanLayout layout) {
  pdl_begin();
  extern __shared__ __align__(16) uint8_t moe_smem[];
  bf16* rings = reinterpret_cast<bf16*>(moe_smem);
  const int routes = p.routes.rows * p.routes.top_k + p.routes.rows;
  // [pairs + rows][kDownCols]: bf16(d) per route, in shared memory after the rings, or (kWide) this
  // block's part of p.d (written and read by this block only: its barrier orders them).
  bf16* d_s = kWide ? p.d + static_cast<size_t>(blockIdx.x) * routes * kDownCols
                    : rings + P::template ring_elems<1>();
  // routes * 16 BF16 = a multiple of 16 bytes: the plan after it stays aligned.
  int n_active;
  const Plan pl = launch_plan<kWide>(
      p, layout,
      reinterpret_cast<int*>(rings + P::template ring_elems<1>() + static_cast<size_t>(routes) * kDownCols),
      false, n_active);
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int g = lane >> 2, t = lane & 3;
  const int h0 = blockIdx.x * kDownCols;
  bf16* ring = rings + warp * P::kStages * P::template stage_elems<1>();
  const int total = n_active > 0 ? pl.a_items[n_active] : 0;
  for (int w = warp; w < total; w += kMoeWarps) {
    const ItemOperands it = down_item(p, pl, n_active, w, h0);
    const size_t K = it.K;
    const bf16* const wrow[1][2] = {{it.w[0] + g * K, it.w[0] + (g + 8) * K}};
    float acc[1][kMoeNT][4];
    warp_gemm<P, 1>(
        wrow, it.K, it.n_rows,
        [&](int r) { return p.act + static_cast<size_t>(pl.pr_route[it.first + r]) * p.act_ld; }, ring, acc);
    for_live_acc(t, it.n_rows, [&](int j, int e, int q) {
      const int hh = g + (e >= 2 ? 8 : 0);
      d_s[static_cast<size_t>(pl.pr_route[it.first + q]) * kDownCols + hh] = f_to_bf16(acc[0][j][e]);
    });
  }
  __syncthreads();
  combine_rows(p, pl, d_s, h0);
}

// ---- grouped experts: the host side ----------------------------------------------------------------------

/// One grouped launch's operands, checked (sizes, alignment, the wide scratch): the parameters, the
/// plan's layout, the shared memory of a narrow launch's plan and of d, and the most work items
/// each kernel can have (the grid sizes of the launches).
struct GroupedLaunch {
  GroupedParams p;
  PlanLayout layout{};
  size_t plan_bytes = 0;        ///< the plan in a narrow launch's shared memory
  size_t d_bytes = 0;           ///< d in a narrow down launch's shared memory
  int64_t items_max = 0;        ///< one-warp gate_up items
  int64_t block_items_max = 0;  ///< block-item gate_up items
  int64_t down_items_max = 0;   ///< block-item down items
};
/// The operands of moe_experts_grouped's launch of `rows` rows (1 .. kMaxMoeLaunchRows; moe.hpp),
/// its arguments as moe.hpp describes them (moe.cu).
GroupedLaunch grouped_launch(const bf16* x, const ExpertWeights& routed, const int32_t* idx,
                             const float* weights, const int32_t* slot, int rows, int top_k,
                             const ExpertWeights* shared, float limit, bf16* act, float* out, void* wide);
/// A wide launch's first launch: the plans built once into `wide` (after d; moe.cu), p's d and
/// plans pointed there. block_items: gate_up's items counted as the block-item kernels take them.
void launch_wide_plan(const LaunchCtx& ctx, GroupedParams& p, const PlanLayout& layout, void* wide,
                      bool block_items);

/// Raises the dynamic shared memory limit of kernel K to `bytes` when a launch needs more than it
/// was raised to before (48 KB: the default). One record per kernel, whichever pipeline pair
/// launches it.
template <auto K>
void opt_in_smem(size_t bytes) {
  static size_t opted = 48 * 1024;
  if (bytes <= opted) return;
  MTP_CUDA_CHECK(
      cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  opted = bytes;
}

/// Resident blocks of kernel K a multiprocessor at `smem` bytes of shared memory, asked once per
/// size (a host computation, also while a graph is being captured).
template <auto K>
int blocks_per_sm(size_t smem) {
  static size_t asked = 0;
  static int per_sm = 0;
  if (asked != smem) {
    MTP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, K, kGroupedThreads, smem));
    asked = smem;
  }
  return std::max(1, per_sm);
}

/// The shared memory limit of a grouped launch: 220 KB (the multiprocessor's 227 less what the
/// static variables and the runtime take).
inline void require_grouped_smem(const GroupedParams& p, size_t smem1, size_t smem2) {
  MTP_REQUIRE(std::max(smem1, smem2) <= 220 * 1024, "ops::cuda::moe_experts_grouped: ", p.routes.rows,
              " rows x ", p.routes.top_k, " routes and ", p.num_local, " local experts need ",
              std::max(smem1, smem2),
              " bytes of shared memory (at most 225280; moe_pipeline v1 needs the least)");
}

/// The two launches under the pipelines GU (gate_up) and DN (down); kWide: after the plan's launch,
/// with the plan and d in `wide` (global memory, wide_bytes) instead of shared memory.
template <typename GU, typename DN, bool kWide = false>
void launch_grouped(const LaunchCtx& ctx, GroupedParams p, const PlanLayout& layout, int64_t items_max,
                    size_t plan_bytes, size_t d_bytes, void* wide = nullptr) {
  if constexpr (kWide) {
    plan_bytes = 0;
    d_bytes = 0;
    launch_wide_plan(ctx, p, layout, wide, false);
  }
  const size_t smem1 = sizeof(bf16) * GU::template ring_elems<2>() + plan_bytes;
  const size_t smem2 = sizeof(bf16) * DN::template ring_elems<1>() + d_bytes + plan_bytes;
  require_grouped_smem(p, smem1, smem2);
  opt_in_smem<moe_gate_up_grouped_kernel<GU, kWide>>(smem1);
  opt_in_smem<moe_down_grouped_kernel<DN, kWide>>(smem2);
  if (items_max > 0) {
    int64_t grid1;
    if constexpr (GU::kSpread) {
      // Every resident block (each deals itself items w % grid), no more blocks than items.
      grid1 = std::min<int64_t>(
          items_max,
          static_cast<int64_t>(blocks_per_sm<moe_gate_up_grouped_kernel<GU, kWide>>(smem1)) * ctx.num_sms);
    } else {
      // Two blocks per multiprocessor are resident (about 128 registers a thread); the rest of a
      // large batch's items are walked by the persistent loop.
      grid1 =
          std::min<int64_t>((items_max + kMoeWarps - 1) / kMoeWarps, 2 * static_cast<int64_t>(ctx.num_sms));
    }
    launch(ctx, moe_gate_up_grouped_kernel<GU, kWide>, static_cast<unsigned>(std::max<int64_t>(1, grid1)),
           kGroupedThreads, smem1, p, layout);
    MTP_CUDA_LAUNCH_CHECK();
  }
  launch(ctx, moe_down_grouped_kernel<DN, kWide>, p.H / kDownCols, kGroupedThreads, smem2, p, layout);
  MTP_CUDA_LAUNCH_CHECK();
}

}  // namespace mtplab::ops::cuda::grouped
