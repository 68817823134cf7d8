// The CUDA sampling-statistics ops (logit_stats_batch, logit_stats_combine) against the CPU
// reference: fresh random BF16 logits (seeded per run, gpu_test_util.hpp) at the three preset vocab
// sizes, rows 1, 3, 16, 128 (and 300: more than one launch of kStatsRows rows), every transform of
// T in {0.7, 1.0} x top_k in {0, 5} x top_p in {1.0, 0.9}, whole rows, shards at an offset, and
// gathered segments; logits rounded to halves (ties at the thresholds) at one size; outputs
// poisoned (NaN) before each op.
// Tolerances: max, second and the requested logit are BF16 values picked by exact integer
// thresholds: bit-identical. The kept mass is a sum of the same per-key fp64 terms in another order:
// within 1e-6 relative (one fp32 ulp is 1.2e-7). The combine is fp64 on both: log q within 1e-6
// relative + 1e-6 absolute, the margin bit-identical.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_test_util.hpp"

namespace mtplab::ops::gputest {
namespace {

struct Transform {
  float temperature;
  int top_k;
  float top_p;
};
const Transform kTransforms[] = {{1.0f, 0, 1.0f}, {0.7f, 0, 1.0f}, {1.0f, 5, 1.0f}, {0.7f, 5, 1.0f},
                                 {1.0f, 0, 0.9f}, {0.7f, 0, 0.9f}, {1.0f, 5, 0.9f}, {0.7f, 5, 0.9f}};

std::string name_of(const Transform& t) {
  return "T=" + std::to_string(t.temperature) + " top_k=" + std::to_string(t.top_k) +
         " top_p=" + std::to_string(t.top_p);
}

bool same_bits(float a, float b) { return float_to_bits(a) == float_to_bits(b); }

/// Runs both ops on both backends over `view` (data pointers of each backend's copy) and compares.
void check(const std::vector<bf16>& host, LogitRows view, const std::vector<int32_t>& requested, int parts,
           const std::string& what) {
  Twin<bf16> logits(host);
  Twin<int32_t> req(requested);
  const int rows = view.rows;
  for (const Transform& t : kTransforms) {
    SampleParams p;
    p.temperature = t.temperature;
    p.top_k = t.top_k;
    p.top_p = t.top_p;
    Twin<SampleParams> params(std::vector<SampleParams>{p});
    auto stats = out_twin<LogitStats>(static_cast<size_t>(rows) * parts);
    auto tokens = out_twin<TokenStats>(static_cast<size_t>(rows));
    // `parts` shards of one segment each (index_base per part), or one view.
    for (int part = 0; part < parts; ++part) {
      LogitRows c = view, g = view;
      if (parts > 1) {
        const VocabSegment seg = vocab_segment(view.n, parts, part);
        c.n = g.n = static_cast<int>(seg.count);
        c.index_base = g.index_base = view.index_base + seg.begin;
        c.data = logits.c.data() + seg.begin;
        g.data = logits.g.data() + seg.begin;
      } else {
        c.data = logits.c.data();
        g.data = logits.g.data();
      }
      const size_t off = static_cast<size_t>(part) * rows;
      cpu().logit_stats_batch(c, req.c.data(), params.c.data(), stats.c.data() + off);
      gpu().logit_stats_batch(g, req.g.data(), params.g.data(), stats.g.data() + off);
    }
    cpu().logit_stats_combine(stats.c.data(), parts, rows, params.c.data(), tokens.c.data());
    gpu().logit_stats_combine(stats.g.data(), parts, rows, params.g.data(), tokens.g.data());
    const auto sc = stats.from_cpu(), sg = stats.from_gpu();
    const auto tc = tokens.from_cpu(), tg = tokens.from_gpu();
    int bad = 0;
    std::string first;
    auto fail = [&](size_t i, const std::string& field, double got, double want) {
      if (bad++ < 5)
        first += "\n  [" + std::to_string(i) + "] " + field + " gpu " + std::to_string(got) + " cpu " +
                 std::to_string(want);
    };
    for (size_t i = 0; i < sc.size(); ++i) {
      if (!same_bits(sg[i].max, sc[i].max)) fail(i, "max", sg[i].max, sc[i].max);
      if (!same_bits(sg[i].second, sc[i].second)) fail(i, "second", sg[i].second, sc[i].second);
      if (!same_bits(sg[i].requested, sc[i].requested))
        fail(i, "requested", sg[i].requested, sc[i].requested);
      if (!(std::fabs(sg[i].sum - sc[i].sum) <= 1e-6 * std::fabs(sc[i].sum)))
        fail(i, "sum", sg[i].sum, sc[i].sum);
    }
    for (size_t i = 0; i < tc.size(); ++i) {
      if (!same_bits(tg[i].margin, tc[i].margin)) fail(i, "margin", tg[i].margin, tc[i].margin);
      for (auto [g, c, f] : {std::tuple{tg[i].logprob, tc[i].logprob, "logprob"},
                             std::tuple{tg[i].req_logprob, tc[i].req_logprob, "req_logprob"}}) {
        const bool ok = std::isinf(c) ? same_bits(g, c) : std::fabs(g - c) <= 1e-6 * std::fabs(c) + 1e-6;
        if (!ok) fail(i, f, g, c);
      }
    }
    EXPECT_EQ(bad, 0) << what << " " << name_of(t) << ": " << bad << " mismatches; " << seed_note() << first;
  }
}

class SampleStats : public ::testing::TestWithParam<Shape> {};

TEST_P(SampleStats, WholeRowsShardsAndSegmentsMatchTheCpu) {
  const Shape& s = GetParam();
  const int V = s.vocab;
  for (int rows : {1, 3, 16, 128, 300}) {
    if (rows == 300 && V > 4096) continue;  // the CPU reference's time; one size covers the chunking
    for (bool ties : {false, true}) {
      if (ties && V != 38912) continue;
      Rng rng(static_cast<uint64_t>(V) * 1000 + rows * 2 + ties);
      std::vector<bf16> host(static_cast<size_t>(rows) * V);
      for (auto& x : host) {
        float v = 3.0f * (rng.uniform(-1.0f, 1.0f) + rng.uniform(-1.0f, 1.0f) + rng.uniform(-1.0f, 1.0f));
        if (ties) v = std::round(v * 2.0f) / 2.0f;
        x = to_bf16(v);
      }
      // Requested tokens: random ids, and every third row its own argmax (inside any support).
      std::vector<int32_t> req(static_cast<size_t>(rows));
      for (int b = 0; b < rows; ++b) {
        req[static_cast<size_t>(b)] = rng.integer(0, V - 1);
        if (b % 3 == 0) {
          int best = 0;
          for (int i = 1; i < V; ++i)
            if (to_float(host[static_cast<size_t>(b) * V + i]) >
                to_float(host[static_cast<size_t>(b) * V + best]))
              best = i;
          req[static_cast<size_t>(b)] = best;
        }
      }
      const std::string what = std::string(s.name) + " rows " + std::to_string(rows) + (ties ? " ties" : "");
      LogitRows whole;
      whole.rows = rows;
      whole.ld = whole.n = V;
      check(host, whole, req, 1, what + " whole");
      if (rows <= 16) check(host, whole, req, 3, what + " 3 shards");  // partials (untruncated combine)
      // Gathered segments: 2 shards padded to the largest, rank-major, +inf padding never read.
      const int world = 2;
      const int64_t stride = vocab_segment(V, world, 0).count;
      std::vector<bf16> gathered(static_cast<size_t>(world) * rows * stride, bf16{0x7F80});
      for (int g = 0; g < world; ++g) {
        const VocabSegment seg = vocab_segment(V, world, g);
        for (int b = 0; b < rows; ++b)
          std::copy_n(host.begin() + static_cast<ptrdiff_t>(b) * V + seg.begin, seg.count,
                      gathered.begin() + (static_cast<ptrdiff_t>(g) * rows + b) * stride);
      }
      LogitRows segs;
      segs.rows = rows;
      segs.ld = static_cast<int>(stride);
      segs.segments = world;
      segs.seg_stride = static_cast<int64_t>(rows) * stride;
      segs.vocab = V;
      check(gathered, segs, req, 1, what + " segments");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SampleStats, ::testing::ValuesIn(kShapes), shape_name);

}  // namespace
}  // namespace mtplab::ops::gputest
