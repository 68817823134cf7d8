// CUDA vs CPU: linear layers (GEMV per row, cuBLASLt batched, FP8), the fused draft head
// and the argmax family, elementwise ops and device scalars, at the tiny, small and glm5.3-flash
// shapes. Tolerances: gpu_test_util.hpp (BF16: 2 ulps + 1/4096 of the tensor's magnitude, most
// elements bit-identical); elementwise ops are one IEEE operation on both sides, so exact.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "ops/one_row.hpp"

namespace mtplab::ops::gputest {
namespace {

class GpuDense : public ::testing::TestWithParam<Shape> {};

/// The reference's argmax over `logits`: largest value, lowest index on ties.
ArgMax host_argmax(const std::vector<bf16>& logits, int64_t base) {
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (to_float(logits[i]) > to_float(logits[best])) best = i;
  return ArgMax{to_float(logits[best]), static_cast<int32_t>(base + static_cast<int64_t>(best))};
}

/// The GPU argmax must be exactly the argmax of the GPU's own logits; against the CPU it must
/// pick the same token unless the CPU's logit at the GPU's token is within the BF16 tolerance of
/// the CPU's maximum (a near-tie that summation order may break either way).
void expect_argmax_matches(const ArgMax& got, const ArgMax& want, const std::vector<bf16>& gpu_logits,
                           const std::vector<bf16>& cpu_logits, int64_t base, const std::string& what) {
  const ArgMax own = host_argmax(gpu_logits, base);
  EXPECT_EQ(got.index, own.index) << what << ": not the argmax of the kernel's own logits; " << seed_note();
  EXPECT_EQ(got.value, own.value) << what << "; " << seed_note();
  if (got.index != want.index) {
    const int64_t local = got.index - base;
    ASSERT_TRUE(local >= 0 && local < static_cast<int64_t>(cpu_logits.size()))
        << what << ": index " << got.index;
    const double cpu_at_gpu = to_float(cpu_logits[static_cast<size_t>(local)]);
    const double tol = 2 * bf16_ulp(want.value);
    EXPECT_LE(std::fabs(want.value - cpu_at_gpu), tol) << what << ": gpu token " << got.index << " vs cpu "
                                                       << want.index << " is not a near-tie; " << seed_note();
  }
}

struct LinearShape {
  const char* name;
  int n_out, k;
};

std::vector<LinearShape> projections(const Shape& s) {
  const int H = s.hidden;
  return {{"eh_proj", H, 2 * H},
          {"q_a", s.q_lora, H},
          {"q_b", s.n_heads * s.head_dim, s.q_lora},
          {"kv_a", s.kv_lora, H},
          {"kv_b", s.n_heads * 2 * s.head_dim, s.kv_lora},
          {"o_proj", H, s.n_heads * s.head_dim},
          {"indexer.wq_b", s.index_heads * s.index_dim, s.q_lora},
          {"indexer.wk", s.index_dim, H},
          {"indexer.weights_proj", s.index_heads, H},
          {"router", s.experts, H}};
}

TEST_P(GpuDense, Linear) {
  const Shape s = GetParam();
  Rng rng(2);
  for (const LinearShape& p : projections(s)) {
    SCOPED_TRACE(std::string(s.name) + " " + p.name);
    const int rows = 4;
    Twin<bf16> W(rng.bf16s(static_cast<size_t>(p.n_out) * p.k, -1.0f, 1.0f));
    Twin<bf16> X(rng.bf16s(static_cast<size_t>(rows) * p.k, -1.0f, 1.0f));
    for (int r : {1, rows}) {
      for (RowsMode mode : {RowsMode::per_row, RowsMode::batched}) {
        if (r == 1 && mode == RowsMode::batched) continue;
        const std::string what = std::string(p.name) + (mode == RowsMode::batched ? " batched" : " per_row") +
                                 " rows=" + std::to_string(r);
        auto Y = out_twin<bf16>(static_cast<size_t>(r) * p.n_out);
        cpu().linear(W.c.data(), X.c.data(), Y.c.data(), r, p.n_out, p.k, mode);
        gpu().linear(W.g.data(), X.g.data(), Y.g.data(), r, p.n_out, p.k, mode);
        expect_bf16_close(Y.from_gpu(), Y.from_cpu(), what);

        // fp32 out: no rounding, so only the summation order differs; bound it by 1e-5 relative
        // plus 1e-4 of the largest output (a k-term reordering moves a cancelling sum by ~k*2^-24
        // of the summed magnitudes, which for these k is below that).
        auto Yf = out_twin<float>(static_cast<size_t>(r) * p.n_out);
        cpu().linear_f32(W.c.data(), X.c.data(), Yf.c.data(), r, p.n_out, p.k, mode);
        gpu().linear_f32(W.g.data(), X.g.data(), Yf.g.data(), r, p.n_out, p.k, mode);
        expect_f32_close(Yf.from_gpu(), Yf.from_cpu(), what + " f32", 1e-5, 1e-4);
      }
    }
    if (p.k % 16 == 0) {
      Twin<fp8e4m3> W8(rng.fp8s(static_cast<size_t>(p.n_out) * p.k));
      std::vector<float> scale(static_cast<size_t>(p.n_out));
      for (auto& v : scale) v = rng.uniform(0.5f, 1.5f) / 448.0f;
      Twin<float> S(scale);
      for (int r : {1, 2}) {
        auto Y = out_twin<bf16>(static_cast<size_t>(r) * p.n_out);
        cpu().linear_fp8(W8.c.data(), S.c.data(), X.c.data(), Y.c.data(), r, p.n_out, p.k);
        gpu().linear_fp8(W8.g.data(), S.g.data(), X.g.data(), Y.g.data(), r, p.n_out, p.k);
        expect_bf16_close(Y.from_gpu(), Y.from_cpu(), std::string(p.name) + " fp8 rows=" + std::to_string(r));
      }
    }
  }
}

TEST_P(GpuDense, HeadArgmax) {
  const Shape s = GetParam();
  Rng rng(3);
  const int V = s.vocab, H = s.hidden;
  const int64_t base = 7 * static_cast<int64_t>(V);  // a vocab shard that does not start at 0
  std::vector<bf16> w_host = rng.bf16s(static_cast<size_t>(V) * H, -1.0f, 1.0f);
  Twin<bf16> W(w_host);
  Twin<bf16> x(rng.bf16s(H, -1.0f, 1.0f));
  auto logits = out_twin<bf16>(V);
  auto out = out_twin<ArgMax>(1);
  auto out_nologits = out_twin<ArgMax>(1);

  cpu().head_argmax(W.c.data(), nullptr, nullptr, x.c.data(), V, H, base, logits.c.data(), out.c.data());
  gpu().head_argmax(W.g.data(), nullptr, nullptr, x.g.data(), V, H, base, logits.g.data(), out.g.data());
  gpu().head_argmax(W.g.data(), nullptr, nullptr, x.g.data(), V, H, base, nullptr, out_nologits.g.data());
  const auto gl = logits.from_gpu(), cl = logits.from_cpu();
  expect_bf16_close(gl, cl, "head logits");
  const ArgMax got = out.from_gpu()[0], want = out.from_cpu()[0];
  expect_argmax_matches(got, want, gl, cl, base, "head_argmax bf16");
  const ArgMax got2 = out_nologits.from_gpu()[0];
  EXPECT_EQ(got2.index, got.index) << "head_argmax without logits; " << seed_note();
  EXPECT_EQ(got2.value, got.value);
  // The extras, written by the head's last block: the pair's key exactly as argmax_pack_key
  // packs it (on either backend: the key is a function of the pair) and the token.
  {
    auto out3 = out_twin<ArgMax>(1);
    auto key = out_twin<uint64_t>(1), packed = out_twin<uint64_t>(1);
    auto token = out_twin<int32_t>(1);
    gpu().head_argmax(W.g.data(), nullptr, nullptr, x.g.data(), V, H, base, nullptr, out3.g.data(),
                      HeadExtras{key.g.data(), token.g.data()});
    gpu().argmax_pack_key(out3.g.data(), packed.g.data());
    cpu().argmax_pack_key(out.c.data(), packed.c.data());
    const ArgMax got3 = out3.from_gpu()[0];
    EXPECT_EQ(got3.index, got.index) << "head_argmax with extras; " << seed_note();
    EXPECT_EQ(key.from_gpu()[0], packed.from_gpu()[0]) << "head key vs argmax_pack_key; " << seed_note();
    EXPECT_EQ(token.from_gpu()[0], got3.index) << seed_note();
    if (got.index == want.index && got.value == want.value) {
      EXPECT_EQ(key.from_gpu()[0], packed.from_cpu()[0]) << "GPU head key vs the CPU's; " << seed_note();
    }
  }

  // Plant an exact tie on the winner: copy its row to a lower row (or the lowest row to the top),
  // so two rows give bit-identical logits on each backend; the lower index must win.
  const int winner = static_cast<int>(want.index - base);
  const int twin_row = winner > 0 ? winner / 2 : V - 1;
  std::copy(w_host.begin() + static_cast<ptrdiff_t>(winner) * H,
            w_host.begin() + static_cast<ptrdiff_t>(winner + 1) * H,
            w_host.begin() + static_cast<ptrdiff_t>(twin_row) * H);
  W.set(w_host);
  logits.poison(0xFF);
  out.poison(0xFF);
  cpu().head_argmax(W.c.data(), nullptr, nullptr, x.c.data(), V, H, base, logits.c.data(), out.c.data());
  gpu().head_argmax(W.g.data(), nullptr, nullptr, x.g.data(), V, H, base, logits.g.data(), out.g.data());
  const ArgMax tie_cpu = out.from_cpu()[0], tie_gpu = out.from_gpu()[0];
  EXPECT_EQ(tie_cpu.index, base + std::min(winner, twin_row)) << "reference tie rule; " << seed_note();
  expect_argmax_matches(tie_gpu, tie_cpu, logits.from_gpu(), logits.from_cpu(), base,
                        "head_argmax planted tie");

  // FP8 head with per-row scales.
  w_host.clear();
  w_host.shrink_to_fit();
  Twin<fp8e4m3> W8(rng.fp8s(static_cast<size_t>(V) * H));
  std::vector<float> scale(static_cast<size_t>(V));
  for (auto& v : scale) v = rng.uniform(0.5f, 1.5f) / 448.0f;
  Twin<float> S(scale);
  logits.poison(0xFF);
  out.poison(0xFF);
  cpu().head_argmax(nullptr, W8.c.data(), S.c.data(), x.c.data(), V, H, base, logits.c.data(), out.c.data());
  auto key8 = out_twin<uint64_t>(1), packed8 = out_twin<uint64_t>(1);
  auto token8 = out_twin<int32_t>(1);
  gpu().head_argmax(nullptr, W8.g.data(), S.g.data(), x.g.data(), V, H, base, logits.g.data(), out.g.data(),
                    HeadExtras{key8.g.data(), token8.g.data()});
  const auto gl8 = logits.from_gpu(), cl8 = logits.from_cpu();
  expect_bf16_close(gl8, cl8, "fp8 head logits");
  expect_argmax_matches(out.from_gpu()[0], out.from_cpu()[0], gl8, cl8, base, "head_argmax fp8");
  gpu().argmax_pack_key(out.g.data(), packed8.g.data());
  EXPECT_EQ(key8.from_gpu()[0], packed8.from_gpu()[0]) << "FP8 head key vs argmax_pack_key; " << seed_note();
  EXPECT_EQ(token8.from_gpu()[0], out.from_gpu()[0].index) << seed_note();
}

TEST_P(GpuDense, ArgmaxFamily) {
  const Shape s = GetParam();
  Rng rng(4);
  const int V = s.vocab;
  std::vector<bf16> v = rng.bf16s(V, -8.0f, 8.0f);
  // Plant ties of the maximum at random places: the lowest must win, exactly as on the CPU.
  const bf16 top = to_bf16(9.0f);
  for (int t = 0; t < 4; ++t) v[static_cast<size_t>(rng.integer(0, V - 1))] = top;
  Twin<bf16> x(v);
  auto out = out_twin<ArgMax>(1);
  cpu().argmax(x.c.data(), V, 123, out.c.data());
  gpu().argmax(x.g.data(), V, 123, out.g.data());
  expect_bytes_equal(out.from_gpu(), out.from_cpu(), "argmax with planted ties");

  // Pack / unpack / pick over pairs with equal values (+0 and -0 included) and negatives.
  const int n = 16;
  std::vector<ArgMax> pairs(n);
  for (int i = 0; i < n; ++i) {
    const int kind = rng.integer(0, 3);
    const float value = kind == 0 ? 0.0f : kind == 1 ? -0.0f : kind == 2 ? -3.5f : rng.uniform(-4.0f, 4.0f);
    pairs[static_cast<size_t>(i)] = ArgMax{value, rng.integer(0, 1 << 20)};
  }
  Twin<ArgMax> p(pairs);
  auto keys = out_twin<uint64_t>(n);
  auto tokens = out_twin<int32_t>(n);
  for (int i = 0; i < n; ++i) {
    cpu().argmax_pack_key(p.c.data() + i, keys.c.data() + i);
    gpu().argmax_pack_key(p.g.data() + i, keys.g.data() + i);
    cpu().argmax_unpack_key(keys.c.data() + i, tokens.c.data() + i);
    gpu().argmax_unpack_key(keys.g.data() + i, tokens.g.data() + i);
  }
  expect_bytes_equal(keys.from_gpu(), keys.from_cpu(), "argmax_pack_key");
  expect_bytes_equal(tokens.from_gpu(), tokens.from_cpu(), "argmax_unpack_key");
  auto pick = out_twin<int32_t>(1);
  cpu().argmax_pick(p.c.data(), n, pick.c.data());
  gpu().argmax_pick(p.g.data(), n, pick.g.data());
  expect_bytes_equal(pick.from_gpu(), pick.from_cpu(), "argmax_pick");
}

TEST_P(GpuDense, ElementwiseExact) {
  const Shape s = GetParam();
  Rng rng(5);
  const int n = s.hidden;
  Twin<bf16> a(rng.bf16s(n, -4.0f, 4.0f));
  Twin<bf16> b(rng.bf16s(n, -4.0f, 4.0f));
  Twin<float> d(rng.floats(n, -4.0f, 4.0f));
  auto y = out_twin<bf16>(n);
  cpu().residual_add(a.c.data(), d.c.data(), y.c.data(), n);
  gpu().residual_add(a.g.data(), d.g.data(), y.g.data(), n);
  expect_bytes_equal(y.from_gpu(), y.from_cpu(), "residual_add");
  y.poison(0xFF);
  cpu().add(a.c.data(), b.c.data(), y.c.data(), n);
  gpu().add(a.g.data(), b.g.data(), y.g.data(), n);
  expect_bytes_equal(y.from_gpu(), y.from_cpu(), "add");
  y.poison(0xFF);
  std::vector<float> wide = rng.floats(n, -1.0f, 1.0f);
  for (auto& v : wide) v = std::ldexp(v, rng.integer(-30, 30));
  Twin<float> f(wide);
  cpu().to_bf16(f.c.data(), y.c.data(), n);
  gpu().to_bf16(f.g.data(), y.g.data(), n);
  expect_bytes_equal(y.from_gpu(), y.from_cpu(), "to_bf16");

  Twin<float> acc(rng.floats(n, -4.0f, 4.0f));
  cpu().accumulate_f32(d.c.data(), acc.c.data(), n);
  gpu().accumulate_f32(d.g.data(), acc.g.data(), n);
  cpu().scale_f32(acc.c.data(), 0.3f, n);
  gpu().scale_f32(acc.g.data(), 0.3f, n);
  expect_bytes_equal(acc.from_gpu(), acc.from_cpu(), "accumulate_f32 then scale_f32");

  Twin<int32_t> pos(std::vector<int32_t>{rng.integer(0, 1 << 20)});
  auto next = out_twin<int32_t>(1);
  cpu().add_i32(pos.c.data(), 5, next.c.data());
  gpu().add_i32(pos.g.data(), 5, next.g.data());
  expect_bytes_equal(next.from_gpu(), next.from_cpu(), "add_i32");
}

INSTANTIATE_TEST_SUITE_P(Models, GpuDense, ::testing::ValuesIn(kShapes), shape_name);

}  // namespace
}  // namespace mtplab::ops::gputest
