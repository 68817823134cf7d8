// Helpers of the end-to-end GPU tests of the drafter: presets with a short context, traces from
// the synthetic target, and the lockstep comparison of two drafters on the same trace.
//
// Lockstep: both drafters get the same inputs at every step, and both verify with the FIRST
// drafter's accepted count, so their caches hold the same rows (up to each backend's rounding)
// for the whole sequence and every step compares like with like. Within a step, draft i is
// comparable only while drafts 0 .. i-1 agree (later drafts chain different tokens).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/trace.hpp"
#include "drafter/factory.hpp"
#include "drafter/target.hpp"
#include "harness/replay.hpp"
#include "model/weights.hpp"

namespace mtplab::e2e {

using test::make_trace;
using test::preset;

/// The synthetic MTP weights (seed 11) of `cfg` on one rank, the head unsharded.
inline model::MtpWeights one_rank_weights(const model::ModelConfig& cfg) {
  return model::synthesize_mtp_weights(cfg, model::make_shard_plan(cfg, 0, 1, model::HeadSharding::none), 11);
}

/// One disagreement between the reference (CPU) draft and the other backend's draft, scored
/// with the reference's own logits.
struct Disagreement {
  int sequence = 0, position = 0, draft = 0;
  int32_t ref_token = 0, other_token = 0;
  float margin = 0;     ///< reference top-1 minus top-2 logit
  float gap = 0;        ///< reference logit of its pick minus its logit of the other's pick
  float tolerance = 0;  ///< allowed margin (see lockstep())
  float head_gap =
      0;  ///< CPU head on the OTHER backend's y: its best logit minus its logit of the other's pick
  float y_rel_diff = 0;  ///< ||y_other - y_ref|| / ||y_ref||, the head inputs of this draft
  /// A near-tie at the head: the reference's top-2 margin is within the tolerance.
  bool near_tie() const { return margin <= tolerance; }
};

struct LockstepReport {
  int compared = 0;  ///< drafts compared (up to and including a step's first disagreement)
  int agreed = 0;
  int steps = 0;
  std::vector<Disagreement> disagreements;
  double agreement() const { return compared ? static_cast<double>(agreed) / compared : 0.0; }
};

/// BF16 spacing at |v|.
inline float bf16_ulp(float v) {
  const float a = std::max(std::fabs(v), 1e-30f);
  return std::ldexp(1.0f, static_cast<int>(std::floor(std::log2(a))) - 7);
}

/// Replays `seq` on `ref` (CPU backend) and `other` in lockstep (see the file comment), both
/// with their head inputs kept. At a disagreement the reference's logits are recomputed on the
/// host from its head input y (bit-identical to its own head: same backend, same op), and from
/// the other backend's y too. The tolerance is `tol_ulps` BF16 ulps of the largest |logit|: the
/// two backends round the same function at the same points and differ only by summation order,
/// which flips BF16 roundings by one ulp here and there; through the whole layer those flips move
/// a logit by a few ulps of the logit scale, so a reference margin within that distance is a
/// near-tie at the head, not a bug.
inline void lockstep(drafter::MtpDrafter& ref, drafter::MtpDrafter& other, ops::Backend& ref_be,
                     const model::MtpWeights& w, bool head_fp8, const io::TraceSequence& seq, int k,
                     int hidden, float tol_ulps, LockstepReport& report) {
  const int N = static_cast<int>(seq.tokens.size());
  const int P = seq.prompt_length;
  auto hidden_row = [&](int r) { return seq.hiddens.data() + static_cast<size_t>(r) * hidden; };
  auto st_ref = ref.new_sequence();
  auto st_other = other.new_sequence();
  ref.append_rows(*st_ref, seq.tokens.data() + 1, hidden_row(0), P - 1, 0);
  other.append_rows(*st_other, seq.tokens.data() + 1, hidden_row(0), P - 1, 0);
  const int64_t V = w.lm_head.dim(0);
  std::vector<bf16> logits(static_cast<size_t>(V));
  int L = P;
  while (L + k <= N - 1) {
    const auto a = ref.propose(*st_ref, seq.tokens[L], hidden_row(L - 1), k);
    const auto b = other.propose(*st_other, seq.tokens[L], hidden_row(L - 1), k);
    ++report.steps;
    for (int i = 0; i < k; ++i) {
      ++report.compared;
      if (a[i] == b[i]) {
        ++report.agreed;
        continue;
      }
      const std::vector<bf16> y = ref.head_inputs();
      const std::vector<bf16> y_other = other.head_inputs();
      const bf16* yr = y.data() + static_cast<size_t>(i) * hidden;
      const bf16* yo = y_other.data() + static_cast<size_t>(i) * hidden;
      auto head = [&](const bf16* x, std::vector<bf16>& out) {
        ops::ArgMax am{};
        ref_be.head_argmax(w.lm_head.data.data(), head_fp8 ? w.lm_head_fp8.weight.data.data() : nullptr,
                           head_fp8 ? w.lm_head_fp8.scale.data.data() : nullptr, x, static_cast<int>(V),
                           hidden, 0, out.data(), &am);
        return am;
      };
      const ops::ArgMax am = head(yr, logits);
      EXPECT_EQ(am.index, a[i]) << "the reference's recomputed head disagrees with its own draft";
      std::vector<bf16> logits_other(static_cast<size_t>(V));
      const ops::ArgMax am_other = head(yo, logits_other);
      double dd = 0, nn = 0;
      for (int j = 0; j < hidden; ++j) {
        const double r = to_float(yr[j]), o = to_float(yo[j]);
        dd += (o - r) * (o - r);
        nn += r * r;
      }
      float top2 = -INFINITY, largest = 0;
      for (int64_t v = 0; v < V; ++v) {
        const float x = to_float(logits[static_cast<size_t>(v)]);
        largest = std::max(largest, std::fabs(x));
        if (v != a[i]) top2 = std::max(top2, x);
      }
      Disagreement d;
      d.sequence = static_cast<int>(seq.index);
      d.position = L;
      d.draft = i;
      d.ref_token = a[i];
      d.other_token = b[i];
      d.margin = to_float(logits[static_cast<size_t>(a[i])]) - top2;
      d.gap = to_float(logits[static_cast<size_t>(a[i])]) - to_float(logits[static_cast<size_t>(b[i])]);
      d.tolerance = tol_ulps * bf16_ulp(largest);
      d.head_gap = am_other.value - to_float(logits_other[static_cast<size_t>(b[i])]);
      d.y_rel_diff = nn > 0 ? static_cast<float>(std::sqrt(dd / nn)) : 0.0f;
      report.disagreements.push_back(d);
      break;  // later drafts of this step chain different tokens
    }
    std::vector<int32_t> targets(seq.tokens.begin() + L + 1, seq.tokens.begin() + L + 1 + k);
    const int acc = harness::accepted_prefix(a, targets);
    ref.after_verify(*st_ref, acc);
    other.after_verify(*st_other, acc);
    const int next_L = L + acc + 1;
    const int from = st_ref->seq_len(0);
    EXPECT_EQ(st_other->seq_len(0), from);
    const int n = next_L - 1 - from;
    ref.append_rows(*st_ref, seq.tokens.data() + from + 1, hidden_row(from), n, from,
                    drafter::Phase::catch_up);
    other.append_rows(*st_other, seq.tokens.data() + from + 1, hidden_row(from), n, from,
                      drafter::Phase::catch_up);
    L = next_L;
  }
}

inline void print_report(const std::string& what, const LockstepReport& r) {
  std::printf("[gpu-e2e] %s: %d steps, %d drafts compared, %d agree (%.4f), %zu disagreements\n",
              what.c_str(), r.steps, r.compared, r.agreed, r.agreement(), r.disagreements.size());
  for (const auto& d : r.disagreements)
    std::printf(
        "[gpu-e2e]   seq %d L %d draft %d: cpu %d vs gpu %d, cpu top-2 margin %.5g (tolerance %.5g), gap "
        "%.5g; "
        "head inputs differ by %.3g (relative L2); cpu head on the gpu's input: gpu pick %.5g below its "
        "best%s\n",
        d.sequence, d.position, d.draft, d.ref_token, d.other_token, d.margin, d.tolerance, d.gap,
        d.y_rel_diff, d.head_gap, d.near_tie() ? "" : "  (not a head near-tie)");
  std::fflush(stdout);
}

/// Every step's drafts of a plain replay of `trace`.
inline std::vector<std::vector<int32_t>> replay_drafts(drafter::MtpDrafter& d,
                                                       const std::vector<io::TraceSequence>& trace, int k,
                                                       int hidden) {
  std::vector<std::vector<int32_t>> out;
  harness::AcceptanceStats stats;
  for (const auto& seq : trace)
    for (auto& step : harness::replay_sequence(d, seq, static_cast<int>(seq.index), k, hidden, stats))
      out.push_back(step.drafts);
  return out;
}

/// main() of a one-GPU test program: lists the tests without a GPU (--gtest_list_tests); exits 77
/// (skipped) when no CUDA device is visible, printing "SKIPPED: no CUDA device is visible; " and
/// `needs` ("the end-to-end GPU tests need one"); otherwise `gpu` holds device 0's backend while
/// the tests run, after `setup(*gpu)` (when given) and the line "<banner> on <device>" (when
/// `banner` is non-null).
inline int gpu_test_main(int argc, char** argv, std::unique_ptr<ops::Backend>& gpu, const char* needs,
                         const char* banner, const std::function<void(ops::Backend&)>& setup = {}) {
  ::testing::InitGoogleTest(&argc, argv);
  if (GTEST_FLAG_GET(list_tests)) return RUN_ALL_TESTS();
  if (!ops::cuda_backend_available()) {
    std::printf("SKIPPED: no CUDA device is visible; %s\n", needs);
    return 77;
  }
  gpu = ops::make_cuda_backend(0);
  if (setup) setup(*gpu);
  if (banner) std::printf("%s on %s\n", banner, gpu->device_name().c_str());
  const int rc = RUN_ALL_TESTS();
  gpu.reset();
  return rc;
}

}  // namespace mtplab::e2e
