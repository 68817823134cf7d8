// CPU reference: MoE routing and the routed SwiGLU experts, against independent double
// formulas: routing by repeated max scans (no sorting), experts by plain double loops that apply
// BF16 rounding at the documented points.
//
// Tolerances:
// - Routing: expert ids exact; weights relative 1e-5 (fp32 sigmoid, one sum of top_k terms,
//   one divide and one multiply: a few 6e-8 roundings plus libm's expf, far below 1e-5).
// - Experts: out_h = sum_i w_i d_ih in fp32 with d = bf16(W_down a). The double reference
//   rounds g, u, a and d at the same points; its fp32 sums can flip an intermediate rounding by
//   one ulp, so each term may differ by 2 ulps of d_ih plus one ulp of every a_r seen through
//   W_down; plus the fp32 accumulation of top_k terms.
#include <algorithm>
#include <limits>

#include "core/error.hpp"
#include "cpu_test_util.hpp"
#include "ops/one_row.hpp"

using namespace mtplab;
using namespace mtplab::ops;
using namespace mtplab::ops::test;

namespace {

struct CpuMoe : CpuBackendTest {};

struct Route {
  std::vector<int32_t> idx;
  std::vector<double> weights;
};

/// Routing by definition: repeated scans for the largest remaining value, lowest id on ties.
Route naive_route(const std::vector<float>& logits, const std::vector<float>& bias, int top_k, int n_group,
                  int topk_group, double scaling) {
  const int E = static_cast<int>(logits.size());
  std::vector<double> s(E), biased(E);
  for (int e = 0; e < E; ++e) {
    s[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[e])));
    biased[e] = s[e] + bias[e];
  }
  if (n_group > 1) {
    const int gs = E / n_group;
    std::vector<double> group_score(n_group);
    for (int g = 0; g < n_group; ++g) {
      std::vector<double> members(biased.begin() + g * gs, biased.begin() + (g + 1) * gs);
      std::sort(members.rbegin(), members.rend());
      group_score[g] = members[0] + members[1];
    }
    std::vector<bool> kept(n_group, false);
    for (int round = 0; round < topk_group; ++round) {
      int best = -1;
      for (int g = 0; g < n_group; ++g) {
        if (!kept[g] && (best < 0 || group_score[g] > group_score[best])) best = g;
      }
      kept[best] = true;
    }
    for (int e = 0; e < E; ++e) {
      if (!kept[e / gs]) biased[e] = -INFINITY;
    }
  }
  Route r;
  std::vector<bool> taken(E, false);
  double sum = 0;
  for (int i = 0; i < top_k; ++i) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      if (!taken[e] && (best < 0 || biased[e] > biased[best])) best = e;
    }
    taken[best] = true;
    r.idx.push_back(best);
    sum += s[best];
  }
  for (int32_t e : r.idx) r.weights.push_back(s[e] / sum * scaling);
  return r;
}

Route run_route(Backend& be, const std::vector<float>& logits, const std::vector<float>& bias, int top_k,
                int n_group, int topk_group, float scaling) {
  auto dl = upload(be, logits), db = upload(be, bias);
  auto idx = poisoned<int32_t>(be, top_k);
  auto w = poisoned<float>(be, top_k);
  mtplab::ops::OneRow(be).moe_route(dl.data(), db.data(), static_cast<int>(logits.size()), top_k, n_group,
                                    topk_group, scaling, idx.data(), w.data());
  Route r;
  r.idx = download(be, idx);
  for (float v : download(be, w)) r.weights.push_back(v);
  return r;
}

void expect_same_route(const Route& got, const Route& want) {
  ASSERT_EQ(got.idx, want.idx);
  for (size_t i = 0; i < want.weights.size(); ++i) {
    EXPECT_TRUE(near_abs(got.weights[i], want.weights[i], 1e-5 * std::fabs(want.weights[i]))) << "slot " << i;
  }
}

}  // namespace

TEST_F(CpuMoe, RouteMatchesDefinitionWithoutGroups) {
  SCOPED_TRACE(seed_note());
  Rng rng(41);
  for (int trial = 0; trial < 50; ++trial) {
    const int E = trial % 2 ? 8 : 64, top_k = trial % 2 ? 2 : 4;
    const auto logits = rng.floats(E, -4, 4);
    const auto bias = rng.floats(E, -0.3f, 0.3f);
    const Route got = run_route(*be, logits, bias, top_k, 1, 1, 2.5f);
    SCOPED_TRACE("trial " + std::to_string(trial));
    expect_same_route(got, naive_route(logits, bias, top_k, 1, 1, 2.5));
    double sum = 0;
    for (double w : got.weights) sum += w;
    EXPECT_NEAR(sum, 2.5, 2.5 * 1e-5);  // normalised, then scaled
  }
}

TEST_F(CpuMoe, BiasChoosesButUnbiasedScoresWeigh) {
  // Expert 5 has the largest sigmoid, but the bias promotes experts 1 and 2 above it.
  std::vector<float> logits = {0.f, 1.f, 0.5f, 0.f, 0.f, 3.f, 0.f, 0.f};
  std::vector<float> bias(8, 0.0f);
  bias[1] = 0.5f;
  bias[2] = 0.5f;
  const Route got = run_route(*be, logits, bias, 2, 1, 1, 1.0f);
  ASSERT_EQ(got.idx, (std::vector<int32_t>{1, 2}));
  const double s1 = 1 / (1 + std::exp(-1.0)), s2 = 1 / (1 + std::exp(-0.5));
  EXPECT_NEAR(got.weights[0], s1 / (s1 + s2), 1e-6);
  EXPECT_NEAR(got.weights[1], s2 / (s1 + s2), 1e-6);
}

TEST_F(CpuMoe, RouteTiesGoToTheLowerExpert) {
  std::vector<float> logits(8, 0.25f), bias(8, 0.0f);
  logits[6] = 1.0f;  // one clear winner, then a 7-way tie
  const Route got = run_route(*be, logits, bias, 3, 1, 1, 1.0f);
  EXPECT_EQ(got.idx, (std::vector<int32_t>{6, 0, 1}));
}

TEST_F(CpuMoe, GroupLimitDropsGroupsByTheirTopTwo) {
  SCOPED_TRACE(seed_note());
  // 16 experts in 4 groups of 4, keep 2 groups. Group 0 holds the single best expert but its
  // second best is poor; groups 2 and 3 have two good experts each, so group 0 is dropped.
  std::vector<float> logits(16, -3.0f), bias(16, 0.0f);
  logits[0] = 4.0f;
  logits[9] = 2.0f;
  logits[10] = 2.0f;
  logits[13] = 1.5f;
  logits[15] = 1.8f;
  const Route got = run_route(*be, logits, bias, 3, 4, 2, 1.0f);
  EXPECT_EQ(got.idx, (std::vector<int32_t>{9, 10, 15}));
  // Without the group limit expert 0 wins.
  EXPECT_EQ(run_route(*be, logits, bias, 3, 1, 1, 1.0f).idx, (std::vector<int32_t>{0, 9, 10}));
  // Tied groups: the lower group is kept.
  std::vector<float> flat(16, 0.0f);
  EXPECT_EQ(run_route(*be, flat, bias, 4, 4, 1, 1.0f).idx, (std::vector<int32_t>{0, 1, 2, 3}));
  // Random inputs against the definition.
  Rng rng(42);
  for (int trial = 0; trial < 50; ++trial) {
    const auto l = rng.floats(32, -4, 4);
    const auto b = rng.floats(32, -0.3f, 0.3f);
    SCOPED_TRACE("trial " + std::to_string(trial));
    expect_same_route(run_route(*be, l, b, 4, 8, 3, 2.5f), naive_route(l, b, 4, 8, 3, 2.5));
  }
  // 16 experts do not split into 3 groups.
  EXPECT_THROW(run_route(*be, logits, bias, 3, 3, 1, 1.0f), Error);
}

// ---- experts ------------------------------------------------------------------------------------

namespace {

/// All experts of a layer (global ids 0..E-1) in the stacked layout of ExpertWeights.
struct Experts {
  int E, H, I;
  std::vector<bf16> gate, up, down;
  Experts(Rng& rng, int e, int h, int inter, float gate_range)
      : E(e),
        H(h),
        I(inter),
        gate(rng.bf16s(static_cast<size_t>(e) * inter * h, -gate_range, gate_range)),
        up(rng.bf16s(static_cast<size_t>(e) * inter * h, -gate_range, gate_range)),
        down(rng.bf16s(static_cast<size_t>(e) * h * inter, -0.2f, 0.2f)) {}
};

struct ExpertsRef {
  std::vector<double> out, tol;
  std::vector<double> abs_sum;  // sum_i |w_i d_ih|: the scale of the fp32 accumulation
  int clamped_gate = 0, clamped_up = 0;
};

/// out_h = sum over owned selected experts of w_i * bf16(W_down a), a = bf16(silu(min(g, L)) *
/// clamp(u, -L, L)), g = bf16(W_gate x), u = bf16(W_up x); all in double with those roundings.
ExpertsRef experts_reference(const Experts& ex, const std::vector<bf16>& x, const std::vector<int32_t>& idx,
                             const std::vector<float>& weights, int first, int num_local, double limit) {
  const int H = ex.H, I = ex.I;
  ExpertsRef ref;
  ref.out.assign(H, 0.0);
  ref.tol.assign(H, 0.0);
  ref.abs_sum.assign(H, 0.0);
  std::vector<double> a(I);
  for (size_t i = 0; i < idx.size(); ++i) {
    const int e = idx[i];
    if (e < first || e >= first + num_local) continue;
    for (int r = 0; r < I; ++r) {
      double g = 0, u = 0;
      for (int j = 0; j < H; ++j) {
        g +=
            static_cast<double>(to_float(ex.gate[(static_cast<size_t>(e) * I + r) * H + j])) * to_float(x[j]);
        u += static_cast<double>(to_float(ex.up[(static_cast<size_t>(e) * I + r) * H + j])) * to_float(x[j]);
      }
      g = bf16_nearest(g);
      u = bf16_nearest(u);
      if (limit > 0) {
        ref.clamped_gate += g > limit;
        ref.clamped_up += std::fabs(u) > limit;
        g = std::min(g, limit);
        u = std::clamp(u, -limit, limit);
      }
      a[r] = bf16_nearest(g / (1 + std::exp(-g)) * u);
    }
    for (int h = 0; h < H; ++h) {
      double d = 0, a_err = 0;
      for (int r = 0; r < I; ++r) {
        const double wd = to_float(ex.down[(static_cast<size_t>(e) * H + h) * I + r]);
        d += wd * a[r];
        a_err += std::fabs(wd) * bf16_ulp(a[r]);
      }
      d = bf16_nearest(d);
      ref.out[h] += weights[i] * d;
      ref.abs_sum[h] += std::fabs(weights[i] * d);
      ref.tol[h] += std::fabs(weights[i]) *
                    (2 * bf16_ulp(d) + a_err + static_cast<double>(idx.size()) * kU32 * std::fabs(d));
    }
  }
  return ref;
}

std::vector<float> run_experts(Backend& be, const Experts& ex, const std::vector<bf16>& x,
                               const std::vector<int32_t>& idx, const std::vector<float>& weights, int first,
                               int num_local, float limit) {
  const size_t per = static_cast<size_t>(ex.I) * ex.H;
  auto gate = upload(
      be, std::vector<bf16>(ex.gate.begin() + first * per, ex.gate.begin() + (first + num_local) * per));
  auto up =
      upload(be, std::vector<bf16>(ex.up.begin() + first * per, ex.up.begin() + (first + num_local) * per));
  auto down = upload(
      be, std::vector<bf16>(ex.down.begin() + first * per, ex.down.begin() + (first + num_local) * per));
  auto dx = upload(be, x);
  auto didx = upload(be, idx);
  auto dw = upload(be, weights);
  auto out = poisoned<float>(be, ex.H);
  const ExpertWeights w{gate.data(), up.data(), down.data(), first, num_local, ex.H, ex.I};
  mtplab::ops::OneRow(be).moe_experts(dx.data(), w, didx.data(), dw.data(), static_cast<int>(idx.size()),
                                      limit, out.data());
  return download(be, out);
}

void expect_matches(const std::vector<float>& got, const ExpertsRef& ref) {
  for (size_t h = 0; h < got.size(); ++h) ASSERT_TRUE(near_abs(got[h], ref.out[h], ref.tol[h])) << "h " << h;
}

}  // namespace

TEST_F(CpuMoe, ExpertsMatchDoubleWithRoundingPoints) {
  SCOPED_TRACE(seed_note());
  Rng rng(43);
  const Experts ex(rng, 8, 128, 64, 0.5f);  // tiny preset: hidden 128, inter 64, 8 experts
  const auto x = rng.bf16s(128, -1, 1);
  const std::vector<int32_t> idx = {5, 1};
  const std::vector<float> weights = {1.6f, 0.9f};
  const auto got = run_experts(*be, ex, x, idx, weights, 0, 8, 10.0f);
  const auto ref = experts_reference(ex, x, idx, weights, 0, 8, 10.0);
  expect_matches(got, ref);
  // The rounding points themselves: when g, u, a and d round as the reference rounds them, out
  // differs only by the fp32 sum of top_k terms. That holds for nearly every h (a flip needs an
  // fp32 error at a rounding boundary); skipping a rounding (of g, say) breaks it for ~1/3.
  int same = 0;
  for (size_t h = 0; h < got.size(); ++h) {
    same += std::fabs(got[h] - ref.out[h]) <= 4 * kU32 * ref.abs_sum[h];
  }
  EXPECT_GE(same, static_cast<int>(got.size()) * 9 / 10);
}

TEST_F(CpuMoe, OnlyOwnedExpertsContribute) {
  SCOPED_TRACE(seed_note());
  Rng rng(44);
  const Experts ex(rng, 8, 128, 64, 0.5f);
  const auto x = rng.bf16s(128, -1, 1);
  const std::vector<int32_t> idx = {3, 6, 2, 0};
  const std::vector<float> weights = rng.floats(4, 0.2f, 1.0f);
  // This rank owns experts 2, 3, 4: experts 3 and 2 contribute, 6 and 0 do not.
  expect_matches(run_experts(*be, ex, x, idx, weights, 2, 3, 10.0f),
                 experts_reference(ex, x, idx, weights, 2, 3, 10.0));
  // Owning none of the selected experts overwrites the (poisoned) output with zeros.
  for (float v : run_experts(*be, ex, x, idx, weights, 4, 2, 10.0f)) ASSERT_EQ(v, 0.0f);
  // An expert-parallel split: the two ranks' partials add up to the unsplit output.
  const auto lo = run_experts(*be, ex, x, idx, weights, 0, 4, 10.0f);
  const auto hi = run_experts(*be, ex, x, idx, weights, 4, 4, 10.0f);
  const auto ref = experts_reference(ex, x, idx, weights, 0, 8, 10.0);
  std::vector<float> sum(lo.size());
  for (size_t h = 0; h < lo.size(); ++h) sum[h] = lo[h] + hi[h];
  expect_matches(sum, ref);
  // ... and neither partial alone does (the test can tell owned from not owned).
  double diff = 0;
  for (size_t h = 0; h < lo.size(); ++h) diff = std::max(diff, std::fabs(lo[h] - ref.out[h]) - ref.tol[h]);
  EXPECT_GT(diff, 0.0);
}

TEST_F(CpuMoe, SwigluClampEngages) {
  SCOPED_TRACE(seed_note());
  Rng rng(45);
  // Large gate / up weights: |g| and |u| spread well beyond the limit 10.
  const Experts ex(rng, 4, 128, 64, 3.0f);
  const auto x = rng.bf16s(128, -1, 1);
  const std::vector<int32_t> idx = {2, 0};
  const std::vector<float> weights = {1.3f, 1.2f};
  const float limit = 10.0f;
  const auto clamped = experts_reference(ex, x, idx, weights, 0, 4, limit);
  ASSERT_GE(clamped.clamped_gate, 5) << "inputs never reach the gate clamp";
  ASSERT_GE(clamped.clamped_up, 5) << "inputs never reach the up clamp";
  const auto unclamped = experts_reference(ex, x, idx, weights, 0, 4, 0.0);
  const auto got = run_experts(*be, ex, x, idx, weights, 0, 4, limit);
  expect_matches(got, clamped);
  // The clamp changes the answer by more than ten times the tolerance ...
  double beyond = 0;
  for (size_t h = 0; h < got.size(); ++h)
    beyond = std::max(beyond, std::fabs(unclamped.out[h] - got[h]) / clamped.tol[h]);
  EXPECT_GT(beyond, 10.0);
  // ... and limit <= 0 turns it off.
  expect_matches(run_experts(*be, ex, x, idx, weights, 0, 4, 0.0f), unclamped);
  expect_matches(run_experts(*be, ex, x, idx, weights, 0, 4, -1.0f), unclamped);
}

namespace {

// ---- batched rows: each row the single-row op's bytes -----------------------------------------------

struct CpuMoeBatch : CpuBackendTest {};

TEST_F(CpuMoeBatch, RouteEqualsTheSingleRowOp) {
  Rng rng(713);
  struct Shape {
    int E, top_k, n_group, topk_group;
  };
  for (const Shape sh : {Shape{8, 2, 1, 1}, Shape{64, 4, 8, 3}}) {
    auto bias = upload(*be, rng.floats(sh.E, -0.3f, 0.3f));
    for (int B : kBatches) {
      const auto slots_h = make_slots(rng, B, B);
      auto logits_h = rng.floats(static_cast<size_t>(B) * sh.E, -4, 4);
      for (int b = 0; b < B; ++b)  // a padded row's logits are NaN: they must not be read
        if (slots_h[b] < 0) std::fill_n(logits_h.begin() + b * sh.E, sh.E, std::nanf(""));
      auto logits = upload(*be, logits_h);
      auto s = upload(*be, slots_h);
      const size_t n = static_cast<size_t>(B) * sh.top_k;
      auto idx = poisoned<int32_t>(*be, n), idx_ref = poisoned<int32_t>(*be, n);
      auto w = poisoned<float>(*be, n), w_ref = poisoned<float>(*be, n);
      be->moe_route_batch(logits.data(), bias.data(), RowBatch{s.data(), nullptr, B}, sh.E, sh.top_k,
                          sh.n_group, sh.topk_group, 2.5f, idx.data(), w.data());
      for (int b = 0; b < B; ++b)
        if (slots_h[b] >= 0)
          mtplab::ops::OneRow(*be).moe_route(logits.data() + b * sh.E, bias.data(), sh.E, sh.top_k,
                                             sh.n_group, sh.topk_group, 2.5f, idx_ref.data() + b * sh.top_k,
                                             w_ref.data() + b * sh.top_k);
      EXPECT_TRUE(same_bytes(download(*be, idx), download(*be, idx_ref))) << "E " << sh.E << ", " << where(B);
      EXPECT_TRUE(same_bytes(download(*be, w), download(*be, w_ref))) << "E " << sh.E << ", " << where(B);
    }
  }
}

struct ExpertSet {
  ExpertSet(Backend& be, Rng& rng, int count, int H, int I, float scale)
      : gate(upload(be, rng.bf16s(static_cast<size_t>(count) * I * H, -scale, scale))),
        up(upload(be, rng.bf16s(static_cast<size_t>(count) * I * H, -scale, scale))),
        down(upload(be, rng.bf16s(static_cast<size_t>(count) * H * I, -0.2f, 0.2f))) {}
  ExpertWeights weights(int first, int num_local, int H, int I) const {
    return ExpertWeights{gate.data(), up.data(), down.data(), first, num_local, H, I};
  }
  Array<bf16> gate, up, down;
};

struct GroupedCase {
  const char* name;
  int first_expert, num_local;  ///< the local experts (EP when fewer than all)
  bool shared;
  float limit;
  bool crowded;  ///< every row routes to experts of a small set: many duplicates across rows
};

TEST_F(CpuMoeBatch, ExpertsGroupedEqualsTheSingleRowOpsPerRow) {
  Rng rng(714);
  const int E = 8, H = 44, I = 36, Is = 20, top_k = 3;
  // Gate/up weights large enough that the limit 10 clamps some values.
  const ExpertSet routed(*be, rng, E, H, I, 3.0f), shared_set(*be, rng, 1, H, Is, 3.0f);
  const ExpertWeights shared = shared_set.weights(0, 1, H, Is);
  const GroupedCase cases[] = {
      {"all local, shared, clamp", 0, E, true, 10.0f, false},
      {"all local, no shared, no clamp", 0, E, false, 0.0f, false},
      {"EP experts 3..5, shared", 3, 3, true, 10.0f, false},
      {"EP experts 3..5, no shared", 3, 3, false, 10.0f, true},
      {"crowded, shared", 0, E, true, 10.0f, true},
  };
  for (const GroupedCase& c : cases) {
    // The local experts start at the first one's weights, as a rank holds only its own.
    const size_t off = static_cast<size_t>(c.first_expert) * I * H;
    const ExpertWeights w{routed.gate.data() + off,
                          routed.up.data() + off,
                          routed.down.data() + off,
                          c.first_expert,
                          c.num_local,
                          H,
                          I};
    for (int B : kBatches) {
      const auto slots_h = make_slots(rng, B, B);
      std::vector<int32_t> idx_h(static_cast<size_t>(B) * top_k);
      for (int b = 0; b < B; ++b) {
        int32_t* row = idx_h.data() + static_cast<size_t>(b) * top_k;
        for (int i = 0; i < top_k; ++i) row[i] = c.crowded ? rng.integer(2, 4) : rng.integer(0, E - 1);
        if (b == 0) {
          row[0] = 4;  // a repeated expert inside one row
          row[1] = 4;
        }
        if (b == 2 && c.num_local < E) {  // a row routed to no local expert
          row[0] = 0;
          row[1] = 1;
          row[2] = 7;
        }
        // A padded row routes to an owned expert: were it applied, its output row would be written.
        if (slots_h[b] < 0) row[0] = c.first_expert;
      }
      auto idx = upload(*be, idx_h), s = upload(*be, slots_h);
      auto rw = upload(*be, rng.floats(static_cast<size_t>(B) * top_k, 0.1f, 1.0f));
      auto x = upload(*be, rng.bf16s(static_cast<size_t>(B) * H, -1, 1));
      auto out = poisoned<float>(*be, static_cast<size_t>(B) * H), ref = poisoned<float>(*be, out.size());
      be->moe_experts_grouped(x.data(), w, idx.data(), rw.data(), RowBatch{s.data(), nullptr, B}, top_k,
                              c.shared ? &shared : nullptr, c.limit, out.data());
      for (int b = 0; b < B; ++b) {
        if (slots_h[b] < 0) continue;
        if (c.shared) {
          mtplab::ops::OneRow(*be).moe_experts_shared(x.data() + b * H, w, idx.data() + b * top_k,
                                                      rw.data() + b * top_k, top_k, shared, c.limit,
                                                      ref.data() + b * H);
        } else {
          mtplab::ops::OneRow(*be).moe_experts(x.data() + b * H, w, idx.data() + b * top_k,
                                               rw.data() + b * top_k, top_k, c.limit, ref.data() + b * H);
        }
      }
      const auto got = download(*be, out);
      EXPECT_TRUE(same_bytes(got, download(*be, ref))) << c.name << ", " << where(B);
      if (B >= 3 && c.num_local < E && !c.shared && slots_h[2] >= 0) {
        for (int h = 0; h < H; ++h) EXPECT_EQ(got[2 * H + h], 0.0f) << "row 2 owns no expert, " << where(B);
      }
    }
  }
}

// Every row padded: the grouped experts write nothing.
TEST_F(CpuMoeBatch, AllRowsPaddedWriteNothing) {
  Rng rng(715);
  const int B = 4, H = 16, I = 8, top_k = 2;
  const ExpertSet routed(*be, rng, 4, H, I, 1.0f);
  const std::vector<int32_t> none(B, -1);
  auto s = upload(*be, none);
  auto x = upload(*be, rng.bf16s(static_cast<size_t>(B) * H, -1, 1));
  auto idx = upload(*be, std::vector<int32_t>(static_cast<size_t>(B) * top_k, 0));
  auto rw = upload(*be, rng.floats(static_cast<size_t>(B) * top_k, 0, 1));
  auto out = poisoned<float>(*be, static_cast<size_t>(B) * H);
  const auto before = download(*be, out);
  be->moe_experts_grouped(x.data(), routed.weights(0, 4, H, I), idx.data(), rw.data(),
                          RowBatch{s.data(), nullptr, B}, top_k, nullptr, 0.0f, out.data());
  EXPECT_TRUE(same_bytes(download(*be, out), before));
}

}  // namespace
