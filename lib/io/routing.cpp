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

RoutingBatches::RoutingBatches(const TraceReader& trace, int rows) : path_(trace.path()), rows_(rows) {
  MTP_REQUIRE(trace.has_routing(), trace.path(), ": the trace records no routing (docs/trace-format.md, ",
              "\"Routing\"; mtplab trace --routing writes one)");
  MTP_REQUIRE(rows >= 1, "routing batches: ", rows, " rows per sequence (>= 1)");
  shape_ = trace.routing_shape();
  for (int64_t s = 0; s < trace.num_sequences(); ++s) {
    ids_.push_back(trace.routing(s));
    const int64_t length = trace.sequence_length(s);
    for (int64_t t = trace.prompt_length(s); t + rows <= length; ++t)
      places_.emplace_back(static_cast<int>(s), static_cast<int>(t));
  }
  for (int64_t l = 0; l < shape_.layers; ++l)
    if (ids_[0][static_cast<size_t>(l * shape_.top_k)] >= 0) routed_.push_back(static_cast<int>(l));
  MTP_REQUIRE(!routed_.empty(), trace.path(), ": every recorded layer is a dense MLP (no routed experts)");
}

std::vector<std::pair<int, int>> RoutingBatches::draw(int batch, std::mt19937_64& rng) const {
  MTP_REQUIRE(batch >= 1 && static_cast<int64_t>(places_.size()) >= batch, path_, ": ", places_.size(),
              " places of ", rows_, " generated rows, fewer than the batch of ", batch);
  // A partial Fisher-Yates shuffle of the place indices.
  std::vector<int> pick(places_.size());
  for (size_t i = 0; i < pick.size(); ++i) pick[i] = static_cast<int>(i);
  std::vector<std::pair<int, int>> out;
  for (int b = 0; b < batch; ++b) {
    std::uniform_int_distribution<size_t> u(static_cast<size_t>(b), pick.size() - 1);
    std::swap(pick[static_cast<size_t>(b)], pick[u(rng)]);
    out.push_back(places_[static_cast<size_t>(pick[static_cast<size_t>(b)])]);
  }
  return out;
}

std::vector<int32_t> RoutingBatches::ids(const std::vector<std::pair<int, int>>& places, int layer) const {
  const int64_t K = shape_.top_k, W = shape_.row_width();
  std::vector<int32_t> out;
  out.reserve(places.size() * static_cast<size_t>(rows_ * K));
  for (const auto& [s, t] : places) {
    const std::vector<int32_t>& r = ids_[static_cast<size_t>(s)];
    for (int i = 0; i < rows_; ++i)
      for (int64_t j = 0; j < K; ++j) out.push_back(r[static_cast<size_t>((t + i) * W + layer * K + j)]);
  }
  return out;
}

DistinctExperts distinct_experts(const TraceReader& trace, int batch, int rows, int windows, uint64_t seed) {
  MTP_REQUIRE(batch >= 1 && rows >= 1 && windows >= 1, "distinct experts: batch ", batch, ", rows ", rows,
              ", windows ", windows, " (each must be >= 1)");
  const RoutingBatches batches(trace, rows);
  std::mt19937_64 rng(seed);
  std::vector<double> counts;
  for (int w = 0; w < windows; ++w) {
    const auto places = batches.draw(batch, rng);
    for (int l : batches.routed_layers()) {
      const std::vector<int32_t> ids = batches.ids(places, l);
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
