// One launch path for every kernel of lib/ops/cuda: cudaLaunchKernelEx with programmatic stream
// serialization when LaunchCtx::pdl() holds: the policy's pdl, on a device that has it, and no
// graph being captured (the kernel itself starts with pdl_begin(), device_common.cuh). Measured on
// the H200 at glm5.3-flash (docs/performance.md): eager draft steps 16-19 us faster, graph replays
// ~6 us slower with the programmatic edges, so captures record ordinary launches.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/kernels.hpp"

namespace mtplab::ops::cuda {

template <typename... Params, typename... Args>
void launch(const LaunchCtx& ctx, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
            Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem_bytes;
  cfg.stream = ctx.stream;
  cfg.attrs = attr;
  cfg.numAttrs = ctx.pdl() ? 1 : 0;
  MTP_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

/// Raises `kernel`'s dynamic shared-memory limit to the device's opt-in maximum less the kernel's
/// static shared memory, and returns that limit (bytes). Call once per kernel (a function-local
/// static at the launcher).
template <typename Kernel>
int opt_in_dynamic_smem(Kernel kernel) {
  int dev = 0, optin = 0;
  MTP_CUDA_CHECK(cudaGetDevice(&dev));
  MTP_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  cudaFuncAttributes attr{};
  MTP_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  const int dyn = optin - static_cast<int>(attr.sharedSizeBytes);
  MTP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dyn));
  return dyn;
}

}  // namespace mtplab::ops::cuda
