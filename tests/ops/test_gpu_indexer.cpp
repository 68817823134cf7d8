// CUDA vs CPU, the indexer family: the pooled lightning indexer's row store and pool keys, the pool
// scores and the top-k pool selection, one row and batched (kBatches rows at different positions
// of a pool of slots, padded rows among them), at the tiny, small and glm5.3-flash shapes.
//
// Tolerances: copies are exact (the same single rounding on both sides); pool keys and scores are
// fp32 that differ by the device expf (<= 2 ulp) and summation order, so 1e-5 relative plus 1e-5
// of the largest finite value (batched pool keys: 1e-5 of the sum of |terms| of a double
// recomputation from the GPU's own cached rows), -inf exactly where the CPU has it; the selection
// is exact given identical scores (both backends are fed the same score vector, ties included);
// BF16 k rows as gpu_test_util.hpp. Both pool-score kernels (KernelPolicy::indexer_scores: pools4,
// tiled) give the same bytes.
// The indexer ops over the ragged batches (ragged_layouts: a sequence's rows at ascending positions of
// one slot, causal among themselves) run where their cache writes and reads meet:
// test_gpu_batch.cpp, RaggedRowsCacheWritesAndReads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "gpu_batch_util.hpp"
#include "gpu_test_util.hpp"
#include "ops/cuda/dispatch.hpp"
#include "ops/cuda/indexer.hpp"
#include "ops/one_row.hpp"

namespace mtplab::ops::gputest {
namespace {

class GpuIndexer : public ::testing::TestWithParam<Shape> {};

// ---- one row -------------------------------------------------------------------------------------------

/// Pools the score / selection tests sweep: the bench's 16384 at glm5.3-flash.
int max_pools_for(const Shape& s) {
  if (s.hidden >= 4096) return 16384;
  if (s.hidden >= 1024) return 2048;
  return 64;
}

TEST_P(GpuIndexer, IndexerStore) {
  const Shape s = GetParam();
  Rng rng(11);
  const int D = s.index_dim, P = s.index_kpool;
  const int rows = s.hidden >= 4096 ? 1024 : 256;
  Twin<float> ape(rng.floats(static_cast<size_t>(P) * D, -1.0f, 1.0f));
  std::vector<int32_t> positions(rows);
  std::iota(positions.begin(), positions.end(), 0);
  Twin<int32_t> pos(positions);
  Twin<bf16> k_rows(rng.bf16s(static_cast<size_t>(rows) * D, -2.0f, 2.0f));
  Twin<float> gate_rows(rng.floats(static_cast<size_t>(rows) * D, -3.0f, 3.0f));
  auto k_cache = out_twin<bf16>(static_cast<size_t>(rows) * D);
  auto gate_cache = out_twin<float>(static_cast<size_t>(rows) * D);
  Twin<uint8_t> valid(std::vector<uint8_t>(static_cast<size_t>(rows), 0));
  auto pool_keys = out_twin<float>(static_cast<size_t>(rows / P) * D);
  for (int r = 0; r < rows; ++r) {
    const size_t off = static_cast<size_t>(r) * D;
    cpu().indexer_store(k_rows.c.data() + off, gate_rows.c.data() + off, ape.c.data(), pos.c.data() + r,
                        k_cache.c.data(), gate_cache.c.data(), valid.c.data(), pool_keys.c.data(), D, P);
    gpu().indexer_store(k_rows.g.data() + off, gate_rows.g.data() + off, ape.g.data(), pos.g.data() + r,
                        k_cache.g.data(), gate_cache.g.data(), valid.g.data(), pool_keys.g.data(), D, P);
  }
  expect_bytes_equal(k_cache.from_gpu(), k_cache.from_cpu(), "indexer k cache");
  expect_bytes_equal(gate_cache.from_gpu(), gate_cache.from_cpu(), "indexer gate cache");
  expect_bytes_equal(valid.from_gpu(), valid.from_cpu(), "indexer valid");
  expect_f32_close(pool_keys.from_gpu(), pool_keys.from_cpu(), "pool keys", 1e-5, 1e-6);
}

TEST_P(GpuIndexer, IndexerScoresAndSelect) {
  const Shape s = GetParam();
  Rng rng(12);
  const int D = s.index_dim, P = s.index_kpool, nI = s.index_heads, K = s.index_topk;
  const int max_pools = max_pools_for(s);
  Twin<float> keys(rng.floats(static_cast<size_t>(max_pools) * D, -1.0f, 1.0f));
  Twin<float> q(rng.floats(static_cast<size_t>(nI) * D, -1.0f, 1.0f));
  std::vector<float> w = rng.floats(nI, -1.0f, 1.0f);
  for (auto& v : w) v /= std::sqrt(static_cast<float>(nI));
  Twin<float> wt(w);
  // Last pool incomplete: the scores past the candidates must be -inf.
  Twin<int32_t> pos(std::vector<int32_t>{P * max_pools - 3});
  auto scores = out_twin<float>(max_pools);
  cpu().indexer_scores(q.c.data(), wt.c.data(), keys.c.data(), pos.c.data(), scores.c.data(), nI, D, P,
                       max_pools);
  gpu().indexer_scores(q.g.data(), wt.g.data(), keys.g.data(), pos.g.data(), scores.g.data(), nI, D, P,
                       max_pools);
  const auto cpu_scores = scores.from_cpu();
  expect_f32_close(scores.from_gpu(), cpu_scores, "indexer scores", 1e-5, 1e-5);
  ASSERT_TRUE(std::isinf(cpu_scores.back()) && cpu_scores.back() < 0);

  // Selection, fed the same scores on both backends: exact. Cases: sparse (many candidates),
  // heavy ties (scores quantised to a few levels), dense (every candidate fits), K/P + 1.
  const int width = K + P - 1;
  std::vector<float> tied = cpu_scores;
  for (auto& v : tied)
    if (std::isfinite(v)) v = std::floor(v * 2.0f) / 2.0f;
  struct Case {
    const char* name;
    const std::vector<float>* scores;
    int32_t pos;
  };
  const Case cases[] = {
      {"sparse", &cpu_scores, P * max_pools - 2},
      {"sparse, full pools", &cpu_scores, P * (max_pools - 1) - 1},
      {"ties", &tied, P * max_pools - 2},
      {"dense", &cpu_scores, std::min(K + P - 2, P * max_pools - 1)},
      {"one pool past K/P", &cpu_scores, std::min(P * (K / P + 1) + 1, P * max_pools - 1)},
      {"position 0", &cpu_scores, 0},
  };
  for (const Case& c : cases) {
    Twin<float> sc(*c.scores);
    Twin<int32_t> p(std::vector<int32_t>{c.pos});
    auto sel = out_twin<int32_t>(width);
    cpu().indexer_select(sc.c.data(), p.c.data(), sel.c.data(), K, P, max_pools);
    gpu().indexer_select(sc.g.data(), p.g.data(), sel.g.data(), K, P, max_pools);
    expect_bytes_equal(sel.from_gpu(), sel.from_cpu(),
                       std::string("indexer_select ") + c.name + " pos " + std::to_string(c.pos));
  }
}

// indexer_select keeps the candidates' keys in shared memory up to 40960 pools and reads global
// memory beyond: both key paths, same scores (random, with ties), exact against the CPU.
TEST(GpuIndexerSelect, SharedAndGlobalKeyPathsMatchTheCpu) {
  Rng rng(14);
  const int P = 4, K = 2048;
  for (int max_pools : {40960, 40961, 50000}) {
    std::vector<float> scores = rng.floats(static_cast<size_t>(max_pools), -4.0f, 4.0f);
    for (size_t i = 0; i < scores.size(); i += 7) scores[i] = std::floor(scores[i]);  // ties
    Twin<float> sc(scores);
    for (int32_t pos : {P * max_pools - 1, P * 30000 + 1, 1000}) {
      Twin<int32_t> p(std::vector<int32_t>{pos});
      auto sel = out_twin<int32_t>(K + P - 1);
      cpu().indexer_select(sc.c.data(), p.c.data(), sel.c.data(), K, P, max_pools);
      gpu().indexer_select(sc.g.data(), p.g.data(), sel.g.data(), K, P, max_pools);
      expect_bytes_equal(sel.from_gpu(), sel.from_cpu(),
                         std::string("indexer_select max_pools ") + std::to_string(max_pools) + " pos " +
                             std::to_string(pos));
    }
  }
}

// The radix kernel against the CPU over the pool counts where its code paths change: tiny, not a
// multiple of the block, the step's 1024, past the candidate buffer (4096), the bench's 16384, the
// last count whose keys fit in shared memory and beyond. Score kinds reach every exit of the
// search: distinct values (a digit's bin is mostly taken whole after one or two digits), a few
// levels and all equal (heavy ties: one bin holds more keys than the candidate buffer), values
// one ulp apart (all three digits needed), +-0 (equal keys), -inf among finite values. K: the
// model's 2048, one pool, fewer rows than a pool (nothing selected) and more than every pool
// (everything selected).
TEST(GpuIndexerSelect, MatchesTheCpuAcrossPoolCountsAndTies) {
  Rng rng(15);
  const int P = 4;
  const char* kinds[] = {"distinct", "levels", "all equal", "ulps apart", "signed zeros", "-inf"};
  for (int max_pools : {1, 5, 100, 1000, 1023, 1024, 1025, 4097, 16384, 16389, 40960, 45001}) {
    for (int kind = 0; kind < 6; ++kind) {
      std::vector<float> scores = rng.floats(static_cast<size_t>(max_pools), -4.0f, 4.0f);
      for (auto& v : scores) {
        if (kind == 1) v = std::floor(v);
        if (kind == 2) v = 0.5f;
        if (kind == 3) v = 1.0f + static_cast<float>(rng.integer(0, 7)) * 0x1p-23f;  // exact: 1 + i ulps
        if (kind == 4) v = rng.integer(0, 1) ? 0.0f : -0.0f;
        if (kind == 5 && rng.integer(0, 3) == 0) v = -INFINITY;
      }
      Twin<float> sc(scores);
      for (int K : {2048, P, P - 1, P * max_pools + P}) {
        for (int32_t pos : {P * max_pools - 1, rng.integer(0, P * max_pools - 1), P - 1}) {
          Twin<int32_t> p(std::vector<int32_t>{pos});
          auto sel = out_twin<int32_t>(static_cast<size_t>(K) + P - 1);
          cpu().indexer_select(sc.c.data(), p.c.data(), sel.c.data(), K, P, max_pools);
          gpu().indexer_select(sc.g.data(), p.g.data(), sel.g.data(), K, P, max_pools);
          expect_bytes_equal(sel.from_gpu(), sel.from_cpu(),
                             std::string("indexer_select max_pools ") + std::to_string(max_pools) + " " +
                                 kinds[kind] + " K " + std::to_string(K) + " pos " + std::to_string(pos));
        }
      }
    }
  }
}

// ---- batched rows --------------------------------------------------------------------------------------

TEST_P(GpuIndexer, IndexerNormStore) {
  const Shape s = GetParam();
  Rng rng(806);
  const int D = s.index_dim, P = s.index_kpool, max_rows = max_rows_for(s), mp = max_rows / P;
  Twin<bf16> lw(rng.bf16s(D, 0.5f, 1.5f)), lb(rng.bf16s(D, -0.5f, 0.5f));
  Twin<float> ape(rng.floats(static_cast<size_t>(P) * D, -1.0f, 1.0f));
  for (int B : kBatches) {
    const std::string what = where("indexer_norm_store_batch", B);
    const int slots = B + 3;
    const size_t rows_all = static_cast<size_t>(slots) * max_rows;
    auto k_cache = out_twin<bf16>(rows_all * D);
    auto gate_cache = out_twin<float>(rows_all * D);
    Twin<uint8_t> valid(std::vector<uint8_t>(rows_all, 0));
    auto pool_keys = out_twin<float>(static_cast<size_t>(slots) * mp * D);
    const auto slots_h = make_slots(rng, B, slots);
    auto pos_h = make_positions(rng, slots_h, max_rows, 1 << 20);
    // Every other live row completes its pool; the pool's earlier rows are stored (valid) before.
    std::vector<bf16> kc = k_cache.from_cpu();
    std::vector<float> gc = gate_cache.from_cpu();
    std::vector<uint8_t> vc(rows_all, 0);
    for (int b = 0; b < B; ++b) {
      const int32_t sb = slots_h[static_cast<size_t>(b)];
      if (sb < 0) continue;
      int32_t& p = pos_h[static_cast<size_t>(b)];
      if (b % 2 == 0) p = p / P * P + P - 1;
      for (int32_t r = p / P * P; r < p; ++r) {
        const size_t row = static_cast<size_t>(sb) * max_rows + r;
        for (int c = 0; c < D; ++c) {
          kc[row * D + c] = to_bf16(rng.uniform(-2.0f, 2.0f));
          gc[row * D + c] = rng.uniform(-3.0f, 3.0f);
        }
        vc[row] = 1;
      }
    }
    k_cache.set(kc);
    gate_cache.set(gc);
    valid.set(vc);
    Twin<int32_t> sl(slots_h), pos(pos_h);
    Twin<bf16> k_pre(rng.bf16s(static_cast<size_t>(B) * D, -2.0f, 4.0f));  // non-zero mean
    Twin<float> gate(rng.floats(static_cast<size_t>(B) * D, -3.0f, 3.0f));
    const IndexerSlots ic{
        k_cache.c.data(), gate_cache.c.data(), valid.c.data(), pool_keys.c.data(), slots, max_rows, D, P};
    const IndexerSlots ig{
        k_cache.g.data(), gate_cache.g.data(), valid.g.data(), pool_keys.g.data(), slots, max_rows, D, P};
    EXPECT_EQ(kernels_of([&] {
                gpu().indexer_norm_store_batch(k_pre.g.data(), lw.g.data(), lb.g.data(), 1e-6f, gate.g.data(),
                                               ape.g.data(), RowBatch{sl.g.data(), pos.g.data(), B}, ig);
              }),
              1u);
    on_cpu_rows(B, [&](Backend& be, int b0, int b1) {
      be.indexer_norm_store_batch(k_pre.c.data() + static_cast<size_t>(b0) * D, lw.c.data(), lb.c.data(),
                                  1e-6f, gate.c.data() + static_cast<size_t>(b0) * D, ape.c.data(),
                                  RowBatch{sl.c.data() + b0, pos.c.data() + b0, b1 - b0}, ic);
    });
    std::vector<uint8_t> k_mask(rows_all * D, 0), key_mask(static_cast<size_t>(slots) * mp * D, 0);
    for (int b = 0; b < B; ++b) {
      const int32_t sb = slots_h[static_cast<size_t>(b)];
      if (sb < 0) continue;
      const int32_t p = pos_h[static_cast<size_t>(b)];
      std::fill_n(k_mask.begin() + (static_cast<size_t>(sb) * max_rows + p) * D, D, 1);
      if (p % P == P - 1) std::fill_n(key_mask.begin() + (static_cast<size_t>(sb) * mp + p / P) * D, D, 1);
    }
    const auto gk = k_cache.from_gpu();
    expect_bf16_written(gk, k_cache.from_cpu(), k_mask, what + " k rows");
    expect_bytes_equal(gate_cache.from_gpu(), gate_cache.from_cpu(), what + " gate rows");
    expect_bytes_equal(valid.from_gpu(), valid.from_cpu(), what + " valid flags");
    // The pool keys against double arithmetic on the GPU's own cached rows (its k rows are checked
    // above), 1e-5 of the sum of |terms|.
    const auto gkeys = pool_keys.from_gpu();
    const auto ggate = gate_cache.from_gpu();
    const auto ape_h = ape.from_cpu();
    size_t bad = 0, keys = 0;
    for (int b = 0; b < B; ++b) {
      const int32_t sb = slots_h[static_cast<size_t>(b)];
      if (sb < 0 || pos_h[static_cast<size_t>(b)] % P != P - 1) continue;
      const int32_t j = pos_h[static_cast<size_t>(b)] / P;
      for (int c = 0; c < D; ++c) {
        double lg[64], mx = -INFINITY;
        for (int m = 0; m < P; ++m) {
          const size_t row = static_cast<size_t>(sb) * max_rows + static_cast<size_t>(j) * P + m;
          lg[m] = static_cast<double>(ggate[row * D + c]) + ape_h[static_cast<size_t>(m) * D + c];
          mx = std::max(mx, lg[m]);
        }
        double den = 0, ref = 0, mag = 0;
        for (int m = 0; m < P; ++m) den += std::exp(lg[m] - mx);
        for (int m = 0; m < P; ++m) {
          const size_t row = static_cast<size_t>(sb) * max_rows + static_cast<size_t>(j) * P + m;
          const double term = std::exp(lg[m] - mx) / den * to_float(gk[row * D + c]);
          ref += term;
          mag += std::fabs(term);
        }
        const double got = gkeys[(static_cast<size_t>(sb) * mp + j) * D + c];
        bad += !(std::fabs(got - ref) <= 1e-5 * mag + 1e-30);
        ++keys;
      }
    }
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << keys << " pool key values off; " << seed_note();
    if (B >= 3) {
      EXPECT_GT(keys, 0u) << what << ": no row completed a pool";
    }
    expect_outside_unchanged(gkeys, pool_keys.from_cpu(), key_mask, what + " pool keys");
  }
}

TEST_P(GpuIndexer, IndexerScoresAndSelectBatch) {
  const Shape s = GetParam();
  Rng rng(807);
  const int D = s.index_dim, P = s.index_kpool, nI = s.index_heads, K = s.index_topk;
  const int max_rows = max_rows_for(s), mp = max_rows / P, width = K + P - 1;
  for (int B : kBatches) {
    const int slots = B + 2;
    Big<float> keys = big_f32(static_cast<size_t>(slots) * mp * D, -1.0f, 1.0f, 8070 + B);
    Twin<uint8_t> valid(std::vector<uint8_t>(static_cast<size_t>(slots) * max_rows, 1));
    const auto slots_h = make_slots(rng, B, slots);
    auto pos_h = make_positions(rng, slots_h, max_rows, 1 << 20);
    // Also a row with no complete pool and one inside the dense window.
    for (int b = 0, live = 0; b < B; ++b) {
      if (slots_h[static_cast<size_t>(b)] < 0) continue;
      if (live == 2) pos_h[static_cast<size_t>(b)] = P - 2;
      if (live == 3) pos_h[static_cast<size_t>(b)] = std::min(K + P - 2, max_rows - 1);
      ++live;
    }
    Twin<int32_t> sl(slots_h), pos(pos_h);
    Twin<float> q(rng.floats(static_cast<size_t>(B) * nI * D, -1.0f, 1.0f));
    std::vector<float> w_h = rng.floats(static_cast<size_t>(B) * nI, -1.0f, 1.0f);
    for (auto& v : w_h) v /= std::sqrt(static_cast<float>(nI));
    Twin<float> w(w_h);
    // Only the pool keys are read; the row caches are stand-ins the op must not need.
    Array<bf16> k_c(cpu(), 8), k_g(gpu(), 8);
    Array<float> gate_c(cpu(), 8), gate_g(gpu(), 8);
    const IndexerSlots icc{k_c.data(), gate_c.data(), valid.c.data(), keys.c.data(), slots, max_rows, D, P};
    const IndexerSlots igg{k_g.data(), gate_g.data(), valid.g.data(), keys.g.data(), slots, max_rows, D, P};
    auto scores = out_twin<float>(static_cast<size_t>(B) * mp);
    EXPECT_EQ(kernels_of([&] {
                gpu().indexer_scores_batch(q.g.data(), w.g.data(), RowBatch{sl.g.data(), pos.g.data(), B},
                                           igg, scores.g.data(), nI);
              }),
              1u);
    on_cpu_rows(B, [&](Backend& be, int b0, int b1) {
      be.indexer_scores_batch(q.c.data() + static_cast<size_t>(b0) * nI * D,
                              w.c.data() + static_cast<size_t>(b0) * nI,
                              RowBatch{sl.c.data() + b0, pos.c.data() + b0, b1 - b0}, icc,
                              scores.c.data() + static_cast<size_t>(b0) * mp, nI);
    });
    const auto mask = row_mask(B, mp, mp, &slots_h);
    const auto cs = scores.from_cpu();
    expect_f32_with_inf(masked(scores.from_gpu(), mask), masked(cs, mask), where("indexer_scores_batch", B),
                        1e-5, 1e-5);
    expect_outside_unchanged(scores.from_gpu(), cs, mask, where("indexer_scores_batch", B));
    // Both kernels (KernelPolicy::indexer_scores) write the same bytes: the tiled one runs where the
    // shape has 32 heads (glm5.3-flash), pools4 elsewhere whatever the policy.
    const bool tiled_shape = nI == 32 && D % 4 == 0;
    EXPECT_EQ(ops::cuda::indexer_scores_tiled(gpu().kernel_policy(), B, nI, D), tiled_shape && B >= 16);
    for (const IndexerScores kernel : {IndexerScores::pools4, IndexerScores::tiled}) {
      const PolicyScope use([kernel](KernelPolicy& p) { p.indexer_scores = kernel; });
      EXPECT_EQ(ops::cuda::indexer_scores_tiled(gpu().kernel_policy(), B, nI, D),
                tiled_shape && kernel == IndexerScores::tiled);
      auto again = out_twin<float>(static_cast<size_t>(B) * mp);
      gpu().indexer_scores_batch(q.g.data(), w.g.data(), RowBatch{sl.g.data(), pos.g.data(), B}, igg,
                                 again.g.data(), nI);
      expect_bytes_equal(again.from_gpu(), scores.from_gpu(),
                         where(kernel == IndexerScores::tiled ? "indexer_scores_batch tiled vs auto"
                                                              : "indexer_scores_batch pools4 vs auto",
                               B));
    }

    // The selection, both backends on the CPU's scores (exact), ties made common in half the rows.
    std::vector<float> sc = cs;
    for (int b = 0; b < B; b += 2)
      for (int j = 0; j < mp; ++j) {
        float& v = sc[static_cast<size_t>(b) * mp + j];
        if (std::isfinite(v)) v = std::floor(v * 4.0f) / 4.0f;
      }
    Twin<float> sct(sc);
    auto sel = out_twin<int32_t>(static_cast<size_t>(B) * width);
    EXPECT_EQ(kernels_of([&] {
                gpu().indexer_select_batch(sct.g.data(), RowBatch{sl.g.data(), pos.g.data(), B}, sel.g.data(),
                                           K, P, mp);
              }),
              1u);
    on_cpu_rows(B, [&](Backend& be, int b0, int b1) {
      be.indexer_select_batch(sct.c.data() + static_cast<size_t>(b0) * mp,
                              RowBatch{sl.c.data() + b0, pos.c.data() + b0, b1 - b0},
                              sel.c.data() + static_cast<size_t>(b0) * width, K, P, mp);
    });
    expect_bytes_equal(sel.from_gpu(), sel.from_cpu(), where("indexer_select_batch", B));
    if (B == 1) {
      // A batch of one runs the single-row kernel: a padded row there must stay untouched too (its
      // position is garbage and must not be read).
      Twin<int32_t> pad_slot(std::vector<int32_t>{-1}), bad_pos(std::vector<int32_t>{-12345});
      auto untouched = out_twin<int32_t>(static_cast<size_t>(width));
      gpu().indexer_select_batch(sct.g.data(), RowBatch{pad_slot.g.data(), bad_pos.g.data(), 1},
                                 untouched.g.data(), K, P, mp);
      expect_bytes_equal(untouched.from_gpu(), untouched.from_cpu(), where("indexer_select_batch padded", B));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GpuIndexer, ::testing::ValuesIn(kShapes), shape_name);

}  // namespace
}  // namespace mtplab::ops::gputest
