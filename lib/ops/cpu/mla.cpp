// CPU reference: the paged latent KV cache and absorbed sparse MLA decode (docs/model.md, "DSA attention").
//
// Invariants:
// - Row t of a sequence lives at slot block_table[t / block_size] * block_size + t % block_size;
//   a physical block outside [0, num_blocks) is an error.
// - An FP8 cache stores to_fp8e4m3(x / scale) (a true fp32 division, not a multiply by 1/scale)
//   and reads back float(fp8) * scale in fp32.
// - Absorbed attention is the same function as the materialised one: q_abs = W_k^T q, scores
//   against the latent rows, softmax in fp32, weighted latent sum, then W_v. BF16 roundings:
//   q_abs, o_lat and o, nothing else. A selection with no rows gives o_lat = 0.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/cpu/cpu_backend.hpp"
#include "ops/cpu/cpu_math.hpp"

namespace mtplab::ops::cpu {

namespace {

/// The checks of every op on a paged latent cache: its storage, its sizes and an FP8 cache's scale.
void check_cache(const char* op, const KvCache& cache) {
  require_ptr(op, "cache.data", cache.data);
  require_sizes(op, {{"cache.num_blocks", cache.num_blocks},
                     {"cache.block_size", cache.block_size},
                     {"cache.kv_lora", cache.kv_lora}});
  if (cache.dtype == KvDtype::fp8) {
    MTP_REQUIRE(std::isfinite(cache.scale) && cache.scale > 0.0f, "ops::", op, ": FP8 cache scale ",
                cache.scale, " must be finite and positive");
  }
}

}  // namespace

int64_t CpuBackend::cache_slot(const int32_t* block_table, const KvCache& cache, int64_t row,
                               const char* op) const {
  const int64_t logical = row / cache.block_size;
  const int32_t physical = block_table[logical];
  MTP_REQUIRE(physical >= 0 && physical < cache.num_blocks, "ops::", op, ": row ", row,
              " maps to logical block ", logical, " -> physical block ", physical, ", outside the cache's ",
              cache.num_blocks, " blocks");
  return static_cast<int64_t>(physical) * cache.block_size + row % cache.block_size;
}

void CpuBackend::kv_write(const bf16* c_kv, const int32_t* block_table, const int32_t* pos, KvCache cache) {
  check_cache("kv_write", cache);
  require_ptr("kv_write", "pos", pos);
  require_ptr("kv_write", "block_table", block_table);
  MTP_REQUIRE(pos[0] >= 0, "ops::kv_write: position ", pos[0], " is negative");
  const size_t base = static_cast<size_t>(cache_slot(block_table, cache, pos[0], "kv_write")) * cache.kv_lora;
  if (cache.dtype == KvDtype::bf16) {
    std::copy(c_kv, c_kv + cache.kv_lora, static_cast<bf16*>(cache.data) + base);
  } else {
    fp8e4m3* dst = static_cast<fp8e4m3*>(cache.data) + base;
    for (int c = 0; c < cache.kv_lora; ++c) dst[c] = to_fp8e4m3(to_float(c_kv[c]) / cache.scale);
  }
}

// The norm, then the write, through a scratch row: the fused op's contract is these two ops.
void CpuBackend::kv_norm_write(const bf16* ckv_pre, const bf16* w, float eps, const int32_t* block_table,
                               const int32_t* pos, KvCache cache) {
  check_cache("kv_norm_write", cache);
  row_.resize(static_cast<size_t>(cache.kv_lora));
  rmsnorm(ckv_pre, w, row_.data(), 1, cache.kv_lora, eps);
  kv_write(row_.data(), block_table, pos, cache);
}

void CpuBackend::mla_absorb_q(const bf16* q, const bf16* W_kvb, bf16* q_abs, int n_heads, int dqk, int dv,
                              int kv_lora) {
  require_size("mla_absorb_q", "n_heads", n_heads);
  require_size("mla_absorb_q", "dqk", dqk);
  require_size("mla_absorb_q", "dv", dv, 0);
  require_size("mla_absorb_q", "kv_lora", kv_lora);
  tmp_.resize(static_cast<size_t>(kv_lora));
  float* acc = tmp_.data();
  for (int h = 0; h < n_heads; ++h) {
    // q_abs[h][c] = sum_d W_kvb[h*(dqk+dv) + d][c] * q[h][d]: accumulate whole W rows scaled by q.
    std::fill(acc, acc + kv_lora, 0.0f);
    const bf16* Wk = W_kvb + static_cast<size_t>(h) * (dqk + dv) * kv_lora;
    for (int d = 0; d < dqk; ++d) {
      const float qd = to_float(q[static_cast<size_t>(h) * dqk + d]);
      const bf16* wrow = Wk + static_cast<size_t>(d) * kv_lora;
      for (int c = 0; c < kv_lora; ++c) acc[c] += to_float(wrow[c]) * qd;
    }
    bf16* out = q_abs + static_cast<size_t>(h) * kv_lora;
    for (int c = 0; c < kv_lora; ++c) out[c] = mtplab::to_bf16(acc[c]);
  }
}

void CpuBackend::mla_decode(const bf16* q_abs, const int32_t* selection, int width,
                            const int32_t* block_table, KvCache cache, bf16* o_lat, int n_heads,
                            float softmax_scale) {
  check_cache("mla_decode", cache);
  require_size("mla_decode", "n_heads", n_heads);
  require_size("mla_decode", "width", width, 0);
  const int L = cache.kv_lora;

  // Gather the selected latent rows once, widened to fp32: every head reads all of them.
  tmp_.resize(static_cast<size_t>(width) * L);
  float* rows = tmp_.data();
  int n_rows = 0;
  for (int i = 0; i < width; ++i) {
    const int32_t t = selection[i];
    if (t == -1) continue;
    MTP_REQUIRE(t >= 0, "ops::mla_decode: selection entry ", i, " is ", t, " (only -1 marks padding)");
    const size_t base = static_cast<size_t>(cache_slot(block_table, cache, t, "mla_decode")) * L;
    float* dst = rows + static_cast<size_t>(n_rows) * L;
    if (cache.dtype == KvDtype::bf16) {
      widen(static_cast<const bf16*>(cache.data) + base, dst, L);
    } else {
      const fp8e4m3* src = static_cast<const fp8e4m3*>(cache.data) + base;
      for (int c = 0; c < L; ++c) dst[c] = to_float(src[c]) * cache.scale;
    }
    ++n_rows;
  }

  xf_.resize(static_cast<size_t>(L));
  tmp2_.resize(static_cast<size_t>(n_rows) + L);
  float* prob = tmp2_.data();
  float* acc = tmp2_.data() + n_rows;
  for (int h = 0; h < n_heads; ++h) {
    bf16* out = o_lat + static_cast<size_t>(h) * L;
    if (n_rows == 0) {
      std::fill(out, out + L, bf16{});
      continue;
    }
    widen(q_abs + static_cast<size_t>(h) * L, xf_.data(), L);
    float max_score = -std::numeric_limits<float>::infinity();
    for (int t = 0; t < n_rows; ++t) {
      prob[t] = softmax_scale * dot(xf_.data(), rows + static_cast<size_t>(t) * L, L);
      max_score = std::max(max_score, prob[t]);
    }
    float denom = 0.0f;
    for (int t = 0; t < n_rows; ++t) {
      prob[t] = std::exp(prob[t] - max_score);
      denom += prob[t];
    }
    std::fill(acc, acc + L, 0.0f);
    for (int t = 0; t < n_rows; ++t) {
      const float* c_t = rows + static_cast<size_t>(t) * L;
      for (int c = 0; c < L; ++c) acc[c] += prob[t] * c_t[c];
    }
    for (int c = 0; c < L; ++c) out[c] = mtplab::to_bf16(acc[c] / denom);
  }
}

void CpuBackend::mla_out_v(const bf16* o_lat, const bf16* W_kvb, bf16* o, int n_heads, int dqk, int dv,
                           int kv_lora) {
  require_size("mla_out_v", "n_heads", n_heads);
  require_size("mla_out_v", "dqk", dqk, 0);
  require_size("mla_out_v", "dv", dv);
  require_size("mla_out_v", "kv_lora", kv_lora);
  xf_.resize(static_cast<size_t>(kv_lora));
  for (int h = 0; h < n_heads; ++h) {
    widen(o_lat + static_cast<size_t>(h) * kv_lora, xf_.data(), kv_lora);
    const bf16* Wv = W_kvb + (static_cast<size_t>(h) * (dqk + dv) + dqk) * kv_lora;
    for (int i = 0; i < dv; ++i) {
      o[static_cast<size_t>(h) * dv + i] =
          mtplab::to_bf16(dot(Wv + static_cast<size_t>(i) * kv_lora, xf_.data(), kv_lora));
    }
  }
}

// ---- batched rows: each live row is the single-row op through its slot's block table -------------

namespace {

void check_kv_slots(const char* op, const KvSlots& kv) {
  check_cache(op, kv.cache);
  require_ptr(op, "kv.block_tables", kv.block_tables);
  require_size(op, "kv.slots", kv.slots);
  require_size(op, "kv.max_blocks", kv.max_blocks);
}

}  // namespace

void CpuBackend::kv_norm_write_batch(const bf16* ckv_pre, const bf16* w, float eps, const RowBatch& rb,
                                     KvSlots kv) {
  const char* op = "kv_norm_write_batch";
  require_cache_write_rows(op, rb);
  check_kv_slots(op, kv);
  const size_t L = static_cast<size_t>(kv.cache.kv_lora);
  const int64_t capacity = static_cast<int64_t>(kv.max_blocks) * kv.cache.block_size;
  for (int r = 0; r < rb.rows; ++r) {
    if (!live_row(op, rb.slot, r, kv.slots)) continue;
    MTP_REQUIRE(rb.pos[r] >= 0 && rb.pos[r] < capacity, "ops::", op, ": row ", r, " is at position ",
                rb.pos[r], ", outside its rb.slot's ", capacity, " rb.rows (", kv.max_blocks, " blocks)");
    kv_norm_write(ckv_pre + r * L, w, eps, kv.block_tables + static_cast<size_t>(rb.slot[r]) * kv.max_blocks,
                  rb.pos + r, kv.cache);
  }
}

template <typename F>
void CpuBackend::ran_per_row(const char* op, int rows, const bf16* in, size_t in_row, bf16* out,
                             size_t out_row, F&& one) {
  ran(op);
  require_size(op, "rows", rows);
  for (int r = 0; r < rows; ++r)
    one(in + static_cast<size_t>(r) * in_row, out + static_cast<size_t>(r) * out_row);
}

void CpuBackend::mla_absorb_q_batch(const bf16* q, const bf16* W_kvb, bf16* q_abs, int rows, int n_heads,
                                    int dqk, int dv, int kv_lora) {
  ran_per_row("mla_absorb_q_batch", rows, q, static_cast<size_t>(n_heads) * dqk, q_abs,
              static_cast<size_t>(n_heads) * kv_lora,
              [&](const bf16* in, bf16* out) { mla_absorb_q(in, W_kvb, out, n_heads, dqk, dv, kv_lora); });
}

void CpuBackend::mla_decode_batch(const bf16* q_abs, const int32_t* selection, int width, const RowBatch& rb,
                                  KvSlots kv, bf16* o_lat, int n_heads, float softmax_scale) {
  ran("mla_decode_batch");
  const char* op = "mla_decode_batch";
  require_rows(op, rb.slot, rb.rows);
  check_kv_slots(op, kv);
  require_size(op, "width", width, 0);
  const size_t row = static_cast<size_t>(n_heads) * kv.cache.kv_lora;
  const int64_t capacity = static_cast<int64_t>(kv.max_blocks) * kv.cache.block_size;
  for (int r = 0; r < rb.rows; ++r) {
    if (!live_row(op, rb.slot, r, kv.slots)) continue;
    const int32_t* sel = selection + static_cast<size_t>(r) * width;
    for (int i = 0; i < width; ++i)
      MTP_REQUIRE(sel[i] < capacity, "ops::", op, ": row ", r, " selects row ", sel[i],
                  ", outside its rb.slot's ", capacity, " rb.rows");
    mla_decode(q_abs + r * row, sel, width, kv.block_tables + static_cast<size_t>(rb.slot[r]) * kv.max_blocks,
               kv.cache, o_lat + r * row, n_heads, softmax_scale);
  }
}

void CpuBackend::mla_out_v_batch(const bf16* o_lat, const bf16* W_kvb, bf16* o, int rows, int n_heads,
                                 int dqk, int dv, int kv_lora) {
  ran_per_row("mla_out_v_batch", rows, o_lat, static_cast<size_t>(n_heads) * kv_lora, o,
              static_cast<size_t>(n_heads) * dv,
              [&](const bf16* in, bf16* out) { mla_out_v(in, W_kvb, out, n_heads, dqk, dv, kv_lora); });
}

}  // namespace mtplab::ops::cpu
