// context_gemm on one GPU (small preset): the context rows' eh_proj and the block's projections
// of u run as one cuBLASLt GEMM per chunk of rows instead of one GEMV per row. The GEMM computes
// the same products in another summation order (fp32 accumulation both ways), so the caches it
// leaves differ from the per-row ones by occasional BF16 rounding flips, and the drafts only where
// such a flip meets a near-tie. Prints the cache differences and the draft agreement, and asserts:
// - after a 699-row prefill (chunks of 256, 256, 187), the latent and indexer rows of the two arms
//   are close: at least half of the values bit-identical and the relative RMS of the difference
//   <= 1e-2. A summation-order change gives a few flips (~1e-3); a row written to the wrong slot
//   or with a wrong stride gives values of the same scale that are independent (~1.4);
// - over a replay of 2 sequences (context_rows cache_only and full), the drafts agree with the
//   per-row arm at >= 90% of the drafts compared, counted as test_gpu_e2e counts them (each step's
//   drafts up to and including its first difference: the drafts after it chain other tokens).
//   The GPU-vs-CPU drafts on this preset, which differ by summation order everywhere, agree at
//   ~96% that way; a wrong layout changes most drafts. Whole steps are printed too: with k = 3 a
//   single flip spoils a step, so steps agree less often (78 of 90 on the H200) than drafts.
// Exits 77 (skipped) without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "e2e_util.hpp"

using namespace mtplab;

namespace {

std::unique_ptr<ops::Backend> g_gpu;

struct CacheDiff {
  double identical = 0;  // fraction of bit-identical values
  double rel_rms = 0;    // sqrt(sum (a - b)^2 / sum a^2)
};

CacheDiff compare(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  CacheDiff d;
  double num = 0, den = 0;
  size_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    same += a[i].bits == b[i].bits;
    const double x = to_float(a[i]), y = to_float(b[i]);
    num += (x - y) * (x - y);
    den += x * x;
  }
  d.identical = a.empty() ? 0 : static_cast<double>(same) / static_cast<double>(a.size());
  d.rel_rms = den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0);
  return d;
}

std::vector<bf16> download_rows(const void* dev, size_t count) {
  std::vector<bf16> h(count);
  g_gpu->download(h.data(), dev, count * sizeof(bf16));
  return h;
}

TEST(GpuContextGemm, CachesAndDraftsOnTheSmallPreset) {
  const auto cfg = e2e::preset("small", 1024);
  const int k = 3;
  const auto trace = e2e::make_trace(*g_gpu, cfg, 2, 700, 48, 5);
  auto w = e2e::one_rank_weights(cfg);
  for (auto rows : {drafter::ContextRows::cache_only, drafter::ContextRows::full}) {
    SCOPED_TRACE(drafter::to_string(rows));
    drafter::DrafterOptions opt;
    opt.draft_len = k;
    opt.context_rows = rows;
    auto per_row = drafter::make_drafter(*g_gpu, nullptr, cfg, w, opt);
    opt.context_gemm = true;
    auto gemm = drafter::make_drafter(*g_gpu, nullptr, cfg, w, opt);

    // The caches after the first sequence's prefill.
    const auto& seq = trace[0];
    const int n = seq.prompt_length - 1;
    auto sa = per_row->new_sequence();
    auto sb = gemm->new_sequence();
    per_row->append_rows(*sa, seq.tokens.data() + 1, seq.hiddens.data(), n, 0);
    gemm->append_rows(*sb, seq.tokens.data() + 1, seq.hiddens.data(), n, 0);
    g_gpu->synchronize();
    const size_t kv = static_cast<size_t>(n) * cfg.kv_lora_rank;  // identity block table
    const size_t kr = static_cast<size_t>(n) * cfg.index_head_dim;
    const CacheDiff dl = compare(download_rows(sa->caches.kv_slots().cache.data, kv),
                                 download_rows(sb->caches.kv_slots().cache.data, kv));
    const CacheDiff dk =
        compare(download_rows(sa->caches.k_cache.data(), kr), download_rows(sb->caches.k_cache.data(), kr));
    std::printf(
        "[gpu-context-gemm] %s, %d rows: latent %.4f identical, rel-rms %.2e; indexer k %.4f identical, "
        "rel-rms %.2e\n",
        drafter::to_string(rows), n, dl.identical, dl.rel_rms, dk.identical, dk.rel_rms);
    EXPECT_GE(dl.identical, 0.5);
    EXPECT_LE(dl.rel_rms, 1e-2);
    EXPECT_GE(dk.identical, 0.5);
    EXPECT_LE(dk.rel_rms, 1e-2);

    const auto da = e2e::replay_drafts(*per_row, trace, k, cfg.hidden);
    const auto db = e2e::replay_drafts(*gemm, trace, k, cfg.hidden);
    ASSERT_GT(da.size(), 20u);
    ASSERT_EQ(da.size(), db.size());
    size_t same_steps = 0, compared = 0, agreed = 0;
    for (size_t i = 0; i < da.size(); ++i) {
      ASSERT_EQ(da[i].size(), db[i].size());
      same_steps += da[i] == db[i];
      for (size_t j = 0; j < da[i].size(); ++j) {
        ++compared;
        if (da[i][j] != db[i][j]) break;
        ++agreed;
      }
    }
    std::printf(
        "[gpu-context-gemm] %s: drafts equal to the per-row arm: %zu of %zu compared (%.4f); whole steps "
        "%zu of %zu\n",
        drafter::to_string(rows), agreed, compared, static_cast<double>(agreed) / compared, same_steps,
        da.size());
    std::fflush(stdout);
    EXPECT_GE(agreed * 10, compared * 9);
  }
}

}  // namespace

int main(int argc, char** argv) {
  return e2e::gpu_test_main(argc, argv, g_gpu, "the context_gemm GPU test needs one", nullptr);
}
