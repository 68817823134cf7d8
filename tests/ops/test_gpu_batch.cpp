// CUDA vs CPU: the batched cases that cross op families, at the tiny, small and glm5.3-flash
// shapes, fresh random inputs each run (each family's own batched cases are in its file:
// test_gpu_norm.cpp, test_gpu_dense.cpp, test_gpu_indexer.cpp, test_gpu_mla.cpp, test_gpu_moe.cpp):
// - The ragged rows through the cache writes and the reads after them (kv_norm_write_batch,
//   indexer_norm_store_batch, then the scores, the selection and the decode on identical caches),
//   over ragged_layouts (gpu_batch_util.hpp), both KV dtypes; tolerances below.
// - A step of batched ops captured in a CUDA graph and replayed: every replay gives the eager
//   launches' bytes.
// What holds for every batched case here and in the family files:
// - Every output and cache is poisoned first (0xFF: NaN for floats and BF16, an invalid FP8 code)
//   on both backends, and the CPU reference writes exactly the rows the op must write (padded rows
//   and untouched cache rows keep their bytes there). So every element the CPU leaves alone must
//   keep its bytes on the GPU too: a padded row's or another slot's stray write fails; a padded
//   row's input is set to what would fault or be refused if it were read (token -7, selection past
//   the table, NaN logits).
// - BF16 outputs of sums: the BF16 tolerance of gpu_test_util.hpp (2 ulps + 1/4096 of the largest
//   |value|, >= 90% bit-identical), docs/numerics.md's rule: both backends round the same fp32
//   function at the same points, the GPU sums in its own order (the tensor cores' for the GEMMs
//   and the decode). Copies, single IEEE operations and integer outputs are exact.
// - One launch per op: each op enqueues at most the kernels it is documented to, whatever B.
// The CPU reference runs on as many threads as the machine has (one CPU backend per thread, each
// on a contiguous range of rows: a row's result does not depend on the others), so the
// glm5.3-flash shapes stay in seconds; contexts are short (a few pools past the first sparse
// selection).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "gpu_batch_util.hpp"
#include "gpu_test_util.hpp"
#include "ops/cuda/dense.hpp"
#include "ops/cuda/dispatch.hpp"
#include "ops/cuda/indexer.hpp"
#include "ops/cuda/moe.hpp"
#include "ops/one_row.hpp"

namespace mtplab::ops::gputest {
namespace {

class GpuBatch : public ::testing::TestWithParam<Shape> {};

// Ragged rows through the cache writes and the reads after them, CUDA against the CPU reference,
// over ragged_layouts (gpu_batch_util.hpp; at the glm5.3-flash shape the thin list of single
// sequences: its CPU decode is the cost). Random starts (see make_ragged), so rows cross pool boundaries and
// complete pools begun before the batch; each slot holds random rows 0 .. start - 1 already (valid,
// and random keys for its complete pools); every cache and output is poisoned first. Both KV dtypes.
// - kv_norm_write_batch (one launch): the written latent rows within the BF16 tolerance (FP8: codes
//   within one step, >= 90% identical), every other byte unchanged.
// - indexer_norm_store_batch (one launch at max_seq_rows 1, two above it: the rows, then the
//   completed pools' keys): k rows within the BF16 tolerance, gate rows and valid flags exact; the
//   keys of the pools the batch completes within rel 2^-7 + 2^-8 of the largest key of the CPU's
//   (GpuFused.IndexerNormStoreIsBitIdenticalToTheTwoOps's bound for the single-row store: a k row
//   may differ by an ulp) and within 1e-5 of the sum of |terms| of a double recomputation from the
//   GPU's own cached rows (the IndexerNormStore bound); every other key unchanged.
// - Then, on identical caches (the GPU's copied to the CPU): indexer_scores_batch within 1e-5
//   relative + 1e-5 of the largest finite score, -inf exactly where the CPU has it (one launch);
//   indexer_select_batch on the CPU's scores exact (one launch); mla_decode_batch over the CPU's
//   selection within the BF16 tolerance (at most two launches); padded rows' outputs untouched.
TEST_P(GpuBatch, RaggedRowsCacheWritesAndReads) {
  const Shape s = GetParam();
  Rng rng(814);
  const int L = s.kv_lora, D = s.index_dim, P = s.index_kpool, nI = s.index_heads, K = s.index_topk;
  const int nh = s.n_heads, width = K + P - 1;
  const int bs = block_size_for(s), capacity = max_rows_for(s), max_blocks = capacity / bs, mp = capacity / P;
  const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const bool flash = s.hidden >= 4096;
  Twin<bf16> kw(rng.bf16s(L, 0.5f, 1.5f)), lw(rng.bf16s(D, 0.5f, 1.5f)), lb(rng.bf16s(D, -0.5f, 0.5f));
  Twin<float> ape(rng.floats(static_cast<size_t>(P) * D, -1.0f, 1.0f));
  const auto ape_h = ape.from_cpu();

  const std::vector<Ragged> layouts = ragged_layouts(rng, capacity, flash);

  for (KvDtype dtype : {KvDtype::bf16, KvDtype::fp8}) {
    const size_t elem = dtype == KvDtype::bf16 ? 2 : 1;
    for (const Ragged& r : layouts) {
      const std::string what =
          std::string(s.name) + ", " + r.name + (dtype == KvDtype::bf16 ? ", BF16 cache" : ", FP8 cache");
      const int R = r.rows(), slots = r.slots, blocks = slots * max_blocks;
      const size_t rows_all = static_cast<size_t>(slots) * capacity;
      const auto tables_h = make_tables(rng, slots, max_blocks);
      Twin<int32_t> tables(tables_h), sl(r.slot), pos(r.pos);
      auto phys = [&](int slot, int t) {
        return static_cast<size_t>(tables_h[static_cast<size_t>(slot) * max_blocks + t / bs]) * bs + t % bs;
      };

      // The caches, poisoned; the rows before each sequence random (and valid), as are the keys of
      // the pools they complete.
      auto data = out_twin<uint8_t>(static_cast<size_t>(blocks) * bs * L * elem);
      data.poison(0xFF);
      auto k_cache = out_twin<bf16>(rows_all * D);
      auto gate_cache = out_twin<float>(rows_all * D);
      Twin<uint8_t> valid(std::vector<uint8_t>(rows_all, 0));
      auto pool_keys = out_twin<float>(static_cast<size_t>(slots) * mp * D);
      {
        auto dh = data.from_cpu();
        auto kh = k_cache.from_cpu();
        auto gh = gate_cache.from_cpu();
        auto vh = valid.from_cpu();
        auto ph = pool_keys.from_cpu();
        for (const Seq& q : r.seqs) {
          for (int t = 0; t < q.start; ++t) {
            uint8_t* lat = dh.data() + phys(q.slot, t) * L * elem;
            for (int c = 0; c < L; ++c) {
              if (dtype == KvDtype::bf16) {
                const bf16 v = to_bf16(rng.uniform(-2.0f, 2.0f));
                std::memcpy(lat + 2 * c, &v, 2);
              } else {
                uint8_t code = static_cast<uint8_t>(rng.next() >> 56);
                if ((code & 0x7f) == 0x7f) code ^= 0x01;
                lat[c] = code;
              }
            }
            const size_t row = static_cast<size_t>(q.slot) * capacity + t;
            for (int c = 0; c < D; ++c) {
              kh[row * D + c] = to_bf16(rng.uniform(-2.0f, 2.0f));
              gh[row * D + c] = rng.uniform(-3.0f, 3.0f);
            }
            vh[row] = 1;
          }
          for (int j = 0; (j + 1) * P <= q.start; ++j)
            for (int c = 0; c < D; ++c)
              ph[(static_cast<size_t>(q.slot) * mp + j) * D + c] = rng.uniform(-1.0f, 1.0f);
        }
        data.set(dh);
        k_cache.set(kh);
        gate_cache.set(gh);
        valid.set(vh);
        pool_keys.set(ph);
      }
      const KvSlots kc{KvCache{data.c.data(), dtype, 0.0123f, blocks, bs, L}, tables.c.data(), slots,
                       max_blocks};
      const KvSlots kg{KvCache{data.g.data(), dtype, 0.0123f, blocks, bs, L}, tables.g.data(), slots,
                       max_blocks};
      const IndexerSlots ic{
          k_cache.c.data(), gate_cache.c.data(), valid.c.data(), pool_keys.c.data(), slots, capacity, D, P};
      const IndexerSlots ig{
          k_cache.g.data(), gate_cache.g.data(), valid.g.data(), pool_keys.g.data(), slots, capacity, D, P};
      const RowBatch rc{sl.c.data(), pos.c.data(), R, r.max_seq_rows};
      const RowBatch rg{sl.g.data(), pos.g.data(), R, r.max_seq_rows};

      // The cache writes. The CPU reference on one backend: a sequence's rows in batch order.
      Twin<bf16> ckv(rng.bf16s(static_cast<size_t>(R) * L, -3.0f, 3.0f));
      Twin<bf16> k_pre(rng.bf16s(static_cast<size_t>(R) * D, -2.0f, 4.0f));  // non-zero mean
      Twin<float> gate(rng.floats(static_cast<size_t>(R) * D, -3.0f, 3.0f));
      EXPECT_EQ(kernels_of([&] { gpu().kv_norm_write_batch(ckv.g.data(), kw.g.data(), 1e-5f, rg, kg); }), 1u)
          << what;
      EXPECT_EQ(kernels_of([&] {
                  gpu().indexer_norm_store_batch(k_pre.g.data(), lw.g.data(), lb.g.data(), 1e-6f,
                                                 gate.g.data(), ape.g.data(), rg, ig);
                }),
                r.max_seq_rows > 1 ? 2u : 1u)
          << what;
      cpu().kv_norm_write_batch(ckv.c.data(), kw.c.data(), 1e-5f, rc, kc);
      cpu().indexer_norm_store_batch(k_pre.c.data(), lw.c.data(), lb.c.data(), 1e-6f, gate.c.data(),
                                     ape.c.data(), rc, ic);

      std::vector<uint8_t> lat_mask(data.c.size() / elem, 0), k_mask(rows_all * D, 0);
      std::vector<uint8_t> key_mask(static_cast<size_t>(slots) * mp * D, 0);
      size_t completed = 0;
      for (int b = 0; b < R; ++b) {
        const int32_t sb = r.slot[static_cast<size_t>(b)];
        if (sb < 0) continue;
        const int32_t p = r.pos[static_cast<size_t>(b)];
        std::fill_n(lat_mask.begin() + static_cast<ptrdiff_t>(phys(sb, p) * L), L, 1);
        std::fill_n(k_mask.begin() + static_cast<ptrdiff_t>((static_cast<size_t>(sb) * capacity + p) * D), D,
                    1);
        if (p % P == P - 1) {
          std::fill_n(key_mask.begin() + static_cast<ptrdiff_t>((static_cast<size_t>(sb) * mp + p / P) * D),
                      D, 1);
          ++completed;
        }
      }
      const auto glat = data.from_gpu(), clat = data.from_cpu();
      if (dtype == KvDtype::bf16) {
        std::vector<bf16> g16(glat.size() / 2), c16(clat.size() / 2);
        std::memcpy(g16.data(), glat.data(), glat.size());
        std::memcpy(c16.data(), clat.data(), clat.size());
        expect_bf16_written(g16, c16, lat_mask, what + ", kv_norm_write_batch latent rows");
      } else {
        expect_fp8_codes_close(masked(glat, lat_mask), masked(clat, lat_mask),
                               what + ", kv_norm_write_batch latent codes");
        expect_outside_unchanged(glat, clat, lat_mask, what + ", kv_norm_write_batch latent codes");
      }
      const auto gk = k_cache.from_gpu();
      const auto ggate = gate_cache.from_gpu();
      const auto gvalid = valid.from_gpu();
      const auto gkeys = pool_keys.from_gpu(), ckeys = pool_keys.from_cpu();
      expect_bf16_written(gk, k_cache.from_cpu(), k_mask, what + ", indexer_norm_store_batch k rows");
      expect_bytes_equal(ggate, gate_cache.from_cpu(), what + ", indexer_norm_store_batch gate rows");
      expect_bytes_equal(gvalid, valid.from_cpu(), what + ", indexer_norm_store_batch valid flags");
      expect_f32_close(masked(gkeys, key_mask), masked(ckeys, key_mask),
                       what + ", indexer_norm_store_batch pool keys vs cpu", 1.0 / 128, 1.0 / 256);
      expect_outside_unchanged(gkeys, ckeys, key_mask, what + ", indexer_norm_store_batch pool keys");
      // The completed pools' keys against double arithmetic on the GPU's own cached rows: a key
      // computed before all its rows were stored (the rows of the batch) fails here.
      size_t bad = 0, checked = 0;
      for (int b = 0; b < R; ++b) {
        const int32_t sb = r.slot[static_cast<size_t>(b)], p = r.pos[static_cast<size_t>(b)];
        if (sb < 0 || p % P != P - 1) continue;
        const size_t first = static_cast<size_t>(sb) * capacity + static_cast<size_t>(p / P) * P;
        for (int c = 0; c < D; ++c) {
          std::vector<double> lg(static_cast<size_t>(P));
          double mx = -INFINITY;
          for (int m = 0; m < P; ++m) {
            lg[static_cast<size_t>(m)] =
                static_cast<double>(ggate[(first + m) * D + c]) + ape_h[static_cast<size_t>(m) * D + c];
            mx = std::max(mx, lg[static_cast<size_t>(m)]);
          }
          double den = 0, ref = 0, mag = 0;
          for (int m = 0; m < P; ++m) den += std::exp(lg[static_cast<size_t>(m)] - mx);
          for (int m = 0; m < P; ++m) {
            const double term =
                std::exp(lg[static_cast<size_t>(m)] - mx) / den * to_float(gk[(first + m) * D + c]);
            ref += term;
            mag += std::fabs(term);
          }
          const double got = gkeys[(static_cast<size_t>(sb) * mp + p / P) * D + c];
          bad += !(std::fabs(got - ref) <= 1e-5 * mag + 1e-30);
          ++checked;
        }
      }
      EXPECT_EQ(checked, completed * D) << what;
      EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << checked
                         << " pool key values off the GPU's own rows; " << seed_note();

      // The reads, on identical caches: the GPU's, copied to the CPU.
      data.set(glat);
      k_cache.set(gk);
      gate_cache.set(ggate);
      valid.set(gvalid);
      pool_keys.set(gkeys);
      Twin<float> q(rng.floats(static_cast<size_t>(R) * nI * D, -1.0f, 1.0f));
      std::vector<float> w_h = rng.floats(static_cast<size_t>(R) * nI, -1.0f, 1.0f);
      for (auto& v : w_h) v /= std::sqrt(static_cast<float>(nI));
      Twin<float> qw(w_h);
      auto scores = out_twin<float>(static_cast<size_t>(R) * mp);
      EXPECT_EQ(kernels_of([&] {
                  gpu().indexer_scores_batch(q.g.data(), qw.g.data(), rg, ig, scores.g.data(), nI);
                }),
                1u)
          << what;
      // The reads write no cache: the CPU reference on every core.
      auto sub = [&](int b0, int b1) {
        return RowBatch{sl.c.data() + b0, pos.c.data() + b0, b1 - b0, r.max_seq_rows};
      };
      on_cpu_rows(R, [&](Backend& be, int b0, int b1) {
        be.indexer_scores_batch(q.c.data() + static_cast<size_t>(b0) * nI * D,
                                qw.c.data() + static_cast<size_t>(b0) * nI, sub(b0, b1), ic,
                                scores.c.data() + static_cast<size_t>(b0) * mp, nI);
      });
      const auto score_mask = row_mask(R, mp, mp, &r.slot);
      const auto gs = scores.from_gpu(), cs = scores.from_cpu();
      expect_f32_with_inf(masked(gs, score_mask), masked(cs, score_mask), what + ", indexer_scores_batch",
                          1e-5, 1e-5);
      expect_outside_unchanged(gs, cs, score_mask, what + ", indexer_scores_batch");

      // The selection, both backends on the CPU's scores (exact), ties made common in half the rows.
      std::vector<float> sc = cs;
      for (int b = 0; b < R; b += 2)
        for (int j = 0; j < mp; ++j) {
          float& v = sc[static_cast<size_t>(b) * mp + j];
          if (std::isfinite(v)) v = std::floor(v * 4.0f) / 4.0f;
        }
      Twin<float> sct(sc);
      auto sel = out_twin<int32_t>(static_cast<size_t>(R) * width);
      EXPECT_EQ(kernels_of([&] { gpu().indexer_select_batch(sct.g.data(), rg, sel.g.data(), K, P, mp); }), 1u)
          << what;
      on_cpu_rows(R, [&](Backend& be, int b0, int b1) {
        be.indexer_select_batch(sct.c.data() + static_cast<size_t>(b0) * mp, sub(b0, b1),
                                sel.c.data() + static_cast<size_t>(b0) * width, K, P, mp);
      });
      const auto csel = sel.from_cpu();
      expect_bytes_equal(sel.from_gpu(), csel, what + ", indexer_select_batch");

      // The decode over the CPU's selection (a padded row's is poison: a read would fault).
      Twin<int32_t> selc(csel);
      Twin<bf16> q_abs(rng.bf16s(static_cast<size_t>(R) * nh * L, -1.0f, 1.0f));
      const size_t row = static_cast<size_t>(nh) * L;
      auto o = out_twin<bf16>(static_cast<size_t>(R) * row);
      EXPECT_LE(kernels_of([&] {
                  gpu().mla_decode_batch(q_abs.g.data(), selc.g.data(), width, rg, kg, o.g.data(), nh,
                                         softmax_scale);
                }),
                2u)
          << what;
      on_cpu_rows(R, [&](Backend& be, int b0, int b1) {
        be.mla_decode_batch(q_abs.c.data() + b0 * row, selc.c.data() + static_cast<size_t>(b0) * width, width,
                            sub(b0, b1), kc, o.c.data() + b0 * row, nh, softmax_scale);
      });
      expect_bf16_written(o.from_gpu(), o.from_cpu(), row_mask(R, row, row, &r.slot),
                          what + ", mla_decode_batch");
    }
  }
}

// A step's worth of batched ops recorded into one CUDA graph and replayed twice gives the eager
// launches' bytes: no op synchronises or allocates once warm, and the head's self-resetting
// scratch survives replays.
TEST_P(GpuBatch, GraphReplayMatchesEager) {
  const Shape s = GetParam();
  if (s.hidden >= 4096)
    GTEST_SKIP() << "the eager tests cover the flash shape; the graph check runs on tiny and small";
  Rng rng(813);
  const int B = 16, V = s.vocab, H = s.hidden, E = s.experts, I = s.moe_inter, k = s.top_k;
  const auto slots_h = make_slots(rng, B, B + 1);
  Twin<int32_t> sl(slots_h);
  const Big<bf16> W = big_bf16(static_cast<size_t>(V) * H, -1.0f, 1.0f, 8131);
  Twin<bf16> x(rng.bf16s(static_cast<size_t>(B) * H, -1.0f, 1.0f));
  const size_t per = static_cast<size_t>(I) * H;
  const Big<bf16> gate = big_bf16(per * E, -1, 1, 8132), up = big_bf16(per * E, -1, 1, 8133),
                  down = big_bf16(per * E, -0.1f, 0.1f, 8134);
  std::vector<int32_t> idx_h(static_cast<size_t>(B) * k);
  for (auto& v : idx_h) v = rng.integer(0, E - 1);
  Twin<int32_t> idx(idx_h);
  Twin<float> wts(rng.floats(static_cast<size_t>(B) * k, 0.1f, 1.0f));
  const ExpertWeights w{gate.g.data(), up.g.data(), down.g.data(), 0, E, H, I};
  auto out = out_twin<ArgMax>(B), out_g = out_twin<ArgMax>(B);
  auto moe = out_twin<float>(static_cast<size_t>(B) * H), moe_g = out_twin<float>(static_cast<size_t>(B) * H);
  auto step = [&](ArgMax* o, float* m) {
    gpu().head_argmax_batch(W.g.data(), nullptr, nullptr, x.g.data(), RowBatch{sl.g.data(), nullptr, B}, V, H,
                            0, nullptr, 0, o);
    gpu().moe_experts_grouped(x.g.data(), w, idx.g.data(), wts.g.data(), RowBatch{sl.g.data(), nullptr, B}, k,
                              &w, 10.0f, m);
    gpu().head_argmax_batch(W.g.data(), nullptr, nullptr, x.g.data(), RowBatch{sl.g.data(), nullptr, B}, V, H,
                            0, nullptr, 0, o);
  };
  step(out.g.data(), moe.g.data());  // eager, sizes the scratch
  gpu().begin_capture();
  step(out_g.g.data(), moe_g.g.data());
  auto graph = gpu().end_capture();
  for (int rep = 0; rep < 2; ++rep) {
    out_g.poison(0xFF);
    moe_g.poison(0xFF);
    graph->launch();
    expect_bytes_equal(out_g.from_gpu(), out.from_gpu(), "head in a graph, replay " + std::to_string(rep));
    expect_bytes_equal(moe_g.from_gpu(), moe.from_gpu(),
                       "grouped experts in a graph, replay " + std::to_string(rep));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GpuBatch, ::testing::ValuesIn(kShapes), shape_name);

}  // namespace
}  // namespace mtplab::ops::gputest
