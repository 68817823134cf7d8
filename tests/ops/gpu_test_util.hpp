// Helpers for the CUDA-vs-CPU op tests (test_gpu_*.cpp): the model shapes of docs/model.md, a fast
// seeded generator, twin buffers (one on each backend) poisoned before an op writes them, and the
// comparisons with their stated tolerances.
//
// Invariants:
// - The seed is fresh every run (std::random_device) and printed by every failing comparison;
//   MTPLAB_TEST_SEED=<n> reproduces a run.
// - Poison is 0xFF for floats (NaN: no tolerance accepts it) and 0x7F for integers (0x7F7F7F7F is
//   no valid index, position or padding value), so an output a kernel forgot to write fails.
// - Kernel choices go through the GPU backend's policy (PolicyScope), never process state; main
//   starts from KernelPolicy{} with the MTPLAB_* overrides applied (ops/kernel_policy.hpp), so a
//   tuning run can run every test under, say, MTPLAB_GEMV_VARIANT=rows4.
// - BF16 tolerance: the two backends round the same fp32 function at the same points and differ
//   only by fp32 summation order (relative error ~ sqrt(k) * 2^-24 before rounding), which can
//   flip a BF16 rounding by one ulp; allow 2 ulps of the reference plus an absolute floor for
//   results that cancel to far below the tensor's magnitude, and require most elements to be
//   bit-identical (a wrong rounding point or formula fails that even when within 2 ulps).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "common/random.hpp"
#include "common/seed.hpp"
#include "core/hash.hpp"
#include "core/numeric.hpp"
#include "ops/kernel_policy.hpp"
#include "ops/ops.hpp"

namespace mtplab::ops::gputest {

/// The sizes of docs/model.md's table ("Sizes").
struct Shape {
  const char* name;
  int hidden, vocab, n_heads, head_dim, q_lora, kv_lora, index_heads, index_dim, index_topk, index_kpool;
  int experts, top_k, moe_inter;
};
inline const Shape kShapes[] = {
    {"tiny", 128, 4096, 8, 32, 64, 64, 4, 32, 16, 4, 8, 2, 64},
    {"small", 1024, 38912, 16, 128, 384, 256, 8, 128, 512, 4, 64, 4, 512},
    {"glm5_3_flash", 4096, 154880, 64, 256, 1536, 512, 32, 128, 2048, 4, 288, 8, 2048},
};

/// gtest parameter name of a shape.
inline std::string shape_name(const ::testing::TestParamInfo<Shape>& param) { return param.param.name; }

Backend& cpu();
Backend& gpu();

uint64_t run_seed();
inline std::string seed_note() { return ::mtplab::test::seed_note(run_seed()); }

/// The GPU backend's kernel policy for one scope: the current policy with `edit` applied; the one
/// before is restored when the scope ends.
class PolicyScope {
 public:
  template <typename Edit>
  explicit PolicyScope(Edit&& edit) : previous_(gpu().kernel_policy()) {
    KernelPolicy p = previous_;
    edit(p);
    gpu().set_kernel_policy(p);
  }
  ~PolicyScope() {
    try {
      gpu().set_kernel_policy(previous_);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "restoring the kernel policy: " << e.what();
    }
  }
  PolicyScope(const PolicyScope&) = delete;
  PolicyScope& operator=(const PolicyScope&) = delete;

 private:
  KernelPolicy previous_;
};

/// The generator of one test (tests/common/random.hpp: splitmix64, fast enough to fill a
/// [154880, 4096] head in about a second): the run's seed mixed with a per-test salt.
class Rng : public ::mtplab::test::Rng {
 public:
  explicit Rng(uint64_t salt) : ::mtplab::test::Rng(::mtplab::test::salted(run_seed(), salt)) {}
};

/// The same data on both backends.
template <typename T>
struct Twin {
  Array<T> c, g;
  explicit Twin(size_t n) : c(cpu(), n), g(gpu(), n) {}
  explicit Twin(const std::vector<T>& host) : Twin(host.size()) { set(host); }
  void set(const std::vector<T>& host) {
    cpu().upload(c.data(), host.data(), c.bytes());
    gpu().upload(g.data(), host.data(), g.bytes());
  }
  void poison(uint8_t byte) {
    cpu().fill_bytes(c.data(), byte, c.bytes());
    gpu().fill_bytes(g.data(), byte, g.bytes());
  }
  std::vector<T> from_cpu() const {
    std::vector<T> h(c.size());
    cpu().download(h.data(), c.data(), c.bytes());
    return h;
  }
  std::vector<T> from_gpu() const {
    std::vector<T> h(g.size());
    gpu().download(h.data(), g.data(), g.bytes());
    return h;
  }
};

/// An output buffer on both backends, poisoned (floats: NaN).
template <typename T>
Twin<T> out_twin(size_t n) {
  Twin<T> t(n);
  t.poison(std::is_integral_v<T> ? 0x7F : 0xFF);
  return t;
}

/// One BF16 ulp at |v| (2^(e-8) for |v| in [2^(e-1), 2^e)).
inline double bf16_ulp(double v) {
  if (v == 0.0) return std::ldexp(1.0, -133);
  int e = 0;
  std::frexp(std::fabs(v), &e);
  return std::ldexp(1.0, e - 8);
}

struct Tolerance {
  double ulps = 2.0;              ///< BF16 ulps of the reference value
  double floor_rel = 1.0 / 4096;  ///< absolute floor, relative to the largest |reference|
  double min_identical = 0.9;     ///< fraction of bit-identical elements (when n >= 256)
};

inline double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

/// GPU vs CPU BF16 outputs under `tol` (see the file comment for why).
inline void expect_bf16_close(const std::vector<bf16>& got, const std::vector<bf16>& want,
                              const std::string& what, Tolerance tol = {}) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::vector<float> ref(want.size());
  for (size_t i = 0; i < want.size(); ++i) ref[i] = to_float(want[i]);
  const double floor_abs = tol.floor_rel * max_abs(ref);
  size_t bad = 0, identical = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = to_float(got[i]);
    const double c = ref[i];
    identical += got[i].bits == want[i].bits;
    const double allowed = tol.ulps * bf16_ulp(c) + floor_abs;
    if (!(std::fabs(g - c) <= allowed)) {  // NaN (poison) fails here
      if (bad < 5)
        first += "\n  [" + std::to_string(i) + "] gpu " + std::to_string(g) + " cpu " + std::to_string(c);
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements outside " << tol.ulps
                     << " ulps + " << floor_abs << "; " << seed_note() << first;
  if (got.size() >= 256) {
    const double frac = static_cast<double>(identical) / static_cast<double>(got.size());
    EXPECT_GE(frac, tol.min_identical)
        << what << ": only " << frac << " of elements bit-identical; " << seed_note();
  }
}

/// GPU vs CPU fp32 outputs: |gpu - cpu| <= rel * |cpu| + floor_rel * max|cpu|.
inline void expect_f32_close(const std::vector<float>& got, const std::vector<float>& want,
                             const std::string& what, double rel, double floor_rel) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double floor_abs = floor_rel * max_abs(want);
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], c = want[i];
    const bool both_neg_inf = std::isinf(c) && c < 0 && std::isinf(g) && g < 0;
    if (both_neg_inf) continue;
    if (!(std::fabs(g - c) <= rel * std::fabs(c) + floor_abs)) {
      if (bad < 5)
        first += "\n  [" + std::to_string(i) + "] gpu " + std::to_string(g) + " cpu " + std::to_string(c);
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " outside rel " << rel << " + "
                     << floor_abs << "; " << seed_note() << first;
}

template <typename T>
void expect_bytes_equal(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = got.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      if (first == got.size()) first = i;
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " differ, first at " << first << "; "
                     << seed_note();
}

}  // namespace mtplab::ops::gputest
