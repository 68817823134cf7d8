// CPU reference, the norm family: rmsnorm, layernorm and the embedding row's norm against
// independent double formulas, and the batched norms, each row the single-row op's bytes (padded
// rows untouched).
//
// Tolerances (docs/numerics.md, "Test tolerances"): a BF16 output within one BF16 ulp of the exact
// value plus the fp32 summation bound of the sum of squares ((n - 1) u of a sum of positive
// terms) and the few roundings after it; at least 90% of the outputs the exact value rounded once.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu_test_util.hpp"
#include "ops/one_row.hpp"

using namespace mtplab;
using namespace mtplab::ops;
using namespace mtplab::ops::test;

namespace {

struct CpuNorm : CpuBackendTest {};
struct CpuNormBatch : CpuBackendTest {};

// ---- one row ----------------------------------------------------------------------------------------

TEST_F(CpuNorm, RmsnormMatchesDoubleFormula) {
  SCOPED_TRACE(seed_note());
  Rng rng(4);
  // eps 0.5 on the short rows so that a missing eps is visible at BF16 resolution.
  for (int n : {128, 1001}) {
    const int rows = 3;
    const float eps = n == 128 ? 0.5f : 1e-5f;
    const auto x = rng.bf16s(static_cast<size_t>(rows) * n, -3, 3), w = rng.bf16s(n, 0.5f, 1.5f);
    auto dx = upload(*be, x), dw = upload(*be, w);
    auto dy = poisoned<bf16>(*be, x.size());
    be->rmsnorm(dx.data(), dw.data(), dy.data(), rows, n, eps);
    const auto y = widen(download(*be, dy));
    // In place (x and y alias) gives the same bits.
    be->rmsnorm(dx.data(), dw.data(), dx.data(), rows, n, eps);
    EXPECT_EQ(std::memcmp(download(*be, dx).data(), download(*be, dy).data(), dy.bytes()), 0);
    int exact_count = 0;
    for (int r = 0; r < rows; ++r) {
      double ss = 0;
      for (int i = 0; i < n; ++i) ss += std::pow(static_cast<double>(to_float(x[r * n + i])), 2);
      const double inv = 1.0 / std::sqrt(ss / n + eps);
      for (int i = 0; i < n; ++i) {
        const double exact = to_float(w[i]) * to_float(x[r * n + i]) * inv;
        // fp32 inside: the sum of n positive squares (relative (n-1)u) and ~4 more roundings.
        ASSERT_TRUE(bf16_near(y[r * n + i], exact, (n + 4) * kU32 * std::fabs(exact)))
            << "n=" << n << " r=" << r << " i=" << i;
        exact_count += y[r * n + i] == bf16_nearest(exact);
      }
    }
    EXPECT_GE(exact_count, rows * n * 9 / 10);
  }
}

TEST_F(CpuNorm, EmbedRmsnormNormalisesTheTokenRow) {
  SCOPED_TRACE(seed_note());
  Rng rng(5);
  const int vocab = 50, n = 96;
  const auto table = rng.bf16s(static_cast<size_t>(vocab) * n, -2, 2), w = rng.bf16s(n, 0.5f, 1.5f);
  const int32_t token = rng.integer(1, vocab - 1);
  auto dt = upload(*be, table), dw = upload(*be, w);
  auto dtok = upload(*be, std::vector<int32_t>{token});
  auto dy = poisoned<bf16>(*be, n);
  mtplab::ops::OneRow(*be).embed_rmsnorm(dt.data(), dtok.data(), dw.data(), dy.data(), n, 1e-5f);
  const auto y = widen(download(*be, dy));
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += std::pow(static_cast<double>(to_float(table[token * n + i])), 2);
  for (int i = 0; i < n; ++i) {
    const double exact = to_float(w[i]) * to_float(table[token * n + i]) / std::sqrt(ss / n + 1e-5);
    ASSERT_TRUE(bf16_near(y[i], exact, (n + 4) * kU32 * std::fabs(exact))) << i;
  }
}

TEST_F(CpuNorm, LayernormMatchesDoubleFormula) {
  SCOPED_TRACE(seed_note());
  Rng rng(6);
  const int rows = 4, n = 200;
  const float eps = 1e-6f;
  auto x = rng.bf16s(static_cast<size_t>(rows) * n, -2, 3);  // non-zero mean
  const auto w = rng.bf16s(n, 0.5f, 1.5f), b = rng.bf16s(n, -0.5f, 0.5f);
  auto dx = upload(*be, x), dw = upload(*be, w), db = upload(*be, b);
  auto dy = poisoned<bf16>(*be, x.size());
  be->layernorm(dx.data(), dw.data(), db.data(), dy.data(), rows, n, eps);
  const auto y = widen(download(*be, dy));
  int exact_count = 0;
  for (int r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int i = 0; i < n; ++i) mean += to_float(x[r * n + i]);
    mean /= n;
    for (int i = 0; i < n; ++i) var += std::pow(to_float(x[r * n + i]) - mean, 2);
    var /= n;  // biased
    for (int i = 0; i < n; ++i) {
      const double z = (to_float(x[r * n + i]) - mean) / std::sqrt(var + eps);
      const double exact = z * to_float(w[i]) + to_float(b[i]);
      // fp32 mean and variance: relative error ~ n u on the normalised value, measured against
      // its scale (|z| + |mean| / std, since x - mean cancels), plus the bias add.
      const double err =
          (n + 8) * kU32 *
          ((std::fabs(z) + std::fabs(mean) / std::sqrt(var)) * to_float(w[i]) + std::fabs(to_float(b[i])));
      ASSERT_TRUE(bf16_near(y[r * n + i], exact, err)) << "r=" << r << " i=" << i;
      exact_count += y[r * n + i] == bf16_nearest(exact);
    }
  }
  EXPECT_GE(exact_count, rows * n * 9 / 10);
}

// ---- batched rows: each row the single-row op's bytes -----------------------------------------------

TEST_F(CpuNormBatch, EmbedRmsnormEqualsTheSingleRowOpAndSkipsPaddedRows) {
  Rng rng(701);
  const int V = 64, n = 44, ld = 2 * n;  // ld: the [e ; h] rows of the MTP front
  auto table = upload(*be, rng.bf16s(static_cast<size_t>(V) * n, -2, 2));
  auto w = upload(*be, rng.bf16s(n, 0.5f, 1.5f));
  for (int B : kBatches) {
    const auto slots_h = make_slots(rng, B, B + 2);
    std::vector<int32_t> tok_h(static_cast<size_t>(B));
    for (int b = 0; b < B; ++b)
      tok_h[b] = slots_h[b] < 0 ? -7 : rng.integer(0, V - 1);  // -7: refused if read
    auto slots = upload(*be, slots_h), tok = upload(*be, tok_h);
    auto y = poisoned<bf16>(*be, static_cast<size_t>(B) * ld);
    auto ref = poisoned<bf16>(*be, static_cast<size_t>(B) * ld);
    be->embed_rmsnorm_batch(table.data(), tok.data(), RowBatch{slots.data(), nullptr, B}, w.data(), y.data(),
                            ld, n, 1e-5f);
    for (int b = 0; b < B; ++b)
      if (slots_h[b] >= 0)
        mtplab::ops::OneRow(*be).embed_rmsnorm(table.data(), tok.data() + b, w.data(), ref.data() + b * ld, n,
                                               1e-5f);
    EXPECT_TRUE(same_bytes(download(*be, y), download(*be, ref))) << where(B);
  }
}

TEST_F(CpuNormBatch, RmsnormStridedEqualsTheSingleRowOp) {
  Rng rng(702);
  const int n = 44, ld_x = n + 5, ld_y = 2 * n;
  auto w = upload(*be, rng.bf16s(n, 0.5f, 1.5f));
  for (int B : kBatches) {
    auto x = upload(*be, rng.bf16s(static_cast<size_t>(B) * ld_x, -3, 3));
    auto y = poisoned<bf16>(*be, static_cast<size_t>(B) * ld_y);
    auto ref = poisoned<bf16>(*be, static_cast<size_t>(B) * ld_y);
    // Into the second half of each row, as the front's hidden norm writes [e ; h].
    be->rmsnorm_strided(x.data(), ld_x, w.data(), y.data() + n, ld_y, B, n, 1e-5f);
    for (int b = 0; b < B; ++b)
      be->rmsnorm(x.data() + b * ld_x, w.data(), ref.data() + b * ld_y + n, 1, n, 1e-5f);
    EXPECT_TRUE(same_bytes(download(*be, y), download(*be, ref))) << where(B);
    // In place, rows of one stride.
    auto xi = download(*be, x);
    be->rmsnorm_strided(x.data(), ld_x, w.data(), x.data(), ld_x, B, n, 1e-5f);
    auto xr = upload(*be, xi);
    for (int b = 0; b < B; ++b)
      be->rmsnorm(xr.data() + b * ld_x, w.data(), xr.data() + b * ld_x, 1, n, 1e-5f);
    EXPECT_TRUE(same_bytes(download(*be, x), download(*be, xr))) << "in place, " << where(B);
  }
}

TEST_F(CpuNormBatch, ResidualAddRmsnormRowsEqualsTheSingleRowOp) {
  Rng rng(703);
  const int n = 52;
  auto w = upload(*be, rng.bf16s(n, 0.5f, 1.5f));
  for (int B : kBatches) {
    const size_t all = static_cast<size_t>(B) * n;
    const auto x_h = rng.bf16s(all, -2, 2);
    auto delta = upload(*be, rng.floats(all, -1, 1));
    auto x = upload(*be, x_h), x_ref = upload(*be, x_h);
    auto normed = poisoned<bf16>(*be, all), normed_ref = poisoned<bf16>(*be, all);
    // x and y alias, as the block's residual does.
    be->residual_add_rmsnorm_rows(x.data(), delta.data(), x.data(), w.data(), normed.data(), B, n, 1e-5f);
    for (int b = 0; b < B; ++b)
      mtplab::ops::OneRow(*be).residual_add_rmsnorm(x_ref.data() + b * n, delta.data() + b * n,
                                                    x_ref.data() + b * n, w.data(), normed_ref.data() + b * n,
                                                    n, 1e-5f);
    EXPECT_TRUE(same_bytes(download(*be, x), download(*be, x_ref))) << where(B);
    EXPECT_TRUE(same_bytes(download(*be, normed), download(*be, normed_ref))) << where(B);
  }
  auto a = poisoned<bf16>(*be, 2 * n);
  auto d = poisoned<float>(*be, 2 * n);
  EXPECT_THROW(
      be->residual_add_rmsnorm_rows(a.data(), d.data(), a.data(), w.data(), a.data() + n, 2, n, 1e-5f),
      Error);
}

}  // namespace
