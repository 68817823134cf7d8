// CUDA vs CPU: the pooled lightning indexer (row store + pool keys, pool scores, top-k pool
// selection) and the absorbed sparse MLA (kv_write BF16 / FP8, absorb_q, decode over the selected
// rows of a paged cache, out_v), at the tiny, small and glm5.3-flash shapes.
//
// Tolerances: copies and FP8 quantisation are exact (same single rounding on both sides); pool
// keys and scores are fp32 that differ by the device expf (<= 2 ulp) and summation order, so
// 1e-5 relative plus 1e-5 of the largest; the selection is exact given identical scores (both
// backends are fed the same score vector, ties included); BF16 outputs as gpu_test_util.hpp.
// The MLA decode runs under both of its paths (ops::MlaDecode, set through the GPU backend's kernel
// policy), each against the same CPU result under gpu_test_util.hpp's BF16 tolerance: both compute
// the CPU's formula with one BF16 rounding of o_lat, differing only by fp32 summation order, the
// BF16 hi + lo split of the probabilities (~2^-17 relative) and, in the split merge, a product of
// two fp32 exponentials where the CPU has one (a few 2^-24), all far below the BF16 ulp (2^-8
// relative). Each path is also run twice on the same inputs and must give the same bytes (a fixed
// merge order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "ops/one_row.hpp"

namespace mtplab::ops::gputest {
namespace {

class GpuAttention : public ::testing::TestWithParam<Shape> {};

/// Pools the score / selection tests sweep: the bench's 16384 at glm5.3-flash.
int max_pools_for(const Shape& s) {
  if (s.hidden >= 4096) return 16384;
  if (s.hidden >= 1024) return 2048;
  return 64;
}

TEST_P(GpuAttention, IndexerStore) {
  const Shape s = GetParam();
  Rng rng(11);
  const int D = s.index_dim, P = s.index_kpool;
  const int rows = s.hidden >= 4096 ? 1024 : 256;
  Twin<float> ape(rng.floats(static_cast<size_t>(P) * D, -1.0f, 1.0f));
  std::vector<int32_t> positions(rows);
  std::iota(positions.begin(), positions.end(), 0);
  Twin<int32_t> pos(positions);
  Twin<bf16> k_rows(rng.bf16s(static_cast<size_t>(rows) * D, -2.0f, 2.0f));
  Twin<float> gate_rows(rng.floats(static_cast<size_t>(rows) * D, -3.0f, 3.0f));
  auto k_cache = out_twin<bf16>(static_cast<size_t>(rows) * D);
  auto gate_cache = out_twin<float>(static_cast<size_t>(rows) * D);
  Twin<uint8_t> valid(std::vector<uint8_t>(static_cast<size_t>(rows), 0));
  auto pool_keys = out_twin<float>(static_cast<size_t>(rows / P) * D);
  for (int r = 0; r < rows; ++r) {
    const size_t off = static_cast<size_t>(r) * D;
    cpu().indexer_store(k_rows.c.data() + off, gate_rows.c.data() + off, ape.c.data(), pos.c.data() + r,
                        k_cache.c.data(), gate_cache.c.data(), valid.c.data(), pool_keys.c.data(), D, P);
    gpu().indexer_store(k_rows.g.data() + off, gate_rows.g.data() + off, ape.g.data(), pos.g.data() + r,
                        k_cache.g.data(), gate_cache.g.data(), valid.g.data(), pool_keys.g.data(), D, P);
  }
  expect_bytes_equal(k_cache.from_gpu(), k_cache.from_cpu(), "indexer k cache");
  expect_bytes_equal(gate_cache.from_gpu(), gate_cache.from_cpu(), "indexer gate cache");
  expect_bytes_equal(valid.from_gpu(), valid.from_cpu(), "indexer valid");
  expect_f32_close(pool_keys.from_gpu(), pool_keys.from_cpu(), "pool keys", 1e-5, 1e-6);
}

TEST_P(GpuAttention, IndexerScoresAndSelect) {
  const Shape s = GetParam();
  Rng rng(12);
  const int D = s.index_dim, P = s.index_kpool, nI = s.index_heads, K = s.index_topk;
  const int max_pools = max_pools_for(s);
  Twin<float> keys(rng.floats(static_cast<size_t>(max_pools) * D, -1.0f, 1.0f));
  Twin<float> q(rng.floats(static_cast<size_t>(nI) * D, -1.0f, 1.0f));
  std::vector<float> w = rng.floats(nI, -1.0f, 1.0f);
  for (auto& v : w) v /= std::sqrt(static_cast<float>(nI));
  Twin<float> wt(w);
  // Last pool incomplete: the scores past the candidates must be -inf.
  Twin<int32_t> pos(std::vector<int32_t>{P * max_pools - 3});
  auto scores = out_twin<float>(max_pools);
  cpu().indexer_scores(q.c.data(), wt.c.data(), keys.c.data(), pos.c.data(), scores.c.data(), nI, D, P,
                       max_pools);
  gpu().indexer_scores(q.g.data(), wt.g.data(), keys.g.data(), pos.g.data(), scores.g.data(), nI, D, P,
                       max_pools);
  const auto cpu_scores = scores.from_cpu();
  expect_f32_close(scores.from_gpu(), cpu_scores, "indexer scores", 1e-5, 1e-5);
  ASSERT_TRUE(std::isinf(cpu_scores.back()) && cpu_scores.back() < 0);

  // Selection, fed the same scores on both backends: exact. Cases: sparse (many candidates),
  // heavy ties (scores quantised to a few levels), dense (every candidate fits), K/P + 1.
  const int width = K + P - 1;
  std::vector<float> tied = cpu_scores;
  for (auto& v : tied)
    if (std::isfinite(v)) v = std::floor(v * 2.0f) / 2.0f;
  struct Case {
    const char* name;
    const std::vector<float>* scores;
    int32_t pos;
  };
  const Case cases[] = {
      {"sparse", &cpu_scores, P * max_pools - 2},
      {"sparse, full pools", &cpu_scores, P * (max_pools - 1) - 1},
      {"ties", &tied, P * max_pools - 2},
      {"dense", &cpu_scores, std::min(K + P - 2, P * max_pools - 1)},
      {"one pool past K/P", &cpu_scores, std::min(P * (K / P + 1) + 1, P * max_pools - 1)},
      {"position 0", &cpu_scores, 0},
  };
  for (const Case& c : cases) {
    Twin<float> sc(*c.scores);
    Twin<int32_t> p(std::vector<int32_t>{c.pos});
    auto sel = out_twin<int32_t>(width);
    cpu().indexer_select(sc.c.data(), p.c.data(), sel.c.data(), K, P, max_pools);
    gpu().indexer_select(sc.g.data(), p.g.data(), sel.g.data(), K, P, max_pools);
    expect_bytes_equal(sel.from_gpu(), sel.from_cpu(),
                       std::string("indexer_select ") + c.name + " pos " + std::to_string(c.pos));
  }
}

// indexer_select keeps the candidates' keys in shared memory up to 40960 pools and reads global
// memory beyond: both key paths, same scores (random, with ties), exact against the CPU.
TEST(GpuIndexerSelect, SharedAndGlobalKeyPathsMatchTheCpu) {
  Rng rng(14);
  const int P = 4, K = 2048;
  for (int max_pools : {40960, 40961, 50000}) {
    std::vector<float> scores = rng.floats(static_cast<size_t>(max_pools), -4.0f, 4.0f);
    for (size_t i = 0; i < scores.size(); i += 7) scores[i] = std::floor(scores[i]);  // ties
    Twin<float> sc(scores);
    for (int32_t pos : {P * max_pools - 1, P * 30000 + 1, 1000}) {
      Twin<int32_t> p(std::vector<int32_t>{pos});
      auto sel = out_twin<int32_t>(K + P - 1);
      cpu().indexer_select(sc.c.data(), p.c.data(), sel.c.data(), K, P, max_pools);
      gpu().indexer_select(sc.g.data(), p.g.data(), sel.g.data(), K, P, max_pools);
      expect_bytes_equal(sel.from_gpu(), sel.from_cpu(),
                         std::string("indexer_select max_pools ") + std::to_string(max_pools) + " pos " +
                             std::to_string(pos));
    }
  }
}

// The radix kernel against the CPU over the pool counts where its code paths change: tiny, not a
// multiple of the block, the step's 1024, past the candidate buffer (4096), the bench's 16384, the
// last count whose keys fit in shared memory and beyond. Score kinds reach every exit of the
// search: distinct values (a digit's bin is mostly taken whole after one or two digits), a few
// levels and all equal (heavy ties: one bin holds more keys than the candidate buffer), values
// one ulp apart (all three digits needed), +-0 (equal keys), -inf among finite values. K: the
// model's 2048, one pool, fewer rows than a pool (nothing selected) and more than every pool
// (everything selected).
TEST(GpuIndexerSelect, MatchesTheCpuAcrossPoolCountsAndTies) {
  Rng rng(15);
  const int P = 4;
  const char* kinds[] = {"distinct", "levels", "all equal", "ulps apart", "signed zeros", "-inf"};
  for (int max_pools : {1, 5, 100, 1000, 1023, 1024, 1025, 4097, 16384, 16389, 40960, 45001}) {
    for (int kind = 0; kind < 6; ++kind) {
      std::vector<float> scores = rng.floats(static_cast<size_t>(max_pools), -4.0f, 4.0f);
      for (auto& v : scores) {
        if (kind == 1) v = std::floor(v);
        if (kind == 2) v = 0.5f;
        if (kind == 3) v = 1.0f + static_cast<float>(rng.integer(0, 7)) * 0x1p-23f;  // exact: 1 + i ulps
        if (kind == 4) v = rng.integer(0, 1) ? 0.0f : -0.0f;
        if (kind == 5 && rng.integer(0, 3) == 0) v = -INFINITY;
      }
      Twin<float> sc(scores);
      for (int K : {2048, P, P - 1, P * max_pools + P}) {
        for (int32_t pos : {P * max_pools - 1, rng.integer(0, P * max_pools - 1), P - 1}) {
          Twin<int32_t> p(std::vector<int32_t>{pos});
          auto sel = out_twin<int32_t>(static_cast<size_t>(K) + P - 1);
          cpu().indexer_select(sc.c.data(), p.c.data(), sel.c.data(), K, P, max_pools);
          gpu().indexer_select(sc.g.data(), p.g.data(), sel.g.data(), K, P, max_pools);
          expect_bytes_equal(sel.from_gpu(), sel.from_cpu(),
                             std::string("indexer_select max_pools ") + std::to_string(max_pools) + " " +
                                 kinds[kind] + " K " + std::to_string(K) + " pos " + std::to_string(pos));
        }
      }
    }
  }
}

struct PagedCache {
  int block_size = 64;
  int num_blocks = 0;
  std::vector<int32_t> table;  // logical -> physical, a random permutation
};

PagedCache make_paged(Rng& rng, int rows) {
  PagedCache pc;
  pc.num_blocks = (rows + pc.block_size - 1) / pc.block_size + 3;
  pc.table.resize(static_cast<size_t>(pc.num_blocks));
  std::iota(pc.table.begin(), pc.table.end(), 0);
  for (size_t i = pc.table.size() - 1; i > 0; --i) std::swap(pc.table[i], pc.table[rng.next() % (i + 1)]);
  return pc;
}

/// Random cache contents for `slots` latent values: BF16 in [-1, 1), or any finite E4M3 code.
std::vector<uint8_t> random_cache_bytes(Rng& rng, size_t slots, KvDtype dtype) {
  std::vector<uint8_t> bytes(slots * (dtype == KvDtype::bf16 ? 2 : 1));
  if (dtype == KvDtype::bf16) {
    const auto v = rng.bf16s(slots, -1.0f, 1.0f);
    std::memcpy(bytes.data(), v.data(), bytes.size());
  } else {
    const auto v = rng.fp8s(slots);
    std::memcpy(bytes.data(), v.data(), bytes.size());
  }
  return bytes;
}

constexpr MlaDecode kDecodePaths[] = {MlaDecode::v1, MlaDecode::v2};

/// mla_decode on the CPU once, then on the GPU under each path (twice: same bytes), into
/// poisoned outputs.
void expect_decode_matches(const Twin<bf16>& q, const Twin<int32_t>& sel, int width,
                           const Twin<int32_t>& table, const KvCache& cc, const KvCache& gc, int nh,
                           float softmax_scale, const std::string& what) {
  const size_t n = static_cast<size_t>(nh) * cc.kv_lora;
  auto ref = out_twin<bf16>(n);
  mtplab::ops::OneRow(cpu()).mla_decode(q.c.data(), sel.c.data(), width, table.c.data(), cc, ref.c.data(), nh,
                                        softmax_scale);
  const auto want = ref.from_cpu();
  for (MlaDecode path : kDecodePaths) {
    const PolicyScope scope([path](KernelPolicy& p) { p.mla_decode = path; });
    const std::string name = what + " (" + to_string(path) + ")";
    auto first = out_twin<bf16>(n);
    auto again = out_twin<bf16>(n);
    mtplab::ops::OneRow(gpu()).mla_decode(q.g.data(), sel.g.data(), width, table.g.data(), gc, first.g.data(),
                                          nh, softmax_scale);
    mtplab::ops::OneRow(gpu()).mla_decode(q.g.data(), sel.g.data(), width, table.g.data(), gc, again.g.data(),
                                          nh, softmax_scale);
    const auto got = first.from_gpu();
    expect_bf16_close(got, want, name);
    expect_bytes_equal(again.from_gpu(), got, name + ", second run");
  }
}

TEST_P(GpuAttention, KvWrite) {
  const Shape s = GetParam();
  Rng rng(13);
  const int L = s.kv_lora;
  const int rows = 200;
  PagedCache pc = make_paged(rng, rows);
  Twin<int32_t> table(pc.table);
  std::vector<int32_t> positions(rows);
  std::iota(positions.begin(), positions.end(), 0);
  Twin<int32_t> pos(positions);
  Twin<bf16> c_kv(rng.bf16s(static_cast<size_t>(rows) * L, -3.0f, 3.0f));
  for (KvDtype dtype : {KvDtype::bf16, KvDtype::fp8}) {
    const size_t elem = dtype == KvDtype::bf16 ? 2 : 1;
    auto data = out_twin<uint8_t>(static_cast<size_t>(pc.num_blocks) * pc.block_size * L * elem);
    KvCache cc{data.c.data(), dtype, 0.0123f, pc.num_blocks, pc.block_size, L};
    KvCache gc{data.g.data(), dtype, 0.0123f, pc.num_blocks, pc.block_size, L};
    for (int r = 0; r < rows; ++r) {
      cpu().kv_write(c_kv.c.data() + static_cast<size_t>(r) * L, table.c.data(), pos.c.data() + r, cc);
      gpu().kv_write(c_kv.g.data() + static_cast<size_t>(r) * L, table.g.data(), pos.g.data() + r, gc);
    }
    expect_bytes_equal(data.from_gpu(), data.from_cpu(),
                       dtype == KvDtype::bf16 ? "kv_write bf16" : "kv_write fp8");
  }
}

TEST_P(GpuAttention, Mla) {
  const Shape s = GetParam();
  Rng rng(14);
  const int nh = s.n_heads, dqk = s.head_dim, dv = s.head_dim, L = s.kv_lora;
  const int K = s.index_topk, P = s.index_kpool;
  const float w_range = 1.0f / std::sqrt(static_cast<float>(L));
  Twin<bf16> W_kvb(rng.bf16s(static_cast<size_t>(nh) * (dqk + dv) * L, -w_range, w_range));

  Twin<bf16> q(rng.bf16s(static_cast<size_t>(nh) * dqk, -2.0f, 2.0f));
  auto q_abs = out_twin<bf16>(static_cast<size_t>(nh) * L);
  mtplab::ops::OneRow(cpu()).mla_absorb_q(q.c.data(), W_kvb.c.data(), q_abs.c.data(), nh, dqk, dv, L);
  mtplab::ops::OneRow(gpu()).mla_absorb_q(q.g.data(), W_kvb.g.data(), q_abs.g.data(), nh, dqk, dv, L);
  expect_bf16_close(q_abs.from_gpu(), q_abs.from_cpu(), "mla_absorb_q");

  // Decode over a selection from the indexer: sparse (K + P - 1 rows, the tail included), dense
  // (early position, -1 padding) and empty.
  const int width = K + P - 1;
  const int p_sparse = 4 * K + 2;  // 4K/P candidate pools, 3 tail rows: every slot used
  const int rows = p_sparse + 1;
  PagedCache pc = make_paged(rng, rows);
  Twin<int32_t> table(pc.table);
  const int max_pools = rows / P + 1;
  Twin<float> scores(rng.floats(max_pools, -1.0f, 1.0f));
  Twin<bf16> q_dec(rng.bf16s(static_cast<size_t>(nh) * L, -4.0f, 4.0f));
  const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(dqk));
  for (KvDtype dtype : {KvDtype::bf16, KvDtype::fp8}) {
    const size_t slots = static_cast<size_t>(pc.num_blocks) * pc.block_size * L;
    Twin<uint8_t> data(random_cache_bytes(rng, slots, dtype));
    const float scale = dtype == KvDtype::bf16 ? 1.0f : 1.0f / 448.0f;
    KvCache cc{data.c.data(), dtype, scale, pc.num_blocks, pc.block_size, L};
    KvCache gc{data.g.data(), dtype, scale, pc.num_blocks, pc.block_size, L};
    for (int32_t p : {p_sparse, std::min(K / 2, p_sparse), -1}) {
      std::vector<int32_t> selection(static_cast<size_t>(width), -1);
      if (p >= 0) {
        Twin<int32_t> pt(std::vector<int32_t>{p});
        auto sel = out_twin<int32_t>(width);
        cpu().indexer_select(scores.c.data(), pt.c.data(), sel.c.data(), K, P, max_pools);
        selection = sel.from_cpu();
      }
      Twin<int32_t> sel(selection);
      expect_decode_matches(q_dec, sel, width, table, cc, gc, nh, softmax_scale,
                            std::string("mla_decode ") + (dtype == KvDtype::bf16 ? "bf16" : "fp8") +
                                " cache, position " + std::to_string(p));
    }
  }

  Twin<bf16> o_lat(rng.bf16s(static_cast<size_t>(nh) * L, -1.0f, 1.0f));
  auto o = out_twin<bf16>(static_cast<size_t>(nh) * dv);
  mtplab::ops::OneRow(cpu()).mla_out_v(o_lat.c.data(), W_kvb.c.data(), o.c.data(), nh, dqk, dv, L);
  mtplab::ops::OneRow(gpu()).mla_out_v(o_lat.g.data(), W_kvb.g.data(), o.g.data(), nh, dqk, dv, L);
  expect_bf16_close(o.from_gpu(), o.from_cpu(), "mla_out_v");
}

// The decode on selections the indexer does not produce, both paths: shorter than a chunk, one
// row, width 0, all padding, scattered padding, and long ones (v2: more chunks per split than its
// ring holds, several clusters per head tile; at the tiny shape, enough rows that the split count
// is raised to keep each split at its 32-chunk maximum).
TEST_P(GpuAttention, MlaDecodeSelections) {
  const Shape s = GetParam();
  Rng rng(15);
  const int nh = s.n_heads, L = s.kv_lora;
  const int rows = s.kv_lora <= 64 ? 80000 : 12288;
  PagedCache pc = make_paged(rng, rows);
  Twin<int32_t> table(pc.table);
  Twin<bf16> q(rng.bf16s(static_cast<size_t>(nh) * L, -4.0f, 4.0f));
  const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));

  // Distinct random rows of the cache.
  std::vector<int32_t> perm(static_cast<size_t>(rows));
  std::iota(perm.begin(), perm.end(), 0);
  for (size_t i = perm.size() - 1; i > 0; --i) std::swap(perm[i], perm[rng.next() % (i + 1)]);
  auto distinct = [&](int n) { return std::vector<int32_t>(perm.begin(), perm.begin() + n); };
  std::vector<int32_t> holes = distinct(3001);
  for (auto& v : holes)
    if (rng.next() % 3 == 0) v = -1;
  std::vector<int32_t> short_sel = distinct(3);
  short_sel.insert(short_sel.begin() + 1, -1);
  short_sel.push_back(-1);
  struct Case {
    const char* name;
    std::vector<int32_t> sel;
    int width;
  };
  const Case cases[] = {
      {"3 rows of 5", short_sel, 5},
      {"one row", distinct(1), 1},
      {"width 0", std::vector<int32_t>{-1}, 0},
      {"all padding", std::vector<int32_t>(37, -1), 37},
      {"a third padding", holes, 3001},
      {"long", distinct(rows), rows},
  };
  for (KvDtype dtype : {KvDtype::bf16, KvDtype::fp8}) {
    const size_t slots = static_cast<size_t>(pc.num_blocks) * pc.block_size * L;
    Twin<uint8_t> data(random_cache_bytes(rng, slots, dtype));
    const float scale = dtype == KvDtype::bf16 ? 1.0f : 1.0f / 448.0f;
    KvCache cc{data.c.data(), dtype, scale, pc.num_blocks, pc.block_size, L};
    KvCache gc{data.g.data(), dtype, scale, pc.num_blocks, pc.block_size, L};
    for (const Case& c : cases) {
      Twin<int32_t> sel(c.sel);
      expect_decode_matches(q, sel, c.width, table, cc, gc, nh, softmax_scale,
                            std::string("mla_decode ") + (dtype == KvDtype::bf16 ? "bf16" : "fp8") + ", " +
                                c.name + " (width " + std::to_string(c.width) + ")");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GpuAttention, ::testing::ValuesIn(kShapes), shape_name);

}  // namespace
}  // namespace mtplab::ops::gputest
