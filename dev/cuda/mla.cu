// The batched MLA decode's comparison kernel (no rule of the library picks it): shared, the shared
// decode (mla_shared.cuh) with 4 head tiles a block on chunks of 16 rows. Checked against the CPU
// reference (lib/ops/cpu/mla.cpp) and timed against the library's choice for the batch (shared2 up
// to 8 rows, shared32 above).
// - Against the CPU: gpu_test_util.hpp's BF16 tolerance (2 ulps + 1/4096 of the largest
//   |reference|, at least 90% bit-identical), BF16 and FP8 caches, every row on its own slot of a
//   pool with interleaved blocks, rows of different selection lengths (one selecting nothing).
// - Against the library: at a forced split count, shared and the library's shared2 run the same chunk
//   step per head tile on the same split boundaries (only how many tiles share a block differs), so
//   their outputs must be the same bytes.
// Run: mtplab_dev_mla [--reps N] [--seed S] [--device D] (playground.hpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "ops/cuda/dispatch.hpp"
#include "ops/cuda/mla.hpp"
#include "ops/cuda/mla_shared.cuh"
#include "ops/ops.hpp"
#include "playground.hpp"

namespace mtplab::ops::cuda {
namespace {

constexpr int kSharedTiles = 4;  // 64 heads a block
constexpr int kSharedRows = 16;  // rows a chunk

/// The comparison kernel's split count: the library's rule for its shared kernels
/// (dispatch.cu's shared_decode_splits) at 4 tiles a block, one block per multiprocessor and the
/// 16-row chunks' slot table bound.
int shared_splits(int num_sms, int width, int n_heads, int rows, int forced) {
  const int chunks = std::max(1, (width + mla::kChunk - 1) / mla::kChunk);
  return shared_decode_splits(num_sms, chunks, n_heads, rows, forced, kSharedTiles, 1,
                              mla::kSharedMaxSplitRows);
}

/// The shared decode of `rows` rows at `splits` splits, then the combine (splits > 1).
void decode_shared(const LaunchCtx& ctx, const mla::DecodeParams& p, bool fp8, int rows) {
  mla::with_decode_shape(p.kv_lora, fp8, [&](auto cw, auto f8) {
    mla::launch_decode_shared<cw(), f8(), kSharedTiles, kSharedRows>(ctx, p, rows);
  });
  if (p.splits > 1) mla_combine_rows(ctx, p.scratch, p.slot, rows, p.splits, p.n_heads, p.kv_lora, p.o_lat);
}

}  // namespace
}  // namespace mtplab::ops::cuda

namespace {

using namespace mtplab;
namespace cuda = mtplab::ops::cuda;
using dev::DeviceBuffer;

constexpr const char* kName = "mtplab_dev_mla";

struct Case {
  const char* name;
  int n_heads, kv_lora, rows;
  ops::KvDtype dtype;
};
// glm5.3-flash's decode (64 heads of 512, K = 2048 + the pool's tail) at B = 2 and 8, a small
// model's (16 heads of 256) at B = 16; both caches.
const Case kCases[] = {
    {"glm5.3-flash", 64, 512, 2, ops::KvDtype::bf16}, {"glm5.3-flash", 64, 512, 8, ops::KvDtype::bf16},
    {"glm5.3-flash", 64, 512, 2, ops::KvDtype::fp8},  {"glm5.3-flash", 64, 512, 8, ops::KvDtype::fp8},
    {"small", 16, 256, 16, ops::KvDtype::bf16},       {"small", 16, 256, 16, ops::KvDtype::fp8}};

void check_case(const cuda::LaunchCtx& ctx, ops::Backend& cpu, dev::Rng& rng, dev::Report& report, int reps,
                const Case& c) {
  const bool fp8 = c.dtype == ops::KvDtype::fp8;
  const int B = c.rows, nh = c.n_heads, L = c.kv_lora;
  const int K = 2048, P = 4, width = K + P - 1, block_size = 64, seq_rows = 4096,
            max_blocks = seq_rows / block_size;
  const float softmax_scale = 1.0f / 16.0f;
  const std::string what = str("shared ", c.name, " ", fp8 ? "fp8" : "bf16", " B=", B);
  // The pool: slot s's block j is physical block j * B + s (interleaved).
  const size_t values = static_cast<size_t>(B) * seq_rows * L;
  std::vector<uint8_t> data(values * (fp8 ? 1 : 2));
  if (fp8) {
    const std::vector<fp8e4m3> codes = rng.fp8s(values);
    std::memcpy(data.data(), codes.data(), values);
  } else {
    const std::vector<bf16> v = rng.bf16s(values, -1.0f, 1.0f);
    std::memcpy(data.data(), v.data(), values * 2);
  }
  std::vector<int32_t> tables(static_cast<size_t>(B) * max_blocks), slots(static_cast<size_t>(B));
  for (int s = 0; s < B; ++s)
    for (int j = 0; j < max_blocks; ++j) tables[static_cast<size_t>(s) * max_blocks + j] = j * B + s;
  std::iota(slots.begin(), slots.end(), 0);
  // Selections of distinct rows of the slot (i + 7b), -1 padded: row 0 the full width, row 1 one
  // row, row 2 (where there is one) nothing, the others a random length.
  std::vector<int32_t> sel(static_cast<size_t>(B) * width, -1);
  for (int b = 0; b < B; ++b) {
    const int len = b == 0 ? width : b == 1 ? 1 : b == 2 ? 0 : 1 + static_cast<int>(rng.next() % width);
    for (int i = 0; i < len; ++i)
      sel[static_cast<size_t>(b) * width + i] = static_cast<int32_t>((i + 7 * b) % seq_rows);
  }
  const std::vector<bf16> q_abs = rng.bf16s(static_cast<size_t>(B) * nh * L, -4.0f, 4.0f);
  const float scale = fp8 ? 1.0f / 448.0f : 1.0f;
  const int num_blocks = B * max_blocks;
  std::vector<bf16> want(static_cast<size_t>(B) * nh * L);
  cpu.mla_decode_batch(q_abs.data(), sel.data(), width, ops::RowBatch{slots.data(), nullptr, B, 1},
                       ops::KvSlots{ops::KvCache{data.data(), c.dtype, scale, num_blocks, block_size, L},
                                    tables.data(), B, max_blocks},
                       want.data(), nh, softmax_scale);

  DeviceBuffer<uint8_t> d_data(data);
  DeviceBuffer<int32_t> d_tables(tables), d_slots(slots), d_sel(sel);
  DeviceBuffer<bf16> d_q(q_abs), o(want.size()), o_lib(want.size());
  const ops::KvSlots kv{ops::KvCache{d_data.data(), c.dtype, scale, num_blocks, block_size, L},
                        d_tables.data(), B, max_blocks};
  const int splits = cuda::shared_splits(ctx.num_sms, width, nh, B, 0);
  const int most = std::max(splits, 7);  // the automatic count and the forced ones below
  DeviceBuffer<float> scratch(static_cast<size_t>(B) * nh * most * (2 + static_cast<size_t>(L)));
  auto params = [&](int splits, bf16* out) {
    return cuda::mla::DecodeParams{d_q.data(),
                                   d_sel.data(),
                                   width,
                                   d_slots.data(),
                                   kv.block_tables,
                                   kv.max_blocks,
                                   kv.cache.data,
                                   scale,
                                   block_size,
                                   L,
                                   nh,
                                   softmax_scale,
                                   splits,
                                   scratch.data(),
                                   out};
  };
  // The library under a policy: its split count, scratch and decode, as the backend runs them.
  DeviceBuffer<float> lib_scratch(static_cast<size_t>(B) * nh * 64 * (2 + static_cast<size_t>(L)));
  auto library = [&](const cuda::LaunchCtx& c2, bf16* out) {
    const int splits = cuda::mla_batch_splits(c2, width, nh, B, fp8);
    MTP_REQUIRE(cuda::mla_decode_batch_scratch_floats(c2, splits, nh, L, B, fp8) <= lib_scratch.size(),
                "the playground's scratch is too small for the library's ", splits, " splits");
    cuda::mla_decode_batch(c2, d_q.data(), d_sel.data(), width, d_slots.data(), B, kv, out, nh, softmax_scale,
                           splits, lib_scratch.data());
  };

  o.poison();
  cuda::decode_shared(ctx, params(splits, o.data()), fp8, B);
  report.bf16_close(str(what, " (", splits, " splits) against the CPU"), o.download(), want);
  for (int forced : {1, 3, 7}) {
    const int f = cuda::shared_splits(ctx.num_sms, width, nh, B, forced);
    o.poison();
    cuda::decode_shared(ctx, params(f, o.data()), fp8, B);
    const std::vector<bf16> got = o.download();
    report.bf16_close(str(what, ", ", forced, " forced splits, against the CPU"), got, want);
    cuda::LaunchCtx two = ctx;
    two.policy.mla_batch = ops::MlaBatch::shared2;
    two.policy.mla_batch_splits = forced;
    o_lib.poison();
    library(two, o_lib.data());
    report.equal(str(what, ", ", forced, " forced splits: the library's shared2 bytes"), got,
                 o_lib.download());
  }
  const cuda::LaunchCtx lib = ctx;  // the default policy: the library's automatic choice
  dev::Report::timing(
      what,
      dev::median_ms(ctx.stream, reps, [&] { cuda::decode_shared(ctx, params(splits, o.data()), fp8, B); }),
      str("library (", ops::to_string(lib.policy.mla_batch), ": ", B <= 8 ? "shared2" : "shared32", ")"),
      dev::median_ms(ctx.stream, reps, [&] { library(lib, o_lib.data()); }));
}

}  // namespace

int main(int argc, char** argv) {
  const dev::Options opt = dev::parse_options(
      argc, argv, kName, "the batched MLA decode's comparison kernel (shared) against the CPU reference");
  if (!dev::have_device(kName)) return 0;
  std::printf("%s: seed %llu, %d reps\n", kName, static_cast<unsigned long long>(opt.seed), opt.reps);
  const cuda::LaunchCtx ctx = dev::make_ctx(opt.device);
  const std::unique_ptr<ops::Backend> cpu = ops::make_cpu_backend();
  dev::Rng rng(opt.seed);
  dev::Report report(opt.seed);
  for (const Case& c : kCases) check_case(ctx, *cpu, rng, report, opt.reps, c);
  return report.finish(kName);
}
