// What the single-GPU benchmarks share: the copy bandwidth every byte floor is taken at, the
// tensor-core rate a compute floor is taken at, and the command line's pairs of choices.
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

/// The BF16 tensor-core rate in TFLOP/s: the median of 8 batched linears (cuBLASLt on CUDA) of
/// 8192 x 8192 x 8192 after 2 untimed ones. The compute floor of a GEMM-bound kernel, as the copy
/// bandwidth is the byte floor's.
inline double gemm_tflops(ops::Backend& be) {
  constexpr int n = 8192;
  const size_t elems = static_cast<size_t>(n) * n;
  ops::Array<bf16> w(be, elems), x(be, elems), y(be, elems);
  be.fill_bytes(w.data(), 0x3c, elems * sizeof(bf16));  // 0x3c3c: about 0.0115, finite sums
  be.fill_bytes(x.data(), 0x3c, elems * sizeof(bf16));
  auto e0 = be.make_event(), e1 = be.make_event();
  std::vector<double> tflops;
  for (int i = 0; i < 10; ++i) {
    e0->record();
    be.linear(w.data(), x.data(), y.data(), n, n, n, ops::RowsMode::batched);
    e1->record();
    const double ms = be.elapsed_ms(*e0, *e1);
    if (i >= 2) tflops.push_back(2.0 * n * static_cast<double>(n) * n / (ms * 1e-3) / 1e12);
  }
  return quantile(tflops, 0.5);
}

/// {a chosen, b chosen} of a comma list of `a` and / or `b` (checked by the command line).
inline std::array<bool, 2> pair_of(const std::vector<std::string>& items, const char* a, const char* b) {
  return {std::find(items.begin(), items.end(), a) != items.end(),
          std::find(items.begin(), items.end(), b) != items.end()};
}

}  // namespace mtplab::bench
