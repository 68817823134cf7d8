// CPU reference: the pooled lightning indexer (docs/model.md): row store + pool key, pool scores,
// and the top-k pool selection.
//
// Invariants:
// - Pool j covers rows jP .. jP+P-1 and exists once row jP+P-1 is stored; its key is computed
//   from the cached (BF16) k rows and fp32 gates when that last row is stored, and recomputed
//   whenever that row is stored again (after a rollback).
// - At position p the candidates are pools 0 .. floor((p+1)/P) - 1; the selection is the top
//   min(K/P, candidates) of them by score, ties to the lower pool index, written in ascending
//   pool order, then the tail rows P*floor((p+1)/P) .. p, then -1 up to width K + P - 1.
//   When every candidate fits (p <= K + P - 2 for K a multiple of P) this is every row 0..p.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "ops/cpu/cpu_backend.hpp"
#include "ops/cpu/cpu_math.hpp"

namespace mtplab::ops::cpu {

namespace {

int32_t read_pos(const char* op, const int32_t* pos) {
  require_ptr(op, "pos", pos);
  MTP_REQUIRE(pos[0] >= 0, "ops::", op, ": position ", pos[0], " is negative");
  return pos[0];
}

/// Pools whose last row is at or before `p`.
int64_t candidate_pools(int64_t p, int P) { return (p + 1) / P; }

/// The position pos[0] and its candidate pools for an op over a score buffer of max_pools (scores,
/// select): P and max_pools checked, and the candidates checked to fit the buffer.
struct Candidates {
  int64_t pos;
  int64_t pools;
};
Candidates read_candidates(const char* op, const int32_t* pos, int P, int max_pools) {
  require_size(op, "P", P);
  require_size(op, "max_pools", max_pools);
  const int64_t p = read_pos(op, pos);
  const int64_t n_cand = candidate_pools(p, P);
  MTP_REQUIRE(n_cand <= max_pools, "ops::", op, ": position ", p, " has ", n_cand,
              " complete pools but the score buffer holds ", max_pools);
  return Candidates{p, n_cand};
}

}  // namespace

void CpuBackend::indexer_store(const bf16* k_normed, const float* gate, const float* ape, const int32_t* pos,
                               bf16* k_cache, float* gate_cache, uint8_t* valid, float* pool_keys, int D,
                               int P) {
  require_size("indexer_store", "D", D);
  require_size("indexer_store", "P", P);
  const int64_t p = read_pos("indexer_store", pos);
  const size_t row = static_cast<size_t>(p) * D;
  std::copy(k_normed, k_normed + D, k_cache + row);
  std::copy(gate, gate + D, gate_cache + row);
  valid[p] = 1;
  if (p % P != P - 1) return;

  const int64_t j = p / P;
  const int64_t first = j * P;
  for (int m = 0; m < P - 1; ++m) {
    MTP_REQUIRE(valid[first + m] != 0, "ops::indexer_store: row ", p, " completes pool ", j, " but row ",
                first + m, " was never stored (rows are missing, not merely stale)");
  }
  // alpha_{m,c} = softmax_m(gate[jP+m, c] + ape[m, c]); K_j[c] = sum_m alpha_{m,c} k[jP+m, c].
  float* key = pool_keys + static_cast<size_t>(j) * D;
  tmp_.resize(static_cast<size_t>(P));
  float* logit = tmp_.data();
  for (int c = 0; c < D; ++c) {
    float max_logit = -std::numeric_limits<float>::infinity();
    for (int m = 0; m < P; ++m) {
      logit[m] = gate_cache[static_cast<size_t>(first + m) * D + c] + ape[static_cast<size_t>(m) * D + c];
      max_logit = std::max(max_logit, logit[m]);
    }
    float denom = 0.0f;
    for (int m = 0; m < P; ++m) {
      logit[m] = std::exp(logit[m] - max_logit);
      denom += logit[m];
    }
    float acc = 0.0f;
    for (int m = 0; m < P; ++m) {
      acc += (logit[m] / denom) * to_float(k_cache[static_cast<size_t>(first + m) * D + c]);
    }
    key[c] = acc;
  }
}

// The norm, then the store, through a scratch row: the fused op's contract is these two ops.
void CpuBackend::indexer_norm_store(const bf16* k_pre, const bf16* w, const bf16* b, float eps,
                                    const float* gate, const float* ape, const int32_t* pos, bf16* k_cache,
                                    float* gate_cache, uint8_t* valid, float* pool_keys, int D, int P) {
  require_size("indexer_norm_store", "D", D);
  row_.resize(static_cast<size_t>(D));
  layernorm(k_pre, w, b, row_.data(), 1, D, eps);
  indexer_store(row_.data(), gate, ape, pos, k_cache, gate_cache, valid, pool_keys, D, P);
}

void CpuBackend::indexer_scores(const float* q, const float* w, const float* pool_keys, const int32_t* pos,
                                float* scores, int n_heads, int D, int P, int max_pools) {
  require_size("indexer_scores", "n_heads", n_heads);
  require_size("indexer_scores", "D", D);
  const int64_t n_cand = read_candidates("indexer_scores", pos, P, max_pools).pools;
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(D));
  for (int64_t j = 0; j < n_cand; ++j) {
    const float* key = pool_keys + static_cast<size_t>(j) * D;
    float score = 0.0f;
    for (int h = 0; h < n_heads; ++h) {
      const float qk = dot(q + static_cast<size_t>(h) * D, key, D) * inv_sqrt_d;
      score += w[h] * std::max(qk, 0.0f);
    }
    scores[j] = score;
  }
  std::fill(scores + n_cand, scores + max_pools, -std::numeric_limits<float>::infinity());
}

void CpuBackend::indexer_select(const float* scores, const int32_t* pos, int32_t* selection, int K, int P,
                                int max_pools) {
  require_size("indexer_select", "K", K);
  const auto [p, n_cand] = read_candidates("indexer_select", pos, P, max_pools);
  const int64_t n_sel = std::min<int64_t>(K / P, n_cand);
  const int64_t width = static_cast<int64_t>(K) + P - 1;

  std::vector<int32_t> pools(static_cast<size_t>(n_cand));
  std::iota(pools.begin(), pools.end(), 0);
  if (n_sel < n_cand) {
    // Higher score first; equal scores: lower pool index first.
    auto better = [scores](int32_t a, int32_t b) {
      return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
    };
    std::nth_element(pools.begin(), pools.begin() + n_sel, pools.end(), better);
    pools.resize(static_cast<size_t>(n_sel));
    std::sort(pools.begin(), pools.end());
  }
  int64_t out = 0;
  for (int32_t j : pools) {
    for (int m = 0; m < P; ++m) selection[out++] = static_cast<int32_t>(static_cast<int64_t>(j) * P + m);
  }
  for (int64_t t = n_cand * P; t <= p; ++t) selection[out++] = static_cast<int32_t>(t);
  for (; out < width; ++out) selection[out] = -1;
}

// ---- batched rows: each live row is the single-row op on its slot's arrays -----------------------

namespace {

void check_indexer_slots(const char* op, const IndexerSlots& idx) {
  require_sizes(
      op, {{"idx.slots", idx.slots}, {"idx.D", idx.D}, {"idx.P", idx.P}, {"idx.max_rows", idx.max_rows}});
  MTP_REQUIRE(idx.max_rows % idx.P == 0, "ops::", op, ": idx.max_rows ", idx.max_rows,
              " is not a whole number of pools of ", idx.P);
}

/// Row b's position, checked against the slot's capacity.
// Slot s's arrays in the pool.
struct SlotArrays {
  bf16* k_cache;
  float* gate_cache;
  uint8_t* valid;
  float* pool_keys;
};
SlotArrays slot_arrays(const IndexerSlots& idx, int32_t slot) {
  const size_t s = static_cast<size_t>(slot), D = static_cast<size_t>(idx.D);
  const size_t rows = static_cast<size_t>(idx.max_rows), pools = static_cast<size_t>(idx.max_pools());
  return {idx.k_cache + s * rows * D, idx.gate_cache + s * rows * D, idx.valid + s * rows,
          idx.pool_keys + s * pools * D};
}

int32_t slot_pos(const char* op, const int32_t* pos, int b, int max_rows) {
  const int32_t p = pos[b];
  MTP_REQUIRE(p >= 0 && p < max_rows, "ops::", op, ": row ", b, " is at position ", p,
              ", outside its slot's ", max_rows, " rows");
  return p;
}

}  // namespace

void CpuBackend::indexer_norm_store_batch(const bf16* k_pre, const bf16* w, const bf16* b, float eps,
                                          const float* gate, const float* ape, const RowBatch& rb,
                                          IndexerSlots idx) {
  const char* op = "indexer_norm_store_batch";
  require_cache_write_rows(op, rb);
  check_indexer_slots(op, idx);
  const size_t D = static_cast<size_t>(idx.D);
  for (int r = 0; r < rb.rows; ++r) {
    if (!live_row(op, rb.slot, r, idx.slots)) continue;
    slot_pos(op, rb.pos, r, idx.max_rows);
    const SlotArrays a = slot_arrays(idx, rb.slot[r]);
    indexer_norm_store(k_pre + r * D, w, b, eps, gate + r * D, ape, rb.pos + r, a.k_cache, a.gate_cache,
                       a.valid, a.pool_keys, idx.D, idx.P);
  }
}

void CpuBackend::indexer_scores_batch(const float* q, const float* w, const RowBatch& rb, IndexerSlots idx,
                                      float* scores, int n_heads) {
  ran("indexer_scores_batch");
  const char* op = "indexer_scores_batch";
  require_rows(op, rb.slot, rb.rows);
  require_ptr(op, "rb.pos", rb.pos);
  check_indexer_slots(op, idx);
  require_size(op, "n_heads", n_heads);
  const size_t D = static_cast<size_t>(idx.D);
  const size_t max_pools = static_cast<size_t>(idx.max_pools());
  for (int r = 0; r < rb.rows; ++r) {
    if (!live_row(op, rb.slot, r, idx.slots)) continue;
    slot_pos(op, rb.pos, r, idx.max_rows);
    indexer_scores(q + r * n_heads * D, w + static_cast<size_t>(r) * n_heads,
                   slot_arrays(idx, rb.slot[r]).pool_keys, rb.pos + r, scores + r * max_pools, n_heads, idx.D,
                   idx.P, idx.max_pools());
  }
}

void CpuBackend::indexer_select_batch(const float* scores, const RowBatch& rb, int32_t* selection, int K,
                                      int P, int max_pools) {
  ran("indexer_select_batch");
  const char* op = "indexer_select_batch";
  require_rows(op, rb.slot, rb.rows);
  require_ptr(op, "rb.pos", rb.pos);
  require_size(op, "K", K);
  require_size(op, "P", P);
  const size_t width = static_cast<size_t>(K) + P - 1;
  for (int r = 0; r < rb.rows; ++r) {
    if (!live_row(op, rb.slot, r)) continue;
    indexer_select(scores + static_cast<size_t>(r) * max_pools, rb.pos + r, selection + r * width, K, P,
                   max_pools);
  }
}

void CpuBackend::indexer_share_select(const int32_t* anchor, const int32_t* anchor_pos, const int32_t* pos,
                                      int rows, int32_t* selection, int width, int K, int P) {
  const char* op = "indexer_share_select";
  require_size(op, "rows", rows);
  require_size(op, "K", K);
  require_size(op, "P", P);
  require_ptr(op, "anchor", anchor);
  require_ptr(op, "anchor_pos", anchor_pos);
  require_ptr(op, "pos", pos);
  require_ptr(op, "selection", selection);
  const int64_t anchor_width = static_cast<int64_t>(K) + P - 1;
  for (int r = 0; r < rows; ++r) {
    const int64_t a = anchor_pos[r], p = pos[r];
    MTP_REQUIRE(a >= 0 && a <= p, "ops::", op, ": row ", r, " is at position ", p, " but its anchor at ", a,
                " (the anchor is the propose's first draft: 0 <= anchor <= position)");
    MTP_REQUIRE(anchor_width + (p - a) <= width, "ops::", op, ": row ", r, " at position ", p, " needs ",
                anchor_width + (p - a), " entries (K + P - 1 + position - anchor) but the width is ", width);
    // The anchor's pools are its first n_sel * P entries (indexer_select writes them first).
    const int64_t first_tail = candidate_pools(a, P) * P;
    const int64_t pool_entries = std::min<int64_t>(K / P, candidate_pools(a, P)) * P;
    const int32_t* src = anchor + static_cast<size_t>(r) * static_cast<size_t>(anchor_width);
    int32_t* dst = selection + static_cast<size_t>(r) * static_cast<size_t>(width);
    int64_t out = 0;
    for (; out < pool_entries; ++out) dst[out] = src[out];
    for (int64_t t = first_tail; t <= p; ++t) dst[out++] = static_cast<int32_t>(t);
    for (; out < width; ++out) dst[out] = -1;
  }
}

}  // namespace mtplab::ops::cpu
