// CPU reference: the pooled lightning indexer (store + pool key, scores, selection) against
// independent formulas: double-precision softmax pooling and scores, and a selection found by
// counting, for each pool, the pools that beat it (no sorting).
//
// Tolerances: pool keys and scores are fp32 internals, checked to 1e-5 relative to the sum of
// |terms| (a few dozen fp32 roundings of 6e-8 each stay below 1e-5, while a missed term, a wrong
// softmax or a stray BF16 rounding at 4e-3 do not). Selections are integers: exact.
#include <algorithm>
#include <limits>
#include <set>

#include "core/error.hpp"
#include "cpu_batch_util.hpp"
#include "cpu_test_util.hpp"
#include "ops/one_row.hpp"

using namespace mtplab;
using namespace mtplab::ops;
using namespace mtplab::ops::test;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct CpuIndexer : CpuBackendTest {
  // Tiny preset geometry: index dim 32, pool 4, top-K 16.
  static constexpr int D = 32, P = 4, K = 16, kRows = 64, kPools = kRows / P;
};

/// K_j[c] = sum_m softmax_m(gate[jP+m, c] + ape[m, c]) k[jP+m, c], in double. Also returns
/// sum_m alpha |k| per channel (the scale of the terms) through `scale`.
std::vector<double> pool_key(const std::vector<float>& k, const std::vector<float>& gate,
                             const std::vector<float>& ape, int j, int D, int P, std::vector<double>* scale) {
  std::vector<double> key(D), sc(D);
  for (int c = 0; c < D; ++c) {
    double denom = 0;
    for (int m = 0; m < P; ++m)
      denom += std::exp(static_cast<double>(gate[(j * P + m) * D + c]) + ape[m * D + c]);
    for (int m = 0; m < P; ++m) {
      const double alpha = std::exp(static_cast<double>(gate[(j * P + m) * D + c]) + ape[m * D + c]) / denom;
      key[c] += alpha * k[(j * P + m) * D + c];
      sc[c] += alpha * std::fabs(k[(j * P + m) * D + c]);
    }
  }
  if (scale) *scale = sc;
  return key;
}

/// The selection by definition: pool j is chosen when fewer than n_sel candidates beat it
/// (higher score, or equal score and lower index). Rows ascending, then the tail, then -1.
std::vector<int32_t> naive_select(const std::vector<float>& scores, int pos, int K, int P) {
  const int n_cand = (pos + 1) / P;
  const int n_sel = std::min(K / P, n_cand);
  std::vector<int32_t> out;
  for (int j = 0; j < n_cand; ++j) {
    int beaten_by = 0;
    for (int i = 0; i < n_cand; ++i) {
      if (scores[i] > scores[j] || (scores[i] == scores[j] && i < j)) ++beaten_by;
    }
    if (beaten_by < n_sel) {
      for (int m = 0; m < P; ++m) out.push_back(j * P + m);
    }
  }
  for (int t = n_cand * P; t <= pos; ++t) out.push_back(t);
  out.resize(K + P - 1, -1);
  return out;
}

}  // namespace

TEST_F(CpuIndexer, StoreWritesRowsAndPoolKeys) {
  SCOPED_TRACE(seed_note());
  Rng rng(21);
  const int n_rows = 23;  // 5 complete pools and a 3-row tail
  const auto k = rng.bf16s(static_cast<size_t>(n_rows) * D, -2, 2);
  const auto gate = rng.floats(static_cast<size_t>(n_rows) * D, -3, 3);
  const auto ape = rng.floats(static_cast<size_t>(P) * D, -1, 1);
  auto dk = upload(*be, k);
  auto dg = upload(*be, gate), dape = upload(*be, ape);
  auto k_cache = poisoned<bf16>(*be, static_cast<size_t>(kRows) * D);
  auto gate_cache = poisoned<float>(*be, static_cast<size_t>(kRows) * D);
  auto valid = poisoned<uint8_t>(*be, kRows, 0);
  auto keys = poisoned<float>(*be, static_cast<size_t>(kPools) * D);
  auto pos = poisoned<int32_t>(*be, 1);
  for (int32_t r = 0; r < n_rows; ++r) {
    be->upload(pos.data(), &r, sizeof r);
    be->indexer_store(dk.data() + r * D, dg.data() + r * D, dape.data(), pos.data(), k_cache.data(),
                      gate_cache.data(), valid.data(), keys.data(), D, P);
  }
  const auto kc = download(*be, k_cache);
  const auto gc = download(*be, gate_cache);
  const auto vd = download(*be, valid);
  const auto kk = download(*be, keys);
  for (int r = 0; r < kRows; ++r) {
    ASSERT_EQ(vd[r], r < n_rows ? 1 : 0) << r;
    for (int c = 0; c < D && r < n_rows; ++c) {
      ASSERT_EQ(kc[r * D + c].bits, k[r * D + c].bits);
      ASSERT_EQ(gc[r * D + c], gate[r * D + c]);
    }
  }
  const auto kf = widen(k);
  for (int j = 0; j < kPools; ++j) {
    if (j >= n_rows / P) {  // incomplete or absent pools: never written
      for (int c = 0; c < D; ++c) ASSERT_TRUE(std::isnan(kk[j * D + c])) << "pool " << j;
      continue;
    }
    std::vector<double> scale;
    const auto want = pool_key(kf, gate, ape, j, D, P, &scale);
    for (int c = 0; c < D; ++c)
      ASSERT_TRUE(near_abs(kk[j * D + c], want[c], 1e-5 * scale[c])) << "pool " << j << " c " << c;
  }
}

TEST_F(CpuIndexer, RewrittenRowsRecomputeTheirPoolKey) {
  SCOPED_TRACE(seed_note());
  Rng rng(22);
  const int n_rows = 8, n_data = 12;  // rows 8..11 are used by the refusal check
  auto k = rng.bf16s(static_cast<size_t>(n_data) * D, -2, 2);
  auto gate = rng.floats(static_cast<size_t>(n_data) * D, -3, 3);
  const auto ape = rng.floats(static_cast<size_t>(P) * D, -1, 1);
  auto dape = upload(*be, ape);
  auto k_cache = poisoned<bf16>(*be, static_cast<size_t>(kRows) * D);
  auto gate_cache = poisoned<float>(*be, static_cast<size_t>(kRows) * D);
  auto valid = poisoned<uint8_t>(*be, kRows, 0);
  auto keys = poisoned<float>(*be, static_cast<size_t>(kPools) * D);
  auto pos = poisoned<int32_t>(*be, 1);
  auto store = [&](int32_t r) {
    auto dk = upload(*be, std::vector<bf16>(k.begin() + r * D, k.begin() + (r + 1) * D));
    auto dg = upload(*be, std::vector<float>(gate.begin() + r * D, gate.begin() + (r + 1) * D));
    be->upload(pos.data(), &r, sizeof r);
    be->indexer_store(dk.data(), dg.data(), dape.data(), pos.data(), k_cache.data(), gate_cache.data(),
                      valid.data(), keys.data(), D, P);
  };
  for (int r = 0; r < n_rows; ++r) store(r);
  // Roll back rows 6..7 (the drafter clears their valid marks) and write new values.
  be->fill_bytes(valid.data() + 6, 0, 2);
  for (int i = 6 * D; i < 8 * D; ++i) {
    k[i] = to_bf16(rng.uniform(-2, 2));
    gate[i] = rng.uniform(-3, 3);
  }
  store(6);
  store(7);
  const auto kk = download(*be, keys);
  std::vector<double> scale;
  const auto want = pool_key(widen(k), gate, ape, 1, D, P, &scale);
  for (int c = 0; c < D; ++c) ASSERT_TRUE(near_abs(kk[D + c], want[c], 1e-5 * scale[c])) << c;

  // Completing a pool whose earlier rows were never stored is refused.
  be->fill_bytes(valid.data() + 9, 0, 1);
  store(8);
  EXPECT_THROW(store(11), Error);
}

TEST_F(CpuIndexer, ScoresMatchDoubleAndMaskLaterPools) {
  SCOPED_TRACE(seed_note());
  Rng rng(23);
  const int n_heads = 4;
  const auto keys = rng.floats(static_cast<size_t>(kPools) * D, -1, 1);
  const auto q = rng.floats(static_cast<size_t>(n_heads) * D, -1, 1);
  auto w = rng.floats(n_heads, -0.5f, 0.5f);
  auto dkeys = upload(*be, keys), dq = upload(*be, q), dw = upload(*be, w);
  auto pos = poisoned<int32_t>(*be, 1);
  int clipped = 0;
  for (int32_t p : {0, 2, 3, 4, 17, 18, 19, 40, kRows - 1}) {
    be->upload(pos.data(), &p, sizeof p);
    auto scores = poisoned<float>(*be, kPools);
    be->indexer_scores(dq.data(), dw.data(), dkeys.data(), pos.data(), scores.data(), n_heads, D, P, kPools);
    const auto got = download(*be, scores);
    const int n_cand = (p + 1) / P;  // pools whose last row is <= p
    for (int j = 0; j < kPools; ++j) {
      if (j >= n_cand) {
        ASSERT_EQ(got[j], kNegInf) << "p=" << p << " pool " << j;
        continue;
      }
      double want = 0, scale = 0;
      for (int h = 0; h < n_heads; ++h) {
        double qk = 0, qk_abs = 0;
        for (int c = 0; c < D; ++c) {
          qk += static_cast<double>(q[h * D + c]) * keys[j * D + c];
          qk_abs += std::fabs(static_cast<double>(q[h * D + c]) * keys[j * D + c]);
        }
        qk /= std::sqrt(static_cast<double>(D));
        clipped += qk < 0;
        want += w[h] * std::max(qk, 0.0);
        scale += std::fabs(w[h]) * qk_abs / std::sqrt(static_cast<double>(D));
      }
      ASSERT_TRUE(near_abs(got[j], want, 1e-5 * scale)) << "p=" << p << " pool " << j;
    }
  }
  EXPECT_GT(clipped, 0) << "the inputs never exercised the ReLU";
  // A position with more complete pools than the buffer holds is refused.
  int32_t far = kRows * 2;
  be->upload(pos.data(), &far, sizeof far);
  auto scores = poisoned<float>(*be, kPools);
  EXPECT_THROW(be->indexer_scores(dq.data(), dw.data(), dkeys.data(), pos.data(), scores.data(), n_heads, D,
                                  P, kPools),
               Error);
}

TEST_F(CpuIndexer, SelectionMatchesTheDefinitionOnRandomScores) {
  SCOPED_TRACE(seed_note());
  Rng rng(24);
  const int max_pools = 64;
  auto pos = poisoned<int32_t>(*be, 1);
  for (int32_t p = 0; p < max_pools * P; p += 1 + p / 16) {
    std::vector<float> scores(max_pools, kNegInf);
    const int n_cand = (p + 1) / P;
    // Scores from a small set, so ties are frequent and straddle the cut.
    for (int j = 0; j < n_cand; ++j) scores[j] = static_cast<float>(rng.integer(0, 6)) * 0.25f + 0.125f;
    auto ds = upload(*be, scores);
    be->upload(pos.data(), &p, sizeof p);
    auto sel = poisoned<int32_t>(*be, K + P - 1, 0x7f);
    be->indexer_select(ds.data(), pos.data(), sel.data(), K, P, max_pools);
    ASSERT_EQ(download(*be, sel), naive_select(scores, p, K, P)) << "p=" << p;
  }
}

TEST_F(CpuIndexer, TiesGoToTheLowerPool) {
  const int max_pools = 16;
  // Pools 0..9 candidates at p = 41 (tail rows 40, 41); K/P = 4 pools are chosen.
  std::vector<float> scores(max_pools, kNegInf);
  for (int j = 0; j < 10; ++j) scores[j] = 1.0f;
  scores[8] = 2.0f;  // the one clear winner
  auto ds = upload(*be, scores);
  auto pos = upload(*be, std::vector<int32_t>{41});
  auto sel = poisoned<int32_t>(*be, K + P - 1, 0x7f);
  be->indexer_select(ds.data(), pos.data(), sel.data(), K, P, max_pools);
  const std::vector<int32_t> want = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 32, 33, 34, 35, 40, 41, -1};
  EXPECT_EQ(download(*be, sel), want);
}

TEST_F(CpuIndexer, EarlyPositionsSelectEveryRowDenseCausal) {
  SCOPED_TRACE(seed_note());
  Rng rng(25);
  const int max_pools = 8;
  auto pos = poisoned<int32_t>(*be, 1);
  for (int32_t p = 0; p <= K + P - 2; ++p) {
    std::vector<float> scores(max_pools, kNegInf);
    for (int j = 0; j < (p + 1) / P; ++j) scores[j] = rng.uniform(-1, 1);
    auto ds = upload(*be, scores);
    be->upload(pos.data(), &p, sizeof p);
    auto sel = poisoned<int32_t>(*be, K + P - 1, 0x7f);
    be->indexer_select(ds.data(), pos.data(), sel.data(), K, P, max_pools);
    const auto got = download(*be, sel);
    for (int i = 0; i < K + P - 1; ++i) ASSERT_EQ(got[i], i <= p ? i : -1) << "p=" << p << " entry " << i;
  }
  // One row later the selection is sparse: K rows of whole pools plus the tail.
  const int32_t p = K + P - 1 + P;  // 23: 6 complete pools, no tail
  std::vector<float> scores(max_pools, kNegInf);
  for (int j = 0; j < 6; ++j) scores[j] = rng.uniform(-1, 1);
  auto ds = upload(*be, scores);
  be->upload(pos.data(), &p, sizeof p);
  auto sel = poisoned<int32_t>(*be, K + P - 1, 0x7f);
  be->indexer_select(ds.data(), pos.data(), sel.data(), K, P, max_pools);
  const auto got = download(*be, sel);
  std::set<int32_t> rows;
  for (int32_t t : got) {
    if (t >= 0) rows.insert(t);
  }
  EXPECT_EQ(rows.size(), static_cast<size_t>(K));
  EXPECT_EQ(std::count(got.begin(), got.end(), -1), P - 1);
}

TEST_F(CpuIndexer, StoreScoreSelectPipelineMatchesDoubleEndToEnd) {
  // The three ops chained as the drafter chains them, against the double formulas end to end.
  SCOPED_TRACE(seed_note());
  Rng rng(26);
  const int n_heads = 4, n_rows = 57;
  const auto k = rng.bf16s(static_cast<size_t>(n_rows) * D, -2, 2);
  const auto gate = rng.floats(static_cast<size_t>(n_rows) * D, -3, 3);
  const auto ape = rng.floats(static_cast<size_t>(P) * D, -1, 1);
  const auto q = rng.floats(static_cast<size_t>(n_heads) * D, -1, 1);
  const auto w = rng.floats(n_heads, 0.1f, 0.5f);
  auto dk = upload(*be, k);
  auto dg = upload(*be, gate), dape = upload(*be, ape), dq = upload(*be, q), dw = upload(*be, w);
  auto k_cache = poisoned<bf16>(*be, static_cast<size_t>(kRows) * D);
  auto gate_cache = poisoned<float>(*be, static_cast<size_t>(kRows) * D);
  auto valid = poisoned<uint8_t>(*be, kRows, 0);
  auto keys = poisoned<float>(*be, static_cast<size_t>(kPools) * D);
  auto pos = poisoned<int32_t>(*be, 1);
  const auto kf = widen(k);
  for (int32_t r = 0; r < n_rows; ++r) {
    be->upload(pos.data(), &r, sizeof r);
    be->indexer_store(dk.data() + r * D, dg.data() + r * D, dape.data(), pos.data(), k_cache.data(),
                      gate_cache.data(), valid.data(), keys.data(), D, P);
    auto scores = poisoned<float>(*be, kPools);
    be->indexer_scores(dq.data(), dw.data(), keys.data(), pos.data(), scores.data(), n_heads, D, P, kPools);
    auto sel = poisoned<int32_t>(*be, K + P - 1, 0x7f);
    be->indexer_select(scores.data(), pos.data(), sel.data(), K, P, kPools);
    // Double scores of every candidate; the selection must be the definition's on them unless
    // two scores are closer than the fp32 tolerance (then either order is acceptable).
    std::vector<float> want(kPools, kNegInf);
    double min_gap = INFINITY;
    for (int j = 0; j < (r + 1) / P; ++j) {
      const auto key = pool_key(kf, gate, ape, j, D, P, nullptr);
      double s = 0;
      for (int h = 0; h < n_heads; ++h) {
        double qk = 0;
        for (int c = 0; c < D; ++c) qk += q[h * D + c] * key[c];
        s += w[h] * std::max(qk / std::sqrt(static_cast<double>(D)), 0.0);
      }
      want[j] = static_cast<float>(s);
    }
    for (int i = 0; i < (r + 1) / P; ++i)
      for (int j = 0; j < i; ++j)
        min_gap = std::min(min_gap, std::fabs(static_cast<double>(want[i]) - want[j]));
    if (min_gap > 1e-4) {
      ASSERT_EQ(download(*be, sel), naive_select(want, r, K, P)) << "row " << r;
    }
  }
}

// ---- batched rows: each row on its own slot -----------------------------------------------------

namespace {

struct CpuIndexerBatch : CpuBackendTest {};

TEST_F(CpuIndexerBatch, IndexerNormStoreWritesEachRowToItsOwnSlotAndCompletesPools) {
  Rng rng(708);
  const int D = Pool::kD, P = Pool::kP;
  auto lw = upload(*be, rng.bf16s(D, 0.5f, 1.5f)), lb = upload(*be, rng.bf16s(D, -0.2f, 0.2f));
  auto ape = upload(*be, rng.floats(static_cast<size_t>(P) * D, -1, 1));
  for (int B : kBatches) {
    const int slots = B + 2;
    Pool pool(*be, rng, slots, KvDtype::bf16);
    const auto slots_h = make_slots(rng, B, slots);
    // Each live row's slot holds rows 0 .. pos-1 already (stored row by row with the single op);
    // half the rows complete a pool (pos % P == P - 1).
    std::vector<int32_t> pos_h(static_cast<size_t>(B), -3);  // -3: refused if a padded row were read
    for (int b = 0; b < B; ++b) {
      if (slots_h[b] < 0) continue;
      const int pools = rng.integer(0, Pool::kMaxRows / P - 1);
      pos_h[b] = pools * P + (b % 2 ? P - 1 : rng.integer(0, P - 2));
      const size_t so = static_cast<size_t>(slots_h[b]);
      for (int32_t t = 0; t < pos_h[b]; ++t) {
        auto k_pre = upload(*be, rng.bf16s(D, -2, 2));
        auto gate = upload(*be, rng.floats(D, -2, 2));
        auto tp = upload(*be, std::vector<int32_t>{t});
        mtplab::ops::OneRow(*be).indexer_norm_store(
            k_pre.data(), lw.data(), lb.data(), 1e-6f, gate.data(), ape.data(), tp.data(),
            pool.k_cache.data() + so * Pool::kMaxRows * D, pool.gate_cache.data() + so * Pool::kMaxRows * D,
            pool.valid.data() + so * Pool::kMaxRows, pool.pool_keys.data() + so * (Pool::kMaxRows / P) * D, D,
            P);
      }
    }
    // The reference: a byte copy of the pool, then the single op per live row.
    Pool ref(*be, rng, slots, KvDtype::bf16);
    be->copy(ref.k_cache.data(), pool.k_cache.data(), pool.k_cache.bytes());
    be->copy(ref.gate_cache.data(), pool.gate_cache.data(), pool.gate_cache.bytes());
    be->copy(ref.valid.data(), pool.valid.data(), pool.valid.bytes());
    be->copy(ref.pool_keys.data(), pool.pool_keys.data(), pool.pool_keys.bytes());
    auto s = upload(*be, slots_h), pos = upload(*be, pos_h);
    auto k_pre = upload(*be, rng.bf16s(static_cast<size_t>(B) * D, -2, 2));
    auto gate = upload(*be, rng.floats(static_cast<size_t>(B) * D, -2, 2));
    be->indexer_norm_store_batch(k_pre.data(), lw.data(), lb.data(), 1e-6f, gate.data(), ape.data(),
                                 RowBatch{s.data(), pos.data(), B}, pool.idx);
    for (int b = 0; b < B; ++b) {
      if (slots_h[b] < 0) continue;
      const size_t so = static_cast<size_t>(slots_h[b]);
      mtplab::ops::OneRow(*be).indexer_norm_store(
          k_pre.data() + b * D, lw.data(), lb.data(), 1e-6f, gate.data() + b * D, ape.data(), pos.data() + b,
          ref.k_cache.data() + so * Pool::kMaxRows * D, ref.gate_cache.data() + so * Pool::kMaxRows * D,
          ref.valid.data() + so * Pool::kMaxRows, ref.pool_keys.data() + so * (Pool::kMaxRows / P) * D, D, P);
    }
    EXPECT_TRUE(same_bytes(download(*be, pool.k_cache), download(*be, ref.k_cache))) << where(B);
    EXPECT_TRUE(same_bytes(download(*be, pool.gate_cache), download(*be, ref.gate_cache))) << where(B);
    EXPECT_TRUE(same_bytes(download(*be, pool.valid), download(*be, ref.valid))) << where(B);
    EXPECT_TRUE(same_bytes(download(*be, pool.pool_keys), download(*be, ref.pool_keys))) << where(B);
  }
  Pool pool(*be, rng, 3, KvDtype::bf16);
  auto k_pre = upload(*be, rng.bf16s(3 * D, -1, 1));
  auto gate = upload(*be, rng.floats(3 * D, -1, 1));
  expect_ragged_write_rules(
      *be,
      [&](const RowBatch& rb) {
        be->indexer_norm_store_batch(k_pre.data(), lw.data(), lb.data(), 1e-6f, gate.data(), ape.data(), rb,
                                     pool.idx);
      },
      [&] { return indexer_bytes(*be, pool); });
  auto two = upload(*be, std::vector<int32_t>{0, 1}),
       past = upload(*be, std::vector<int32_t>{0, Pool::kMaxRows});
  EXPECT_THROW(be->indexer_norm_store_batch(k_pre.data(), lw.data(), lb.data(), 1e-6f, gate.data(),
                                            ape.data(), RowBatch{two.data(), past.data(), 2}, pool.idx),
               Error);
}

TEST_F(CpuIndexerBatch, IndexerScoresReadEachRowsOwnPoolKeys) {
  Rng rng(709);
  const int D = Pool::kD, P = Pool::kP, nh = 3;
  for (int B : kBatches) {
    const int slots = B + 2;
    Pool pool(*be, rng, slots, KvDtype::bf16);
    const auto keys = rng.floats(pool.pool_keys.size(), -1, 1);
    be->upload(pool.pool_keys.data(), keys.data(), pool.pool_keys.bytes());
    const auto slots_h = make_slots(rng, B, slots);
    const auto pos_h = make_positions(rng, slots_h, Pool::kMaxRows, 1 << 20);
    auto s = upload(*be, slots_h), pos = upload(*be, pos_h);
    auto q = upload(*be, rng.floats(static_cast<size_t>(B) * nh * D, -1, 1));
    auto w = upload(*be, rng.floats(static_cast<size_t>(B) * nh, 0, 1));
    const int mp = pool.idx.max_pools();
    auto scores = poisoned<float>(*be, static_cast<size_t>(B) * mp),
         ref = poisoned<float>(*be, scores.size());
    be->indexer_scores_batch(q.data(), w.data(), RowBatch{s.data(), pos.data(), B}, pool.idx, scores.data(),
                             nh);
    for (int b = 0; b < B; ++b) {
      if (slots_h[b] < 0) continue;
      be->indexer_scores(q.data() + b * nh * D, w.data() + b * nh,
                         pool.pool_keys.data() + static_cast<size_t>(slots_h[b]) * mp * D, pos.data() + b,
                         ref.data() + b * mp, nh, D, P, mp);
    }
    EXPECT_TRUE(same_bytes(download(*be, scores), download(*be, ref))) << where(B);
  }
}

TEST_F(CpuIndexerBatch, IndexerSelectEqualsTheSingleRowOp) {
  Rng rng(710);
  const int P = 4, K = 12, max_pools = 30, width = K + P - 1;
  for (int B : kBatches) {
    std::vector<float> sc(static_cast<size_t>(B) * max_pools);
    for (auto& v : sc) v = static_cast<float>(rng.integer(0, 5));  // many ties
    auto scores = upload(*be, sc);
    const auto slots_h = make_slots(rng, B, B + 1);
    const auto pos_h = make_positions(rng, slots_h, max_pools * P, -3);  // -3: refused if read
    auto s = upload(*be, slots_h), pos = upload(*be, pos_h);
    auto sel = poisoned<int32_t>(*be, static_cast<size_t>(B) * width, 0x7B);
    auto ref = poisoned<int32_t>(*be, sel.size(), 0x7B);
    be->indexer_select_batch(scores.data(), RowBatch{s.data(), pos.data(), B}, sel.data(), K, P, max_pools);
    for (int b = 0; b < B; ++b)
      if (slots_h[b] >= 0)
        be->indexer_select(scores.data() + b * max_pools, pos.data() + b, ref.data() + b * width, K, P,
                           max_pools);
    EXPECT_TRUE(same_bytes(download(*be, sel), download(*be, ref))) << where(B);
  }
}

}  // namespace
