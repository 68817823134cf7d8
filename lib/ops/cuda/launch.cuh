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

}  // namespace mtplab::ops::cuda
