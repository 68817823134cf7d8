// Sampling statistics end to end on one GPU, tiny preset (synthetic weights, the synthetic
// target's trace): the CUDA drafter's DraftStats, from propose (B = 1) and propose_batch (B = 3),
// BF16 and FP8 heads, cuda_graph off and on, against the CPU stats ops applied to the CUDA head's
// own logits of the CUDA drafter's head inputs (keep_head_inputs): the head op the drafter runs
// (head_argmax for one row, head_argmax_batch over the step's padded rows), recomputed here, so the
// comparison isolates the stats path (logits kept by the head, the stats kernels, the device-side
// parameters, the graphs) from the drafter's other rounding. Tolerances: the margin bit-identical;
// log q within 1e-6 relative + 1e-6 absolute (both sum the same fp64 per-key terms, in another order).
// Also: cuda_graph on gives the drafts and stats of cuda_graph off bit for bit (the graph replays
// the same kernels), and a call with another transform replays the recorded graphs (no recording
// per call). Exits 77 (skipped) without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "drafter/exchange.hpp"
#include "e2e_util.hpp"

using namespace mtplab;
using drafter::DraftStats;
using drafter::SamplingTransform;

namespace {

std::unique_ptr<ops::Backend> g_gpu;
ops::Backend& gpu() { return *g_gpu; }

constexpr int kDraft = 3;
// A truncating transform first, an untruncated one second: the first call of a drafter runs op by op
// (warm-up), so by the end of the first round both stats-pass graphs have been recorded.
const SamplingTransform kTransforms[] = {{0.7, 5, 0.9}, {1.0, 0, 1.0}, {0.7, 0, 0.9}, {0.7, 0, 1.0}};

std::string name_of(const SamplingTransform& t) {
  return str("T=", t.temperature, " top_k=", t.top_k, " top_p=", t.top_p);
}

struct Fixture {
  model::ModelConfig cfg = e2e::preset("tiny", 256);
  model::MtpWeights w = e2e::one_rank_weights(cfg);
  std::unique_ptr<ops::Backend> cpu = ops::make_cpu_backend();
  std::vector<io::TraceSequence> trace;
  int H = cfg.hidden;
  int V = static_cast<int>(cfg.vocab);
  ops::Array<bf16> W;
  ops::Array<fp8e4m3> W8;
  ops::Array<float> scale;
  /// A CUDA drafter of kDraft drafts, its head FP8 or BF16, with or without graphs.
  std::unique_ptr<drafter::MtpDrafter> gpu_drafter(bool fp8, bool graph) {
    drafter::DrafterOptions opt;
    opt.head_fp8 = fp8;
    opt.cuda_graph = graph;
    opt.draft_len = kDraft;
    return drafter::make_drafter(gpu(), nullptr, cfg, w, opt);
  }
  Fixture() : trace(e2e::make_trace(gpu(), cfg, 3, 30, 40, 5)) {
    model::quantize_head_fp8(w);
    W = drafter::upload(gpu(), w.lm_head);
    W8 = drafter::upload(gpu(), w.lm_head_fp8.weight);
    scale = drafter::upload(gpu(), w.lm_head_fp8.scale);
  }

  /// The CUDA head's logits of `rows` head inputs y [rows, H] (host), as the drafter's head ran
  /// them: one row through head_argmax, else head_argmax_batch over `padded` rows (slot -1 past rows).
  std::vector<bf16> gpu_logits(const std::vector<bf16>& y, int rows, int padded, bool fp8, bool batched) {
    ops::Array<bf16> x(gpu(), static_cast<size_t>(padded) * H),
        logits(gpu(), static_cast<size_t>(padded) * V);
    ops::Array<ops::ArgMax> am(gpu(), static_cast<size_t>(padded));
    std::vector<bf16> xs(static_cast<size_t>(padded) * H, bf16{0});
    std::copy(y.begin(), y.end(), xs.begin());
    gpu().upload(x.data(), xs.data(), xs.size() * sizeof(bf16));
    const fp8e4m3* w8 = fp8 ? W8.data() : nullptr;
    const float* sc = fp8 ? scale.data() : nullptr;
    if (!batched) {
      gpu().head_argmax(W.data(), w8, sc, x.data(), V, H, 0, logits.data(), am.data());
    } else {
      std::vector<int32_t> slot(static_cast<size_t>(padded), -1);
      for (int b = 0; b < rows; ++b) slot[static_cast<size_t>(b)] = b;
      ops::Array<int32_t> s(gpu(), slot.size());
      gpu().upload(s.data(), slot.data(), slot.size() * sizeof(int32_t));
      gpu().head_argmax_batch(W.data(), w8, sc, x.data(), ops::RowBatch{s.data(), nullptr, padded}, V, H, 0,
                              logits.data(), V, am.data());
    }
    std::vector<bf16> out(static_cast<size_t>(rows) * V);
    gpu().download(out.data(), logits.data(), out.size() * sizeof(bf16));
    return out;
  }

  /// The CPU stats ops on whole rows of logits.
  std::vector<ops::TokenStats> cpu_stats(const std::vector<bf16>& logits, int rows,
                                         const std::vector<int32_t>& req, const SamplingTransform& t) {
    const ops::SampleParams p = drafter::sample_params(t);
    ops::LogitRows v;
    v.data = logits.data();
    v.rows = rows;
    v.ld = v.n = V;
    std::vector<ops::LogitStats> parts(static_cast<size_t>(rows));
    std::vector<ops::TokenStats> out(static_cast<size_t>(rows));
    cpu->logit_stats_batch(v, req.data(), &p, parts.data());
    cpu->logit_stats_combine(parts.data(), 1, rows, &p, out.data());
    return out;
  }
};

struct Counts {
  int compared = 0, inside = 0, outside = 0;
};

void expect_match(const DraftStats& got, const ops::TokenStats& want, const std::string& what, Counts& n) {
  ++n.compared;
  (std::isinf(want.req_logprob) ? n.outside : n.inside)++;
  EXPECT_EQ(float_to_bits(got.margin), float_to_bits(want.margin)) << what;
  EXPECT_NEAR(got.logprob, want.logprob, 1e-6 * std::fabs(want.logprob) + 1e-6) << what;
  if (std::isinf(want.req_logprob)) {
    EXPECT_EQ(got.req_logprob, want.req_logprob) << what;
  } else {
    EXPECT_NEAR(got.req_logprob, want.req_logprob, 1e-6 * std::fabs(want.req_logprob) + 1e-6) << what;
  }
}

/// Every draft and stat of a run, for graph on vs off.
struct Recorded {
  std::vector<int32_t> drafts;
  std::vector<DraftStats> stats;
  void add(const std::vector<int32_t>& d, const std::vector<DraftStats>& st) {
    drafts.insert(drafts.end(), d.begin(), d.end());
    stats.insert(stats.end(), st.begin(), st.end());
  }
};

bool same(const Recorded& a, const Recorded& b) {
  if (a.drafts != b.drafts || a.stats.size() != b.stats.size()) return false;
  for (size_t i = 0; i < a.stats.size(); ++i)
    if (float_to_bits(a.stats[i].margin) != float_to_bits(b.stats[i].margin) ||
        float_to_bits(a.stats[i].logprob) != float_to_bits(b.stats[i].logprob) ||
        float_to_bits(a.stats[i].req_logprob) != float_to_bits(b.stats[i].req_logprob))
      return false;
  return true;
}

/// The extras of a stats round: `requested` under `t` into `stats`, and `chain` as the chain
/// tokens when `with_chain` (the spans refer to the vectors given).
drafter::ProposeExtras extras(const std::vector<int32_t>& requested, const std::vector<int32_t>& chain,
                              bool with_chain, const SamplingTransform& t, std::vector<DraftStats>& stats) {
  drafter::ProposeExtras x;
  x.requested = requested;
  if (with_chain) x.chain_tokens = chain;
  x.transform = t;
  x.stats = &stats;
  return x;
}

/// After one drafter's three rounds (recorded[r]: its graph recordings after round r): with graphs,
/// the first round recorded, the second (extras) recorded nothing new, the third (chain tokens)
/// one step variant; the stats fell both inside and outside the support.
void expect_rounds(const int (&recorded)[3], bool graph, bool fp8, const Counts& n) {
  if (graph) {
    EXPECT_GT(recorded[0], 0);
    EXPECT_EQ(recorded[1], recorded[0]) << (fp8 ? "fp8" : "bf16") << ": a call with extras recorded again";
    EXPECT_EQ(recorded[2], recorded[1] + 1) << (fp8 ? "fp8" : "bf16") << ": chain tokens: one step variant";
  }
  EXPECT_GT(n.inside, 0);
  EXPECT_GT(n.outside, 0);
}

}  // namespace

TEST(GpuStats, SingleSequenceStatsMatchTheCpuOnTheGpuLogits) {
  Fixture f;
  const auto& seq = f.trace[0];
  for (bool fp8 : {false, true}) {
    Recorded runs[2];
    for (bool graph : {false, true}) {
      auto d = f.gpu_drafter(fp8, graph);
      d->keep_head_inputs(true);
      auto st = d->new_sequence();
      int L = 30;
      d->append_rows(*st, seq.tokens.data() + 1, seq.hiddens.data(), L - 1, 0);
      Counts n;
      int recorded[3] = {};
      // Three rounds of every transform on one sequence (rewrite keeps one row a step): the first
      // warms and records, the second must only replay, the third adds chain tokens (one more
      // step variant to record, the stats graphs replayed).
      for (int round = 0; round < 3; ++round) {
        for (const SamplingTransform& t : kTransforms) {
          std::vector<int32_t> req(seq.tokens.begin() + L + 1, seq.tokens.begin() + L + 1 + kDraft);
          std::vector<int32_t> chain(seq.tokens.begin() + L + 1, seq.tokens.begin() + L + kDraft);
          std::vector<DraftStats> stats;
          const drafter::ProposeExtras x = extras(req, chain, round == 2, t, stats);
          const auto drafts = d->propose(*st, seq.tokens[L], seq.hiddens.data() + (L - 1) * f.H, kDraft, x);
          const auto ys = d->head_inputs();
          // head_argmax ran once per draft: the same single-row logits.
          std::vector<bf16> per_row;
          for (int i = 0; i < kDraft; ++i) {
            const std::vector<bf16> yi(ys.begin() + i * f.H, ys.begin() + (i + 1) * f.H);
            const auto li = f.gpu_logits(yi, 1, 1, fp8, false);
            per_row.insert(per_row.end(), li.begin(), li.end());
          }
          const auto want = f.cpu_stats(per_row, kDraft, req, t);
          for (int i = 0; i < kDraft; ++i) {
            const std::string what = str(fp8 ? "fp8" : "bf16", graph ? " graph " : " eager ", name_of(t),
                                         " round ", round, " draft ", i);
            expect_match(stats[static_cast<size_t>(i)], want[static_cast<size_t>(i)], what, n);
            // The draft is the logits' argmax (lowest id among ties).
            const bf16* row = per_row.data() + static_cast<size_t>(i) * f.V;
            int best = 0;
            for (int v = 1; v < f.V; ++v)
              if (to_float(row[v]) > to_float(row[best])) best = v;
            EXPECT_EQ(drafts[static_cast<size_t>(i)], best) << what;
          }
          runs[graph].add(drafts, stats);
          d->after_verify(*st, 0);
          ++L;
        }
        recorded[round] = d->graph_recordings();
      }
      expect_rounds(recorded, graph, fp8, n);
    }
    EXPECT_TRUE(same(runs[0], runs[1])) << (fp8 ? "fp8" : "bf16") << ": cuda_graph on and off differ";
  }
}

TEST(GpuStats, BatchedStatsMatchTheCpuOnTheGpuLogits) {
  Fixture f;
  const int B = 3;
  const int lens[B] = {26, 31, 29};
  for (bool fp8 : {false, true}) {
    Recorded runs[2];
    for (bool graph : {false, true}) {
      auto d = f.gpu_drafter(fp8, graph);
      // The same padding with and without graphs (another padded row count may pick other GEMMs).
      auto batch = d->new_batch(B, drafter::BatchPadding::bucket);
      d->keep_head_inputs(true);
      int L[B];
      for (int s = 0; s < B; ++s) {
        L[s] = lens[s];
        const int slot = d->new_sequence(*batch);
        ASSERT_EQ(slot, s);
        d->append_rows(*batch, slot, f.trace[static_cast<size_t>(s)].tokens.data() + 1,
                       f.trace[static_cast<size_t>(s)].hiddens.data(), L[s] - 1, 0);
      }
      const int padded = drafter::batch_bucket(B);
      Counts n;
      int recorded[3] = {};
      for (int round = 0; round < 3; ++round) {
        for (const SamplingTransform& t : kTransforms) {
          std::vector<drafter::BatchRow> rows;
          std::vector<int32_t> req, chain;
          for (int s = 0; s < B; ++s) {
            const auto& q = f.trace[static_cast<size_t>(s)];
            rows.push_back({s, q.tokens[static_cast<size_t>(L[s])],
                            q.hiddens.data() + static_cast<size_t>(L[s] - 1) * f.H});
            req.insert(req.end(), q.tokens.begin() + L[s] + 1, q.tokens.begin() + L[s] + 1 + kDraft);
            chain.insert(chain.end(), q.tokens.begin() + L[s] + 1, q.tokens.begin() + L[s] + kDraft);
          }
          std::vector<DraftStats> stats;
          const drafter::ProposeExtras x = extras(req, chain, round == 2, t, stats);
          const auto drafts = d->propose_batch(*batch, rows, kDraft, x);
          const auto ys = d->batch_head_inputs();  // [B, k, H]
          ASSERT_EQ(stats.size(), static_cast<size_t>(B * kDraft));
          for (int i = 0; i < kDraft; ++i) {
            // Draft i of every row went through one head_argmax_batch over the padded rows.
            std::vector<bf16> yi;
            std::vector<int32_t> ri;
            for (int s = 0; s < B; ++s) {
              const auto at = ys.begin() + (static_cast<ptrdiff_t>(s) * kDraft + i) * f.H;
              yi.insert(yi.end(), at, at + f.H);
              ri.push_back(req[static_cast<size_t>(s * kDraft + i)]);
            }
            const auto logits = f.gpu_logits(yi, B, padded, fp8, true);
            const auto want = f.cpu_stats(logits, B, ri, t);
            for (int s = 0; s < B; ++s)
              expect_match(stats[static_cast<size_t>(s * kDraft + i)], want[static_cast<size_t>(s)],
                           str(fp8 ? "fp8" : "bf16", graph ? " graph " : " eager ", name_of(t), " round ",
                               round, " row ", s, " draft ", i),
                           n);
          }
          runs[graph].add(drafts, stats);
          for (int s = 0; s < B; ++s) {
            d->after_verify(*batch, s, 0);
            ++L[s];
          }
        }
        recorded[round] = d->graph_recordings();
      }
      expect_rounds(recorded, graph, fp8, n);
    }
    EXPECT_TRUE(same(runs[0], runs[1])) << (fp8 ? "fp8" : "bf16") << ": cuda_graph on and off differ";
  }
}

TEST(GpuStats, TargetLogprobsMatchTheCpuDrafters) {
  // The target's head is the BF16 lm_head on the trace's hiddens: the CUDA values against the CPU
  // drafter's, within the rounding of two backends' heads (a BF16 logit may round one ulp apart).
  Fixture f;
  auto dg = drafter::make_drafter(gpu(), nullptr, f.cfg, f.w, drafter::DrafterOptions{});
  auto dc = drafter::make_drafter(*f.cpu, nullptr, f.cfg, f.w, drafter::DrafterOptions{});
  const auto& seq = f.trace[1];
  const int n = 69;
  for (const SamplingTransform& t : kTransforms) {
    const auto g = dg->target_logprobs(seq.hiddens.data(), seq.tokens.data() + 1, n, t);
    const auto c = dc->target_logprobs(seq.hiddens.data(), seq.tokens.data() + 1, n, t);
    int close = 0;
    for (int r = 0; r < n; ++r) {
      const double a = g[static_cast<size_t>(r)], b = c[static_cast<size_t>(r)];
      if (std::isinf(a) || std::isinf(b)) {
        close += a == b;
        continue;
      }
      // One ulp of a logit near 8 is 1/32: 0.05 / T bounds it with room.
      EXPECT_NEAR(a, b, 0.05 / t.temperature) << name_of(t) << " row " << r;
      close += std::fabs(a - b) <= 1e-5 * std::fabs(b) + 1e-5;
    }
    EXPECT_GE(close, n * 9 / 10) << name_of(t) << ": most rows' logits round alike on both heads";
  }
}

int main(int argc, char** argv) {
  return e2e::gpu_test_main(argc, argv, g_gpu, "the end-to-end GPU tests need one",
                            "sampling-statistics end-to-end GPU tests");
}
