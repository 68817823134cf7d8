// CUDA vs CPU: linear layers (GEMV per row, cuBLASLt batched, FP8), the fused draft head
// and the argmax family, elementwise ops and device scalars, at the tiny, small and glm5.3-flash
// shapes. Tolerances: gpu_test_util.hpp (BF16: 2 ulps + 1/4096 of the tensor's magnitude, most
// elements bit-identical); elementwise ops are one IEEE operation on both sides, so exact.
//
// Batched rows (kBatches rows, padded rows among them whose outputs keep their poison; the rules of
// test_gpu_batch.cpp's comment):
// - Argmax over logits the backends computed themselves (the head): the GPU's pick must be
//   exactly the argmax of its own logits (and its key / token exactly the pair's); against the
//   CPU it may differ only at a near-tie, the CPU's logit at the GPU's pick within 2 ulps of the
//   CPU's maximum. Near-ties are counted and printed, never ignored silently. The argmax family on
//   identical inputs is exact.
// - Batched linears (rows_linear = gemv, and cuBLASLt): Linear's tolerances, and a row's bits at
//   B < 16 equal to its bits at B = 16 (BatchedLinearsRowsGemv).
// - The FP8 head's multi-row GEMV (head_gemm = gemv, B = 1 .. 4): the head's tolerances against
//   the CPU, and a row's logits and pick at B = 1, 2 and 3 bit-identical to its own at B = 4
//   (HeadGemvRowBitsDoNotDependOnTheBatch); exact ties to the lowest index, nothing of a padded
//   row written, graph replays equal to eager launches. The FP8 head's FP16 operands (resident
//   MMA, wgmma) and its E4M3 parts under cuBLASLt (head_gemm = cublaslt): a row scaled by 2^e
//   gives its logits times 2^e bit for bit; under cuBLASLt a row with a non-finite entry gives NaN
//   logits and leaves the other rows' bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "gpu_batch_util.hpp"
#include "gpu_test_util.hpp"
#include "ops/cuda/dense.hpp"
#include "ops/cuda/dispatch.hpp"
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

// ---- batched rows: the head and the argmax family --------------------------------------------------------

TEST_P(GpuDense, HeadArgmaxBatch) {
  const Shape s = GetParam();
  Rng rng(802);
  const int V = s.vocab, H = s.hidden;
  const int64_t base = 3 * static_cast<int64_t>(V);  // a vocab shard that does not start at 0
  const Big<bf16> W = big_bf16(static_cast<size_t>(V) * H, -1.0f, 1.0f, 8021);
  const Big<fp8e4m3> W8 = big_fp8(static_cast<size_t>(V) * H, 8022);
  std::vector<float> scale_h(static_cast<size_t>(V));
  for (auto& v : scale_h) v = rng.uniform(0.5f, 1.5f) / 448.0f;
  Twin<float> scale(scale_h);
  const int ld = V + 24;  // entries V .. ld of a logits row are not written
  int near_ties = 0, compared = 0;
  // Five paths: the fused MMA kernel with BF16 and FP8 rows, the cuBLASLt GEMM + argmax
  // (KernelPolicy::head_gemm = cublaslt, BF16 only), the FP8 multi-row GEMV (head_gemm = gemv)
  // at the batch sizes it takes, 1 .. 4 rows (B = 1, 2 and 3 every row live, B = 4 with row 2
  // padded), and the FP8 wgmma kernel. cuBLASLt and the GEMV sum in other orders than the CPU, so their
  // logits are compared within the usual BF16 tolerance and their picks at near-ties, as the MMA path's are.
  struct Path {
    bool fp8;
    HeadGemm gemm;
    std::vector<int> batches;
  };
  const std::vector<int> all_batches(std::begin(kBatches), std::end(kBatches));
  // cuBLASLt also past 128 rows (a verification's rows: launches of 256, here 256 + 44), where the
  // CPU twin is affordable (not at the flash shape's 154880 x 4096).
  std::vector<int> lt_batches = all_batches;
  if (s.hidden < 4096) lt_batches.push_back(300);
  const KernelPolicy before = gpu().kernel_policy();
  for (const Path& path :
       {Path{false, HeadGemm::mma, all_batches}, Path{false, HeadGemm::cublaslt, lt_batches},
        Path{true, HeadGemm::mma, all_batches}, Path{true, HeadGemm::gemv, {1, 2, 3, 4}},
        Path{true, HeadGemm::wgmma, all_batches}, Path{true, HeadGemm::cublaslt, lt_batches}}) {
    const bool fp8 = path.fp8;
    KernelPolicy policy = before;
    policy.head_gemm = path.gemm;
    gpu().set_kernel_policy(policy);
    const bool lt = path.gemm == HeadGemm::cublaslt;
    const bool rows_gemv = path.gemm == HeadGemm::gemv;
    const bool wgmma = path.gemm == HeadGemm::wgmma;
    if (wgmma && !ops::cuda::have_wgmma()) {
      std::printf("[gpu-dense] %s: FP8 head wgmma not checked: this build has no sm_90a device code\n",
                  s.name);
      continue;
    }
    const bf16* Wc = fp8 ? nullptr : W.c.data();
    const bf16* Wg = fp8 ? nullptr : W.g.data();
    const fp8e4m3* W8c = fp8 ? W8.c.data() : nullptr;
    const fp8e4m3* W8g = fp8 ? W8.g.data() : nullptr;
    const float* Sc = fp8 ? scale.c.data() : nullptr;
    const float* Sg = fp8 ? scale.g.data() : nullptr;
    // The path's batches, then the ragged batches (ragged_layouts: a sequence's rows share a slot)
    // up to the rows one fused launch takes (cuBLASLt: all of them), where the CPU twin is
    // affordable (not at the flash shape's 154880 x 4096); the multi-row GEMV keeps its 1 .. 4.
    std::vector<std::pair<std::string, std::vector<int32_t>>> row_sets;
    for (int B : path.batches) {
      auto slots_h = make_slots(rng, B, B);
      if (rows_gemv) {  // every row live but row 2 at B = 4 (make_slots pads row 1 and the last)
        std::iota(slots_h.begin(), slots_h.end(), 0);
        rng.shuffle(slots_h);
        if (B == 4) slots_h[2] = -1;
      }
      row_sets.emplace_back("B = " + std::to_string(B), slots_h);
    }
    if (!rows_gemv && s.hidden < 4096) {
      for (const Ragged& r : ragged_layouts(rng, max_rows_for(s), false))
        if (lt || r.rows() <= cuda::kMaxBatchRows) row_sets.emplace_back(r.name, r.slot);
    }
    for (const auto& [rows_name, slots_h] : row_sets) {
      const int B = static_cast<int>(slots_h.size());
      const std::string what = std::string(rows_gemv   ? "head_argmax_batch FP8 gemv"
                                           : wgmma     ? "head_argmax_batch FP8 wgmma"
                                           : fp8 && lt ? "head_argmax_batch FP8 cublaslt"
                                           : fp8       ? "head_argmax_batch FP8"
                                           : lt        ? "head_argmax_batch BF16 cublaslt"
                                                       : "head_argmax_batch BF16") +
                               ", " + rows_name;
      Twin<int32_t> slots(slots_h);
      std::vector<bf16> x_h = rng.bf16s(static_cast<size_t>(B) * H, -1.0f, 1.0f);
      for (int b = 0; b < B; ++b)  // a padded row's input is NaN: it would show in a logit if read
        if (slots_h[static_cast<size_t>(b)] < 0)
          std::fill_n(x_h.begin() + static_cast<ptrdiff_t>(b) * H, H, bf16{0xffff});
      Twin<bf16> x(x_h);
      auto logits = out_twin<bf16>(static_cast<size_t>(B) * ld);
      auto out = out_twin<ArgMax>(B);
      auto key = out_twin<uint64_t>(B);
      auto token = out_twin<int32_t>(B);
      const uint64_t launches = kernels_of([&] {
        gpu().head_argmax_batch(Wg, W8g, Sg, x.g.data(), RowBatch{slots.g.data(), nullptr, B}, V, H, base,
                                logits.g.data(), ld, out.g.data(), HeadExtras{key.g.data(), token.g.data()});
      });
      if (lt) {
        // The backend counts the launches it makes itself: the argmax (one launch, or two when
        // the rows are split into parts) and the finishing launch (cuBLASLt's GEMM kernels are not
        // among them); FP8 rows also the split of x into E4M3 parts and the combine of the parts.
        // Past kMaxBatchRows rows, all of that once per launch of kHeadLtWideRows rows.
        const uint64_t own = fp8 ? 2u : 0u;
        const uint64_t chunks =
            B > cuda::kMaxBatchRows
                ? static_cast<uint64_t>((B + cuda::kHeadLtWideRows - 1) / cuda::kHeadLtWideRows)
                : 1u;
        EXPECT_GE(launches, chunks * (2u + own)) << what << ": the argmax and the finishing launch";
        EXPECT_LE(launches, chunks * (3u + own))
            << what << ": the argmax (at most two launches) and the finishing launch";
      } else if (wgmma) {
        EXPECT_EQ(launches, 2u) << what << ": x packed, then the GEMM with its argmax";
      } else {
        EXPECT_EQ(launches, 1u) << what;
      }
      on_cpu_rows(B, [&](Backend& be, int b0, int b1) {
        be.head_argmax_batch(Wc, W8c, Sc, x.c.data() + static_cast<size_t>(b0) * H,
                             RowBatch{slots.c.data() + b0, nullptr, b1 - b0}, V, H, base,
                             logits.c.data() + static_cast<size_t>(b0) * ld, ld, out.c.data() + b0,
                             HeadExtras{key.c.data() + b0, token.c.data() + b0});
      });
      const auto gl = logits.from_gpu(), cl = logits.from_cpu();
      // FP8 rows on cuBLASLt: the tensor core's FP8 sums are not fp32 sums in another order. Its
      // MMA adds a group's products aligned to the largest and keeps about 14 bits below it before
      // each promotion to fp32 (docs/kernels.md, "The head"), so a logit is off by
      // up to ~2^-12 of the sums it passed through: measured at most 1.01 / 4096 of the largest
      // |logit| and 89% of the logits bit-identical at the three shapes. Held to 1/1024 of the
      // largest and 80% identical (the fused kernels keep the default 1/4096 and 90%).
      const Tolerance tol = fp8 && lt ? Tolerance{2.0, 1.0 / 1024, 0.8} : Tolerance{};
      expect_bf16_written(gl, cl, row_mask(B, ld, V, &slots_h), what + " logits", tol);
      const auto go = out.from_gpu(), co = out.from_cpu();
      const auto gk = key.from_gpu();
      const auto gt = token.from_gpu();
      const auto one = row_mask(B, 1, 1, &slots_h);
      expect_outside_unchanged(go, co, one, what + " out");
      expect_outside_unchanged(gk, key.from_cpu(), one, what + " key");
      expect_outside_unchanged(gt, token.from_cpu(), one, what + " token");
      for (int b = 0; b < B; ++b) {
        if (slots_h[static_cast<size_t>(b)] < 0) continue;
        const bf16* row = gl.data() + static_cast<size_t>(b) * ld;
        int best = 0;
        for (int i = 1; i < V; ++i)
          if (to_float(row[i]) > to_float(row[best])) best = i;
        const ArgMax& g = go[static_cast<size_t>(b)];
        EXPECT_EQ(g.index, base + best)
            << what << " row " << b << ": not the argmax of the kernel's own logits; " << seed_note();
        EXPECT_EQ(g.value, to_float(row[best])) << what << " row " << b;
        EXPECT_EQ(gk[static_cast<size_t>(b)], host_key(g))
            << what << " row " << b << ": key is not the pair's";
        EXPECT_EQ(gt[static_cast<size_t>(b)], g.index) << what << " row " << b;
        ++compared;
        const ArgMax& c = co[static_cast<size_t>(b)];
        if (g.index == c.index) continue;
        const double cpu_at_gpu =
            to_float(cl[static_cast<size_t>(b) * ld + static_cast<size_t>(g.index - base)]);
        const bool near = std::fabs(c.value - cpu_at_gpu) <= 2 * bf16_ulp(c.value);
        EXPECT_TRUE(near) << what << " row " << b << ": gpu token " << g.index << " vs cpu " << c.index
                          << " is not a near-tie (cpu logits " << c.value << " vs " << cpu_at_gpu << "); "
                          << seed_note();
        near_ties += near;
      }
      // Without logits and extras: the same pairs (the same sums; only the epilogue's stores differ).
      auto out2 = out_twin<ArgMax>(B);
      gpu().head_argmax_batch(Wg, W8g, Sg, x.g.data(), RowBatch{slots.g.data(), nullptr, B}, V, H, base,
                              nullptr, 0, out2.g.data());
      expect_bytes_equal(masked(out2.from_gpu(), one), masked(go, one), what + " without logits");
      expect_outside_unchanged(out2.from_gpu(), out2.from_cpu(), one, what + " without logits, padded rows");
    }
  }
  gpu().set_kernel_policy(before);
  std::printf("[gpu-dense] %s head: %d of %d rows' picks differ from the CPU at near-ties\n", s.name,
              near_ties, compared);
}

// The FP8 head under head_gemm = gemv (the multi-row GEMV at 1 .. 4 rows): a row's logits, pair,
// key and token are bit for bit the same at B = 1, 2, 3 and 4 (its sums depend on k only, never on
// the other rows); automatic takes the same kernel at 1 .. 3 rows (the same bytes) and cuBLASLt's
// FP8 GEMM at 4 (the cublaslt bytes). And they are the
// GEMV's, not the MMA kernel's: from the small shape up (>= 155k logits, each a sum of >= 1024
// products) the two summation orders round dozens to hundreds of logits differently, so equal
// bytes would mean the GEMV never ran.
TEST_P(GpuDense, HeadGemvRowBitsDoNotDependOnTheBatch) {
  const Shape s = GetParam();
  Rng rng(804);
  const int V = s.vocab, H = s.hidden, kRows = 4;
  const int64_t base = 2 * static_cast<int64_t>(V);
  const Big<fp8e4m3> W8 = big_fp8(static_cast<size_t>(V) * H, 8041);
  std::vector<float> scale_h(static_cast<size_t>(V));
  for (auto& v : scale_h) v = rng.uniform(0.5f, 1.5f) / 448.0f;
  Twin<float> scale(scale_h);
  Twin<bf16> x(rng.bf16s(static_cast<size_t>(kRows) * H, -1.0f, 1.0f));
  std::vector<int32_t> slots_h(kRows);
  std::iota(slots_h.begin(), slots_h.end(), 0);
  rng.shuffle(slots_h);
  Twin<int32_t> slots(slots_h);
  struct Result {
    std::vector<bf16> logits;
    std::vector<ArgMax> out;
    std::vector<uint64_t> key;
    std::vector<int32_t> token;
  };
  auto run = [&](HeadGemm gemm, int B) {
    PolicyScope scope([gemm](KernelPolicy& p) { p.head_gemm = gemm; });
    auto logits = out_twin<bf16>(static_cast<size_t>(B) * V);
    auto out = out_twin<ArgMax>(B);
    auto key = out_twin<uint64_t>(B);
    auto token = out_twin<int32_t>(B);
    const uint64_t launches = kernels_of([&] {
      gpu().head_argmax_batch(nullptr, W8.g.data(), scale.g.data(), x.g.data(),
                              RowBatch{slots.g.data(), nullptr, B}, V, H, base, logits.g.data(), V,
                              out.g.data(), HeadExtras{key.g.data(), token.g.data()});
    });
    if (gemm == HeadGemm::cublaslt || (gemm == HeadGemm::automatic && B >= 4)) {
      EXPECT_GE(launches, 4u) << "FP8 head, head_gemm " << to_string(gemm) << ", B = " << B
                              << ": split, combine, argmax, finish";
    } else {
      EXPECT_EQ(launches, 1u) << "FP8 head, head_gemm " << to_string(gemm) << ", B = " << B;
    }
    return Result{logits.from_gpu(), out.from_gpu(), key.from_gpu(), token.from_gpu()};
  };
  auto first = []<typename T>(const std::vector<T>& v, size_t n) {
    return std::vector<T>(v.begin(), v.begin() + n);
  };
  const Result ref = run(HeadGemm::gemv, kRows);
  for (int b = 0; b < kRows; ++b) {
    EXPECT_EQ(ref.key[static_cast<size_t>(b)], host_key(ref.out[static_cast<size_t>(b)])) << "row " << b;
    EXPECT_EQ(ref.token[static_cast<size_t>(b)], ref.out[static_cast<size_t>(b)].index) << "row " << b;
  }
  for (const int B : {1, 2, 3}) {
    const Result r = run(HeadGemm::gemv, B);
    const std::string what = "gemv head at B = " + std::to_string(B) + " vs the same rows at B = 4";
    expect_bytes_equal(r.logits, first(ref.logits, static_cast<size_t>(B) * V), what + ": logits");
    expect_bytes_equal(r.out, first(ref.out, static_cast<size_t>(B)), what + ": pairs");
    expect_bytes_equal(r.key, first(ref.key, static_cast<size_t>(B)), what + ": keys");
    expect_bytes_equal(r.token, first(ref.token, static_cast<size_t>(B)), what + ": tokens");
  }
  for (const int B : {1, 2, 3}) {
    const Result a = run(HeadGemm::automatic, B);
    const std::string what = "automatic head at B = " + std::to_string(B) + " vs gemv";
    expect_bytes_equal(a.logits, first(ref.logits, static_cast<size_t>(B) * V), what + ": logits");
    expect_bytes_equal(a.out, first(ref.out, static_cast<size_t>(B)), what + ": pairs");
  }
  const Result mma = run(HeadGemm::mma, kRows);
  {
    const Result lt = run(HeadGemm::cublaslt, kRows);
    const Result a = run(HeadGemm::automatic, kRows);
    expect_bytes_equal(a.logits, lt.logits, "automatic head at B = 4 vs cublaslt: logits");
    expect_bytes_equal(a.out, lt.out, "automatic head at B = 4 vs cublaslt: pairs");
  }
  if (H >= 1024) {
    size_t differ = 0;
    for (size_t i = 0; i < mma.logits.size(); ++i) differ += mma.logits[i].bits != ref.logits[i].bits;
    EXPECT_GT(differ, 0u) << "gemv and mma heads gave the same " << mma.logits.size()
                          << " logits: the gemv path did not run; " << seed_note();
    std::printf("[gpu-dense] %s FP8 head, B = 4: %zu of %zu logits differ between gemv and mma\n", s.name,
                differ, mma.logits.size());
  }
}

// The FP8 head under head_gemm = wgmma: a row's logits and pair are bit for bit the same whatever
// the batch around it and whichever N the kernel runs at (B = 3: 16 columns, 20: 32, 50: 64, 128:
// 128): a logit is the dot product of its own W row and x row in the wgmma's k order, and the
// row's FP16 scaling (batch::f16_row_shift) depends on the row alone. Two launches each time (x
// packed, then the GEMM): the wgmma kernel ran. Its bytes against the mma.sync kernel's are
// printed (the same products and k order: on an H200 they have come out equal).
TEST_P(GpuDense, HeadWgmmaRowBitsDoNotDependOnTheBatch) {
  if (!ops::cuda::have_wgmma()) GTEST_SKIP() << "this build has no sm_90a device code";
  const Shape s = GetParam();
  Rng rng(806);
  const int V = s.vocab, H = s.hidden, kRows = 128;
  const Big<fp8e4m3> W8 = big_fp8(static_cast<size_t>(V) * H, 8061);
  std::vector<float> scale_h(static_cast<size_t>(V));
  for (auto& v : scale_h) v = rng.uniform(0.5f, 1.5f) / 448.0f;
  Twin<float> scale(scale_h);
  Twin<bf16> x(rng.bf16s(static_cast<size_t>(kRows) * H, -1.0f, 1.0f));
  std::vector<int32_t> slots_h(kRows);
  std::iota(slots_h.begin(), slots_h.end(), 0);
  Twin<int32_t> slots(slots_h);
  auto run = [&](HeadGemm gemm, int B) {
    PolicyScope scope([gemm](KernelPolicy& p) { p.head_gemm = gemm; });
    auto logits = out_twin<bf16>(static_cast<size_t>(B) * V);
    auto out = out_twin<ArgMax>(B);
    const uint64_t launches = kernels_of([&] {
      gpu().head_argmax_batch(nullptr, W8.g.data(), scale.g.data(), x.g.data(),
                              RowBatch{slots.g.data(), nullptr, B}, V, H, 0, logits.g.data(), V,
                              out.g.data());
    });
    if (gemm == HeadGemm::wgmma) {
      EXPECT_EQ(launches, 2u) << "wgmma head at B = " << B << ": x packed, then the GEMM";
    }
    return std::make_pair(logits.from_gpu(), out.from_gpu());
  };
  const auto ref = run(HeadGemm::wgmma, kRows);
  for (const int B : {3, 20, 50}) {
    const auto r = run(HeadGemm::wgmma, B);
    const std::string what = "wgmma head at B = " + std::to_string(B) + " vs the same rows at B = 128";
    expect_bytes_equal(r.first,
                       std::vector<bf16>(ref.first.begin(), ref.first.begin() + static_cast<size_t>(B) * V),
                       what + ": logits");
    expect_bytes_equal(r.second, std::vector<ArgMax>(ref.second.begin(), ref.second.begin() + B),
                       what + ": pairs");
  }
  const auto mma = run(HeadGemm::mma, 20);
  size_t differ = 0;
  for (size_t i = 0; i < mma.first.size(); ++i) differ += mma.first[i].bits != ref.first[i].bits;
  std::printf("[gpu-dense] %s FP8 head, B = 20: %zu of %zu logits differ between wgmma and mma\n", s.name,
              differ, mma.first.size());
}

// The FP8 head on cuBLASLt (head_gemm = cublaslt): a row with one infinite entry has no finite
// scale, so every one of its logits is NaN (E4M3 has no infinity: its parts are NaN), a NaN entry
// makes its row's logits NaN, as in the other kernels, and the other rows keep their bytes from the
// same batch without the bad entries.
TEST(GpuDenseHead, Fp8CublasltNonFiniteRowsGiveNanLogitsAndLeaveTheOthers) {
  Rng rng(809);
  const int n = 2000, k = 256, B = 4;
  std::vector<fp8e4m3> W_h(static_cast<size_t>(n) * k);
  for (auto& w : W_h) w = to_fp8e4m3(rng.uniform(-1.0f, 1.0f));
  std::vector<float> scale_h(static_cast<size_t>(n), 1.0f / 448.0f);
  Twin<fp8e4m3> W(W_h);
  Twin<float> scale(scale_h);
  std::vector<bf16> x_h = rng.bf16s(static_cast<size_t>(B) * k, -1.0f, 1.0f);
  std::vector<int32_t> slots_h(static_cast<size_t>(B));
  std::iota(slots_h.begin(), slots_h.end(), 0);
  Twin<int32_t> slots(slots_h);
  PolicyScope scope([](KernelPolicy& p) { p.head_gemm = HeadGemm::cublaslt; });
  auto run = [&](const std::vector<bf16>& xv) {
    Twin<bf16> x(xv);
    auto logits = out_twin<bf16>(static_cast<size_t>(B) * n);
    auto out = out_twin<ArgMax>(B);
    gpu().head_argmax_batch(nullptr, W.g.data(), scale.g.data(), x.g.data(),
                            RowBatch{slots.g.data(), nullptr, B}, n, k, 0, logits.g.data(), n, out.g.data());
    return logits.from_gpu();
  };
  const auto clean = run(x_h);
  for (size_t i = 0; i < clean.size(); ++i) ASSERT_TRUE(std::isfinite(to_float(clean[i]))) << "logit " << i;
  std::vector<bf16> bad = x_h;
  bad[1 * k + 17] = to_bf16(INFINITY);
  bad[3 * k + 200] = bf16{0x7fc0};  // NaN
  const auto got = run(bad);
  for (int b = 0; b < B; ++b) {
    size_t wrong = 0;
    for (int v = 0; v < n; ++v) {
      const size_t i = static_cast<size_t>(b) * n + v;
      wrong += b == 1 || b == 3 ? !std::isnan(to_float(got[i])) : got[i].bits != clean[i].bits;
    }
    EXPECT_EQ(wrong, 0u) << "row " << b
                         << (b == 1   ? " (an infinite entry): logits not NaN"
                             : b == 3 ? " (a NaN entry): logits not NaN"
                                      : ": logits differ from the batch without the bad entries");
  }
}

// The FP8 head's FP16 operands (the resident MMA kernel at up to 16 rows, the wgmma kernel): every
// batch row is one x row times 2^e, e from -60 to 60, so each row gets another shift. The shift is
// taken out again exactly, so row b's logits are row 0's times 2^(e_b - e_0) bit for bit (BF16
// holds them all: |logit| < 2^7 before the scaling) and every row picks row 0's token. A shift
// applied to the wrong row, or not taken out, breaks it.
TEST_P(GpuDense, HeadFp16OperandsScaleExactly) {
  const Shape s = GetParam();
  Rng rng(807);
  const int V = s.vocab, H = s.hidden;
  const Big<fp8e4m3> W8 = big_fp8(static_cast<size_t>(V) * H, 8071);
  std::vector<float> scale_h(static_cast<size_t>(V));
  for (auto& v : scale_h) v = rng.uniform(0.5f, 1.5f) / 448.0f;
  Twin<float> scale(scale_h);
  const std::vector<bf16> x0 = rng.bf16s(static_cast<size_t>(H), -1.0f, 1.0f);
  const int exps[] = {0, -60, -13, 5, 40, 1, -1, 60, 17, -33};
  for (const HeadGemm gemm : {HeadGemm::mma, HeadGemm::wgmma, HeadGemm::cublaslt}) {
    if (gemm == HeadGemm::wgmma && !ops::cuda::have_wgmma()) continue;
    PolicyScope scope([gemm](KernelPolicy& p) { p.head_gemm = gemm; });
    for (const int B : {10, 16, 20}) {
      if (gemm == HeadGemm::mma && B > 16) continue;  // the ring kernel (BF16 operands) from 17 rows
      const std::string what = std::string(to_string(gemm)) + " head at B = " + std::to_string(B);
      std::vector<bf16> x_h(static_cast<size_t>(B) * H);
      std::vector<int> e(static_cast<size_t>(B));
      for (int b = 0; b < B; ++b) {
        e[static_cast<size_t>(b)] = exps[b % 10];
        for (int i = 0; i < H; ++i)
          x_h[static_cast<size_t>(b) * H + i] =
              to_bf16(std::ldexp(to_float(x0[static_cast<size_t>(i)]), exps[b % 10]));
      }
      Twin<bf16> x(x_h);
      std::vector<int32_t> slots_h(static_cast<size_t>(B));
      std::iota(slots_h.begin(), slots_h.end(), 0);
      Twin<int32_t> slots(slots_h);
      auto logits = out_twin<bf16>(static_cast<size_t>(B) * V);
      auto out = out_twin<ArgMax>(B);
      gpu().head_argmax_batch(nullptr, W8.g.data(), scale.g.data(), x.g.data(),
                              RowBatch{slots.g.data(), nullptr, B}, V, H, 0, logits.g.data(), V,
                              out.g.data());
      const auto gl = logits.from_gpu();
      const auto go = out.from_gpu();
      for (int b = 1; b < B; ++b) {
        size_t bad = 0, first = 0;
        for (size_t v = 0; v < static_cast<size_t>(V); ++v) {
          const float want = std::ldexp(to_float(gl[v]), e[static_cast<size_t>(b)] - e[0]);
          if (to_float(gl[static_cast<size_t>(b) * V + v]) != want && bad++ == 0) first = v;
        }
        EXPECT_EQ(bad, 0u) << what << " row " << b << " (x times 2^" << e[static_cast<size_t>(b)]
                           << "): " << bad << " logits are not row 0's scaled, first at " << first << "; "
                           << seed_note();
        EXPECT_EQ(go[static_cast<size_t>(b)].index, go[0].index) << what << " row " << b;
      }
    }
  }
}

// Rows 7 and 40 of an FP8 head are the same large row with the same scale, row 90 a little smaller:
// with positive inputs each batch row's maximum is their exact tie, and 7 must win, under the MMA
// kernel, the wgmma kernel and the multi-row GEMV (rows 7 and 40 fall to different warps and
// blocks of the GEMV) at every batch size the GEMV takes.
TEST(GpuDenseHead, Fp8TiesGoToTheLowestRowUnderEitherKernel) {
  Rng rng(805);
  const int n = 1000, k = 128;
  std::vector<fp8e4m3> W_h(static_cast<size_t>(n) * k);
  for (auto& w : W_h) w = to_fp8e4m3(rng.uniform(-0.05f, 0.05f));
  for (int j = 0; j < k; ++j) {
    W_h[7 * k + j] = to_fp8e4m3(1.0f);
    W_h[40 * k + j] = to_fp8e4m3(1.0f);
    W_h[90 * k + j] = to_fp8e4m3(0.875f);
  }
  std::vector<float> scale_h(static_cast<size_t>(n));
  for (auto& v : scale_h) v = rng.uniform(0.5f, 1.5f) / 448.0f;
  scale_h[7] = scale_h[40] = scale_h[90] = 1.0f / 448.0f;
  Twin<fp8e4m3> W(W_h);
  Twin<float> scale(scale_h);
  Twin<bf16> x(rng.bf16s(static_cast<size_t>(4) * k, 0.5f, 1.0f));
  for (const HeadGemm gemm : {HeadGemm::mma, HeadGemm::gemv, HeadGemm::wgmma, HeadGemm::cublaslt}) {
    if (gemm == HeadGemm::wgmma && !ops::cuda::have_wgmma()) continue;
    PolicyScope scope([gemm](KernelPolicy& p) { p.head_gemm = gemm; });
    for (const int B : {1, 2, 3, 4}) {
      std::vector<int32_t> slots_h(static_cast<size_t>(B));
      std::iota(slots_h.begin(), slots_h.end(), 0);
      Twin<int32_t> slots(slots_h);
      auto out = out_twin<ArgMax>(B);
      gpu().head_argmax_batch(nullptr, W.g.data(), scale.g.data(), x.g.data(),
                              RowBatch{slots.g.data(), nullptr, B}, n, k, 5, nullptr, 0, out.g.data());
      for (const ArgMax& a : out.from_gpu())
        EXPECT_EQ(a.index, 5 + 7) << "head_gemm " << to_string(gemm) << ", B = " << B << "; " << seed_note();
    }
  }
}

TEST(GpuDenseHead, TiesGoToTheLowestRowInEveryRow) {
  // Rows 7 and 40 of W are the same large row, row 90 a little smaller: with positive inputs each
  // row's maximum is the exact tie of rows 7 and 40 (the same sum on any backend), and 7 must win.
  Rng rng(803);
  const int n = 1000, k = 128, B = 16;
  auto W_h = rng.bf16s(static_cast<size_t>(n) * k, -0.05f, 0.05f);
  for (int j = 0; j < k; ++j) {
    W_h[7 * k + j] = to_bf16(1.0f);
    W_h[40 * k + j] = to_bf16(1.0f);
    W_h[90 * k + j] = to_bf16(0.875f);
  }
  Twin<bf16> W(W_h);
  Twin<bf16> x(rng.bf16s(static_cast<size_t>(B) * k, 0.5f, 1.0f));
  std::vector<int32_t> slots_h(B);
  std::iota(slots_h.begin(), slots_h.end(), 0);
  Twin<int32_t> slots(slots_h);
  auto out = out_twin<ArgMax>(B);
  gpu().head_argmax_batch(W.g.data(), nullptr, nullptr, x.g.data(), RowBatch{slots.g.data(), nullptr, B}, n,
                          k, 5, nullptr, 0, out.g.data());
  for (const ArgMax& a : out.from_gpu()) EXPECT_EQ(a.index, 5 + 7) << seed_note();
}

TEST_P(GpuDense, ArgmaxFamilyBatch) {
  const Shape s = GetParam();
  Rng rng(804);
  const int n = s.vocab, world = 3;
  for (int B : kBatches) {
    for (int offset : {0, 1}) {  // offset 1: rows 2 bytes past a 16-byte boundary (the scalar loads)
      const int ld = n + 13;
      std::vector<bf16> x_h(static_cast<size_t>(B) * ld + offset);
      for (auto& v : x_h) v = to_bf16(static_cast<float>(rng.integer(-64, 64)) * 0.125f);  // many ties
      Twin<bf16> x(x_h);
      auto out = out_twin<ArgMax>(B);
      // One launch, or two when long rows are split into parts (the parts, then their reduction).
      const uint64_t launches =
          kernels_of([&] { gpu().argmax_batch(x.g.data() + offset, ld, B, n, 77, out.g.data()); });
      EXPECT_GE(launches, 1u);
      EXPECT_LE(launches, 2u);
      cpu().argmax_batch(x.c.data() + offset, ld, B, n, 77, out.c.data());
      expect_bytes_equal(out.from_gpu(), out.from_cpu(),
                         where("argmax_batch offset " + std::to_string(offset), B));
    }
    std::vector<ArgMax> pairs_h(static_cast<size_t>(world) * B);
    for (auto& p : pairs_h) {
      const int kind = rng.integer(0, 3);
      p = ArgMax{kind == 0   ? 0.0f
                 : kind == 1 ? -0.0f
                             : static_cast<float>(rng.integer(-2, 2)),
                 rng.integer(0, 1 << 20)};
    }
    Twin<ArgMax> pairs(pairs_h);
    auto tok = out_twin<int32_t>(B);
    EXPECT_EQ(kernels_of([&] { gpu().argmax_pick_batch(pairs.g.data(), world, B, tok.g.data()); }), 1u);
    cpu().argmax_pick_batch(pairs.c.data(), world, B, tok.c.data());
    expect_bytes_equal(tok.from_gpu(), tok.from_cpu(), where("argmax_pick_batch", B));
    std::vector<uint64_t> keys_h(static_cast<size_t>(B));
    for (int b = 0; b < B; ++b) keys_h[static_cast<size_t>(b)] = host_key(pairs_h[static_cast<size_t>(b)]);
    Twin<uint64_t> keys(keys_h);
    auto unpacked = out_twin<int32_t>(B);
    EXPECT_EQ(kernels_of([&] { gpu().argmax_unpack_key_batch(keys.g.data(), unpacked.g.data(), B); }), 1u);
    cpu().argmax_unpack_key_batch(keys.c.data(), unpacked.c.data(), B);
    expect_bytes_equal(unpacked.from_gpu(), unpacked.from_cpu(), where("argmax_unpack_key_batch", B));
  }
}

// ---- batched rows: the linears through the multi-row GEMV and cuBLASLt
// -------------------------------------

// KernelPolicy::rows_linear = gemv (cuda::rows_gemv) against the CPU linear / linear_f32 at B = 2, 3,
// 8, 16: the step's batched linears at each model shape, plus (tiny only) odd shapes: n not a
// multiple of the row groups, k a multiple of 8 but not of 64, k of 1, 2 and 3 tiles of 2048
// columns with a partial last part and tile. Tolerances are GpuDense.Linear's: BF16 within 2 ulps
// + 1/4096 of the largest |value| with >= 90% bit-identical (the same fp32 sum rounded once; only
// the summation order differs), fp32 within 1e-5 relative + 1e-4 of the largest |value| (a k-term
// reordering moves a sum by ~k * 2^-24 of the summed magnitudes, below that at these k). One row
// past the batch is poisoned too and must keep its bytes. Invariance: every row at B < 16 must be
// bit for bit the same row at B = 16 (rows_gemv's arithmetic for a row does not depend on the
// others, rows_gemv.cu). cuBLASLt (rows_linear = cublaslt) is checked against the CPU at B = 2 and 16.
struct BatchedLinear {
  const char* name;
  int n, k;
  bool f32;
};

std::vector<BatchedLinear> batched_linears(const Shape& s) {
  const int H = s.hidden;
  std::vector<BatchedLinear> v = {{"eh_proj", H, 2 * H, false},
                                  {"q_a", s.q_lora, H, false},
                                  {"q_b", s.n_heads * s.head_dim, s.q_lora, false},
                                  {"kv_a", s.kv_lora, H, false},
                                  {"o_proj", H, s.n_heads * s.head_dim, true},
                                  {"indexer.wq_b", s.index_heads * s.index_dim, s.q_lora, true},
                                  {"indexer.wk", s.index_dim, H, false},
                                  {"indexer.gate", s.index_heads, H, true},
                                  {"router", s.experts, H, true}};
  if (std::string(s.name) == "tiny") {
    v.push_back({"odd n=291 k=1000", 291, 1000, false});
    v.push_back({"odd n=37 k=2056", 37, 2056, true});
    v.push_back({"odd n=1031 k=4104", 1031, 4104, false});
    v.push_back({"odd n=5 k=8", 5, 8, true});
    v.push_back({"odd n=3 k=2048", 3, 2048, false});
  }
  return v;
}

TEST_P(GpuDense, BatchedLinearsRowsGemv) {
  const Shape s = GetParam();
  constexpr int kMaxB = 16;
  uint64_t salt = 9100;
  for (const BatchedLinear& l : batched_linears(s)) {
    SCOPED_TRACE(std::string(s.name) + " " + l.name);
    const size_t n = static_cast<size_t>(l.n);
    const Big<bf16> W = big_bf16(n * l.k, -1.0f, 1.0f, ++salt);
    const Big<bf16> X = big_bf16(static_cast<size_t>(kMaxB) * l.k, -1.0f, 1.0f, ++salt);
    for (const bool f32 : {false, true}) {
      // The CPU reference of all kMaxB rows (a CPU row does not depend on the others).
      Big<float> want_f(f32 ? kMaxB * n : 1);
      Big<bf16> want_b(f32 ? 1 : kMaxB * n);
      on_cpu_rows(kMaxB, [&](Backend& be, int b0, int b1) {
        const bf16* x = X.c.data() + static_cast<size_t>(b0) * l.k;
        if (f32) {
          be.linear_f32(W.c.data(), x, want_f.c.data() + b0 * n, b1 - b0, l.n, l.k, RowsMode::batched);
        } else {
          be.linear(W.c.data(), x, want_b.c.data() + b0 * n, b1 - b0, l.n, l.k, RowsMode::batched);
        }
      });
      std::vector<float> full_f;
      std::vector<bf16> full_b;
      for (const RowsLinear path : {RowsLinear::gemv, RowsLinear::cublaslt}) {
        PolicyScope scope([&](KernelPolicy& p) { p.rows_linear = path; });
        for (const int B : {16, 2, 3, 8}) {
          if (path == RowsLinear::cublaslt && B != 16 && B != 2) continue;
          const std::string what = where(std::string(l.name) + (f32 ? " f32" : " bf16") +
                                             (path == RowsLinear::gemv ? " gemv" : " cublaslt"),
                                         B);
          const size_t nb = static_cast<size_t>(B) * n;
          // One output type: the row past the batch keeps its poison, the rows are within the CPU's
          // tolerance, and (gemv) bit-identical to the same rows at B = 16.
          auto check = [&](auto* tag, auto run, const auto& want, auto& full, auto close) {
            using T = std::remove_pointer_t<decltype(tag)>;
            auto Y = out_twin<T>(nb + n);
            run(Y.g.data());
            std::vector<T> got = Y.from_gpu();
            const std::vector<T> poison = Y.from_cpu();  // the CPU twin: poisoned, never written
            expect_bytes_equal(std::vector<T>(got.begin() + static_cast<long>(nb), got.end()),
                               std::vector<T>(poison.begin() + static_cast<long>(nb), poison.end()),
                               what + ": the row past the batch keeps its poison");
            got.resize(nb);
            close(got, std::vector<T>(want.c.data(), want.c.data() + nb));
            if (path != RowsLinear::gemv) return;
            if (B == kMaxB) {
              full = got;
            } else {
              expect_bytes_equal(got, std::vector<T>(full.begin(), full.begin() + static_cast<long>(nb)),
                                 what + ": rows bit-identical to the same rows at B = 16");
            }
          };
          if (f32) {
            check(
                static_cast<float*>(nullptr),
                [&](float* y) {
                  gpu().linear_f32(W.g.data(), X.g.data(), y, B, l.n, l.k, RowsMode::batched);
                },
                want_f, full_f,
                [&](const std::vector<float>& got, const std::vector<float>& ref) {
                  expect_f32_close(got, ref, what, 1e-5, 1e-4);
                });
          } else {
            check(
                static_cast<bf16*>(nullptr),
                [&](bf16* y) { gpu().linear(W.g.data(), X.g.data(), y, B, l.n, l.k, RowsMode::batched); },
                want_b, full_b,
                [&](const std::vector<bf16>& got, const std::vector<bf16>& ref) {
                  expect_bf16_close(got, ref, what);
                });
          }
        }
      }
    }
  }
}

// The batched linears over the row counts of the ragged batches (ragged_layouts: a linear's rows
// are independent of each other, so a ragged batch is its row count), under every kernel
// rows_linear can pick (auto; gemv, up to 16 rows, more on cuBLASLt; cublaslt), each linear in its
// own output type: every row within Linear's tolerances of the CPU's (BF16: 2 ulps + 1/4096 of the
// largest |value|, >= 90% bit-identical; fp32: 1e-5 relative + 1e-4 of the largest |value|: a
// k-term reordering moves a sum by ~k 2^-24 of the summed magnitudes), the row past the batch
// keeping its poison.
TEST_P(GpuDense, LinearRaggedRows) {
  const Shape s = GetParam();
  Rng rng(817);
  std::vector<int> counts;
  for (const Ragged& r : ragged_layouts(rng, max_rows_for(s), s.hidden >= 4096)) counts.push_back(r.rows());
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  const int most = counts.back();
  uint64_t salt = 9200;
  for (const BatchedLinear& l : batched_linears(s)) {
    SCOPED_TRACE(std::string(s.name) + " " + l.name);
    const size_t n = static_cast<size_t>(l.n);
    const Big<bf16> W = big_bf16(n * l.k, -1.0f, 1.0f, ++salt);
    const Big<bf16> X = big_bf16(static_cast<size_t>(most) * l.k, -1.0f, 1.0f, ++salt);
    Big<float> want_f(l.f32 ? most * n : 1);
    Big<bf16> want_b(l.f32 ? 1 : most * n);
    on_cpu_rows(most, [&](Backend& be, int b0, int b1) {
      const bf16* x = X.c.data() + static_cast<size_t>(b0) * l.k;
      if (l.f32) {
        be.linear_f32(W.c.data(), x, want_f.c.data() + b0 * n, b1 - b0, l.n, l.k, RowsMode::batched);
      } else {
        be.linear(W.c.data(), x, want_b.c.data() + b0 * n, b1 - b0, l.n, l.k, RowsMode::batched);
      }
    });
    for (const RowsLinear path : {RowsLinear::automatic, RowsLinear::gemv, RowsLinear::cublaslt}) {
      PolicyScope scope([&](KernelPolicy& p) { p.rows_linear = path; });
      for (const int R : counts) {
        const std::string what = std::string(l.name) + (l.f32 ? " f32 " : " bf16 ") + to_string(path) + ", " +
                                 std::to_string(R) + " rows";
        const size_t nb = static_cast<size_t>(R) * n;
        auto check = [&](auto* tag, auto run, const auto& want, auto close) {
          using T = std::remove_pointer_t<decltype(tag)>;
          auto Y = out_twin<T>(nb + n);
          run(Y.g.data());
          std::vector<T> got = Y.from_gpu();
          const std::vector<T> poison = Y.from_cpu();  // the CPU twin: poisoned, never written
          expect_bytes_equal(std::vector<T>(got.begin() + static_cast<long>(nb), got.end()),
                             std::vector<T>(poison.begin() + static_cast<long>(nb), poison.end()),
                             what + ": the row past the batch keeps its poison");
          got.resize(nb);
          close(got, std::vector<T>(want.c.data(), want.c.data() + nb));
        };
        if (l.f32) {
          check(
              static_cast<float*>(nullptr),
              [&](float* y) { gpu().linear_f32(W.g.data(), X.g.data(), y, R, l.n, l.k, RowsMode::batched); },
              want_f,
              [&](const std::vector<float>& got, const std::vector<float>& ref) {
                expect_f32_close(got, ref, what, 1e-5, 1e-4);
              });
        } else {
          check(
              static_cast<bf16*>(nullptr),
              [&](bf16* y) { gpu().linear(W.g.data(), X.g.data(), y, R, l.n, l.k, RowsMode::batched); },
              want_b,
              [&](const std::vector<bf16>& got, const std::vector<bf16>& ref) {
                expect_bf16_close(got, ref, what);
              });
        }
      }
    }
  }
}

// rows_gemv refuses a k it cannot load (not a multiple of 8) with an error naming the op and k; the
// automatic policy leaves such a linear to cuBLASLt.
TEST(GpuDenseRowsGemv, ForcedGemvRefusesUnsupportedK) {
  Rng rng(9200);
  const int n = 64, k = 100, B = 4;
  Twin<bf16> W(rng.bf16s(static_cast<size_t>(n) * k, -1.0f, 1.0f));
  Twin<bf16> X(rng.bf16s(static_cast<size_t>(B) * k, -1.0f, 1.0f));
  auto Y = out_twin<bf16>(static_cast<size_t>(B) * n);
  PolicyScope scope([](KernelPolicy& p) { p.rows_linear = RowsLinear::gemv; });
  std::string msg;
  try {
    gpu().linear(W.g.data(), X.g.data(), Y.g.data(), B, n, k, RowsMode::batched);
  } catch (const Error& e) {
    msg = e.message();
  }
  EXPECT_NE(msg.find("rows_gemv"), std::string::npos) << msg;
  EXPECT_NE(msg.find("k 100"), std::string::npos) << msg;
  EXPECT_NE(msg.find("multiple of 8"), std::string::npos) << msg;
}

// A multi-tile rows_gemv (k = 4104: 3 tiles, the workspace and the self-resetting counters) run
// eagerly at B = 2 (which sizes the scratch for 16 rows), then captured at B = 16 and replayed twice:
// every replay gives the eager B = 16 bytes, so no launch left a counter set and the capture needed
// no growth.
TEST(GpuDenseRowsGemv, GraphReplayMatchesEager) {
  Rng rng(9300);
  const int n = 1031, k = 4104;
  Twin<bf16> W(rng.bf16s(static_cast<size_t>(n) * k, -1.0f, 1.0f));
  Twin<bf16> X(rng.bf16s(static_cast<size_t>(16) * k, -1.0f, 1.0f));
  PolicyScope scope([](KernelPolicy& p) { p.rows_linear = RowsLinear::gemv; });
  auto small = out_twin<bf16>(static_cast<size_t>(2) * n);
  gpu().linear(W.g.data(), X.g.data(), small.g.data(), 2, n, k, RowsMode::batched);
  auto eager = out_twin<bf16>(static_cast<size_t>(16) * n),
       graph_y = out_twin<bf16>(static_cast<size_t>(16) * n);
  gpu().begin_capture();
  gpu().linear(W.g.data(), X.g.data(), graph_y.g.data(), 16, n, k, RowsMode::batched);
  auto graph = gpu().end_capture();
  gpu().linear(W.g.data(), X.g.data(), eager.g.data(), 16, n, k, RowsMode::batched);
  const std::vector<bf16> want = eager.from_gpu();
  for (int rep = 0; rep < 2; ++rep) {
    graph_y.poison(0xFF);
    graph->launch();
    expect_bytes_equal(graph_y.from_gpu(), want, "rows_gemv in a graph, replay " + std::to_string(rep));
  }
  const std::vector<bf16> first2(want.begin(), want.begin() + 2 * n);
  expect_bytes_equal(small.from_gpu(), first2, "B = 2 rows vs the same rows at B = 16");
}

// linear_rows_group (the block's projections of u in one op) at B = 1, 2, 3, 5, 8, 16 under
// rows_linear auto and gemv: every output bit-identical to its own batched linear / linear_f32 (+
// scale_f32) on the GPU (the group's contract: rows_gemv's sums of a weight do not depend on the
// other weights of the launch), within GpuDense.Linear's tolerances of the CPU (as
// BatchedLinearsRowsGemv), a row past the batch kept poisoned; and one launch for the whole group
// where the multi-row GEMV takes every output (forced gemv at any B up to 16; auto at B = 1 through
// linear_group, and up to 8 rows where each of these linears is under the GEMV's work limit).
TEST_P(GpuDense, LinearRowsGroupIsBitIdenticalToSeparateLinears) {
  const Shape s = GetParam();
  constexpr int kMaxB = 16;
  const int k = s.hidden;
  struct Member {
    const char* name;
    int n;
    bool f32;
    float scale;
  };
  std::vector<Member> members = {
      {"kv_a", s.kv_lora, false, 1.0f},
      {"indexer.wk", s.index_dim, false, 1.0f},
      {"indexer.gate", s.index_dim, true, 1.0f},
      {"q_a", s.q_lora, false, 1.0f},
      {"indexer.weights_proj", s.index_heads, true, 1.0f / std::sqrt(static_cast<float>(s.index_heads))}};
  if (std::string(s.name) == "tiny") members.push_back({"ragged n=37", 37, true, 0.25f});
  uint64_t salt = 9400;
  const Big<bf16> X = big_bf16(static_cast<size_t>(kMaxB) * k, -1.0f, 1.0f, ++salt);
  std::vector<Big<bf16>> W;
  for (const Member& m : members) W.push_back(big_bf16(static_cast<size_t>(m.n) * k, -1.0f, 1.0f, ++salt));
  // The CPU reference of all kMaxB rows, output by output (scaled as scale_f32 would).
  std::vector<std::vector<float>> want_f(members.size());
  std::vector<std::vector<bf16>> want_b(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    const Member& m = members[i];
    auto Yf = out_twin<float>(m.f32 ? static_cast<size_t>(kMaxB) * m.n : 1);
    auto Yb = out_twin<bf16>(m.f32 ? 1 : static_cast<size_t>(kMaxB) * m.n);
    if (m.f32) {
      cpu().linear_f32(W[i].c.data(), X.c.data(), Yf.c.data(), kMaxB, m.n, k, RowsMode::batched);
      if (m.scale != 1.0f) cpu().scale_f32(Yf.c.data(), m.scale, kMaxB * m.n);
      want_f[i] = Yf.from_cpu();
    } else {
      cpu().linear(W[i].c.data(), X.c.data(), Yb.c.data(), kMaxB, m.n, k, RowsMode::batched);
      want_b[i] = Yb.from_cpu();
    }
  }
  for (const RowsLinear path : {RowsLinear::automatic, RowsLinear::gemv}) {
    PolicyScope scope([&](KernelPolicy& p) { p.rows_linear = path; });
    for (const int B : {1, 2, 3, 5, 8, 16}) {
      const std::string what = where(
          std::string(s.name) + (path == RowsLinear::gemv ? " gemv" : " auto") + " linear_rows_group", B);
      std::vector<Twin<float>> gf;
      std::vector<Twin<bf16>> gb;
      std::vector<LinearOut> outs;
      gf.reserve(members.size());
      gb.reserve(members.size());
      for (const Member& m : members) {
        const size_t nb = static_cast<size_t>(B) * m.n;
        gf.push_back(out_twin<float>(m.f32 ? nb + m.n : 1));
        gb.push_back(out_twin<bf16>(m.f32 ? 1 : nb + m.n));
        void* y = m.f32 ? static_cast<void*>(gf.back().g.data()) : static_cast<void*>(gb.back().g.data());
        outs.push_back({W[outs.size()].g.data(), y, m.n, m.f32, m.scale});
      }
      const uint64_t launches = kernels_of([&] { gpu().linear_rows_group(outs, X.g.data(), B, k); });
      // rows_linear auto gives the GEMV a linear of at most 8 rows and 20 M multiply-adds.
      int64_t most = 0;
      for (const Member& m : members) most = std::max<int64_t>(most, static_cast<int64_t>(B) * m.n * k);
      const bool all_gemv = path == RowsLinear::gemv || B == 1 || (B <= 8 && most <= 20'000'000);
      if (all_gemv) {
        EXPECT_EQ(launches, 1u) << what << ": the whole group in one launch";
      }
      for (size_t i = 0; i < members.size(); ++i) {
        const Member& m = members[i];
        const size_t nb = static_cast<size_t>(B) * m.n;
        const std::string wi = what + " " + m.name;
        auto tail_kept = [&](const auto& got, const auto& poison) {
          using V = std::decay_t<decltype(got)>;
          expect_bytes_equal(V(got.begin() + static_cast<long>(nb), got.end()),
                             V(poison.begin() + static_cast<long>(nb), poison.end()),
                             wi + ": the row past the batch keeps its poison");
        };
        if (m.f32) {
          std::vector<float> got = gf[i].from_gpu();
          tail_kept(got, gf[i].from_cpu());
          got.resize(nb);
          expect_f32_close(got,
                           std::vector<float>(want_f[i].begin(), want_f[i].begin() + static_cast<long>(nb)),
                           wi + " vs cpu", 1e-5, 1e-4);
          auto sep = out_twin<float>(nb);
          gpu().linear_f32(W[i].g.data(), X.g.data(), sep.g.data(), B, m.n, k, RowsMode::batched);
          if (m.scale != 1.0f) gpu().scale_f32(sep.g.data(), m.scale, B * m.n);
          expect_bytes_equal(got, sep.from_gpu(), wi + ": group vs the separate batched linear");
        } else {
          std::vector<bf16> got = gb[i].from_gpu();
          tail_kept(got, gb[i].from_cpu());
          got.resize(nb);
          expect_bf16_close(got,
                            std::vector<bf16>(want_b[i].begin(), want_b[i].begin() + static_cast<long>(nb)),
                            wi + " vs cpu");
          auto sep = out_twin<bf16>(nb);
          gpu().linear(W[i].g.data(), X.g.data(), sep.g.data(), B, m.n, k, RowsMode::batched);
          expect_bytes_equal(got, sep.from_gpu(), wi + ": group vs the separate batched linear");
        }
      }
    }
  }
}

// ---- batched rows: padding and graphs -----------------------------------------------------------------

// Every row padded: the head writes nothing and leaves its scratch clean (the grouped experts'
// case: GpuMoePadding, test_gpu_moe.cpp).
TEST(GpuDensePadding, AllRowsPaddedWriteNothing) {
  Rng rng(812);
  const Shape s = kShapes[0];
  const int B = 8, H = s.hidden, V = 512;
  Twin<int32_t> none(std::vector<int32_t>(B, -1));
  Twin<bf16> x(rng.bf16s(static_cast<size_t>(B) * H, -1.0f, 1.0f));
  Twin<bf16> W(rng.bf16s(static_cast<size_t>(V) * H, -1.0f, 1.0f));
  auto head = out_twin<ArgMax>(B);
  gpu().head_argmax_batch(W.g.data(), nullptr, nullptr, x.g.data(), RowBatch{none.g.data(), nullptr, B}, V, H,
                          0, nullptr, 0, head.g.data());
  expect_bytes_equal(head.from_gpu(), head.from_cpu(), "head, every row padded");
  // The head's scratch is left clean: a live call after it picks the right rows.
  Twin<int32_t> live(std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
  auto head2 = out_twin<ArgMax>(B);
  gpu().head_argmax_batch(W.g.data(), nullptr, nullptr, x.g.data(), RowBatch{live.g.data(), nullptr, B}, V, H,
                          0, nullptr, 0, head2.g.data());
  cpu().head_argmax_batch(W.c.data(), nullptr, nullptr, x.c.data(), RowBatch{live.c.data(), nullptr, B}, V, H,
                          0, nullptr, 0, head2.c.data());
  size_t differ = 0;
  for (int b = 0; b < B; ++b)
    differ +=
        head2.from_gpu()[static_cast<size_t>(b)].index != head2.from_cpu()[static_cast<size_t>(b)].index;
  EXPECT_LE(differ, 1u) << "head after an all-padded call; " << seed_note();
  // The FP8 head's multi-row GEMV (head_gemm = gemv, 4 rows): nothing written (pairs nor logits),
  // and its scratch left clean for a live call after it.
  {
    PolicyScope scope([](KernelPolicy& p) { p.head_gemm = HeadGemm::gemv; });
    const int B4 = 4;
    Twin<fp8e4m3> W8(rng.fp8s(static_cast<size_t>(V) * H));
    Twin<float> sc(rng.floats(static_cast<size_t>(V), 0.5f / 448, 1.5f / 448));
    auto logits = out_twin<bf16>(static_cast<size_t>(B4) * V);
    auto h = out_twin<ArgMax>(B4);
    gpu().head_argmax_batch(nullptr, W8.g.data(), sc.g.data(), x.g.data(),
                            RowBatch{none.g.data(), nullptr, B4}, V, H, 0, logits.g.data(), V, h.g.data());
    expect_bytes_equal(h.from_gpu(), h.from_cpu(), "FP8 gemv head, every row padded: pairs");
    expect_bytes_equal(logits.from_gpu(), logits.from_cpu(), "FP8 gemv head, every row padded: logits");
    auto h2 = out_twin<ArgMax>(B4);
    gpu().head_argmax_batch(nullptr, W8.g.data(), sc.g.data(), x.g.data(),
                            RowBatch{live.g.data(), nullptr, B4}, V, H, 0, nullptr, 0, h2.g.data());
    cpu().head_argmax_batch(nullptr, W8.c.data(), sc.c.data(), x.c.data(),
                            RowBatch{live.c.data(), nullptr, B4}, V, H, 0, nullptr, 0, h2.c.data());
    size_t differ4 = 0;
    for (int b = 0; b < B4; ++b)
      differ4 += h2.from_gpu()[static_cast<size_t>(b)].index != h2.from_cpu()[static_cast<size_t>(b)].index;
    EXPECT_LE(differ4, 1u) << "FP8 gemv head after an all-padded call; " << seed_note();
  }
}

// The FP8 head's multi-row GEMV in a CUDA graph: run eagerly at B = 2, then two heads at B = 4
// captured and replayed twice: every replay gives the eager B = 4 bytes (the self-resetting keys and
// counter survive back-to-back launches and replays).
TEST(GpuDenseHead, Fp8GemvGraphReplayMatchesEager) {
  Rng rng(806);
  const int n = 4099, k = 256, B = 4;
  Twin<fp8e4m3> W(rng.fp8s(static_cast<size_t>(n) * k));
  Twin<float> scale(rng.floats(static_cast<size_t>(n), 0.5f / 448, 1.5f / 448));
  Twin<bf16> x(rng.bf16s(static_cast<size_t>(B) * k, -1.0f, 1.0f));
  Twin<bf16> x2(rng.bf16s(static_cast<size_t>(B) * k, -1.0f, 1.0f));
  Twin<int32_t> slots(std::vector<int32_t>{2, 0, 3, 1});
  PolicyScope scope([](KernelPolicy& p) { p.head_gemm = HeadGemm::gemv; });
  auto head = [&](const Twin<bf16>& in, int rows, Twin<bf16>& logits, Twin<ArgMax>& out) {
    gpu().head_argmax_batch(nullptr, W.g.data(), scale.g.data(), in.g.data(),
                            RowBatch{slots.g.data(), nullptr, rows}, n, k, 0, logits.g.data(), n,
                            out.g.data());
  };
  auto small_l = out_twin<bf16>(static_cast<size_t>(2) * n);
  auto small_o = out_twin<ArgMax>(2);
  head(x, 2, small_l, small_o);
  auto l1 = out_twin<bf16>(static_cast<size_t>(B) * n), l2 = out_twin<bf16>(static_cast<size_t>(B) * n);
  auto o1 = out_twin<ArgMax>(B), o2 = out_twin<ArgMax>(B);
  gpu().begin_capture();
  head(x, B, l1, o1);
  head(x2, B, l2, o2);
  auto graph = gpu().end_capture();
  auto e1 = out_twin<bf16>(static_cast<size_t>(B) * n), e2 = out_twin<bf16>(static_cast<size_t>(B) * n);
  auto eo1 = out_twin<ArgMax>(B), eo2 = out_twin<ArgMax>(B);
  head(x, B, e1, eo1);
  head(x2, B, e2, eo2);
  for (int rep = 0; rep < 2; ++rep) {
    for (auto* t : {&l1, &l2}) t->poison(0xFF);
    for (auto* t : {&o1, &o2}) t->poison(0xFF);
    graph->launch();
    const std::string what = "FP8 gemv head in a graph, replay " + std::to_string(rep);
    expect_bytes_equal(l1.from_gpu(), e1.from_gpu(), what + ": first head's logits");
    expect_bytes_equal(o1.from_gpu(), eo1.from_gpu(), what + ": first head's pairs");
    expect_bytes_equal(l2.from_gpu(), e2.from_gpu(), what + ": second head's logits");
    expect_bytes_equal(o2.from_gpu(), eo2.from_gpu(), what + ": second head's pairs");
  }
  const std::vector<bf16> e1h = e1.from_gpu();
  expect_bytes_equal(small_l.from_gpu(), std::vector<bf16>(e1h.begin(), e1h.begin() + 2 * n),
                     "B = 2 rows vs the same rows at B = 4");
}

INSTANTIATE_TEST_SUITE_P(Models, GpuDense, ::testing::ValuesIn(kShapes), shape_name);

}  // namespace
}  // namespace mtplab::ops::gputest
