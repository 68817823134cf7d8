// Library versions at run time (not the headers compiled against), so that a result records
// what actually ran.
#include "provenance/versions.hpp"

#include <mpi.h>

#if defined(MTPLAB_HAVE_CUDA)
#include <cuda_runtime.h>
#endif
#if defined(MTPLAB_HAVE_NCCL)
#include <nccl.h>
#endif

#include "core/str.hpp"
#include "io/hdf5.hpp"

#ifndef MTPLAB_YAML_CPP_VERSION
#define MTPLAB_YAML_CPP_VERSION "unknown"
#endif

namespace mtplab::provenance {

std::string cuda_version_string(int encoded) {
  if (encoded <= 0) return "-";
  return str(encoded / 1000, ".", (encoded % 1000) / 10);
}

std::string nccl_version_string(int encoded) {
  if (encoded <= 0) return "-";
  if (encoded >= 20900) return str(encoded / 10000, ".", (encoded % 10000) / 100, ".", encoded % 100);
  return str(encoded / 1000, ".", (encoded % 1000) / 100, ".", encoded % 100);
}

LibraryVersions library_versions() {
  LibraryVersions v;
  v.cuda_runtime = v.cuda_driver = v.nccl = "-";
#if defined(MTPLAB_HAVE_CUDA)
  int runtime = 0, driver = 0;
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) v.cuda_runtime = cuda_version_string(runtime);
  // 0 when no driver is installed; the call itself succeeds then.
  if (cudaDriverGetVersion(&driver) == cudaSuccess) v.cuda_driver = cuda_version_string(driver);
  (void)cudaGetLastError();
#endif
#if defined(MTPLAB_HAVE_NCCL)
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess) v.nccl = nccl_version_string(nccl);
#endif
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  if (MPI_Get_library_version(mpi, &len) == MPI_SUCCESS) {
    // Some MPI libraries count the terminating NUL in len; cut at the first NUL or newline.
    std::string text(mpi, static_cast<size_t>(len));
    text = text.substr(0, text.find('\0'));
    v.mpi = trim(text.substr(0, text.find('\n')));
  } else {
    v.mpi = "-";
  }
  v.hdf5 = io::hdf5_library_version();
  v.yaml_cpp = MTPLAB_YAML_CPP_VERSION;
  return v;
}

}  // namespace mtplab::provenance
