// The rules that pick the CUDA backend's kernels (dispatch.hpp), each with the measured table
// behind it. Host code only; a .cu file so that it reads the kernels' shapes (block sizes, chunk
// lengths, shared-memory bounds) from the headers that define them.
#include <algorithm>
#include <array>
#include <cstdint>

#include "core/error.hpp"
#include "ops/cuda/dense.hpp"
#include "ops/cuda/dispatch.hpp"
#include "ops/cuda/gemv.cuh"
#include "ops/cuda/indexer_pool.cuh"
#include "ops/cuda/mla_chunk.cuh"
#include "ops/cuda/mla_shared.cuh"
#include "ops/cuda/moe.hpp"

namespace mtplab::ops::cuda {

// ==== GEMV ==============================================================================================

int gemv_split(const LaunchCtx& ctx, int64_t n, int n_chunks) {
  if (ctx.policy.gemv_split != 0) return ctx.policy.gemv_split;
  // Warps that keep the chip's memory system busy: below that, split each row across warps.
  // Long rows (k >= 8192 BF16: eh_proj, o_proj) aim at two warps per resident slot: measured on
  // the H200, split 4 instead of 2 took eh_proj 20.9 -> 19.8 us and o_proj 38.3 -> 36.1 us
  // (docs/performance.md), while shorter rows lost with more splits.
  const int64_t target_warps = static_cast<int64_t>(ctx.num_sms) * 32 * (n_chunks >= 1024 ? 2 : 1);
  int split = 1;
  while (split < 8 && n * split < target_warps && n_chunks / (split * 2) >= 2 * kWarp) split *= 2;
  return split;
}

int unroll_for(int per_lane, int cap) {
  int u = 2;
  while (u < per_lane && u < cap) u *= 2;
  return u;
}

bool rows_kernel_fits(int rows, int split, int64_t n, int rows_per_group, int num_sms) {
  const int block_rows = kGemvWarps / std::min(split, kGemvWarps) * rows;
  if (split > 4 || n * split < static_cast<int64_t>(rows) * num_sms * 16) return false;
  return !(rows_per_group < n && rows_per_group % block_rows != 0);
}

namespace {

/// The automatic variant per shape: the first rule whose kind and ranges hold wins; none: v1.
/// Filled from the gemv-sweep task of scripts/device/run.sh (docs/kernels.md), e.g.
/// {false, 8192, int64_t{1} << 40, 512, 2048, GemvVariant::rows4} for BF16 rows of k 512..2048 and
/// n >= 8192.
struct AutoRule {
  bool fp8;
  int64_t n_min, n_max;
  int k_min, k_max;
  GemvVariant variant;
};
// From the sweep on one H200 (2026-11-30; graph mode, % of copy):
// the heads gain from 4 rows per warp (one activation load feeds 4 rows: FP8 head 89.9 -> 95.1%,
// BF16 100.9 -> 102.1%); the FP8 eh_proj (56.4 -> 68.4%), q_b (76.8 -> 84.5%) and the k >= 8192
// BF16 GEMVs (eh_proj 80.7 -> 81.8%, o_proj 88.3 -> 88.7%) from the 64-warp occ kernel; kv_b and
// mla_out_v stay on v1 (every variant was slower or equal). All of these give v1's bits.
constexpr int64_t kAnyN = int64_t{1} << 40;
constexpr int kAnyK = 1 << 30;
constexpr std::array<AutoRule, 5> kAutoRules{{
    {false, 65536, kAnyN, 1, kAnyK, GemvVariant::rows4},  // the BF16 head
    {true, 65536, kAnyN, 1, kAnyK, GemvVariant::rows4},   // the FP8 head
    {true, 1, 65535, 1, kAnyK, GemvVariant::occ},         // FP8 eh_proj
    {false, 8192, 65535, 1024, 2048, GemvVariant::occ},   // q_b
    {false, 1, 16384, 8192, kAnyK, GemvVariant::occ},     // eh_proj, o_proj
}};

GemvVariant automatic_variant(bool fp8, int64_t n, int k) {
  for (const AutoRule& r : kAutoRules)
    if (r.fp8 == fp8 && n >= r.n_min && n <= r.n_max && k >= r.k_min && k <= r.k_max) return r.variant;
  return GemvVariant::v1;
}

}  // namespace

/// The instances that exist (gemv.cu's launch_gemv): the rows kernels for splits 1, 2, 4 and occ
/// for every split, with the argmax only unsplit (the head's shapes), no fp32 output (router-sized
/// GEMVs); rows4 only where its rows fit (rows_kernel_fits). Anything else runs v1.
GemvPlan gemv_plan(const LaunchCtx& ctx, bool fp8, bool argmax, bool f32_out, int64_t n, int k,
                   int rows_per_group) {
  const int n_chunks = k / (fp8 ? 16 : 8);
  GemvVariant v = ctx.policy.gemv_variant;
  if (v == GemvVariant::automatic) v = automatic_variant(fp8, n, k);
  GemvPlan plan;
  plan.split = gemv_split(ctx, n, n_chunks);
  plan.unroll = kUnroll;
  // Rows of at most 2 chunks per lane (k <= 512 BF16 unsplit: mla_out_v, kv_b) need no 8-deep
  // unroll; the 2-deep kernel holds fewer registers, so twice the warps (and bytes) are in flight.
  // Each lane still adds its chunks in ascending order: the same bits as the 8-deep kernel.
  if (plan.split == 1 && n_chunks <= 2 * kWarp) plan.unroll = 2;
  if (v == GemvVariant::v1) return plan;
  if (f32_out || (argmax && plan.split != 1)) return plan;
  const int per_lane = (n_chunks + plan.split * kWarp - 1) / (plan.split * kWarp);
  switch (v) {
    case GemvVariant::occ:
      // 2 loads per lane: at 4 the 32-register bound spills (ptxas, sm_90).
      plan.kernel = v;
      plan.unroll = 2;
      return plan;
    case GemvVariant::rows4:
      if (!rows_kernel_fits(4, plan.split, n, rows_per_group, ctx.num_sms)) return plan;
      plan.kernel = v;
      plan.unroll = unroll_for(per_lane, 4);
      return plan;
    case GemvVariant::automatic:
    case GemvVariant::v1:
      break;
  }
  return plan;
}

// ==== the batched head ==================================================================================

namespace {

// BF16 rows: measured on one H200 (the glm5.3-flash head
// [154880 x 4096], 2026-12-02): cuBLASLt + argmax + finish took 308 / 326 / 330 / 344 / 356 us at
// 1 / 4 / 16 / 64 / 128 rows against the fused MMA kernel's 342 / 339 / 368 / 505 / 1121 us: the
// fused kernel's tensor-core work, not W's bytes, sets its time from 16 rows up, and the extra pass
// over the logits costs less than the difference at every size. So automatic is cuBLASLt for
// every batched head of 2 or more rows (one row: the fused kernel, as the single-sequence path has
// its own head). gemv names the FP8 head's multi-row GEMV; there is no BF16 one, so BF16 rows take
// automatic's choice.
constexpr int kHeadLtMinRows = 2;
// FP8 rows through cuBLASLt's FP8 GEMM on x's E4M3 parts: measured on an H200 (graph
// mode, per launch): 164 / 170 / 179 / 200 / 242 / 395 us at
// 4 / 8 / 16 / 32 / 64 / 128 rows against the fused kernels' 189 / 190 / 252 / 279 / 330 / 467,
// and 161 against the multi-row GEMV's 155 at 2 rows.
constexpr int kFp8HeadLtMinRows = 4;

}  // namespace

bool head_on_cublaslt(const KernelPolicy& policy, bool fp8, int rows,
                      const std::function<bool()>& fp8_plans_exist) {
  switch (policy.head_gemm) {
    case HeadGemm::mma:
      return false;
    case HeadGemm::cublaslt:
      return !fp8 || fp8_plans_exist();
    case HeadGemm::gemv:
    case HeadGemm::wgmma:
      if (fp8) return false;
      break;
    case HeadGemm::automatic:
      break;
  }
  if (fp8) return rows >= kFp8HeadLtMinRows && fp8_plans_exist();
  return rows >= kHeadLtMinRows;
}

HeadKernel head_fused_kernel(const KernelPolicy& policy, bool fp8, int rows, int k) {
  return head_fused_kernel(policy, fp8, rows, k, have_wgmma());
}

HeadKernel head_fused_kernel(const KernelPolicy& policy, bool fp8, int rows, int k, bool wgmma_built) {
  if (!fp8) return HeadKernel::mma;
  // The multi-row GEMV head: under gemv where it fits; under auto up to kMaxRowsGemvHeadAuto rows
  // where it fits: at 4 rows the resident MMA kernel with FP16 operands is faster (191 against 210
  // us on an H200, docs/kernels.md). Never under mma, wgmma, or cublaslt (whose FP8 fallback where
  // cuBLASLt has no algorithm is the MMA kernel).
  const bool gemv = policy.head_gemm == HeadGemm::gemv ||
                    (policy.head_gemm == HeadGemm::automatic && rows <= kMaxRowsGemvHeadAuto);
  if (gemv && head_gemv_fits(rows, k)) return HeadKernel::gemv;
  // The wgmma head: always under wgmma (an error where the build lacks it); under auto from
  // kMinRowsWgmmaHead rows where the build has it: from 17 rows the mma.sync kernel leaves its
  // resident mode (measured on an H200, 279 against 337
  // us at 32 rows, 334 / 447 at 64, 457 / 704 at 128; equal at 16).
  if (policy.head_gemm == HeadGemm::wgmma) {
    MTP_REQUIRE(wgmma_built,
                "ops::cuda::head_argmax_batch: head_gemm wgmma needs the sm_90a device code; "
                "this build's CUDA architectures have no 90a (configure with CMAKE_CUDA_ARCHITECTURES=90a)");
    return HeadKernel::wgmma;
  }
  if (policy.head_gemm == HeadGemm::automatic && wgmma_built && rows >= kMinRowsWgmmaHead)
    return HeadKernel::wgmma;
  return HeadKernel::mma;
}

int head_lt_launch_rows(int rows) {
  // Past 128 rows the head's GEMM is bound by its tensor-core work, not by reading W (154880 x
  // 4096 at 256 rows: 325 GFLOP against 1.3 GB), so launches of 256 rows lose little to reading W
  // once a launch and keep the logits scratch (FP8: fp32 [2 x rows][n]) at 317 MB.
  return rows > kMaxBatchRows ? kHeadLtWideRows : kMaxBatchRows;
}

// ==== batched linears ===================================================================================

namespace {

// rows_linear = auto, from the measured comparison with cuBLASLt (bench_kernels' "batch
// rows_linear" cases on one H200, docs/kernels.md): the GEMV wins the small weights (kv_a, the
// indexer's wk / gate / wq_b, the router: 1-3 us of cuBLASLt's ~5 us floor per launch) up to 8
// rows, and loses the large ones (eh_proj, o_proj: 1.3-3.8x slower from 2 rows), so it takes a
// linear of at most 8 rows whose rows x n x k is at most 20 M multiply-adds. (The skinny
// tensor-core GEMM, mla_out_v_batch's kernel, lost to cuBLASLt at every batched linear of that
// comparison: no rule gives it a linear.)
constexpr int kRowsGemvAutoMax = 8;
constexpr int64_t kRowsGemvAutoWork = 20'000'000;

}  // namespace

bool rows_linear_on_gemv(const KernelPolicy& policy, int rows, int64_t n, int k, bool aligned) {
  switch (policy.rows_linear) {
    case RowsLinear::cublaslt:
      return false;
    case RowsLinear::gemv:
      // Forced up to kMaxRowsGemv rows (the launcher refuses a k that is not a multiple of 8 or
      // unaligned operands).
      return rows <= kMaxRowsGemv;
    case RowsLinear::automatic:
      break;
  }
  return rows <= kRowsGemvAutoMax && static_cast<int64_t>(rows) * n * k <= kRowsGemvAutoWork && k % 8 == 0 &&
         aligned;
}

// ==== the batched MLA decode ============================================================================

BatchDecodeKernel mla_batch_kernel(const KernelPolicy& policy, bool fp8_cache, int rows) {
  switch (policy.mla_batch) {
    case MlaBatch::shared2:
      return BatchDecodeKernel::shared2;
    case MlaBatch::shared32:
      return BatchDecodeKernel::shared32;
    case MlaBatch::automatic:
      // From two rows a shared kernel (the head tiles of a row share each staged chunk): shared2
      // up to 8 rows, shared32 above, as measured on one H200 (glm5.3-flash, 2051 selected rows,
      // BF16 cache, graph mode, us; docs/kernels.md; shared, 4 tiles on 16-row chunks, is the
      // comparison kernel of dev/cuda/mla.cu): shared2 / shared 18.7 / 24.2 at B = 2, 27.8 /
      // 27.9 at 4; shared2 / shared / shared32 34.8 / 36.1 / 34.6 at 8, 56.4 / 55.9 / 52.8 at 16,
      // 159.0 / 156.3 / 140.4 at 64, 257.5 / 249.3 / 219.8 at 128. A batch of one keeps the tiles
      // rule below.
      if (rows >= 2) return rows <= 8 ? BatchDecodeKernel::shared2 : BatchDecodeKernel::shared32;
      break;
    case MlaBatch::tiles:
      break;
  }
  // The tiles rule. Under mla_decode v2 the batched decode takes the v2 kernel for FP8 caches and
  // the v1 kernel for BF16 ones, as measured on one H200 (glm5.3-flash, 2051 selected rows,
  // docs/kernels.md): BF16 v1 / v2 27 / 34 us at B = 1, 146 / 205 at 16, 376 / 417 at 64, 682 / 788
  // at 128; FP8 110 / 126 at 16, 453 / 374 at 64, 847 / 732 at 128. A forced split count
  // (mla_batch_splits) follows the policy's kernel whatever the cache, so a batch's v2 can be
  // compared row by row with each row decoded alone.
  if (policy.mla_decode != MlaDecode::v2) return BatchDecodeKernel::v1;
  return fp8_cache || policy.mla_batch_splits > 0 ? BatchDecodeKernel::v2 : BatchDecodeKernel::v1;
}

int shared_decode_splits(int num_sms, int chunks, int n_heads, int rows, int forced, int tiles_per_block,
                         int blocks_per_sm, int max_split_rows) {
  // At least enough splits for the slot table's bound; else a forced count (capped at the chunks),
  // or as many splits as keep the launch within one wave, with at least 4 chunks of 16 rows per
  // split (the combine reads splits x kv_lora per head).
  const int least = (chunks * mla::kChunk + max_split_rows - 1) / max_split_rows;
  if (forced > 0) return std::max(least, std::min(forced, chunks));
  const int per_block = tiles_per_block * mla::kHeadTile;
  const int64_t blocks = static_cast<int64_t>((n_heads + per_block - 1) / per_block) * rows;
  const int want =
      static_cast<int>(std::max<int64_t>(1, static_cast<int64_t>(num_sms) * blocks_per_sm / blocks));
  return std::max(least, std::min(want, std::max(1, chunks / 4)));
}

int v2_decode_clusters(int num_sms, int chunks, int64_t units, int forced) {
  // About one block per multiprocessor over the launch, and no more clusters than it takes to give
  // every split a chunk; either count is raised where a split would own more than kMaxSplitChunks
  // chunks (a large batch: one cluster per (row, head tile)).
  const int64_t per_cluster = mla::kCluster * mla::kMaxSplitChunks;
  int64_t clusters = forced;
  if (clusters == 0) {
    clusters = std::max<int64_t>(1, (num_sms + units * mla::kCluster / 2) / (units * mla::kCluster));
    clusters = std::min<int64_t>(clusters, (chunks + mla::kCluster - 1) / mla::kCluster);
  }
  clusters = std::max<int64_t>(clusters, (chunks + per_cluster - 1) / per_cluster);
  return static_cast<int>(clusters);
}

int mla_batch_splits(const LaunchCtx& ctx, int width, int n_heads, int rows, bool fp8_cache) {
  const int chunks = std::max(1, (width + mla::kChunk - 1) / mla::kChunk);
  const int tiles = (n_heads + mla::kHeadTile - 1) / mla::kHeadTile;
  const int forced = ctx.policy.mla_batch_splits;
  switch (mla_batch_kernel(ctx.policy, fp8_cache, rows)) {
    case BatchDecodeKernel::shared2:  // 2 tiles a block, two blocks per multiprocessor
      return shared_decode_splits(ctx.num_sms, chunks, n_heads, rows, forced, 2, 2, mla::kSharedMaxSplitRows);
    case BatchDecodeKernel::shared32:  // 4 tiles a block on 32-row chunks, one block per multiprocessor
      return shared_decode_splits(ctx.num_sms, chunks, n_heads, rows, forced, 4, 1,
                                  mla::kShared32MaxSplitRows);
    case BatchDecodeKernel::v2: {
      // One block per multiprocessor over every (row, head tile) of the batch; a forced count
      // rounded up to whole clusters of 8 (raised, as any, where a split would own more than 32
      // chunks).
      const int clusters = forced > 0 ? (forced + mla::kCluster - 1) / mla::kCluster : 0;
      return v2_decode_clusters(ctx.num_sms, chunks, static_cast<int64_t>(tiles) * rows, clusters) *
             mla::kCluster;
    }
    case BatchDecodeKernel::v1:
      break;
  }
  if (forced > 0) return std::min(forced, chunks);
  // v1: at least two chunks of 16 rows per block, and about two blocks per multiprocessor over the
  // whole batch: a large batch fills the chip with one split per row (no combine).
  const int64_t work = static_cast<int64_t>(chunks) * tiles * rows;
  const int per_split =
      static_cast<int>(std::max<int64_t>(2, (work + 2 * ctx.num_sms - 1) / (2 * ctx.num_sms)));
  return std::max(1, (chunks + per_split - 1) / per_split);
}

// ==== the grouped experts ==============================================================================

MoePlan moe_grouped_plan(const KernelPolicy& policy, int rows, bool slots_fit, bool ring_fits) {
  MoePlan plan;
  plan.wide = rows > kMaxBatchRows;
  switch (policy.moe_pipeline) {
    case MoePipeline::v1:
      plan.kernel = MoeKernel::v1;
      return plan;
    case MoePipeline::ringpf:
      plan.kernel = MoeKernel::ringpf;
      return plan;
    case MoePipeline::slots:
      // Up to kMaxRowsSlotsMoe rows where the down launch fits its warps; more rows take auto's
      // choice above the slots rows (block items past kMaxBatchRows).
      if (slots_fit) {
        plan.kernel = MoeKernel::slots;
        return plan;
      }
      break;
    case MoePipeline::automatic:
      // The single-row kernels at 1 - 3 rows, measured on one H200 (glm5.3-flash, graph mode, per
      // launch, us; docs/kernels.md, "Routed experts"): slots / ring 111.5 / 177.7 at B = 1,
      // 218.3 / 278.6 at 2, 355.2 / 375.2 at 3, 440.1 / 432.5 at 4; in the step at B = 2 BF16
      // 688.0 against ring's 705.8, at B = 4 936.1 against 915.3. So auto stops below 4.
      if (rows <= kMaxRowsSlotsMoeAuto && slots_fit) {
        plan.kernel = MoeKernel::slots;
        return plan;
      }
      break;
  }
  // Above the slots rows: ringpf, ring with the L2 prefetch hint on its weight copies (ring's
  // bits), measured fastest or level at every batch: ring against v1 on one H200 (per launch, us)
  // 274 / 317 at B = 2, 432 / 440 at 4, 1388 / 1409 at 16, 3228 / 3255 at 64, 3956 / 4194 at 128;
  // ringpf against ring in the step (one H100, BF16, us) 1170.7 / 1202.5 at B = 4, 3947.5 / 4145.1
  // at 64, 4788.9 / 4992.9 at 128. split is faster as a launch at 1 - 2 rows (142 / 174, 246 /
  // 275) but gave no step a gain (698.8 against ring's 694.7 at B = 2) and loses from 4 rows, so
  // auto never takes it (ring, split and the other comparison pipelines: dev/cuda/moe.cu). Where ring's rings
  // with the plan and d do not fit a block's shared memory (a launch of many routes and local experts), v1,
  // the least shared memory (v1's bits as ring's). Past kMaxBatchRows rows the block items: an expert has
  // tens of pairs there, and the one-warp items read each weight tile once per 16 of them and gather a
  // group's rows again for every 16-row tile. Measured on one H100 (the verify layer, one ragged forward;
  // CHANGELOG, 5af902c .. 24616b8), one-warp ringpf items against block items, us: B = 128, R = 5 (640 rows)
  // 10973 / 7334 (2.31x / 1.53x the floor), R = 3 (384 rows) 7545 / 6097; B = 32, R = 5 (160 rows) 4905 /
  // 4963 (+1%). The same bits (v1's).
  if (plan.wide) {
    plan.kernel = MoeKernel::block_items;
    return plan;
  }
  plan.kernel = ring_fits ? MoeKernel::ringpf : MoeKernel::v1;
  return plan;
}

// ==== the indexer =======================================================================================

bool indexer_scores_tiled(const KernelPolicy& policy, int rows, int n_heads, int D) {
  // The tiled kernel's shape: 32 heads, whole 16-byte vectors, keys that fit its rings (D <= 172).
  if (n_heads != indexer::kTileHeads || D % 4 != 0 ||
      indexer::tiled_scores_smem(D) > indexer::kTiledScoresMaxSmem)
    return false;
  switch (policy.indexer_scores) {
    case IndexerScores::tiled:
      return true;
    case IndexerScores::pools4:
      return false;
    case IndexerScores::automatic:
      break;
  }
  // Measured (one H100, mtplab_bench_kernels --only "batch indexer_scores", graph mode, per
  // launch, medians of 10; docs/perf/2026-12-06-s16-h100-bench_kernels-indexer-2ff6a78.txt), us:
  //   B        1     16    32    64    128
  //   pools4   5.4   13.2  25.2  50.2  99.6
  //   tiled    8.4   9.3   15.1  28.0  52.8
  // At one row the tiled grid leaves most SMs idle (8 blocks hold the 1024 candidate pools), so
  // auto keeps pools4 below 16 rows.
  return rows >= kMinRowsTiledScores;
}

// ==== what ran ==========================================================================================

const char* kernel_text(const GemvPlan& plan) {
  static constexpr const char* kTexts[3][4] = {
      {"v1 split 1", "v1 split 2", "v1 split 4", "v1 split 8"},
      {"rows4 split 1", "rows4 split 2", "rows4 split 4", "rows4 split 8"},
      {"occ split 1", "occ split 2", "occ split 4", "occ split 8"}};
  const int kernel = plan.kernel == GemvVariant::rows4 ? 1 : plan.kernel == GemvVariant::occ ? 2 : 0;
  const int split = plan.split <= 1 ? 0 : plan.split == 2 ? 1 : plan.split == 4 ? 2 : 3;
  return kTexts[kernel][split];
}

const char* kernel_text(HeadKernel kernel) {
  static constexpr const char* kTexts[] = {"mma", "gemv", "wgmma"};  // HeadKernel's order
  return kTexts[static_cast<int>(kernel)];
}

const char* kernel_text(BatchDecodeKernel kernel) {
  static constexpr const char* kTexts[] = {"v1", "v2", "shared2", "shared32"};  // BatchDecodeKernel's order
  return kTexts[static_cast<int>(kernel)];
}

const char* kernel_text(const MoePlan& plan) {
  // MoeKernel's order; a wide launch's texts second (slots has none; block items are always
  // wide).
  static constexpr const char* kTexts[][2] = {
      {"slots", "slots"}, {"v1", "v1 wide"}, {"ringpf", "ringpf wide"}, {"block items", "block items"}};
  return kTexts[static_cast<int>(plan.kernel)][plan.wide ? 1 : 0];
}

}  // namespace mtplab::ops::cuda
