// What a verify batch's routing costs in bytes: the distinct routed experts of B sequences x R
// consecutive rows, from a trace that records routing (docs/trace-format.md, "Routing").
//
// A verify step of B sequences runs R = k + 1 consecutive rows of each through every layer; the
// routed-expert bytes it reads are the distinct experts of those B x R rows at each layer. Random
// routing picks top_k of E experts independently per row, so its expected count is
// E (1 - (1 - top_k / E)^(B R)); the rows of one sequence of a trained model share experts far
// more (consecutive tokens route alike), and so do the sequences of a batch on one kind of text.
// distinct_experts measures it on windows of a recorded routing: each window takes B (sequence,
// start) pairs, distinct, at generated positions (start >= the prompt length) where R rows fit,
// and counts the distinct ids at every routed layer; the figure is the mean over layers and
// windows.
#pragma once
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "io/trace.hpp"

namespace mtplab::io {

/// A trace's recorded routing, loaded once and cut into verify-shaped batches: B distinct
/// (sequence, start) places at generated positions (start >= the prompt length) where R rows fit,
/// and the ids of their rows at one routed layer. What distinct_experts counts and what
/// mtplab_bench_verify --routing runs the routed experts on.
class RoutingBatches {
 public:
  /// Loads every sequence's routing. Needs a trace with routing and at least one routed layer; an
  /// Error naming the file otherwise.
  explicit RoutingBatches(const TraceReader& trace);
  const TraceRouting& shape() const { return shape_; }
  /// The layers with routed experts (a dense layer records -1).
  const std::vector<int>& routed_layers() const { return routed_; }
  /// `batch` distinct places of `rows` rows drawn uniformly (an Error naming the file when there
  /// are fewer).
  std::vector<std::pair<int, int>> draw(int batch, int rows, std::mt19937_64& rng) const;
  /// The ids of `places`' `rows` rows at `layer`: [places x rows, top_k], place-major.
  std::vector<int32_t> ids(const std::vector<std::pair<int, int>>& places, int rows, int layer) const;

 private:
  std::string path_;
  TraceRouting shape_;
  std::vector<std::vector<int32_t>> ids_;
  std::vector<std::pair<int, int>> spans_;  // per sequence: prompt length, length
  std::vector<int> routed_;
};

struct DistinctExperts {
  int batch = 0, rows = 0;
  int windows = 0;
  double mean = 0;          ///< distinct experts per layer, mean over the routed layers and windows
  double p10 = 0, p90 = 0;  ///< of the per-(window, layer) counts
  double uniform = 0;       ///< E (1 - (1 - top_k / E)^(B R)): independent uniform routing
};

/// The distinct experts of `windows` windows of `batch` sequences x `rows` rows of a recorded
/// routing (header comment), windows drawn from `seed`. Needs enough (sequence, start) places for
/// `batch`; an Error naming the file otherwise.
DistinctExperts distinct_experts(const RoutingBatches& routing, int batch, int rows, int windows,
                                 uint64_t seed);

/// The expected distinct experts of n rows each routed to top_k of `experts` experts uniformly at
/// random (without replacement within a row, independently across rows).
double uniform_distinct_experts(int64_t experts, int64_t top_k, int64_t n);

}  // namespace mtplab::io
