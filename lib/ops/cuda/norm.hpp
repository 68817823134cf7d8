// Host launchers of the norm kernels (norm.cu; the CPU reference: cpu/norm.cpp). What every launcher
// shares (LaunchCtx, the invariants): kernels.hpp.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/kernels.hpp"
#include "ops/ops.hpp"

namespace mtplab::ops::cuda {

// ---- one row ------------------------------------------------------------------------------------------
void rmsnorm(const LaunchCtx& ctx, const bf16* x, const bf16* w, bf16* y, int rows, int n, float eps);
void embed_rmsnorm(const LaunchCtx& ctx, const bf16* table, const int32_t* token, const bf16* w, bf16* y,
                   int n, float eps);
void layernorm(const LaunchCtx& ctx, const bf16* x, const bf16* w, const bf16* b, bf16* y, int rows, int n,
               float eps);
/// residual_add then rmsnorm in one block: the rmsnorm kernel's thread layout and reduction.
void residual_add_rmsnorm(const LaunchCtx& ctx, const bf16* x, const float* delta, bf16* y, const bf16* w,
                          bf16* normed, int n, float eps);

// ---- batched rows -------------------------------------------------------------------------------------
void embed_rmsnorm_batch(const LaunchCtx& ctx, const bf16* table, const int32_t* tokens, const int32_t* slot,
                         const bf16* w, bf16* y, int ld_y, int rows, int n, float eps);
void rmsnorm_strided(const LaunchCtx& ctx, const bf16* x, int ld_x, const bf16* w, bf16* y, int ld_y,
                     int rows, int n, float eps);
void residual_add_rmsnorm_rows(const LaunchCtx& ctx, const bf16* x, const float* delta, bf16* y,
                               const bf16* w, bf16* normed, int rows, int n, float eps);

}  // namespace mtplab::ops::cuda
