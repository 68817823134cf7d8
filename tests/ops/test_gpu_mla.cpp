// CUDA vs CPU, the MLA family: the latent KV writes (kv_write and the fused norm + write, BF16 and
// FP8 caches), absorb_q, the sparse decode over the selected rows of a paged cache and out_v, one
// row and batched (kBatches rows on their own slots of a pool, padded rows among them), at the
// tiny, small and glm5.3-flash shapes.
//
// Tolerances: copies and FP8 quantisation are exact (the same single rounding on both sides); FP8
// codes written from a norm within one step of the CPU's, >= 90% identical (the BF16 value may
// differ by an ulp); BF16 outputs as gpu_test_util.hpp. The decode runs under every kernel the
// dispatch can pick (KernelPolicy::mla_decode v1 / v2, mla_batch tiles / shared2 / shared32, at
// automatic and forced split counts), each against the same CPU result under the BF16 tolerance:
// each computes the CPU's formula with one BF16 rounding of o_lat, differing only by fp32
// summation order, the BF16 hi + lo split of the probabilities (~2^-17 relative) and, in the split
// merge, a product of two fp32 exponentials where the CPU has one (a few 2^-24), all far below the
// BF16 ulp (2^-8 relative). Each path run twice on the same inputs gives the same bytes (a fixed
// merge order); the batched v2 gives each row a batch of one's bytes at the same split count, and
// under the shared kernels a row decoded alone gives its bytes in the batch (shared, 4 tiles on
// 16-row chunks, gives shared2's bytes at a forced split count: checked in dev/cuda/mla.cu). A
// batch of one runs the single-row absorb_q and out_v: their bytes.
// The MLA ops over the ragged batches (ragged_layouts: a sequence's rows at ascending positions of
// one slot, causal among themselves) run where their cache writes and reads meet:
// test_gpu_batch.cpp, RaggedRowsCacheWritesAndReads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "gpu_batch_util.hpp"
#include "gpu_test_util.hpp"
#include "ops/cuda/dispatch.hpp"
#include "ops/cuda/indexer.hpp"
#include "ops/one_row.hpp"

namespace mtplab::ops::gputest {
namespace {

class GpuMla : public ::testing::TestWithParam<Shape> {};

// ---- one row -------------------------------------------------------------------------------------------

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

TEST_P(GpuMla, KvWrite) {
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

TEST_P(GpuMla, Mla) {
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
TEST_P(GpuMla, MlaDecodeSelections) {
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

// ---- batched rows --------------------------------------------------------------------------------------

TEST_P(GpuMla, KvNormWrite) {
  const Shape s = GetParam();
  Rng rng(805);
  const int L = s.kv_lora, bs = block_size_for(s), capacity = max_rows_for(s), max_blocks = capacity / bs;
  Twin<bf16> w(rng.bf16s(L, 0.5f, 1.5f));
  for (KvDtype dtype : {KvDtype::bf16, KvDtype::fp8}) {
    const size_t elem = dtype == KvDtype::bf16 ? 2 : 1;
    for (int B : kBatches) {
      const std::string what =
          where(dtype == KvDtype::bf16 ? "kv_norm_write_batch BF16" : "kv_norm_write_batch FP8", B);
      const int slots = B + 3;
      const auto tables_h = make_tables(rng, slots, max_blocks);
      Twin<int32_t> tables(tables_h);
      auto data = out_twin<uint8_t>(static_cast<size_t>(slots) * max_blocks * bs * L * elem);
      data.poison(0xFF);
      const auto slots_h = make_slots(rng, B, slots);
      const auto pos_h = make_positions(rng, slots_h, capacity, 1 << 20);
      Twin<int32_t> sl(slots_h), pos(pos_h);
      Twin<bf16> ckv(rng.bf16s(static_cast<size_t>(B) * L, -3.0f, 3.0f));
      const int blocks = slots * max_blocks;
      KvSlots kc{KvCache{data.c.data(), dtype, 0.0123f, blocks, bs, L}, tables.c.data(), slots, max_blocks};
      KvSlots kg{KvCache{data.g.data(), dtype, 0.0123f, blocks, bs, L}, tables.g.data(), slots, max_blocks};
      EXPECT_EQ(kernels_of([&] {
                  gpu().kv_norm_write_batch(ckv.g.data(), w.g.data(), 1e-5f,
                                            RowBatch{sl.g.data(), pos.g.data(), B}, kg);
                }),
                1u);
      on_cpu_rows(B, [&](Backend& be, int b0, int b1) {
        be.kv_norm_write_batch(ckv.c.data() + static_cast<size_t>(b0) * L, w.c.data(), 1e-5f,
                               RowBatch{sl.c.data() + b0, pos.c.data() + b0, b1 - b0}, kc);
      });
      // The written cache rows: (slot, pos) of each live row through its table.
      std::vector<uint8_t> mask(data.c.size() / elem, 0);
      for (int b = 0; b < B; ++b) {
        const int32_t sb = slots_h[static_cast<size_t>(b)];
        if (sb < 0) continue;
        const int32_t p = pos_h[static_cast<size_t>(b)];
        const int64_t phys =
            static_cast<int64_t>(tables_h[static_cast<size_t>(sb) * max_blocks + p / bs]) * bs + p % bs;
        std::fill_n(mask.begin() + phys * L, L, 1);
      }
      const auto got = data.from_gpu(), want = data.from_cpu();
      if (dtype == KvDtype::bf16) {
        std::vector<bf16> g16(got.size() / 2), c16(want.size() / 2);
        std::memcpy(g16.data(), got.data(), got.size());
        std::memcpy(c16.data(), want.data(), want.size());
        expect_bf16_written(g16, c16, mask, what);
      } else {
        expect_fp8_codes_close(masked(got, mask), masked(want, mask), what);
        expect_outside_unchanged(got, want, mask, what);
      }
    }
  }
}

TEST_P(GpuMla, MlaAbsorbAndOutV) {
  const Shape s = GetParam();
  Rng rng(808);
  const int nh = s.n_heads, dqk = s.head_dim, dv = s.head_dim, L = s.kv_lora;
  const float wr = 1.0f / std::sqrt(static_cast<float>(L));
  const Big<bf16> W = big_bf16(static_cast<size_t>(nh) * (dqk + dv) * L, -wr, wr, 8080);
  for (int B : kBatches) {
    Twin<bf16> q(rng.bf16s(static_cast<size_t>(B) * nh * dqk, -2.0f, 2.0f));
    auto q_abs = out_twin<bf16>(static_cast<size_t>(B) * nh * L);
    EXPECT_EQ(kernels_of([&] {
                gpu().mla_absorb_q_batch(q.g.data(), W.g.data(), q_abs.g.data(), B, nh, dqk, dv, L);
              }),
              1u);
    on_cpu_rows(B, [&](Backend& be, int b0, int b1) {
      be.mla_absorb_q_batch(q.c.data() + static_cast<size_t>(b0) * nh * dqk, W.c.data(),
                            q_abs.c.data() + static_cast<size_t>(b0) * nh * L, b1 - b0, nh, dqk, dv, L);
    });
    expect_bf16_close(q_abs.from_gpu(), q_abs.from_cpu(), where("mla_absorb_q_batch", B));

    Twin<bf16> o_lat(rng.bf16s(static_cast<size_t>(B) * nh * L, -1.0f, 1.0f));
    auto o = out_twin<bf16>(static_cast<size_t>(B) * nh * dv);
    EXPECT_EQ(
        kernels_of([&] { gpu().mla_out_v_batch(o_lat.g.data(), W.g.data(), o.g.data(), B, nh, dqk, dv, L); }),
        1u);
    on_cpu_rows(B, [&](Backend& be, int b0, int b1) {
      be.mla_out_v_batch(o_lat.c.data() + static_cast<size_t>(b0) * nh * L, W.c.data(),
                         o.c.data() + static_cast<size_t>(b0) * nh * dv, b1 - b0, nh, dqk, dv, L);
    });
    expect_bf16_close(o.from_gpu(), o.from_cpu(), where("mla_out_v_batch", B));
    if (B == 1) {
      // A batch of one runs the single-row ops themselves: their bytes.
      auto q_abs1 = out_twin<bf16>(static_cast<size_t>(nh) * L);
      auto o1 = out_twin<bf16>(static_cast<size_t>(nh) * dv);
      mtplab::ops::OneRow(gpu()).mla_absorb_q(q.g.data(), W.g.data(), q_abs1.g.data(), nh, dqk, dv, L);
      mtplab::ops::OneRow(gpu()).mla_out_v(o_lat.g.data(), W.g.data(), o1.g.data(), nh, dqk, dv, L);
      expect_bytes_equal(q_abs.from_gpu(), q_abs1.from_gpu(), where("mla_absorb_q_batch vs mla_absorb_q", B));
      expect_bytes_equal(o.from_gpu(), o1.from_gpu(), where("mla_out_v_batch vs mla_out_v", B));
    }
  }
}

TEST_P(GpuMla, MlaDecode) {
  const Shape s = GetParam();
  Rng rng(809);
  const int nh = s.n_heads, L = s.kv_lora, K = s.index_topk, P = s.index_kpool;
  const int bs = block_size_for(s), capacity = max_rows_for(s), max_blocks = capacity / bs, mp = capacity / P;
  const int width = K + P - 1;
  const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  for (KvDtype dtype : {KvDtype::bf16, KvDtype::fp8}) {
    for (int B : kBatches) {
      const std::string what =
          where(dtype == KvDtype::bf16 ? "mla_decode_batch BF16" : "mla_decode_batch FP8", B);
      const int slots = B + 3;
      const size_t values = static_cast<size_t>(slots) * max_blocks * bs * L;
      Big<uint8_t> data(values * (dtype == KvDtype::bf16 ? 2 : 1));
      if (dtype == KvDtype::bf16) {
        auto* p = reinterpret_cast<bf16*>(data.c.data());
        parallel_fill(p, values, 8090 + B, [](Rng& r) { return to_bf16(r.uniform(-1.0f, 1.0f)); });
      } else {
        parallel_fill(data.c.data(), values, 8091 + B, [](Rng& r) {
          uint8_t code = static_cast<uint8_t>(r.next() >> 56);
          return static_cast<uint8_t>((code & 0x7f) == 0x7f ? code ^ 0x01 : code);
        });
      }
      data.upload();
      const auto tables_h = make_tables(rng, slots, max_blocks);
      Twin<int32_t> tables(tables_h);
      const auto slots_h = make_slots(rng, B, slots);
      const auto pos_h = make_positions(rng, slots_h, capacity, 0);
      // Each live row's selection is the CPU indexer's at its position (sparse past K + P - 2, dense
      // before, with -1 padding: rows of different lengths in one batch, the second live row one
      // selected row); the third live row selects nothing (zeros); a padded row selects rows past
      // every table (a read would fault).
      std::vector<int32_t> sel_h(static_cast<size_t>(B) * width, 1 << 28);
      auto be = make_cpu_backend();
      for (int b = 0, live = 0; b < B; ++b) {
        if (slots_h[static_cast<size_t>(b)] < 0) continue;
        int32_t* row = sel_h.data() + static_cast<size_t>(b) * width;
        if (live++ == 2) {
          std::fill_n(row, width, -1);
          continue;
        }
        const auto sc = rng.floats(mp, -1.0f, 1.0f);
        be->indexer_select(sc.data(), &pos_h[static_cast<size_t>(b)], row, K, P, mp);
      }
      Twin<int32_t> sel(sel_h), sl(slots_h);
      Twin<bf16> q(rng.bf16s(static_cast<size_t>(B) * nh * L, -4.0f, 4.0f));
      const float scale = dtype == KvDtype::bf16 ? 1.0f : 1.0f / 448.0f;
      const int blocks = slots * max_blocks;
      const KvSlots kc{KvCache{data.c.data(), dtype, scale, blocks, bs, L}, tables.c.data(), slots,
                       max_blocks};
      const KvSlots kg{KvCache{data.g.data(), dtype, scale, blocks, bs, L}, tables.g.data(), slots,
                       max_blocks};
      auto ref = out_twin<bf16>(static_cast<size_t>(B) * nh * L);
      on_cpu_rows(B, [&](Backend& cb, int b0, int b1) {
        cb.mla_decode_batch(q.c.data() + static_cast<size_t>(b0) * nh * L,
                            sel.c.data() + static_cast<size_t>(b0) * width, width,
                            RowBatch{sl.c.data() + b0, nullptr, b1 - b0}, kc,
                            ref.c.data() + static_cast<size_t>(b0) * nh * L, nh, softmax_scale);
      });
      const auto want = ref.from_cpu();
      const auto mask = row_mask(B, static_cast<size_t>(nh) * L, static_cast<size_t>(nh) * L, &slots_h);
      auto decode = [&](Twin<bf16>& out) {
        gpu().mla_decode_batch(q.g.data(), sel.g.data(), width, RowBatch{sl.g.data(), nullptr, B}, kg,
                               out.g.data(), nh, softmax_scale);
      };

      // Both kernels (KernelPolicy::mla_decode), automatic splits: at most two launches (the
      // decode and its combine), the CPU's result within the BF16 tolerance, padded rows untouched,
      // the same bytes on a second run. Then forced split counts (KernelPolicy::mla_batch_splits):
      // another merge order, the same tolerance. v2 rounds a forced count up to whole clusters of 8
      // (3 -> one cluster, 20 -> three, 64 -> eight: a combine over the clusters' partials).
      for (MlaDecode path : {MlaDecode::v2, MlaDecode::v1}) {
        const std::string pw = what + ", decode " + to_string(path);
        const PolicyScope use([path](KernelPolicy& p) {
          p.mla_decode = path;
          p.mla_batch = MlaBatch::tiles;
          p.mla_batch_splits = 0;
        });
        auto o = out_twin<bf16>(want.size()), again = out_twin<bf16>(want.size());
        EXPECT_LE(kernels_of([&] { decode(o); }), 2u) << pw;
        decode(again);
        const auto got = o.from_gpu();
        expect_bf16_written(got, want, mask, pw);
        expect_bytes_equal(again.from_gpu(), got, pw + ", second run");
        const std::vector<int> forced =
            path == MlaDecode::v1 ? std::vector<int>{1, 3} : std::vector<int>{3, 20, 64};
        for (int f : forced) {
          const PolicyScope force([f](KernelPolicy& p) { p.mla_batch_splits = f; });
          auto fo = out_twin<bf16>(want.size());
          decode(fo);
          expect_bf16_written(fo.from_gpu(), want, mask, pw + ", " + std::to_string(f) + " forced splits");
        }
      }

      // The batched v2 kernel is a batch of one row by row: at the same split count (8 per cluster:
      // mla_batch_splits = 8 x clusters) every live row's bytes equal the decode of that row alone
      // (its slot's block table), the padded rows untouched by both.
      for (int clusters : {1, 3}) {
        const PolicyScope use([clusters](KernelPolicy& p) {
          p.mla_decode = MlaDecode::v2;
          p.mla_batch = MlaBatch::tiles;
          p.mla_batch_splits = 8 * clusters;
        });
        auto batched = out_twin<bf16>(want.size()), single = out_twin<bf16>(want.size());
        decode(batched);
        const size_t row = static_cast<size_t>(nh) * L;
        for (int b = 0; b < B; ++b) {
          const int32_t slot = slots_h[static_cast<size_t>(b)];
          if (slot < 0) continue;
          mtplab::ops::OneRow(gpu()).mla_decode(q.g.data() + b * row,
                                                sel.g.data() + static_cast<size_t>(b) * width, width,
                                                tables.g.data() + static_cast<size_t>(slot) * max_blocks,
                                                kg.cache, single.g.data() + b * row, nh, softmax_scale);
        }
        expect_bytes_equal(batched.from_gpu(), single.from_gpu(),
                           what + ", batched v2 against each row alone, " + std::to_string(clusters) +
                               " cluster(s) of 8 splits");
      }

      // The shared kernels (KernelPolicy::mla_batch = shared2, shared32): automatic and forced split
      // counts against the CPU (at most two launches, the same bytes on a second run), and a row
      // decoded alone gives its bytes in the batch: a difference is a staging, barrier or fragment
      // error, not rounding.
      for (MlaBatch kernel : {MlaBatch::shared2, MlaBatch::shared32}) {
        const std::string pw = what + ", " + to_string(kernel) + " decode";
        const PolicyScope use([kernel](KernelPolicy& p) {
          p.mla_batch = kernel;
          p.mla_batch_splits = 0;
        });
        auto o = out_twin<bf16>(want.size()), again = out_twin<bf16>(want.size());
        EXPECT_LE(kernels_of([&] { decode(o); }), 2u) << pw;
        decode(again);
        const auto got = o.from_gpu();
        expect_bf16_written(got, want, mask, pw);
        expect_bytes_equal(again.from_gpu(), got, pw + ", second run");
      }
      for (int f : {1, 3, 7}) {
        const std::string fw = what + ", shared2 decode, " + std::to_string(f) + " forced splits";
        auto two = out_twin<bf16>(want.size());
        {
          const PolicyScope force([f](KernelPolicy& p) {
            p.mla_batch = MlaBatch::shared2;
            p.mla_batch_splits = f;
          });
          decode(two);
          if (f == 3) {
            // Each live row alone (rows = 1, its slot), into a copy of the batch's output.
            auto alone = out_twin<bf16>(want.size());
            const size_t row = static_cast<size_t>(nh) * L;
            for (int b = 0; b < B; ++b) {
              if (slots_h[static_cast<size_t>(b)] < 0) continue;
              gpu().mla_decode_batch(q.g.data() + b * row, sel.g.data() + static_cast<size_t>(b) * width,
                                     width, RowBatch{sl.g.data() + b, nullptr, 1}, kg,
                                     alone.g.data() + b * row, nh, softmax_scale);
            }
            expect_bytes_equal(alone.from_gpu(), two.from_gpu(), fw + ", each row alone against the batch");
          }
        }
        expect_bf16_written(two.from_gpu(), want, mask, fw);
        // shared32 at the same split count: its own bits (the softmax steps per 32 rows), against
        // the CPU, and a row decoded alone gives its bytes in the batch.
        const std::string w32 = what + ", shared32 decode, " + std::to_string(f) + " forced splits";
        const PolicyScope force32([f](KernelPolicy& p) {
          p.mla_batch = MlaBatch::shared32;
          p.mla_batch_splits = f;
        });
        auto batch32 = out_twin<bf16>(want.size()), alone32 = out_twin<bf16>(want.size());
        decode(batch32);
        const size_t row = static_cast<size_t>(nh) * L;
        for (int b = 0; b < B; ++b) {
          if (slots_h[static_cast<size_t>(b)] < 0) continue;
          gpu().mla_decode_batch(q.g.data() + b * row, sel.g.data() + static_cast<size_t>(b) * width, width,
                                 RowBatch{sl.g.data() + b, nullptr, 1}, kg, alone32.g.data() + b * row, nh,
                                 softmax_scale);
        }
        const auto g32 = batch32.from_gpu();
        expect_bf16_written(g32, want, mask, w32);
        expect_bytes_equal(alone32.from_gpu(), g32, w32 + ", each row alone against the batch");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GpuMla, ::testing::ValuesIn(kShapes), shape_name);

}  // namespace
}  // namespace mtplab::ops::gputest
