// Checked calls into MPI, CUDA and NCCL for lib/dist and its tests. Every failure becomes an
// mtplab::Error naming the call, the library's own error string and the caller's file:line.
// The CUDA / NCCL macros exist only when mtplab is built with them (MTPLAB_HAVE_CUDA /
// MTPLAB_HAVE_NCCL); this header is internal to dist and its tests, never included by the drafter.
#pragma once
#include <mpi.h>

#include <string>

#include "core/error.hpp"

namespace mtplab::dist::detail {

/// MPI_Error_string of `code`, or the bare code when MPI cannot describe it.
inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return str("MPI error ", code);
  return std::string(text, static_cast<size_t>(len));
}

}  // namespace mtplab::dist::detail

/// Throws mtplab::Error when an MPI call does not return MPI_SUCCESS. Needs MPI_ERRORS_RETURN on
/// the communicator (Runtime sets it on MPI_COMM_WORLD; derived communicators inherit it).
#define MTP_MPI_CHECK(call)                                                                \
  do {                                                                                     \
    const int mtp_mpi_rc_ = (call);                                                        \
    if (mtp_mpi_rc_ != MPI_SUCCESS)                                                        \
      MTP_FAIL(#call, " failed: ", ::mtplab::dist::detail::mpi_error_string(mtp_mpi_rc_)); \
  } while (0)

#if defined(MTPLAB_HAVE_CUDA)
#include <cuda_runtime.h>
#define MTP_CUDA_CHECK(call)                                                                                \
  do {                                                                                                      \
    const cudaError_t mtp_cuda_rc_ = (call);                                                                \
    if (mtp_cuda_rc_ != cudaSuccess)                                                                        \
      MTP_FAIL(#call, " failed: ", cudaGetErrorName(mtp_cuda_rc_), ": ", cudaGetErrorString(mtp_cuda_rc_)); \
  } while (0)
#endif

#if defined(MTPLAB_HAVE_NCCL)
#include <nccl.h>
#define MTP_NCCL_CHECK(call)                                                                                \
  do {                                                                                                      \
    const ncclResult_t mtp_nccl_rc_ = (call);                                                               \
    if (mtp_nccl_rc_ != ncclSuccess)                                                                        \
      MTP_FAIL(#call, " failed: ", ncclGetErrorString(mtp_nccl_rc_), " (", ncclGetLastError(nullptr), ")"); \
  } while (0)
#endif
