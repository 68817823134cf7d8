// Random test inputs from any generator: RandomVectors<Gen> adds the vector draws to a generator
// class that provides uniform(lo, hi) (CRTP), so every test's generator hands out floats and
// BF16 values the same way whatever its engine.
#pragma once
#include <cstddef>
#include <vector>

#include "core/numeric.hpp"

namespace mtplab::test {

template <typename Gen>
class RandomVectors {
 public:
  /// n values uniform in [lo, hi).
  std::vector<float> floats(size_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (auto& x : v) x = self().uniform(lo, hi);
    return v;
  }
  /// n values uniform in [lo, hi), each rounded to BF16.
  std::vector<bf16> bf16s(size_t n, float lo, float hi) {
    std::vector<bf16> v(n);
    for (auto& x : v) x = to_bf16(self().uniform(lo, hi));
    return v;
  }

 private:
  Gen& self() { return static_cast<Gen&>(*this); }
};

}  // namespace mtplab::test
