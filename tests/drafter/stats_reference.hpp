// The sampling statistics of one row of logits recomputed directly, in fp64, by sorting: the
// reference the drafter's stats (ops::logit_stats_batch + combine, any sharding) are checked
// against. Independent of the ops' histogram method: it sorts the values, finds the k-th largest
// and the top-p cut by walking the sorted values, and sums every entry's exp on its own.
// Ties: every entry equal to a threshold value is kept (the rule of docs/drafter.md).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/numeric.hpp"
#include "drafter/options.hpp"
#include "ops/ops.hpp"

namespace mtplab::test {

struct RefStats {
  double margin = 0;
  double logprob = 0;      ///< of the argmax token (lowest id among ties)
  double req_logprob = 0;  ///< -inf outside the support
  int32_t argmax = -1;
  double tau = 0;           ///< the support's threshold logit (-inf: everything kept)
  bool in_support = false;  ///< whether the requested token is kept
};

/// `logits`: the whole vocab's BF16 logits as floats; `requested`: a token id.
inline RefStats reference_stats(const std::vector<float>& logits, int32_t requested,
                                const drafter::SamplingTransform& t) {
  const double inf = std::numeric_limits<double>::infinity();
  const size_t V = logits.size();
  std::vector<double> sorted(logits.begin(), logits.end());
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  RefStats r;
  const double top = sorted[0];
  r.margin = V > 1 ? top - sorted[1] : inf;
  r.argmax = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  double tau = -inf;
  if (t.top_k > 0 && static_cast<size_t>(t.top_k) < V) tau = sorted[static_cast<size_t>(t.top_k) - 1];
  auto mass = [&](double l) { return std::exp((l - top) / t.temperature); };
  if (t.top_p < 1.0) {
    double kept = 0;
    for (double l : sorted)
      if (l >= tau) kept += mass(l);
    double cum = 0;
    for (size_t i = 0; i < V && sorted[i] >= tau;) {
      // Every entry of this value together: the cut never splits equal logits.
      size_t j = i;
      while (j < V && sorted[j] == sorted[i]) cum += mass(sorted[j++]);
      if (cum >= t.top_p * kept) {
        tau = sorted[i];
        break;
      }
      i = j;
    }
  }
  double Z = 0;
  for (float l : logits)
    if (l >= tau) Z += mass(l);
  r.tau = tau;
  r.logprob = (logits[static_cast<size_t>(r.argmax)] - top) / t.temperature - std::log(Z);
  const double ly = logits[static_cast<size_t>(requested)];
  r.in_support = ly >= tau;
  r.req_logprob = r.in_support ? (ly - top) / t.temperature - std::log(Z) : -inf;
  return r;
}

/// The whole vocab's BF16 logits W y (as the drafter's head computes them: the CPU backend's
/// head_argmax on host memory), BF16 W [V, H] or FP8 W with row scales.
inline std::vector<float> head_logits(ops::Backend& cpu, const bf16* W, const fp8e4m3* W8, const float* scale,
                                      const bf16* y, int V, int H) {
  std::vector<bf16> l(static_cast<size_t>(V));
  ops::ArgMax am{};
  cpu.head_argmax(W, W8, scale, y, V, H, 0, l.data(), &am);
  std::vector<float> out(l.size());
  for (size_t i = 0; i < l.size(); ++i) out[i] = to_float(l[i]);
  return out;
}

/// |a - b| within rel * |b| + abs, with -inf == -inf (log q outside the support).
inline bool close(double a, double b, double rel, double abs) {
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return std::abs(a - b) <= rel * std::abs(b) + abs;
}

/// A token outside the support of `logits` under `t` (one with the smallest logit: outside
/// whenever the transform truncates at all), and one inside it other than the argmax when one
/// exists (the runner-up).
inline int32_t lowest_token(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::min_element(logits.begin(), logits.end()) - logits.begin());
}
inline int32_t runner_up(const std::vector<float>& logits) {
  const size_t top = static_cast<size_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  size_t best = top == 0 ? 1 : 0;
  for (size_t i = 0; i < logits.size(); ++i)
    if (i != top && logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

}  // namespace mtplab::test
