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
/// Most rows moe_pipeline slots runs on the single-row kernels (their down launch has a warp per
/// (row, route) or per two, 32 at most; moe_grouped_on_slots says where they fit); more rows, and
/// rows that do not fit, take ring.
inline constexpr int kMaxRowsSlotsMoe = 4;
/// Most rows moe_pipeline auto gives to slots (docs/kernels.md, "The grouped experts"; at 3 rows
/// slots 355 against ring's 375 us a launch, at 4 slower).
inline constexpr int kMaxRowsSlotsMoeAuto = 3;
/// Whether moe_experts_grouped runs `rows` rows of top_k routes on the single-row kernels under
/// `pipeline` (slots, or auto at few rows; the down launch must fit its warps).
bool moe_grouped_on_slots(MoePipeline pipeline, int rows, int top_k, bool shared);
/// Most rows of one moe_experts_grouped launch: the wide launches' (more rows than kMaxBatchRows,
/// plan and d in global memory), except under moe_pipeline split (kMaxBatchRows).
inline constexpr int kMaxMoeLaunchRows = 1024;
int moe_grouped_launch_rows(MoePipeline pipeline);
/// The global scratch (bytes) of a wide launch of `rows` rows; 0 at most kMaxBatchRows rows.
size_t moe_grouped_wide_bytes(int rows, int top_k, int num_local, int hidden);
/// The routed experts grouped over up to moe_grouped_launch_rows rows (plus the shared expert):
/// two launches, three when wide (docs/kernels.md, "Batched kernels"). `act` is
/// moe_grouped_act_elems of scratch; `wide` moe_grouped_wide_bytes of it (16-byte aligned) when
/// rows > kMaxBatchRows.
void moe_experts_grouped(const LaunchCtx& ctx, const bf16* x, const ExpertWeights& routed, const int32_t* idx,
                         const float* weights, const int32_t* slot, int rows, int top_k,
                         const ExpertWeights* shared, float limit, bf16* act, float* out, void* wide = nullptr);

}  // namespace mtplab::ops::cuda
