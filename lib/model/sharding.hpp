// The sharding plan: which experts, attention heads and lm_head rows one rank holds.
//
// Invariants:
// - Every split is balanced and contiguous: of `total` items over `world` ranks, rank r gets
//   total / world items, and the first total % world ranks one more, in rank order. Across
//   ranks every item is owned exactly once.
// - Experts are split over all ranks (EP = world); heads over all ranks (TP = world; q_b_proj
//   and kv_b_proj keep this rank's heads' rows, o_proj this rank's heads' columns, and the
//   partial o_proj outputs are all-reduced); the fused shared expert's intermediate dimension
//   over all ranks (gate/up rows, down columns: its partial output joins the routed experts'
//   in the same all-reduce); the target's dense MLP's intermediate dimension likewise (its
//   partial output is all-reduced as the MoE's); the indexer, router and norms are replicated.
// - lm_head: head_sharding vocab gives rank r rows [vocab.begin, vocab.end()) (uneven splits
//   allowed, as above); head_sharding none, or a single rank, gives the whole vocab.
// Policy (which splits are allowed at all) is ModelConfig::validate(tp, ep); the plan is only
// the arithmetic.
#pragma once
#include <cstdint>
#include <string>

#include "model/config.hpp"

namespace mtplab::model {

enum class HeadSharding { none, vocab };
/// The YAML spelling of each value, in enum order.
inline constexpr const char* kHeadShardingNames[] = {"none", "vocab"};
const char* to_string(HeadSharding s);

/// Half-open range [begin, begin + count).
struct Range {
  int64_t begin = 0;
  int64_t count = 0;
  int64_t end() const { return begin + count; }
  bool contains(int64_t i) const { return i >= begin && i < end(); }
  bool operator==(const Range&) const = default;
};

/// The balanced contiguous split of `total` items: rank r's range.
Range split_range(int64_t total, int rank, int world);

struct ShardPlan {
  int rank = 0;
  int world = 1;
  HeadSharding head_sharding = HeadSharding::none;
  Range experts;       ///< routed experts this rank owns (global ids)
  Range heads;         ///< attention heads this rank runs
  Range vocab;         ///< lm_head rows this rank sweeps (global token ids)
  Range shared_inter;  ///< columns of the fused shared expert (of cfg.shared_intermediate())
  Range dense_inter;   ///< columns of a dense-MLP trunk layer (of cfg.intermediate_size)
  int64_t total_vocab = 0;

  bool owns_expert(int e) const { return experts.contains(e); }
  /// True when this rank's head covers only part of the vocab (a cross-rank pick is needed).
  bool vocab_sharded() const { return vocab.count != total_vocab; }
};

/// The plan of `rank` in `world` for `cfg`. Checks 0 <= rank < world only; call
/// cfg.validate(world, world) for the policy.
ShardPlan make_shard_plan(const ModelConfig& cfg, int rank, int world, HeadSharding head_sharding);

}  // namespace mtplab::model
