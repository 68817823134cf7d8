// Host launchers of the MoE kernels (moe.cu; the CPU reference: cpu/moe.cpp). What every launcher
// shares (LaunchCtx, the invariants): kernels.hpp.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/kernels.hpp"
#include "ops/ops.hpp"

namespace mtplab::ops::cuda {

// ---- one row ------------------------------------------------------------------------------------------
void moe_route(const LaunchCtx& ctx, const float* logits, const float* bias, int num_experts, int top_k,
               int n_group, int topk_group, float scaling, int32_t* idx, float* weights);
/// Routed experts in two launches (gate/up + activation, then down + weighted combine), expert
/// ids read on the device; with `shared`, the shared expert's rows run in the same two launches
/// as one more slot of weight 1, added last. `act` is scratch of top_k * inter (+ shared->inter)
/// BF16.
void moe_experts(const LaunchCtx& ctx, const bf16* x, const ExpertWeights& w, const int32_t* idx,
                 const float* weights, int top_k, float limit, bf16* act, float* out,
                 const ExpertWeights* shared = nullptr);

// ---- batched rows -------------------------------------------------------------------------------------
void moe_route_batch(const LaunchCtx& ctx, const float* logits, const float* bias, const int32_t* slot,
                     int rows, int num_experts, int top_k, int n_group, int topk_group, float scaling,
                     int32_t* idx, float* weights);
/// BF16 scratch moe_experts_grouped needs for `rows` rows: one activation row per (row, route)
/// and per row for the shared expert.
size_t moe_grouped_act_elems(int rows, int top_k, int inter, int shared_inter);
/// Most rows the single-row kernels take (moe_pipeline slots): their down launch has a warp per
/// (row, route) or per two, 32 at most.
inline constexpr int kMaxRowsSlotsMoe = 4;
/// Whether the single-row kernels take `rows` rows of top_k routes (plus the shared expert) in one
/// launch: 1 .. kMaxRowsSlotsMoe rows, top_k >= 1, and the down block's warps fit. Whether they
/// run is dispatch.cu's rule (moe_grouped_plan).
bool moe_slots_fit(int rows, int top_k, bool shared);
/// Most rows of one grouped launch, a wide one (more rows than kMaxBatchRows: the plan and d in
/// global memory): the launch size the backend uses.
inline constexpr int kMaxMoeLaunchRows = 1024;
/// The global scratch (bytes) of a wide launch of `rows` rows; 0 at most kMaxBatchRows rows.
size_t moe_grouped_wide_bytes(int rows, int top_k, int num_local, int hidden);
/// The routed experts grouped over up to kMaxMoeLaunchRows rows (plus the shared expert):
/// two launches, three when wide (docs/kernels.md, "Routed experts"), the kernels that
/// dispatch.cu's moe_grouped_plan picks (noted in the kernel record as moe_experts_grouped).
/// `act` is moe_grouped_act_elems of scratch; `wide` moe_grouped_wide_bytes of it (16-byte
/// aligned) when rows > kMaxBatchRows.
void moe_experts_grouped(const LaunchCtx& ctx, const bf16* x, const ExpertWeights& routed, const int32_t* idx,
                         const float* weights, const int32_t* slot, int rows, int top_k,
                         const ExpertWeights* shared, float limit, bf16* act, float* out,
                         void* wide = nullptr);

}  // namespace mtplab::ops::cuda
