// Entry point of the CUDA op tests: exits 77 (ctest: skipped) with the reason when no CUDA device
// is visible; otherwise one CPU reference backend and one CUDA backend (device 0) serve every test.
// The CUDA backend runs KernelPolicy{} with the MTPLAB_* overrides of the environment applied
// (env_overrides), printed at the start: a tuning run can take every test through one variant.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"

namespace mtplab::ops::gputest {

namespace {
std::unique_ptr<Backend> g_cpu;
std::unique_ptr<Backend> g_gpu;
}  // namespace

Backend& cpu() { return *g_cpu; }
Backend& gpu() { return *g_gpu; }

uint64_t run_seed() {
  static const uint64_t seed = ::mtplab::test::env_seed_or_fresh();
  return seed;
}

}  // namespace mtplab::ops::gputest

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  using namespace mtplab::ops;
  if (GTEST_FLAG_GET(list_tests)) return RUN_ALL_TESTS();  // listing needs no device
  if (!cuda_backend_available()) {
    std::printf(
        "SKIPPED: no CUDA device is visible (cudaGetDeviceCount reports none); the GPU op tests need one\n");
    return 77;
  }
  gputest::g_cpu = make_cpu_backend();
  gputest::g_gpu = make_cuda_backend(0);
  std::vector<std::string> overridden;
  gputest::g_gpu->set_kernel_policy(env_overrides(KernelPolicy{}, &overridden));
  std::string env_note;
  for (const std::string& o : overridden) env_note += (env_note.empty() ? " (environment: " : ", ") + o;
  if (!env_note.empty()) env_note += ")";
  std::printf("GPU op tests on %s, %s, kernel policy %s%s\n", gputest::g_gpu->device_name().c_str(),
              gputest::seed_note().c_str(), to_string(gputest::g_gpu->kernel_policy()).c_str(),
              env_note.c_str());
  const int rc = RUN_ALL_TESTS();
  gputest::g_gpu.reset();
  gputest::g_cpu.reset();
  return rc;
}
