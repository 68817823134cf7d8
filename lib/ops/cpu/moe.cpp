// CPU reference: MoE routing (sigmoid, correction bias, group limit, top-k) and the routed
// SwiGLU experts this rank owns.
//
// Invariants:
// - Routing is fp32 and deterministic: every rank computes the same idx / weights from the same
//   logits. idx is ordered by biased score s' descending, ties to the lower expert id (the order
//   of a stable descending sort); weights follow idx.
// - Group limit: groups are ranked by the sum of their two largest s' (ties: lower group id); the
//   experts of dropped groups get s' = -inf, so they are never chosen while a kept expert is left.
// - moe_experts overwrites `out`, then adds weight_i * bf16(down_i) for each selected expert in
//   [first_expert, first_expert + num_local), in idx order; experts other ranks own contribute 0.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "ops/cpu/cpu_backend.hpp"
#include "ops/cpu/cpu_math.hpp"
#include "ops/group_score.hpp"

namespace mtplab::ops::cpu {

void CpuBackend::moe_route(const float* logits, const float* bias, int num_experts, int top_k, int n_group,
                           int topk_group, float scaling, int32_t* idx, float* weights) {
  require_size("moe_route", "num_experts", num_experts);
  require_size("moe_route", "top_k", top_k);
  require_size("moe_route", "n_group", n_group);
  MTP_REQUIRE(top_k <= num_experts, "ops::moe_route: top_k ", top_k, " > num_experts ", num_experts);
  const int group_size = num_experts / n_group;
  if (n_group > 1) {
    MTP_REQUIRE(num_experts % n_group == 0, "ops::moe_route: num_experts ", num_experts,
                " is not a multiple of n_group ", n_group);
    MTP_REQUIRE(group_size >= 2, "ops::moe_route: groups of ", group_size,
                " expert(s); the group score needs the top 2 of each group");
    MTP_REQUIRE(topk_group >= 1 && topk_group <= n_group, "ops::moe_route: topk_group ", topk_group,
                " outside [1, n_group = ", n_group, "]");
    MTP_REQUIRE(top_k <= topk_group * group_size, "ops::moe_route: top_k ", top_k, " > the ",
                topk_group * group_size, " experts of the kept groups");
  }

  const size_t E = static_cast<size_t>(num_experts);
  tmp_.resize(2 * E);
  float* s = tmp_.data();           // unbiased sigmoid scores: the weights come from these
  float* biased = tmp_.data() + E;  // s' = s + bias: the choice comes from these
  for (size_t e = 0; e < E; ++e) {
    s[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    biased[e] = s[e] + (bias ? bias[e] : 0.0f);
  }

  if (n_group > 1) {
    std::vector<float> group_score(static_cast<size_t>(n_group));
    for (int g = 0; g < n_group; ++g)
      group_score[g] = group_top2_sum(biased, g * group_size, (g + 1) * group_size);
    std::vector<int> groups(static_cast<size_t>(n_group));
    std::iota(groups.begin(), groups.end(), 0);
    std::stable_sort(groups.begin(), groups.end(),
                     [&](int a, int b) { return group_score[a] > group_score[b]; });
    for (int rank = topk_group; rank < n_group; ++rank) {
      const int g = groups[rank];
      std::fill(biased + static_cast<size_t>(g) * group_size,
                biased + static_cast<size_t>(g + 1) * group_size, -std::numeric_limits<float>::infinity());
    }
  }

  std::vector<int32_t> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return biased[a] > biased[b]; });
  float sum = 0.0f;
  for (int i = 0; i < top_k; ++i) {
    idx[i] = order[i];
    sum += s[order[i]];
  }
  for (int i = 0; i < top_k; ++i) weights[i] = s[idx[i]] / sum * scaling;
}

void CpuBackend::moe_experts(const bf16* x, const ExpertWeights& w, const int32_t* idx, const float* weights,
                             int top_k, float limit, float* out) {
  require_size("moe_experts", "top_k", top_k, 0);
  require_size("moe_experts", "hidden", w.hidden);
  require_size("moe_experts", "inter", w.inter);
  require_size("moe_experts", "num_local", w.num_local, 0);
  const int H = w.hidden;
  const int I = w.inter;
  std::fill(out, out + H, 0.0f);
  xf_.resize(static_cast<size_t>(H));
  widen(x, xf_.data(), H);
  tmp_.resize(static_cast<size_t>(I));
  float* act = tmp_.data();
  const bool clamp = limit > 0.0f;
  for (int i = 0; i < top_k; ++i) {
    const int64_t local = static_cast<int64_t>(idx[i]) - w.first_expert;
    if (local < 0 || local >= w.num_local) continue;  // another rank owns it
    MTP_REQUIRE(w.gate && w.up && w.down, "ops::moe_experts: expert ", idx[i],
                " is owned but its weights are null");
    const size_t expert_off = static_cast<size_t>(local) * I * H;
    const bf16* Wg = w.gate + expert_off;
    const bf16* Wu = w.up + expert_off;
    const bf16* Wd = w.down + expert_off;
    for (int r = 0; r < I; ++r) {
      float g = round_bf16(dot(Wg + static_cast<size_t>(r) * H, xf_.data(), H));
      float u = round_bf16(dot(Wu + static_cast<size_t>(r) * H, xf_.data(), H));
      if (clamp) {
        g = std::min(g, limit);
        u = std::clamp(u, -limit, limit);
      }
      act[r] = round_bf16(g / (1.0f + std::exp(-g)) * u);
    }
    const float wi = weights[i];
    for (int h = 0; h < H; ++h) out[h] += wi * round_bf16(dot(Wd + static_cast<size_t>(h) * I, act, I));
  }
}

void CpuBackend::moe_experts_shared(const bf16* x, const ExpertWeights& routed, const int32_t* idx,
                                    const float* weights, int top_k, const ExpertWeights& shared, float limit,
                                    float* out) {
  moe_experts(x, routed, idx, weights, top_k, limit, out);
  std::vector<float> shared_out(static_cast<size_t>(shared.hidden));
  const int32_t zero = 0;
  const float one = 1.0f;
  ExpertWeights one_expert = shared;
  one_expert.first_expert = 0;
  one_expert.num_local = 1;
  moe_experts(x, one_expert, &zero, &one, 1, limit, shared_out.data());
  for (int h = 0; h < routed.hidden; ++h) out[h] += shared_out[static_cast<size_t>(h)];
}

// ---- batched rows -------------------------------------------------------------------------------

void CpuBackend::moe_route_batch(const float* logits, const float* bias, const RowBatch& rb, int num_experts,
                                 int top_k, int n_group, int topk_group, float scaling, int32_t* idx,
                                 float* weights) {
  require_rows("moe_route_batch", rb.slot, rb.rows);
  require_size("moe_route_batch", "top_k", top_k);
  for (int b = 0; b < rb.rows; ++b) {
    if (!live_row("moe_route_batch", rb.slot, b)) continue;
    const size_t k_off = static_cast<size_t>(b) * top_k;
    moe_route(logits + static_cast<size_t>(b) * num_experts, bias, num_experts, top_k, n_group, topk_group,
              scaling, idx + k_off, weights + k_off);
  }
}

namespace {

/// One (row, route slot) pair that an expert applies to: its input row and where its output goes.
struct ExpertPair {
  int64_t expert;  ///< local expert index
  int row;         ///< position of the row among the live rows
  int route;       ///< row * top_k + slot: the output's index in the per-pair buffer
};

/// Applies one expert (gate, up, down at these pointers) to the rows `xs` (fp32 widened, [.., H])
/// of `pairs`, writing bf16(W_down a) of pair p to d + pairs[p].route * H. The weights are read
/// once for all pairs; each pair's numbers are moe_experts' for that row, op for op: g and u
/// rounded, clamped, a rounded, d rounded.
void apply_expert(const bf16* Wg, const bf16* Wu, const bf16* Wd, int H, int I, float limit,
                  const std::vector<const float*>& xs, const std::vector<int>& routes,
                  std::vector<float>& act, float* d) {
  const size_t n = xs.size();
  act.resize(n * I);
  const bool clamp = limit > 0.0f;
  for (int r = 0; r < I; ++r) {
    const bf16* gate_row = Wg + static_cast<size_t>(r) * H;
    const bf16* up_row = Wu + static_cast<size_t>(r) * H;
    for (size_t p = 0; p < n; ++p) {
      float g = round_bf16(dot(gate_row, xs[p], H));
      float u = round_bf16(dot(up_row, xs[p], H));
      if (clamp) {
        g = std::min(g, limit);
        u = std::clamp(u, -limit, limit);
      }
      act[p * I + r] = round_bf16(g / (1.0f + std::exp(-g)) * u);
    }
  }
  for (int h = 0; h < H; ++h) {
    const bf16* down_row = Wd + static_cast<size_t>(h) * I;
    for (size_t p = 0; p < n; ++p)
      d[static_cast<size_t>(routes[p]) * H + h] = round_bf16(dot(down_row, act.data() + p * I, I));
  }
}

}  // namespace

// Expert by expert over the union of the batch's routes (ascending local id), each applied to all
// its (row, slot) pairs at once; the rounded down-projections are kept per pair, then every row
// sums its own experts in its idx order, as moe_experts does, so the fp32 sums are the same.
void CpuBackend::moe_experts_grouped(const bf16* x, const ExpertWeights& w, const int32_t* idx,
                                     const float* weights, const RowBatch& rb, int top_k,
                                     const ExpertWeights* shared, float limit, float* out) {
  ran("moe_experts_grouped");
  const char* op = "moe_experts_grouped";
  require_rows(op, rb.slot, rb.rows);
  require_size(op, "top_k", top_k, 0);
  require_size(op, "hidden", w.hidden);
  require_size(op, "inter", w.inter);
  require_size(op, "num_local", w.num_local, 0);
  if (shared) {
    MTP_REQUIRE(shared->hidden == w.hidden, "ops::", op, ": the shared expert's hidden ", shared->hidden,
                " is not the routed experts' ", w.hidden);
    require_size(op, "shared inter", shared->inter);
    MTP_REQUIRE(shared->gate && shared->up && shared->down, "ops::", op,
                ": the shared expert's weights are null");
  }
  const int H = w.hidden;
  const int I = w.inter;
  std::vector<int> live;
  for (int b = 0; b < rb.rows; ++b)
    if (live_row(op, rb.slot, b)) live.push_back(b);
  if (live.empty()) return;
  const size_t L = live.size();
  xf_.resize(L * H);
  for (size_t j = 0; j < L; ++j) widen(x + static_cast<size_t>(live[j]) * H, xf_.data() + j * H, H);

  std::vector<ExpertPair> pairs;
  for (size_t j = 0; j < L; ++j) {
    for (int i = 0; i < top_k; ++i) {
      const int32_t e = idx[static_cast<size_t>(live[j]) * top_k + i];
      const int64_t local = static_cast<int64_t>(e) - w.first_expert;
      if (local < 0 || local >= w.num_local) continue;  // another rank owns it
      MTP_REQUIRE(w.gate && w.up && w.down, "ops::", op, ": expert ", e,
                  " is owned but its weights are null");
      pairs.push_back({local, static_cast<int>(j), static_cast<int>(j) * top_k + i});
    }
  }
  std::stable_sort(pairs.begin(), pairs.end(),
                   [](const ExpertPair& a, const ExpertPair& b) { return a.expert < b.expert; });
  std::vector<float> d(L * std::max(top_k, 1) * H);  // per (row, slot): bf16(W_down a), as floats
  std::vector<float> act;
  std::vector<const float*> xs;
  std::vector<int> routes;
  for (size_t p0 = 0; p0 < pairs.size();) {
    size_t p1 = p0;
    xs.clear();
    routes.clear();
    for (; p1 < pairs.size() && pairs[p1].expert == pairs[p0].expert; ++p1) {
      xs.push_back(xf_.data() + static_cast<size_t>(pairs[p1].row) * H);
      routes.push_back(pairs[p1].route);
    }
    const size_t expert_off = static_cast<size_t>(pairs[p0].expert) * I * H;
    apply_expert(w.gate + expert_off, w.up + expert_off, w.down + expert_off, H, I, limit, xs, routes, act,
                 d.data());
    p0 = p1;
  }

  // Each row: 0, then weight_i * d_i in idx order over the owned slots (moe_experts' sum).
  for (size_t j = 0; j < L; ++j) {
    float* o = out + static_cast<size_t>(live[j]) * H;
    std::fill(o, o + H, 0.0f);
    for (int i = 0; i < top_k; ++i) {
      const int64_t local =
          static_cast<int64_t>(idx[static_cast<size_t>(live[j]) * top_k + i]) - w.first_expert;
      if (local < 0 || local >= w.num_local) continue;
      const float wi = weights[static_cast<size_t>(live[j]) * top_k + i];
      const float* di = d.data() + (j * top_k + i) * H;
      for (int h = 0; h < H; ++h) o[h] += wi * di[h];
    }
  }
  if (!shared) return;
  // The shared expert on every live row at once, then added as moe_experts_shared adds it: its
  // own moe_experts output (0 + 1 * d) with one fp32 add.
  xs.clear();
  routes.clear();
  for (size_t j = 0; j < L; ++j) {
    xs.push_back(xf_.data() + j * H);
    routes.push_back(static_cast<int>(j));
  }
  std::vector<float> sh(L * H);
  apply_expert(shared->gate, shared->up, shared->down, H, shared->inter, limit, xs, routes, act, sh.data());
  for (size_t j = 0; j < L; ++j) {
    float* o = out + static_cast<size_t>(live[j]) * H;
    const float* dj = sh.data() + j * H;
    for (int h = 0; h < H; ++h) {
      const float shared_out = 0.0f + 1.0f * dj[h];
      o[h] += shared_out;
    }
  }
}

}  // namespace mtplab::ops::cpu
