// Helpers for the CPU reference tests: seeded random inputs, backend buffers poisoned before an
// op writes them, and the tolerance arithmetic every test states (BF16 ulp, fp32 summation bound).
//
// Invariants: inputs come from a seed that failures print (MTPLAB_TEST_SEED overrides it, so a
// failure reproduces and other seeds can be tried); poisoned floats are NaN (0xFF bytes), which
// no tolerance accepts, so an output the op forgot to write fails the test.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <numeric>
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

/// The generator of one test (tests/common/random.hpp): the run's seed mixed with a per-test salt.
class Rng : public ::mtplab::test::Rng {
 public:
  explicit Rng(uint64_t salt) : ::mtplab::test::Rng(::mtplab::test::salted(test_seed(), salt)) {}
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

// ---- batched rows --------------------------------------------------------------------------------

/// The batch sizes of the batched ops' tests.
inline constexpr int kBatches[] = {1, 3, 16, 64, 128};

/// Whether two vectors hold the same bytes (the first differing byte otherwise).
template <typename T>
::testing::AssertionResult same_bytes(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  const auto* a = reinterpret_cast<const uint8_t*>(got.data());
  const auto* b = reinterpret_cast<const uint8_t*>(want.data());
  const size_t bytes = got.size() * sizeof(T);
  for (size_t i = 0; i < bytes; ++i) {
    if (a[i] != b[i])
      return ::testing::AssertionFailure()
             << "first differing byte " << i << " (element " << i / sizeof(T) << " of " << got.size()
             << "): " << int(a[i]) << " vs " << int(b[i]);
  }
  return ::testing::AssertionSuccess();
}

inline std::string where(int rows) { return "B = " + std::to_string(rows) + "; " + seed_note(); }

/// The rows' slots: distinct slots of a pool of `slots` in shuffled order; with `pad`, rows 1, the
/// last and every 5th are padded (-1) when B >= 3, so padded rows sit between live ones.
inline std::vector<int32_t> make_slots(Rng& rng, int rows, int slots, bool pad = true) {
  std::vector<int32_t> all(static_cast<size_t>(slots));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<int32_t> s(all.begin(), all.begin() + rows);
  if (pad && rows >= 3) {
    for (int b = 0; b < rows; ++b)
      if (b == 1 || b == rows - 1 || b % 5 == 4) s[static_cast<size_t>(b)] = -1;
  }
  return s;
}

}  // namespace mtplab::ops::test
