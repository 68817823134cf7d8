// The target (drafter/target.hpp) on CUDA against the CPU reference, tiny preset, 3 layers with the
// first one dense (the dense MLP runs on the shared-expert kernels of moe_experts_grouped, no
// routed expert): prefill of 3 prompts, then verify steps of 1 .. 5 rows per sequence with stats
// and logits, the same rows on both backends. The backends sum in other orders, so bits may
// differ:
// - every hidden row finite, the mean |diff| under 1% of the row's RMS, 95% of the rows within 1/8
//   of the RMS everywhere (an indexer or router near-tie can move a whole row; a wrong slot,
//   position, layer or MLP would move all of them by the hidden's scale);
// - a row's token agrees wherever the CPU's top-2 margin exceeds the tolerance (16 BF16 steps of
//   the largest logit), and in at least 95% of the rows;
// - the CUDA stats are the CPU stats ops' on the CUDA logits (the stats pass is exact);
// - one dense layer alone (the prompt inside the indexer's dense window): every hidden within 4
//   BF16 steps at the row's RMS of the CPU's.
// Exits 77 (skipped) without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "e2e_util.hpp"

using namespace mtplab;
using drafter::VerifyExtras;
using drafter::VerifyResult;
using drafter::VerifySeq;

namespace {

std::unique_ptr<ops::Backend> g_gpu;
ops::Backend& gpu() { return *g_gpu; }

model::ModelConfig dense_tiny() {
  model::ModelConfig cfg = test::tiny_config(256);
  cfg.first_k_dense_replace = 1;
  return cfg;
}

struct Outcome {
  std::vector<VerifyResult> results;
};

/// The fixed scenario on one backend (the rows do not depend on the results).
Outcome run(ops::Backend& be, const model::ModelConfig& cfg, int layers,
            const drafter::SamplingTransform& t) {
  auto target = drafter::make_synthetic_target(be, nullptr, cfg, layers, 7, 5, {});
  auto state = target->new_batch(3);
  std::mt19937 rng(41);
  auto tokens = [&](int n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = static_cast<int32_t>(rng() % static_cast<unsigned>(cfg.vocab));
    return v;
  };
  Outcome out;
  VerifyExtras x;
  x.transform = &t;
  x.logits = true;
  for (int len : {18, 37, 52})
    out.results.push_back(target->prefill(*state, target->new_sequence(*state), tokens(len), x));
  for (int step = 0; step < 6; ++step) {
    std::vector<std::vector<int32_t>> rows;
    std::vector<VerifySeq> seqs;
    std::vector<int> before;
    for (int b = 0; b < 3; ++b) {
      rows.push_back(tokens(1 + (b + step) % 5));
      before.push_back(state->seq_len(b));
    }
    for (int b = 0; b < 3; ++b) seqs.push_back(VerifySeq{b, rows[static_cast<size_t>(b)]});
    out.results.push_back(target->verify(*state, seqs, x));
    for (int b = 0; b < 3; ++b)
      target->rollback(
          *state, b,
          before[static_cast<size_t>(b)] + 1 + static_cast<int>(rows[static_cast<size_t>(b)].size()) / 2);
  }
  return out;
}

}  // namespace

TEST(GpuTarget, VerifyMatchesTheCpuTarget) {
  const model::ModelConfig cfg = dense_tiny();
  const int H = cfg.hidden, V = cfg.vocab;
  drafter::SamplingTransform t;
  t.temperature = 0.8;
  auto cpu = ops::make_cpu_backend();
  const Outcome ref = run(*cpu, cfg, 3, t);
  const Outcome dev = run(gpu(), cfg, 3, t);
  ASSERT_EQ(ref.results.size(), dev.results.size());
  int rows = 0, close_rows = 0, headed = 0, same_token = 0, clear = 0, clear_same = 0;
  double rel_sum = 0, stats_err = 0;
  for (size_t i = 0; i < ref.results.size(); ++i) {
    const VerifyResult& a = ref.results[i];
    const VerifyResult& b = dev.results[i];
    ASSERT_EQ(a.rows, b.rows);
    ASSERT_EQ(a.tokens.size(), b.tokens.size());
    for (int r = 0; r < a.rows; ++r) {
      double ss = 0, diff_sum = 0, diff_max = 0;
      for (int h = 0; h < H; ++h) {
        const size_t at = static_cast<size_t>(r) * H + h;
        const float x = to_float(a.hiddens[at]), y = to_float(b.hiddens[at]);
        ASSERT_TRUE(std::isfinite(y)) << "result " << i << " row " << r;
        ss += static_cast<double>(x) * x;
        diff_sum += std::fabs(x - y);
        diff_max = std::max(diff_max, static_cast<double>(std::fabs(x - y)));
      }
      const double rms = std::sqrt(ss / H);
      ++rows;
      rel_sum += diff_sum / H / rms;
      close_rows += diff_max <= rms / 8;
    }
    for (size_t r = 0; r < a.tokens.size(); ++r) {
      ++headed;
      same_token += a.tokens[r] == b.tokens[r];
      const bf16* la = a.logits.data() + r * static_cast<size_t>(V);
      float top = -INFINITY;
      for (int v = 0; v < V; ++v) top = std::max(top, std::fabs(to_float(la[v])));
      const float tol = 16 * e2e::bf16_ulp(top);
      if (a.stats[r].margin > tol) {
        ++clear;
        clear_same += a.tokens[r] == b.tokens[r];
        EXPECT_EQ(a.tokens[r], b.tokens[r])
            << "result " << i << " row " << r << " margin " << a.stats[r].margin;
      }
      // The stats of the CUDA logits, by the CPU stats op: the CUDA stats pass is exact.
      const bf16* lb = b.logits.data() + r * static_cast<size_t>(V);
      double m = -INFINITY;
      for (int v = 0; v < V; ++v) m = std::max(m, static_cast<double>(to_float(lb[v])));
      double z = 0;
      for (int v = 0; v < V; ++v) z += std::exp((to_float(lb[v]) - m) / t.temperature);
      stats_err = std::max(stats_err, std::fabs(-std::log(z) - b.stats[r].logprob));
    }
  }
  std::printf(
      "[ target on CUDA ] rows %d: within 1/8 RMS %d, mean |diff| / RMS %.5f; headed rows %d, same token %d; "
      "clear rows %d, same %d; |logprob - host(CUDA logits)| <= %.2e\n",
      rows, close_rows, rel_sum / rows, headed, same_token, clear, clear_same, stats_err);
  EXPECT_LT(rel_sum / rows, 0.01);
  EXPECT_GE(close_rows, rows * 95 / 100);
  EXPECT_GE(same_token, headed * 95 / 100);
  EXPECT_LT(stats_err, 1e-5);
}

TEST(GpuTarget, DenseLayerMatchesTheCpu) {
  const model::ModelConfig cfg = dense_tiny();
  const int H = cfg.hidden;
  std::vector<int32_t> prompt(16);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 389 + 17) % 4096);
  auto hiddens = [&](ops::Backend& be) {
    auto target = drafter::make_synthetic_target(be, nullptr, cfg, 1, 7, 5, {});
    EXPECT_EQ(target->dense_layers(), 1);
    auto state = target->new_batch(1);
    const int s = target->new_sequence(*state);
    return target->prefill(*state, s, prompt).hiddens;
  };
  auto cpu = ops::make_cpu_backend();
  const std::vector<bf16> a = hiddens(*cpu), b = hiddens(gpu());
  ASSERT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t r = 0; r < prompt.size(); ++r) {
    double ss = 0;
    for (int h = 0; h < H; ++h) ss += std::pow(to_float(a[r * H + h]), 2.0);
    const float step = e2e::bf16_ulp(static_cast<float>(std::sqrt(ss / H)));
    for (int h = 0; h < H; ++h)
      worst = std::max(
          worst, std::fabs(static_cast<double>(to_float(a[r * H + h]) - to_float(b[r * H + h]))) / step);
  }
  std::printf("[ target on CUDA ] one dense layer: worst difference %.1f BF16 steps at the row's RMS\n",
              worst);
  EXPECT_LE(worst, 4.0);
}

int main(int argc, char** argv) {
  return e2e::gpu_test_main(argc, argv, g_gpu, "the target's GPU tests need one", "target GPU tests");
}
