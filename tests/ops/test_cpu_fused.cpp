// CPU reference of the fused ops (linear_group, residual_add_rmsnorm): each must equal, bit for
// bit, the separate ops it replaces on the same backend (that is its whole contract), and the
// separate ops are checked against exact double arithmetic here once more so equality with a
// wrong pair could not pass. Bad arguments are refused with a message naming the op.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cpu_test_util.hpp"

namespace mtplab::ops::test {
namespace {

struct CpuFused : ::testing::Test {
  std::unique_ptr<Backend> be = make_cpu_backend();
};

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
  be->linear_group(outs, x.data(), k);
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
        EXPECT_TRUE(bf16_near(to_float(v), exact, err)) << "output " << i << " row " << r << "; " << seed_note();
      }
    }
  }
}

TEST_F(CpuFused, LinearGroupRefusesBadGroups) {
  auto x = poisoned<bf16>(*be, 8);
  auto W = poisoned<bf16>(*be, 8);
  auto y = poisoned<bf16>(*be, 1);
  EXPECT_THROW(be->linear_group(std::span<const LinearOut>(), x.data(), 8), Error);
  const std::vector<LinearOut> too_many(kMaxLinearGroup + 1, LinearOut{W.data(), y.data(), 1, false, 1.0f});
  EXPECT_THROW(be->linear_group(too_many, x.data(), 8), Error);
  const LinearOut scaled_bf16{W.data(), y.data(), 1, false, 2.0f};
  EXPECT_THROW(be->linear_group(std::span<const LinearOut>(&scaled_bf16, 1), x.data(), 8), Error);
  const LinearOut no_y{W.data(), nullptr, 1, false, 1.0f};
  EXPECT_THROW(be->linear_group(std::span<const LinearOut>(&no_y, 1), x.data(), 8), Error);
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
  be->residual_add_rmsnorm(x.data(), delta.data(), y1.data(), w.data(), n1.data(), n, eps);
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
  be->residual_add_rmsnorm(xa.data(), delta.data(), xa.data(), w.data(), na.data(), n, eps);
  EXPECT_TRUE(same_bits(download(*be, xa), y)) << seed_note();
  EXPECT_TRUE(same_bits(download(*be, na), normed)) << seed_note();
  // normed overlapping y is refused.
  EXPECT_THROW(be->residual_add_rmsnorm(x.data(), delta.data(), y1.data(), w.data(), y1.data(), n, eps), Error);
}

}  // namespace
}  // namespace mtplab::ops::test
