// Elementwise ops and device-side scalars (the CPU reference: cpu/backend.cpp, "scalars and
// elementwise"): residual_add, add, to_bf16, accumulate_f32 and scale_f32 as grid-stride loops,
// add_i32 in one thread.
//
// Invariants: each element is the CPU reference's operation, with explicit round-to-nearest
// intrinsics (no FMA contraction).
#include <algorithm>
#include <cstdint>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/device_common.cuh"
#include "ops/cuda/elementwise.hpp"
#include "ops/cuda/launch.cuh"

namespace mtplab::ops::cuda {
namespace {

constexpr int kEltThreads = 256;

__global__ void residual_add_kernel(const bf16* x, const float* delta, bf16* y, int n) {
  pdl_begin();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = f_to_bf16(__fadd_rn(bf16_to_f(x[i]), delta[i]));
}
__global__ void add_kernel(const bf16* a, const bf16* b, bf16* y, int n) {
  pdl_begin();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = f_to_bf16(__fadd_rn(bf16_to_f(a[i]), bf16_to_f(b[i])));
}
__global__ void to_bf16_kernel(const float* x, bf16* y, int n) {
  pdl_begin();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = f_to_bf16(x[i]);
}
__global__ void accumulate_f32_kernel(const float* x, float* y, int n) {
  pdl_begin();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = __fadd_rn(y[i], x[i]);
}
__global__ void scale_f32_kernel(float* x, float s, int n) {
  pdl_begin();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    x[i] = __fmul_rn(x[i], s);
}
__global__ void add_i32_kernel(const int32_t* src, int32_t add, int32_t* dst) {
  pdl_begin();
  dst[0] = static_cast<int32_t>(static_cast<int64_t>(src[0]) + add);
}

int elt_grid(const LaunchCtx& ctx, int n) {
  return std::max(1, std::min((n + kEltThreads - 1) / kEltThreads, ctx.num_sms * 8));
}

}  // namespace

void residual_add(const LaunchCtx& ctx, const bf16* x, const float* delta, bf16* y, int n) {
  launch(ctx, residual_add_kernel, elt_grid(ctx, n), kEltThreads, 0, x, delta, y, n);
  MTP_CUDA_LAUNCH_CHECK();
}
void add(const LaunchCtx& ctx, const bf16* a, const bf16* b, bf16* y, int n) {
  launch(ctx, add_kernel, elt_grid(ctx, n), kEltThreads, 0, a, b, y, n);
  MTP_CUDA_LAUNCH_CHECK();
}
void to_bf16(const LaunchCtx& ctx, const float* x, bf16* y, int n) {
  launch(ctx, to_bf16_kernel, elt_grid(ctx, n), kEltThreads, 0, x, y, n);
  MTP_CUDA_LAUNCH_CHECK();
}
void accumulate_f32(const LaunchCtx& ctx, const float* x, float* y, int n) {
  launch(ctx, accumulate_f32_kernel, elt_grid(ctx, n), kEltThreads, 0, x, y, n);
  MTP_CUDA_LAUNCH_CHECK();
}
void scale_f32(const LaunchCtx& ctx, float* x, float s, int n) {
  launch(ctx, scale_f32_kernel, elt_grid(ctx, n), kEltThreads, 0, x, s, n);
  MTP_CUDA_LAUNCH_CHECK();
}
void add_i32(const LaunchCtx& ctx, const int32_t* src, int32_t add, int32_t* dst) {
  launch(ctx, add_i32_kernel, 1, 1, 0, src, add, dst);
  MTP_CUDA_LAUNCH_CHECK();
}

}  // namespace mtplab::ops::cuda
