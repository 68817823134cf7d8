// CPU reference of the fused ops (linear_group, residual_add_rmsnorm, kv_norm_write,
// indexer_norm_store): each must equal, bit for bit, the separate ops it replaces on the same
// backend (that is its whole contract), and the separate ops are checked against exact double
// arithmetic here once more so equality with a wrong pair could not pass. Bad arguments are
// refused with a message naming the op (the fused cache writes: the op that refuses them).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "cpu_test_util.hpp"
#include "ops/one_row.hpp"

namespace mtplab::ops::test {
namespace {

struct CpuFused : CpuBackendTest {};

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

struct GroupMember {
  int n_out;
  bool f32_out;
  float scale;
};

TEST_F(CpuFused, LinearGroupEqualsTheSeparateOpsBitForBit) {
  Rng rng(101);
  const int k = 200;  // not a multiple of the CPU's 8 lanes: the tail path runs too
  // The block's group of u's projections: q_a, kv_a, wk (BF16), gate (fp32), weights_proj (fp32 scaled).
  const std::vector<GroupMember> members = {
      {48, false, 1.0f}, {32, false, 1.0f}, {16, false, 1.0f}, {16, true, 1.0f}, {4, true, 0.5f / 3.0f}};
  const auto x_h = rng.bf16s(k, -1.0f, 1.0f);
  auto x = upload(*be, x_h);
  std::vector<Array<bf16>> W;
  std::vector<std::vector<float>> W_f;
  std::vector<Array<uint8_t>> fused, separate;
  std::vector<LinearOut> outs;
  for (const GroupMember& m : members) {
    const auto w_h = rng.bf16s(static_cast<size_t>(m.n_out) * k, -1.0f, 1.0f);
    W_f.push_back(widen(w_h));
    W.push_back(upload(*be, w_h));
    const size_t bytes = static_cast<size_t>(m.n_out) * (m.f32_out ? 4 : 2);
    fused.push_back(poisoned<uint8_t>(*be, bytes));
    separate.push_back(poisoned<uint8_t>(*be, bytes));
    outs.push_back({W.back().data(), fused.back().data(), m.n_out, m.f32_out, m.scale});
  }
  mtplab::ops::OneRow(*be).linear_group(outs, x.data(), k);
  const auto x_f = widen(x_h);
  for (size_t i = 0; i < members.size(); ++i) {
    const GroupMember& m = members[i];
    if (m.f32_out) {
      auto* y = reinterpret_cast<float*>(separate[i].data());
      be->linear_f32(W[i].data(), x.data(), y, 1, m.n_out, k);
      if (m.scale != 1.0f) be->scale_f32(y, m.scale, m.n_out);
    } else {
      be->linear(W[i].data(), x.data(), reinterpret_cast<bf16*>(separate[i].data()), 1, m.n_out, k);
    }
    const auto got = download(*be, fused[i]);
    EXPECT_TRUE(same_bits(got, download(*be, separate[i]))) << "output " << i << "; " << seed_note();
    // And against the exact product: an fp32 sum of k exact products, rounded as stated.
    for (int r = 0; r < m.n_out; ++r) {
      double exact = 0, abs_sum = 0;
      for (int j = 0; j < k; ++j) {
        const double t = static_cast<double>(W_f[i][static_cast<size_t>(r) * k + j]) * x_f[j];
        exact += t;
        abs_sum += std::fabs(t);
      }
      const double err = fp32_sum_bound(k, abs_sum);
      if (m.f32_out) {
        float v;
        std::memcpy(&v, got.data() + static_cast<size_t>(r) * 4, 4);
        // The scale is one more fp32 rounding: half an ulp of the result.
        EXPECT_TRUE(near_abs(v, exact * m.scale, err * m.scale + std::fabs(exact * m.scale) * kU32))
            << "output " << i << " row " << r << "; " << seed_note();
      } else {
        bf16 v;
        std::memcpy(&v, got.data() + static_cast<size_t>(r) * 2, 2);
        EXPECT_TRUE(bf16_near(to_float(v), exact, err))
            << "output " << i << " row " << r << "; " << seed_note();
      }
    }
  }
}

TEST_F(CpuFused, LinearGroupRefusesBadGroups) {
  auto x = poisoned<bf16>(*be, 8);
  auto W = poisoned<bf16>(*be, 8);
  auto y = poisoned<bf16>(*be, 1);
  EXPECT_THROW(mtplab::ops::OneRow(*be).linear_group(std::span<const LinearOut>(), x.data(), 8), Error);
  const std::vector<LinearOut> too_many(kMaxLinearGroup + 1, LinearOut{W.data(), y.data(), 1, false, 1.0f});
  EXPECT_THROW(mtplab::ops::OneRow(*be).linear_group(too_many, x.data(), 8), Error);
  const LinearOut scaled_bf16{W.data(), y.data(), 1, false, 2.0f};
  EXPECT_THROW(
      mtplab::ops::OneRow(*be).linear_group(std::span<const LinearOut>(&scaled_bf16, 1), x.data(), 8), Error);
  const LinearOut no_y{W.data(), nullptr, 1, false, 1.0f};
  EXPECT_THROW(mtplab::ops::OneRow(*be).linear_group(std::span<const LinearOut>(&no_y, 1), x.data(), 8),
               Error);
}

// linear_rows_group: each output of rows [rows, n_out] equal bit for bit to its own batched
// linear / linear_f32 (+ scale_f32 over every row), at 1 and at several rows, and a row's values the
// same as that row alone (the CPU's batched linears are per-row GEMVs).
TEST_F(CpuFused, LinearRowsGroupEqualsTheSeparateBatchedOpsBitForBit) {
  Rng rng(103);
  const int k = 200;
  const std::vector<GroupMember> members = {
      {32, false, 1.0f}, {16, false, 1.0f}, {16, true, 1.0f}, {48, false, 1.0f}, {4, true, 0.5f / 3.0f}};
  for (const int rows : {1, 3, 7}) {
    const auto x_h = rng.bf16s(static_cast<size_t>(rows) * k, -1.0f, 1.0f);
    auto x = upload(*be, x_h);
    std::vector<Array<bf16>> W;
    std::vector<Array<uint8_t>> fused, separate;
    std::vector<LinearOut> outs;
    for (const GroupMember& m : members) {
      W.push_back(upload(*be, rng.bf16s(static_cast<size_t>(m.n_out) * k, -1.0f, 1.0f)));
      const size_t bytes = static_cast<size_t>(rows) * m.n_out * (m.f32_out ? 4 : 2);
      fused.push_back(poisoned<uint8_t>(*be, bytes));
      separate.push_back(poisoned<uint8_t>(*be, bytes));
      outs.push_back({W.back().data(), fused.back().data(), m.n_out, m.f32_out, m.scale});
    }
    be->linear_rows_group(outs, x.data(), rows, k);
    for (size_t i = 0; i < members.size(); ++i) {
      const GroupMember& m = members[i];
      if (m.f32_out) {
        auto* y = reinterpret_cast<float*>(separate[i].data());
        be->linear_f32(W[i].data(), x.data(), y, rows, m.n_out, k, RowsMode::batched);
        if (m.scale != 1.0f) be->scale_f32(y, m.scale, rows * m.n_out);
      } else {
        be->linear(W[i].data(), x.data(), reinterpret_cast<bf16*>(separate[i].data()), rows, m.n_out, k,
                   RowsMode::batched);
      }
      const auto got = download(*be, fused[i]);
      EXPECT_TRUE(same_bits(got, download(*be, separate[i])))
          << "rows " << rows << " output " << i << "; " << seed_note();
      // The last row alone gives the same bytes as in the group.
      const size_t row_bytes = static_cast<size_t>(m.n_out) * (m.f32_out ? 4 : 2);
      auto x_last = upload(*be, std::vector<bf16>(x_h.end() - k, x_h.end()));
      auto alone = poisoned<uint8_t>(*be, row_bytes);
      const LinearOut one{W[i].data(), alone.data(), m.n_out, m.f32_out, m.scale};
      be->linear_rows_group(std::span<const LinearOut>(&one, 1), x_last.data(), 1, k);
      const std::vector<uint8_t> last(got.end() - static_cast<long>(row_bytes), got.end());
      EXPECT_TRUE(same_bits(download(*be, alone), last))
          << "rows " << rows << " output " << i << "; " << seed_note();
    }
  }
}

TEST_F(CpuFused, LinearRowsGroupRefusesBadGroups) {
  auto x = poisoned<bf16>(*be, 16);
  auto W = poisoned<bf16>(*be, 8);
  auto y = poisoned<bf16>(*be, 2);
  EXPECT_THROW(be->linear_rows_group(std::span<const LinearOut>(), x.data(), 2, 8), Error);
  const std::vector<LinearOut> too_many(kMaxLinearGroup + 1, LinearOut{W.data(), y.data(), 1, false, 1.0f});
  EXPECT_THROW(be->linear_rows_group(too_many, x.data(), 2, 8), Error);
  const LinearOut scaled_bf16{W.data(), y.data(), 1, false, 2.0f};
  EXPECT_THROW(be->linear_rows_group(std::span<const LinearOut>(&scaled_bf16, 1), x.data(), 2, 8), Error);
  const LinearOut no_w{nullptr, y.data(), 1, false, 1.0f};
  EXPECT_THROW(be->linear_rows_group(std::span<const LinearOut>(&no_w, 1), x.data(), 2, 8), Error);
  const LinearOut fine{W.data(), y.data(), 1, false, 1.0f};
  EXPECT_THROW(be->linear_rows_group(std::span<const LinearOut>(&fine, 1), x.data(), 0, 8), Error);
}

TEST_F(CpuFused, ResidualAddRmsnormEqualsTheTwoOpsBitForBit) {
  Rng rng(102);
  const int n = 300;
  const float eps = 1e-5f;
  const auto x_h = rng.bf16s(n, -3.0f, 3.0f);
  const auto d_h = rng.floats(n, -2.0f, 2.0f);
  const auto w_h = rng.bf16s(n, 0.5f, 1.5f);
  auto x = upload(*be, x_h);
  auto delta = upload(*be, d_h);
  auto w = upload(*be, w_h);
  auto y1 = poisoned<bf16>(*be, n), n1 = poisoned<bf16>(*be, n);
  auto y2 = poisoned<bf16>(*be, n), n2 = poisoned<bf16>(*be, n);
  mtplab::ops::OneRow(*be).residual_add_rmsnorm(x.data(), delta.data(), y1.data(), w.data(), n1.data(), n,
                                                eps);
  be->residual_add(x.data(), delta.data(), y2.data(), n);
  be->rmsnorm(y2.data(), w.data(), n2.data(), 1, n, eps);
  const auto y = download(*be, y1), normed = download(*be, n1);
  EXPECT_TRUE(same_bits(y, download(*be, y2))) << seed_note();
  EXPECT_TRUE(same_bits(normed, download(*be, n2))) << seed_note();
  // y is one rounding of an exact fp32 sum; normed is the rmsnorm of y (double formula).
  double ss = 0;
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(to_float(y[i]), bf16_nearest(static_cast<double>(to_float(x_h[i])) + d_h[i]))
        << "y[" << i << "]; " << seed_note();
    ss += static_cast<double>(to_float(y[i])) * to_float(y[i]);
  }
  const double r = 1.0 / std::sqrt(ss / n + eps);
  for (int i = 0; i < n; ++i) {
    const double exact = to_float(w_h[i]) * (to_float(y[i]) * r);
    // fp32 sum of squares (n u relative) and three fp32 roundings, well inside 1e-5 relative.
    EXPECT_TRUE(bf16_near(to_float(normed[i]), exact, 1e-5 * std::fabs(exact))) << i << "; " << seed_note();
  }

  // In place: y aliases x (the block's last residual).
  auto xa = upload(*be, x_h);
  auto na = poisoned<bf16>(*be, n);
  mtplab::ops::OneRow(*be).residual_add_rmsnorm(xa.data(), delta.data(), xa.data(), w.data(), na.data(), n,
                                                eps);
  EXPECT_TRUE(same_bits(download(*be, xa), y)) << seed_note();
  EXPECT_TRUE(same_bits(download(*be, na), normed)) << seed_note();
  // normed overlapping y is refused.
  EXPECT_THROW(mtplab::ops::OneRow(*be).residual_add_rmsnorm(x.data(), delta.data(), y1.data(), w.data(),
                                                             y1.data(), n, eps),
               Error);
}

// kv_norm_write: the cache after each fused write equals the cache after rmsnorm + kv_write of the
// same row (both caches start with the same poison, so a stray or missing write shows), BF16 and
// FP8, kv_lora a multiple of the 8 lanes and not, positions across block boundaries of a shuffled
// block table; the BF16 rows against the double formula, the FP8 codes against to_fp8e4m3.
TEST_F(CpuFused, KvNormWriteEqualsTheTwoOpsBitForBit) {
  Rng rng(103);
  const float eps = 1e-6f, scale = 0.0123f;
  const int block_size = 4, num_blocks = 5;
  const std::vector<int32_t> table_h = {3, 0, 4, 1, 2};
  const std::vector<int32_t> positions = {0, 1, 3, 4, 7, 8, 19, 5, 4};  // 4 again: a rewrite
  auto table = upload(*be, table_h);
  for (const int L : {64, 37}) {
    const auto w_h = rng.bf16s(static_cast<size_t>(L), 0.5f, 1.5f);
    auto w = upload(*be, w_h);
    std::vector<std::vector<bf16>> rows;  // the BF16 run's normed row per position
    for (const KvDtype dtype : {KvDtype::bf16, KvDtype::fp8}) {
      SCOPED_TRACE(std::string(dtype == KvDtype::bf16 ? "bf16" : "fp8") + " L=" + std::to_string(L));
      const size_t elem = dtype == KvDtype::bf16 ? 2 : 1;
      const size_t bytes = static_cast<size_t>(num_blocks) * block_size * L * elem;
      auto fused = poisoned<uint8_t>(*be, bytes), separate = poisoned<uint8_t>(*be, bytes);
      const KvCache fc{fused.data(), dtype, scale, num_blocks, block_size, L};
      const KvCache sc{separate.data(), dtype, scale, num_blocks, block_size, L};
      Rng inputs(104 + L);  // the same rows for both dtypes
      for (size_t t = 0; t < positions.size(); ++t) {
        const int32_t p = positions[t];
        const auto x_h = inputs.bf16s(static_cast<size_t>(L), -3.0f, 3.0f);
        auto x = upload(*be, x_h);
        auto pos = upload(*be, std::vector<int32_t>{p});
        auto c_kv = poisoned<bf16>(*be, static_cast<size_t>(L));
        mtplab::ops::OneRow(*be).kv_norm_write(x.data(), w.data(), eps, table.data(), pos.data(), fc);
        be->rmsnorm(x.data(), w.data(), c_kv.data(), 1, L, eps);
        be->kv_write(c_kv.data(), table.data(), pos.data(), sc);
        const auto got = download(*be, fused);
        ASSERT_TRUE(same_bits(got, download(*be, separate))) << "position " << p << "; " << seed_note();
        const size_t at =
            (static_cast<size_t>(table_h[p / block_size]) * block_size + p % block_size) * L * elem;
        if (dtype == KvDtype::bf16) {
          std::vector<bf16> row(static_cast<size_t>(L));
          std::memcpy(row.data(), got.data() + at, L * elem);
          rows.push_back(row);
          double ss = 0;
          for (int i = 0; i < L; ++i) ss += static_cast<double>(to_float(x_h[i])) * to_float(x_h[i]);
          const double inv = 1.0 / std::sqrt(ss / L + eps);
          for (int i = 0; i < L; ++i) {
            const double exact = to_float(w_h[i]) * to_float(x_h[i]) * inv;
            ASSERT_TRUE(bf16_near(to_float(row[i]), exact, (L + 4) * kU32 * std::fabs(exact)))
                << "position " << p << " i=" << i << "; " << seed_note();
          }
        } else {
          for (int i = 0; i < L; ++i) {
            ASSERT_EQ(got[at + i], to_fp8e4m3(to_float(rows[t][i]) / scale).bits)
                << "position " << p << " i=" << i << "; " << seed_note();
          }
        }
      }
    }
  }
  // A block id outside the cache is refused, as by kv_write.
  auto bad_table = upload(*be, std::vector<int32_t>{0, 9, 0, 0, 0});
  auto x = poisoned<bf16>(*be, 64, 0);
  auto w = poisoned<bf16>(*be, 64, 0);
  auto pos = upload(*be, std::vector<int32_t>{5});
  auto data = poisoned<uint8_t>(*be, static_cast<size_t>(num_blocks) * block_size * 64 * 2);
  EXPECT_THROW(mtplab::ops::OneRow(*be).kv_norm_write(
                   x.data(), w.data(), eps, bad_table.data(), pos.data(),
                   KvCache{data.data(), KvDtype::bf16, 1.0f, num_blocks, block_size, 64}),
               Error);
}

// indexer_norm_store: k cache, gate cache, valid flags and pool keys after each fused store equal
// those after layernorm + indexer_store (same poison on both sides; valid starts at 0 as in a
// SlotCaches), D a multiple of the 8 lanes and not, rows in order over three pools, then a pool's
// last row stored again with new values (after a rollback: the key is recomputed). The k rows
// against the double formula; a pool completed with a row missing is refused.
TEST_F(CpuFused, IndexerNormStoreEqualsTheTwoOpsBitForBit) {
  Rng rng(105);
  const float eps = 1e-6f;
  const int P = 4, rows = 3 * P;
  for (const int D : {32, 37}) {
    SCOPED_TRACE("D=" + std::to_string(D));
    const auto w_h = rng.bf16s(static_cast<size_t>(D), 0.5f, 1.5f),
               b_h = rng.bf16s(static_cast<size_t>(D), -0.5f, 0.5f);
    auto w = upload(*be, w_h), b = upload(*be, b_h);
    auto ape = upload(*be, rng.floats(static_cast<size_t>(P) * D, -1.0f, 1.0f));
    struct Caches {
      Array<bf16> k;
      Array<float> gate, keys;
      Array<uint8_t> valid;
    };
    auto make = [&] {
      return Caches{poisoned<bf16>(*be, static_cast<size_t>(rows) * D),
                    poisoned<float>(*be, static_cast<size_t>(rows) * D),
                    poisoned<float>(*be, static_cast<size_t>(rows / P) * D), poisoned<uint8_t>(*be, rows, 0)};
    };
    Caches fused = make(), separate = make();
    std::vector<int32_t> positions(rows);
    std::iota(positions.begin(), positions.end(), 0);
    positions.push_back(2 * P - 1);
    for (const int32_t p : positions) {
      const auto x_h = rng.bf16s(static_cast<size_t>(D), -2.0f, 3.0f);  // non-zero mean
      auto x = upload(*be, x_h);
      auto gate = upload(*be, rng.floats(static_cast<size_t>(D), -3.0f, 3.0f));
      auto pos = upload(*be, std::vector<int32_t>{p});
      auto k_normed = poisoned<bf16>(*be, static_cast<size_t>(D));
      mtplab::ops::OneRow(*be).indexer_norm_store(x.data(), w.data(), b.data(), eps, gate.data(), ape.data(),
                                                  pos.data(), fused.k.data(), fused.gate.data(),
                                                  fused.valid.data(), fused.keys.data(), D, P);
      be->layernorm(x.data(), w.data(), b.data(), k_normed.data(), 1, D, eps);
      be->indexer_store(k_normed.data(), gate.data(), ape.data(), pos.data(), separate.k.data(),
                        separate.gate.data(), separate.valid.data(), separate.keys.data(), D, P);
      const auto k = download(*be, fused.k);
      ASSERT_TRUE(same_bits(k, download(*be, separate.k)))
          << "k cache, position " << p << "; " << seed_note();
      ASSERT_TRUE(same_bits(download(*be, fused.gate), download(*be, separate.gate)))
          << "gate cache, position " << p << "; " << seed_note();
      ASSERT_TRUE(same_bits(download(*be, fused.valid), download(*be, separate.valid)))
          << "valid, position " << p << "; " << seed_note();
      ASSERT_TRUE(same_bits(download(*be, fused.keys), download(*be, separate.keys)))
          << "pool keys, position " << p << "; " << seed_note();
      double mean = 0, var = 0;
      for (int i = 0; i < D; ++i) mean += to_float(x_h[i]);
      mean /= D;
      for (int i = 0; i < D; ++i) var += std::pow(to_float(x_h[i]) - mean, 2);
      var /= D;
      for (int i = 0; i < D; ++i) {
        const double z = (to_float(x_h[i]) - mean) / std::sqrt(var + eps);
        const double exact = z * to_float(w_h[i]) + to_float(b_h[i]);
        // As test_cpu_dense's layernorm: ~D u relative to the normalised value's scale, plus the bias.
        const double err = (D + 8) * kU32 *
                           ((std::fabs(z) + std::fabs(mean) / std::sqrt(var)) * to_float(w_h[i]) +
                            std::fabs(to_float(b_h[i])));
        ASSERT_TRUE(bf16_near(to_float(k[static_cast<size_t>(p) * D + i]), exact, err))
            << "position " << p << " i=" << i << "; " << seed_note();
      }
    }
  }
  // Row 7 completes pool 1, whose rows 4..6 were never stored: refused, as by indexer_store.
  const int D = 8;
  auto x = upload(*be, rng.bf16s(D, -1.0f, 1.0f));
  auto w = upload(*be, rng.bf16s(D, 0.5f, 1.5f)), b = upload(*be, rng.bf16s(D, -0.5f, 0.5f));
  auto gate = upload(*be, rng.floats(D, -1.0f, 1.0f)), ape = upload(*be, rng.floats(P * D, -1.0f, 1.0f));
  auto pos = upload(*be, std::vector<int32_t>{7});
  auto k = poisoned<bf16>(*be, 8 * D);
  auto g = poisoned<float>(*be, 8 * D), keys = poisoned<float>(*be, 2 * D);
  auto valid = poisoned<uint8_t>(*be, 8, 0);
  EXPECT_THROW(mtplab::ops::OneRow(*be).indexer_norm_store(x.data(), w.data(), b.data(), eps, gate.data(),
                                                           ape.data(), pos.data(), k.data(), g.data(),
                                                           valid.data(), keys.data(), D, P),
               Error);
}

}  // namespace
}  // namespace mtplab::ops::test
