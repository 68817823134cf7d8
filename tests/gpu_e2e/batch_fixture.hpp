// The fixture of the batched end-to-end GPU tests (test_gpu_batch_e2e, test_gpu_index_share): a
// preset with a short context, unsharded synthetic weights (seed 11), a trace from the synthetic
// target on the GPU, prompt lengths spread over a case's range, and the CPU reference's head at
// any draft of the scripted replay (tests/drafter/batch_replay.hpp), computed once per sequence.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "drafter/batch_replay.hpp"
#include "e2e_util.hpp"

namespace mtplab::e2e {

struct BatchCase {
  const char* preset;
  int max_seq_len;
  int prompt_lo, prompt_hi;  ///< prompt lengths spread over this range
  int tokens;                ///< trace length of every sequence
};

inline std::string case_name(const ::testing::TestParamInfo<BatchCase>& p) { return p.param.preset; }

inline std::vector<int> prompts(const BatchCase& c, size_t count) {
  return test::spread_prompts(count, c.prompt_lo, 17, static_cast<size_t>(c.prompt_hi - c.prompt_lo + 1));
}

/// The CPU reference's head at one draft: its pick, its top-2 margin and the tolerance.
struct HeadMargin {
  float margin = 0, tolerance = 0;
  int32_t token = -1;
};

/// How two drafters' drafts compare with each other (BatchFixture::compare).
struct Agreement {
  int compared = 0, agreed = 0;
  int near = 0;           ///< disagreements at a head near-tie of the CPU reference
  int upstream = 0;       ///< disagreements that are not (a discrete choice inside the block flipped)
  bool complete = false;  ///< false: the two replays drafted different numbers of steps (a failure)
};

struct BatchFixture {
  BatchCase c;
  int k;
  float tol_ulps;
  drafter::DrafterOptions options;  ///< every drafter's arms (make sets draft_len and cuda_graph)
  model::ModelConfig cfg;
  model::MtpWeights w;
  std::vector<io::TraceSequence> trace;
  std::unique_ptr<ops::Backend> cpu = ops::make_cpu_backend();
  std::map<size_t, std::vector<std::vector<bf16>>> head_inputs;

  /// `sequences` sequences of the case, traced on `gpu`; drafters of `draft_len` drafts per
  /// propose; a head margin within `near_tie_ulps` BF16 ulps of the largest |logit| is a near-tie.
  BatchFixture(ops::Backend& gpu, const BatchCase& cs, int sequences, int draft_len, float near_tie_ulps,
               drafter::DrafterOptions opts = {})
      : c(cs),
        k(draft_len),
        tol_ulps(near_tie_ulps),
        options(opts),
        cfg(preset(cs.preset, cs.max_seq_len)),
        w(one_rank_weights(cfg)),
        trace(make_trace(gpu, cfg, sequences, cs.prompt_hi, cs.tokens - cs.prompt_hi, 5)) {}

  std::unique_ptr<drafter::MtpDrafter> make(ops::Backend& be, bool graph) {
    drafter::DrafterOptions opt = options;
    opt.draft_len = k;
    opt.cuda_graph = graph;
    return drafter::make_drafter(be, nullptr, cfg, w, opt);
  }

  /// The CPU single-sequence drafter's head inputs of sequence s per step (k rows of H each), with
  /// replay_single's script (which drafts exactly what the CPU batched drafter drafts); once per
  /// sequence, on its first disagreement.
  const std::vector<std::vector<bf16>>& cpu_head_inputs(size_t s) {
    auto it = head_inputs.find(s);
    if (it != head_inputs.end()) return it->second;
    auto d = make(*cpu, false);
    d->keep_head_inputs(true);
    std::vector<std::vector<bf16>> steps;
    test::replay_scripted(*d, trace[s], s, prompts(c, trace.size())[s], k, cfg.hidden,
                          [&](const std::vector<int32_t>&) { steps.push_back(d->head_inputs()); });
    return head_inputs.emplace(s, std::move(steps)).first->second;
  }

  /// The CPU head at draft i of step `step` of sequence s.
  HeadMargin cpu_margin(size_t s, int step, int i) {
    const std::vector<bf16>& y = cpu_head_inputs(s).at(static_cast<size_t>(step));
    const int H = cfg.hidden;
    const int64_t V = w.lm_head.dim(0);
    std::vector<bf16> logits(static_cast<size_t>(V));
    ops::ArgMax am{};
    cpu->head_argmax(w.lm_head.data.data(), nullptr, nullptr, y.data() + static_cast<size_t>(i) * H,
                     static_cast<int>(V), H, 0, logits.data(), &am);
    float top2 = -INFINITY, largest = 0;
    for (int64_t v = 0; v < V; ++v) {
      const float x = to_float(logits[static_cast<size_t>(v)]);
      largest = std::max(largest, std::fabs(x));
      if (v != am.index) top2 = std::max(top2, x);
    }
    HeadMargin m;
    m.margin = am.value - top2;
    m.tolerance = tol_ulps * bf16_ulp(largest);
    m.token = am.index;
    return m;
  }

  /// `other`'s drafts against the reference `ref`, step by step (k drafts a step): a step counts
  /// up to and including its first disagreement (later drafts chain different tokens), which the
  /// CPU head's margin there calls a near-tie (within the tolerance) or upstream. With
  /// `cpu_drafts`, the CPU single-sequence replay's pick at a disagreement must equal that draft
  /// (the two CPU replays agree). Prints each disagreement and the counts, as "[tag] what: ...".
  void compare(const test::SequenceDrafts& ref, const test::SequenceDrafts& other,
               const test::SequenceDrafts* cpu_drafts, const char* tag, const std::string& what,
               Agreement& a) {
    a = Agreement{};
    ASSERT_EQ(ref.size(), other.size()) << what;
    for (size_t s = 0; s < ref.size(); ++s) {
      ASSERT_EQ(ref[s].size(), other[s].size())
          << what << ": sequence " << s << " drafted a different number of steps";
      for (size_t step = 0; step * k < ref[s].size(); ++step) {
        for (int i = 0; i < k; ++i) {
          const size_t at = step * k + static_cast<size_t>(i);
          ++a.compared;
          if (ref[s][at] == other[s][at]) {
            ++a.agreed;
            continue;
          }
          const HeadMargin m = cpu_margin(s, static_cast<int>(step), i);
          if (cpu_drafts) {
            EXPECT_EQ(m.token, (*cpu_drafts)[s][at])
                << "the CPU single-sequence replay disagrees with the CPU batched drafter";
          }
          std::printf(
              "[%s] %s: seq %zu step %zu draft %d: %d vs %d, cpu top-2 margin %.5g (tolerance %.5g)%s\n", tag,
              what.c_str(), s, step, i, ref[s][at], other[s][at], m.margin, m.tolerance,
              m.margin <= m.tolerance ? "" : "  (not a head near-tie)");
          ++(m.margin <= m.tolerance ? a.near : a.upstream);
          break;  // later drafts of this step chain different tokens
        }
      }
    }
    std::printf("[%s] %s: %d drafts compared, %d agree, %d near-ties, %d upstream\n", tag, what.c_str(),
                a.compared, a.agreed, a.near, a.upstream);
    std::fflush(stdout);
    a.complete = true;
  }
};

}  // namespace mtplab::e2e
