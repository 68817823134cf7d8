// The sharding arithmetic (see sharding.hpp for the rules).
#include "model/sharding.hpp"

#include <algorithm>

namespace mtplab::model {

const char* to_string(HeadSharding s) { return kHeadShardingNames[static_cast<int>(s)]; }

Range split_range(int64_t total, int rank, int world) {
  MTP_REQUIRE(world >= 1 && rank >= 0 && rank < world, "split_range: rank ", rank, " is not in [0, ", world,
              ")");
  MTP_REQUIRE(total >= 0, "split_range: negative total ", total);
  const int64_t base = total / world;
  const int64_t extra = total % world;
  Range r;
  r.count = base + (rank < extra ? 1 : 0);
  r.begin = rank * base + std::min<int64_t>(rank, extra);
  return r;
}

ShardPlan make_shard_plan(const ModelConfig& cfg, int rank, int world, HeadSharding head_sharding) {
  MTP_REQUIRE(world >= 1 && rank >= 0 && rank < world, "shard plan: rank ", rank, " is not in [0, ", world,
              ")");
  ShardPlan p;
  p.rank = rank;
  p.world = world;
  p.head_sharding = head_sharding;
  p.total_vocab = cfg.vocab;
  p.experts = split_range(cfg.n_routed_experts, rank, world);
  p.heads = split_range(cfg.n_heads, rank, world);
  p.shared_inter = split_range(cfg.shared_intermediate(), rank, world);
  p.dense_inter = split_range(cfg.intermediate_size, rank, world);
  p.vocab = head_sharding == HeadSharding::vocab ? split_range(cfg.vocab, rank, world) : Range{0, cfg.vocab};
  return p;
}

}  // namespace mtplab::model
