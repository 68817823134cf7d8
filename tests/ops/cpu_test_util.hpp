// Helpers for the CPU reference tests: seeded random inputs, backend buffers poisoned before an
// op writes them, and the tolerance arithmetic every test states (BF16 ulp, fp32 summation bound).
//
// Invariants: inputs come from a seed that failures print (MTPLAB_TEST_SEED overrides it, so a
// failure reproduces and other seeds can be tried); poisoned floats are NaN (0xFF bytes), which
// no tolerance accepts, so an output the op forgot to write fails the test.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/random.hpp"
#include "common/seed.hpp"
#include "core/hash.hpp"
#include "core/numeric.hpp"
#include "ops/ops.hpp"

namespace mtplab::ops::test {

/// fp32 unit roundoff.
inline constexpr double kU32 = 1.0 / (1 << 24);

inline uint64_t test_seed() {
  static const uint64_t seed = ::mtplab::test::env_seed_or(20261201);
  return seed;
}

/// A generator for one test: the global seed mixed with a per-test salt.
class Rng : public ::mtplab::test::RandomVectors<Rng> {
 public:
  explicit Rng(uint64_t salt) : gen_(test_seed() * kSplitmix64Gamma + salt) {}
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen_); }
  float normal(float stddev) { return std::normal_distribution<float>(0.0f, stddev)(gen_); }
  int integer(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen_); }
  /// Random finite E4M3 codes (0x7f / 0xff are NaN and excluded).
  std::vector<fp8e4m3> fp8s(size_t n) {
    std::vector<fp8e4m3> v(n);
    for (auto& x : v) {
      int code;
      do code = integer(0, 255);
      while ((code & 0x7f) == 0x7f);
      x = fp8e4m3{static_cast<uint8_t>(code)};
    }
    return v;
  }
  std::mt19937_64& engine() { return gen_; }

 private:
  std::mt19937_64 gen_;
};

inline std::string seed_note() { return ::mtplab::test::seed_note(test_seed()); }

// ---- backend buffers ----------------------------------------------------------------------------

/// A test fixture with its own CPU backend, `be`.
struct CpuBackendTest : ::testing::Test {
  std::unique_ptr<Backend> be = make_cpu_backend();
};

template <typename T>
Array<T> upload(Backend& be, const std::vector<T>& host) {
  Array<T> a(be, host.size());
  be.upload(a.data(), host.data(), a.bytes());
  return a;
}

/// A buffer filled with `byte` (0xFF: NaN for bf16 and fp32, -1 for integers).
template <typename T>
Array<T> poisoned(Backend& be, size_t count, uint8_t byte = 0xFF) {
  Array<T> a(be, count);
  be.fill_bytes(a.data(), byte, a.bytes());
  return a;
}

template <typename T>
std::vector<T> download(Backend& be, const Array<T>& a) {
  std::vector<T> host(a.size());
  be.download(host.data(), a.data(), a.bytes());
  return host;
}

// ---- tolerances ---------------------------------------------------------------------------------

/// Spacing of BF16 values at |v| (8 significant bits): 2^(e - 7) for |v| in [2^e, 2^(e+1)).
inline double bf16_ulp(double v) {
  const double a = std::fabs(v);
  if (a < std::ldexp(1.0, -126)) return std::ldexp(1.0, -133);
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  return std::ldexp(1.0, e - 1 - 7);
}

/// The BF16 value nearest to v, ties to the even significand, computed in double from the
/// spacing (a different method from the rounding-bias trick of core/numeric). Finite v only.
inline float bf16_nearest(double v) {
  const double a = std::fabs(v);
  const double ulp = bf16_ulp(a);
  const double m = std::floor(a / ulp);  // a = (m + frac) * ulp, m in [128, 256) for normals
  const double frac = a / ulp - m;
  const bool up = frac > 0.5 || (frac == 0.5 && std::fmod(m, 2.0) == 1.0);
  const double r = (up ? m + 1 : m) * ulp;
  return static_cast<float>(std::copysign(r, v));
}

/// Bound on |fp32 sum - exact sum| for n terms in any summation order: (n - 1) u sum|terms|
/// (products of BF16 / FP8 values are exact in fp32, so summation is the only error).
inline double fp32_sum_bound(int n, double abs_sum) { return (n > 1 ? n - 1 : 1) * kU32 * abs_sum; }

/// Checks one BF16 output against the exact value: got = bf16(s) with |s - exact| <= fp32_err,
/// so |got - exact| <= half an ulp at s (at most one ulp at exact, across a binade) + fp32_err.
inline ::testing::AssertionResult bf16_near(float got, double exact, double fp32_err) {
  const double tol = bf16_ulp(exact) + fp32_err;
  if (std::isfinite(got) && std::fabs(got - exact) <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "got " << got << ", exact " << exact << ", |diff| " << std::fabs(got - exact) << " > tol " << tol;
}

inline ::testing::AssertionResult near_abs(double got, double want, double tol) {
  if (std::isfinite(got) && std::fabs(got - want) <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "got " << got << ", want " << want << ", |diff| " << std::fabs(got - want) << " > tol " << tol;
}

inline std::vector<float> widen(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = to_float(v[i]);
  return out;
}

}  // namespace mtplab::ops::test
