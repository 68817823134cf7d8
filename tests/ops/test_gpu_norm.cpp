// CUDA vs CPU, the norm family: rmsnorm, layernorm, the embedding row's norm and the fused
// residual add + rmsnorm, one row and batched (kBatches rows, padded rows among them: their outputs
// keep their poison), at the tiny, small and glm5.3-flash shapes, and over the widths where the
// norms' vector and scalar paths change. Tolerances: gpu_test_util.hpp (BF16: 2 ulps + 1/4096 of
// the tensor's magnitude, most elements bit-identical; the sums run in another order than the
// CPU's); the residual add is one IEEE add and one rounding on both sides, so exact.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gpu_batch_util.hpp"
#include "gpu_test_util.hpp"
#include "ops/one_row.hpp"

namespace mtplab::ops::gputest {
namespace {

class GpuNorm : public ::testing::TestWithParam<Shape> {};

// ---- one row -------------------------------------------------------------------------------------------

TEST_P(GpuNorm, OneRow) {
  const Shape s = GetParam();
  Rng rng(1);
  const int H = s.hidden;
  const int rows = 3;
  Twin<bf16> x(rng.bf16s(static_cast<size_t>(rows) * H, -3.0f, 3.0f));
  Twin<bf16> w(rng.bf16s(H, 0.5f, 1.5f));
  auto y = out_twin<bf16>(static_cast<size_t>(rows) * H);
  cpu().rmsnorm(x.c.data(), w.c.data(), y.c.data(), rows, H, 1e-5f);
  gpu().rmsnorm(x.g.data(), w.g.data(), y.g.data(), rows, H, 1e-5f);
  expect_bf16_close(y.from_gpu(), y.from_cpu(), "rmsnorm");

  // In place (x and y alias).
  cpu().rmsnorm(x.c.data(), w.c.data(), x.c.data(), rows, H, 1e-5f);
  gpu().rmsnorm(x.g.data(), w.g.data(), x.g.data(), rows, H, 1e-5f);
  expect_bf16_close(x.from_gpu(), x.from_cpu(), "rmsnorm in place");

  const int table_rows = 4096;
  Twin<bf16> table(rng.bf16s(static_cast<size_t>(table_rows) * H, -1.0f, 1.0f));
  Twin<int32_t> token(std::vector<int32_t>{rng.integer(1, table_rows - 1)});
  auto e = out_twin<bf16>(H);
  mtplab::ops::OneRow(cpu()).embed_rmsnorm(table.c.data(), token.c.data(), w.c.data(), e.c.data(), H, 1e-5f);
  mtplab::ops::OneRow(gpu()).embed_rmsnorm(table.g.data(), token.g.data(), w.g.data(), e.g.data(), H, 1e-5f);
  expect_bf16_close(e.from_gpu(), e.from_cpu(), "embed_rmsnorm");

  const int D = s.index_dim;
  Twin<bf16> xl(rng.bf16s(static_cast<size_t>(rows) * D, -2.0f, 4.0f));  // non-zero mean
  Twin<bf16> wl(rng.bf16s(D, 0.5f, 1.5f));
  Twin<bf16> bl(rng.bf16s(D, -0.5f, 0.5f));
  auto yl = out_twin<bf16>(static_cast<size_t>(rows) * D);
  cpu().layernorm(xl.c.data(), wl.c.data(), bl.c.data(), yl.c.data(), rows, D, 1e-6f);
  gpu().layernorm(xl.g.data(), wl.g.data(), bl.g.data(), yl.g.data(), rows, D, 1e-6f);
  expect_bf16_close(yl.from_gpu(), yl.from_cpu(), "layernorm");
}

// Row widths around the register-resident norm kernels' limits: multiples of 8 up to 8192 run
// the vector kernels (1..4 octets per thread), anything else the scalar ones, and so does a row
// that is not 16-byte aligned. Same tolerances as Norms.
/// The elements from `offset` on: the ones the ops wrote (those before stay poisoned).
std::vector<bf16> tail(const std::vector<bf16>& v, int offset) {
  return std::vector<bf16>(v.begin() + offset, v.end());
}

TEST(GpuNormWidths, VectorAndScalarPathsMatchTheCpu) {
  Rng rng(5);
  for (int n : {8, 100, 512, 2056, 6144, 8192, 8200, 10000}) {
    for (int offset : {0, 1}) {  // offset 1: every row pointer 2 bytes past a 16-byte boundary
      SCOPED_TRACE("n " + std::to_string(n) + " offset " + std::to_string(offset));
      const int rows = 2;
      const size_t len = static_cast<size_t>(rows) * n + offset;
      Twin<bf16> x(rng.bf16s(len, -3.0f, 3.0f));
      Twin<bf16> w(rng.bf16s(static_cast<size_t>(n) + offset, 0.5f, 1.5f));
      Twin<bf16> b(rng.bf16s(static_cast<size_t>(n) + offset, -0.5f, 0.5f));
      Twin<float> delta(rng.floats(static_cast<size_t>(n) + offset, -2.0f, 2.0f));
      auto y = out_twin<bf16>(len);
      cpu().rmsnorm(x.c.data() + offset, w.c.data() + offset, y.c.data() + offset, rows, n, 1e-5f);
      gpu().rmsnorm(x.g.data() + offset, w.g.data() + offset, y.g.data() + offset, rows, n, 1e-5f);
      expect_bf16_close(tail(y.from_gpu(), offset), tail(y.from_cpu(), offset), "rmsnorm");
      auto yl = out_twin<bf16>(len);
      cpu().layernorm(x.c.data() + offset, w.c.data() + offset, b.c.data() + offset, yl.c.data() + offset,
                      rows, n, 1e-6f);
      gpu().layernorm(x.g.data() + offset, w.g.data() + offset, b.g.data() + offset, yl.g.data() + offset,
                      rows, n, 1e-6f);
      expect_bf16_close(tail(yl.from_gpu(), offset), tail(yl.from_cpu(), offset), "layernorm");
      Twin<int32_t> token(std::vector<int32_t>{1});
      auto e = out_twin<bf16>(static_cast<size_t>(n) + offset);
      mtplab::ops::OneRow(cpu()).embed_rmsnorm(x.c.data() + offset, token.c.data(), w.c.data() + offset,
                                               e.c.data() + offset, n, 1e-5f);
      mtplab::ops::OneRow(gpu()).embed_rmsnorm(x.g.data() + offset, token.g.data(), w.g.data() + offset,
                                               e.g.data() + offset, n, 1e-5f);
      expect_bf16_close(tail(e.from_gpu(), offset), tail(e.from_cpu(), offset), "embed_rmsnorm");
      auto ry = out_twin<bf16>(static_cast<size_t>(n) + offset);
      auto rn = out_twin<bf16>(static_cast<size_t>(n) + offset);
      mtplab::ops::OneRow(cpu()).residual_add_rmsnorm(x.c.data() + offset, delta.c.data() + offset,
                                                      ry.c.data() + offset, w.c.data() + offset,
                                                      rn.c.data() + offset, n, 1e-5f);
      mtplab::ops::OneRow(gpu()).residual_add_rmsnorm(x.g.data() + offset, delta.g.data() + offset,
                                                      ry.g.data() + offset, w.g.data() + offset,
                                                      rn.g.data() + offset, n, 1e-5f);
      expect_bytes_equal(tail(ry.from_gpu(), offset), tail(ry.from_cpu(), offset), "residual_add_rmsnorm y");
      expect_bf16_close(tail(rn.from_gpu(), offset), tail(rn.from_cpu(), offset),
                        "residual_add_rmsnorm normed");
    }
  }
}

// ---- batched rows --------------------------------------------------------------------------------------

/// The batched norms on rows whose slots are `slots_h` (padded: -1) at positions pos_h, in
/// poisoned outputs: embed_rmsnorm_batch (a padded row's token -7: reading it would fault) into the
/// first half of rows of 2H, rmsnorm_strided (a row op: padded rows too) into the second half and
/// in place, residual_add_rmsnorm_rows in place; each against the CPU on every core.
void check_norms(Rng& rng, Twin<bf16>& table, Twin<bf16>& w, int V, int H,
                 const std::vector<int32_t>& slots_h, const std::vector<int32_t>& pos_h, int max_seq_rows,
                 const std::string& what) {
  const int B = static_cast<int>(slots_h.size());
  std::vector<int32_t> tok_h(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b)
    tok_h[static_cast<size_t>(b)] = slots_h[static_cast<size_t>(b)] < 0 ? -7 : rng.integer(0, V - 1);
  Twin<int32_t> slots(slots_h), tok(tok_h), pos(pos_h);
  // embed_rmsnorm_batch into the first half of each [e ; h] row of 2H.
  const int ld = 2 * H;
  auto y = out_twin<bf16>(static_cast<size_t>(B) * ld);
  EXPECT_EQ(kernels_of([&] {
              gpu().embed_rmsnorm_batch(table.g.data(), tok.g.data(),
                                        RowBatch{slots.g.data(), pos.g.data(), B, max_seq_rows}, w.g.data(),
                                        y.g.data(), ld, H, 1e-5f);
            }),
            1u);
  on_cpu_rows(B, [&](Backend& be, int b0, int b1) {
    be.embed_rmsnorm_batch(table.c.data(), tok.c.data() + b0,
                           RowBatch{slots.c.data() + b0, pos.c.data() + b0, b1 - b0, max_seq_rows},
                           w.c.data(), y.c.data() + static_cast<size_t>(b0) * ld, ld, H, 1e-5f);
  });
  expect_bf16_written(y.from_gpu(), y.from_cpu(), row_mask(B, ld, H, &slots_h),
                      what + ", embed_rmsnorm_batch");

  // rmsnorm_strided into the second half (a row op: padded rows too), then in place.
  const int ld_x = H + 8;
  Twin<bf16> x(rng.bf16s(static_cast<size_t>(B) * ld_x, -3.0f, 3.0f));
  EXPECT_EQ(kernels_of([&] {
              gpu().rmsnorm_strided(x.g.data(), ld_x, w.g.data(), y.g.data() + H, ld, B, H, 1e-5f);
            }),
            1u);
  on_cpu_rows(B, [&](Backend& be, int b0, int b1) {
    be.rmsnorm_strided(x.c.data() + static_cast<size_t>(b0) * ld_x, ld_x, w.c.data(),
                       y.c.data() + static_cast<size_t>(b0) * ld + H, ld, b1 - b0, H, 1e-5f);
  });
  std::vector<uint8_t> second(static_cast<size_t>(B) * ld, 0);
  for (int b = 0; b < B; ++b) std::fill_n(second.begin() + b * ld + H, H, 1);
  const auto both = [&] {
    auto m = row_mask(B, ld, H, &slots_h);
    for (size_t i = 0; i < m.size(); ++i) m[i] |= second[i];
    return m;
  }();
  expect_bf16_written(y.from_gpu(), y.from_cpu(), both, what + ", rmsnorm_strided");
  gpu().rmsnorm_strided(x.g.data(), ld_x, w.g.data(), x.g.data(), ld_x, B, H, 1e-5f);
  on_cpu_rows(B, [&](Backend& be, int b0, int b1) {
    bf16* xr = x.c.data() + static_cast<size_t>(b0) * ld_x;
    be.rmsnorm_strided(xr, ld_x, w.c.data(), xr, ld_x, b1 - b0, H, 1e-5f);
  });
  expect_bf16_written(x.from_gpu(), x.from_cpu(), row_mask(B, ld_x, H, nullptr),
                      what + ", rmsnorm_strided in place");

  // residual_add_rmsnorm_rows in place (x and y alias, as the block's residual does).
  const size_t all = static_cast<size_t>(B) * H;
  Twin<bf16> r(rng.bf16s(all, -2.0f, 2.0f));
  Twin<float> delta(rng.floats(all, -1.0f, 1.0f));
  auto normed = out_twin<bf16>(all);
  EXPECT_EQ(kernels_of([&] {
              gpu().residual_add_rmsnorm_rows(r.g.data(), delta.g.data(), r.g.data(), w.g.data(),
                                              normed.g.data(), B, H, 1e-5f);
            }),
            1u);
  on_cpu_rows(B, [&](Backend& be, int b0, int b1) {
    const size_t off = static_cast<size_t>(b0) * H;
    be.residual_add_rmsnorm_rows(r.c.data() + off, delta.c.data() + off, r.c.data() + off, w.c.data(),
                                 normed.c.data() + off, b1 - b0, H, 1e-5f);
  });
  // y = bf16(x + delta) is one IEEE add and one rounding on both: exact.
  expect_bytes_equal(r.from_gpu(), r.from_cpu(), what + ", residual_add_rmsnorm_rows y");
  expect_bf16_close(normed.from_gpu(), normed.from_cpu(), what + ", residual_add_rmsnorm_rows normed");
}

TEST_P(GpuNorm, Batched) {
  const Shape s = GetParam();
  Rng rng(801);
  const int H = s.hidden, V = 4096;  // a table of 4096 rows: the norm does not depend on the vocab
  Twin<bf16> table(rng.bf16s(static_cast<size_t>(V) * H, -2.0f, 2.0f));
  Twin<bf16> w(rng.bf16s(H, 0.5f, 1.5f));
  for (int B : kBatches) {
    const auto slots_h = make_slots(rng, B, B + 2);
    check_norms(rng, table, w, V, H, slots_h, std::vector<int32_t>(static_cast<size_t>(B), 0), 1,
                "B = " + std::to_string(B));
  }
}

// The batched norms over every ragged batch of ragged_layouts (gpu_batch_util.hpp): a sequence's
// rows share their slot at ascending positions; the norms are row ops, so each row as its own.
TEST_P(GpuNorm, RaggedRows) {
  const Shape s = GetParam();
  Rng rng(816);
  const int H = s.hidden, V = 4096;
  Twin<bf16> table(rng.bf16s(static_cast<size_t>(V) * H, -2.0f, 2.0f));
  Twin<bf16> w(rng.bf16s(H, 0.5f, 1.5f));
  for (const Ragged& r : ragged_layouts(rng, max_rows_for(s), s.hidden >= 4096))
    check_norms(rng, table, w, V, H, r.slot, r.pos, r.max_seq_rows, std::string(s.name) + ", " + r.name);
}

INSTANTIATE_TEST_SUITE_P(Models, GpuNorm, ::testing::ValuesIn(kShapes), shape_name);

}  // namespace
}  // namespace mtplab::ops::gputest
