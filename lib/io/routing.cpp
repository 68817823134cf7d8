// The distinct experts of verify-shaped windows of a recorded routing (routing.hpp).
#include "io/routing.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <utility>

#include "core/error.hpp"
#include "core/stats.hpp"

namespace mtplab::io {

double uniform_distinct_experts(int64_t experts, int64_t top_k, int64_t n) {
  const double E = static_cast<double>(experts);
  return E * (1.0 - std::pow(1.0 - static_cast<double>(top_k) / E, static_cast<double>(n)));
}

DistinctExperts distinct_experts(const TraceReader& trace, int batch, int rows, int windows, uint64_t seed) {
  MTP_REQUIRE(trace.has_routing(), trace.path(), ": the trace records no routing (docs/trace-format.md, ",
              "\"Routing\"; mtplab trace --routing writes one)");
  MTP_REQUIRE(batch >= 1 && rows >= 1 && windows >= 1, "distinct experts: batch ", batch, ", rows ", rows,
              ", windows ", windows, " (each must be >= 1)");
  const TraceRouting& shape = trace.routing_shape();
  const int64_t K = shape.top_k, W = shape.row_width();
  // Every sequence's routing, and every (sequence, start) where `rows` generated rows fit.
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::pair<int, int>> starts;
  for (int64_t s = 0; s < trace.num_sequences(); ++s) {
    ids.push_back(trace.routing(s));
    const int64_t length = trace.sequence_length(s);
    for (int64_t t = trace.prompt_length(s); t + rows <= length; ++t)
      starts.emplace_back(static_cast<int>(s), static_cast<int>(t));
  }
  MTP_REQUIRE(static_cast<int64_t>(starts.size()) >= batch, trace.path(), ": ", starts.size(), " places of ",
              rows, " generated rows, fewer than the batch of ", batch);
  std::vector<int> routed;  // the layers with routed experts (a dense layer records -1)
  for (int64_t l = 0; l < shape.layers; ++l)
    if (ids[0][static_cast<size_t>(l * K)] >= 0) routed.push_back(static_cast<int>(l));
  MTP_REQUIRE(!routed.empty(), trace.path(), ": every recorded layer is a dense MLP (no routed experts)");

  std::mt19937_64 rng(seed);
  std::vector<double> counts;
  std::vector<int> pick(starts.size());
  for (int w = 0; w < windows; ++w) {
    // B distinct places: a partial Fisher-Yates shuffle.
    for (size_t i = 0; i < pick.size(); ++i) pick[i] = static_cast<int>(i);
    for (int b = 0; b < batch; ++b) {
      std::uniform_int_distribution<size_t> u(static_cast<size_t>(b), pick.size() - 1);
      std::swap(pick[static_cast<size_t>(b)], pick[u(rng)]);
    }
    for (int l : routed) {
      std::set<int32_t> seen;
      for (int b = 0; b < batch; ++b) {
        const auto [s, t] = starts[static_cast<size_t>(pick[static_cast<size_t>(b)])];
        const std::vector<int32_t>& r = ids[static_cast<size_t>(s)];
        for (int i = 0; i < rows; ++i)
          for (int64_t j = 0; j < K; ++j) seen.insert(r[static_cast<size_t>((t + i) * W + l * K + j)]);
      }
      counts.push_back(static_cast<double>(seen.size()));
    }
  }
  DistinctExperts d;
  d.batch = batch;
  d.rows = rows;
  d.windows = windows;
  double sum = 0;
  for (double c : counts) sum += c;
  d.mean = sum / static_cast<double>(counts.size());
  d.p10 = quantile(counts, 0.1);
  d.p90 = quantile(counts, 0.9);
  d.uniform = uniform_distinct_experts(shape.experts, K, static_cast<int64_t>(batch) * rows);
  return d;
}

}  // namespace mtplab::io
