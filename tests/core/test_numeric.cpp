// BF16 and FP8 E4M3 conversions against exhaustive or independent definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/numeric.hpp"

using namespace mtplab;

namespace {
// Independent reference: the nearest representable value by search, ties to even mantissa.
float nearest_e4m3(float x) {
  float best = 0;
  int best_code = 0;
  float best_err = INFINITY;
  for (int code = 0; code < 0x7f; ++code) {  // positive finite codes (0x7f is NaN)
    float v = to_float(fp8e4m3{static_cast<uint8_t>(code)});
    float err = std::fabs(std::fabs(x) - v);
    if (err < best_err || (err == best_err && (code & 1) == 0 && (best_code & 1) == 1)) {
      best_err = err;
      best = v;
      best_code = code;
    }
  }
  return std::signbit(x) ? -best : best;
}
}  // namespace

TEST(Numeric, Bf16RoundTripsEveryBf16Value) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    bf16 v{static_cast<uint16_t>(b)};
    float f = to_float(v);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(to_float(to_bf16(f))));
      continue;
    }
    EXPECT_EQ(to_bf16(f).bits, v.bits) << b;
  }
}

TEST(Numeric, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(to_float(to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6.
  EXPECT_EQ(to_float(to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(to_float(to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20))),
            1.0f + std::ldexp(1.0f, -7));
  EXPECT_TRUE(std::isinf(to_float(to_bf16(3.4e38f * 1.0001f))) || to_float(to_bf16(3.4e38f)) > 3e38f);
}

TEST(Numeric, E4m3DecodesKnownCodes) {
  EXPECT_EQ(to_float(fp8e4m3{0x7e}), 448.0f);
  EXPECT_EQ(to_float(fp8e4m3{0x38}), 1.0f);
  EXPECT_EQ(to_float(fp8e4m3{0x01}), std::ldexp(1.0f, -9));
  EXPECT_EQ(to_float(fp8e4m3{0x08}), std::ldexp(1.0f, -6));
  EXPECT_EQ(to_float(fp8e4m3{0xb8}), -1.0f);
  EXPECT_TRUE(std::isnan(to_float(fp8e4m3{0x7f})));
}

TEST(Numeric, E4m3EncodeMatchesNearestSearch) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> mag(-12.0f, 9.0f);
  for (int i = 0; i < 20000; ++i) {
    float x = std::ldexp(1.0f, 0) * std::exp2(mag(rng)) * ((i & 1) ? -1.0f : 1.0f);
    float got = to_float(to_fp8e4m3(x));
    float want = nearest_e4m3(x);
    ASSERT_EQ(got, want) << "x=" << x;
  }
  // Every code round-trips.
  for (int code = 0; code < 0x100; ++code) {
    if ((code & 0x7f) == 0x7f) continue;
    float v = to_float(fp8e4m3{static_cast<uint8_t>(code)});
    if (v == 0.0f) continue;
    EXPECT_EQ(to_fp8e4m3(v).bits, code) << code;
  }
}

TEST(Numeric, E4m3Saturates) {
  EXPECT_EQ(to_float(to_fp8e4m3(1e6f)), 448.0f);
  EXPECT_EQ(to_float(to_fp8e4m3(-500.0f)), -448.0f);
  EXPECT_EQ(to_float(to_fp8e4m3(464.0f)), 448.0f);
  EXPECT_TRUE(std::isnan(to_float(to_fp8e4m3(NAN))));
}
