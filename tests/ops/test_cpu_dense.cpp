// CPU reference: memory, timing, elementwise ops, linear layers, the head and the argmax
// family, each against an independent double-precision formula written here.
//
// Tolerances (docs/numerics.md, "Test tolerances"): a BF16 output must lie within one BF16 ulp of
// the exact value plus the fp32 summation bound (n - 1) u sum|terms| (products of BF16 values are
// exact in fp32, so that bound is rigorous); for the linear layers we also require that at least
// 90% of the outputs equal the exact value rounded once to nearest-even, which a truncating or
// double-rounding implementation fails. fp32 outputs: the summation bound alone. The batched head
// and argmax family: each live row the single-row op's bytes, padded rows untouched.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <thread>

#include "core/error.hpp"
#include "cpu_test_util.hpp"
#include "ops/one_row.hpp"

using namespace mtplab;
using namespace mtplab::ops;
using namespace mtplab::ops::test;

namespace {

struct Fixture : CpuBackendTest {};

// y = W x in double, with the sum of |terms| for the tolerance.
struct Dot {
  double value = 0;
  double abs_sum = 0;
};
Dot exact_dot(const std::vector<float>& w_row, const std::vector<float>& x) {
  Dot d;
  for (size_t j = 0; j < x.size(); ++j) {
    d.value += static_cast<double>(w_row[j]) * x[j];
    d.abs_sum += std::fabs(static_cast<double>(w_row[j]) * x[j]);
  }
  return d;
}

std::vector<float> row_of(const std::vector<float>& m, size_t r, size_t cols) {
  return {m.begin() + static_cast<std::ptrdiff_t>(r * cols),
          m.begin() + static_cast<std::ptrdiff_t>((r + 1) * cols)};
}

}  // namespace

using CpuDense = Fixture;

// ---- memory, timing, scalars --------------------------------------------------------------------

TEST_F(CpuDense, MemoryIsAlignedAndCopiesRoundTrip) {
  SCOPED_TRACE(seed_note());
  Rng rng(1);
  EXPECT_EQ(be->kind(), BackendKind::cpu);
  EXPECT_STREQ(to_string(be->kind()), "cpu");
  EXPECT_EQ(be->allocate(0), nullptr);
  be->release(nullptr);
  const auto host = rng.floats(1001, -5, 5);
  auto a = upload(*be, host);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
  auto b = poisoned<float>(*be, host.size());
  be->copy(b.data(), a.data(), a.bytes());
  EXPECT_EQ(std::memcmp(download(*be, b).data(), host.data(), a.bytes()), 0);
  be->fill_bytes(b.data(), 0x3f, 8);
  auto back = download(*be, b);
  uint32_t bits;
  std::memcpy(&bits, &back[1], 4);
  EXPECT_EQ(bits, 0x3f3f3f3fu);
  EXPECT_EQ(back[2], host[2]);
}

TEST_F(CpuDense, EventsMeasureSteadyClockTime) {
  auto start = be->make_event();
  auto end = be->make_event();
  EXPECT_THROW(be->elapsed_ms(*start, *end), Error);  // never recorded
  start->record();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  end->record();
  const double ms = be->elapsed_ms(*start, *end);
  EXPECT_GE(ms, 5.0);
  EXPECT_LT(ms, 5000.0);
}

TEST_F(CpuDense, AddI32ReadsAndWritesBackendMemory) {
  auto src = upload(*be, std::vector<int32_t>{41});
  auto dst = poisoned<int32_t>(*be, 1);
  be->add_i32(src.data(), 7, dst.data());
  EXPECT_EQ(download(*be, dst)[0], 48);
  be->add_i32(dst.data(), -48, dst.data());  // in place
  EXPECT_EQ(download(*be, dst)[0], 0);
}

// ---- elementwise --------------------------------------------------------------------------------

TEST_F(CpuDense, ElementwiseRoundOnceToNearestEven) {
  SCOPED_TRACE(seed_note());
  Rng rng(2);
  const int n = 777;
  const auto xa = rng.bf16s(n, -4, 4), xb = rng.bf16s(n, -4, 4);
  const auto delta = rng.floats(n, -0.1f, 0.1f);
  auto f = rng.floats(n, -300, 300);
  f[0] = 1.0f + std::ldexp(1.0f, -8);      // exact tie: rounds to even (1.0)
  f[1] = 1.0f + 3 * std::ldexp(1.0f, -8);  // exact tie: rounds to even (1 + 2^-6)
  auto a = upload(*be, xa), b = upload(*be, xb);
  auto d = upload(*be, delta), fx = upload(*be, f);
  auto y_res = poisoned<bf16>(*be, n), y_add = poisoned<bf16>(*be, n), y_cvt = poisoned<bf16>(*be, n);
  be->residual_add(a.data(), d.data(), y_res.data(), n);
  be->add(a.data(), b.data(), y_add.data(), n);
  be->to_bf16(fx.data(), y_cvt.data(), n);
  const auto res = widen(download(*be, y_res)), sum = widen(download(*be, y_add)),
             cvt = widen(download(*be, y_cvt));
  int res_exact = 0;
  for (int i = 0; i < n; ++i) {
    // a + b of two BF16 values is exact in fp32, so one rounding: bit-exact with the double.
    ASSERT_EQ(sum[i], bf16_nearest(static_cast<double>(to_float(xa[i])) + to_float(xb[i]))) << i;
    // fp32 values convert with one rounding: bit-exact.
    ASSERT_EQ(cvt[i], bf16_nearest(f[i])) << i;
    // x + delta rounds in fp32 first (half a fp32 ulp), then to BF16.
    const double exact = static_cast<double>(to_float(xa[i])) + delta[i];
    ASSERT_TRUE(bf16_near(res[i], exact, kU32 * std::fabs(exact))) << i;
    res_exact += res[i] == bf16_nearest(exact);
  }
  EXPECT_EQ(cvt[0], 1.0f);
  EXPECT_EQ(cvt[1], 1.0f + std::ldexp(1.0f, -6));
  EXPECT_GE(res_exact, n * 99 / 100);
}

TEST_F(CpuDense, AccumulateAndScaleF32AreSingleFp32Operations) {
  SCOPED_TRACE(seed_note());
  Rng rng(3);
  const int n = 333;
  const auto x = rng.floats(n, -10, 10), y0 = rng.floats(n, -10, 10);
  auto dx = upload(*be, x), dy = upload(*be, y0);
  be->accumulate_f32(dx.data(), dy.data(), n);
  be->scale_f32(dy.data(), 0.3f, n);
  const auto y = download(*be, dy);
  for (int i = 0; i < n; ++i) {
    // One fp32 add then one fp32 multiply; each is the correctly rounded double result.
    const float added = static_cast<float>(static_cast<double>(y0[i]) + x[i]);
    ASSERT_EQ(y[i], static_cast<float>(static_cast<double>(added) * 0.3f)) << i;
  }
}

// ---- linear layers ------------------------------------------------------------------------------

TEST_F(CpuDense, LinearBf16AndF32MatchDoubleAndBatchedEqualsPerRow) {
  SCOPED_TRACE(seed_note());
  Rng rng(7);
  const int rows = 3, n_out = 67, k = 203;  // k not a multiple of the 8 summation lanes
  const auto W = rng.bf16s(static_cast<size_t>(n_out) * k, -1, 1),
             X = rng.bf16s(static_cast<size_t>(rows) * k, -1, 1);
  auto dW = upload(*be, W), dX = upload(*be, X);
  auto y_row = poisoned<bf16>(*be, static_cast<size_t>(rows) * n_out),
       y_bat = poisoned<bf16>(*be, y_row.size());
  auto y_f32 = poisoned<float>(*be, y_row.size()), y_f32b = poisoned<float>(*be, y_row.size());
  be->linear(dW.data(), dX.data(), y_row.data(), rows, n_out, k, RowsMode::per_row);
  be->linear(dW.data(), dX.data(), y_bat.data(), rows, n_out, k, RowsMode::batched);
  be->linear_f32(dW.data(), dX.data(), y_f32.data(), rows, n_out, k, RowsMode::per_row);
  be->linear_f32(dW.data(), dX.data(), y_f32b.data(), rows, n_out, k, RowsMode::batched);
  // On the CPU, batched is per_row (the mode only picks a GPU path): identical bits.
  EXPECT_EQ(std::memcmp(download(*be, y_row).data(), download(*be, y_bat).data(), y_row.bytes()), 0);
  EXPECT_EQ(std::memcmp(download(*be, y_f32).data(), download(*be, y_f32b).data(), y_f32.bytes()), 0);
  const auto yb = widen(download(*be, y_row));
  const auto yf = download(*be, y_f32);
  const auto Wf = widen(W), Xf = widen(X);
  int exact_count = 0;
  for (int r = 0; r < rows; ++r) {
    const auto x = row_of(Xf, r, k);
    for (int i = 0; i < n_out; ++i) {
      const Dot d = exact_dot(row_of(Wf, i, k), x);
      const size_t o = static_cast<size_t>(r) * n_out + i;
      ASSERT_TRUE(bf16_near(yb[o], d.value, fp32_sum_bound(k, d.abs_sum))) << "r=" << r << " i=" << i;
      ASSERT_TRUE(near_abs(yf[o], d.value, fp32_sum_bound(k, d.abs_sum))) << "r=" << r << " i=" << i;
      exact_count += yb[o] == bf16_nearest(d.value);
    }
  }
  EXPECT_GE(exact_count, rows * n_out * 9 / 10);
}

TEST_F(CpuDense, LinearFp8AppliesTheRowScale) {
  SCOPED_TRACE(seed_note());
  Rng rng(8);
  const int rows = 2, n_out = 41, k = 130;
  const auto W = rng.fp8s(static_cast<size_t>(n_out) * k);
  const auto scale = rng.floats(n_out, 0.001f, 0.01f);
  const auto X = rng.bf16s(static_cast<size_t>(rows) * k, -2, 2);
  auto dW = upload(*be, W);
  auto ds = upload(*be, scale);
  auto dX = upload(*be, X);
  auto dY = poisoned<bf16>(*be, static_cast<size_t>(rows) * n_out);
  be->linear_fp8(dW.data(), ds.data(), dX.data(), dY.data(), rows, n_out, k);
  const auto y = widen(download(*be, dY));
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < n_out; ++i) {
      double acc = 0, abs_sum = 0;
      for (int j = 0; j < k; ++j) {
        const double t =
            static_cast<double>(to_float(W[static_cast<size_t>(i) * k + j])) * to_float(X[r * k + j]);
        acc += t;
        abs_sum += std::fabs(t);
      }
      // One more fp32 rounding for the scale multiply.
      ASSERT_TRUE(bf16_near(y[r * n_out + i], scale[i] * acc,
                            scale[i] * (fp32_sum_bound(k, abs_sum) + kU32 * std::fabs(acc))))
          << "r=" << r << " i=" << i;
    }
  }
}

// ---- head and argmax ----------------------------------------------------------------------------

TEST_F(CpuDense, HeadArgmaxRoundsLogitsAndPicksLowestIndexOfTheMax) {
  SCOPED_TRACE(seed_note());
  Rng rng(9);
  const int n = 500, k = 128;
  const int64_t base = 1000;
  auto W = rng.bf16s(static_cast<size_t>(n) * k, -1, 1);
  const auto x = rng.bf16s(k, -1, 1);
  // Rows 77 and 300 are the same row aligned with x: the two largest logits, tied.
  for (int j = 0; j < k; ++j) {
    W[77 * k + j] = to_bf16(to_float(x[j]) >= 0 ? 1.0f : -1.0f);
    W[300 * k + j] = W[77 * k + j];
  }
  auto dW = upload(*be, W), dx = upload(*be, x);
  auto logits = poisoned<bf16>(*be, n);
  auto out = poisoned<ArgMax>(*be, 1);
  be->head_argmax(dW.data(), nullptr, nullptr, dx.data(), n, k, base, logits.data(), out.data());
  const auto got = widen(download(*be, logits));
  const ArgMax am = download(*be, out)[0];
  const auto Wf = widen(W), xf = widen(x);
  for (int i = 0; i < n; ++i) {
    const Dot d = exact_dot(row_of(Wf, i, k), xf);
    ASSERT_TRUE(bf16_near(got[i], d.value, fp32_sum_bound(k, d.abs_sum))) << i;
  }
  EXPECT_EQ(am.index, base + 77);
  EXPECT_EQ(am.value, got[77]);
  EXPECT_EQ(got[77], got[300]);
  // Without a logits buffer: same answer.
  auto out2 = poisoned<ArgMax>(*be, 1);
  be->head_argmax(dW.data(), nullptr, nullptr, dx.data(), n, k, base, nullptr, out2.data());
  EXPECT_EQ(download(*be, out2)[0].index, base + 77);
  // The extras: the packed key of the pair (as argmax_pack_key writes it) and the token.
  auto out3 = poisoned<ArgMax>(*be, 1);
  auto key = poisoned<uint64_t>(*be, 1), packed = poisoned<uint64_t>(*be, 1);
  auto token = poisoned<int32_t>(*be, 1);
  be->head_argmax(dW.data(), nullptr, nullptr, dx.data(), n, k, base, nullptr, out3.data(),
                  HeadExtras{key.data(), token.data()});
  be->argmax_pack_key(out3.data(), packed.data());
  EXPECT_EQ(download(*be, out3)[0].index, base + 77);
  EXPECT_EQ(download(*be, key)[0], download(*be, packed)[0]);
  EXPECT_EQ(download(*be, token)[0], base + 77);
}

TEST_F(CpuDense, HeadArgmaxComparesBf16LogitsNotFp32Sums) {
  // fp32 sums 1 (row 1) and 1 + 2^-10 (row 3) both round to BF16 1.0: the argmax is over the
  // rounded logits, so row 1 (the lower index) wins, although row 3's fp32 sum is larger.
  const int n = 5, k = 8;
  std::vector<float> Wf(static_cast<size_t>(n) * k, 0.0f);
  for (int i = 0; i < n; ++i) Wf[i * k] = 0.5f;
  Wf[1 * k] = 1.0f;
  Wf[3 * k] = 1.0f;
  Wf[3 * k + 1] = std::ldexp(1.0f, -10);
  std::vector<bf16> W(Wf.size()), x(k, to_bf16(1.0f));
  for (size_t i = 0; i < Wf.size(); ++i) W[i] = to_bf16(Wf[i]);
  auto dW = upload(*be, W), dx = upload(*be, x);
  auto out = poisoned<ArgMax>(*be, 1);
  be->head_argmax(dW.data(), nullptr, nullptr, dx.data(), n, k, 0, nullptr, out.data());
  EXPECT_EQ(download(*be, out)[0].index, 1);
  EXPECT_EQ(download(*be, out)[0].value, 1.0f);
}

TEST_F(CpuDense, HeadArgmaxFp8UsesScaledFp8Rows) {
  SCOPED_TRACE(seed_note());
  Rng rng(10);
  const int n = 300, k = 96;
  const int64_t base = 12345;
  const auto W = rng.fp8s(static_cast<size_t>(n) * k);
  const auto scale = rng.floats(n, 0.001f, 0.004f);
  const auto x = rng.bf16s(k, -1, 1);
  auto dW = upload(*be, W);
  auto ds = upload(*be, scale);
  auto dx = upload(*be, x);
  auto logits = poisoned<bf16>(*be, n);
  auto out = poisoned<ArgMax>(*be, 1);
  be->head_argmax(nullptr, dW.data(), ds.data(), dx.data(), n, k, base, logits.data(), out.data());
  const auto got = widen(download(*be, logits));
  int best = 0;
  for (int i = 0; i < n; ++i) {
    double acc = 0, abs_sum = 0;
    for (int j = 0; j < k; ++j) {
      const double t = static_cast<double>(to_float(W[static_cast<size_t>(i) * k + j])) * to_float(x[j]);
      acc += t;
      abs_sum += std::fabs(t);
    }
    ASSERT_TRUE(
        bf16_near(got[i], scale[i] * acc, scale[i] * (fp32_sum_bound(k, abs_sum) + kU32 * std::fabs(acc))))
        << i;
    if (got[i] > got[best]) best = i;
  }
  EXPECT_EQ(download(*be, out)[0].index, base + best);
  EXPECT_EQ(download(*be, out)[0].value, got[best]);
}

TEST_F(CpuDense, ArgmaxTiesGoToTheLowestIndex) {
  SCOPED_TRACE(seed_note());
  Rng rng(11);
  const int n = 1000;
  auto x = rng.bf16s(n, -10, 10);
  const bf16 top = to_bf16(11.0f);
  for (int i : {613, 204, 900}) x[i] = top;
  auto dx = upload(*be, x);
  auto out = poisoned<ArgMax>(*be, 1);
  be->argmax(dx.data(), n, 0, out.data());
  EXPECT_EQ(download(*be, out)[0].index, 204);
  EXPECT_EQ(download(*be, out)[0].value, 11.0f);
  // All equal (and all -inf): index 0, plus the base.
  std::vector<bf16> flat(n, to_bf16(-std::numeric_limits<float>::infinity()));
  auto df = upload(*be, flat);
  be->argmax(df.data(), n, 7, out.data());
  EXPECT_EQ(download(*be, out)[0].index, 7);
  // -0 and +0 compare equal: the first one wins.
  std::vector<bf16> zeros = {to_bf16(-1.0f), to_bf16(-0.0f), to_bf16(0.0f)};
  auto dz = upload(*be, zeros);
  be->argmax(dz.data(), 3, 0, out.data());
  EXPECT_EQ(download(*be, out)[0].index, 1);
  EXPECT_THROW(be->argmax(dx.data(), n, std::numeric_limits<int32_t>::max(), out.data()), Error);
}

// ---- cross-rank pick helpers --------------------------------------------------------------------

namespace {

// Independent definition of the key's high half: rank of the value in float order, by cases.
uint64_t expected_key(float v, int32_t index) {
  uint32_t hi;
  if (v == 0.0f) {
    hi = 0x80000000u;  // both zeros
  } else if (v > 0) {
    hi = 0x80000000u + float_to_bits(v);  // above every negative and zero
  } else {
    hi = 0x7fffffffu - (float_to_bits(-v));  // larger magnitude -> smaller key
  }
  return (static_cast<uint64_t>(hi) << 32) | (0xffffffffu - static_cast<uint32_t>(index));
}

}  // namespace

TEST_F(CpuDense, PackKeyMatchesDefinitionAndRoundTrips) {
  SCOPED_TRACE(seed_note());
  Rng rng(12);
  auto in = poisoned<ArgMax>(*be, 1);
  auto key = poisoned<uint64_t>(*be, 1);
  auto tok = poisoned<int32_t>(*be, 1);
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> values = {0.0f, -0.0f, 1.0f, -1.0f, inf, -inf, 1e-40f, -1e-40f, 3.0e38f};
  for (int i = 0; i < 200; ++i) values.push_back(rng.uniform(-100, 100));
  for (float v : values) {
    const int32_t index = rng.integer(0, 154879);
    const ArgMax a{v, index};
    be->upload(in.data(), &a, sizeof a);
    be->argmax_pack_key(in.data(), key.data());
    be->argmax_unpack_key(key.data(), tok.data());
    ASSERT_EQ(download(*be, key)[0], expected_key(v, index)) << "value " << v;
    ASSERT_EQ(download(*be, tok)[0], index);
  }
  // Spot values: 1.0 at index 5, -1.0 at index 0.
  EXPECT_EQ(expected_key(1.0f, 5), 0xbf800000fffffffaull);
  EXPECT_EQ(expected_key(-1.0f, 0), 0x407fffffffffffffull);
}

TEST_F(CpuDense, MaxOfPackedKeysEqualsArgmaxPick) {
  SCOPED_TRACE(seed_note());
  Rng rng(13);
  // Few distinct values, so ties are common; includes -0 / +0 and infinities.
  const float choices[] = {-std::numeric_limits<float>::infinity(), -2.5f, -0.0f, 0.0f, 0.75f, 3.0f,
                           std::numeric_limits<float>::infinity()};
  for (int trial = 0; trial < 300; ++trial) {
    const int n = rng.integer(1, 9);
    std::vector<ArgMax> pairs(n);
    for (auto& p : pairs) p = ArgMax{choices[rng.integer(0, 6)], rng.integer(0, 1 << 20)};
    // Naive winner: largest value; among equal values the smallest index.
    ArgMax want = pairs[0];
    for (const auto& p : pairs) {
      if (p.value > want.value || (p.value == want.value && p.index < want.index)) want = p;
    }
    auto dp = upload(*be, pairs);
    auto tok = poisoned<int32_t>(*be, 1);
    be->argmax_pick(dp.data(), n, tok.data());
    ASSERT_EQ(download(*be, tok)[0], want.index) << "trial " << trial;
    uint64_t max_key = 0;
    auto key = poisoned<uint64_t>(*be, 1);
    for (int i = 0; i < n; ++i) {
      be->argmax_pack_key(dp.data() + i, key.data());
      max_key = std::max(max_key, download(*be, key)[0]);
    }
    auto dk = upload(*be, std::vector<uint64_t>{max_key});
    be->argmax_unpack_key(dk.data(), tok.data());
    ASSERT_EQ(download(*be, tok)[0], want.index) << "trial " << trial;
  }
}

// ---- batched rows: each row the single-row op's bytes -----------------------------------------------

namespace {

struct CpuDenseBatch : CpuBackendTest {};

struct HeadCase {
  bool fp8;
  bool logits;
  bool extras;
};

TEST_F(CpuDenseBatch, HeadArgmaxEqualsTheSingleRowOpBf16AndFp8) {
  Rng rng(704);
  const int n = 300, k = 72, ld = n + 20;
  const int64_t base = 1000;
  auto W_h = rng.bf16s(static_cast<size_t>(n) * k, -1, 1);
  // Duplicate rows, so equal logits occur at several places of the sweep.
  std::copy_n(W_h.begin() + 17 * k, k, W_h.begin() + 250 * k);
  std::copy_n(W_h.begin() + 3 * k, k, W_h.begin() + 200 * k);
  auto W = upload(*be, W_h);
  auto W8 = upload(*be, rng.fp8s(static_cast<size_t>(n) * k));
  auto scale = upload(*be, rng.floats(n, 0.001f, 0.01f));
  for (const HeadCase c : {HeadCase{false, true, true}, HeadCase{true, true, true},
                           HeadCase{false, false, false}, HeadCase{true, false, true}}) {
    for (int B : kBatches) {
      const auto slots_h = make_slots(rng, B, B);
      auto slots = upload(*be, slots_h);
      auto x = upload(*be, rng.bf16s(static_cast<size_t>(B) * k, -1, 1));
      auto out = poisoned<ArgMax>(*be, B), out_ref = poisoned<ArgMax>(*be, B);
      auto logits = poisoned<bf16>(*be, static_cast<size_t>(B) * ld);
      auto logits_ref = poisoned<bf16>(*be, static_cast<size_t>(B) * ld);
      auto key = poisoned<uint64_t>(*be, B), key_ref = poisoned<uint64_t>(*be, B);
      auto token = poisoned<int32_t>(*be, B), token_ref = poisoned<int32_t>(*be, B);
      const fp8e4m3* w8 = c.fp8 ? W8.data() : nullptr;
      const bf16* w16 = c.fp8 ? nullptr : W.data();
      const float* sc = c.fp8 ? scale.data() : nullptr;
      HeadExtras extras;
      if (c.extras) extras = {key.data(), token.data()};
      be->head_argmax_batch(w16, w8, sc, x.data(), RowBatch{slots.data(), nullptr, B}, n, k, base,
                            c.logits ? logits.data() : nullptr, ld, out.data(), extras);
      for (int b = 0; b < B; ++b) {
        if (slots_h[b] < 0) continue;
        HeadExtras e1;
        if (c.extras) e1 = {key_ref.data() + b, token_ref.data() + b};
        be->head_argmax(w16, w8, sc, x.data() + b * k, n, k, base,
                        c.logits ? logits_ref.data() + b * ld : nullptr, out_ref.data() + b, e1);
      }
      const std::string what = std::string(c.fp8 ? "FP8" : "BF16") + (c.logits ? " with logits" : "") +
                               (c.extras ? " with extras" : "") + ", " + where(B);
      EXPECT_TRUE(same_bytes(download(*be, out), download(*be, out_ref))) << what;
      EXPECT_TRUE(same_bytes(download(*be, logits), download(*be, logits_ref))) << what;
      EXPECT_TRUE(same_bytes(download(*be, key), download(*be, key_ref))) << what;
      EXPECT_TRUE(same_bytes(download(*be, token), download(*be, token_ref))) << what;
    }
  }
}

TEST_F(CpuDenseBatch, HeadArgmaxTiesGoToTheLowestRowInEveryRow) {
  // Rows 7 and 40 of W are the same large positive row, row 90 a little smaller: with positive
  // inputs every row's maximum is the tie of rows 7 and 40, and row 7 must win in each.
  Rng rng(705);
  const int n = 128, k = 32, B = 16;
  auto W_h = rng.bf16s(static_cast<size_t>(n) * k, -0.05f, 0.05f);
  for (int j = 0; j < k; ++j) {
    W_h[7 * k + j] = to_bf16(1.0f);
    W_h[40 * k + j] = to_bf16(1.0f);
    W_h[90 * k + j] = to_bf16(0.875f);
  }
  auto W = upload(*be, W_h);
  auto x = upload(*be, rng.bf16s(static_cast<size_t>(B) * k, 0.5f, 1.0f));
  std::vector<int32_t> slots_h(B);
  std::iota(slots_h.begin(), slots_h.end(), 0);
  auto slots = upload(*be, slots_h);
  auto out = poisoned<ArgMax>(*be, B);
  be->head_argmax_batch(W.data(), nullptr, nullptr, x.data(), RowBatch{slots.data(), nullptr, B}, n, k, 5,
                        nullptr, 0, out.data());
  for (const ArgMax& a : download(*be, out)) EXPECT_EQ(a.index, 5 + 7);
}

TEST_F(CpuDenseBatch, ArgmaxFamilyEqualsTheSingleRowOps) {
  Rng rng(706);
  const int n = 37, ld = 50, world = 3;
  for (int B : kBatches) {
    // Values from a small set, so ties are common.
    std::vector<bf16> x_h(static_cast<size_t>(B) * ld);
    for (auto& v : x_h) v = to_bf16(static_cast<float>(rng.integer(-4, 4)) * 0.25f);
    auto x = upload(*be, x_h);
    auto out = poisoned<ArgMax>(*be, B), out_ref = poisoned<ArgMax>(*be, B);
    be->argmax_batch(x.data(), ld, B, n, 500, out.data());
    for (int b = 0; b < B; ++b) be->argmax(x.data() + b * ld, n, 500, out_ref.data() + b);
    EXPECT_TRUE(same_bytes(download(*be, out), download(*be, out_ref))) << where(B);

    std::vector<ArgMax> pairs_h(static_cast<size_t>(world) * B);
    for (auto& p : pairs_h) p = ArgMax{static_cast<float>(rng.integer(0, 2)), rng.integer(0, 1000)};
    auto pairs = upload(*be, pairs_h);
    auto tok = poisoned<int32_t>(*be, B), tok_ref = poisoned<int32_t>(*be, B);
    be->argmax_pick_batch(pairs.data(), world, B, tok.data());
    for (int b = 0; b < B; ++b) {
      std::vector<ArgMax> row;
      for (int i = 0; i < world; ++i) row.push_back(pairs_h[static_cast<size_t>(i) * B + b]);
      auto row_dev = upload(*be, row);
      be->argmax_pick(row_dev.data(), world, tok_ref.data() + b);
    }
    EXPECT_TRUE(same_bytes(download(*be, tok), download(*be, tok_ref))) << "pick, " << where(B);

    auto keys = poisoned<uint64_t>(*be, B);
    for (int b = 0; b < B; ++b) be->argmax_pack_key(pairs.data() + b, keys.data() + b);
    auto unpacked = poisoned<int32_t>(*be, B), unpacked_ref = poisoned<int32_t>(*be, B);
    be->argmax_unpack_key_batch(keys.data(), unpacked.data(), B);
    for (int b = 0; b < B; ++b) be->argmax_unpack_key(keys.data() + b, unpacked_ref.data() + b);
    const auto u = download(*be, unpacked);
    EXPECT_TRUE(same_bytes(u, download(*be, unpacked_ref))) << "unpack, " << where(B);
    for (int b = 0; b < B; ++b) EXPECT_EQ(u[b], pairs_h[b].index);
  }
}

// Every row padded: the head writes nothing (the grouped experts' case: CpuMoeBatch, test_cpu_moe.cpp).
TEST_F(CpuDenseBatch, AllRowsPaddedWritesNothing) {
  Rng rng(715);
  const int B = 4, H = 16;
  const std::vector<int32_t> none(B, -1);
  auto s = upload(*be, none);
  auto x = upload(*be, rng.bf16s(static_cast<size_t>(B) * H, -1, 1));
  auto head_out = poisoned<ArgMax>(*be, B);
  const auto head_before = download(*be, head_out);
  auto W = upload(*be, rng.bf16s(static_cast<size_t>(10) * H, -1, 1));
  be->head_argmax_batch(W.data(), nullptr, nullptr, x.data(), RowBatch{s.data(), nullptr, B}, 10, H, 0,
                        nullptr, 0, head_out.data());
  EXPECT_TRUE(same_bytes(download(*be, head_out), head_before));
}

}  // namespace
