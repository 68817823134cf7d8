// The grouped experts' comparison pipelines (no rule of the library picks them; the library runs
// v1, ringpf, the single-row kernels and the block items: lib/ops/cuda/dispatch.cu,
// moe_grouped_plan): spread, regs, ring and split, each instantiated from the one-warp work items
// of lib/ops/cuda/moe_grouped.cuh. Each is checked against the CPU reference
// (lib/ops/cpu/moe.cpp) and timed against the library's choice for the same batch.
// - Against the CPU: fp32 outputs within 1/128 relative + 1/256 of the largest |reference| (the
//   tolerance of the grouped experts' GPU test: the GPU rounds the activations and d to BF16 after
//   its own fp32 sums, so one BF16 step of an input to the combine moves an output by ~1/256 of
//   its terms), on every live row; a padded row's outputs keep their poison.
// - Against v1 (the library's pipeline, forced): spread, regs and ring the same bytes, whatever the
//   batch (the same MMAs in the same order; only where the weights wait and which warp takes an
//   item differ). split: printed, how many outputs differ from v1's (with few chunks its parts can
//   round exactly as one accumulator does).
// - A row alone (B = 64, 200): the bytes it has in the batch (a row's numbers depend on its own
//   routes only). Every row padded: nothing written.
// - Batches of 1 .. 128 rows in one narrow launch, 200 in a wide one (the plan and d in global
//   memory; split has none, it runs at most 128 rows).
// Run: mtplab_dev_moe [--reps N] [--seed S] [--device D] (playground.hpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ops/cuda/dispatch.hpp"
#include "ops/cuda/moe.hpp"
#include "ops/cuda/moe_grouped.cuh"
#include "ops/ops.hpp"
#include "playground.hpp"

namespace mtplab::ops::cuda::grouped {
namespace {

// ---- the comparison pipelines --------------------------------------------------------------------------
//
// Each hands the tensor cores the operands of v1 (moe_grouped.cuh, "the memory pipelines") in the
// same order, so spread, regs and ring give v1's bits; split cuts an item's reduction into eight
// parts (its own bits, within the CPU's tolerances).
// - spread: v1's chunk pipeline, gate_up's items dealt round-robin over a grid of every resident
//   block (item w to block w % grid): at B = 1, 1152 items over 264 blocks are 8 or 9 per
//   multiprocessor, where runs of 8 over 144 blocks put 16 on 12 of them.
// - regs: spread, and the down kernel's weights three chunks ahead in four register buffers (128
//   registers at __launch_bounds__(256, 2); gate_up with three buffers would spill, so it is spread's).
// - ring: ringpf without the L2 hint on its weight copies.
// - split: below.
using PipeSpread = Pipe<kMoeStages, kMoeWBuf, false, true, 2>;
using PipeRegsDown = Pipe<kMoeStages, 4, false, true, 2>;
using PipeRingGateUp = Pipe<3, 1, true, true, 1>;
using PipeRingDown = Pipe<4, 1, true, true, 1>;

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
  require_grouped_smem(p, smem1, smem2);
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

}  // namespace

/// The comparison pipelines, as moe_experts_grouped's launches of them.
enum class Retired { spread, regs, ring, split };
constexpr Retired kRetired[] = {Retired::spread, Retired::regs, Retired::ring, Retired::split};
constexpr const char* kRetiredNames[] = {"spread", "regs", "ring", "split"};  // Retired's order

/// One grouped launch of `rows` rows under a comparison pipeline (wide: the scratch of a launch of
/// more than kMaxBatchRows rows; split takes at most kMaxBatchRows).
void run_retired(Retired pipe, const LaunchCtx& ctx, const bf16* x, const ExpertWeights& routed,
                 const int32_t* idx, const float* weights, const int32_t* slot, int rows, int top_k,
                 const ExpertWeights* shared, float limit, bf16* act, float* out, void* wide) {
  const GroupedLaunch g =
      grouped_launch(x, routed, idx, weights, slot, rows, top_k, shared, limit, act, out, wide);
  const bool is_wide = rows > kMaxBatchRows;
  switch (pipe) {
    case Retired::spread:
      return is_wide
                 ? launch_grouped<PipeSpread, PipeSpread, true>(ctx, g.p, g.layout, g.items_max, 0, 0, wide)
                 : launch_grouped<PipeSpread, PipeSpread>(ctx, g.p, g.layout, g.items_max, g.plan_bytes,
                                                          g.d_bytes);
    case Retired::regs:
      return is_wide
                 ? launch_grouped<PipeSpread, PipeRegsDown, true>(ctx, g.p, g.layout, g.items_max, 0, 0, wide)
                 : launch_grouped<PipeSpread, PipeRegsDown>(ctx, g.p, g.layout, g.items_max, g.plan_bytes,
                                                            g.d_bytes);
    case Retired::ring:
      return is_wide ? launch_grouped<PipeRingGateUp, PipeRingDown, true>(ctx, g.p, g.layout, g.items_max, 0,
                                                                          0, wide)
                     : launch_grouped<PipeRingGateUp, PipeRingDown>(ctx, g.p, g.layout, g.items_max,
                                                                    g.plan_bytes, g.d_bytes);
    case Retired::split:
      MTP_REQUIRE(!is_wide, "split takes at most ", kMaxBatchRows, " rows per launch, not ", rows);
      return launch_split(ctx, g.p, g.layout, g.items_max, g.plan_bytes, g.d_bytes);
  }
}

}  // namespace mtplab::ops::cuda::grouped

namespace {

using namespace mtplab;
namespace cuda = mtplab::ops::cuda;
using cuda::grouped::Retired;
using dev::DeviceBuffer;

constexpr const char* kName = "mtplab_dev_moe";

struct Shape {
  const char* name;
  int hidden, inter, experts, top_k;
  std::vector<int> batches;
};
// A small model's experts and a slice of glm5.3-flash's (its hidden, inter and top_k, 32 of its
// experts), at the batches of the draft step, a wide verification launch (200) where the CPU
// reference stays quick.
const Shape kShapes[] = {{"small", 1024, 256, 64, 4, {1, 2, 3, 4, 16, 64, 128, 200}},
                         {"flash slice", 4096, 2048, 32, 8, {1, 4, 16, 64}}};

struct Case {
  const char* name;
  bool ep;       ///< a third of the experts from E / 3: rows route to experts other ranks own
  bool shared;   ///< the shared expert too
  float limit;   ///< 10: the swiglu clamp; 0: none
  bool crowded;  ///< every row among 3 experts: pairs of one expert span several work groups
};
const Case kCases[] = {{"all local, shared, clamp", false, true, 10.0f, false},
                       {"EP, no shared, no clamp", true, false, 0.0f, false},
                       {"crowded, shared", false, true, 10.0f, true}};

/// The library's launch context at a memory pipeline (v1: the bytes spread, regs and ring must
/// give; automatic: the library's choice, the timing baseline).
cuda::LaunchCtx at(const cuda::LaunchCtx& ctx, ops::MoePipeline pipe) {
  cuda::LaunchCtx c = ctx;
  c.policy.moe_pipeline = pipe;
  return c;
}

/// The live rows' outputs (padded rows dropped), and whether every padded row kept its poison.
std::vector<float> live_rows(const std::vector<float>& out, const std::vector<int32_t>& slot, int H,
                             bool& padded_untouched) {
  std::vector<float> live;
  padded_untouched = true;
  for (size_t b = 0; b < slot.size(); ++b) {
    const float* row = out.data() + b * static_cast<size_t>(H);
    if (slot[b] >= 0) {
      live.insert(live.end(), row, row + H);
      continue;
    }
    for (int h = 0; h < H; ++h) {
      uint32_t bits;
      std::memcpy(&bits, row + h, sizeof(bits));
      padded_untouched = padded_untouched && bits == 0xFFFFFFFFu;
    }
  }
  return live;
}

void check_shape(const Shape& s, const cuda::LaunchCtx& ctx, ops::Backend& cpu, dev::Rng& rng,
                 dev::Report& report, int reps) {
  const int E = s.experts, H = s.hidden, I = s.inter, k = s.top_k;
  const size_t per = static_cast<size_t>(I) * H;
  const std::vector<bf16> gate = rng.bf16s(per * E, -1.0f, 1.0f), up = rng.bf16s(per * E, -1.0f, 1.0f);
  const std::vector<bf16> down = rng.bf16s(per * E, -0.1f, 0.1f);
  const std::vector<bf16> sg = rng.bf16s(per, -1.0f, 1.0f), su = rng.bf16s(per, -1.0f, 1.0f);
  const std::vector<bf16> sd = rng.bf16s(per, -0.1f, 0.1f);
  DeviceBuffer<bf16> d_gate(gate), d_up(up), d_down(down), d_sg(sg), d_su(su), d_sd(sd);
  const int most = *std::max_element(s.batches.begin(), s.batches.end());
  DeviceBuffer<bf16> act(std::max<size_t>(1, cuda::moe_grouped_act_elems(most, k, I, I)));
  DeviceBuffer<uint8_t> wide(std::max<size_t>(16, cuda::moe_grouped_wide_bytes(most, k, E, H)));
  for (const Case& c : kCases) {
    const int first = c.ep ? E / 3 : 0, num_local = c.ep ? std::max(1, E / 3) : E;
    const size_t off = static_cast<size_t>(first) * per;  // a rank holds only its own experts' weights
    const ops::ExpertWeights wc{
        gate.data() + off, up.data() + off, down.data() + off, first, num_local, H, I};
    const ops::ExpertWeights wg{
        d_gate.data() + off, d_up.data() + off, d_down.data() + off, first, num_local, H, I};
    const ops::ExpertWeights shc{sg.data(), su.data(), sd.data(), 0, 1, H, I};
    const ops::ExpertWeights shg{d_sg.data(), d_su.data(), d_sd.data(), 0, 1, H, I};
    for (const int B : s.batches) {
      const std::string what = str(s.name, ", ", c.name, ", B = ", B);
      // Every fifth row padded (its slot -1; routed to an owned expert, which would write its row).
      std::vector<int32_t> slot(static_cast<size_t>(B));
      for (int b = 0; b < B; ++b) slot[static_cast<size_t>(b)] = b % 5 == 4 ? -1 : b;
      std::vector<int32_t> idx(static_cast<size_t>(B) * k);
      for (int b = 0; b < B; ++b) {
        int32_t* row = idx.data() + static_cast<size_t>(b) * k;
        for (int i = 0; i < k; ++i)
          row[i] = static_cast<int32_t>(c.crowded ? first + rng.next() % 3
                                                  : rng.next() % static_cast<uint64_t>(E));
        if (b == 0 && k >= 2) row[1] = row[0];  // a repeated expert inside one row
        if (slot[static_cast<size_t>(b)] < 0) row[0] = first;
      }
      const std::vector<float> wts = rng.floats(static_cast<size_t>(B) * k, 0.1f, 1.0f);
      const std::vector<bf16> x = rng.bf16s(static_cast<size_t>(B) * H, -1.0f, 1.0f);
      std::vector<float> want(static_cast<size_t>(B) * H, 0.0f);
      cpu.moe_experts_grouped(x.data(), wc, idx.data(), wts.data(), ops::RowBatch{slot.data(), nullptr, B}, k,
                              c.shared ? &shc : nullptr, c.limit, want.data());
      bool unused = true;
      const std::vector<float> want_live = live_rows(want, slot, H, unused);
      DeviceBuffer<int32_t> d_idx(idx), d_slot(slot);
      DeviceBuffer<float> d_wts(wts), out(static_cast<size_t>(B) * H), out_v1(static_cast<size_t>(B) * H);
      DeviceBuffer<bf16> d_x(x);
      const ops::ExpertWeights* sh = c.shared ? &shg : nullptr;
      auto library = [&](const cuda::LaunchCtx& lc, float* o) {
        cuda::moe_experts_grouped(lc, d_x.data(), wg, d_idx.data(), d_wts.data(), d_slot.data(), B, k, sh,
                                  c.limit, act.data(), o, wide.data());
      };
      out_v1.poison();
      library(at(ctx, ops::MoePipeline::v1), out_v1.data());
      const std::vector<float> v1 = out_v1.download();
      const cuda::LaunchCtx lib = at(ctx, ops::MoePipeline::automatic);
      const double lib_ms = dev::median_ms(ctx.stream, reps, [&] { library(lib, out_v1.data()); });
      for (const Retired pipe : cuda::grouped::kRetired) {
        const char* name = cuda::grouped::kRetiredNames[static_cast<int>(pipe)];
        if (pipe == Retired::split && B > cuda::kMaxBatchRows) continue;  // no wide launch
        const std::string pw = str(what, ", ", name);
        auto run = [&](int rows, int r0, float* o) {
          cuda::grouped::run_retired(pipe, ctx, d_x.data() + static_cast<size_t>(r0) * H, wg,
                                     d_idx.data() + static_cast<size_t>(r0) * k,
                                     d_wts.data() + static_cast<size_t>(r0) * k, d_slot.data() + r0, rows, k,
                                     sh, c.limit, act.data(), o, wide.data());
        };
        out.poison();
        run(B, 0, out.data());
        const std::vector<float> got = out.download();
        bool padded_untouched = false;
        report.f32_close(pw + " against the CPU", live_rows(got, slot, H, padded_untouched), want_live,
                         1.0 / 128, 1.0 / 256);
        report.check(pw + ": padded rows unwritten", padded_untouched);
        if (pipe != Retired::split) {
          report.equal(pw + ": v1's bytes", got, v1);
        } else {
          size_t differ = 0;
          for (size_t i = 0; i < got.size(); ++i)
            differ +=
                slot[i / static_cast<size_t>(H)] >= 0 && std::memcmp(&got[i], &v1[i], sizeof(float)) != 0;
          std::printf("  note %s: %zu of %zu outputs differ from v1's bytes\n", pw.c_str(), differ,
                      got.size());
        }
        if (B == 64 || B == 200) {
          // A row alone: the bytes it has in the batch.
          for (const int r : {0, B / 2, B - 1}) {
            if (slot[static_cast<size_t>(r)] < 0) continue;
            DeviceBuffer<float> one(static_cast<size_t>(H));
            one.poison();
            run(1, r, one.data());
            const std::vector<float> row(got.begin() + static_cast<ptrdiff_t>(r) * H,
                                         got.begin() + static_cast<ptrdiff_t>(r + 1) * H);
            report.equal(str(pw, ": row ", r, " alone"), one.download(), row);
          }
        }
        dev::Report::timing(pw, dev::median_ms(ctx.stream, reps, [&] { run(B, 0, out.data()); }), "library",
                            lib_ms);
      }
    }
  }
  // Every row padded: nothing written, under each pipeline.
  const int B = 8;
  const std::vector<int32_t> none(B, -1), idx(static_cast<size_t>(B) * k, 0);
  DeviceBuffer<int32_t> d_none(none), d_idx(idx);
  DeviceBuffer<float> d_wts(rng.floats(static_cast<size_t>(B) * k, 0.1f, 1.0f)),
      out(static_cast<size_t>(B) * H);
  DeviceBuffer<bf16> d_x(rng.bf16s(static_cast<size_t>(B) * H, -1.0f, 1.0f));
  const ops::ExpertWeights w{d_gate.data(), d_up.data(), d_down.data(), 0, E, H, I};
  for (const Retired pipe : cuda::grouped::kRetired) {
    out.poison();
    cuda::grouped::run_retired(pipe, ctx, d_x.data(), w, d_idx.data(), d_wts.data(), d_none.data(), B, k, &w,
                               10.0f, act.data(), out.data(), wide.data());
    bool untouched = false;
    live_rows(out.download(), none, H, untouched);
    report.check(str(s.name, ", every row padded, ", cuda::grouped::kRetiredNames[static_cast<int>(pipe)],
                     ": nothing written"),
                 untouched);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const dev::Options opt = dev::parse_options(
      argc, argv, kName,
      "the grouped experts' comparison pipelines (spread, regs, ring, split) against the CPU");
  if (!dev::have_device(kName)) return 0;
  std::printf("%s: seed %llu, %d reps\n", kName, static_cast<unsigned long long>(opt.seed), opt.reps);
  const cuda::LaunchCtx ctx = dev::make_ctx(opt.device);
  const std::unique_ptr<ops::Backend> cpu = ops::make_cpu_backend();
  dev::Rng rng(opt.seed);
  dev::Report report(opt.seed);
  for (const Shape& s : kShapes) check_shape(s, ctx, *cpu, rng, report, opt.reps);
  return report.finish(kName);
}
