// Checked CUDA and cuBLASLt calls for lib/ops/cuda: every runtime / cuBLASLt call goes through
// MTP_CUDA_CHECK / MTP_CUBLAS_CHECK, and every kernel launch is followed by MTP_CUDA_LAUNCH_CHECK,
// so a failure throws mtplab::Error carrying the call, the CUDA error name and string, and the
// file and line where it was made (not where it was noticed later).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "core/error.hpp"

namespace mtplab::ops::cuda {

/// Kernels this process has enqueued through the launchers (each launch once, also when it is
/// recorded into a graph rather than run); Backend::kernels_enqueued reports it.
inline std::atomic<uint64_t> g_kernels_enqueued{0};

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  throw ::mtplab::Error(
      ::mtplab::str("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ") in ", expr), file,
      line);
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t st, const char* expr, const char* file, int line) {
  throw ::mtplab::Error(::mtplab::str("cuBLASLt error ", cublasLtGetStatusName(st), " (",
                                      cublasLtGetStatusString(st), ") in ", expr),
                        file, line);
}

}  // namespace mtplab::ops::cuda

/// Evaluates a CUDA / cuBLAS call once; anything but `ok` throws through `thrower` with the call's
/// text and site.
#define MTP_CUDA_STATUS_CHECK_(expr, ok, thrower)                                                  \
  do {                                                                                             \
    const auto mtp_status_ = (expr);                                                               \
    if (mtp_status_ != (ok)) ::mtplab::ops::cuda::thrower(mtp_status_, #expr, __FILE__, __LINE__); \
  } while (0)

#define MTP_CUDA_CHECK(expr) MTP_CUDA_STATUS_CHECK_(expr, cudaSuccess, throw_cuda_error)
#define MTP_CUBLAS_CHECK(expr) MTP_CUDA_STATUS_CHECK_(expr, CUBLAS_STATUS_SUCCESS, throw_cublas_error)

/// After a <<<...>>> launch: counts it and reports a bad configuration at the launch site.
#define MTP_CUDA_LAUNCH_CHECK()                                                      \
  do {                                                                               \
    ::mtplab::ops::cuda::g_kernels_enqueued.fetch_add(1, std::memory_order_relaxed); \
    MTP_CUDA_CHECK(cudaGetLastError());                                              \
  } while (0)
