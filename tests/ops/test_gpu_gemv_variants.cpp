// Every GEMV kernel variant (ops::GemvVariant, selected here through the GPU backend's kernel
// policy) against the CPU reference and against v1's bits (every variant keeps v1's k-split): BF16
// GEMVs with BF16 and fp32 outputs, FP8 GEMVs with row scales, the row map (mla_out_v), the head
// with its fused argmax, and linear_group (v1's kernel) against the separate GEMVs of each variant.
// The shapes give every k-split the GPU picks (1 .. 8 at 132 SMs), 2 to 8 chunks per lane, odd n,
// k whose parts or unrolls end part-way, and shapes a variant leaves to v1. (The comparison
// variants rows2 and fp8split: dev/cuda/gemv.cu.)
// Each shape's reference is computed once and every variant is compared with it. Tolerances:
// gpu_test_util.hpp (BF16: 2 ulps + 1/4096 of the largest |reference|, 90% bit-identical; fp32:
// 1e-5 relative + 1e-4 of the largest |reference|, as the Linear test of test_gpu_dense.cpp).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "ops/one_row.hpp"

namespace mtplab::ops::gputest {
namespace {

constexpr GemvVariant kVariants[] = {GemvVariant::v1, GemvVariant::rows4, GemvVariant::occ,
                                     GemvVariant::automatic};

/// The variant for one scope (the rest of the policy as it is); the previous policy is restored at
/// its end.
class VariantScope {
 public:
  explicit VariantScope(GemvVariant v) : scope_([v](KernelPolicy& p) { p.gemv_variant = v; }) {}

 private:
  PolicyScope scope_;
};

std::string label(GemvVariant v) { return std::string("variant ") + to_string(v); }

struct GemvShape {
  const char* name;
  int n, k;
};

// At 132 SMs: eh_proj split 4 (8 chunks per lane and part), q_a 4, kv_a 8, q_b 1 (6 per lane),
// kv_b 1 (2 per lane), wq_b 2; odd n on each family; k = 1000 and 784 end part-way through a
// lane's unroll (and 784 has FP8 rows of 49 chunks); 777 and 1 rows are left to v1 by the rows
// variants (too few rows for every warp).
const GemvShape kGemvShapes[] = {{"eh_proj", 4096, 8192},  {"eh_proj_odd", 4097, 8192},
                                 {"q_a", 1536, 4096},      {"q_b", 16384, 1536},
                                 {"q_b_odd", 16383, 1536}, {"kv_a", 512, 4096},
                                 {"kv_b", 32768, 512},     {"kv_b_odd", 32769, 512},
                                 {"wq_b", 4096, 1536},     {"k1000", 9001, 1000},
                                 {"k784", 20011, 784},     {"small", 777, 1024},
                                 {"one_row", 1, 4096},     {"tiny", 33, 64}};

TEST(GpuGemvVariants, LinearBf16AndFp32) {
  Rng rng(21);
  for (const GemvShape& s : kGemvShapes) {
    SCOPED_TRACE(std::string(s.name) + " [" + std::to_string(s.n) + ", " + std::to_string(s.k) + "]");
    Twin<bf16> W(rng.bf16s(static_cast<size_t>(s.n) * s.k, -1.0f, 1.0f));
    Twin<bf16> x(rng.bf16s(s.k, -1.0f, 1.0f));
    auto y = out_twin<bf16>(s.n);
    auto yf = out_twin<float>(s.n);
    cpu().linear(W.c.data(), x.c.data(), y.c.data(), 1, s.n, s.k);
    cpu().linear_f32(W.c.data(), x.c.data(), yf.c.data(), 1, s.n, s.k);
    const std::vector<bf16> want = y.from_cpu();
    const std::vector<float> want_f = yf.from_cpu();
    std::vector<bf16> v1_bits;
    std::vector<float> v1_bits_f;
    for (GemvVariant v : kVariants) {
      SCOPED_TRACE(label(v));
      const VariantScope scope(v);
      y.poison(0xFF);
      yf.poison(0xFF);
      gpu().linear(W.g.data(), x.g.data(), y.g.data(), 1, s.n, s.k);
      gpu().linear_f32(W.g.data(), x.g.data(), yf.g.data(), 1, s.n, s.k);
      const std::vector<bf16> got = y.from_gpu();
      const std::vector<float> got_f = yf.from_gpu();
      expect_bf16_close(got, want, "linear");
      expect_f32_close(got_f, want_f, "linear_f32", 1e-5, 1e-4);
      if (v == GemvVariant::v1) {
        v1_bits = got;
        v1_bits_f = got_f;
      } else {
        expect_bytes_equal(got, v1_bits, "linear: v1's bits");
        expect_bytes_equal(got_f, v1_bits_f, "linear_f32: v1's bits");
      }
    }
  }
}

TEST(GpuGemvVariants, LinearFp8) {
  Rng rng(22);
  for (const GemvShape& s : kGemvShapes) {
    if (s.k % 16 != 0) continue;
    SCOPED_TRACE(std::string(s.name) + " fp8 [" + std::to_string(s.n) + ", " + std::to_string(s.k) + "]");
    Twin<fp8e4m3> W(rng.fp8s(static_cast<size_t>(s.n) * s.k));
    std::vector<float> scale(static_cast<size_t>(s.n));
    for (auto& v : scale) v = rng.uniform(0.5f, 1.5f) / 448.0f;
    Twin<float> S(scale);
    Twin<bf16> x(rng.bf16s(s.k, -1.0f, 1.0f));
    auto y = out_twin<bf16>(s.n);
    cpu().linear_fp8(W.c.data(), S.c.data(), x.c.data(), y.c.data(), 1, s.n, s.k);
    const std::vector<bf16> want = y.from_cpu();
    std::vector<bf16> v1_bits;
    for (GemvVariant v : kVariants) {
      SCOPED_TRACE(label(v));
      const VariantScope scope(v);
      y.poison(0xFF);
      gpu().linear_fp8(W.g.data(), S.g.data(), x.g.data(), y.g.data(), 1, s.n, s.k);
      const std::vector<bf16> got = y.from_gpu();
      expect_bf16_close(got, want, "linear_fp8");
      if (v == GemvVariant::v1) {
        v1_bits = got;
      } else {
        expect_bytes_equal(got, v1_bits, "linear_fp8: v1's bits");
      }
    }
  }
}

TEST(GpuGemvVariants, RowMapOutV) {
  struct OutV {
    int heads, dqk, dv, kv_lora;
  };
  // glm5.3-flash (groups of 256 rows: every variant's rows share a group); 96-row groups (rows4
  // takes them: a multiple of its 32 rows per block and iteration); 40-row groups (not a multiple:
  // the rows variant leaves them to v1).
  Rng rng(23);
  for (const OutV& s : {OutV{64, 256, 256, 512}, OutV{48, 32, 96, 256}, OutV{130, 24, 40, 128}}) {
    SCOPED_TRACE("mla_out_v heads " + std::to_string(s.heads) + " dv " + std::to_string(s.dv) + " kv_lora " +
                 std::to_string(s.kv_lora));
    Twin<bf16> W(rng.bf16s(static_cast<size_t>(s.heads) * (s.dqk + s.dv) * s.kv_lora, -0.05f, 0.05f));
    Twin<bf16> o_lat(rng.bf16s(static_cast<size_t>(s.heads) * s.kv_lora, -2.0f, 2.0f));
    auto o = out_twin<bf16>(static_cast<size_t>(s.heads) * s.dv);
    mtplab::ops::OneRow(cpu()).mla_out_v(o_lat.c.data(), W.c.data(), o.c.data(), s.heads, s.dqk, s.dv,
                                         s.kv_lora);
    const std::vector<bf16> want = o.from_cpu();
    std::vector<bf16> v1_bits;
    for (GemvVariant v : kVariants) {
      SCOPED_TRACE(label(v));
      const VariantScope scope(v);
      o.poison(0xFF);
      mtplab::ops::OneRow(gpu()).mla_out_v(o_lat.g.data(), W.g.data(), o.g.data(), s.heads, s.dqk, s.dv,
                                           s.kv_lora);
      const std::vector<bf16> got = o.from_gpu();
      expect_bf16_close(got, want, "mla_out_v");
      if (v == GemvVariant::v1) {
        v1_bits = got;
      } else {
        expect_bytes_equal(got, v1_bits, "mla_out_v: v1's bits");
      }
    }
  }
}

/// Largest value, lowest index on ties (the reference's rule) over BF16 logits.
ArgMax logits_argmax(const std::vector<bf16>& logits, int64_t base) {
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (to_float(logits[i]) > to_float(logits[best])) best = i;
  return ArgMax{to_float(logits[best]), static_cast<int32_t>(base + static_cast<int64_t>(best))};
}

TEST(GpuGemvVariants, HeadArgmax) {
  // A small model's head (split 1, 4 chunks per lane) and an odd vocabulary shard of short rows.
  Rng rng(24);
  for (const GemvShape& s : {GemvShape{"head", 38912, 1024}, GemvShape{"head_odd", 4099, 256}}) {
    for (bool fp8 : {false, true}) {
      SCOPED_TRACE(std::string(s.name) + (fp8 ? " fp8" : " bf16"));
      const int64_t base = 3 * static_cast<int64_t>(s.n);
      Twin<bf16> W(fp8 ? std::vector<bf16>(1) : rng.bf16s(static_cast<size_t>(s.n) * s.k, -1.0f, 1.0f));
      Twin<fp8e4m3> W8(fp8 ? rng.fp8s(static_cast<size_t>(s.n) * s.k) : std::vector<fp8e4m3>(1));
      std::vector<float> scale(static_cast<size_t>(s.n));
      for (auto& v : scale) v = rng.uniform(0.5f, 1.5f) / 448.0f;
      Twin<float> S(scale);
      Twin<bf16> x(rng.bf16s(s.k, -1.0f, 1.0f));
      auto logits = out_twin<bf16>(s.n);
      auto out = out_twin<ArgMax>(1);
      const bf16* w_c = fp8 ? nullptr : W.c.data();
      const fp8e4m3* w8_c = fp8 ? W8.c.data() : nullptr;
      const bf16* w_g = fp8 ? nullptr : W.g.data();
      const fp8e4m3* w8_g = fp8 ? W8.g.data() : nullptr;
      cpu().head_argmax(w_c, w8_c, fp8 ? S.c.data() : nullptr, x.c.data(), s.n, s.k, base, logits.c.data(),
                        out.c.data());
      const std::vector<bf16> want = logits.from_cpu();
      std::vector<bf16> v1_bits;
      ArgMax v1_out{};
      for (GemvVariant v : kVariants) {
        SCOPED_TRACE(label(v));
        const VariantScope scope(v);
        logits.poison(0xFF);
        out.poison(0xFF);
        gpu().head_argmax(w_g, w8_g, fp8 ? S.g.data() : nullptr, x.g.data(), s.n, s.k, base, logits.g.data(),
                          out.g.data());
        const std::vector<bf16> got = logits.from_gpu();
        const ArgMax got_out = out.from_gpu()[0];
        expect_bf16_close(got, want, "head logits");
        const ArgMax own = logits_argmax(got, base);
        EXPECT_EQ(got_out.index, own.index) << "not the argmax of the kernel's own logits; " << seed_note();
        EXPECT_EQ(got_out.value, own.value) << seed_note();
        if (v == GemvVariant::v1) {
          v1_bits = got;
          v1_out = got_out;
        } else {
          expect_bytes_equal(got, v1_bits, "head logits: v1's bits");
          EXPECT_EQ(got_out.index, v1_out.index) << seed_note();
        }
      }
    }
  }
}

TEST(GpuGemvVariants, LinearGroupMatchesEachVariantsGemvs) {
  // The u_proj group of glm5.3-flash (splits 4 and 8) plus a large output (split 1): linear_group
  // runs v1's split and order, so it must give the bits of every variant that keeps them.
  Rng rng(25);
  const int k = 4096;
  const int ns[] = {1536, 512, 128, 16384};
  Twin<bf16> x(rng.bf16s(k, -1.0f, 1.0f));
  std::vector<Twin<bf16>> W;
  std::vector<Twin<bf16>> y_group, y_sep;
  for (int n : ns) {
    W.emplace_back(rng.bf16s(static_cast<size_t>(n) * k, -1.0f, 1.0f));
    y_group.push_back(out_twin<bf16>(n));
    y_sep.push_back(out_twin<bf16>(n));
  }
  std::vector<LinearOut> outs;
  for (size_t i = 0; i < W.size(); ++i)
    outs.push_back({W[i].g.data(), y_group[i].g.data(), ns[i], false, 1.0f});
  for (GemvVariant v : kVariants) {
    SCOPED_TRACE(label(v));
    const VariantScope scope(v);
    mtplab::ops::OneRow(gpu()).linear_group(outs, x.g.data(), k);
    for (size_t i = 0; i < W.size(); ++i) {
      y_sep[i].poison(0xFF);
      gpu().linear(W[i].g.data(), x.g.data(), y_sep[i].g.data(), 1, ns[i], k);
      expect_bytes_equal(y_group[i].from_gpu(), y_sep[i].from_gpu(),
                         "linear_group output " + std::to_string(i) + " vs its linear");
    }
  }
}

}  // namespace
}  // namespace mtplab::ops::gputest
