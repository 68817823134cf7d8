// MoE (the CPU reference: cpu/moe.cpp): the router and the routed experts this rank owns.
// - One row: moe_route runs the batched router's kernel at one row; moe_experts in two launches
//   (gate/up + activation, then down + weighted combine), warps streaming the expert rows with the
//   GEMV family's lane dot product (slice_dot, device_common.cuh), expert ids read on the device;
//   the shared expert runs in the same two launches as one more slot of weight 1, added last.
// - Batched rows: the router per row, and the routed experts grouped over the batch; at 1 .. 4
//   rows (moe_pipeline slots, auto at 1 - 3) the single-row kernels instead, a warp per (row,
//   route) and the shared expert's weights loaded once for all rows: each row the one-row bits.
//   Which runs, and under which memory pipeline, is dispatch.cu's rule (moe_grouped_plan).
//
// moe_route_batch: block b routes row b (one thread per expert, up to 1024): sigmoid, bias, group
// limit, then every expert's packed key (biased score, lower id first on ties) is ranked against all
// others and the rank-r expert goes to slot r: the CPU's stable-sort order. Padded rows: nothing.
//
// moe_experts_grouped, two launches, nothing on the host:
// 1. The plan, in shared memory, built by every block of both launches from idx / slot alone (so no
//    launch waits on another for it): the (row, route) pairs of the live rows whose expert this rank
//    owns, counted per local expert, placed by expert (a stable counting sort: counts, a block scan, then
//    each pair at its expert's offset), the experts with pairs listed in ascending id ("active"),
//    and the shared expert as one more active entry whose pairs are the live rows.
// 2. gate_up: each warp takes work items (active expert, 16 rows of its gate and up, a group of up
//    to 16 pairs) and computes both projections of those rows for the group's input rows on the
//    tensor cores (the weights read once, by the warp whose fragments hold them, the input rows
//    gathered through a per-warp cp.async ring; how the weights wait for their MMAs is the
//    policy's moe_pipeline, "the memory pipelines" below), then
//    act = bf16(silu(min(g, L)) * clamp(u, -L, L)) with g, u rounded, into act[route].
// 3. down + combine: block = 16 output columns h of every row. Its warps take (active expert, pair
//    group) items: d = bf16(W_down[h] . act[route]) for the block's 16 h, kept in shared memory per
//    route; then each live row sums its own routes in idx order, out = 0, out += w_i * d_i for the
//    owned ones, then + (0 + 1 * d_shared), each one fp32 operation as on the CPU.
// Items of one expert sit next to each other, so an expert whose pairs span several groups is read
// from memory once and from L2 by the neighbouring groups. Each pair's numbers depend on nothing but
// its own row (an MMA column is independent of the others); the placement is stable (ascending pair
// index within an expert), so every block cuts an expert's pairs into the same work groups.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/cuda/batch_common.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/device_common.cuh"
#include "ops/cuda/dispatch.hpp"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/moe.hpp"
#include "ops/cuda/moe_grouped.cuh"
#include "ops/group_score.hpp"

namespace mtplab::ops::cuda {

using namespace grouped;  // the grouped experts' work items (moe_grouped.cuh)

// ==== one row ==========================================================================================

namespace {

constexpr int kMoeThreads = 256;
constexpr int kMoeUnroll = 4;

/// The shared expert's slice when it runs in the routed experts' launches (moe_experts_shared):
/// its rows follow the routed slots' (act[top_k * I + i]), with weight 1. inter 0: none.
struct SharedExpert {
  const bf16* gate = nullptr;
  const bf16* up = nullptr;
  const bf16* down = nullptr;
  int inter = 0;
};

/// Row b of R is live: no slot table (the single-row op), or slot[b] >= 0.
template <int R>
__device__ __forceinline__ void live_rows(const int32_t* slot, bool (&live)[R]) {
#pragma unroll
  for (int b = 0; b < R; ++b) live[b] = slot == nullptr || slot[b] >= 0;
}

/// This lane's share of the dot products of one weight row with R activation rows x[b] over 16-byte
/// chunks [0, n_chunks), kMoeUnroll weight loads in flight: each weight chunk is loaded once for
/// every row, and row b's sum takes its chunks in slice_dot's order (so its bits are the one-row
/// dot product's whatever R). Rows with !live[b] add nothing.
template <int R>
__device__ __forceinline__ void dot_rows_one_weight(const bf16* w_row, const bf16* const (&x)[R],
                                                    const bool (&live)[R], int n_chunks, int lane,
                                                    float (&acc)[R]) {
  for (int c = lane; c < n_chunks; c += kWarp * kMoeUnroll) {
    uint4 wv[kMoeUnroll];
#pragma unroll
    for (int q = 0; q < kMoeUnroll; ++q) {
      const int cc = c + q * kWarp;
      wv[q] = cc < n_chunks ? load_stream(w_row + static_cast<size_t>(cc) * 8) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int q = 0; q < kMoeUnroll; ++q) {
      const int cc = c + q * kWarp;
      if (cc < n_chunks) {
#pragma unroll
        for (int b = 0; b < R; ++b)
          if (live[b]) acc[b] = dot_bf16x8(wv[q], load_cached(x[b] + static_cast<size_t>(cc) * 8), acc[b]);
      }
    }
  }
}

/// This lane's share of one x row's dot products with a gate row and an up row over 16-byte
/// chunks [0, n_chunks): kMoeUnroll loads of each in flight, the chunks added in ascending order.
__device__ __forceinline__ void gate_up_dot(const bf16* g_row, const bf16* u_row, const bf16* x, int n_chunks,
                                            int lane, float& g, float& u) {
  for (int c = lane; c < n_chunks; c += kWarp * kMoeUnroll) {
    uint4 gv[kMoeUnroll], uv[kMoeUnroll];
#pragma unroll
    for (int q = 0; q < kMoeUnroll; ++q) {
      const int cc = c + q * kWarp;
      gv[q] = cc < n_chunks ? load_stream(g_row + static_cast<size_t>(cc) * 8) : make_uint4(0, 0, 0, 0);
      uv[q] = cc < n_chunks ? load_stream(u_row + static_cast<size_t>(cc) * 8) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int q = 0; q < kMoeUnroll; ++q) {
      const int cc = c + q * kWarp;
      if (cc < n_chunks) {
        const uint4 xv = load_cached(x + static_cast<size_t>(cc) * 8);
        g = dot_bf16x8(gv[q], xv, g);
        u = dot_bf16x8(uv[q], xv, u);
      }
    }
  }
}

/// act[b][s, i] = swiglu_act of row b's gate and up projections through the expert in its slot s
/// (row b's activations at act + b * (top_k * I + shared inter)); zero for slots whose expert another
/// rank owns; then the shared expert's rows, if any. One warp per (b, s, i), and one per shared row i
/// for all R rows (its weights loaded once). Padded rows (slot[b] < 0) are skipped: nothing read or
/// written. Each (b, s, i) is the one-row op's dot product, so a row's bits do not depend on R.
template <int R>
__global__ void __launch_bounds__(kMoeThreads)
    moe_gate_up_kernel(const bf16* x, const int32_t* slot, const bf16* gate, const bf16* up, int first_expert,
                       int num_local, int H, int I, const int32_t* idx, int top_k, float limit, bf16* act,
                       SharedExpert sh) {
  pdl_begin();
  const int lane = threadIdx.x % kWarp;
  const int64_t warps_total = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  const int n_chunks = H / 8;
  const int64_t per_row = static_cast<int64_t>(top_k) * I;
  const int64_t act_ld = per_row + sh.inter;
  const int64_t routed_tasks = R * per_row;
  bool live[R];
  live_rows<R>(slot, live);
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
       t < routed_tasks + sh.inter; t += warps_total) {
    if (t < routed_tasks) {
      const int b = R == 1 ? 0 : static_cast<int>(t / per_row);
      if (!live[b]) continue;
      const int64_t r = t - b * per_row;
      const int s = static_cast<int>(r / I);
      const int i = static_cast<int>(r - static_cast<int64_t>(s) * I);
      bf16* a = act + b * act_ld + r;
      const int local = idx[b * top_k + s] - first_expert;
      if (local < 0 || local >= num_local) {
        if (lane == 0) *a = bf16{0};
        continue;
      }
      const size_t row = (static_cast<size_t>(local) * I + i) * H;
      const bf16* xb = x + static_cast<size_t>(b) * H;
      float g = 0.0f, u = 0.0f;
      gate_up_dot(gate + row, up + row, xb, n_chunks, lane, g, u);
      g = warp_sum(g);
      u = warp_sum(u);
      if (lane == 0) *a = swiglu_act(g, u, limit);
    } else {
      // The shared expert's row i for every row: the gate row's loads, then the up row's (each
      // row's sums in slice order, as the routed rows' are).
      const int64_t i = t - routed_tasks;
      const bf16* xs[R];
#pragma unroll
      for (int b = 0; b < R; ++b) xs[b] = x + static_cast<size_t>(b) * H;
      float g[R], u[R];
#pragma unroll
      for (int b = 0; b < R; ++b) g[b] = u[b] = 0.0f;
      if constexpr (R == 1) {
        // One row: gate and up loads in flight together, as the routed rows.
        if (live[0])
          gate_up_dot(sh.gate + static_cast<size_t>(i) * H, sh.up + static_cast<size_t>(i) * H, xs[0],
                      n_chunks, lane, g[0], u[0]);
      } else {
        dot_rows_one_weight<R>(sh.gate + static_cast<size_t>(i) * H, xs, live, n_chunks, lane, g);
        dot_rows_one_weight<R>(sh.up + static_cast<size_t>(i) * H, xs, live, n_chunks, lane, u);
      }
#pragma unroll
      for (int b = 0; b < R; ++b) {
        g[b] = warp_sum(g[b]);
        u[b] = warp_sum(u[b]);
        if (lane == 0 && live[b]) act[b * act_ld + per_row + i] = swiglu_act(g[b], u[b], limit);
      }
    }
  }
}

/// out[h] = sum over owned slots s, in slot order, of weights[s] * bf16(W_down,s[h] . act[s]).
/// One warp per output h; the slots' rows are read back to back (one row, more than 31 slots).
__global__ void __launch_bounds__(kMoeThreads)
    moe_down_kernel(const bf16* down, int first_expert, int num_local, int H, int I, const int32_t* idx,
                    const float* weights, int top_k, const bf16* act, float* out) {
  pdl_begin();
  const int lane = threadIdx.x % kWarp;
  const int warps_total = gridDim.x * (blockDim.x / kWarp);
  const int n_chunks = I / 8;
  for (int h = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp; h < H; h += warps_total) {
    float total = 0.0f;
    for (int s = 0; s < top_k; ++s) {
      const int local = idx[s] - first_expert;
      if (local < 0 || local >= num_local) continue;
      const bf16* d_row = down + (static_cast<size_t>(local) * H + h) * I;
      const bf16* a = act + static_cast<size_t>(s) * I;
      const float d =
          warp_sum(slice_dot<false>(reinterpret_cast<const uint8_t*>(d_row), a, 0, n_chunks, lane));
      total += weights[s] * round_to_bf16(d);
    }
    if (lane == 0) out[h] = total;
  }
}

/// (row, route) pairs per routed warp of moe_down_slots_kernel: one while a warp per pair and the
/// shared expert's fit the block's 32 warps, else two.
__host__ __device__ constexpr int down_pairs_per_warp(int rows, int top_k, bool shared) {
  return rows * top_k + (shared ? 1 : 0) <= 32 ? 1 : 2;
}
/// Warps per output of moe_down_slots_kernel: the routed warps, plus one for the shared expert's
/// row of every row.
__host__ __device__ constexpr int down_warps(int rows, int top_k, bool shared) {
  const int per = down_pairs_per_warp(rows, top_k, shared);
  return (rows * top_k + per - 1) / per + (shared ? 1 : 0);
}
/// Partial sums per output of moe_down_slots_kernel: one per (row, route), one per row's shared.
__host__ __device__ constexpr int down_entries(int rows, int top_k, bool shared) {
  return rows * top_k + (shared ? rows : 0);
}
constexpr int kDownPartEntries = 256;  // moe_down_slots_kernel's shared partial sums
/// Most threads of a moe_down_slots_kernel block with kP pairs a warp: two pairs (four rows at
/// top_k 8: 17 warps) get the registers their loads in flight need (at 1024 ptxas spilled).
__host__ __device__ constexpr int down_max_threads(int kP) { return kP == 2 ? 576 : 1024; }
/// Threads of a moe_down_slots_kernel block: per_block outputs x down_warps, at least 8 warps.
__host__ __device__ constexpr int down_threads(int rows, int top_k, bool shared) {
  const int warps = down_warps(rows, top_k, shared);
  return (warps >= 8 ? warps : 8 / warps * warps) * kWarp;
}
/// Whether moe_down_slots_kernel takes rows x top_k (+ the shared expert) in one block.
__host__ __device__ constexpr bool down_fits(int rows, int top_k, bool shared) {
  return down_warps(rows, top_k, shared) <= 32 &&
         down_threads(rows, top_k, shared) <= down_max_threads(down_pairs_per_warp(rows, top_k, shared));
}

/// This lane's share of kP dot products, pair j of weight row w[j] with activation row x[j] over
/// 16-byte chunks [0, n_chunks): the loads of every pair issued before the first FMA (8 / kP per
/// pair and lane), each pair's chunks added in ascending order, so a pair's bits are slice_dot's.
/// Pairs with !ok[j] load and add nothing.
template <int kP>
__device__ __forceinline__ void dot_pairs(const bf16* const (&w)[kP], const bf16* const (&x)[kP],
                                          const bool (&ok)[kP], int n_chunks, int lane, float (&acc)[kP]) {
  constexpr int kU = kUnroll / kP;
  walk_chunks<kP, kU>(w, ok, lane, n_chunks, [&](const uint4(&wv)[kP][kU], int u, int cc) {
#pragma unroll
    for (int j = 0; j < kP; ++j)
      if (ok[j]) acc[j] = dot_bf16x8(wv[j][u], load_cached(x[j] + static_cast<size_t>(cc) * 8), acc[j]);
  });
}

/// The down projection and the combine of R rows: a block holds `per_block` outputs x
/// down_warps(R) warps. Routed warp (o, w) computes bf16(W_down,s[h] . act[b][s]) for kP of the
/// (b, s) pairs of output h of the block, the shared warp (o) the shared expert's for every row
/// (its weights loaded once); then one lane per (output, live row) sums that row's slots in slot
/// order and adds the shared expert last with one IEEE add (what accumulate_f32 of its own output
/// did). Every sum is the one-row op's, so a row's bits do not depend on R. The single-row kernel
/// walked the slots one after the other in one warp, a chain of top_k memory round trips per
/// output; here the whole block's rows are in flight at once. Padded rows write nothing.
template <int R, int kP>
__global__ void __launch_bounds__(down_max_threads(kP))
    moe_down_slots_kernel(const bf16* down, const int32_t* slot, int first_expert, int num_local, int H,
                          int I, const int32_t* idx, const float* weights, int top_k, int per_block,
                          const bf16* act, float* out, SharedExpert sh) {
  pdl_begin();
  __shared__ float part[kDownPartEntries];  // per output: R * top_k routed, then R shared sums
  const bool has_shared = sh.inter > 0;
  const int warps = down_warps(R, top_k, has_shared);
  const int routed_warps = warps - (has_shared ? 1 : 0);
  const int entries = down_entries(R, top_k, has_shared);
  const int64_t act_ld = static_cast<int64_t>(top_k) * I + sh.inter;
  bool live[R];
  live_rows<R>(slot, live);
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int w = warp % warps;
  const int o = warp / warps;
  const int h = blockIdx.x * per_block + o;
  if (h < H) {
    if (w < routed_warps) {
      const bf16* rows[kP];
      const bf16* as[kP];
      bool ok[kP];
      float d[kP];
#pragma unroll
      for (int j = 0; j < kP; ++j) {
        const int q = w * kP + j;  // pair (b, s)
        const int b = q / top_k, s = q - b * top_k;
        const int local = q < R * top_k ? idx[q] - first_expert : -1;
        ok[j] = q < R * top_k && live[b] && local >= 0 && local < num_local;
        rows[j] = down + (static_cast<size_t>(ok[j] ? local : 0) * H + h) * I;
        as[j] = act + b * act_ld + static_cast<int64_t>(s) * I;
        d[j] = 0.0f;
      }
      if constexpr (kP == 1) {
        if (ok[0]) d[0] = slice_dot<false>(reinterpret_cast<const uint8_t*>(rows[0]), as[0], 0, I / 8, lane);
      } else {
        dot_pairs<kP>(rows, as, ok, I / 8, lane, d);
      }
#pragma unroll
      for (int j = 0; j < kP; ++j) {
        d[j] = warp_sum(d[j]);
        if (lane == 0 && w * kP + j < R * top_k) part[o * entries + w * kP + j] = d[j];
      }
    } else {
      const bf16* as[R];
#pragma unroll
      for (int b = 0; b < R; ++b) as[b] = act + b * act_ld + static_cast<int64_t>(top_k) * I;
      float d[R];
#pragma unroll
      for (int b = 0; b < R; ++b) d[b] = 0.0f;
      const bf16* d_row = sh.down + static_cast<size_t>(h) * sh.inter;
      if constexpr (R == 1) {
        if (live[0])
          d[0] = slice_dot<false>(reinterpret_cast<const uint8_t*>(d_row), as[0], 0, sh.inter / 8, lane);
      } else {
        dot_rows_one_weight<R>(d_row, as, live, sh.inter / 8, lane, d);
      }
#pragma unroll
      for (int b = 0; b < R; ++b) {
        d[b] = warp_sum(d[b]);
        if (lane == 0) part[o * entries + R * top_k + b] = d[b];
      }
    }
  }
  __syncthreads();
  if (w < R && live[w] && lane == 0 && h < H) {
    const int b = w;
    float total = 0.0f;
    for (int t = 0; t < top_k; ++t) {
      const int local = idx[b * top_k + t] - first_expert;
      if (local < 0 || local >= num_local) continue;
      total += weights[b * top_k + t] * round_to_bf16(part[o * entries + b * top_k + t]);
    }
    if (has_shared) total = __fadd_rn(total, round_to_bf16(part[o * entries + R * top_k + b]));
    out[static_cast<size_t>(b) * H + h] = total;
  }
}

/// moe_experts of R rows (slot nullptr: all live), both launches.
template <int R>
void launch_expert_rows(const LaunchCtx& ctx, const bf16* x, const int32_t* slot, const ExpertWeights& w,
                        const int32_t* idx, const float* weights, int top_k, float limit, bf16* act,
                        float* out, const SharedExpert& sh) {
  const int H = w.hidden;
  const int I = w.inter;
  const int warps_per_block = kMoeThreads / kWarp;
  const int64_t tasks = static_cast<int64_t>(R) * top_k * I + sh.inter;
  const int grid1 = static_cast<int>(std::min<int64_t>((tasks + warps_per_block - 1) / warps_per_block,
                                                       static_cast<int64_t>(ctx.num_sms) * 8));
  launch(ctx, moe_gate_up_kernel<R>, grid1, kMoeThreads, 0, x, slot, w.gate, w.up, w.first_expert,
         w.num_local, H, I, idx, top_k, limit, act, sh);
  MTP_CUDA_LAUNCH_CHECK();
  const bool has_shared = sh.inter > 0;
  const int warps = down_warps(R, top_k, has_shared);
  if (down_fits(R, top_k, has_shared)) {
    // Warps per output: one per (row, slot) or per two of them, and the shared expert's; at least
    // 8 warps a block (e.g. 1 output x 9 slots, 8 x 1).
    const int per_block = std::max(1, warps_per_block / warps);
    MTP_REQUIRE(per_block * down_entries(R, top_k, has_shared) <= kDownPartEntries,
                "ops::cuda::moe_experts: ", R, " rows x ", top_k, " slots exceed the down kernel's partials");
    const int grid2 = (H + per_block - 1) / per_block;
    auto kernel = down_pairs_per_warp(R, top_k, has_shared) == 1 ? moe_down_slots_kernel<R, 1>
                                                                 : moe_down_slots_kernel<R, 2>;
    launch(ctx, kernel, grid2, per_block * warps * kWarp, 0, w.down, slot, w.first_expert, w.num_local, H, I,
           idx, weights, top_k, per_block, act, out, sh);
  } else {
    MTP_REQUIRE(R == 1 && sh.inter == 0, "ops::cuda::moe_experts: ", R, " rows x ", top_k,
                " slots exceed the down kernel's 32 warps");
    const int grid2 = std::min((H + warps_per_block - 1) / warps_per_block, ctx.num_sms * 8);
    launch(ctx, moe_down_kernel, grid2, kMoeThreads, 0, w.down, w.first_expert, w.num_local, H, I, idx,
           weights, top_k, act, out);
  }
  MTP_CUDA_LAUNCH_CHECK();
}

}  // namespace

void moe_route(const LaunchCtx& ctx, const float* logits, const float* bias, int num_experts, int top_k,
               int n_group, int topk_group, float scaling, int32_t* idx, float* weights) {
  MTP_REQUIRE(num_experts >= 1 && top_k >= 1 && top_k <= num_experts && n_group >= 1,
              "ops::cuda::moe_route: num_experts ", num_experts, ", top_k ", top_k, ", n_group ", n_group);
  if (n_group > 1) {
    MTP_REQUIRE(num_experts % n_group == 0 && num_experts / n_group >= 2 && topk_group >= 1 &&
                    topk_group <= n_group && top_k <= topk_group * (num_experts / n_group),
                "ops::cuda::moe_route: bad group limit (num_experts ", num_experts, ", n_group ", n_group,
                ", topk_group ", topk_group, ", top_k ", top_k, ")");
  }
  // The batched router's kernel at one row (slot nullptr: the row is live).
  moe_route_batch(ctx, logits, bias, nullptr, 1, num_experts, top_k, n_group, topk_group, scaling, idx,
                  weights);
}

void moe_experts(const LaunchCtx& ctx, const bf16* x, const ExpertWeights& w, const int32_t* idx,
                 const float* weights, int top_k, float limit, bf16* act, float* out,
                 const ExpertWeights* shared) {
  const int H = w.hidden;
  const int I = w.inter;
  MTP_REQUIRE(H % 8 == 0 && I % 8 == 0, "ops::cuda::moe_experts: hidden ", H, " and inter ", I,
              " must be multiples of 8");
  require_aligned("moe_experts", "x", x);
  SharedExpert sh;
  if (shared) {
    MTP_REQUIRE(shared->hidden == H && shared->inter >= 8 && shared->inter % 8 == 0 && top_k + 1 <= 32 &&
                    shared->gate && shared->up && shared->down,
                "ops::cuda::moe_experts: shared expert (hidden ", shared->hidden, ", inter ", shared->inter,
                ") must match hidden ", H,
                ", have an inter that is a multiple of 8, and at most 31 routed slots");
    sh = SharedExpert{shared->gate, shared->up, shared->down, shared->inter};
  }
  if (top_k == 0 && !shared) {
    MTP_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float) * static_cast<size_t>(H), ctx.stream));
    return;
  }
  launch_expert_rows<1>(ctx, x, nullptr, w, idx, weights, top_k, limit, act, out, sh);
}

// ==== batched rows =====================================================================================

namespace {

// ---- router --------------------------------------------------------------------------------------------

constexpr int kRouteThreads = 1024;

/// Block b: moe_route of row b (see the file comment). Shared memory: keys[E], group keys, s[E],
/// biased[E], the chosen s[top_k], group flags.
__global__ void __launch_bounds__(kRouteThreads)
    moe_route_batch_kernel(const float* logits, const float* bias, const int32_t* slot, int E, int top_k,
                           int n_group, int topk_group, float scaling, int32_t* idx_out, float* weights_out) {
  pdl_begin();
  extern __shared__ unsigned long long route_smem[];
  const int row = blockIdx.x;
  if (slot && slot[row] < 0) return;                     // padded row (slot nullptr: every row is live)
  unsigned long long* keys = route_smem;                 // [E]
  unsigned long long* gkeys = keys + E;                  // [n_group]
  float* s = reinterpret_cast<float*>(gkeys + n_group);  // [E]
  float* biased = s + E;                                 // [E]
  float* chosen_s = biased + E;                          // [top_k]
  uint8_t* group_kept = reinterpret_cast<uint8_t*>(chosen_s + top_k);  // [n_group]
  const float* lg = logits + static_cast<size_t>(row) * E;
  int32_t* idx = idx_out + static_cast<size_t>(row) * top_k;
  float* weights = weights_out + static_cast<size_t>(row) * top_k;
  const int tid = threadIdx.x;
  for (int e = tid; e < E; e += blockDim.x) {
    const float v = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-lg[e])));
    s[e] = v;
    biased[e] = __fadd_rn(v, bias ? bias[e] : 0.0f);
  }
  __syncthreads();
  if (n_group > 1) {
    const int gs = E / n_group;
    for (int g = tid; g < n_group; g += blockDim.x)
      gkeys[g] = argmax_key(group_top2_sum(biased, g * gs, (g + 1) * gs), g);
    __syncthreads();
    for (int g = tid; g < n_group; g += blockDim.x) {
      int rank = 0;
      for (int o = 0; o < n_group; ++o) rank += gkeys[o] > gkeys[g];
      group_kept[g] = rank < topk_group;
    }
    __syncthreads();
    for (int e = tid; e < E; e += blockDim.x)
      if (!group_kept[e / gs]) biased[e] = -INFINITY;
    __syncthreads();
  }
  for (int e = tid; e < E; e += blockDim.x) keys[e] = argmax_key(biased[e], e);
  __syncthreads();
  for (int e = tid; e < E; e += blockDim.x) {
    const unsigned long long mine = keys[e];
    int rank = 0;
#pragma unroll 16
    for (int o = 0; o < E; ++o) rank += keys[o] > mine;
    if (rank < top_k) {
      idx[rank] = e;
      chosen_s[rank] = s[e];
    }
  }
  __syncthreads();
  if (tid == 0) {
    float sum = 0.0f;
    for (int i = 0; i < top_k; ++i) sum = __fadd_rn(sum, chosen_s[i]);
    for (int i = 0; i < top_k; ++i) weights[i] = __fmul_rn(__fdiv_rn(chosen_s[i], sum), scaling);
  }
}

// ---- grouped experts: wide batches ---------------------------------------------------------------------
//
// More rows than kMaxBatchRows (a verification's B x (k + 1)): the plan and d outgrow a block's
// shared memory, and a launch per 128 rows would read every active expert once per launch. So one
// block of kPlanThreads builds the plan once into global memory (gate_up's; down's is the same
// placement with its own item counts), and the two launches read it from there (L2) instead of
// building it, the down blocks keeping d in their own part of global memory. The items, their
// MMAs and the combine are the narrow launches': the same bits.
constexpr int kPlanThreads = 1024;

// The block-item kernels (wide batches, block items, below).
constexpr int kBlockStages = 4;            // chunks a block-item ring holds (three in flight)
constexpr int kBlockNT = 8;                // column tiles of a block item
constexpr int kBlockGroup = 8 * kBlockNT;  // pairs per block item: an expert's weights read once
                                           // for up to 64 of its pairs

/// Block items of active entry `expert` (-1: the shared expert) with cnt pairs for the block-item
/// kernels: gate_up (kMoeWarps 16-row tiles of its inter, group of kBlockGroup pairs), down (group).
__device__ __forceinline__ int block_items_of(const GroupedParams& p, int expert, int cnt, bool gate_up) {
  const int groups = (cnt + kBlockGroup - 1) / kBlockGroup;
  if (!gate_up) return groups;
  const int tiles = (expert < 0 ? p.shared.inter : p.routed.inter) / 16;
  return (tiles + kMoeWarps - 1) / kMoeWarps * groups;
}

__global__ void __launch_bounds__(kPlanThreads)
    moe_plan_wide_kernel(GroupedParams p, PlanLayout layout, int* plan_gu, int* plan_dn, bool block_items) {
  pdl_begin();
  const Plan gu = carve_plan(plan_gu + 1, layout);
  const int n_active = build_plan(p, gu, true);
  if (block_items) {
    // gate_up's items counted as the block-item kernel takes them (the placement is the same).
    count_items(gu, n_active, [&](int expert, int cnt) { return block_items_of(p, expert, cnt, true); });
  }
  const size_t n = layout.ints();
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) plan_dn[1 + i] = plan_gu[1 + i];
  __syncthreads();
  const Plan dn = carve_plan(plan_dn + 1, layout);
  count_items(dn, n_active, [&](int expert, int cnt) {
    return block_items ? block_items_of(p, expert, cnt, false) : entry_items(p, expert, cnt, false);
  });
  if (threadIdx.x == 0) {
    plan_gu[0] = n_active;
    plan_dn[0] = n_active;
  }
}

/// The global scratch of a wide launch: d (BF16), then the two plans (ints).
size_t wide_d_elems(const PlanLayout& l, int H) {
  return static_cast<size_t>(l.pairs + l.rows) * static_cast<size_t>(H);
}
size_t wide_bytes(const PlanLayout& l, int H) {
  return (sizeof(bf16) * wide_d_elems(l, H) + 15) / 16 * 16 + sizeof(int) * 2 * (1 + l.ints());
}

// ---- grouped experts: wide batches, block items ---------------------------------------------------------
//
// Past kMaxBatchRows rows an expert has tens of pairs. The one-warp items read each weight tile
// once per group of 16 pairs, and gather the group's rows again for every tile: every 16-row
// gate_up tile gathers the input rows (inter / 16 times an expert), every 16-column down block the
// activation rows (H / 16 times). The block-item kernels (auto's wide launches) take groups of up
// to kBlockGroup = 64 pairs (one for most experts: their weights stream from memory once) and let
// the 8 warps of a block share one copy of the rows:
// - gate_up: a block item is (active entry, 8 consecutive 16-row tiles of its inter, group of 64
//   pairs); warp w computes tile 8i + w against all the group's rows, the block stages the group's
//   input rows once per 64-column chunk into a ring it shares, each warp its own weight tiles into
//   its own ring (cp.async, the L2 hint of ringpf), one block barrier per chunk.
// - down: block (b, s) owns output columns [128 b, 128 b + 128), a warp 16 of them, and takes the
//   items (active entry, group of 64 pairs) s, s + S, ... of the plan: the group's activation rows
//   staged once for the 8 warps. Each warp writes bf16(d) of its 16 columns into d[route][H] (global).
// - combine: a block per row sums its own routes in idx order, then the shared expert, as
//   combine_rows does.
// Each pair's MMAs are the one-warp items' (the same weight words and rows, chunks in ascending
// order, four k-steps each), so the bits are theirs and the narrow launches'.

/// The rows of a block item each thread copies: rows threadIdx.x / 8 + 32 i, 16 bytes at column
/// 8 (threadIdx.x % 8) of each 64-column chunk.
constexpr int kBlockRowsPerThread = kBlockGroup * 8 / kGroupedThreads;

/// This thread's pieces of a chunk's input rows (its rows' pointers `row`, null: zeros) into an
/// input stage (kBlockGroup rows padded to kMoeXStride); rows past the MMA's n-tiles are not
/// written, columns past K are zeros.
__device__ __forceinline__ void stage_rows_shared(bf16* dst, int col0, int K, int n_tiles,
                                                  const bf16* const (&row)[kBlockRowsPerThread],
                                                  const bf16* any) {
  const int c8 = (threadIdx.x % 8) * 8;
  const int col = col0 + c8;
#pragma unroll
  for (int i = 0; i < kBlockRowsPerThread; ++i) {
    const int r = static_cast<int>(threadIdx.x) / 8 + i * (kGroupedThreads / 8);
    if (r >= 8 * n_tiles) continue;
    const bool ok = row[i] != nullptr && col < K;
    batch::cp_async16(dst + r * kMoeXStride + c8, ok ? row[i] + col : any, ok ? 16 : 0);
  }
}

/// This thread's row pointers for stage_rows_shared: row(r) of the group's n_rows rows, null past them.
template <typename RowPtr>
__device__ __forceinline__ void block_rows(int n_rows, RowPtr&& row,
                                           const bf16* (&out)[kBlockRowsPerThread]) {
#pragma unroll
  for (int i = 0; i < kBlockRowsPerThread; ++i) {
    const int r = static_cast<int>(threadIdx.x) / 8 + i * (kGroupedThreads / 8);
    out[i] = r < n_rows ? row(r) : nullptr;
  }
}

/// One block item's K-long products: this warp's kMats 16-row weight tiles (rows tile[m] + i K,
/// null when the warp has no tile in this item) against the group's n_rows rows (this thread's row
/// `row` for the shared stage), chunk after chunk through a ring of kBlockStages stages: the shared
/// input stages (xring) and this warp's weight stages (wring). Block-wide: every thread calls it
/// with the same item.
template <int kMats>
__device__ __forceinline__ void block_item_gemm(const bf16* const (&tile)[kMats], bool mine, int K,
                                                int n_rows, const bf16* const (&row)[kBlockRowsPerThread],
                                                const bf16* any, bf16* xring, bf16* wring,
                                                float (&acc)[kMats][kBlockNT][4]) {
  constexpr int S = kBlockStages;
  constexpr size_t kX = static_cast<size_t>(kBlockGroup) * kMoeXStride;
  constexpr size_t kW = static_cast<size_t>(16 * kMats) * kMoeXStride;
  const bf16* const no_rows[kPairGroup / 4] = {};
  const int nchunks = (K + kChunkK - 1) / kChunkK;
  const int n_tiles = (n_rows + 7) / 8;
  auto stage = [&](int c, int st) {
    if (mine)
      stage_chunk<kMats, true, true>(wring + static_cast<size_t>(st) * kW, tile, static_cast<size_t>(K),
                                     c * kChunkK, no_rows, 0);
    stage_rows_shared(xring + static_cast<size_t>(st) * kX, c * kChunkK, K, n_tiles, row, any);
  };
#pragma unroll
  for (int m = 0; m < kMats; ++m)
#pragma unroll
    for (int j = 0; j < kBlockNT; ++j) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.0f;
  __syncthreads();  // every warp is done with the stages of the block's previous item
  for (int s = 0; s < S - 1; ++s) {
    if (s < nchunks) stage(s, s);
    batch::cp_async_commit();
  }
  for (int c = 0; c < nchunks; ++c) {
    batch::cp_async_wait<S - 2>();  // this thread's copies of chunk c have landed
    __syncthreads();                // everyone's have, and every warp is done with chunk c - 1's stage
    if (c + S - 1 < nchunks) stage(c + S - 1, (c + S - 1) % S);
    batch::cp_async_commit();
    if (mine) {
      const int st = c % S;
      uint4 w[kMats][4];
      stage_weight_words<kMats>(wring + static_cast<size_t>(st) * kW, w);
      chunk_mma<kMats, kBlockNT>(xring + static_cast<size_t>(st) * kX, w, n_tiles, acc);
    }
  }
}

/// The shared memory of a block-item kernel with kMats weight matrices (BF16 elements).
template <int kMats>
constexpr size_t block_item_elems() {
  return static_cast<size_t>(kBlockStages) * kMoeXStride *
         (kBlockGroup + static_cast<size_t>(kMoeWarps) * 16 * kMats);
}

/// A block-item kernel's rings in its dynamic shared memory (block_item_elems): the block's input
/// ring first, then each warp's ring of kMats weight tiles (this warp's in wring).
template <int kMats>
__device__ __forceinline__ void block_item_rings(uint8_t* smem, bf16*& xring, bf16*& wring) {
  constexpr size_t kW = static_cast<size_t>(kBlockStages) * 16 * kMats * kMoeXStride;
  xring = reinterpret_cast<bf16*>(smem);
  wring = xring + static_cast<size_t>(kBlockStages) * kBlockGroup * kMoeXStride + (threadIdx.x / kWarp) * kW;
}

/// What both block-item kernels start from: their rings in the dynamic shared memory
/// (block_item_rings), this thread's warp and MMA lane coordinates (g, t), and the plan read from
/// global memory with its active entries (0: nothing to do).
struct BlockStart {
  bf16* xring;
  bf16* wring;
  int warp, g, t;
  Plan pl;
  int n_active;
};
template <int kMats>
__device__ __forceinline__ BlockStart start_block_items(const GroupedParams& p, const PlanLayout& layout,
                                                        uint8_t* smem, bool gate_up) {
  BlockStart s;
  block_item_rings<kMats>(smem, s.xring, s.wring);
  s.warp = threadIdx.x / kWarp;
  s.g = (threadIdx.x % kWarp) >> 2;
  s.t = threadIdx.x % 4;
  s.pl = launch_plan<true>(p, layout, nullptr, gate_up, s.n_active);
  return s;
}

__global__ void __launch_bounds__(kGroupedThreads, 1)
    moe_gate_up_block_kernel(GroupedParams p, PlanLayout layout) {
  pdl_begin();
  extern __shared__ __align__(16) uint8_t moe_smem[];
  const auto [xring, wring, warp, g, t, pl, n_active] = start_block_items<2>(p, layout, moe_smem, true);
  if (n_active == 0) return;
  const int total = pl.a_items[n_active];
  for (int w = blockIdx.x; w < total; w += gridDim.x) {
    const int a = find_entry(pl, n_active, w);
    const int expert = pl.a_expert[a];
    const bool shared = expert < 0;
    const int inter = shared ? p.shared.inter : p.routed.inter;
    const int groups = (pl.a_cnt[a] + kBlockGroup - 1) / kBlockGroup;
    const int rem = w - pl.a_items[a];
    const int eighth = rem / groups;
    const int grp = rem - eighth * groups;
    const int tile = eighth * kMoeWarps + warp;
    const bool mine = tile < inter / 16;  // warp-uniform
    const int first = pl.a_off[a] + grp * kBlockGroup;
    const int n_rows = min(kBlockGroup, pl.a_cnt[a] - grp * kBlockGroup);
    const size_t eo = shared ? 0 : static_cast<size_t>(expert) * p.routed.inter * p.H;
    const size_t ro = static_cast<size_t>(mine ? tile : 0) * 16 * p.H;
    const bf16* const tiles[2] = {(shared ? p.shared.gate : p.routed.gate + eo) + ro,
                                  (shared ? p.shared.up : p.routed.up + eo) + ro};
    const bf16* rows[kBlockRowsPerThread];
    block_rows(
        n_rows, [&](int r) { return p.x + static_cast<size_t>(pl.pr_row[first + r]) * p.H; }, rows);
    float acc[2][kBlockNT][4];
    block_item_gemm<2>(tiles, mine, p.H, n_rows, rows, p.x, xring, wring, acc);
    if (!mine) continue;
    for_live_acc<kBlockNT>(t, n_rows, [&](int j, int e, int q) {
      const int i = tile * 16 + g + (e >= 2 ? 8 : 0);
      p.act[static_cast<size_t>(pl.pr_route[first + q]) * p.act_ld + i] =
          swiglu_act(acc[0][j][e], acc[1][j][e], p.limit);
    });
  }
}

/// Block (hb, s) = blockIdx.x (hb fastest, `hblocks` of them): output columns [128 hb, + 128) of
/// the items s, s + gridDim.x / hblocks, ... (see above).
__global__ void __launch_bounds__(kGroupedThreads, 2)
    moe_down_block_kernel(GroupedParams p, PlanLayout layout, int hblocks) {
  pdl_begin();
  extern __shared__ __align__(16) uint8_t moe_smem[];
  const auto [xring, wring, warp, g, t, pl, n_active] = start_block_items<1>(p, layout, moe_smem, false);
  if (n_active == 0) return;
  const int total = pl.a_items[n_active];
  const int hb = static_cast<int>(blockIdx.x) % hblocks;
  const int slices = static_cast<int>(gridDim.x) / hblocks;
  const int h0 = (hb * kMoeWarps + warp) * kDownCols;
  const bool mine = h0 < p.H;  // warp-uniform
  for (int w = static_cast<int>(blockIdx.x) / hblocks; w < total; w += slices) {
    const int a = find_entry(pl, n_active, w);
    const int expert = pl.a_expert[a];
    const bool shared = expert < 0;
    const int K = shared ? p.shared.inter : p.routed.inter;
    const int grp = w - pl.a_items[a];
    const int first = pl.a_off[a] + grp * kBlockGroup;
    const int n_rows = min(kBlockGroup, pl.a_cnt[a] - grp * kBlockGroup);
    const bf16* const tiles[1] = {
        (shared ? p.shared.down : p.routed.down + static_cast<size_t>(expert) * p.H * p.routed.inter) +
        static_cast<size_t>(mine ? h0 : 0) * K};
    const bf16* rows[kBlockRowsPerThread];
    block_rows(
        n_rows, [&](int r) { return p.act + static_cast<size_t>(pl.pr_route[first + r]) * p.act_ld; }, rows);
    float acc[1][kBlockNT][4];
    block_item_gemm<1>(tiles, mine, K, n_rows, rows, p.act, xring, wring, acc);
    if (!mine) continue;
    for_live_acc<kBlockNT>(t, n_rows, [&](int j, int e, int q) {
      const int hh = g + (e >= 2 ? 8 : 0);
      p.d[static_cast<size_t>(pl.pr_route[first + q]) * p.H + h0 + hh] = f_to_bf16(acc[0][j][e]);
    });
  }
}

/// Block b: out[b] of a live row from d[route][H], its routes in idx order, then the shared expert
/// (combine_rows' sums); padded rows: nothing written.
__global__ void __launch_bounds__(kGroupedThreads) moe_combine_block_kernel(GroupedParams p) {
  pdl_begin();
  const int b = blockIdx.x;
  if (p.routes.slot[b] < 0) return;
  const int P_ = p.routes.rows * p.routes.top_k;
  for (int h = threadIdx.x; h < p.H; h += blockDim.x) {
    float o = 0.0f;
    for (int i = 0; i < p.routes.top_k; ++i) {
      const int q = b * p.routes.top_k + i;
      const int e = p.routes.idx[q] - p.first_expert;
      if (e < 0 || e >= p.num_local) continue;
      o = __fadd_rn(o, __fmul_rn(p.routes.weights[q], bf16_to_f(p.d[static_cast<size_t>(q) * p.H + h])));
    }
    if (p.shared.inter > 0) {
      const float sh =
          __fadd_rn(0.0f, __fmul_rn(1.0f, bf16_to_f(p.d[static_cast<size_t>(P_ + b) * p.H + h])));
      o = __fadd_rn(o, sh);
    }
    p.out[static_cast<size_t>(b) * p.H + h] = o;
  }
}

/// The block-item kernels' four launches (wide batches, block items): the plan (gate_up's items
/// counted per block), gate_up over every resident block, down on (H / 128) x S blocks, the combine.
void launch_block_items(const LaunchCtx& ctx, GroupedParams p, const PlanLayout& layout, int64_t items_max,
                        int64_t down_items_max, void* wide) {
  launch_wide_plan(ctx, p, layout, wide, true);
  const size_t smem1 = sizeof(bf16) * block_item_elems<2>();
  const size_t smem2 = sizeof(bf16) * block_item_elems<1>();
  require_grouped_smem(p, smem1, smem2);
  opt_in_smem<moe_gate_up_block_kernel>(smem1);
  opt_in_smem<moe_down_block_kernel>(smem2);
  if (items_max > 0) {
    const int64_t grid1 = std::min<int64_t>(
        items_max, static_cast<int64_t>(blocks_per_sm<moe_gate_up_block_kernel>(smem1)) * ctx.num_sms);
    launch(ctx, moe_gate_up_block_kernel, static_cast<unsigned>(std::max<int64_t>(1, grid1)), kGroupedThreads,
           smem1, p, layout);
    MTP_CUDA_LAUNCH_CHECK();
  }
  const int hblocks = (p.H / kDownCols + kMoeWarps - 1) / kMoeWarps;
  const int64_t resident = static_cast<int64_t>(blocks_per_sm<moe_down_block_kernel>(smem2)) * ctx.num_sms;
  const int64_t slices =
      std::max<int64_t>(1, std::min<int64_t>(down_items_max, (resident + hblocks - 1) / hblocks));
  launch(ctx, moe_down_block_kernel, static_cast<unsigned>(slices * hblocks), kGroupedThreads, smem2, p,
         layout, hblocks);
  MTP_CUDA_LAUNCH_CHECK();
  launch(ctx, moe_combine_block_kernel, p.routes.rows, kGroupedThreads, 0, p);
  MTP_CUDA_LAUNCH_CHECK();
}

}  // namespace

// ---- grouped experts: the host side (moe_grouped.cuh)
// ------------------------------------------------------

namespace grouped {

void launch_wide_plan(const LaunchCtx& ctx, GroupedParams& p, const PlanLayout& layout, void* wide,
                      bool block_items) {
  p.d = static_cast<bf16*>(wide);
  int* plans = reinterpret_cast<int*>(static_cast<uint8_t*>(wide) +
                                      (sizeof(bf16) * wide_d_elems(layout, p.H) + 15) / 16 * 16);
  p.plan_gu = plans;
  p.plan_dn = plans + 1 + layout.ints();
  launch(ctx, moe_plan_wide_kernel, 1, kPlanThreads, 0, p, layout, plans, plans + 1 + layout.ints(),
         block_items);
  MTP_CUDA_LAUNCH_CHECK();
}

GroupedLaunch grouped_launch(const bf16* x, const ExpertWeights& routed, const int32_t* idx,
                             const float* weights, const int32_t* slot, int rows, int top_k,
                             const ExpertWeights* shared, float limit, bf16* act, float* out, void* wide) {
  const int H = routed.hidden, I = routed.inter;
  const int Is = shared ? shared->inter : 0;
  MTP_REQUIRE(rows >= 1 && rows <= kMaxMoeLaunchRows && top_k >= 0 && top_k <= 32,
              "ops::cuda::moe_experts_grouped: rows ", rows, " (1 .. ", kMaxMoeLaunchRows,
              " per launch), top_k ", top_k, " (at most 32)");
  const bool is_wide = rows > kMaxBatchRows;
  MTP_REQUIRE(!is_wide || (wide && reinterpret_cast<uintptr_t>(wide) % 16 == 0),
              "ops::cuda::moe_experts_grouped: ", rows,
              " rows need the wide scratch (moe_grouped_wide_bytes), ", "16-byte aligned");
  MTP_REQUIRE(H % 16 == 0 && I % 16 == 0 && Is % 16 == 0, "ops::cuda::moe_experts_grouped: hidden ", H,
              ", inter ", I, " and shared inter ", Is, " must be multiples of 16");
  MTP_REQUIRE(routed.num_local >= 0 && routed.num_local <= kMaxLocalExperts,
              "ops::cuda::moe_experts_grouped: ", routed.num_local, " local experts (at most ",
              kMaxLocalExperts, ")");
  for (const void* ptr : {static_cast<const void*>(x), static_cast<const void*>(routed.gate),
                          static_cast<const void*>(routed.up), static_cast<const void*>(routed.down),
                          static_cast<const void*>(act)}) {
    MTP_REQUIRE(
        reinterpret_cast<uintptr_t>(ptr) % 16 == 0,
        "ops::cuda::moe_experts_grouped: x, the expert weights and the scratch must be 16-byte aligned");
  }
  GroupedLaunch g;
  const int pairs = rows * top_k;
  g.layout = PlanLayout{routed.num_local, pairs, rows, std::min(routed.num_local, pairs) + 1};
  g.plan_bytes = sizeof(int) * g.layout.ints();
  g.d_bytes = sizeof(bf16) * (static_cast<size_t>(pairs) + rows) * kDownCols;
  GroupedParams& p = g.p;
  p.x = x;
  p.routed = ExpertMats{routed.gate, routed.up, routed.down, I};
  p.first_expert = routed.first_expert;
  p.num_local = routed.num_local;
  p.H = H;
  if (shared) p.shared = ExpertMats{shared->gate, shared->up, shared->down, Is};
  p.routes = RoutePairs{idx, weights, slot, rows, top_k};
  p.limit = limit;
  p.act = act;
  p.act_ld = std::max(I, Is);
  p.out = out;
  // Launch 1: enough warps for the most items this batch can have, at most what is resident.
  const int64_t active_max = std::min(routed.num_local, pairs);
  const int64_t groups_max = active_max + pairs / kPairGroup;
  const int64_t shared_items =
      Is > 0 ? static_cast<int64_t>(Is / 16) * ((rows + kPairGroup - 1) / kPairGroup) : 0;
  g.items_max = static_cast<int64_t>(I / 16) * groups_max + shared_items;
  // The block-item kernels: gate_up's items are 8 tiles of one group of 64 pairs, down's a group.
  const int64_t block_groups = active_max + pairs / kBlockGroup;
  const int64_t shared_groups = Is > 0 ? (rows + kBlockGroup - 1) / kBlockGroup : 0;
  const int64_t eighths = (I / 16 + kMoeWarps - 1) / kMoeWarps;
  const int64_t shared_eighths = (Is / 16 + kMoeWarps - 1) / kMoeWarps;
  g.block_items_max = eighths * block_groups + shared_eighths * shared_groups;
  g.down_items_max = block_groups + shared_groups;
  return g;
}

}  // namespace grouped

void moe_route_batch(const LaunchCtx& ctx, const float* logits, const float* bias, const int32_t* slot,
                     int rows, int num_experts, int top_k, int n_group, int topk_group, float scaling,
                     int32_t* idx, float* weights) {
  const size_t smem = sizeof(unsigned long long) * (static_cast<size_t>(num_experts) + n_group) +
                      sizeof(float) * (2 * static_cast<size_t>(num_experts) + top_k) + n_group;
  MTP_REQUIRE(smem <= 48 * 1024, "ops::cuda::moe_route_batch: ", num_experts,
              " experts exceed the router's shared memory");
  const int threads = std::min(kRouteThreads, std::max(kWarp, (num_experts + kWarp - 1) / kWarp * kWarp));
  launch(ctx, moe_route_batch_kernel, rows, threads, smem, logits, bias, slot, num_experts, top_k, n_group,
         topk_group, scaling, idx, weights);
  MTP_CUDA_LAUNCH_CHECK();
}

bool moe_slots_fit(int rows, int top_k, bool shared) {
  return rows >= 1 && rows <= kMaxRowsSlotsMoe && top_k >= 1 && down_fits(rows, top_k, shared);
}

size_t moe_grouped_act_elems(int rows, int top_k, int inter, int shared_inter) {
  return static_cast<size_t>(rows) * (top_k + 1) * static_cast<size_t>(std::max(inter, shared_inter));
}

size_t moe_grouped_wide_bytes(int rows, int top_k, int num_local, int hidden) {
  if (rows <= kMaxBatchRows) return 0;
  const int pairs = rows * top_k;
  return wide_bytes(PlanLayout{num_local, pairs, rows, std::min(num_local, pairs) + 1}, hidden);
}

void moe_experts_grouped(const LaunchCtx& ctx, const bf16* x, const ExpertWeights& routed, const int32_t* idx,
                         const float* weights, const int32_t* slot, int rows, int top_k,
                         const ExpertWeights* shared, float limit, bf16* act, float* out, void* wide) {
  const GroupedLaunch g =
      grouped_launch(x, routed, idx, weights, slot, rows, top_k, shared, limit, act, out, wide);
  // Whether ringpf's rings fit beside the plan and d in a narrow launch's shared memory: what the
  // rule (dispatch.cu's moe_grouped_plan) asks of the shape.
  const size_t ring_smem =
      std::max(sizeof(bf16) * PipeRingPfGateUp::template ring_elems<2>() + g.plan_bytes,
               sizeof(bf16) * PipeRingPfDown::template ring_elems<1>() + g.d_bytes + g.plan_bytes);
  const MoePlan plan = moe_grouped_plan(ctx.policy, rows, moe_slots_fit(rows, top_k, shared != nullptr),
                                        ring_smem <= 220 * 1024);
  record_kernel(ctx, "moe_experts_grouped", kernel_text(plan));
  switch (plan.kernel) {
    case MoeKernel::slots: {
      // The single-row kernels for every (row, route): each row's bytes are the one-row op's.
      SharedExpert sh;
      if (shared) sh = SharedExpert{shared->gate, shared->up, shared->down, shared->inter};
      static_assert(kMaxRowsSlotsMoe == 4, "the dispatch below covers 1 .. kMaxRowsSlotsMoe rows");
      if (rows == 1)
        return launch_expert_rows<1>(ctx, x, slot, routed, idx, weights, top_k, limit, act, out, sh);
      if (rows == 2)
        return launch_expert_rows<2>(ctx, x, slot, routed, idx, weights, top_k, limit, act, out, sh);
      if (rows == 3)
        return launch_expert_rows<3>(ctx, x, slot, routed, idx, weights, top_k, limit, act, out, sh);
      return launch_expert_rows<4>(ctx, x, slot, routed, idx, weights, top_k, limit, act, out, sh);
    }
    case MoeKernel::block_items:
      return launch_block_items(ctx, g.p, g.layout, g.block_items_max, g.down_items_max, wide);
    case MoeKernel::v1:
      return plan.wide
                 ? launch_grouped<PipeV1, PipeV1, true>(ctx, g.p, g.layout, g.items_max, 0, 0, wide)
                 : launch_grouped<PipeV1, PipeV1>(ctx, g.p, g.layout, g.items_max, g.plan_bytes, g.d_bytes);
    case MoeKernel::ringpf:
      return plan.wide ? launch_grouped<PipeRingPfGateUp, PipeRingPfDown, true>(ctx, g.p, g.layout,
                                                                                g.items_max, 0, 0, wide)
                       : launch_grouped<PipeRingPfGateUp, PipeRingPfDown>(ctx, g.p, g.layout, g.items_max,
                                                                          g.plan_bytes, g.d_bytes);
  }
  MTP_FAIL("ops::cuda::moe_experts_grouped: kernel ", static_cast<int>(plan.kernel), " has no launch");
}

}  // namespace mtplab::ops::cuda
