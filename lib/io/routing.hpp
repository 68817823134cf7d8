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
#include <vector>

#include "io/trace.hpp"

namespace mtplab::io {

struct DistinctExperts {
  int batch = 0, rows = 0;
  int windows = 0;
  double mean = 0;          ///< distinct experts per layer, mean over the routed layers and windows
  double p10 = 0, p90 = 0;  ///< of the per-(window, layer) counts
  double uniform = 0;       ///< E (1 - (1 - top_k / E)^(B R)): independent uniform routing
};

/// The distinct experts of `windows` windows of `batch` sequences x `rows` rows of `trace`'s
/// recorded routing (header comment), windows drawn from `seed`. Needs a trace with routing, at
/// least one routed layer and enough (sequence, start) pairs for `batch`; an Error naming the file
/// otherwise.
DistinctExperts distinct_experts(const TraceReader& trace, int batch, int rows, int windows, uint64_t seed);

/// The expected distinct experts of n rows each routed to top_k of `experts` experts uniformly at
/// random (without replacement within a row, independently across rows).
double uniform_distinct_experts(int64_t experts, int64_t top_k, int64_t n);

}  // namespace mtplab::io
