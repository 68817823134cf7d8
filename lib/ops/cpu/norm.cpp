// CPU reference: the norms (RMSNorm, LayerNorm, the embedding lookup and the residual add fused
// with an RMSNorm), for one row and for batched rows.
//
// Invariants:
// - Sums of squares (and LayerNorm's mean and variance) accumulate in fp32 over the row; each
//   output is rounded to BF16 exactly once, at the point ops.hpp names.
// - The batched ops run the single-row code on each row, so a row's result does not depend on the
//   batch it is in.
#include <cmath>

#include "ops/cpu/cpu_backend.hpp"
#include "ops/cpu/cpu_math.hpp"

namespace mtplab::ops::cpu {

// ---- norms --------------------------------------------------------------------------------------

namespace {

/// y = bf16(w * (x * r)), r = 1 / sqrt(sum(x^2) / n + eps); x and y may alias.
void rmsnorm_row(const bf16* x, const bf16* w, bf16* y, int n, float eps) {
  float acc[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float v = to_float(x[j + l]);
      acc[l] += v * v;
    }
  }
  float tail = 0.0f;
  for (; j < n; ++j) tail += to_float(x[j]) * to_float(x[j]);
  const float mean_sq = (fold_lanes(acc) + tail) / static_cast<float>(n);
  const float r = 1.0f / std::sqrt(mean_sq + eps);
  for (int i = 0; i < n; ++i) y[i] = mtplab::to_bf16(to_float(w[i]) * (to_float(x[i]) * r));
}

}  // namespace

void CpuBackend::rmsnorm(const bf16* x, const bf16* w, bf16* y, int rows, int n, float eps) {
  require_size("rmsnorm", "rows", rows);
  require_size("rmsnorm", "n", n);
  for (int r = 0; r < rows; ++r) {
    const size_t off = static_cast<size_t>(r) * n;
    rmsnorm_row(x + off, w, y + off, n, eps);
  }
}

void CpuBackend::residual_add_rmsnorm(const bf16* x, const float* delta, bf16* y, const bf16* w, bf16* normed,
                                      int n, float eps) {
  require_size("residual_add_rmsnorm", "n", n);
  require_ptr("residual_add_rmsnorm", "normed", normed);
  MTP_REQUIRE(normed + n <= y || y + n <= normed, "ops::residual_add_rmsnorm: normed overlaps y");
  residual_add(x, delta, y, n);
  rmsnorm_row(y, w, normed, n, eps);
}

void CpuBackend::embed_rmsnorm(const bf16* table, const int32_t* token, const bf16* w, bf16* y, int n,
                               float eps) {
  require_size("embed_rmsnorm", "n", n);
  require_ptr("embed_rmsnorm", "token", token);
  MTP_REQUIRE(token[0] >= 0, "ops::embed_rmsnorm: token id ", token[0], " is negative");
  rmsnorm_row(table + static_cast<size_t>(token[0]) * n, w, y, n, eps);
}

void CpuBackend::layernorm(const bf16* x, const bf16* w, const bf16* b, bf16* y, int rows, int n, float eps) {
  require_size("layernorm", "rows", rows);
  require_size("layernorm", "n", n);
  xf_.resize(n);
  float* v = xf_.data();
  for (int r = 0; r < rows; ++r) {
    const size_t off = static_cast<size_t>(r) * n;
    widen(x + off, v, n);
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) sum += v[i];
    const float mean = sum / static_cast<float>(n);
    float sq = 0.0f;
    for (int i = 0; i < n; ++i) sq += (v[i] - mean) * (v[i] - mean);
    const float r_std = 1.0f / std::sqrt(sq / static_cast<float>(n) + eps);
    for (int i = 0; i < n; ++i) {
      y[off + i] = mtplab::to_bf16((v[i] - mean) * r_std * to_float(w[i]) + to_float(b[i]));
    }
  }
}

// ---- batched rows -------------------------------------------------------------------------------

void CpuBackend::embed_rmsnorm_batch(const bf16* table, const int32_t* tokens, const RowBatch& rb,
                                     const bf16* w, bf16* y, int ld_y, int n, float eps) {
  require_rows("embed_rmsnorm_batch", rb.slot, rb.rows);
  require_size("embed_rmsnorm_batch", "n", n);
  require_size("embed_rmsnorm_batch", "ld_y", ld_y, n);
  require_ptr("embed_rmsnorm_batch", "tokens", tokens);
  for (int b = 0; b < rb.rows; ++b) {
    if (!live_row("embed_rmsnorm_batch", rb.slot, b)) continue;
    embed_rmsnorm(table, tokens + b, w, y + static_cast<size_t>(b) * ld_y, n, eps);
  }
}

void CpuBackend::rmsnorm_strided(const bf16* x, int ld_x, const bf16* w, bf16* y, int ld_y, int rows, int n,
                                 float eps) {
  require_size("rmsnorm_strided", "rows", rows);
  require_size("rmsnorm_strided", "n", n);
  require_size("rmsnorm_strided", "ld_x", ld_x, n);
  require_size("rmsnorm_strided", "ld_y", ld_y, n);
  for (int b = 0; b < rows; ++b)
    rmsnorm_row(x + static_cast<size_t>(b) * ld_x, w, y + static_cast<size_t>(b) * ld_y, n, eps);
}

void CpuBackend::residual_add_rmsnorm_rows(const bf16* x, const float* delta, bf16* y, const bf16* w,
                                           bf16* normed, int rows, int n, float eps) {
  require_size("residual_add_rmsnorm_rows", "rows", rows);
  require_size("residual_add_rmsnorm_rows", "n", n);
  const size_t all = static_cast<size_t>(rows) * n;
  MTP_REQUIRE(normed + all <= y || y + all <= normed, "ops::residual_add_rmsnorm_rows: normed overlaps y");
  for (int b = 0; b < rows; ++b) {
    const size_t off = static_cast<size_t>(b) * n;
    residual_add_rmsnorm(x + off, delta + off, y + off, w, normed + off, n, eps);
  }
}

}  // namespace mtplab::ops::cpu
