// The multi-row GEMV of the batched linears at a few rows (the CPU reference: cpu/dense.cpp;
// KernelPolicy::rows_linear picks it): every weight element loaded once for all rows, a row's
// result independent of the other rows.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>

#include "ops/cuda/batch_common.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dense.hpp"
#include "ops/cuda/device_common.cuh"
#include "ops/cuda/launch.cuh"

namespace mtplab::ops::cuda {

namespace {

// ---- the multi-row GEMV (rows_gemv) -----------------------------------------------------------------
//
// Y[r, n] = W[n] . X[r] for R = 2 .. kMaxRowsGemv rows, every W element loaded once for all rows.
// A warp owns one part of k: 32 chunks of 8 columns, one chunk per lane, whose R activation chunks
// the lane holds in registers as fp32 for the whole launch. A block is a tile of up to kRgWarps
// consecutive parts (2048 columns; blockIdx.y is the tile) and walks groups of kU output rows
// (blockIdx.x, grid-stride): each lane streams its chunk of the kU weight rows (16-byte loads, the
// next group's issued before the current group is reduced), does kR x 8 FMAs per chunk, the warp
// reduces its kU x kR sums with a reduce-scatter butterfly, the tile's parts are summed in shared
// memory in part order, and the tiles in tile order: directly into Y when k fits one tile, else
// through a workspace [tiles][rows][n] whose last-arriving block (a per-group counter that the
// same block resets) adds the tiles' sums and writes Y.
//
// Invariance: output (r, n) is the same fp32 function of W[n] and X[r] whatever R, the other rows
// or the grid: the lane that owns a chunk depends only on k, each lane's 8 products are summed in
// column order into an accumulator of row r alone, the butterfly adds the same pairs as warp_sum
// (same xor order 16 .. 1, each pair the lane's own partial plus its partner's), and the parts and
// tiles are summed in index order. kR, kU and the grid only decide which rows share a launch, a
// group or a block, so a row's bits at B = 2 are its bits at B = 16. (It is not gemv_bf16's order:
// the single-row GEMV splits k per shape, this kernel always in parts of 256 columns.)

constexpr int kRgWarps = 8;             // parts per tile = warps per block
constexpr int kRgPartCols = 8 * kWarp;  // columns of a part: one 16-byte chunk per lane
constexpr int kRgTileCols = kRgWarps * kRgPartCols;

/// One output of a rows_gemv launch: W [n, k] rows, y [rows][n]; virtual rows first .. first + n - 1
/// of the launch. BF16 y rounded once; fp32 y times `scale` in fp32 when scale != 1 (as scale_f32).
struct RowsGemvOut {
  const bf16* W = nullptr;
  void* y = nullptr;
  int n = 0;
  int first = 0;
  int f32 = 0;
  float scale = 1.0f;
};
inline constexpr int kMaxRowsGemvOuts = kMaxLinearGroup;

struct RowsGemvParams {
  RowsGemvOut out[kMaxRowsGemvOuts];
  int n_outs = 0;
  const bf16* x = nullptr;
  int rows = 0;
  int n = 0;  // virtual rows: every output's n, in output order
  int k = 0;
  int tiles = 1;
  float* ws = nullptr;              // [tiles][rows][n] tile sums (tiles > 1)
  unsigned int* counter = nullptr;  // per row group, zero between launches (tiles > 1)
};

/// The output holding virtual row `row` (row < p.n).
__device__ __forceinline__ int rows_gemv_out_of(const RowsGemvParams& p, int row) {
  int o = 0;
  while (o + 1 < p.n_outs && row >= p.out[o + 1].first) ++o;
  return o;
}

__device__ __forceinline__ void rows_gemv_store(const RowsGemvParams& p, int r, int row, float v) {
  const RowsGemvOut& o = p.out[rows_gemv_out_of(p, row)];
  const size_t at = static_cast<size_t>(r) * o.n + (row - o.first);
  if (o.f32) {
    static_cast<float*>(o.y)[at] = o.scale != 1.0f ? __fmul_rn(v, o.scale) : v;
  } else {
    static_cast<bf16*>(o.y)[at] = f_to_bf16(v);
  }
}

template <int kR, int kU, int kW>
__global__ void __launch_bounds__(kW* kWarp) rows_gemv_kernel(RowsGemvParams p) {
  static_assert(kW % kRgWarps == 0, "a block is whole tiles of kRgWarps parts");
  pdl_begin();
  constexpr int kM = kR * kU;  // sums per warp and group: value u * kR + r
  constexpr int kLanesPerValue = kWarp / kM;
  __shared__ float s_part[kM][kW];
  __shared__ bool s_last;
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int tile = blockIdx.y;  // of kW parts (kW / kRgWarps tiles of kRgWarps parts, one launch tile)
  const int n_chunks = p.k / 8;
  const int n_parts = (n_chunks + kWarp - 1) / kWarp;
  const int tile_parts = min(kW, n_parts - tile * kW);
  const int chunk = (tile * kW + warp) * kWarp + lane;
  const bool active = warp < tile_parts && chunk < n_chunks;

  // This lane's chunk of every row of X, as fp32 (zeros past the rows or k).
  float xf[kR][8];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const uint4 v = active && r < p.rows ? load_cached(p.x + static_cast<size_t>(r) * p.k + chunk * 8)
                                         : make_uint4(0, 0, 0, 0);
    batch::unpack8(v, xf[r]);
  }

  const size_t row_bytes = static_cast<size_t>(p.k) * 2;
  const int groups = (p.n + kU - 1) / kU;
  auto load_group = [&](uint4(&w)[kU], int g) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int row = g * kU + u;
      if (active && row < p.n) {
        const RowsGemvOut& o = p.out[rows_gemv_out_of(p, row)];
        w[u] = load_stream(reinterpret_cast<const uint8_t*>(o.W) +
                           static_cast<size_t>(row - o.first) * row_bytes + static_cast<size_t>(chunk) * 16);
      } else {
        w[u] = make_uint4(0, 0, 0, 0);
      }
    }
  };
  uint4 w[kU];
  if (static_cast<int>(blockIdx.x) < groups) load_group(w, blockIdx.x);

  for (int g = blockIdx.x; g < groups; g += gridDim.x) {
    float v[kM];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      float wf[8];
      batch::unpack8(w[u], wf);
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        float acc = 0.0f;
        if (kR == 2 || r < p.rows) {
#pragma unroll
          for (int e = 0; e < 8; ++e) acc = fmaf(wf[e], xf[r][e], acc);
        }
        v[u * kR + r] = acc;
      }
    }
    // The next group's weights are in flight while this group is reduced and combined.
    if (g + static_cast<int>(gridDim.x) < groups) load_group(w, g + gridDim.x);
    warp_reduce_scatter<kM>(v, lane);
    if (warp < tile_parts && lane % kLanesPerValue == 0) s_part[lane / kLanesPerValue][warp] = v[0];
    __syncthreads();
    // Thread t < kM: value t of the group, its tile's parts in part order.
    const int t = threadIdx.x;
    const int r = t % kR;
    const int row = g * kU + t / kR;
    const bool ok = t < kM && r < p.rows && row < p.n;
    float sum = 0.0f;
    if (ok) {
      // Each kRgWarps parts summed in part order, then those sums in order: the association of
      // kRgWarps-part tiles summed in tile order, whatever kW.
      sum = sum_parts(&s_part[t][0], min(kRgWarps, tile_parts));
      for (int q0 = kRgWarps; q0 < tile_parts; q0 += kRgWarps)
        sum += sum_parts(&s_part[t][q0], min(kRgWarps, tile_parts - q0));
    }
    __syncthreads();  // s_part is rewritten by the next group
    if (p.tiles == 1) {
      if (ok) rows_gemv_store(p, r, row, sum);
      continue;
    }
    float* ws_at = p.ws + static_cast<size_t>(r) * p.n + row;  // + tile * rows * n
    const size_t tile_stride = static_cast<size_t>(p.rows) * p.n;
    if (ok) ws_at[tile * tile_stride] = sum;
    __threadfence();  // publish the tile's sums before counting this block as done with the group
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(p.counter + g, 1u) == static_cast<unsigned>(p.tiles - 1);
    __syncthreads();
    if (!s_last) continue;
    if (threadIdx.x == 0) p.counter[g] = 0;  // ready for the next launch (stream order)
    __threadfence();
    if (ok) {
      float total = __ldcg(ws_at);
      for (int tt = 1; tt < p.tiles; ++tt) total += __ldcg(ws_at + tt * tile_stride);
      rows_gemv_store(p, r, row, total);
    }
  }
}

/// Blocks of `kernel` with `warps` warps resident per SM, asked of the occupancy calculator once.
template <int kR, int kU, int kW>
int rows_gemv_resident(int warps) {
  static std::array<std::atomic<int>, kW + 1> cache{};
  int b = cache[static_cast<size_t>(warps)].load(std::memory_order_relaxed);
  if (b == 0) {
    MTP_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, rows_gemv_kernel<kR, kU, kW>, warps * kWarp, 0));
    b = std::max(1, b);
    cache[static_cast<size_t>(warps)].store(b, std::memory_order_relaxed);
  }
  return b;
}

template <int kR, int kU, int kW>
void launch_rows_gemv(const LaunchCtx& ctx, RowsGemvParams p) {
  const int n_parts = (p.k / 8 + kWarp - 1) / kWarp;
  const int warps = std::min(kW, n_parts);
  p.tiles = (n_parts + kW - 1) / kW;
  const int groups = (p.n + kU - 1) / kU;
  const int resident = rows_gemv_resident<kR, kU, kW>(warps) * ctx.num_sms;
  const int gx = std::max(1, std::min(groups, resident / p.tiles));
  launch(ctx, rows_gemv_kernel<kR, kU, kW>, dim3(static_cast<unsigned>(gx), static_cast<unsigned>(p.tiles)),
         dim3(static_cast<unsigned>(warps * kWarp)), 0, p);
  MTP_CUDA_LAUNCH_CHECK();
}

/// kR: the rows rounded up to a power of two (the padded rows load nothing and
/// skip their FMAs); kU: 4 weight
/// rows per group up to 8 rows, 2 at 16 (the activations then hold 128 registers).
/// kW: a block of two tiles (16 warps) where k spans exactly two (2048 < k <= 4096) and the rows'
/// activations leave the registers for it (up to 8 rows): one block sums the whole row, with no
/// workspace, fence or counter between two blocks (the same association: above).
void dispatch_rows_gemv(const LaunchCtx& ctx, const RowsGemvParams& p) {
  const bool two_tiles = p.k > kRgTileCols && p.k <= 2 * kRgTileCols;
  if (p.rows <= 2) {
    return two_tiles ? launch_rows_gemv<2, 4, 2 * kRgWarps>(ctx, p)
                     : launch_rows_gemv<2, 4, kRgWarps>(ctx, p);
  }
  if (p.rows <= 4) {
    return two_tiles ? launch_rows_gemv<4, 4, 2 * kRgWarps>(ctx, p)
                     : launch_rows_gemv<4, 4, kRgWarps>(ctx, p);
  }
  if (p.rows <= 8) {
    return two_tiles ? launch_rows_gemv<8, 4, 2 * kRgWarps>(ctx, p)
                     : launch_rows_gemv<8, 4, kRgWarps>(ctx, p);
  }
  return launch_rows_gemv<16, 2, kRgWarps>(ctx, p);
}

int rows_gemv_tiles(int k) { return (k + kRgTileCols - 1) / kRgTileCols; }

}  // namespace

size_t rows_gemv_ws_floats(int n, int k) {
  const int tiles = rows_gemv_tiles(k);
  return tiles > 1 ? static_cast<size_t>(tiles) * kMaxRowsGemv * static_cast<size_t>(n) : 0;
}

int rows_gemv_counters(int n, int k) { return rows_gemv_tiles(k) > 1 ? n : 0; }

void rows_gemv_group(const LaunchCtx& ctx, std::span<const LinearOut> outs, const bf16* x, int rows, int k,
                     const RowsGemvScratch& s) {
  MTP_REQUIRE(!outs.empty() && static_cast<int>(outs.size()) <= kMaxRowsGemvOuts,
              "ops::cuda::rows_gemv: ", outs.size(), " outputs (1 .. ", kMaxRowsGemvOuts, " per launch)");
  MTP_REQUIRE(rows >= 1 && rows <= kMaxRowsGemv && k >= 8 && k % 8 == 0, "ops::cuda::rows_gemv: rows ", rows,
              " (1 .. ", kMaxRowsGemv, "), k ", k,
              " (k must be a positive multiple of 8: the kernel loads 16-byte chunks of 8 columns)");
  require_aligned("rows_gemv", "x", x);
  RowsGemvParams p;
  int64_t n = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    const LinearOut& o = outs[i];
    MTP_REQUIRE(o.W && o.y && o.n_out >= 1, "ops::cuda::rows_gemv: output ", i, " has W ", o.W, ", y ", o.y,
                ", n ", o.n_out);
    MTP_REQUIRE(o.f32_out || o.f32_scale == 1.0f, "ops::cuda::rows_gemv: output ", i,
                " is BF16 but has f32_scale ", o.f32_scale, " (only fp32 outputs are scaled)");
    require_aligned("rows_gemv", "W", o.W);
    p.out[i] = RowsGemvOut{o.W, o.y, o.n_out, static_cast<int>(n), o.f32_out ? 1 : 0, o.f32_scale};
    n += o.n_out;
  }
  MTP_REQUIRE(n <= (int64_t{1} << 30), "ops::cuda::rows_gemv: ", n, " output rows in one launch");
  p.n_outs = static_cast<int>(outs.size());
  p.x = x;
  p.rows = rows;
  p.n = static_cast<int>(n);
  p.k = k;
  p.tiles = rows_gemv_tiles(k);
  if (p.tiles > 1) {
    MTP_REQUIRE(s.ws && s.ws_floats >= static_cast<size_t>(p.tiles) * rows * p.n && s.counter &&
                    s.counters >= rows_gemv_counters(p.n, k),
                "ops::cuda::rows_gemv: k ", k, " spans ", p.tiles, " tiles and needs ",
                static_cast<size_t>(p.tiles) * rows * p.n, " workspace floats and ",
                rows_gemv_counters(p.n, k), " counters; the scratch has ", s.ws_floats, " and ", s.counters);
    p.ws = s.ws;
    p.counter = s.counter;
  }
  dispatch_rows_gemv(ctx, p);
}

void rows_gemv(const LaunchCtx& ctx, const bf16* W, const bf16* x, void* y, bool f32_out, int rows, int n,
               int k, const RowsGemvScratch& s) {
  MTP_REQUIRE(n >= 1, "ops::cuda::rows_gemv: n ", n);
  const LinearOut out{W, y, n, f32_out, 1.0f};
  rows_gemv_group(ctx, std::span<const LinearOut>(&out, 1), x, rows, k, s);
}

}  // namespace mtplab::ops::cuda
