// The sharding plan: every expert / head / vocab row owned exactly once, balanced, contiguous.
#include <gtest/gtest.h>

#include <vector>

#include "model/sharding.hpp"

using namespace mtplab;
using namespace mtplab::model;

namespace {

/// Every item of [0, total) appears in exactly one rank's range; ranges are contiguous in rank
/// order and differ in size by at most one, the larger ones first.
void expect_exact_cover(const std::vector<Range>& ranges, int64_t total, const std::string& what) {
  std::vector<int> owners(static_cast<size_t>(total), 0);
  int64_t next = 0;
  for (size_t r = 0; r < ranges.size(); ++r) {
    const Range& g = ranges[r];
    EXPECT_EQ(g.begin, next) << what << " rank " << r;
    next = g.end();
    for (int64_t i = g.begin; i < g.end(); ++i) {
      ASSERT_GE(i, 0);
      ASSERT_LT(i, total) << what;
      ++owners[static_cast<size_t>(i)];
    }
    if (r > 0) {
      EXPECT_LE(g.count, ranges[r - 1].count) << what;
      EXPECT_GE(g.count + 1, ranges[0].count) << what;
    }
  }
  for (int64_t i = 0; i < total; ++i) ASSERT_EQ(owners[static_cast<size_t>(i)], 1) << what << " item " << i;
}

ModelConfig sizes(int vocab, int heads, int experts, int shared_inter = 64) {
  ModelConfig c;
  c.name = "sizes";
  c.vocab = vocab;
  c.n_heads = heads;
  c.n_routed_experts = experts;
  c.n_shared_experts = 1;
  c.moe_intermediate_size = shared_inter;
  return c;
}

}  // namespace

TEST(Sharding, CoversEveryItemExactlyOnceForWorld1To5) {
  // tiny, small, glm5.3-flash sizes, and awkward primes.
  const ModelConfig cases[] = {sizes(4096, 8, 8, 64), sizes(38912, 16, 64, 512), sizes(154880, 64, 288, 2048),
                               sizes(4099, 7, 13, 11), sizes(5, 3, 2, 3)};
  for (const ModelConfig& c : cases) {
    for (int world = 1; world <= 5; ++world) {
      std::vector<Range> experts, heads, vocab, shared;
      for (int rank = 0; rank < world; ++rank) {
        const ShardPlan p = make_shard_plan(c, rank, world, HeadSharding::vocab);
        EXPECT_EQ(p.rank, rank);
        EXPECT_EQ(p.world, world);
        experts.push_back(p.experts);
        heads.push_back(p.heads);
        vocab.push_back(p.vocab);
        shared.push_back(p.shared_inter);
        EXPECT_EQ(p.vocab_sharded(), world > 1);
        for (int64_t e = p.experts.begin; e < p.experts.end(); ++e)
          EXPECT_TRUE(p.owns_expert(static_cast<int>(e)));
        EXPECT_FALSE(p.owns_expert(static_cast<int>(p.experts.end())));
      }
      const std::string what = str("V", c.vocab, " h", c.n_heads, " E", c.n_routed_experts, " world ", world);
      expect_exact_cover(experts, c.n_routed_experts, what + " experts");
      expect_exact_cover(heads, c.n_heads, what + " heads");
      expect_exact_cover(vocab, c.vocab, what + " vocab");
      expect_exact_cover(shared, c.shared_intermediate(), what + " shared expert columns");
    }
  }
}

TEST(Sharding, UnevenRuleFirstRanksGetOneMore) {
  // 154880 = 3 * 51626 + 2: ranks 0 and 1 get 51627 rows, rank 2 gets 51626.
  EXPECT_EQ(split_range(154880, 0, 3), (Range{0, 51627}));
  EXPECT_EQ(split_range(154880, 1, 3), (Range{51627, 51627}));
  EXPECT_EQ(split_range(154880, 2, 3), (Range{103254, 51626}));
  // Fewer items than ranks: the last ranks get none.
  EXPECT_EQ(split_range(2, 2, 3), (Range{2, 0}));
  EXPECT_EQ(split_range(288, 3, 8), (Range{108, 36}));
}

TEST(Sharding, NoneOrSingleRankGivesTheWholeVocab) {
  const ModelConfig c = sizes(4099, 8, 8);
  for (int world = 1; world <= 4; ++world)
    for (int rank = 0; rank < world; ++rank) {
      const ShardPlan p = make_shard_plan(c, rank, world, HeadSharding::none);
      EXPECT_EQ(p.vocab, (Range{0, 4099}));
      EXPECT_FALSE(p.vocab_sharded());
    }
  const ShardPlan one = make_shard_plan(c, 0, 1, HeadSharding::vocab);
  EXPECT_EQ(one.vocab, (Range{0, 4099}));
  EXPECT_FALSE(one.vocab_sharded());
}

TEST(Sharding, BadRanksAreErrors) {
  const ModelConfig c = sizes(16, 2, 2);
  EXPECT_THROW(make_shard_plan(c, 2, 2, HeadSharding::none), Error);
  EXPECT_THROW(make_shard_plan(c, -1, 2, HeadSharding::none), Error);
  EXPECT_STREQ(to_string(HeadSharding::vocab), "vocab");
}
