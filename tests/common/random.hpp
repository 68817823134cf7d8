// The tests' one random generator: splitmix64 (core/hash.hpp) with the draws the tests take from
// it (uniform floats, BF16 values, finite E4M3 codes, integers, normals, shuffles). It is a
// standard uniform random bit generator too, so the <random> distributions and std::shuffle take
// it. Seeds come from tests/common/seed.hpp (MTPLAB_TEST_SEED replays a run); a suite's helper
// mixes its run seed with a per-test salt (salted), so tests draw independent streams.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "core/hash.hpp"
#include "core/numeric.hpp"

namespace mtplab::test {

/// The seed of a test's stream: the run's seed mixed with the test's salt.
constexpr uint64_t salted(uint64_t run_seed, uint64_t salt) { return run_seed ^ (salt * kSplitmix64Gamma); }

class Rng {
 public:
  using result_type = uint64_t;
  explicit Rng(uint64_t seed = 0) : s_(seed) {}
  void seed(uint64_t seed) { s_ = seed; }
  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return std::numeric_limits<result_type>::max(); }
  result_type operator()() { return next(); }
  uint64_t next() { return splitmix64_next(s_); }

  /// Uniform in [lo, hi) (24 random bits: every value a float of the grid of 2^-24 steps).
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
  }
  /// Uniform in [lo, hi], both ends included.
  int integer(int lo, int hi) { return lo + static_cast<int>(next() % static_cast<uint64_t>(hi - lo + 1)); }
  /// Normal with mean 0 and standard deviation `stddev`.
  float normal(float stddev) { return std::normal_distribution<float>(0.0f, stddev)(*this); }

  /// n values uniform in [lo, hi).
  std::vector<float> floats(size_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (auto& x : v) x = uniform(lo, hi);
    return v;
  }
  /// n values uniform in [lo, hi), each rounded to BF16.
  std::vector<bf16> bf16s(size_t n, float lo, float hi) {
    std::vector<bf16> v(n);
    for (auto& x : v) x = to_bf16(uniform(lo, hi));
    return v;
  }
  /// n finite E4M3 codes of both signs (0x7f / 0xff are NaN and avoided), eight a draw.
  std::vector<fp8e4m3> fp8s(size_t n) {
    std::vector<fp8e4m3> v(n);
    for (size_t i = 0; i < n; i += 8) {
      uint64_t r = next();
      for (size_t j = i; j < std::min(n, i + 8); ++j, r >>= 8)
        v[j] = fp8_code(static_cast<uint8_t>(r & 0xff));
    }
    return v;
  }
  /// One finite E4M3 code from the top byte of a draw.
  fp8e4m3 fp8() { return fp8_code(static_cast<uint8_t>(next() >> 56)); }
  /// The elements of v in a random order (Fisher-Yates from the back).
  template <typename T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[next() % i]);
  }

 private:
  static fp8e4m3 fp8_code(uint8_t code) {
    if ((code & 0x7f) == 0x7f) code ^= 0x01;
    return fp8e4m3{code};
  }
  uint64_t s_;
};

}  // namespace mtplab::test
