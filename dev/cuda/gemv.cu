// The GEMV family's comparison variants (no rule of the library picks them): rows2, the rows kernel
// with 2 rows per warp, and fp8split, FP8 rows at the k-split of BF16 rows of the same length (the
// v1 kernel, 4 or fewer chunks per lane in flight). Each is checked against the CPU reference
// (lib/ops/cpu/dense.cpp) and timed against the library's choice for the shape.
// - rows2 keeps v1's k-split and each lane's order: its outputs must be v1's bytes (the library's
//   gemv_bf16 / gemv_fp8 / head_argmax under gemv_variant v1), and the CPU's within 2 BF16 ulps +
//   1/4096 of the largest |reference|, at least 90% bit-identical (tests/ops/gpu_test_util.hpp's
//   tolerance); the head's fused argmax must be the argmax of its own logits. A shape the kernel
//   does not cover at this device's size (rows_kernel_fits) is reported and skipped.
// - fp8split sums FP8 rows in other parts than v1: the CPU's tolerance only.
// Run: mtplab_dev_gemv [--reps N] [--seed S] [--device D] (playground.hpp).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "ops/cuda/dense.hpp"
#include "ops/cuda/dispatch.hpp"
#include "ops/cuda/gemv.cuh"
#include "ops/ops.hpp"
#include "playground.hpp"

namespace mtplab::ops::cuda {
namespace {

/// rows2: gemv_rows_kernel with 2 rows per warp at v1's split, unrolled to cover a lane's chunks
/// (up to 8 loads per row in flight).
template <bool kFp8, bool kArgmax>
void launch_rows2(const LaunchCtx& ctx, const GemvParams& p, int grid_cap) {
  const int n_chunks = p.k / (kFp8 ? 16 : 8);
  GemvPlan plan;
  plan.split = gemv_split(ctx, p.n, n_chunks);
  plan.unroll = unroll_for((n_chunks + plan.split * kWarp - 1) / (plan.split * kWarp), kUnroll);
  launch_rows_split<kFp8, OutKind::bf16, kArgmax, 2, 1, 8, false>(ctx, p, grid_cap, plan);
}

/// Whether rows2 covers [n x k] on this device (else the library would run v1 for it).
bool rows2_covers(const LaunchCtx& ctx, bool fp8, bool argmax, int64_t n, int k) {
  const int split = gemv_split(ctx, n, k / (fp8 ? 16 : 8));
  return !(argmax && split != 1) && rows_kernel_fits(2, split, n, static_cast<int>(n), ctx.num_sms);
}

/// fp8split: FP8 rows of k at the split BF16 rows of k take (k / 8 chunks: for k >= 8192 two warps
/// per resident slot, so FP8 eh_proj runs 4 parts of 128 chunks instead of 2 of 256), each lane's
/// loads in flight covering its chunks (2, 4 or 8).
template <int kU>
void launch_fp8split_u(const LaunchCtx& ctx, const GemvParams& p, int split) {
  switch (split) {
    case 1:
      return launch_gemv_split<true, 1, OutKind::bf16, false, kU>(ctx, p, 0);
    case 2:
      return launch_gemv_split<true, 2, OutKind::bf16, false, kU>(ctx, p, 0);
    case 4:
      return launch_gemv_split<true, 4, OutKind::bf16, false, kU>(ctx, p, 0);
    default:
      return launch_gemv_split<true, 8, OutKind::bf16, false, kU>(ctx, p, 0);
  }
}
void launch_fp8split(const LaunchCtx& ctx, const GemvParams& p) {
  const int split = gemv_split(ctx, p.n, p.k / 8);
  const int n_chunks = p.k / 16;
  const int unroll = unroll_for((n_chunks + split * kWarp - 1) / (split * kWarp), kUnroll);
  if (unroll == 2) return launch_fp8split_u<2>(ctx, p, split);
  if (unroll == 4) return launch_fp8split_u<4>(ctx, p, split);
  launch_fp8split_u<8>(ctx, p, split);
}

}  // namespace
}  // namespace mtplab::ops::cuda

namespace {

using namespace mtplab;
namespace cuda = mtplab::ops::cuda;
using dev::DeviceBuffer;

constexpr const char* kName = "mtplab_dev_gemv";

struct Shape {
  const char* name;
  int n, k;
};
// glm5.3-flash's GEMVs (q_b, kv_b, eh_proj), an odd n, and a small model's head.
const Shape kShapes[] = {{"q_b", 16384, 1536},     {"kv_b", 32768, 512}, {"eh_proj", 4096, 8192},
                         {"q_b odd", 16383, 1536}, {"wq_b", 4096, 1536}, {"head small", 38912, 1024}};

/// The library's launch context at a GEMV variant (v1: the bytes rows2 must give; automatic: the
/// timing baseline).
cuda::LaunchCtx at(const cuda::LaunchCtx& base, ops::GemvVariant v) {
  cuda::LaunchCtx c = base;
  c.policy.gemv_variant = v;
  return c;
}

std::vector<float> row_scales(dev::Rng& rng, int n) {
  std::vector<float> s(static_cast<size_t>(n));
  for (auto& v : s) v = rng.uniform(0.5f, 1.5f) / 448.0f;
  return s;
}

void check_rows2(const cuda::LaunchCtx& ctx, ops::Backend& cpu, dev::Rng& rng, dev::Report& report,
                 int reps) {
  for (const Shape& s : kShapes) {
    for (bool fp8 : {false, true}) {
      const std::string what = str("rows2 ", fp8 ? "fp8 " : "bf16 ", s.name, " [", s.n, " x ", s.k, "]");
      if (!cuda::rows2_covers(ctx, fp8, false, s.n, s.k)) {
        std::printf("  skip %s: rows2 does not cover it at %d SMs (the library runs v1)\n", what.c_str(),
                    ctx.num_sms);
        continue;
      }
      const size_t nk = static_cast<size_t>(s.n) * s.k;
      const std::vector<bf16> x = rng.bf16s(static_cast<size_t>(s.k), -1.0f, 1.0f);
      std::vector<bf16> want(static_cast<size_t>(s.n));
      std::unique_ptr<DeviceBuffer<bf16>> W;
      std::unique_ptr<DeviceBuffer<fp8e4m3>> W8;
      std::unique_ptr<DeviceBuffer<float>> S;
      if (fp8) {
        const std::vector<fp8e4m3> w = rng.fp8s(nk);
        const std::vector<float> scale = row_scales(rng, s.n);
        cpu.linear_fp8(w.data(), scale.data(), x.data(), want.data(), 1, s.n, s.k);
        W8 = std::make_unique<DeviceBuffer<fp8e4m3>>(w);
        S = std::make_unique<DeviceBuffer<float>>(scale);
      } else {
        const std::vector<bf16> w = rng.bf16s(nk, -1.0f, 1.0f);
        cpu.linear(w.data(), x.data(), want.data(), 1, s.n, s.k);
        W = std::make_unique<DeviceBuffer<bf16>>(w);
      }
      DeviceBuffer<bf16> d_x(x), y(static_cast<size_t>(s.n)), y_v1(static_cast<size_t>(s.n));
      const void* w_ptr = fp8 ? static_cast<const void*>(W8->data()) : static_cast<const void*>(W->data());
      const cuda::GemvParams p = cuda::gemv_params("rows2", fp8, w_ptr, fp8 ? S->data() : nullptr, d_x.data(),
                                                   y.data(), s.n, s.k, cuda::GemvRowMap{s.n, 0, 0, 0});
      auto rows2 = [&] {
        fp8 ? cuda::launch_rows2<true, false>(ctx, p, 0) : cuda::launch_rows2<false, false>(ctx, p, 0);
      };
      auto library = [&](const cuda::LaunchCtx& c, bf16* out) {
        if (fp8) {
          cuda::gemv_fp8(c, W8->data(), S->data(), d_x.data(), out, s.n, s.k);
        } else {
          cuda::gemv_bf16(c, W->data(), d_x.data(), out, false, s.n, s.k, cuda::GemvRowMap{s.n, 0, 0, 0});
        }
      };
      y.poison();
      rows2();
      const std::vector<bf16> got = y.download();
      report.bf16_close(what + " against the CPU", got, want);
      y_v1.poison();
      library(at(ctx, ops::GemvVariant::v1), y_v1.data());
      report.equal(what + ": v1's bytes", got, y_v1.download());
      const cuda::LaunchCtx lib = at(ctx, ops::GemvVariant::automatic);
      dev::Report::timing(what, dev::median_ms(ctx.stream, reps, rows2), "library",
                          dev::median_ms(ctx.stream, reps, [&] { library(lib, y_v1.data()); }));
    }
  }
}

/// The head with its argmax fused (one unsplit row per warp pair), BF16 and FP8.
void check_rows2_head(const cuda::LaunchCtx& ctx, ops::Backend& cpu, dev::Rng& rng, dev::Report& report,
                      int reps) {
  const int n = 38912, k = 1024;
  const int64_t base = 3 * static_cast<int64_t>(n);
  cuda::ArgmaxScratch scratch;
  scratch.capacity = cuda::gemv_max_grid(ctx.num_sms);
  DeviceBuffer<unsigned long long> partials(static_cast<size_t>(scratch.capacity));
  DeviceBuffer<unsigned int> counter(1);
  counter.poison(0);  // zero between launches (the last block resets it)
  scratch.partials = partials.data();
  scratch.counter = counter.data();
  for (bool fp8 : {false, true}) {
    const std::string what = str("rows2 head ", fp8 ? "fp8" : "bf16", " [", n, " x ", k, "] with its argmax");
    if (!cuda::rows2_covers(ctx, fp8, true, n, k)) {
      std::printf("  skip %s: rows2 does not cover it at %d SMs\n", what.c_str(), ctx.num_sms);
      continue;
    }
    const size_t nk = static_cast<size_t>(n) * k;
    const std::vector<bf16> x = rng.bf16s(static_cast<size_t>(k), -1.0f, 1.0f);
    std::vector<bf16> want(static_cast<size_t>(n));
    ops::ArgMax want_out{};
    std::vector<bf16> w = fp8 ? std::vector<bf16>(1) : rng.bf16s(nk, -1.0f, 1.0f);
    std::vector<fp8e4m3> w8 = fp8 ? rng.fp8s(nk) : std::vector<fp8e4m3>(1);
    const std::vector<float> scale = row_scales(rng, n);
    cpu.head_argmax(fp8 ? nullptr : w.data(), fp8 ? w8.data() : nullptr, fp8 ? scale.data() : nullptr,
                    x.data(), n, k, base, want.data(), &want_out);
    DeviceBuffer<bf16> d_w(w), d_x(x), logits(static_cast<size_t>(n)), logits_v1(static_cast<size_t>(n));
    DeviceBuffer<fp8e4m3> d_w8(w8);
    DeviceBuffer<float> d_s(scale);
    DeviceBuffer<ops::ArgMax> out(1), out_v1(1);
    const void* w_ptr = fp8 ? static_cast<const void*>(d_w8.data()) : static_cast<const void*>(d_w.data());
    cuda::GemvParams p = cuda::gemv_params("rows2 head", fp8, w_ptr, fp8 ? d_s.data() : nullptr, d_x.data(),
                                           logits.data(), n, k, cuda::GemvRowMap{n, 0, 0, 0});
    p.index_base = base;
    p.out = out.data();
    p.partials = scratch.partials;
    p.counter = scratch.counter;
    auto rows2 = [&] {
      fp8 ? cuda::launch_rows2<true, true>(ctx, p, scratch.capacity)
          : cuda::launch_rows2<false, true>(ctx, p, scratch.capacity);
    };
    auto library = [&](const cuda::LaunchCtx& c, bf16* l, ops::ArgMax* o) {
      cuda::head_argmax(c, fp8 ? nullptr : d_w.data(), fp8 ? d_w8.data() : nullptr,
                        fp8 ? d_s.data() : nullptr, d_x.data(), n, k, base, l, o, {}, scratch);
    };
    logits.poison();
    out.poison();
    rows2();
    const std::vector<bf16> got = logits.download();
    const ops::ArgMax got_out = out.download()[0];
    report.bf16_close(what + ": logits against the CPU", got, want);
    size_t best = 0;
    for (size_t i = 1; i < got.size(); ++i)
      if (to_float(got[i]) > to_float(got[best])) best = i;
    report.check(
        str(what, ": the argmax ", got_out.index, " is its own logits' ", base + static_cast<int64_t>(best)),
        got_out.index == base + static_cast<int64_t>(best) && got_out.value == to_float(got[best]));
    logits_v1.poison();
    library(at(ctx, ops::GemvVariant::v1), logits_v1.data(), out_v1.data());
    report.equal(what + ": v1's logits", got, logits_v1.download());
    report.check(what + ": v1's pick", got_out.index == out_v1.download()[0].index);
    const cuda::LaunchCtx lib = at(ctx, ops::GemvVariant::automatic);
    dev::Report::timing(
        what, dev::median_ms(ctx.stream, reps, rows2), "library",
        dev::median_ms(ctx.stream, reps, [&] { library(lib, logits_v1.data(), out_v1.data()); }));
  }
}

void check_fp8split(const cuda::LaunchCtx& ctx, ops::Backend& cpu, dev::Rng& rng, dev::Report& report,
                    int reps) {
  for (const Shape& s : kShapes) {
    if (s.k % 16 != 0) continue;
    const std::string what =
        str("fp8split ", s.name, " [", s.n, " x ", s.k, "] (split ", cuda::gemv_split(ctx, s.n, s.k / 8),
            ", v1's ", cuda::gemv_split(ctx, s.n, s.k / 16), ")");
    const size_t nk = static_cast<size_t>(s.n) * s.k;
    const std::vector<bf16> x = rng.bf16s(static_cast<size_t>(s.k), -1.0f, 1.0f);
    const std::vector<fp8e4m3> w = rng.fp8s(nk);
    const std::vector<float> scale = row_scales(rng, s.n);
    std::vector<bf16> want(static_cast<size_t>(s.n));
    cpu.linear_fp8(w.data(), scale.data(), x.data(), want.data(), 1, s.n, s.k);
    DeviceBuffer<fp8e4m3> d_w(w);
    DeviceBuffer<float> d_s(scale);
    DeviceBuffer<bf16> d_x(x), y(static_cast<size_t>(s.n));
    const cuda::GemvParams p = cuda::gemv_params("fp8split", true, d_w.data(), d_s.data(), d_x.data(),
                                                 y.data(), s.n, s.k, cuda::GemvRowMap{s.n, 0, 0, 0});
    y.poison();
    cuda::launch_fp8split(ctx, p);
    report.bf16_close(what + " against the CPU", y.download(), want);
    const cuda::LaunchCtx lib = at(ctx, ops::GemvVariant::automatic);
    dev::Report::timing(what, dev::median_ms(ctx.stream, reps, [&] { cuda::launch_fp8split(ctx, p); }),
                        "library", dev::median_ms(ctx.stream, reps, [&] {
                          cuda::gemv_fp8(lib, d_w.data(), d_s.data(), d_x.data(), y.data(), s.n, s.k);
                        }));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const dev::Options opt = dev::parse_options(
      argc, argv, kName, "the GEMV comparison variants (rows2, fp8split) against the CPU reference");
  if (!dev::have_device(kName)) return 0;
  std::printf("%s: seed %llu, %d reps\n", kName, static_cast<unsigned long long>(opt.seed), opt.reps);
  const cuda::LaunchCtx ctx = dev::make_ctx(opt.device);
  const std::unique_ptr<ops::Backend> cpu = ops::make_cpu_backend();
  dev::Rng rng(opt.seed);
  dev::Report report(opt.seed);
  check_rows2(ctx, *cpu, rng, report, opt.reps);
  check_rows2_head(ctx, *cpu, rng, report, opt.reps);
  check_fp8split(ctx, *cpu, rng, report, opt.reps);
  return report.finish(kName);
}
