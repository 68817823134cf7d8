// End to end on 2 GPUs (mpirun -np 2, one GPU per rank, NCCL communicator on the CUDA backend's
// stream): every head_sharding x exchange x context_rows arm, with cuda_graph off and on, gives
// exactly the drafts of the reference arm (none, packed_u64, cache_only, graphs off), as
// tests/drafter/test_drafter_mpi.cpp checks on the CPU. cuda_graph on with a vocab-sharded
// bf16_lanes exchange is refused. Exits 77 on every rank when the ranks see fewer GPUs than ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "common/exchange_arms.hpp"
#include "common/mpi.hpp"
#include "dist/guard.hpp"
#include "dist/runtime.hpp"
#include "e2e_util.hpp"

using namespace mtplab;

namespace {
dist::Runtime* g_runtime = nullptr;
ops::Backend* g_gpu = nullptr;

std::vector<std::vector<int32_t>> run_arm(const model::ModelConfig& cfg, dist::Communicator& comm,
                                          const std::vector<io::TraceSequence>& trace,
                                          drafter::DrafterOptions opt, int k) {
  const auto plan = model::make_shard_plan(cfg, comm.rank(), comm.size(), opt.head_sharding);
  auto w = model::synthesize_mtp_weights(cfg, plan, 11);
  auto d = drafter::make_drafter(*g_gpu, &comm, cfg, w, opt);
  return e2e::replay_drafts(*d, trace, k, cfg.hidden);
}

void check_arms(const char* preset, int max_seq_len, int prompt, int gen) {
  auto group = g_runtime->world_group();
  auto& comm = group.connect(dist::Transport::nccl, g_gpu->native_stream());
  const auto cfg = e2e::preset(preset, max_seq_len);
  // Every rank generates the trace on its GPU (deterministic kernels), then takes rank 0's, so
  // the inputs are identical by construction.
  auto trace = e2e::make_trace(*g_gpu, cfg, 2, prompt, gen, 3);
  for (auto& seq : trace) {
    dist::broadcast(group, std::span<int32_t>(seq.tokens));
    dist::broadcast(group, std::span<bf16>(seq.hiddens));
  }
  const int k = 3;
  drafter::DrafterOptions ref_opt;
  ref_opt.draft_len = k;
  const auto reference = run_arm(cfg, comm, trace, ref_opt, k);
  ASSERT_FALSE(reference.empty());
  int arms = 0;
  for (bool graph : {false, true}) {
    for (const test::ExchangeArm& arm : test::exchange_arms(ref_opt)) {
      drafter::DrafterOptions opt = arm.opt;
      opt.cuda_graph = graph;
      const std::string name = str(preset, " ", arm.name, graph ? "/graph" : "");
      const bool sharded = opt.head_sharding == model::HeadSharding::vocab && comm.size() > 1;
      if (sharded && opt.exchange == drafter::Exchange::bf16_lanes && (graph || comm.size() > 2)) {
        EXPECT_THROW(run_arm(cfg, comm, trace, opt, k), Error) << name;
        continue;
      }
      EXPECT_EQ(run_arm(cfg, comm, trace, opt, k), reference) << name << " at " << comm.size() << " ranks";
      ++arms;
    }
  }
  if (comm.rank() == 0)
    std::printf("[gpu-e2e-mpi] %s, world %d: %zu steps, %d arms identical to the reference\n", preset,
                comm.size(), reference.size(), arms);
}

TEST(GpuE2eMpi, TinyAllArmsGiveTheSameDrafts) { check_arms("tiny", 256, 24, 60); }
TEST(GpuE2eMpi, SmallAllArmsGiveTheSameDrafts) { check_arms("small", 1024, 540, 24); }

}  // namespace

int main(int argc, char** argv) {
  return test::mpi_test_main(argc, argv, [](dist::Runtime& runtime) {
    g_runtime = &runtime;
    const int gpus = runtime.min_visible_gpus();  // collective: called once, on every rank
    if (gpus < runtime.local_size()) {
      if (runtime.rank() == 0)
        std::printf("SKIPPED: %d rank(s) on this node but only %d visible GPU(s)\n", runtime.local_size(),
                    gpus);
      return 77;
    }
    const auto& dev = runtime.bind_device();
    auto be = ops::make_cuda_backend(dev.device);
    g_gpu = be.get();
    const int failed = test::run_all_tests_on_every_rank(runtime);
    g_gpu = nullptr;
    return failed;
  });
}
