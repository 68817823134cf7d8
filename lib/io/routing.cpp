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

RoutingBatches::RoutingBatches(const TraceReader& trace) : path_(trace.path()) {
  MTP_REQUIRE(trace.has_routing(), trace.path(), ": the trace records no routing (docs/trace-format.md, ",
              "\"Routing\"; mtplab trace --routing writes one)");
  shape_ = trace.routing_shape();
  for (int64_t s = 0; s < trace.num_sequences(); ++s) {
    ids_.push_back(trace.routing(s));
    spans_.emplace_back(trace.prompt_length(s), static_cast<int>(trace.sequence_length(s)));
  }
  for (int64_t l = 0; l < shape_.layers; ++l)
    if (ids_[0][static_cast<size_t>(l * shape_.top_k)] >= 0) routed_.push_back(static_cast<int>(l));
  MTP_REQUIRE(!routed_.empty(), trace.path(), ": every recorded layer is a dense MLP (no routed experts)");
}

std::vector<std::pair<int, int>> RoutingBatches::draw(int batch, int rows, std::mt19937_64& rng) const {
  MTP_REQUIRE(rows >= 1, "routing batches: ", rows, " rows per sequence (>= 1)");
  std::vector<std::pair<int, int>> places;  // every (sequence, start) where `rows` generated rows fit
  for (size_t s = 0; s < spans_.size(); ++s)
    for (int t = spans_[s].first; t + rows <= spans_[s].second; ++t)
      places.emplace_back(static_cast<int>(s), t);
  MTP_REQUIRE(batch >= 1 && static_cast<int64_t>(places.size()) >= batch, path_, ": ", places.size(),
              " places of ", rows, " generated rows, fewer than the batch of ", batch);
  // A partial Fisher-Yates shuffle: the first `batch` places.
  for (int b = 0; b < batch; ++b) {
    std::uniform_int_distribution<size_t> u(static_cast<size_t>(b), places.size() - 1);
    std::swap(places[static_cast<size_t>(b)], places[u(rng)]);
  }
  places.resize(static_cast<size_t>(batch));
  return places;
}

std::vector<int32_t> RoutingBatches::ids(const std::vector<std::pair<int, int>>& places, int rows,
                                         int layer) const {
  const int64_t K = shape_.top_k, W = shape_.row_width();
  std::vector<int32_t> out;
  out.reserve(places.size() * static_cast<size_t>(rows * K));
  for (const auto& [s, t] : places) {
    const std::vector<int32_t>& r = ids_[static_cast<size_t>(s)];
    for (int i = 0; i < rows; ++i)
      for (int64_t j = 0; j < K; ++j) out.push_back(r[static_cast<size_t>((t + i) * W + layer * K + j)]);
  }
  return out;
}

DistinctExperts distinct_experts(const RoutingBatches& batches, int batch, int rows, int windows,
                                 uint64_t seed) {
  MTP_REQUIRE(batch >= 1 && rows >= 1 && windows >= 1, "distinct experts: batch ", batch, ", rows ", rows,
              ", windows ", windows, " (each must be >= 1)");
  std::mt19937_64 rng(seed);
  std::vector<double> counts;
  for (int w = 0; w < windows; ++w) {
    const auto places = batches.draw(batch, rows, rng);
    for (int l : batches.routed_layers()) {
      const std::vector<int32_t> ids = batches.ids(places, rows, l);
      counts.push_back(static_cast<double>(std::set<int32_t>(ids.begin(), ids.end()).size()));
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
  d.uniform = uniform_distinct_experts(batches.shape().experts, batches.shape().top_k,
                                       static_cast<int64_t>(batch) * rows);
  return d;
}

}  // namespace mtplab::io
