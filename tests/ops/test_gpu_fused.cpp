// CUDA fused ops (linear_group, residual_add_rmsnorm, moe_experts_shared, kv_norm_write,
// indexer_norm_store) at the tiny, small and glm5.3-flash shapes: each must be bit-identical to
// the separate CUDA ops it replaces (same per-row reduction order: that is the contract that keeps
// the drafter's numerics unchanged), and close to the CPU reference under the usual tolerances
// (gpu_test_util.hpp; fp32 outputs 1e-5 relative + 1e-4 of the largest, as test_gpu_dense's
// Linear).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "gpu_test_util.hpp"
#include "ops/one_row.hpp"

namespace mtplab::ops::gputest {
namespace {

class GpuFused : public ::testing::TestWithParam<Shape> {};

struct Member {
  const char* name;
  int n_out;
  bool f32_out;
  float scale;
};

void check_group(const std::vector<Member>& members, int k, Rng& rng, const std::string& group) {
  Twin<bf16> x(rng.bf16s(static_cast<size_t>(k), -1.0f, 1.0f));
  std::vector<Twin<bf16>> W;
  std::vector<Twin<bf16>> yb;
  std::vector<Twin<float>> yf;
  W.reserve(members.size());
  yb.reserve(members.size());
  yf.reserve(members.size());
  std::vector<LinearOut> c_outs, g_outs;
  for (const Member& m : members) {
    W.emplace_back(rng.bf16s(static_cast<size_t>(m.n_out) * k, -1.0f, 1.0f));
    yb.push_back(out_twin<bf16>(static_cast<size_t>(m.n_out)));
    yf.push_back(out_twin<float>(static_cast<size_t>(m.n_out)));
    void* yc = m.f32_out ? static_cast<void*>(yf.back().c.data()) : static_cast<void*>(yb.back().c.data());
    void* yg = m.f32_out ? static_cast<void*>(yf.back().g.data()) : static_cast<void*>(yb.back().g.data());
    c_outs.push_back({W.back().c.data(), yc, m.n_out, m.f32_out, m.scale});
    g_outs.push_back({W.back().g.data(), yg, m.n_out, m.f32_out, m.scale});
  }
  mtplab::ops::OneRow(cpu()).linear_group(c_outs, x.c.data(), k);
  mtplab::ops::OneRow(gpu()).linear_group(g_outs, x.g.data(), k);
  for (size_t i = 0; i < members.size(); ++i) {
    const Member& m = members[i];
    const std::string what = group + " " + m.name;
    if (m.f32_out) {
      const auto fused = yf[i].from_gpu();
      expect_f32_close(fused, yf[i].from_cpu(), what + " vs cpu", 1e-5, 1e-4);
      auto sep = out_twin<float>(static_cast<size_t>(m.n_out));
      gpu().linear_f32(W[i].g.data(), x.g.data(), sep.g.data(), 1, m.n_out, k);
      if (m.scale != 1.0f) gpu().scale_f32(sep.g.data(), m.scale, m.n_out);
      expect_bytes_equal(fused, sep.from_gpu(), what + " fused vs separate gpu ops");
    } else {
      const auto fused = yb[i].from_gpu();
      expect_bf16_close(fused, yb[i].from_cpu(), what + " vs cpu");
      auto sep = out_twin<bf16>(static_cast<size_t>(m.n_out));
      gpu().linear(W[i].g.data(), x.g.data(), sep.g.data(), 1, m.n_out, k);
      expect_bytes_equal(fused, sep.from_gpu(), what + " fused vs separate gpu ops");
    }
  }
}

TEST_P(GpuFused, LinearGroupIsBitIdenticalToSeparateGemvs) {
  const Shape s = GetParam();
  Rng rng(31);
  const float w_scale = 1.0f / std::sqrt(static_cast<float>(s.index_heads));
  // Block::forward's group (every projection of u) and a cache-only forward's (the cache side).
  check_group({{"q_a", s.q_lora, false, 1.0f},
               {"kv_a", s.kv_lora, false, 1.0f},
               {"indexer.wk", s.index_dim, false, 1.0f},
               {"indexer.gate", s.index_dim, true, 1.0f},
               {"indexer.weights_proj", s.index_heads, true, w_scale}},
              s.hidden, rng, std::string(s.name) + " forward");
  check_group({{"kv_a", s.kv_lora, false, 1.0f},
               {"indexer.wk", s.index_dim, false, 1.0f},
               {"indexer.gate", s.index_dim, true, 1.0f}},
              s.hidden, rng, std::string(s.name) + " context");
  // Ragged sizes (partial blocks at every split) and a single large output.
  check_group(
      {{"n1", 1, false, 1.0f}, {"n37", 37, true, 0.25f}, {"n301", 301, false, 1.0f}, {"n8", 8, true, 1.0f}},
      s.hidden, rng, std::string(s.name) + " ragged");
  check_group({{"router", s.experts, true, 1.0f}}, s.hidden, rng, std::string(s.name) + " single");
}

TEST_P(GpuFused, ResidualAddRmsnormIsBitIdenticalToTheTwoOps) {
  const Shape s = GetParam();
  Rng rng(32);
  const int H = s.hidden;
  const auto x_h = rng.bf16s(static_cast<size_t>(H), -3.0f, 3.0f);
  Twin<bf16> x(x_h);
  Twin<float> delta(rng.floats(static_cast<size_t>(H), -2.0f, 2.0f));
  Twin<bf16> w(rng.bf16s(static_cast<size_t>(H), 0.5f, 1.5f));
  auto y = out_twin<bf16>(static_cast<size_t>(H));
  auto normed = out_twin<bf16>(static_cast<size_t>(H));
  mtplab::ops::OneRow(cpu()).residual_add_rmsnorm(x.c.data(), delta.c.data(), y.c.data(), w.c.data(),
                                                  normed.c.data(), H, 1e-5f);
  mtplab::ops::OneRow(gpu()).residual_add_rmsnorm(x.g.data(), delta.g.data(), y.g.data(), w.g.data(),
                                                  normed.g.data(), H, 1e-5f);
  const auto y_g = y.from_gpu(), n_g = normed.from_gpu();
  expect_bytes_equal(y_g, y.from_cpu(), "y vs cpu (one IEEE add and one rounding: exact)");
  expect_bf16_close(n_g, normed.from_cpu(), "normed vs cpu");

  auto y2 = out_twin<bf16>(static_cast<size_t>(H));
  auto n2 = out_twin<bf16>(static_cast<size_t>(H));
  gpu().residual_add(x.g.data(), delta.g.data(), y2.g.data(), H);
  gpu().rmsnorm(y2.g.data(), w.g.data(), n2.g.data(), 1, H, 1e-5f);
  expect_bytes_equal(y_g, y2.from_gpu(), "y fused vs separate gpu ops");
  expect_bytes_equal(n_g, n2.from_gpu(), "normed fused vs separate gpu ops");

  // In place (y aliases x), as the block's residuals use it.
  mtplab::ops::OneRow(gpu()).residual_add_rmsnorm(x.g.data(), delta.g.data(), x.g.data(), w.g.data(),
                                                  n2.g.data(), H, 1e-5f);
  expect_bytes_equal(x.from_gpu(), y_g, "y in place");
  expect_bytes_equal(n2.from_gpu(), n_g, "normed in place");
}

// moe_experts_shared: the routed experts and the shared expert's slice in one pass. Bit-identical
// to moe_experts of each plus accumulate_f32 on the GPU (the block's former three ops), and close
// to the CPU under test_gpu_moe's expert tolerance (2^-7 relative + 2^-8 of the largest). Cases:
// all routed experts owned, half owned (another rank has the rest), none owned, and the shared
// slice of 2 ranks (half the intermediate rows).
TEST_P(GpuFused, MoeExpertsSharedIsBitIdenticalToTheSeparateOps) {
  const Shape s = GetParam();
  Rng rng(33);
  const int H = s.hidden, I = s.moe_inter, k = s.top_k;
  const int num_local = std::min(s.experts, 12);
  const size_t per = static_cast<size_t>(I) * H;
  Twin<bf16> gate(rng.bf16s(per * num_local, -1.0f, 1.0f));
  Twin<bf16> up(rng.bf16s(per * num_local, -1.0f, 1.0f));
  Twin<bf16> down(rng.bf16s(per * num_local, -0.1f, 0.1f));
  Twin<bf16> sg(rng.bf16s(per, -1.0f, 1.0f));
  Twin<bf16> su(rng.bf16s(per, -1.0f, 1.0f));
  Twin<bf16> sd(rng.bf16s(per, -0.1f, 0.1f));
  Twin<bf16> x(rng.bf16s(H, -1.0f, 1.0f));
  std::vector<int32_t> ids;
  while (static_cast<int>(ids.size()) < k) {
    const int id = rng.integer(0, s.experts - 1);
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  Twin<int32_t> idx(ids);
  Twin<float> wts(rng.floats(k, 0.1f, 1.0f));
  Twin<int32_t> zero(std::vector<int32_t>{0});
  Twin<float> one(std::vector<float>{1.0f});
  struct Case {
    const char* name;
    int first;        // first routed expert this rank owns
    int shared_rows;  // this rank's slice of the shared expert
  };
  const Case cases[] = {{"owned", ids[0] - ids[0] % num_local, I},
                        {"none owned", s.experts, I},
                        {"2-rank shared slice", ids[0] - ids[0] % num_local, I / 2}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(s.name) + " " + c.name);
    // The shared slice of a rank: the first `shared_rows` rows of gate / up, the same columns of down.
    std::vector<bf16> sd_slice(static_cast<size_t>(H) * c.shared_rows);
    const auto sd_full = sd.from_cpu();
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < c.shared_rows; ++i)
        sd_slice[static_cast<size_t>(h) * c.shared_rows + i] = sd_full[static_cast<size_t>(h) * I + i];
    Twin<bf16> sdown(sd_slice);
    const int num = std::min(num_local, s.experts - c.first);
    ExpertWeights cr{gate.c.data(), up.c.data(), down.c.data(), c.first, std::max(0, num), H, I};
    ExpertWeights gr{gate.g.data(), up.g.data(), down.g.data(), c.first, std::max(0, num), H, I};
    ExpertWeights cs{sg.c.data(), su.c.data(), sdown.c.data(), 0, 1, H, c.shared_rows};
    ExpertWeights gs{sg.g.data(), su.g.data(), sdown.g.data(), 0, 1, H, c.shared_rows};
    auto fused = out_twin<float>(H);
    mtplab::ops::OneRow(cpu()).moe_experts_shared(x.c.data(), cr, idx.c.data(), wts.c.data(), k, cs, 10.0f,
                                                  fused.c.data());
    mtplab::ops::OneRow(gpu()).moe_experts_shared(x.g.data(), gr, idx.g.data(), wts.g.data(), k, gs, 10.0f,
                                                  fused.g.data());
    const auto got = fused.from_gpu();
    expect_f32_close(got, fused.from_cpu(), "moe_experts_shared vs cpu", 1.0 / 128, 1.0 / 256);
    auto routed = out_twin<float>(H);
    auto shared = out_twin<float>(H);
    mtplab::ops::OneRow(gpu()).moe_experts(x.g.data(), gr, idx.g.data(), wts.g.data(), k, 10.0f,
                                           routed.g.data());
    mtplab::ops::OneRow(gpu()).moe_experts(x.g.data(), gs, zero.g.data(), one.g.data(), 1, 10.0f,
                                           shared.g.data());
    gpu().accumulate_f32(shared.g.data(), routed.g.data(), H);
    expect_bytes_equal(got, routed.from_gpu(), "moe_experts_shared vs moe_experts x2 + accumulate_f32");
  }
}

// The fused cache writes run the standalone norm kernel's code (the register-resident one, or the
// scalar one for rows that are not a multiple of 8 or inputs that are not 16-byte aligned, the
// same test as the norm's) and store each rounded element as the second op would: so the caches
// must be byte-identical to the two GPU ops. Each is run at the shape's size (register path), an
// odd size and the shape's size with the input one element off alignment (both scalar). Against
// the CPU: BF16 rows under gpu_test_util.hpp's tolerance, FP8 codes within one E4M3 step (a BF16
// ulp of difference in c_kv can move the quantised code by one, 2^-3 relative), flags and copied
// gates exact, pool keys 2^-7 relative + 2^-8 of the largest (k rows that differ by a BF16 ulp,
// 2^-8 relative, weighted by a softmax that sums to 1).
struct NormCase {
  std::string name;
  int n;
  int offset;  // elements the input row starts past an aligned allocation
};
std::vector<NormCase> norm_cases(int n) {
  return {{"n=" + std::to_string(n), n, 0}, {"n=37", 37, 0}, {"n=" + std::to_string(n) + " unaligned", n, 1}};
}

/// The cache elements of logical row p (its slot through `table`), `row_elems` per row.
template <typename T>
std::vector<T> cache_row(const std::vector<T>& all, const std::vector<int32_t>& table, int block_size, int p,
                         size_t row_elems) {
  const size_t slot = static_cast<size_t>(table[p / block_size]) * block_size + p % block_size;
  return std::vector<T>(all.begin() + slot * row_elems, all.begin() + (slot + 1) * row_elems);
}

TEST_P(GpuFused, KvNormWriteIsBitIdenticalToTheTwoOps) {
  const Shape s = GetParam();
  Rng rng(34);
  const float eps = 1e-6f, scale = 0.0123f;
  const int block_size = 64, rows = 200, num_blocks = rows / block_size + 2;
  std::vector<int32_t> table_h(num_blocks);
  std::iota(table_h.begin(), table_h.end(), 0);
  for (size_t i = table_h.size() - 1; i > 0; --i) std::swap(table_h[i], table_h[rng.next() % (i + 1)]);
  Twin<int32_t> table(table_h);
  // Block boundaries, a rewrite of a row (a rollback), the last row.
  const std::vector<int32_t> positions = {0, 1, 63, 64, 65, 127, 128, 64, rows - 1};
  Twin<int32_t> pos(positions);
  for (const NormCase& c : norm_cases(s.kv_lora)) {
    const int L = c.n;
    Twin<bf16> x(rng.bf16s(positions.size() * L + c.offset, -3.0f, 3.0f));
    Twin<bf16> w(rng.bf16s(static_cast<size_t>(L), 0.5f, 1.5f));
    for (const KvDtype dtype : {KvDtype::bf16, KvDtype::fp8}) {
      const std::string what =
          std::string(s.name) + " " + c.name + (dtype == KvDtype::bf16 ? " bf16" : " fp8") + " kv_norm_write";
      const size_t elem = dtype == KvDtype::bf16 ? 2 : 1;
      const size_t bytes = static_cast<size_t>(num_blocks) * block_size * L * elem;
      auto fused = out_twin<uint8_t>(bytes);
      auto separate = out_twin<uint8_t>(bytes);
      auto c_kv = out_twin<bf16>(static_cast<size_t>(L));
      const KvCache fc{fused.c.data(), dtype, scale, num_blocks, block_size, L};
      const KvCache fg{fused.g.data(), dtype, scale, num_blocks, block_size, L};
      const KvCache sg{separate.g.data(), dtype, scale, num_blocks, block_size, L};
      for (size_t t = 0; t < positions.size(); ++t) {
        const size_t off = c.offset + t * L;
        mtplab::ops::OneRow(cpu()).kv_norm_write(x.c.data() + off, w.c.data(), eps, table.c.data(),
                                                 pos.c.data() + t, fc);
        mtplab::ops::OneRow(gpu()).kv_norm_write(x.g.data() + off, w.g.data(), eps, table.g.data(),
                                                 pos.g.data() + t, fg);
        gpu().rmsnorm(x.g.data() + off, w.g.data(), c_kv.g.data(), 1, L, eps);
        gpu().kv_write(c_kv.g.data(), table.g.data(), pos.g.data() + t, sg);
      }
      const auto got = fused.from_gpu();
      expect_bytes_equal(got, separate.from_gpu(), what + " fused vs rmsnorm + kv_write (gpu)");
      const auto want = fused.from_cpu();
      std::vector<bf16> got_bf16, want_bf16;
      std::vector<float> got_fp8, want_fp8;
      size_t same_codes = 0, n_codes = 0;
      for (int32_t p : positions) {
        const auto g = cache_row(got, table_h, block_size, p, L * elem);
        const auto w_row = cache_row(want, table_h, block_size, p, L * elem);
        if (dtype == KvDtype::bf16) {
          std::vector<bf16> gb(L), wb(L);
          std::memcpy(gb.data(), g.data(), L * elem);
          std::memcpy(wb.data(), w_row.data(), L * elem);
          got_bf16.insert(got_bf16.end(), gb.begin(), gb.end());
          want_bf16.insert(want_bf16.end(), wb.begin(), wb.end());
        } else {
          for (int i = 0; i < L; ++i) {
            got_fp8.push_back(to_float(fp8e4m3{g[i]}) * scale);
            want_fp8.push_back(to_float(fp8e4m3{w_row[i]}) * scale);
            same_codes += g[i] == w_row[i];
            ++n_codes;
          }
        }
      }
      if (dtype == KvDtype::bf16) {
        expect_bf16_close(got_bf16, want_bf16, what + " vs cpu");
      } else {
        expect_f32_close(got_fp8, want_fp8, what + " vs cpu (one E4M3 step)", 1.0 / 8, 1.0 / 4096);
        EXPECT_GE(static_cast<double>(same_codes) / n_codes, 0.9)
            << what << " vs cpu: identical codes; " << seed_note();
      }
      // The slots no position maps to keep their poison (out_twin's byte for integers) on both backends.
      std::vector<bool> written(static_cast<size_t>(num_blocks) * block_size, false);
      for (int32_t p : positions)
        written[static_cast<size_t>(table_h[p / block_size]) * block_size + p % block_size] = true;
      size_t touched = 0;
      for (size_t slot = 0; slot < written.size(); ++slot) {
        if (written[slot]) continue;
        for (size_t i = slot * L * elem; i < (slot + 1) * L * elem; ++i)
          touched += got[i] != 0x7F || want[i] != 0x7F;
      }
      EXPECT_EQ(touched, 0u) << what << ": bytes written outside the rows' slots";
    }
  }
}

TEST_P(GpuFused, IndexerNormStoreIsBitIdenticalToTheTwoOps) {
  const Shape s = GetParam();
  Rng rng(35);
  const float eps = 1e-6f;
  const int P = s.index_kpool, rows = 4 * P;
  // Rows in order over four pools, then a pool's last row stored again (after a rollback: its key
  // is recomputed) and a row inside a pool.
  std::vector<int32_t> positions(rows);
  std::iota(positions.begin(), positions.end(), 0);
  positions.push_back(2 * P - 1);
  positions.push_back(P + 1);
  Twin<int32_t> pos(positions);
  const size_t n_pos = positions.size();
  for (const NormCase& c : norm_cases(s.index_dim)) {
    const int D = c.n;
    const std::string what = std::string(s.name) + " " + c.name + " indexer_norm_store";
    Twin<bf16> x(rng.bf16s(n_pos * D + c.offset, -2.0f, 3.0f));
    Twin<float> gate(rng.floats(n_pos * D, -3.0f, 3.0f));
    Twin<bf16> w(rng.bf16s(static_cast<size_t>(D), 0.5f, 1.5f));
    Twin<bf16> b(rng.bf16s(static_cast<size_t>(D), -0.5f, 0.5f));
    Twin<float> ape(rng.floats(static_cast<size_t>(P) * D, -1.0f, 1.0f));
    struct Caches {
      Twin<bf16> k;
      Twin<float> gate, keys;
      Twin<uint8_t> valid;
    };
    auto make = [&] {
      return Caches{out_twin<bf16>(static_cast<size_t>(rows) * D),
                    out_twin<float>(static_cast<size_t>(rows) * D),
                    out_twin<float>(static_cast<size_t>(rows / P) * D),
                    Twin<uint8_t>(std::vector<uint8_t>(static_cast<size_t>(rows), 0))};
    };
    Caches fused = make(), separate = make();
    auto k_normed = out_twin<bf16>(static_cast<size_t>(D));
    for (size_t t = 0; t < n_pos; ++t) {
      const size_t off = c.offset + t * D;
      const float* g_c = gate.c.data() + t * D;
      const float* g_g = gate.g.data() + t * D;
      mtplab::ops::OneRow(cpu()).indexer_norm_store(
          x.c.data() + off, w.c.data(), b.c.data(), eps, g_c, ape.c.data(), pos.c.data() + t,
          fused.k.c.data(), fused.gate.c.data(), fused.valid.c.data(), fused.keys.c.data(), D, P);
      mtplab::ops::OneRow(gpu()).indexer_norm_store(
          x.g.data() + off, w.g.data(), b.g.data(), eps, g_g, ape.g.data(), pos.g.data() + t,
          fused.k.g.data(), fused.gate.g.data(), fused.valid.g.data(), fused.keys.g.data(), D, P);
      gpu().layernorm(x.g.data() + off, w.g.data(), b.g.data(), k_normed.g.data(), 1, D, eps);
      gpu().indexer_store(k_normed.g.data(), g_g, ape.g.data(), pos.g.data() + t, separate.k.g.data(),
                          separate.gate.g.data(), separate.valid.g.data(), separate.keys.g.data(), D, P);
    }
    const auto k = fused.k.from_gpu();
    const auto keys = fused.keys.from_gpu();
    expect_bytes_equal(k, separate.k.from_gpu(), what + " k cache fused vs layernorm + indexer_store (gpu)");
    expect_bytes_equal(fused.gate.from_gpu(), separate.gate.from_gpu(),
                       what + " gate cache fused vs separate (gpu)");
    expect_bytes_equal(fused.valid.from_gpu(), separate.valid.from_gpu(),
                       what + " valid fused vs separate (gpu)");
    expect_bytes_equal(keys, separate.keys.from_gpu(), what + " pool keys fused vs separate (gpu)");
    expect_bf16_close(k, fused.k.from_cpu(), what + " k cache vs cpu");
    expect_bytes_equal(fused.gate.from_gpu(), fused.gate.from_cpu(), what + " gate cache vs cpu");
    expect_bytes_equal(fused.valid.from_gpu(), fused.valid.from_cpu(), what + " valid vs cpu");
    expect_f32_close(keys, fused.keys.from_cpu(), what + " pool keys vs cpu", 1.0 / 128, 1.0 / 256);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuFused, ::testing::ValuesIn(kShapes), shape_name);

}  // namespace
}  // namespace mtplab::ops::gputest
