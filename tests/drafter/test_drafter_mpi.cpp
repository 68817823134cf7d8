// The drafter across ranks (MPI communicator, CPU backend), at 1, 2, 4 and 8 ranks (tiny: one head,
// one routed expert and 8 of the shared expert's 64 columns a rank at 8):
// - every head_sharding x exchange x context_rows arm gives exactly the drafts of the reference
//   arm (none, packed_u64, cache_only) at the same world size;
// - the rate at which drafts differ from the single-rank drafter (EP / TP partial sums change
//   the fp32 summation order) and from the FP8 head is printed for the record.
// A failure on any rank fails the job (gtest's exit code on every rank, MPI_Abort on errors).
#include <gtest/gtest.h>
#include <mpi.h>

#include "common/exchange_arms.hpp"
#include "common/mpi.hpp"
#include "common/trace.hpp"
#include "dist/guard.hpp"
#include "dist/runtime.hpp"
#include "drafter/factory.hpp"
#include "harness/replay.hpp"
#include "model/weights.hpp"

using namespace mtplab;

namespace {
dist::Runtime* g_runtime = nullptr;

struct ArmResult {
  std::string name;
  std::vector<std::vector<int32_t>> drafts;
};

std::vector<std::vector<int32_t>> run_arm(const model::ModelConfig& cfg, dist::Communicator& comm,
                                          const std::vector<io::TraceSequence>& trace,
                                          drafter::DrafterOptions opt, int k) {
  auto be = ops::make_cpu_backend();
  const auto plan = model::make_shard_plan(cfg, comm.rank(), comm.size(), opt.head_sharding);
  auto w = model::synthesize_mtp_weights(cfg, plan, 11);
  auto d = drafter::make_drafter(*be, &comm, cfg, w, opt);
  std::vector<std::vector<int32_t>> out;
  harness::AcceptanceStats stats;
  for (const auto& seq : trace)
    for (auto& step : harness::replay_sequence(*d, seq, static_cast<int>(seq.index), k, cfg.hidden, stats))
      out.push_back(step.drafts);
  return out;
}

double differ_rate(const std::vector<std::vector<int32_t>>& a, const std::vector<std::vector<int32_t>>& b) {
  // Steps align only while both replays accepted the same counts; compare first drafts of the
  // common prefix of steps.
  size_t n = std::min(a.size(), b.size()), diff = 0;
  for (size_t i = 0; i < n; ++i) diff += a[i][0] != b[i][0];
  return n ? static_cast<double>(diff) / n : 0.0;
}
}  // namespace

TEST(DrafterMpi, AllArmsGiveTheSameDrafts) {
  auto group = g_runtime->world_group();
  auto& comm = group.connect(dist::Transport::mpi);
  const auto cfg = test::tiny_config(256);
  auto be = ops::make_cpu_backend();
  const auto trace = test::make_trace(*be, cfg, 2, 20, 60, 3);
  const int k = 3;
  drafter::DrafterOptions ref_opt;
  ref_opt.draft_len = k;
  const auto reference = run_arm(cfg, comm, trace, ref_opt, k);
  ASSERT_FALSE(reference.empty());
  for (const test::ExchangeArm& arm : test::exchange_arms(ref_opt)) {
    const drafter::DrafterOptions& opt = arm.opt;
    if (opt.exchange == drafter::Exchange::bf16_lanes && opt.head_sharding == model::HeadSharding::vocab &&
        comm.size() > 2) {
      EXPECT_THROW(run_arm(cfg, comm, trace, opt, k), Error) << arm.name;
      continue;
    }
    EXPECT_EQ(run_arm(cfg, comm, trace, opt, k), reference) << arm.name << " at " << comm.size() << " ranks";
  }
  // For the record: against one rank, and FP8 against BF16.
  auto solo = g_runtime->make_group(comm.rank(), 0);  // a group of one: the single-rank drafter
  const double solo_rate =
      differ_rate(run_arm(cfg, solo.connect(dist::Transport::mpi), trace, ref_opt, k), reference);
  drafter::DrafterOptions fp8 = ref_opt;
  fp8.head_fp8 = true;
  fp8.head_sharding = model::HeadSharding::vocab;
  const double fp8_rate = differ_rate(run_arm(cfg, comm, trace, fp8, k), reference);
  if (comm.rank() == 0)
    std::printf(
        "[drafter-mpi] world %d: %zu steps; first drafts differing from one rank %.3f, FP8 head vs BF16 "
        "%.3f\n",
        comm.size(), reference.size(), solo_rate, fp8_rate);
}

int main(int argc, char** argv) {
  return test::mpi_test_main(argc, argv, [](dist::Runtime& runtime) {
    g_runtime = &runtime;
    return test::run_all_tests_on_every_rank(runtime);
  });
}
