// provenance: the version encodings of CUDA and NCCL, and the library versions of this process
// (read at run time; no MPI launcher needed, MPI_Get_library_version works before MPI_Init).
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "provenance/versions.hpp"

using namespace mtplab::provenance;

TEST(Versions, Strings) {
  EXPECT_EQ(cuda_version_string(13000), "13.0");
  EXPECT_EQ(cuda_version_string(12040), "12.4");
  EXPECT_EQ(cuda_version_string(0), "-");
  EXPECT_EQ(nccl_version_string(22809), "2.28.9");
  EXPECT_EQ(nccl_version_string(2708), "2.7.8");
  EXPECT_EQ(nccl_version_string(0), "-");
}

TEST(Versions, OfThisProcess) {
  const LibraryVersions v = library_versions();
  const std::regex dotted(R"(\d+\.\d+(\.\d+)?)");
  EXPECT_TRUE(std::regex_match(v.hdf5, dotted)) << v.hdf5;
  EXPECT_TRUE(std::regex_match(v.yaml_cpp, dotted)) << v.yaml_cpp;
  // One line of MPI's own text, never empty.
  EXPECT_FALSE(v.mpi.empty());
  EXPECT_NE(v.mpi, "-");
  EXPECT_EQ(v.mpi.find('\n'), std::string::npos) << v.mpi;
  // CUDA and NCCL: a version, or "-" when the build or the machine has none.
  for (const std::string& x : {v.cuda_runtime, v.cuda_driver, v.nccl})
    EXPECT_TRUE(x == "-" || std::regex_match(x, dotted)) << x;
}
