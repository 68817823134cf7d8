// What the single-GPU benchmarks share: the copy bandwidth every floor is taken at, and the
// command line's pairs of choices.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/stats.hpp"
#include "ops/ops.hpp"

namespace mtplab::bench {

/// Device-to-device copy bandwidth in GB/s (bytes read + written): the median of 10 copies of
/// 1 GiB after 2 untimed ones.
inline double copy_bandwidth(ops::Backend& be) {
  const size_t bytes = size_t{1} << 30;
  ops::Array<uint8_t> a(be, bytes), b(be, bytes);
  be.fill_bytes(a.data(), 0x5a, bytes);
  auto e0 = be.make_event(), e1 = be.make_event();
  std::vector<double> gbps;
  for (int i = 0; i < 12; ++i) {
    e0->record();
    be.copy(b.data(), a.data(), bytes);
    e1->record();
    const double ms = be.elapsed_ms(*e0, *e1);
    if (i >= 2) gbps.push_back(2.0 * bytes / (ms * 1e-3) / 1e9);
  }
  return quantile(gbps, 0.5);
}

/// {a chosen, b chosen} of a comma list of `a` and / or `b` (checked by the command line).
inline std::array<bool, 2> pair_of(const std::vector<std::string>& items, const char* a, const char* b) {
  return {std::find(items.begin(), items.end(), a) != items.end(),
          std::find(items.begin(), items.end(), b) != items.end()};
}

}  // namespace mtplab::bench
