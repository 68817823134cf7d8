// CUDA vs CPU: the MoE router (sigmoid, correction bias, group limit, top-k, weights) and the
// routed experts of one rank (expert ids read on the device, experts other ranks own contribute
// zero), at the tiny, small and glm5.3-flash shapes.
//
// Tolerances: the router differs only by the device expf (<= 2 ulp): the chosen experts must be
// identical unless two biased scores are within 1e-6 of each other, and the weights agree to 1e-5
// relative. The experts' fp32 output sums weight * bf16(down row . act) over the slots; one BF16
// ulp flip in an intermediate moves it by ~2^-8 of a term, so 2^-7 relative plus 2^-8 of the
// largest output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "ops/one_row.hpp"

namespace mtplab::ops::gputest {
namespace {

class GpuMoe : public ::testing::TestWithParam<Shape> {};

TEST_P(GpuMoe, Route) {
  const Shape s = GetParam();
  Rng rng(21);
  const int E = s.experts, k = s.top_k;
  const std::vector<float> logits = rng.floats(E, -4.0f, 4.0f);
  const std::vector<float> bias = rng.floats(E, -0.1f, 0.1f);
  Twin<float> lg(logits), bs(bias);
  std::vector<double> biased(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) biased[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[e]))) + bias[e];
  const int n_group = E >= 64 ? 8 : 4;
  for (int groups : {1, n_group}) {
    const int topk_group = groups == 1 ? 1 : groups / 2;
    auto idx = out_twin<int32_t>(k);
    auto w = out_twin<float>(k);
    mtplab::ops::OneRow(cpu()).moe_route(lg.c.data(), bs.c.data(), E, k, groups, topk_group, 2.5f,
                                         idx.c.data(), w.c.data());
    mtplab::ops::OneRow(gpu()).moe_route(lg.g.data(), bs.g.data(), E, k, groups, topk_group, 2.5f,
                                         idx.g.data(), w.g.data());
    const auto gi = idx.from_gpu(), ci = idx.from_cpu();
    bool same = true;
    for (int i = 0; i < k; ++i) {
      if (gi[i] == ci[i]) continue;
      same = false;
      ASSERT_TRUE(gi[i] >= 0 && gi[i] < E) << "expert id " << gi[i];
      EXPECT_LE(std::fabs(biased[gi[i]] - biased[ci[i]]), 1e-6)
          << "n_group " << groups << " slot " << i << ": gpu expert " << gi[i] << " vs cpu " << ci[i]
          << " is not a near-tie; " << seed_note();
    }
    if (same)
      expect_f32_close(w.from_gpu(), w.from_cpu(), "route weights n_group " + std::to_string(groups), 1e-5,
                       0);
  }
  // Exact ties (equal logits, no bias): the lower expert id wins, in the group ranking too.
  Twin<float> flat(std::vector<float>(static_cast<size_t>(E), 0.25f));
  for (int groups : {1, n_group}) {
    auto idx = out_twin<int32_t>(k);
    auto w = out_twin<float>(k);
    const int topk_group = groups == 1 ? 1 : groups / 2;
    mtplab::ops::OneRow(cpu()).moe_route(flat.c.data(), nullptr, E, k, groups, topk_group, 2.5f, idx.c.data(),
                                         w.c.data());
    mtplab::ops::OneRow(gpu()).moe_route(flat.g.data(), nullptr, E, k, groups, topk_group, 2.5f, idx.g.data(),
                                         w.g.data());
    const auto gi = idx.from_gpu();
    EXPECT_EQ(gi, idx.from_cpu()) << "tied scores, n_group " << groups;
    for (int i = 0; i < k; ++i) EXPECT_EQ(gi[static_cast<size_t>(i)], i) << "tied scores: slot " << i;
    expect_f32_close(w.from_gpu(), w.from_cpu(), "tied route weights", 1e-6, 0);
  }
}

TEST_P(GpuMoe, Experts) {
  const Shape s = GetParam();
  Rng rng(22);
  const int H = s.hidden, I = s.moe_inter, k = s.top_k;
  const int num_local = std::min(s.experts, 16);
  const int first = s.experts > num_local ? s.experts / 3 : 0;
  const size_t per = static_cast<size_t>(I) * H;
  Twin<bf16> gate(rng.bf16s(per * num_local, -1.0f, 1.0f));
  Twin<bf16> up(rng.bf16s(per * num_local, -1.0f, 1.0f));
  Twin<bf16> down(rng.bf16s(per * num_local, -0.1f, 0.1f));
  Twin<bf16> x(rng.bf16s(H, -1.0f, 1.0f));
  // Distinct ids, every other one owned by this rank (when the rank does not own them all).
  std::vector<int32_t> ids;
  while (static_cast<int>(ids.size()) < k) {
    const bool owned = s.experts == num_local || ids.size() % 2 == 0;
    const int id = owned ? first + rng.integer(0, num_local - 1)
                         : (first + num_local + rng.integer(0, s.experts - num_local - 1)) % s.experts;
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  Twin<int32_t> idx(ids);
  Twin<float> wts(rng.floats(k, 0.1f, 1.0f));
  // Slot counts: top_k, one (the shared expert's launch: 8 outputs per block in the down
  // projection), and three (a block of 2 outputs x 3 slots).
  for (int slots : {k, 1, std::min(3, k)})
    for (int owner_offset : {0, s.experts}) {  // the second pass owns none of the selected experts
      ExpertWeights cw{gate.c.data(), up.c.data(), down.c.data(), first + owner_offset, num_local, H, I};
      ExpertWeights gw{gate.g.data(), up.g.data(), down.g.data(), first + owner_offset, num_local, H, I};
      for (float limit : {10.0f, 0.0f}) {
        SCOPED_TRACE("slots " + std::to_string(slots));
        auto out = out_twin<float>(H);
        mtplab::ops::OneRow(cpu()).moe_experts(x.c.data(), cw, idx.c.data(), wts.c.data(), slots, limit,
                                               out.c.data());
        mtplab::ops::OneRow(gpu()).moe_experts(x.g.data(), gw, idx.g.data(), wts.g.data(), slots, limit,
                                               out.g.data());
        const auto want = out.from_cpu();
        if (owner_offset != 0) {
          ASSERT_EQ(max_abs(want), 0.0) << "reference: no owned expert must give zeros";
        }
        expect_f32_close(
            out.from_gpu(), want,
            std::string("moe_experts limit ") + std::to_string(limit) + (owner_offset ? " (none owned)" : ""),
            1.0 / 128, 1.0 / 256);
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Models, GpuMoe, ::testing::ValuesIn(kShapes), shape_name);

}  // namespace
}  // namespace mtplab::ops::gputest
