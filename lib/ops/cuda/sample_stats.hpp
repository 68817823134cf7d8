// Host launchers of the sampling-statistics kernels (sample_stats.cu; the CPU reference:
// cpu/sample_stats.cpp). What every launcher shares (LaunchCtx, the invariants): kernels.hpp.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/kernels.hpp"
#include "ops/ops.hpp"

namespace mtplab::ops::cuda {

/// Rows per launch pair of logit_stats_batch, and the most blocks one row's histogram is split over.
inline constexpr int kStatsRows = 128;
inline constexpr int kStatsMaxSplits = 64;
/// The scratch logit_stats_batch needs: a 65536-bin histogram per row of a launch (zero between
/// launches: zero it once when allocated, the kernels leave it zero) and the blocks' top-two keys.
size_t stats_scratch_bytes();
/// logit_stats_batch in launches of kStatsRows rows: the histogram kernel, then one block per row.
void logit_stats_batch(const LaunchCtx& ctx, const LogitRows& view, const int32_t* requested,
                       const SampleParams* params, LogitStats* out, void* scratch);
/// logit_stats_combine: one thread per row.
void logit_stats_combine(const LaunchCtx& ctx, const LogitStats* parts, int n, int rows,
                         const SampleParams* params, TokenStats* out);

}  // namespace mtplab::ops::cuda
