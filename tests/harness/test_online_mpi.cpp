// Online runs across 2 ranks (MPI communicator, CPU backend): the target and the drafter sharded
// (heads, experts and MLP columns split; the head whole or vocab-split), on the weights of
// online_fixture.hpp (steps accept 0 .. k drafts):
// - online greedy at 2 ranks is the replay, at 2 ranks, of the trace the 2-rank target generated
//   from the same prompts: the same steps, drafts and accepted counts, bit for bit (a row's bits do
//   not depend on its forward at 2 ranks either: docs/target.md, "Bits");
// - its tokens are that trace's (lossless), and every rank takes the same decisions.
// Against one rank the partial sums change the fp32 summation order: a hidden differs in its last
// bits, and a router's or an indexer's choice or a head's near-tie can flip, after which the
// sequences part (docs/target.md); so 2 ranks are compared with their own target's trace.
// A failure on any rank fails the job.
#include <gtest/gtest.h>
#include <mpi.h>

#include "common/mpi.hpp"
#include "dist/runtime.hpp"
#include "dist/world_ops.hpp"
#include "online_fixture.hpp"

using namespace mtplab;
using namespace mtplab::harness;

namespace {
dist::Runtime* g_runtime = nullptr;

constexpr int kLayers = 2;
constexpr uint64_t kTargetSeed = 5;
constexpr int kNewTokens = 26;

struct Ranked {
  model::ModelConfig cfg = test::tiny_config(256);
  std::unique_ptr<ops::Backend> be = ops::make_cpu_backend();
  model::MtpWeights w;
  std::unique_ptr<drafter::Target> target;
  Ranked(dist::Communicator* comm, model::HeadSharding hs) {
    const int rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
    w = test::online_weights(cfg, rank, world, hs);
    drafter::TargetOptions o;
    o.head_sharding = hs;
    target = test::online_target(*be, comm, cfg, w, kLayers, kTargetSeed, o);
  }
  std::unique_ptr<drafter::MtpDrafter> drafter(dist::Communicator* comm, int k, model::HeadSharding hs) {
    drafter::DrafterOptions o;
    o.draft_len = k;
    o.head_sharding = hs;
    return drafter::make_drafter(*be, comm, cfg, w, o);
  }
};

OnlineRun run_of(int k, int B) {
  OnlineRun r;
  r.draft_len = k;
  r.batch_size = B;
  r.max_new_tokens = kNewTokens;
  return r;
}

// Every record's sequence, position, rows, accepted count and drafts, flattened (to compare runs and
// ranks).
std::vector<int32_t> flat(const std::vector<StepRecord>& steps) {
  std::vector<int32_t> out;
  for (const StepRecord& r : steps) {
    out.insert(out.end(), {r.sequence, r.position, r.batch_rows, r.accepted});
    out.insert(out.end(), r.drafts.begin(), r.drafts.end());
  }
  return out;
}

}  // namespace

TEST(OnlineMpi, TwoRanksAreTheReplayOfTheirTarget) {
  auto group = g_runtime->world_group();
  auto& comm = group.connect(dist::Transport::mpi);
  ASSERT_EQ(comm.size(), 2);
  const model::ModelConfig cfg = test::tiny_config(256);
  const auto prompts = test::online_prompts(5, static_cast<int>(cfg.vocab), 21);
  for (auto hs : {model::HeadSharding::none, model::HeadSharding::vocab}) {
    Ranked two(&comm, hs);
    const auto trace = test::online_trace(*two.target, prompts, kNewTokens);
    for (int k : {1, 3}) {
      auto d = two.drafter(&comm, k, hs);
      for (int B : {1, 3}) {
        SCOPED_TRACE(str(model::to_string(hs), ", k ", k, ", batch ", B));
        const test::OnlineOutcome on = test::run_online_collect(*two.target, d.get(), prompts, run_of(k, B));
        const test::OnlineOutcome re = test::replay_collect(*d, trace, B, k, cfg.hidden);
        const std::vector<int32_t> mine = flat(on.steps);
        EXPECT_EQ(mine, flat(re.steps));
        for (const OnlineSequence& q : on.seqs) {
          const io::TraceSequence& t = trace.at(static_cast<size_t>(q.index));
          // The trace holds max_new_tokens tokens; a last step's bonus token may lie one past them.
          const size_t n = std::min(q.tokens.size(), t.tokens.size());
          ASSERT_GE(n + 1, t.tokens.size() - static_cast<size_t>(k));
          EXPECT_TRUE(std::equal(q.tokens.begin(), q.tokens.begin() + static_cast<std::ptrdiff_t>(n),
                                 t.tokens.begin()))
              << "sequence " << q.index;
        }
        int64_t accepted = 0;
        for (const StepRecord& r : on.steps) accepted += r.accepted;
        EXPECT_GT(accepted, static_cast<int64_t>(on.steps.size()) / 4);
        // Rank 0's records on every rank.
        std::vector<int32_t> rank0 = mine;
        dist::broadcast(group, rank0);
        EXPECT_EQ(mine, rank0);
      }
    }
  }
}

int main(int argc, char** argv) {
  return test::mpi_test_main(argc, argv, [](dist::Runtime& runtime) {
    g_runtime = &runtime;
    return test::run_all_tests_on_every_rank(runtime);
  });
}
