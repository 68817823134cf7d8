// Inner loops of the CPU reference: dot products with fp32 accumulation, BF16 widening, and the
// argument checks every op shares.
//
// Invariants: a product of a BF16 (or FP8) weight and a BF16-valued float is exact in fp32 (8 x 8
// significand bits), so the only fp32 error in a dot product is the summation; the 8 interleaved
// lanes keep it small and let the compiler vectorise without reassociating on its own.
#pragma once
#include <array>
#include <cstdint>

#include "core/error.hpp"
#include "core/numeric.hpp"

namespace mtplab::ops::cpu {

inline constexpr int kLanes = 8;

/// Folds the 8 lanes pairwise: a fixed tree, so the result does not depend on the compiler.
inline float fold_lanes(const float (&acc)[kLanes]) {
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

/// sum_j float(w[j]) * x[j], fp32.
inline float dot(const bf16* w, const float* x, int k) {
  float acc[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= k; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += to_float(w[j + l]) * x[j + l];
  }
  float tail = 0.0f;
  for (; j < k; ++j) tail += to_float(w[j]) * x[j];
  return fold_lanes(acc) + tail;
}

/// sum_j float(w[j]) * x[j] with FP8 E4M3 weights, fp32 (the row scale is applied by the caller).
/// The 256 E4M3 values, so a dot product decodes by table lookup (the same values to_float gives).
inline const float* e4m3_table() {
  static const auto table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = to_float(fp8e4m3{static_cast<uint8_t>(c)});
    return t;
  }();
  return table.data();
}
inline float dot(const fp8e4m3* w, const float* x, int k) {
  const float* lut = e4m3_table();
  float acc[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= k; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += lut[w[j + l].bits] * x[j + l];
  }
  float tail = 0.0f;
  for (; j < k; ++j) tail += lut[w[j].bits] * x[j];
  return fold_lanes(acc) + tail;
}

/// sum_j a[j] * b[j], both fp32.
inline float dot(const float* a, const float* b, int k) {
  float acc[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= k; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += a[j + l] * b[j + l];
  }
  float tail = 0.0f;
  for (; j < k; ++j) tail += a[j] * b[j];
  return fold_lanes(acc) + tail;
}

inline void widen(const bf16* x, float* out, int n) {
  for (int i = 0; i < n; ++i) out[i] = to_float(x[i]);
}

/// Maps a float to a u32 whose unsigned order is the float order (-0 and +0 map alike).
inline uint32_t order_preserving_u32(float v) {
  if (v == 0.0f) v = 0.0f;  // canonical +0, so equal floats give equal keys
  const uint32_t bits = float_to_bits(v);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

inline void require_size(const char* op, const char* what, int64_t value, int64_t min = 1) {
  MTP_REQUIRE(value >= min, "ops::", op, ": ", what, " = ", value, " must be >= ", min);
}
inline void require_ptr(const char* op, const char* what, const void* p) {
  MTP_REQUIRE(p != nullptr, "ops::", op, ": ", what, " is null");
}

// ---- batched rows -------------------------------------------------------------------------------

/// Whether row b of a slot op is live (slot[b] >= 0); a live slot must be < `slots` (when the op
/// knows the pool: slots > 0).
inline bool live_row(const char* op, const int32_t* slot, int b, int slots = 0) {
  const int32_t s = slot[b];
  if (s < 0) return false;
  MTP_REQUIRE(slots <= 0 || s < slots, "ops::", op, ": row ", b, " names slot ", s, " of a pool of ", slots,
              " slots");
  return true;
}

/// The checks every slot op shares: rows >= 1 and a slot array.
inline void require_rows(const char* op, const int32_t* slot, int rows) {
  require_size(op, "rows", rows);
  require_ptr(op, "slot", slot);
}

/// Live rows that write caches must name distinct slots: two rows of one slot in one op would
/// race on a GPU (and their order would be unspecified).
inline void require_distinct_slots(const char* op, const int32_t* slot, int rows) {
  for (int b = 0; b < rows; ++b) {
    if (slot[b] < 0) continue;
    for (int c = 0; c < b; ++c)
      MTP_REQUIRE(slot[c] != slot[b], "ops::", op, ": rows ", c, " and ", b, " both write slot ", slot[b],
                  " (the rows of one op must name distinct slots)");
  }
}

/// The checks of a slot op that writes caches at (slot, pos): require_rows, a position array,
/// distinct slots.
inline void require_cache_write_rows(const char* op, const int32_t* slot, const int32_t* pos, int rows) {
  require_rows(op, slot, rows);
  require_ptr(op, "pos", pos);
  require_distinct_slots(op, slot, rows);
}

}  // namespace mtplab::ops::cpu
