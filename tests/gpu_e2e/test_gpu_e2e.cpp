// End to end on one GPU: the MtpDrafter on the CUDA backend against the CPU reference, and CUDA
// graphs against op-by-op launches, on the tiny and small presets (synthetic weights, traces of
// the synthetic target).
// - CUDA vs CPU (lockstep, e2e_util.hpp): drafts agree except at near-ties (the CPU's top-2
//   logit margin within the stated tolerance); every disagreement is printed with that margin,
//   how far the two head inputs differ, and whether the GPU head picked the best token of its own
//   input (always required). A few chained drafts whose input diverged upstream are allowed (see
//   the test). Also with the FP8 head (tiny).
// - cuda_graph on vs off: bit-identical drafts over whole replays (the graph replays the very
//   kernels the op-by-op path launches), at two draft lengths, with graphs reused across steps.
// Exits 77 (skipped) without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "e2e_util.hpp"

using namespace mtplab;

namespace {

struct Case {
  const char* preset;
  int max_seq_len, sequences, prompt, gen, k;
};
// tiny: index_topk 16, so the selection is sparse after ~20 rows; small: topk 512 (sparse past
// ~515 rows: the prompt of 560 gets there).
const Case kCases[] = {{"tiny", 512, 3, 40, 80, 3}, {"small", 1024, 2, 560, 36, 3}};

std::string case_name(const ::testing::TestParamInfo<Case>& p) { return p.param.preset; }

// Made in main and reset before it returns (no CUDA work during static destruction).
std::unique_ptr<ops::Backend> g_gpu;
ops::Backend& gpu() { return *g_gpu; }

class GpuE2e : public ::testing::TestWithParam<Case> {};

TEST_P(GpuE2e, CudaMatchesCpu) {
  const Case c = GetParam();
  const auto cfg = e2e::preset(c.preset, c.max_seq_len);
  auto cpu = ops::make_cpu_backend();
  const auto trace = e2e::make_trace(gpu(), cfg, c.sequences, c.prompt, c.gen, 5);
  // The FP8 head arm on tiny only: the small preset's CPU reference takes about a minute per arm.
  for (bool fp8 : {false, true}) {
    if (fp8 && std::string(c.preset) != "tiny") continue;
    auto w = e2e::one_rank_weights(cfg);
    drafter::DrafterOptions opt;
    opt.draft_len = c.k;
    opt.head_fp8 = fp8;
    auto ref = drafter::make_drafter(*cpu, nullptr, cfg, w, opt);
    auto dev = drafter::make_drafter(gpu(), nullptr, cfg, w, opt);
    ref->keep_head_inputs(true);
    dev->keep_head_inputs(true);
    e2e::LockstepReport report;
    for (const auto& seq : trace) e2e::lockstep(*ref, *dev, *cpu, w, fp8, seq, c.k, cfg.hidden, 8.0f, report);
    e2e::print_report(str(c.preset, fp8 ? " fp8 head" : " bf16 head", ", cuda vs cpu"), report);
    ASSERT_GT(report.compared, 20) << "too few drafts to compare";
    int upstream = 0;
    for (const auto& d : report.disagreements) {
      // The GPU head picked the best token of its own input: the head is right whatever y was.
      EXPECT_LE(d.head_gap, d.tolerance)
          << "seq " << d.sequence << " L " << d.position << " draft " << d.draft << ": the GPU's pick is "
          << d.head_gap << " below the best logit of its own head input";
      if (d.near_tie()) continue;
      // Not a near-tie at the head: the inputs y themselves diverged upstream. Allowed only on a
      // chained draft (its input is the previous draft's BF16 y and the rows those drafts wrote,
      // so a near-tie of a discrete choice inside the block, the router's top-k or the
      // indexer's top-k, at any earlier draft of the step changes y), and rarely.
      ++upstream;
      EXPECT_GE(d.draft, 1) << "seq " << d.sequence << " L " << d.position
                            << ": a first draft (true hidden) disagrees with CPU margin " << d.margin
                            << " > tolerance " << d.tolerance;
    }
    EXPECT_LE(upstream, std::max(1, report.compared / 50))
        << upstream << " disagreements of " << report.compared << " drafts are not head near-ties";
    // Near-ties are rare: a wrong kernel shows as many disagreements.
    EXPECT_GE(report.agreement(), 0.95);
  }
}

TEST_P(GpuE2e, GraphMatchesEager) {
  const Case c = GetParam();
  const auto cfg = e2e::preset(c.preset, c.max_seq_len);
  const auto trace = e2e::make_trace(gpu(), cfg, c.sequences, c.prompt, c.gen, 9);
  for (auto cr : {drafter::ContextRows::cache_only, drafter::ContextRows::full}) {
    auto w = e2e::one_rank_weights(cfg);
    drafter::DrafterOptions opt;
    opt.draft_len = c.k;
    opt.context_rows = cr;
    auto eager = drafter::make_drafter(gpu(), nullptr, cfg, w, opt);
    opt.cuda_graph = true;
    auto graphed = drafter::make_drafter(gpu(), nullptr, cfg, w, opt);
    for (int k : {c.k, 1}) {
      const auto a = e2e::replay_drafts(*eager, trace, k, cfg.hidden);
      const auto b = e2e::replay_drafts(*graphed, trace, k, cfg.hidden);
      ASSERT_FALSE(a.empty());
      EXPECT_EQ(a, b) << c.preset << " k " << k << " context_rows " << drafter::to_string(cr);
    }
    // One eager warm-up, then one recording per (k, sequence caches): far fewer than the steps.
    std::printf("[gpu-e2e] %s %s: %d graph recordings\n", c.preset, drafter::to_string(cr),
                graphed->graph_recordings());
    EXPECT_GE(graphed->graph_recordings(), 2);
    EXPECT_LE(graphed->graph_recordings(), 2 * c.sequences);
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, GpuE2e, ::testing::ValuesIn(kCases), case_name);

TEST(GpuE2eOptions, GraphNeedsCuda) {
  const auto cfg = e2e::preset("tiny", 128);
  auto cpu = ops::make_cpu_backend();
  auto w = e2e::one_rank_weights(cfg);
  drafter::DrafterOptions opt;
  opt.cuda_graph = true;
  EXPECT_THROW(drafter::make_drafter(*cpu, nullptr, cfg, w, opt), Error);
}

}  // namespace

int main(int argc, char** argv) {
  return e2e::gpu_test_main(
      argc, argv, g_gpu, "the end-to-end GPU tests need one", nullptr, [](ops::Backend& gpu) {
        // The default kernel policy with the environment's MTPLAB_* overrides (MTPLAB_CUDA_PDL=0 in
        // scripts/device/run.sh test's run without programmatic launch).
        std::vector<std::string> overridden;
        gpu.set_kernel_policy(ops::env_overrides(ops::KernelPolicy{}, &overridden));
        std::printf("end-to-end GPU tests on %s, kernel policy %s%s%s\n", gpu.device_name().c_str(),
                    ops::to_string(gpu.kernel_policy()).c_str(),
                    overridden.empty() ? "" : "; from the environment: ", join(overridden, ", ").c_str());
      });
}
