// CUDA vs CPU, the MoE family: the router (sigmoid, correction bias, group limit, top-k, weights)
// and the routed experts of one rank (expert ids read on the device, experts other ranks own
// contribute zero), one row and batched, at the tiny, small and glm5.3-flash shapes; the grouped
// experts over the ragged batches (gpu_batch_util.hpp, ragged_layouts) under every kernel the
// dispatch can pick (KernelPolicy::moe_pipeline: auto, v1, slots, ringpf; auto's block items past
// 128 rows). Outputs are poisoned before the op writes them; what it must not write keeps its poison.
//
// Tolerances: the router differs only by the device expf (<= 2 ulp): the chosen experts must be
// identical unless two biased scores are within 1e-6 of each other (a near-tie: counted and
// printed), and the weights agree to 1e-5 relative. The experts' fp32 output sums weight *
// bf16(down row . act) over the slots; one BF16 ulp flip in an intermediate moves it by ~2^-8 of a
// term, so 2^-7 relative plus 2^-8 of the largest output. Between the kernels: ringpf gives v1's
// bytes (the same MMAs in the same order), slots on the single-row kernels each row the one-row
// op's bytes, and a row computed alone the bytes it has in a batch (of 64, and a wide one of 200)
// under every pipeline. (The comparison pipelines spread, regs, ring and split: dev/cuda/moe.cu.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_batch_util.hpp"
#include "gpu_test_util.hpp"
#include "ops/cuda/dispatch.hpp"
#include "ops/cuda/moe.hpp"
#include "ops/one_row.hpp"

namespace mtplab::ops::gputest {
namespace {

class GpuMoe : public ::testing::TestWithParam<Shape> {};

// ---- one row -------------------------------------------------------------------------------------------

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

// ---- batched rows --------------------------------------------------------------------------------------

// moe_route_batch at the batches of kBatches, padded rows among the live ones (their logits NaN:
// never read, their outputs never written), both group limits: one launch; ids as the single-row
// Route test holds them, weights 1e-5 relative where the ids agree.
TEST_P(GpuMoe, RouteBatch) {
  const Shape s = GetParam();
  Rng rng(810);
  const int E = s.experts, k = s.top_k;
  const std::vector<float> bias_h = rng.floats(E, -0.1f, 0.1f);
  Twin<float> bias(bias_h);
  int near = 0;
  for (int groups : {1, E >= 64 ? 8 : 4}) {
    const int topk_group = groups == 1 ? 1 : groups / 2;
    for (int B : kBatches) {
      const std::string what = where("moe_route_batch n_group " + std::to_string(groups), B);
      const auto slots_h = make_slots(rng, B, B);
      auto logits_h = rng.floats(static_cast<size_t>(B) * E, -4.0f, 4.0f);
      for (int b = 0; b < B; ++b)  // a padded row's logits are NaN: they must not be read
        if (slots_h[static_cast<size_t>(b)] < 0)
          std::fill_n(logits_h.begin() + static_cast<ptrdiff_t>(b) * E, E, std::nanf(""));
      Twin<float> logits(logits_h);
      Twin<int32_t> sl(slots_h);
      auto idx = out_twin<int32_t>(static_cast<size_t>(B) * k);
      auto wts = out_twin<float>(static_cast<size_t>(B) * k);
      EXPECT_EQ(kernels_of([&] {
                  gpu().moe_route_batch(logits.g.data(), bias.g.data(), RowBatch{sl.g.data(), nullptr, B}, E,
                                        k, groups, topk_group, 2.5f, idx.g.data(), wts.g.data());
                }),
                1u);
      cpu().moe_route_batch(logits.c.data(), bias.c.data(), RowBatch{sl.c.data(), nullptr, B}, E, k, groups,
                            topk_group, 2.5f, idx.c.data(), wts.c.data());
      const auto gi = idx.from_gpu(), ci = idx.from_cpu();
      const auto gw = wts.from_gpu(), cw = wts.from_cpu();
      const auto mask = row_mask(B, k, k, &slots_h);
      expect_outside_unchanged(gi, ci, mask, what + " idx");
      expect_outside_unchanged(gw, cw, mask, what + " weights");
      for (int b = 0; b < B; ++b) {
        if (slots_h[static_cast<size_t>(b)] < 0) continue;
        bool same = true;
        for (int i = 0; i < k; ++i) {
          const size_t at = static_cast<size_t>(b) * k + i;
          if (gi[at] == ci[at]) continue;
          same = false;
          ASSERT_TRUE(gi[at] >= 0 && gi[at] < E) << what << ": expert id " << gi[at];
          auto biased = [&](int e) {
            return 1.0 / (1.0 + std::exp(-static_cast<double>(logits_h[static_cast<size_t>(b) * E + e]))) +
                   bias_h[e];
          };
          EXPECT_LE(std::fabs(biased(gi[at]) - biased(ci[at])), 1e-6)
              << what << " row " << b << " slot " << i << ": gpu expert " << gi[at] << " vs cpu " << ci[at]
              << " is not a near-tie; " << seed_note();
        }
        near += !same;
        if (!same) continue;
        expect_f32_close(std::vector<float>(gw.begin() + b * k, gw.begin() + (b + 1) * k),
                         std::vector<float>(cw.begin() + b * k, cw.begin() + (b + 1) * k), what + " weights",
                         1e-5, 0);
      }
    }
  }
  std::printf("[gpu-moe] %s router: %d rows with a near-tie choice\n", s.name, near);
}

/// Row r of a row-major [rows, n] float output.
std::vector<float> got_row(const std::vector<float>& all, int r, int n) {
  return std::vector<float>(all.begin() + static_cast<ptrdiff_t>(r) * n,
                            all.begin() + static_cast<ptrdiff_t>(r + 1) * n);
}

struct GroupedCase {
  const char* name;
  bool ep;       ///< a third of the experts from E / 3: rows route to experts other ranks own
  bool shared;   ///< the shared expert too
  float limit;   ///< 10: the swiglu clamp; 0: none
  bool crowded;  ///< every row among 3 experts: pairs of one expert span several work groups
};
constexpr GroupedCase kGroupedCases[] = {{"all local, shared, clamp", false, true, 10.0f, false},
                                         {"EP, no shared, no clamp", true, false, 0.0f, false},
                                         {"crowded, shared", false, true, 10.0f, true}};

/// Every expert of a shape resident on both backends (the flash shape: 288 x 3 x 2048 x 4096
/// BF16, 14.5 GB on each side), and the shared expert; a case's rank holds only its own experts.
struct GroupedExperts {
  int E, H, I;
  size_t per;
  Big<bf16> gate, up, down, sg, su, sd;
  explicit GroupedExperts(const Shape& s)
      : E(s.experts),
        H(s.hidden),
        I(s.moe_inter),
        per(static_cast<size_t>(s.moe_inter) * s.hidden),
        gate(big_bf16(per * E, -1.0f, 1.0f, 8111)),
        up(big_bf16(per * E, -1.0f, 1.0f, 8112)),
        down(big_bf16(per * E, -0.1f, 0.1f, 8113)),
        sg(big_bf16(per, -1.0f, 1.0f, 8114)),
        su(big_bf16(per, -1.0f, 1.0f, 8115)),
        sd(big_bf16(per, -0.1f, 0.1f, 8116)) {}
  /// The case's first local expert and how many this rank holds.
  int first(const GroupedCase& c) const { return c.ep ? E / 3 : 0; }
  int num_local(const GroupedCase& c) const { return c.ep ? std::max(1, E / 3) : E; }
  ExpertWeights routed_cpu(const GroupedCase& c) const {
    const size_t off = static_cast<size_t>(first(c)) * per;
    return {gate.c.data() + off, up.c.data() + off, down.c.data() + off, first(c), num_local(c), H, I};
  }
  ExpertWeights routed_gpu(const GroupedCase& c) const {
    const size_t off = static_cast<size_t>(first(c)) * per;
    return {gate.g.data() + off, up.g.data() + off, down.g.data() + off, first(c), num_local(c), H, I};
  }
  ExpertWeights shared_cpu() const { return {sg.c.data(), su.c.data(), sd.c.data(), 0, 1, H, I}; }
  ExpertWeights shared_gpu() const { return {sg.g.data(), su.g.data(), sd.g.data(), 0, 1, H, I}; }
};

/// Every memory pipeline of the grouped experts, v1 first (the one the others but slots must match).
constexpr MoePipeline kMoePipelines[] = {MoePipeline::v1, MoePipeline::slots, MoePipeline::ringpf};
/// Whether slots runs B rows of k routes on the single-row kernels (up to cuda::kMaxRowsSlotsMoe
/// rows, where their down launch fits: the one-row op's bytes), as the rule (dispatch.cu's
/// moe_grouped_plan) says; elsewhere it runs auto's choice above the slots rows (ringpf).
bool on_slots(MoePipeline m, int B, int k, bool shared) {
  KernelPolicy policy;
  policy.moe_pipeline = m;
  return cuda::moe_grouped_plan(policy, B, cuda::moe_slots_fit(B, k, shared), true).kernel ==
         cuda::MoeKernel::slots;
}
/// Whether a pipeline gives v1's bytes at B rows: slots on the single-row kernels gives the one-row
/// op's.
bool gives_v1_bits(MoePipeline m, int B, int k, bool shared) { return !on_slots(m, B, k, shared); }

TEST_P(GpuMoe, ExpertsGrouped) {
  const Shape s = GetParam();
  const KernelPolicy before = gpu().kernel_policy();
  Rng rng(811);
  const int E = s.experts, H = s.hidden, k = s.top_k;
  const GroupedExperts experts(s);
  for (const GroupedCase& c : kGroupedCases) {
    const int first = experts.first(c);
    const ExpertWeights wc = experts.routed_cpu(c), wg = experts.routed_gpu(c);
    const ExpertWeights shc = experts.shared_cpu(), shg = experts.shared_gpu();
    // The test batches, and 2 and 4: the slots pipeline's kernels at two rows and at four (two
    // (row, route) pairs a down warp); 200: a wide launch (more rows than kMaxBatchRows: the plan
    // built once in global memory, d in global memory).
    for (int B : {1, 2, 3, 4, 16, 64, 128, 200}) {
      const std::string what = where(std::string("moe_experts_grouped ") + c.name, B);
      const auto slots_h = make_slots(rng, B, B);
      std::vector<int32_t> idx_h(static_cast<size_t>(B) * k);
      for (int b = 0; b < B; ++b) {
        int32_t* row = idx_h.data() + static_cast<size_t>(b) * k;
        for (int i = 0; i < k; ++i) row[i] = c.crowded ? first + rng.integer(0, 2) : rng.integer(0, E - 1);
        if (b == 0 && k >= 2) row[1] = row[0];                    // a repeated expert inside one row
        if (slots_h[static_cast<size_t>(b)] < 0) row[0] = first;  // owned: applied, it would write its row
      }
      Twin<int32_t> idx(idx_h), sl(slots_h);
      Twin<float> wts(rng.floats(static_cast<size_t>(B) * k, 0.1f, 1.0f));
      Twin<bf16> x(rng.bf16s(static_cast<size_t>(B) * H, -1.0f, 1.0f));
      auto cpu_out = out_twin<float>(static_cast<size_t>(B) * H);
      on_cpu_rows(B, [&](Backend& be, int b0, int b1) {
        be.moe_experts_grouped(
            x.c.data() + static_cast<size_t>(b0) * H, wc, idx.c.data() + static_cast<size_t>(b0) * k,
            wts.c.data() + static_cast<size_t>(b0) * k, RowBatch{sl.c.data() + b0, nullptr, b1 - b0}, k,
            c.shared ? &shc : nullptr, c.limit, cpu_out.c.data() + static_cast<size_t>(b0) * H);
      });
      const auto mask = row_mask(B, H, H, &slots_h);
      const auto want = cpu_out.from_cpu();
      // Every memory pipeline (KernelPolicy::moe_pipeline), v1 first: each within the tolerance of
      // the CPU, and ringpf with v1's bytes (the same MMAs in the same order; only where the
      // weights wait and which warp takes an item differ); slots on the single-row kernels: each
      // row the one-row op's bytes (below).
      std::vector<float> v1_bytes;
      for (const MoePipeline pipe : kMoePipelines) {
        const std::string pwhat = what + ", moe_pipeline " + to_string(pipe);
        KernelPolicy policy = before;
        policy.moe_pipeline = pipe;
        gpu().set_kernel_policy(policy);
        auto out = out_twin<float>(static_cast<size_t>(B) * H);
        // Two launches; a wide one three (its plan first), four on the block-item kernels (auto and
        // slots: the combine last).
        const bool wide = B > cuda::kMaxBatchRows;
        const bool block_items = pipe == MoePipeline::automatic || pipe == MoePipeline::slots;
        const uint64_t launches = !wide ? 2u : block_items ? 4u : 3u;
        gpu().reset_kernels_chosen();
        EXPECT_EQ(kernels_of([&] {
                    gpu().moe_experts_grouped(x.g.data(), wg, idx.g.data(), wts.g.data(),
                                              RowBatch{sl.g.data(), nullptr, B}, k, c.shared ? &shg : nullptr,
                                              c.limit, out.g.data());
                  }),
                  launches)
            << pwhat;
        // The kernel record names what ran: the pipeline's kernels, " wide" past kMaxBatchRows rows;
        // slots past its rows auto's choice above them (ringpf, or v1 where ringpf's rings do not
        // fit; past kMaxBatchRows rows the block items).
        {
          const std::string ran = gpu().kernels_chosen().text(), op = "moe_experts_grouped=";
          const std::string wide_suffix = wide ? " wide" : "";
          if (on_slots(pipe, B, k, c.shared)) {
            EXPECT_EQ(ran, op + "slots") << pwhat;
          } else if (block_items && wide) {
            EXPECT_EQ(ran, op + "block items") << pwhat;
          } else if (pipe == MoePipeline::slots) {
            EXPECT_TRUE(ran == op + "ringpf" || ran == op + "v1") << pwhat << ": " << ran;
          } else {
            EXPECT_EQ(ran, op + to_string(pipe) + wide_suffix) << pwhat;
          }
        }
        const auto got = out.from_gpu();
        expect_f32_close(masked(got, mask), masked(want, mask), pwhat, 1.0 / 128, 1.0 / 256);
        expect_outside_unchanged(got, want, mask, pwhat);
        if (pipe == MoePipeline::v1) {
          v1_bytes = got;
        } else if (gives_v1_bits(pipe, B, k, c.shared)) {
          expect_bytes_equal(got, v1_bytes, pwhat + " against v1");
        } else {
          // Printed, not asserted: the single-row kernels sum in their own order (each row is
          // held to the one-row op's bytes below), which can round exactly as v1 does.
          const auto a = masked(got, mask), v = masked(v1_bytes, mask);
          size_t differ = 0;
          for (size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &v[i], sizeof(float)) != 0;
          std::printf("[gpu-moe] %s: %zu of %zu outputs differ from v1's bytes\n", pwhat.c_str(), differ,
                      a.size());
        }
        if (on_slots(pipe, B, k, c.shared)) {
          // The single-row kernels: every live row has the bytes of the one-row op on that row
          // alone (moe_experts_shared / moe_experts), and a padded row's stay poisoned (above).
          for (int r = 0; r < B; ++r) {
            if (slots_h[static_cast<size_t>(r)] < 0) continue;
            auto one = out_twin<float>(static_cast<size_t>(H));
            const bf16* xr = x.g.data() + static_cast<size_t>(r) * H;
            const int32_t* ir = idx.g.data() + static_cast<size_t>(r) * k;
            const float* wr = wts.g.data() + static_cast<size_t>(r) * k;
            if (c.shared) {
              mtplab::ops::OneRow(gpu()).moe_experts_shared(xr, wg, ir, wr, k, shg, c.limit, one.g.data());
            } else {
              mtplab::ops::OneRow(gpu()).moe_experts(xr, wg, ir, wr, k, c.limit, one.g.data());
            }
            expect_bytes_equal(got_row(got, r, H), one.from_gpu(),
                               pwhat + ", row " + std::to_string(r) + " against the one-row op");
          }
        }
        // A row's numbers do not depend on B or the other rows: live rows alone, the same bytes,
        // in a batch of 64 and in a wide one. (Not under slots: a row alone takes the single-row
        // kernels, a batch ring's.)
        if ((B != 64 && B != 200) || pipe == MoePipeline::slots) continue;
        for (const int r : {0, B / 2, B - 1}) {
          if (slots_h[static_cast<size_t>(r)] < 0) continue;
          auto one = out_twin<float>(static_cast<size_t>(H));
          gpu().moe_experts_grouped(
              x.g.data() + static_cast<size_t>(r) * H, wg, idx.g.data() + static_cast<size_t>(r) * k,
              wts.g.data() + static_cast<size_t>(r) * k, RowBatch{sl.g.data() + r, nullptr, 1}, k,
              c.shared ? &shg : nullptr, c.limit, one.g.data());
          expect_bytes_equal(one.from_gpu(), got_row(got, r, H),
                             pwhat + ", row " + std::to_string(r) + " alone");
        }
      }
      gpu().set_kernel_policy(before);
    }
  }
}

// ---- ragged rows ---------------------------------------------------------------------------------------

/// The kernel texts a launch of `rows` rows may record under pipeline m (dispatch.cu's
/// moe_grouped_plan; whether ringpf's rings fit is the launcher's to say, so auto's narrow launches
/// above the slots rows may name v1 or ringpf).
bool allowed_kernel(MoePipeline m, int rows, int k, bool shared, const std::string& ran) {
  const std::string op = "moe_experts_grouped=";
  KernelPolicy policy;
  policy.moe_pipeline = m;
  const bool slots =
      cuda::moe_grouped_plan(policy, rows, cuda::moe_slots_fit(rows, k, shared), true).kernel ==
      cuda::MoeKernel::slots;
  if (slots) return ran == op + "slots";
  const bool wide = rows > cuda::kMaxBatchRows;
  switch (m) {
    case MoePipeline::v1:
      return ran == op + (wide ? "v1 wide" : "v1");
    case MoePipeline::ringpf:
      return ran == op + (wide ? "ringpf wide" : "ringpf");
    case MoePipeline::automatic:
    case MoePipeline::slots:
      return wide ? ran == op + "block items" : ran == op + "ringpf" || ran == op + "v1";
  }
  return false;
}

// The grouped experts over every ragged batch of ragged_layouts (one row; 3 .. 128 sequences of one
// row; one sequence of 1 .. 64 rows; 4, 16 and 64 sequences of 2 .. 5 rows, padded rows among
// them), each row's routes drawn fresh, under every kernel the dispatch can pick: each within the
// tolerance of the CPU (the file comment), the padded rows' outputs untouched, the kernel record
// naming what the rule picks, and v1, ringpf and (past its rows) slots with the same bytes (a
// pair's MMAs do not depend on the pipeline; the block items are v1's too).
TEST_P(GpuMoe, RaggedRows) {
  const Shape s = GetParam();
  const KernelPolicy before = gpu().kernel_policy();
  Rng rng(815);
  const int E = s.experts, H = s.hidden, k = s.top_k;
  const bool flash = s.hidden >= 4096;
  const GroupedExperts experts(s);
  const std::vector<Ragged> layouts = ragged_layouts(rng, max_rows_for(s), flash);
  constexpr MoePipeline kPipes[] = {MoePipeline::v1, MoePipeline::ringpf, MoePipeline::slots,
                                    MoePipeline::automatic};
  for (const Ragged& r : layouts) {
    const GroupedCase& c = kGroupedCases[static_cast<size_t>(rng.integer(0, 2))];
    const int R = r.rows(), first = experts.first(c);
    const std::string what = std::string(s.name) + ", " + r.name + ", " + c.name;
    std::vector<int32_t> idx_h(static_cast<size_t>(R) * k);
    for (int b = 0; b < R; ++b)
      for (int i = 0; i < k; ++i)
        idx_h[static_cast<size_t>(b) * k + i] = c.crowded ? first + rng.integer(0, 2) : rng.integer(0, E - 1);
    Twin<int32_t> idx(idx_h), sl(r.slot), ps(r.pos);
    Twin<float> wts(rng.floats(static_cast<size_t>(R) * k, 0.1f, 1.0f));
    Twin<bf16> x(rng.bf16s(static_cast<size_t>(R) * H, -1.0f, 1.0f));
    const ExpertWeights wc = experts.routed_cpu(c), wg = experts.routed_gpu(c);
    const ExpertWeights shc = experts.shared_cpu(), shg = experts.shared_gpu();
    auto cpu_out = out_twin<float>(static_cast<size_t>(R) * H);
    on_cpu_rows(R, [&](Backend& be, int b0, int b1) {
      be.moe_experts_grouped(
          x.c.data() + static_cast<size_t>(b0) * H, wc, idx.c.data() + static_cast<size_t>(b0) * k,
          wts.c.data() + static_cast<size_t>(b0) * k,
          RowBatch{sl.c.data() + b0, ps.c.data() + b0, b1 - b0, r.max_seq_rows}, k, c.shared ? &shc : nullptr,
          c.limit, cpu_out.c.data() + static_cast<size_t>(b0) * H);
    });
    const auto want = cpu_out.from_cpu();
    const auto mask = row_mask(R, H, H, &r.slot);
    std::vector<float> v1_bytes;
    for (const MoePipeline pipe : kPipes) {
      const std::string pwhat = what + ", moe_pipeline " + to_string(pipe);
      KernelPolicy policy = before;
      policy.moe_pipeline = pipe;
      gpu().set_kernel_policy(policy);
      auto out = out_twin<float>(static_cast<size_t>(R) * H);
      gpu().reset_kernels_chosen();
      gpu().moe_experts_grouped(x.g.data(), wg, idx.g.data(), wts.g.data(),
                                RowBatch{sl.g.data(), ps.g.data(), R, r.max_seq_rows}, k,
                                c.shared ? &shg : nullptr, c.limit, out.g.data());
      const std::string ran = gpu().kernels_chosen().text();
      EXPECT_TRUE(allowed_kernel(pipe, R, k, c.shared, ran)) << pwhat << ": ran " << ran;
      const auto got = out.from_gpu();
      expect_f32_close(masked(got, mask), masked(want, mask), pwhat, 1.0 / 128, 1.0 / 256);
      expect_outside_unchanged(got, want, mask, pwhat);
      if (ran.find("slots") != std::string::npos) continue;  // the one-row op's bytes (ExpertsGrouped)
      if (v1_bytes.empty()) {
        v1_bytes = got;
      } else {
        expect_bytes_equal(got, v1_bytes, pwhat + " against v1");
      }
    }
    gpu().set_kernel_policy(before);
  }
}

// ---- padding -------------------------------------------------------------------------------------------

// Every row padded: the grouped experts write nothing under every pipeline.
TEST(GpuMoePadding, AllRowsPaddedWriteNothing) {
  Rng rng(812);
  const Shape s = kShapes[0];
  const int B = 8, H = s.hidden, I = s.moe_inter, k = s.top_k, E = s.experts;
  Twin<int32_t> none(std::vector<int32_t>(B, -1));
  Twin<bf16> x(rng.bf16s(static_cast<size_t>(B) * H, -1.0f, 1.0f));
  Twin<bf16> gate(rng.bf16s(static_cast<size_t>(E) * I * H, -1, 1)),
      up(rng.bf16s(static_cast<size_t>(E) * I * H, -1, 1));
  Twin<bf16> down(rng.bf16s(static_cast<size_t>(E) * I * H, -0.1f, 0.1f));
  Twin<int32_t> idx(std::vector<int32_t>(static_cast<size_t>(B) * k, 0));
  Twin<float> wts(rng.floats(static_cast<size_t>(B) * k, 0.1f, 1.0f));
  auto out = out_twin<float>(static_cast<size_t>(B) * H);
  const ExpertWeights w{gate.g.data(), up.g.data(), down.g.data(), 0, E, H, I};
  const KernelPolicy before = gpu().kernel_policy();
  for (const MoePipeline pipe : kMoePipelines) {
    KernelPolicy policy = before;
    policy.moe_pipeline = pipe;
    gpu().set_kernel_policy(policy);
    gpu().moe_experts_grouped(x.g.data(), w, idx.g.data(), wts.g.data(), RowBatch{none.g.data(), nullptr, B},
                              k, &w, 10.0f, out.g.data());
    expect_bytes_equal(out.from_gpu(), out.from_cpu(),
                       std::string("grouped experts, every row padded, moe_pipeline ") + to_string(pipe));
  }
  gpu().set_kernel_policy(before);
}

INSTANTIATE_TEST_SUITE_P(Models, GpuMoe, ::testing::ValuesIn(kShapes), shape_name);

}  // namespace
}  // namespace mtplab::ops::gputest
