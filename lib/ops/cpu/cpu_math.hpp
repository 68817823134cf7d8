// Inner loops of the CPU reference: dot products with fp32 accumulation, BF16 widening, and the
// argument checks every op shares.
//
// Invariants: a product of a BF16 (or FP8) weight and a BF16-valued float is exact in fp32 (8 x 8
// significand bits), so the only fp32 error in a dot product is the summation; the 8 interleaved
// lanes keep it small and let the compiler vectorise without reassociating on its own.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "core/error.hpp"
#include "core/numeric.hpp"
#include "ops/ops.hpp"

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
/// require_size(op, what, value) for each (what, value), in order.
inline void require_sizes(const char* op, std::initializer_list<std::pair<const char*, int64_t>> sizes) {
  for (const auto& [what, value] : sizes) require_size(op, what, value);
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

/// The checks of a slot op that writes caches at (slot, pos): require_rows, a position array, and
/// the ragged layout the writes rely on: the live rows of one slot at distinct, ascending positions
/// (a sequence's rows in order, so a row that completes a pool finds the pool's earlier rows
/// stored), at most rb.max_seq_rows of them (the bound the CUDA dispatch plans with).
inline void require_cache_write_rows(const char* op, const RowBatch& rb) {
  require_rows(op, rb.slot, rb.rows);
  require_ptr(op, "pos", rb.pos);
  require_size(op, "max_seq_rows", rb.max_seq_rows);
  for (int b = 0; b < rb.rows; ++b) {
    if (rb.slot[b] < 0) continue;
    int same = 1;
    for (int c = 0; c < b; ++c) {
      if (rb.slot[c] != rb.slot[b]) continue;
      ++same;
      MTP_REQUIRE(rb.pos[c] < rb.pos[b], "ops::", op, ": rows ", c, " and ", b, " of slot ", rb.slot[b],
                  " are at positions ", rb.pos[c], " and ", rb.pos[b],
                  " (the rows of one slot must be at ascending positions)");
    }
    MTP_REQUIRE(same <= rb.max_seq_rows, "ops::", op, ": slot ", rb.slot[b], " has ", same,
                " rows in the batch, more than max_seq_rows ", rb.max_seq_rows);
  }
}

}  // namespace mtplab::ops::cpu
