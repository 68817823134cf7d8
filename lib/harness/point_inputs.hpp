// The inputs a point reads, cached across points: its trace, its weight shard and, for sampling
// verification, the target's log-probability of every trace token. Consecutive points usually
// share them (a sweep of arms over one model and trace), and loading them (or synthesising a
// trace at the glm5.3-flash shape) costs more than many points' replays.
//
// Invariants:
// - A cache entry is keyed by a struct of everything that determines it (the resolved model, the
//   trace or weights spec, the sequences taken, the head sharding), compared field by field.
// - The trace is identical on every rank: a synthetic trace is generated on rank 0 and broadcast.
// - The target log-probabilities are computed by every rank together (MtpDrafter::target_logprobs
//   is collective), so every rank holds the same values.
#pragma once
#include <optional>
#include <vector>

#include "dist/runtime.hpp"
#include "drafter/drafter.hpp"
#include "harness/experiment.hpp"
#include "io/trace.hpp"
#include "model/weights.hpp"
#include "ops/ops.hpp"

namespace mtplab::harness {

/// What a point's trace depends on.
struct TraceKey {
  model::ModelConfig model;
  TraceSpec trace;
  uint64_t weights_seed = 0;  ///< a synthetic trace's target shares the drafter's weights seed
  int take = 0;               ///< measure.sequences
  friend bool operator==(const TraceKey&, const TraceKey&) = default;
};

/// What a point's weight shard depends on.
struct WeightsKey {
  model::ModelConfig model;
  WeightsSpec weights;
  model::HeadSharding head_sharding = model::HeadSharding::none;
  friend bool operator==(const WeightsKey&, const WeightsKey&) = default;
};

/// What the target's log-probabilities of a point's trace depend on: the trace, the lm_head (the
/// weights and how they are sharded: the sharded combine sums in another order) and the transform.
struct TargetKey {
  TraceKey trace;
  WeightsKey weights;
  double temperature = 1.0;
  int top_k = 0;
  double top_p = 1.0;
  friend bool operator==(const TargetKey&, const TargetKey&) = default;
};

TraceKey trace_key(const PointConfig& p);
WeightsKey weights_key(const PointConfig& p);
TargetKey target_key(const PointConfig& p);

/// One cached trace and one cached weight shard, for the points of one run.
class PointInputs {
 public:
  PointInputs(ops::Backend& be, const dist::Group& world, int rank, int world_size)
      : be_(be), world_(world), rank_(rank), world_size_(world_size) {}
  /// The point's sequences (the first measure.sequences of the trace), identical on every rank.
  /// Collective over the world when the trace is synthetic and not cached.
  const std::vector<io::TraceSequence>& trace(const PointConfig& p);
  /// The prompts of an online point (the first measure.sequences of its trace, or all): a trace
  /// file's prompts (each sequence's first prompt_length tokens), or a synthetic trace's
  /// (PromptGenerator(trace.synthetic.seed), prompt_len tokens each; nothing is generated). Each
  /// prompt's index is its sequence's. Read by every rank alike (rank-local inputs).
  std::vector<Prompt> prompts(const PointConfig& p) const;
  /// This rank's weight shard for the point.
  model::MtpWeights& weights(const PointConfig& p);
  /// For each of the point's sequences (trace(p), same order), log p(tokens[t]) at every trace
  /// position t >= prompt_length under the point's transform (NaN before it): the target's own
  /// head on the trace's hidden h_{t-1}, through `drafter` (built from weights(p)). Collective.
  /// Refuses, naming the trace, the sequence and the position, a token outside the target's
  /// truncated support (a trace sampled with the point's top-k / top-p cannot hold one).
  const std::vector<std::vector<float>>& target_logprobs(const PointConfig& p, drafter::MtpDrafter& drafter);

 private:
  ops::Backend& be_;
  const dist::Group& world_;
  int rank_ = 0;
  int world_size_ = 1;
  std::optional<TraceKey> trace_key_;
  std::vector<io::TraceSequence> trace_;
  std::optional<WeightsKey> weights_key_;
  model::MtpWeights weights_;
  std::optional<TargetKey> target_key_;
  std::vector<std::vector<float>> target_logprobs_;
};

}  // namespace mtplab::harness
