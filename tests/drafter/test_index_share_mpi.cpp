// The index_share arm across 2 ranks (MPI communicator, CPU backend): attention heads and experts
// split over the ranks, the head replicated or vocab-sharded. The indexer is replicated, so
// sharing its selection changes no collective: a replay with index_share on issues exactly the
// collectives (kind and size, in order) of the same replay with it off. With it on, every head
// sharding and exchange gives the drafts of the reference arm (head replicated, packed_u64,
// cache_only) at the same world size, and a sequence's batched drafts (B = 3) equal its drafts
// alone. A failure on any rank fails the job.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "batch_replay.hpp"
#include "common/drafter.hpp"
#include "common/mpi.hpp"
#include "common/recording_comm.hpp"
#include "common/trace.hpp"
#include "dist/guard.hpp"
#include "dist/runtime.hpp"
#include "drafter/factory.hpp"
#include "model/weights.hpp"

using namespace mtplab;

namespace {
dist::Runtime* g_runtime = nullptr;

constexpr int kDraft = 3;

using Case = test::ShardCase;

/// 4 sequences of 40 tokens: most drafts past the tiny preset's dense window (19 rows).
const std::vector<io::TraceSequence>& shared_trace() { return test::shared_tiny_trace(4, 20, 20, 8); }

std::vector<int> prompts(size_t n) { return test::spread_prompts(n, 12, 7, 15); }

struct CaseRun {
  test::SequenceDrafts single, batched;
  std::vector<test::RecordingComm::Call> calls;  ///< the single-sequence replay's collectives
};

CaseRun run_case(const model::ModelConfig& cfg, dist::Communicator& comm, const Case& c, bool share) {
  auto be = ops::make_cpu_backend();
  const auto plan = model::make_shard_plan(cfg, comm.rank(), comm.size(), c.sharding);
  auto w = model::synthesize_mtp_weights(cfg, plan, 11);
  drafter::DrafterOptions opt;
  opt.draft_len = kDraft;
  opt.head_sharding = c.sharding;
  opt.exchange = c.exchange;
  opt.context_rows = c.context;
  opt.index_share = share;
  const auto& trace = shared_trace();
  const auto p = prompts(trace.size());
  CaseRun r;
  test::RecordingComm recording(comm);
  auto d = drafter::make_drafter(*be, &recording, cfg, w, opt);
  r.single = test::replay_single(*d, trace, p, kDraft, cfg.hidden);
  r.calls = recording.calls;
  auto b = drafter::make_drafter(*be, &comm, cfg, w, opt);
  r.batched = test::replay_batched(*b, trace, p, kDraft, cfg.hidden, 3).drafts;
  return r;
}

}  // namespace

TEST(IndexShareMpi, SameCollectivesAndShardingIndependentDrafts) {
  auto group = g_runtime->world_group();
  auto& comm = group.connect(dist::Transport::mpi);
  const auto cfg = test::tiny_config(256);
  const Case reference{model::HeadSharding::none, drafter::Exchange::packed_u64,
                       drafter::ContextRows::cache_only};
  const CaseRun ref = run_case(cfg, comm, reference, true);
  size_t drafted = 0;
  for (const auto& d : ref.single) drafted += d.size();
  ASSERT_GT(drafted, 0u);
  const std::vector<Case> cases = {
      reference,
      {model::HeadSharding::vocab, drafter::Exchange::packed_u64, drafter::ContextRows::full},
      {model::HeadSharding::vocab, drafter::Exchange::allgather_logits, drafter::ContextRows::cache_only},
      {model::HeadSharding::vocab, drafter::Exchange::bf16_lanes, drafter::ContextRows::cache_only},
  };
  for (const Case& c : cases) {
    const std::string where = name_of(c) + " at " + std::to_string(comm.size()) + " ranks";
    const CaseRun on = &c == &cases.front() ? ref : run_case(cfg, comm, c, true);
    const CaseRun off = run_case(cfg, comm, c, false);
    EXPECT_TRUE(on.single == ref.single) << where << ": drafts differ from the reference arm's";
    EXPECT_TRUE(on.batched == on.single) << where << ": batched drafts differ from the single-sequence ones";
    EXPECT_FALSE(on.calls.empty()) << where;
    EXPECT_EQ(on.calls, off.calls) << where << ": index_share changed the collectives";
  }
}

int main(int argc, char** argv) {
  return test::mpi_test_main(argc, argv, [](dist::Runtime& runtime) {
    g_runtime = &runtime;
    return test::run_all_tests_on_every_rank(runtime);
  });
}
