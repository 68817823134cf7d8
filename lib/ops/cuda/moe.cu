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
#include "ops/group_score.hpp"

namespace mtplab::ops::cuda {

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
  for (int c = lane; c < n_chunks; c += kWarp * kU) {
    uint4 wv[kP][kU];
#pragma unroll
    for (int j = 0; j < kP; ++j) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int cc = c + u * kWarp;
        wv[j][u] =
            ok[j] && cc < n_chunks ? load_stream(w[j] + static_cast<size_t>(cc) * 8) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int cc = c + u * kWarp;
      if (cc < n_chunks) {
#pragma unroll
        for (int j = 0; j < kP; ++j)
          if (ok[j]) acc[j] = dot_bf16x8(wv[j][u], load_cached(x[j] + static_cast<size_t>(cc) * 8), acc[j]);
      }
    }
  }
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

using batch::kChunkK;

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

/// Builds the plan (see the file comment); every thread of the block must call it. Returns the
/// number of active entries (block-uniform).
__device__ int build_plan(const GroupedParams& p, const Plan& pl, bool gate_up) {
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
  const unsigned long long items = segment_scan(
      n_active,
      [&](int a) {
        return static_cast<unsigned long long>(entry_items(p, pl.a_expert[a], pl.a_cnt[a], gate_up));
      },
      [&](int a, unsigned long long before, unsigned long long) {
        pl.a_items[a] = static_cast<int>(before);
      });
  if (threadIdx.x == 0) pl.a_items[n_active] = static_cast<int>(items);
  __syncthreads();
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
// KernelPolicy::moe_pipeline picks how a warp brings its chunks in; the variants differ in where a
// weight chunk waits between its load and its MMA, and in which warp takes which gate_up item,
// never in what the MMAs compute: each of them hands the tensor cores the same A and B words of
// the same chunks in ascending chunk order, each item's pairs in the same columns, so they give
// v1's bits (split, below, is the exception: it cuts an item's reduction into eight parts). Which warp
// computes an item changes nothing either: an item's numbers depend on its weights and its own group's rows
// only.
// - v1: the weights one 64-column chunk ahead in registers (two buffers), the input rows through a
//   3-stage per-warp cp.async ring; gate_up's items go to the blocks in runs of 8 (block b: items
//   8b .. 8b + 7, then the next grid's worth), a grid of at most two blocks a multiprocessor.
// - spread: v1's chunk pipeline, gate_up's items dealt round-robin over a grid of every resident
//   block (item w to block w % grid): at B = 1, 1152 items over 264 blocks are 8 or 9 per
//   multiprocessor, where runs of 8 over 144 blocks put 16 on 12 of them.
// - regs: spread, and the down kernel's weights three chunks ahead in four register buffers (128
//   registers at __launch_bounds__(256, 2); gate_up with three buffers would spill, so it is spread's).
// - ring: the weight tile and the input rows of a chunk through one per-warp cp.async ring in
//   shared memory (gate_up 3 stages, down 4: two or three chunks ahead, no register cost, one block
//   a multiprocessor); the A fragments are read back from the ring, whose rows are padded to 144
//   bytes so that the 16-byte reads of a quarter-warp fall in distinct banks. gate_up dealt as
//   spread.

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
using PipeSpread = Pipe<kMoeStages, kMoeWBuf, false, true, 2>;
using PipeRegsDown = Pipe<kMoeStages, 4, false, true, 2>;
using PipeRingGateUp = Pipe<3, 1, true, true, 1>;
using PipeRingDown = Pipe<4, 1, true, true, 1>;
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
    const unsigned long long gi = segment_scan(
        n_active,
        [&](int a) {
          return static_cast<unsigned long long>(block_items_of(p, gu.a_expert[a], gu.a_cnt[a], true));
        },
        [&](int a, unsigned long long before, unsigned long long) {
          gu.a_items[a] = static_cast<int>(before);
        });
    if (threadIdx.x == 0) gu.a_items[n_active] = static_cast<int>(gi);
    __syncthreads();
  }
  const size_t n = layout.ints();
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) plan_dn[1 + i] = plan_gu[1 + i];
  __syncthreads();
  const Plan dn = carve_plan(plan_dn + 1, layout);
  const unsigned long long items = segment_scan(
      n_active,
      [&](int a) {
        return static_cast<unsigned long long>(block_items
                                                   ? block_items_of(p, dn.a_expert[a], dn.a_cnt[a], false)
                                                   : entry_items(p, dn.a_expert[a], dn.a_cnt[a], false));
      },
      [&](int a, unsigned long long before, unsigned long long) {
        dn.a_items[a] = static_cast<int>(before);
      });
  if (threadIdx.x == 0) {
    dn.a_items[n_active] = static_cast<int>(items);
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

__global__ void __launch_bounds__(kGroupedThreads, 1)
    moe_gate_up_block_kernel(GroupedParams p, PlanLayout layout) {
  pdl_begin();
  extern __shared__ __align__(16) uint8_t moe_smem[];
  bf16 *xring, *wring;
  block_item_rings<2>(moe_smem, xring, wring);
  const int warp = threadIdx.x / kWarp;
  const int g = (threadIdx.x % kWarp) >> 2, t = threadIdx.x % 4;
  int n_active;
  const Plan pl = launch_plan<true>(p, layout, nullptr, true, n_active);
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
  bf16 *xring, *wring;
  block_item_rings<1>(moe_smem, xring, wring);
  const int warp = threadIdx.x / kWarp;
  const int g = (threadIdx.x % kWarp) >> 2, t = threadIdx.x % 4;
  int n_active;
  const Plan pl = launch_plan<true>(p, layout, nullptr, false, n_active);
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

// ---- grouped experts: the split pipeline ----------------------------------------------------------------
//
// moe_pipeline split: every warp of a block works on the same item at once, each on its own fixed
// eighth of the item's reduction (warp w: chunks [w n / 8, (w + 1) n / 8) of the item's n chunks of 64
// columns), streaming its chunks of the block's items one after another through its own cp.async
// ring (the ring pipeline's stages: weight tile and input rows, 144-byte rows), so the ring never
// drains between items. At an item's end each warp writes its partial sums to shared memory (two
// buffers, one block barrier an item), and thread (k, lane) adds the 8 warps' partials of MMA
// element k of lane `lane` in warp order, then applies the item's epilogue (gate_up: the
// activation into act; down: bf16(d) into d_s). The blocks take whole items (gate_up: item w to
// block w % grid; down: every item of its 16 columns), so the work a multiprocessor gets differs by
// at most one item, where one warp per item left a block's last round to one or two warps.
// Bits: the reduction of an item is cut at fixed chunks (they depend on K alone, not on B, the
// other rows or the grid), so a row's numbers do not depend on the batch; they are not the other
// pipelines' (those sum all chunks in one accumulator), and stay within the CPU's tolerances.

using PipeSplitGateUp = PipeRingGateUp;  // the ring's stage layout and depth
using PipeSplitDown = PipeRingDown;
static_assert(kMoeNT * 4 == kMoeWarps,
              "the partials' reduction gives one MMA element of a lane to each warp");

/// The floats of the split pipeline's partial sums: two buffers x warps x (kMats x kMoeNT x 4) x lanes.
template <int kMats>
constexpr size_t split_part_floats() {
  return static_cast<size_t>(2) * kMoeWarps * kMats * kMoeNT * 4 * kWarp;
}

/// This warp's chunks [c0, c1) of an item whose rows are K long.
__device__ __forceinline__ void split_segment(int K, int warp, int& c0, int& c1) {
  const int n = (K + kChunkK - 1) / kChunkK;
  c0 = warp * n / kMoeWarps;
  c1 = (warp + 1) * n / kMoeWarps;
}

/// The block's items it0, it0 + stride, ... < total (block-uniform), every warp its segment of
/// each (see above); item_at(w) gives item w's operands, xrow(it, r) its input row r, and
/// epilogue(it, sum) is called by every thread after an item with sum(m) = the item's element of
/// this thread (MMA element k = threadIdx.x / 32 of lane threadIdx.x % 32) in matrix m, the warps'
/// partials added in warp order.
template <typename P, int kMats, typename ItemAt, typename RowPtr, typename Epilogue>
__device__ __forceinline__ void split_stream(int it0, int stride, int total, ItemAt&& item_at, RowPtr&& xrow,
                                             bf16* ring, float* part, Epilogue&& epilogue) {
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  constexpr int kStages = P::kStages;
  constexpr int kWRows = 16 * kMats;
  constexpr size_t kStageElems = P::template stage_elems<kMats>();
  constexpr int kStageRows = kPairGroup / 4;
  constexpr int kPer = kMats * kMoeNT * 4 * kWarp;  // one warp's partials
  // The stager: the next chunk of this warp's stream to copy (kStages - 1 ahead of the MMAs).
  int s_idx = it0, s_c = 0, s_c1 = 0, s_tiles = 0;
  ItemOperands s_it{};
  const bf16* src_row[kStageRows];
  auto s_load = [&]() {
    s_it = item_at(s_idx);
    split_segment(s_it.K, warp, s_c, s_c1);
    s_tiles = (s_it.n_rows + 7) / 8;
#pragma unroll
    for (int i = 0; i < kStageRows; ++i) {
      const int r = lane / 8 + 4 * i;
      src_row[i] = r < s_it.n_rows ? xrow(s_it, r) : nullptr;
    }
  };
  if (s_idx < total) s_load();
  auto stage_next = [&](int st) {
    while (s_idx < total && s_c >= s_c1) {
      s_idx += stride;
      if (s_idx < total) s_load();
    }
    if (s_idx >= total) return;  // past the stream: the caller commits an empty group
    stage_chunk<kMats, true>(ring + static_cast<size_t>(st) * kStageElems, s_it.w,
                             static_cast<size_t>(s_it.K), s_c * kChunkK, src_row, s_tiles);
    ++s_c;
  };
  for (int s = 0; s < kStages - 1; ++s) {
    stage_next(s);
    batch::cp_async_commit();
  }
  int j = 0;    // this warp's stream position: the chunk the MMAs take next
  int buf = 0;  // the partials' buffer of the current item
  for (int idx = it0; idx < total; idx += stride) {
    const ItemOperands it = item_at(idx);
    int c0, c1;
    split_segment(it.K, warp, c0, c1);
    const int n_tiles = (it.n_rows + 7) / 8;
    float acc[kMats][kMoeNT][4];
#pragma unroll
    for (int m = 0; m < kMats; ++m)
#pragma unroll
      for (int q = 0; q < kMoeNT; ++q) acc[m][q][0] = acc[m][q][1] = acc[m][q][2] = acc[m][q][3] = 0.0f;
    for (int c = c0; c < c1; ++c, ++j) {
      stage_next((j + kStages - 1) % kStages);
      batch::cp_async_commit();
      batch::cp_async_wait<kStages - 1>();
      __syncwarp();  // every lane's copies of this chunk are visible to the warp
      const bf16* st = ring + static_cast<size_t>(j % kStages) * kStageElems;
      uint4 w[kMats][4];
      stage_weight_words<kMats>(st, w);
      chunk_mma<kMats>(st + kWRows * kMoeXStride, w, n_tiles, acc);
      __syncwarp();  // the stage is refilled by a later iteration's copies
    }
    float* mine = part + static_cast<size_t>(buf * kMoeWarps + warp) * kPer;
#pragma unroll
    for (int m = 0; m < kMats; ++m)
#pragma unroll
      for (int q = 0; q < kMoeNT; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[((m * kMoeNT + q) * 4 + e) * kWarp + lane] = acc[m][q][e];
    // Every warp's partials of this item are written; the other buffer's readers (the previous
    // item's epilogue) are done before any warp writes it again, one barrier later.
    __syncthreads();
    const float* pb = part + static_cast<size_t>(buf) * kMoeWarps * kPer;
    const int k = warp;  // this thread's MMA element: n-tile k / 4, element k % 4
    epilogue(it, [&](int m) {
      const float* v = pb + static_cast<size_t>((m * kMoeNT * 4 + k) * kWarp + lane);
      float s = v[0];
#pragma unroll
      for (int w2 = 1; w2 < kMoeWarps; ++w2) s = __fadd_rn(s, v[static_cast<size_t>(w2) * kPer]);
      return s;
    });
    buf ^= 1;
  }
}

/// The pair column q and the tile row i (0 .. 15) of this thread's MMA element in split_stream's
/// epilogue (n-tile k / 4, element k % 4 of lane (g, t); k = threadIdx.x / 32).
__device__ __forceinline__ void split_element(int& q, int& i) {
  const int k = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int g = lane >> 2, t = lane & 3;
  const int jj = k >> 2, e = k & 3;
  q = 8 * jj + 2 * t + (e & 1);
  i = g + (e >= 2 ? 8 : 0);
}

/// Launch 1 of the split pipeline: act for the block's gate_up items (w % gridDim.x == blockIdx.x).
__global__ void __launch_bounds__(kGroupedThreads, 1)
    moe_gate_up_split_kernel(GroupedParams p, PlanLayout layout) {
  using P = PipeSplitGateUp;
  pdl_begin();
  extern __shared__ __align__(16) uint8_t moe_smem[];
  bf16* rings = reinterpret_cast<bf16*>(moe_smem);
  float* part = reinterpret_cast<float*>(rings + P::template ring_elems<2>());
  const Plan pl = carve_plan(reinterpret_cast<int*>(part + split_part_floats<2>()), layout);
  const int n_active = build_plan(p, pl, true);
  if (n_active == 0) return;
  const int warp = threadIdx.x / kWarp;
  bf16* ring = rings + warp * P::kStages * P::template stage_elems<2>();
  split_stream<P, 2>(
      blockIdx.x, gridDim.x, pl.a_items[n_active], [&](int w) { return gate_up_item(p, pl, n_active, w); },
      [&](const ItemOperands& it, int r) { return p.x + static_cast<size_t>(pl.pr_row[it.first + r]) * p.H; },
      ring, part,
      [&](const ItemOperands& it, auto&& sum) {
        int q, i;
        split_element(q, i);
        if (q >= it.n_rows) return;
        const float gs = sum(0), us = sum(1);
        p.act[static_cast<size_t>(pl.pr_route[it.first + q]) * p.act_ld + it.tile * 16 + i] =
            swiglu_act(gs, us, p.limit);
      });
}

/// Launch 2 of the split pipeline: block = output columns [16 * blockIdx.x, + 16) of every live row.
__global__ void __launch_bounds__(kGroupedThreads, 1)
    moe_down_split_kernel(GroupedParams p, PlanLayout layout) {
  using P = PipeSplitDown;
  pdl_begin();
  extern __shared__ __align__(16) uint8_t moe_smem[];
  bf16* rings = reinterpret_cast<bf16*>(moe_smem);
  float* part = reinterpret_cast<float*>(rings + P::template ring_elems<1>());
  bf16* d_s = reinterpret_cast<bf16*>(part + split_part_floats<1>());
  const int routes = p.routes.rows * p.routes.top_k + p.routes.rows;
  const Plan pl = carve_plan(reinterpret_cast<int*>(d_s + static_cast<size_t>(routes) * kDownCols), layout);
  const int n_active = build_plan(p, pl, false);
  const int warp = threadIdx.x / kWarp;
  const int h0 = blockIdx.x * kDownCols;
  bf16* ring = rings + warp * P::kStages * P::template stage_elems<1>();
  const int total = n_active > 0 ? pl.a_items[n_active] : 0;
  split_stream<P, 1>(
      0, 1, total, [&](int w) { return down_item(p, pl, n_active, w, h0); },
      [&](const ItemOperands& it, int r) {
        return p.act + static_cast<size_t>(pl.pr_route[it.first + r]) * p.act_ld;
      },
      ring, part,
      [&](const ItemOperands& it, auto&& sum) {
        int q, i;
        split_element(q, i);
        if (q >= it.n_rows) return;
        d_s[static_cast<size_t>(pl.pr_route[it.first + q]) * kDownCols + i] = f_to_bf16(sum(0));
      });
  __syncthreads();
  combine_rows(p, pl, d_s, h0);
}

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
void require_grouped_smem(const LaunchCtx& ctx, const GroupedParams& p, size_t smem1, size_t smem2) {
  MTP_REQUIRE(std::max(smem1, smem2) <= 220 * 1024, "ops::cuda::moe_experts_grouped: ", p.routes.rows,
              " rows x ", p.routes.top_k, " routes and ", p.num_local, " local experts need ",
              std::max(smem1, smem2), " bytes of shared memory under moe_pipeline ",
              to_string(ctx.policy.moe_pipeline), " (at most 225280; v1 needs the least)");
}

/// The two launches under the pipelines GU (gate_up) and DN (down); kWide: after the plan's launch,
/// with the plan and d in `wide` (global memory, wide_bytes) instead of shared memory.
template <typename GU, typename DN, bool kWide = false>
void launch_grouped(const LaunchCtx& ctx, GroupedParams p, const PlanLayout& layout, int64_t items_max,
                    size_t plan_bytes, size_t d_bytes, void* wide = nullptr) {
  if constexpr (kWide) {
    plan_bytes = 0;
    d_bytes = 0;
    p.d = static_cast<bf16*>(wide);
    int* plans = reinterpret_cast<int*>(static_cast<uint8_t*>(wide) +
                                        (sizeof(bf16) * wide_d_elems(layout, p.H) + 15) / 16 * 16);
    p.plan_gu = plans;
    p.plan_dn = plans + 1 + layout.ints();
    launch(ctx, moe_plan_wide_kernel, 1, kPlanThreads, 0, p, layout, plans, plans + 1 + layout.ints(), false);
    MTP_CUDA_LAUNCH_CHECK();
  }
  const size_t smem1 = sizeof(bf16) * GU::template ring_elems<2>() + plan_bytes;
  const size_t smem2 = sizeof(bf16) * DN::template ring_elems<1>() + d_bytes + plan_bytes;
  require_grouped_smem(ctx, p, smem1, smem2);
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

/// The shared memory of the split pipeline's two launches (see "the split pipeline").
void split_smem(size_t plan_bytes, size_t d_bytes, size_t& smem1, size_t& smem2) {
  smem1 =
      sizeof(bf16) * PipeSplitGateUp::ring_elems<2>() + sizeof(float) * split_part_floats<2>() + plan_bytes;
  smem2 = sizeof(bf16) * PipeSplitDown::ring_elems<1>() + sizeof(float) * split_part_floats<1>() + d_bytes +
          plan_bytes;
}

/// The two launches of the split pipeline: gate_up over every resident block (each whole items
/// w % grid), down a block per 16 output columns.
void launch_split(const LaunchCtx& ctx, const GroupedParams& p, const PlanLayout& layout, int64_t items_max,
                  size_t plan_bytes, size_t d_bytes) {
  size_t smem1, smem2;
  split_smem(plan_bytes, d_bytes, smem1, smem2);
  require_grouped_smem(ctx, p, smem1, smem2);
  opt_in_smem<moe_gate_up_split_kernel>(smem1);
  opt_in_smem<moe_down_split_kernel>(smem2);
  if (items_max > 0) {
    const int64_t grid1 = std::min<int64_t>(
        items_max, static_cast<int64_t>(blocks_per_sm<moe_gate_up_split_kernel>(smem1)) * ctx.num_sms);
    launch(ctx, moe_gate_up_split_kernel, static_cast<unsigned>(std::max<int64_t>(1, grid1)), kGroupedThreads,
           smem1, p, layout);
    MTP_CUDA_LAUNCH_CHECK();
  }
  launch(ctx, moe_down_split_kernel, p.H / kDownCols, kGroupedThreads, smem2, p, layout);
  MTP_CUDA_LAUNCH_CHECK();
}

/// The block-item kernels' four launches (wide batches, block items): the plan (gate_up's items
/// counted per block), gate_up over every resident block, down on (H / 128) x S blocks, the combine.
void launch_block_items(const LaunchCtx& ctx, GroupedParams p, const PlanLayout& layout, int64_t items_max,
                        int64_t down_items_max, void* wide) {
  p.d = static_cast<bf16*>(wide);
  int* plans = reinterpret_cast<int*>(static_cast<uint8_t*>(wide) +
                                      (sizeof(bf16) * wide_d_elems(layout, p.H) + 15) / 16 * 16);
  p.plan_gu = plans;
  p.plan_dn = plans + 1 + layout.ints();
  launch(ctx, moe_plan_wide_kernel, 1, kPlanThreads, 0, p, layout, plans, plans + 1 + layout.ints(), true);
  MTP_CUDA_LAUNCH_CHECK();
  const size_t smem1 = sizeof(bf16) * block_item_elems<2>();
  const size_t smem2 = sizeof(bf16) * block_item_elems<1>();
  require_grouped_smem(ctx, p, smem1, smem2);
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

/// A wide launch (rows > kMaxBatchRows) of `kernel` (moe_grouped_plan): the block-item kernels, or
/// a pipeline's one-warp items with the plan and d in global memory (slots and split have none).
void launch_wide(const LaunchCtx& ctx, MoeKernel kernel, const GroupedParams& p, const PlanLayout& layout,
                 int64_t items_max, int64_t block_items_max, int64_t down_items_max, void* wide) {
  switch (kernel) {
    case MoeKernel::block_items:
      return launch_block_items(ctx, p, layout, block_items_max, down_items_max, wide);
    case MoeKernel::v1:
      return launch_grouped<PipeV1, PipeV1, true>(ctx, p, layout, items_max, 0, 0, wide);
    case MoeKernel::spread:
      return launch_grouped<PipeSpread, PipeSpread, true>(ctx, p, layout, items_max, 0, 0, wide);
    case MoeKernel::regs:
      return launch_grouped<PipeSpread, PipeRegsDown, true>(ctx, p, layout, items_max, 0, 0, wide);
    case MoeKernel::ring:
      return launch_grouped<PipeRingGateUp, PipeRingDown, true>(ctx, p, layout, items_max, 0, 0, wide);
    case MoeKernel::ringpf:
      return launch_grouped<PipeRingPfGateUp, PipeRingPfDown, true>(ctx, p, layout, items_max, 0, 0, wide);
    case MoeKernel::slots:
    case MoeKernel::split:
      break;
  }
  MTP_FAIL("ops::cuda::moe_experts_grouped: ", kernel_text(MoePlan{kernel, false}),
           " has no wide launch (at most ", kMaxBatchRows, " rows per launch)");
}

}  // namespace

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
  const int H = routed.hidden, I = routed.inter;
  const int Is = shared ? shared->inter : 0;
  const int most = moe_grouped_launch_rows(ctx.policy);
  MTP_REQUIRE(rows >= 1 && rows <= most && top_k >= 0 && top_k <= 32, "ops::cuda::moe_experts_grouped: rows ",
              rows, " (1 .. ", most, " per launch under moe_pipeline ", to_string(ctx.policy.moe_pipeline),
              "), top_k ", top_k, " (at most 32)");
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
  // The plan's and d's shared memory in a narrow launch, and whether ring's rings fit beside them:
  // what the rule (dispatch.cu's moe_grouped_plan) asks of the shape.
  const int pairs = rows * top_k;
  PlanLayout layout{routed.num_local, pairs, rows, std::min(routed.num_local, pairs) + 1};
  const size_t plan_bytes = sizeof(int) * layout.ints();
  const size_t routes = static_cast<size_t>(pairs) + rows;
  const size_t d_bytes = sizeof(bf16) * routes * kDownCols;
  const size_t ring_smem =
      std::max(sizeof(bf16) * PipeRingGateUp::template ring_elems<2>() + plan_bytes,
               sizeof(bf16) * PipeRingDown::template ring_elems<1>() + d_bytes + plan_bytes);
  const MoePlan plan = moe_grouped_plan(ctx.policy, rows, moe_slots_fit(rows, top_k, shared != nullptr),
                                        ring_smem <= 220 * 1024);
  record_kernel(ctx, "moe_experts_grouped", kernel_text(plan));
  if (plan.kernel == MoeKernel::slots) {
    // The single-row kernels for every (row, route): each row's bytes are the one-row op's.
    SharedExpert sh;
    if (shared) sh = SharedExpert{shared->gate, shared->up, shared->down, Is};
    static_assert(kMaxRowsSlotsMoe == 4, "the dispatch below covers 1 .. kMaxRowsSlotsMoe rows");
    if (rows == 1)
      return launch_expert_rows<1>(ctx, x, slot, routed, idx, weights, top_k, limit, act, out, sh);
    if (rows == 2)
      return launch_expert_rows<2>(ctx, x, slot, routed, idx, weights, top_k, limit, act, out, sh);
    if (rows == 3)
      return launch_expert_rows<3>(ctx, x, slot, routed, idx, weights, top_k, limit, act, out, sh);
    return launch_expert_rows<4>(ctx, x, slot, routed, idx, weights, top_k, limit, act, out, sh);
  }
  GroupedParams p;
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
  const int64_t items_max = static_cast<int64_t>(I / 16) * groups_max + shared_items;
  if (plan.wide) {
    // The block-item kernels: gate_up's items are 8 tiles of one group of 64 pairs, down's a group.
    const int64_t block_groups = active_max + pairs / kBlockGroup;
    const int64_t shared_groups = Is > 0 ? (rows + kBlockGroup - 1) / kBlockGroup : 0;
    const int64_t eighths = (I / 16 + kMoeWarps - 1) / kMoeWarps;
    const int64_t shared_eighths = (Is / 16 + kMoeWarps - 1) / kMoeWarps;
    const int64_t block_items_max = eighths * block_groups + shared_eighths * shared_groups;
    return launch_wide(ctx, plan.kernel, p, layout, items_max, block_items_max, block_groups + shared_groups,
                       wide);
  }
  switch (plan.kernel) {
    case MoeKernel::v1:
      return launch_grouped<PipeV1, PipeV1>(ctx, p, layout, items_max, plan_bytes, d_bytes);
    case MoeKernel::spread:
      return launch_grouped<PipeSpread, PipeSpread>(ctx, p, layout, items_max, plan_bytes, d_bytes);
    case MoeKernel::regs:
      return launch_grouped<PipeSpread, PipeRegsDown>(ctx, p, layout, items_max, plan_bytes, d_bytes);
    case MoeKernel::ring:
      return launch_grouped<PipeRingGateUp, PipeRingDown>(ctx, p, layout, items_max, plan_bytes, d_bytes);
    case MoeKernel::ringpf:
      return launch_grouped<PipeRingPfGateUp, PipeRingPfDown>(ctx, p, layout, items_max, plan_bytes, d_bytes);
    case MoeKernel::split:
      return launch_split(ctx, p, layout, items_max, plan_bytes, d_bytes);
    case MoeKernel::slots:
    case MoeKernel::block_items:
      break;
  }
  MTP_FAIL("ops::cuda::moe_experts_grouped: kernel ", static_cast<int>(plan.kernel),
           " has no grouped launch");
}

}  // namespace mtplab::ops::cuda
