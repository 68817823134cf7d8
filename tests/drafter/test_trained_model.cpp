// mtplab's CPU drafter on a trained model (data/trained-tiny/, data/trained-mini/; made by
// tools/train_tiny/) must reproduce the acceptance figures of the PyTorch oracle that replayed the
// same trace under the same rules (meta.json) within 1 percentage point: both compute in BF16 at
// the same rounding points and differ only by fp32 summation order, so only drafts whose top-2
// logits are within about one BF16 ulp can flip (docs/trained-tiny.md gives the count of such
// near-ties, about 1 in 10 deciding drafts at most, and each flip moves the rate by 1/steps).
// One executable per data folder, one test per greedy trace (trained_model.hpp).
#include <gtest/gtest.h>

#include <filesystem>

#include "drafter/factory.hpp"
#include "harness/replay.hpp"
#include "model/weights.hpp"
#include "trained_model.hpp"

using namespace mtplab;

namespace {
class Greedy : public ::testing::TestWithParam<std::string> {};
}  // namespace

TEST_P(Greedy, CpuDrafterReproducesTheOracleAcceptance) {
  const std::string dir = trained::data_dir();
  const std::string trace_name = GetParam();
  ASSERT_TRUE(std::filesystem::exists(dir + "/meta.json"))
      << dir << " is missing (tools/train_tiny makes it)";
  const trained::OracleFigures oracle = trained::oracle_figures(trace_name);
  const YamlNode& figs = oracle.figures;

  const model::ModelConfig cfg = model::load_model_preset(trained::config_path());
  auto be = ops::make_cpu_backend();
  const auto seqs = trained::read_sequences(dir + "/" + trace_name, cfg, oracle.sequences);
  ASSERT_FALSE(seqs.empty());
  for (int k = 1; k <= trained::max_k(); ++k) {
    const auto plan = model::make_shard_plan(cfg, 0, 1, model::HeadSharding::none);
    auto w = model::load_mtp_weights(cfg, plan, dir + "/model.safetensors");
    drafter::DrafterOptions opt;
    opt.draft_len = k;
    auto d = drafter::make_drafter(*be, nullptr, cfg, w, opt);
    harness::AcceptanceStats stats;
    for (const auto& seq : seqs)
      harness::replay_sequence(*d, seq, static_cast<int>(seq.index), k, cfg.hidden, stats);
    const YamlNode want = trained::child(figs, "k" + std::to_string(k));
    const double want_rate = trained::child(want, "acceptance_rate").as_double();
    const double want_tau = trained::child(want, "tau").as_double();
    std::printf(
        "[%s %s, %zu sequences] k=%d: mtplab rate %.4f tau %.4f | oracle rate %.4f tau %.4f (%lld steps)\n",
        MTPLAB_TRAINED_DIR, trace_name.c_str(), seqs.size(), k, stats.rate(), stats.tau(), want_rate,
        want_tau, static_cast<long long>(stats.steps));
    EXPECT_NEAR(stats.rate(), want_rate, 0.01) << "k=" << k;
    EXPECT_NEAR(stats.tau() - 1.0, want_tau - 1.0, 0.01 * k) << "k=" << k;  // tau - 1 = rate * k
    const auto pos = stats.per_position();
    const std::vector<double> want_pos = trained::doubles(trained::child(want, "per_position"));
    ASSERT_EQ(want_pos.size(), static_cast<size_t>(k));
    for (int i = 0; i < k; ++i) EXPECT_NEAR(pos[i], want_pos[i], 0.01) << "k=" << k << " position " << i + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(MTPLAB_TRAINED_SUITE, Greedy, ::testing::ValuesIn(trained::greedy_traces()),
                         [](const auto& p) { return trained::param_name(p.param); });
