// Batched drafting across 2 ranks (MPI communicator, CPU backend): heads and experts split over
// the ranks (expert parallelism: rows routed to no expert of a rank), the head vocab-sharded, for
// every exchange protocol (bf16_lanes runs at 2 ranks only). A sequence's drafts at batch B must
// equal the single-sequence drafter's at the same world size, bit for bit (at 2 ranks an
// all-reduce sums each element as a + b, whatever the message size), and each batched step must
// issue exactly the collectives of one single-sequence step: per draft one all-reduce of the
// attention partials and one of the MoE partials, each [B, H], and ONE exchange collective
// carrying all B rows (keys, pairs, logits or lanes), whatever B. A counting communicator wraps
// the real one to check it. A failure on any rank fails the job.
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

const std::vector<io::TraceSequence>& shared_trace() { return test::shared_tiny_trace(18, 16, 24, 4); }

/// The collectives one batched step of `rows` rows must issue, checked against what it issued.
void expect_step_collectives(const std::vector<test::RecordingComm::Call>& calls, const Case& c, int rows,
                             int world, int hidden, int64_t stride, const std::string& where) {
  const bool sharded = c.sharding == model::HeadSharding::vocab && world > 1;
  int sums = 0, exchanges = 0, others = 0;
  for (const auto& call : calls) {
    const bool is_exchange =
        sharded &&
        ((c.exchange == drafter::Exchange::packed_u64 && call.kind == test::RecordingComm::max_u64) ||
         (c.exchange == drafter::Exchange::bf16_lanes && call.kind == test::RecordingComm::sum_bf16) ||
         ((c.exchange == drafter::Exchange::allgather_pairs ||
           c.exchange == drafter::Exchange::allgather_logits) &&
          call.kind == test::RecordingComm::gather));
    if (call.kind == test::RecordingComm::sum_f32) {
      ++sums;
      EXPECT_EQ(call.size, static_cast<size_t>(rows) * hidden) << where << ": a partial all-reduce";
    } else if (is_exchange) {
      ++exchanges;
      size_t want = 0;
      switch (c.exchange) {
        case drafter::Exchange::packed_u64:
          want = static_cast<size_t>(rows);  // one key per row
          break;
        case drafter::Exchange::allgather_pairs:
          want = static_cast<size_t>(rows) * sizeof(ops::ArgMax);
          break;
        case drafter::Exchange::allgather_logits:
          want = static_cast<size_t>(rows) * stride * sizeof(bf16);
          break;
        case drafter::Exchange::bf16_lanes:
          want = static_cast<size_t>(rows) * 8;
          break;
      }
      EXPECT_EQ(call.size, want) << where << ": the exchange carries every row";
    } else {
      ++others;
    }
  }
  EXPECT_EQ(sums, 2 * kDraft) << where << ": one attention and one MoE all-reduce per draft";
  EXPECT_EQ(exchanges, sharded ? kDraft : 0) << where << ": one exchange collective per draft for all rows";
  EXPECT_EQ(others, 0) << where;
}

}  // namespace

TEST(DrafterBatchMpi, BatchedDraftsAndCollectivesMatchTheSingleSequenceDrafter) {
  auto group = g_runtime->world_group();
  auto& comm = group.connect(dist::Transport::mpi);
  const int world = comm.size();
  const auto cfg = test::tiny_config(256);
  const auto& all = shared_trace();
  std::vector<Case> cases = {{model::HeadSharding::none, drafter::Exchange::packed_u64}};
  for (auto ex : {drafter::Exchange::packed_u64, drafter::Exchange::allgather_pairs,
                  drafter::Exchange::allgather_logits, drafter::Exchange::bf16_lanes}) {
    if (ex == drafter::Exchange::bf16_lanes && world != 2) continue;  // refused elsewhere (test_drafter_mpi)
    cases.push_back({model::HeadSharding::vocab, ex});
  }
  cases.push_back({model::HeadSharding::vocab, drafter::Exchange::packed_u64, drafter::ContextRows::full});
  struct Batch {
    int slots;
    size_t sequences;
  };
  for (const Case& c : cases) {
    drafter::DrafterOptions opt;
    opt.draft_len = kDraft;
    opt.head_sharding = c.sharding;
    opt.exchange = c.exchange;
    opt.context_rows = c.context;
    auto be = ops::make_cpu_backend();
    const auto plan = model::make_shard_plan(cfg, comm.rank(), world, opt.head_sharding);
    auto w = model::synthesize_mtp_weights(cfg, plan, 11);
    auto single = drafter::make_drafter(*be, &comm, cfg, w, opt);
    test::RecordingComm counting(comm);
    auto batched = drafter::make_drafter(*be, &counting, cfg, w, opt);
    const int64_t stride = batched->shard().stride;
    for (const Batch b : {Batch{1, 2}, Batch{3, 5}, Batch{16, 18}}) {
      if (c.context == drafter::ContextRows::full && b.slots != 3) continue;  // one size is enough there
      const std::vector<io::TraceSequence> trace(all.begin(),
                                                 all.begin() + static_cast<ptrdiff_t>(b.sequences));
      std::vector<int> prompts(b.sequences);
      for (size_t s = 0; s < b.sequences; ++s) prompts[s] = 3 + static_cast<int>((s * 13) % 23);
      const std::string where =
          name_of(c) + ", B = " + std::to_string(b.slots) + ", " + std::to_string(world) + " ranks";
      const auto want = test::replay_single(*single, trace, prompts, kDraft, cfg.hidden);
      size_t before = 0;
      int steps_checked = 0;
      const auto got = test::replay_batched(
          *batched, trace, prompts, kDraft, cfg.hidden, b.slots, std::nullopt,
          [&](int) { before = counting.calls.size(); },
          [&](int rows) {
            const std::vector<test::RecordingComm::Call> step(
                counting.calls.begin() + static_cast<ptrdiff_t>(before), counting.calls.end());
            expect_step_collectives(step, c, rows, world, cfg.hidden, stride, where);
            ++steps_checked;
          });
      EXPECT_TRUE(got.drafts == want) << where;
      EXPECT_EQ(got.max_rows, b.slots) << where;
      EXPECT_EQ(steps_checked, got.batched_steps) << where;
    }
  }
}

int main(int argc, char** argv) {
  return test::mpi_test_main(argc, argv, [](dist::Runtime& runtime) {
    g_runtime = &runtime;
    return test::run_all_tests_on_every_rank(runtime);
  });
}
