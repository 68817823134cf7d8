// CUDA fused ops (linear_group, residual_add_rmsnorm) at the tiny, small and glm5.3-flash
// shapes: each must be bit-identical to the separate CUDA ops it replaces (same per-row
// reduction order: that is the contract that keeps the drafter's numerics unchanged), and close
// to the CPU reference under the usual tolerances (gpu_test_util.hpp; fp32 outputs 1e-5
// relative + 1e-4 of the largest, as test_gpu_dense's Linear).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"

namespace mtplab::ops::gputest {
namespace {

class GpuFused : public ::testing::TestWithParam<Shape> {};

struct Member {
  const char* name;
  int n_out;
  bool f32_out;
  float scale;
};

void check_group(const std::vector<Member>& members, int k, Rng& rng, const std::string& group) {
  Twin<bf16> x(rng.bf16s(static_cast<size_t>(k), -1.0f, 1.0f));
  std::vector<Twin<bf16>> W;
  std::vector<Twin<bf16>> yb;
  std::vector<Twin<float>> yf;
  W.reserve(members.size());
  yb.reserve(members.size());
  yf.reserve(members.size());
  std::vector<LinearOut> c_outs, g_outs;
  for (const Member& m : members) {
    W.emplace_back(rng.bf16s(static_cast<size_t>(m.n_out) * k, -1.0f, 1.0f));
    yb.push_back(out_twin<bf16>(static_cast<size_t>(m.n_out)));
    yf.push_back(out_twin<float>(static_cast<size_t>(m.n_out)));
    void* yc = m.f32_out ? static_cast<void*>(yf.back().c.data()) : static_cast<void*>(yb.back().c.data());
    void* yg = m.f32_out ? static_cast<void*>(yf.back().g.data()) : static_cast<void*>(yb.back().g.data());
    c_outs.push_back({W.back().c.data(), yc, m.n_out, m.f32_out, m.scale});
    g_outs.push_back({W.back().g.data(), yg, m.n_out, m.f32_out, m.scale});
  }
  cpu().linear_group(c_outs, x.c.data(), k);
  gpu().linear_group(g_outs, x.g.data(), k);
  for (size_t i = 0; i < members.size(); ++i) {
    const Member& m = members[i];
    const std::string what = group + " " + m.name;
    if (m.f32_out) {
      const auto fused = yf[i].from_gpu();
      expect_f32_close(fused, yf[i].from_cpu(), what + " vs cpu", 1e-5, 1e-4);
      auto sep = out_twin<float>(static_cast<size_t>(m.n_out));
      gpu().linear_f32(W[i].g.data(), x.g.data(), sep.g.data(), 1, m.n_out, k);
      if (m.scale != 1.0f) gpu().scale_f32(sep.g.data(), m.scale, m.n_out);
      expect_bytes_equal(fused, sep.from_gpu(), what + " fused vs separate gpu ops");
    } else {
      const auto fused = yb[i].from_gpu();
      expect_bf16_close(fused, yb[i].from_cpu(), what + " vs cpu");
      auto sep = out_twin<bf16>(static_cast<size_t>(m.n_out));
      gpu().linear(W[i].g.data(), x.g.data(), sep.g.data(), 1, m.n_out, k);
      expect_bytes_equal(fused, sep.from_gpu(), what + " fused vs separate gpu ops");
    }
  }
}

TEST_P(GpuFused, LinearGroupIsBitIdenticalToSeparateGemvs) {
  const Shape s = GetParam();
  Rng rng(31);
  const float w_scale = 1.0f / std::sqrt(static_cast<float>(s.index_heads));
  // Block::forward's group (every projection of u) and write_context_row's (the cache side).
  check_group({{"q_a", s.q_lora, false, 1.0f},
               {"kv_a", s.kv_lora, false, 1.0f},
               {"indexer.wk", s.index_dim, false, 1.0f},
               {"indexer.gate", s.index_dim, true, 1.0f},
               {"indexer.weights_proj", s.index_heads, true, w_scale}},
              s.hidden, rng, std::string(s.name) + " forward");
  check_group({{"kv_a", s.kv_lora, false, 1.0f},
               {"indexer.wk", s.index_dim, false, 1.0f},
               {"indexer.gate", s.index_dim, true, 1.0f}},
              s.hidden, rng, std::string(s.name) + " context");
  // Ragged sizes (partial blocks at every split) and a single large output.
  check_group({{"n1", 1, false, 1.0f}, {"n37", 37, true, 0.25f}, {"n301", 301, false, 1.0f}, {"n8", 8, true, 1.0f}},
              s.hidden, rng, std::string(s.name) + " ragged");
  check_group({{"router", s.experts, true, 1.0f}}, s.hidden, rng, std::string(s.name) + " single");
}

TEST_P(GpuFused, ResidualAddRmsnormIsBitIdenticalToTheTwoOps) {
  const Shape s = GetParam();
  Rng rng(32);
  const int H = s.hidden;
  const auto x_h = rng.bf16s(static_cast<size_t>(H), -3.0f, 3.0f);
  Twin<bf16> x(x_h);
  Twin<float> delta(rng.floats(static_cast<size_t>(H), -2.0f, 2.0f));
  Twin<bf16> w(rng.bf16s(static_cast<size_t>(H), 0.5f, 1.5f));
  auto y = out_twin<bf16>(static_cast<size_t>(H));
  auto normed = out_twin<bf16>(static_cast<size_t>(H));
  cpu().residual_add_rmsnorm(x.c.data(), delta.c.data(), y.c.data(), w.c.data(), normed.c.data(), H, 1e-5f);
  gpu().residual_add_rmsnorm(x.g.data(), delta.g.data(), y.g.data(), w.g.data(), normed.g.data(), H, 1e-5f);
  const auto y_g = y.from_gpu(), n_g = normed.from_gpu();
  expect_bytes_equal(y_g, y.from_cpu(), "y vs cpu (one IEEE add and one rounding: exact)");
  expect_bf16_close(n_g, normed.from_cpu(), "normed vs cpu");

  auto y2 = out_twin<bf16>(static_cast<size_t>(H));
  auto n2 = out_twin<bf16>(static_cast<size_t>(H));
  gpu().residual_add(x.g.data(), delta.g.data(), y2.g.data(), H);
  gpu().rmsnorm(y2.g.data(), w.g.data(), n2.g.data(), 1, H, 1e-5f);
  expect_bytes_equal(y_g, y2.from_gpu(), "y fused vs separate gpu ops");
  expect_bytes_equal(n_g, n2.from_gpu(), "normed fused vs separate gpu ops");

  // In place (y aliases x), as the block's residuals use it.
  gpu().residual_add_rmsnorm(x.g.data(), delta.g.data(), x.g.data(), w.g.data(), n2.g.data(), H, 1e-5f);
  expect_bytes_equal(x.from_gpu(), y_g, "y in place");
  expect_bytes_equal(n2.from_gpu(), n_g, "normed in place");
}

// moe_experts_shared: the routed experts and the shared expert's slice in one pass. Bit-identical
// to moe_experts of each plus accumulate_f32 on the GPU (the block's former three ops), and close
// to the CPU under test_gpu_moe's expert tolerance (2^-7 relative + 2^-8 of the largest). Cases:
// all routed experts owned, half owned (another rank has the rest), none owned, and the shared
// slice of 2 ranks (half the intermediate rows).
TEST_P(GpuFused, MoeExpertsSharedIsBitIdenticalToTheSeparateOps) {
  const Shape s = GetParam();
  Rng rng(33);
  const int H = s.hidden, I = s.moe_inter, k = s.top_k;
  const int num_local = std::min(s.experts, 12);
  const size_t per = static_cast<size_t>(I) * H;
  Twin<bf16> gate(rng.bf16s(per * num_local, -1.0f, 1.0f));
  Twin<bf16> up(rng.bf16s(per * num_local, -1.0f, 1.0f));
  Twin<bf16> down(rng.bf16s(per * num_local, -0.1f, 0.1f));
  Twin<bf16> sg(rng.bf16s(per, -1.0f, 1.0f));
  Twin<bf16> su(rng.bf16s(per, -1.0f, 1.0f));
  Twin<bf16> sd(rng.bf16s(per, -0.1f, 0.1f));
  Twin<bf16> x(rng.bf16s(H, -1.0f, 1.0f));
  std::vector<int32_t> ids;
  while (static_cast<int>(ids.size()) < k) {
    const int id = rng.integer(0, s.experts - 1);
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  Twin<int32_t> idx(ids);
  Twin<float> wts(rng.floats(k, 0.1f, 1.0f));
  Twin<int32_t> zero(std::vector<int32_t>{0});
  Twin<float> one(std::vector<float>{1.0f});
  struct Case {
    const char* name;
    int first;        // first routed expert this rank owns
    int shared_rows;  // this rank's slice of the shared expert
  };
  const Case cases[] = {{"owned", ids[0] - ids[0] % num_local, I},
                        {"none owned", s.experts, I},
                        {"2-rank shared slice", ids[0] - ids[0] % num_local, I / 2}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(s.name) + " " + c.name);
    // The shared slice of a rank: the first `shared_rows` rows of gate / up, the same columns of down.
    std::vector<bf16> sd_slice(static_cast<size_t>(H) * c.shared_rows);
    const auto sd_full = sd.from_cpu();
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < c.shared_rows; ++i)
        sd_slice[static_cast<size_t>(h) * c.shared_rows + i] = sd_full[static_cast<size_t>(h) * I + i];
    Twin<bf16> sdown(sd_slice);
    const int num = std::min(num_local, s.experts - c.first);
    ExpertWeights cr{gate.c.data(), up.c.data(), down.c.data(), c.first, std::max(0, num), H, I};
    ExpertWeights gr{gate.g.data(), up.g.data(), down.g.data(), c.first, std::max(0, num), H, I};
    ExpertWeights cs{sg.c.data(), su.c.data(), sdown.c.data(), 0, 1, H, c.shared_rows};
    ExpertWeights gs{sg.g.data(), su.g.data(), sdown.g.data(), 0, 1, H, c.shared_rows};
    auto fused = out_twin<float>(H);
    cpu().moe_experts_shared(x.c.data(), cr, idx.c.data(), wts.c.data(), k, cs, 10.0f, fused.c.data());
    gpu().moe_experts_shared(x.g.data(), gr, idx.g.data(), wts.g.data(), k, gs, 10.0f, fused.g.data());
    const auto got = fused.from_gpu();
    expect_f32_close(got, fused.from_cpu(), "moe_experts_shared vs cpu", 1.0 / 128, 1.0 / 256);
    auto routed = out_twin<float>(H);
    auto shared = out_twin<float>(H);
    gpu().moe_experts(x.g.data(), gr, idx.g.data(), wts.g.data(), k, 10.0f, routed.g.data());
    gpu().moe_experts(x.g.data(), gs, zero.g.data(), one.g.data(), 1, 10.0f, shared.g.data());
    gpu().accumulate_f32(shared.g.data(), routed.g.data(), H);
    expect_bytes_equal(got, routed.from_gpu(), "moe_experts_shared vs moe_experts x2 + accumulate_f32");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuFused, ::testing::ValuesIn(kShapes), shape_name);

}  // namespace
}  // namespace mtplab::ops::gputest
