// Storage types shared by the CPU reference and the CUDA kernels: BF16 and FP8 E4M3.
// Conversions round to nearest even, exactly as the device intrinsics do
// (__float2bfloat16_rn; cvt.rn.satfinite.e4m3x2.f32), so both backends round at the same points.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MTP_HD __host__ __device__
#else
#define MTP_HD
#endif

namespace mtplab {

/// A BF16 value as stored (the high half of an IEEE binary32).
struct bf16 {
  uint16_t bits = 0;
  /// Bitwise equality (so +0 != -0 and NaN == NaN of the same bits): what "identical" means in tests.
  friend constexpr bool operator==(bf16 a, bf16 b) { return a.bits == b.bits; }
};

MTP_HD inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
MTP_HD inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

MTP_HD inline float to_float(bf16 x) { return bits_to_float(static_cast<uint32_t>(x.bits) << 16); }

/// Round-to-nearest-even; NaN stays a (quiet) NaN, overflow goes to infinity as in IEEE.
MTP_HD inline bf16 to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>((u + rounding) >> 16)};
}

/// Rounds a float through BF16 and back: the value a BF16 tensor would hold.
MTP_HD inline float round_bf16(float f) { return to_float(to_bf16(f)); }

/// FP8 E4M3 (OCP "fn" variant: no infinities, 0x7f/0xff are NaN, max finite 448).
struct fp8e4m3 {
  uint8_t bits = 0;
  friend constexpr bool operator==(fp8e4m3 a, fp8e4m3 b) { return a.bits == b.bits; }
};
inline constexpr float kE4M3Max = 448.0f;

MTP_HD inline float to_float(fp8e4m3 x) {
  const uint32_t sign = (x.bits & 0x80u) << 24;
  const uint32_t exp = (x.bits >> 3) & 0xfu;
  const uint32_t man = x.bits & 0x7u;
  if (exp == 0xf && man == 0x7) return bits_to_float(sign | 0x7fc00000u);
  float v;
  if (exp == 0) {
    v = static_cast<float>(man) * 0.001953125f;  // subnormal: man * 2^-9
  } else {
    v = bits_to_float(((exp + 120u) << 23) | (man << 20));
  }
  return sign ? -v : v;
}

/// Round-to-nearest-even with saturation to +-448 (satfinite); NaN maps to NaN.
MTP_HD inline fp8e4m3 to_fp8e4m3(float f) {
  const uint32_t u = float_to_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return fp8e4m3{static_cast<uint8_t>(sign | 0x7f)};
  float a = std::fabs(f);
  if (a >= kE4M3Max) return fp8e4m3{static_cast<uint8_t>(sign | 0x7e)};
  // Smallest normal is 2^-6; below that the step is 2^-9.
  if (a < 0.015625f) {
    // Scale to units of 2^-9 and round to nearest even (rintf uses the current mode, RNE by default).
    float q = std::nearbyint(a * 512.0f);
    return fp8e4m3{static_cast<uint8_t>(sign | static_cast<uint8_t>(q))};  // q == 8 is the smallest normal
  }
  uint32_t au = float_to_bits(a);
  // Keep 3 mantissa bits: round the binary32 mantissa at bit 20, to nearest even.
  uint32_t rounding = 0x7ffffu + ((au >> 20) & 1u);
  au += rounding;
  uint32_t exp = (au >> 23) - 120u;
  uint32_t man = (au >> 20) & 0x7u;
  if (exp > 15 || (exp == 15 && man == 7)) return fp8e4m3{static_cast<uint8_t>(sign | 0x7e)};
  return fp8e4m3{static_cast<uint8_t>(sign | (exp << 3) | man)};
}

}  // namespace mtplab
