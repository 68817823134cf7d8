// Host launchers of the elementwise and device-scalar kernels (elementwise.cu; the CPU reference:
// cpu/backend.cpp). What every launcher shares (LaunchCtx, the invariants): kernels.hpp.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/kernels.hpp"
#include "ops/ops.hpp"

namespace mtplab::ops::cuda {

void residual_add(const LaunchCtx& ctx, const bf16* x, const float* delta, bf16* y, int n);
void add(const LaunchCtx& ctx, const bf16* a, const bf16* b, bf16* y, int n);
void to_bf16(const LaunchCtx& ctx, const float* x, bf16* y, int n);
void accumulate_f32(const LaunchCtx& ctx, const float* x, float* y, int n);
void scale_f32(const LaunchCtx& ctx, float* x, float s, int n);
void add_i32(const LaunchCtx& ctx, const int32_t* src, int32_t add, int32_t* dst);

}  // namespace mtplab::ops::cuda
