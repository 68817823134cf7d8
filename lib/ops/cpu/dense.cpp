// CPU reference: linear layers, the draft head and the argmax family (the norms: norm.cpp).
//
// Invariants:
// - Inputs are widened to fp32 once per row (the hoisted `xf_`), products accumulate in fp32 and
//   each output is rounded to BF16 exactly once, at the point ops.hpp names.
// - RowsMode::batched computes exactly what per_row does on the CPU: the mode only selects a
//   GPU code path (cuBLASLt GEMM vs GEMV), whose summation order differs.
// - Argmax ties keep the lowest index: a later element replaces the best only when strictly
//   greater. The pack key orders (value, -index) the same way, so MAX over keys == argmax_pick.
#include <algorithm>
#include <limits>
#include <vector>

#include "ops/cpu/cpu_backend.hpp"
#include "ops/cpu/cpu_math.hpp"

namespace mtplab::ops::cpu {

// ---- linear layers ------------------------------------------------------------------------------

void CpuBackend::linear_fp32_rows(const bf16* W, const bf16* X, float* Y, int rows, int n_out, int k,
                                  const char* op) {
  require_size(op, "rows", rows);
  require_size(op, "n_out", n_out);
  require_size(op, "k", k);
  xf_.resize(k);
  for (int r = 0; r < rows; ++r) {
    widen(X + static_cast<size_t>(r) * k, xf_.data(), k);
    float* y = Y + static_cast<size_t>(r) * n_out;
    for (int i = 0; i < n_out; ++i) y[i] = dot(W + static_cast<size_t>(i) * k, xf_.data(), k);
  }
}

void CpuBackend::linear(const bf16* W, const bf16* X, bf16* Y, int rows, int n_out, int k, RowsMode) {
  ran("linear");
  require_size("linear", "rows", rows);
  require_size("linear", "n_out", n_out);
  tmp_.resize(static_cast<size_t>(n_out));
  for (int r = 0; r < rows; ++r) {
    linear_fp32_rows(W, X + static_cast<size_t>(r) * k, tmp_.data(), 1, n_out, k, "linear");
    bf16* y = Y + static_cast<size_t>(r) * n_out;
    for (int i = 0; i < n_out; ++i) y[i] = mtplab::to_bf16(tmp_[i]);
  }
}

void CpuBackend::linear_f32(const bf16* W, const bf16* X, float* Y, int rows, int n_out, int k, RowsMode) {
  ran("linear_f32");
  linear_fp32_rows(W, X, Y, rows, n_out, k, "linear_f32");
}

void CpuBackend::linear_outs(const char* op, const char* x_name, std::span<const LinearOut> outs,
                             const bf16* X, int rows, int k, RowsMode mode) {
  MTP_REQUIRE(!outs.empty() && static_cast<int>(outs.size()) <= kMaxLinearGroup, "ops::", op, ": ",
              outs.size(), " outputs (1 .. ", kMaxLinearGroup, " allowed)");
  require_ptr(op, x_name, X);
  require_size(op, "rows", rows);
  for (size_t i = 0; i < outs.size(); ++i) {
    const LinearOut& o = outs[i];
    MTP_REQUIRE(o.W && o.y, "ops::", op, ": output ", i, " has a null ", o.W ? "y" : "W");
    MTP_REQUIRE(o.f32_out || o.f32_scale == 1.0f, "ops::", op, ": output ", i, " is BF16 but has f32_scale ",
                o.f32_scale, " (only fp32 outputs are scaled)");
  }
  // The separate ops themselves: the group's contract is "bit-identical to them" (on the CPU
  // `batched` computes what `per_row` does).
  for (const LinearOut& o : outs) {
    if (o.f32_out) {
      linear_f32(o.W, X, static_cast<float*>(o.y), rows, o.n_out, k, mode);
      if (o.f32_scale != 1.0f) scale_f32(static_cast<float*>(o.y), o.f32_scale, rows * o.n_out);
    } else {
      linear(o.W, X, static_cast<bf16*>(o.y), rows, o.n_out, k, mode);
    }
  }
}

void CpuBackend::linear_group(std::span<const LinearOut> outs, const bf16* x, int k) {
  linear_outs("linear_group", "x", outs, x, 1, k, RowsMode::per_row);
}

void CpuBackend::linear_rows_group(std::span<const LinearOut> outs, const bf16* X, int rows, int k) {
  ran("linear_rows_group");
  linear_outs("linear_rows_group", "X", outs, X, rows, k, RowsMode::batched);
}

void CpuBackend::linear_fp8(const fp8e4m3* W, const float* row_scale, const bf16* X, bf16* Y, int rows,
                            int n_out, int k) {
  ran("linear_fp8");
  require_size("linear_fp8", "rows", rows);
  require_size("linear_fp8", "n_out", n_out);
  require_size("linear_fp8", "k", k);
  require_ptr("linear_fp8", "row_scale", row_scale);
  xf_.resize(k);
  tmp_.resize(static_cast<size_t>(n_out));
  for (int r = 0; r < rows; ++r) {
    widen(X + static_cast<size_t>(r) * k, xf_.data(), k);
    for (int i = 0; i < n_out; ++i)
      tmp_[i] = row_scale[i] * dot(W + static_cast<size_t>(i) * k, xf_.data(), k);
    bf16* y = Y + static_cast<size_t>(r) * n_out;
    for (int i = 0; i < n_out; ++i) y[i] = mtplab::to_bf16(tmp_[i]);
  }
}

// ---- head and argmax ----------------------------------------------------------------------------

namespace {

int32_t global_index(const char* op, int64_t index_base, int64_t local) {
  const int64_t g = index_base + local;
  MTP_REQUIRE(index_base >= 0 && g <= std::numeric_limits<int32_t>::max(), "ops::", op, ": index_base ",
              index_base, " + ", local, " does not fit a non-negative int32 token id");
  return static_cast<int32_t>(g);
}

}  // namespace

void CpuBackend::head_argmax(const bf16* W, const fp8e4m3* W_fp8, const float* row_scale, const bf16* x,
                             int n, int k, int64_t index_base, bf16* logits, ArgMax* out, HeadExtras extras) {
  ran("head_argmax");
  require_size("head_argmax", "n", n);
  require_size("head_argmax", "k", k);
  require_ptr("head_argmax", "out", out);
  global_index("head_argmax", index_base, n - 1);  // checks the whole range once
  if (W_fp8) {
    require_ptr("head_argmax", "row_scale (FP8 head)", row_scale);
  } else {
    require_ptr("head_argmax", "W", W);
  }
  xf_.resize(k);
  widen(x, xf_.data(), k);
  float best = 0.0f;
  int best_i = -1;
  for (int i = 0; i < n; ++i) {
    const size_t row = static_cast<size_t>(i) * k;
    const float acc = W_fp8 ? row_scale[i] * dot(W_fp8 + row, xf_.data(), k) : dot(W + row, xf_.data(), k);
    const bf16 logit = mtplab::to_bf16(acc);
    if (logits) logits[i] = logit;
    const float v = to_float(logit);
    if (best_i < 0 || v > best) {
      best = v;
      best_i = i;
    }
  }
  *out = ArgMax{best, global_index("head_argmax", index_base, best_i)};
  if (extras.key) argmax_pack_key(out, extras.key);
  if (extras.token) *extras.token = out->index;
}

void CpuBackend::argmax(const bf16* x, int n, int64_t index_base, ArgMax* out) {
  require_size("argmax", "n", n);
  require_ptr("argmax", "out", out);
  global_index("argmax", index_base, n - 1);
  float best = to_float(x[0]);
  int best_i = 0;
  for (int i = 1; i < n; ++i) {
    const float v = to_float(x[i]);
    if (v > best) {
      best = v;
      best_i = i;
    }
  }
  *out = ArgMax{best, global_index("argmax", index_base, best_i)};
}

void CpuBackend::argmax_pack_key(const ArgMax* in, uint64_t* key) {
  require_ptr("argmax_pack_key", "in", in);
  require_ptr("argmax_pack_key", "key", key);
  *key = (static_cast<uint64_t>(order_preserving_u32(in->value)) << 32) |
         static_cast<uint64_t>(~static_cast<uint32_t>(in->index));
}

void CpuBackend::argmax_unpack_key(const uint64_t* key, int32_t* token) {
  require_ptr("argmax_unpack_key", "key", key);
  require_ptr("argmax_unpack_key", "token", token);
  *token = static_cast<int32_t>(~static_cast<uint32_t>(*key & 0xffffffffu));
}

void CpuBackend::argmax_pick(const ArgMax* pairs, int n, int32_t* token) {
  require_size("argmax_pick", "n", n);
  require_ptr("argmax_pick", "token", token);
  ArgMax best = pairs[0];
  for (int i = 1; i < n; ++i) {
    const ArgMax& p = pairs[i];
    if (p.value > best.value || (p.value == best.value && p.index < best.index)) best = p;
  }
  *token = best.index;
}

// ---- batched rows -------------------------------------------------------------------------------

// The weight rows outside, the batch's rows inside: each row's logit is the same dot product (same
// widened x, same lanes) as head_argmax computes, and each row keeps its own running best with the
// same strict comparison, so every row's result is head_argmax's.
void CpuBackend::head_argmax_batch(const bf16* W, const fp8e4m3* W_fp8, const float* row_scale, const bf16* x,
                                   const RowBatch& rb, int n, int k, int64_t index_base, bf16* logits,
                                   int ld_logits, ArgMax* out, HeadExtras extras) {
  ran("head_argmax_batch");
  require_rows("head_argmax_batch", rb.slot, rb.rows);
  require_size("head_argmax_batch", "n", n);
  require_size("head_argmax_batch", "k", k);
  require_ptr("head_argmax_batch", "out", out);
  if (logits) require_size("head_argmax_batch", "ld_logits", ld_logits, n);
  global_index("head_argmax_batch", index_base, n - 1);
  if (W_fp8) {
    require_ptr("head_argmax_batch", "row_scale (FP8 head)", row_scale);
  } else {
    require_ptr("head_argmax_batch", "W", W);
  }
  std::vector<int> live;
  for (int b = 0; b < rb.rows; ++b)
    if (live_row("head_argmax_batch", rb.slot, b)) live.push_back(b);
  if (live.empty()) return;
  const size_t L = live.size();
  xf_.resize(L * k);
  for (size_t j = 0; j < L; ++j) widen(x + static_cast<size_t>(live[j]) * k, xf_.data() + j * k, k);
  std::vector<float> best(L, 0.0f);
  std::vector<int> best_i(L, -1);
  for (int i = 0; i < n; ++i) {
    const size_t row = static_cast<size_t>(i) * k;
    for (size_t j = 0; j < L; ++j) {
      const float* xj = xf_.data() + j * k;
      const float acc = W_fp8 ? row_scale[i] * dot(W_fp8 + row, xj, k) : dot(W + row, xj, k);
      const bf16 logit = mtplab::to_bf16(acc);
      if (logits) logits[static_cast<size_t>(live[j]) * ld_logits + i] = logit;
      const float v = to_float(logit);
      if (best_i[j] < 0 || v > best[j]) {
        best[j] = v;
        best_i[j] = i;
      }
    }
  }
  for (size_t j = 0; j < L; ++j) {
    const int b = live[j];
    out[b] = ArgMax{best[j], global_index("head_argmax_batch", index_base, best_i[j])};
    if (extras.key) argmax_pack_key(out + b, extras.key + b);
    if (extras.token) extras.token[b] = out[b].index;
  }
}

void CpuBackend::argmax_batch(const bf16* x, int ld_x, int rows, int n, int64_t index_base, ArgMax* out) {
  require_size("argmax_batch", "rows", rows);
  require_size("argmax_batch", "n", n);
  require_size("argmax_batch", "ld_x", ld_x, n);
  for (int b = 0; b < rows; ++b) argmax(x + static_cast<size_t>(b) * ld_x, n, index_base, out + b);
}

void CpuBackend::argmax_unpack_key_batch(const uint64_t* key, int32_t* token, int rows) {
  require_size("argmax_unpack_key_batch", "rows", rows);
  for (int b = 0; b < rows; ++b) argmax_unpack_key(key + b, token + b);
}

void CpuBackend::argmax_pick_batch(const ArgMax* pairs, int n, int rows, int32_t* token) {
  require_size("argmax_pick_batch", "rows", rows);
  require_size("argmax_pick_batch", "n", n);
  require_ptr("argmax_pick_batch", "pairs", pairs);
  std::vector<ArgMax> row(static_cast<size_t>(n));
  for (int b = 0; b < rows; ++b) {
    for (int i = 0; i < n; ++i) row[static_cast<size_t>(i)] = pairs[static_cast<size_t>(i) * rows + b];
    argmax_pick(row.data(), n, token + b);
  }
}

}  // namespace mtplab::ops::cpu
