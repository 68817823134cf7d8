// Versions of the libraries this process runs with, for `mtplab info`, the benchmarks' headers
// and the provenance the harness writes next to results. Every field is a printable string;
// "-" when absent (no CUDA in the build, no driver on the machine, ...).
#pragma once
#include <string>

namespace mtplab::provenance {

struct LibraryVersions {
  std::string cuda_runtime;  ///< cudaRuntimeGetVersion, "13.0"
  std::string cuda_driver;   ///< cudaDriverGetVersion (the newest CUDA the driver supports)
  std::string nccl;          ///< ncclGetVersion of the loaded library, "2.28.9"
  std::string mpi;           ///< first line of MPI_Get_library_version (MPI must be initialised)
  std::string hdf5;          ///< H5get_libversion
  std::string yaml_cpp;      ///< the yaml-cpp the build found (CMake package version)
};

LibraryVersions library_versions();

/// "13.0" from CUDA's 13000 encoding; "-" for 0.
std::string cuda_version_string(int encoded);
/// "2.28.9" from NCCL's encoding (major*10000 + minor*100 + patch since 2.9, major*1000 +
/// minor*100 + patch before).
std::string nccl_version_string(int encoded);

}  // namespace mtplab::provenance
