// The kernel choices of a run, as one value: the fields where the CUDA backend has more than one
// kernel that a rule picks (the GEMV variant and k-split, the MLA decode, the batched head, linears,
// decode, pool scores and grouped experts), programmatic dependent launch, and whether the NCCL
// communicators block. A Backend carries the policy it launches under (Backend::set_kernel_policy,
// ops.hpp); the experiment records it per point and keys the point's identity on it, so a resumed
// results file cannot mix kernel paths. The rules that turn a policy into the kernel a launch runs
// live in one place: lib/ops/cuda/dispatch.cpp (with the measurements behind each).
//
// Invariants:
// - The default-constructed policy is what runs when nothing is configured (and no MTPLAB_*
//   variable is set): every choice automatic (the dispatch rules), decode v2, programmatic launch
//   on, blocking NCCL communicators.
// - Every field has one canonical text (its YAML spelling, field_text); parse_field accepts that
//   text (and the number 0 for the automatic counts), so a value prints and parses back to itself.
// - A kernel choice is an enum with its table of (value, text) next to it (kGemvVariantChoices,
//   ...): the texts, the accepted values of its MTPLAB_* variable and the choices an error lists all
//   come from that table, so a new value is the enumerator, its table entry and its dispatch rule.
// - The environment only overrides (env_overrides), for the benchmarks and tuning runs; what it
//   overrode is reported so the caller can record it.
// - Kernels kept only for comparison are no values here: they live in the playgrounds of
//   dev/cuda (docs/kernels.md, "Playgrounds"); naming one (or a retired field) is an Error that
//   says where it went.
//
// What each field changes, for the record (every field is recorded per point regardless):
// - gemv_variant: auto, v1, rows4 and occ give the same bits (same k-split, each lane's chunks
//   summed in ascending order, parts summed in part order). Timing only.
// - gemv_split: a forced k-split changes the summation order of every GEMV, hence the bits.
// - mla_decode: v1 and v2 split and merge the selected rows differently: other summation order,
//   other bits (within the usual tolerances). It picks the kernel of the batched decode's tiles
//   rule (one row included).
// - pdl, nccl_blocking: the same bits, other timing.
// - head_gemm: cuBLASLt and the multi-row GEMV sum a logit in other orders than the MMA kernel
//   (and the CPU twin) and than each other: logits within a BF16 step, picks equal except at
//   near-ties.
// - mla_batch_splits: the split count fixes the merge order of the batched decode (v1 and v2):
//   other bits.
// - moe_pipeline: how the grouped experts' kernels bring their weights in; v1 and ringpf feed the
//   tensor cores the same operands in the same order: the same bits, other timing; slots runs
//   each row on the single-row kernels: each row the one-row op's bits.
// - rows_linear: the multi-row GEMV sums a batched linear's outputs in another order than
//   cuBLASLt: other bits (within the usual tolerances); its own bits do not depend on the batch.
// - indexer_scores: pools4 and tiled compute every score with the same operations in the same
//   order: the same bits, other timing.
// - mla_batch: shared2 computes v1's scores with 2 head tiles of a row in one block and one
//   softmax per tile; the denominator's summation order and its split counts differ from v1's and
//   v2's: other bits (within the usual tolerances). shared32 (4 tiles a block) steps its softmax
//   per 32 rows instead of 16 (the running max moves at other rows): its own bits, within the
//   tolerances.
#pragma once
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/setting.hpp"

namespace mtplab::ops {

/// One value of a kernel choice and its canonical text (its YAML spelling and the value its
/// MTPLAB_* variable takes).
template <typename E>
struct Choice {
  E value;
  std::string_view text;
};

/// The kernels of gemv_bf16, gemv_fp8 and head_argmax (docs/kernels.md, "GEMV"). automatic:
/// per shape from the table in cuda/dispatch.cpp; v1: one row (or part) per warp, 8 loads per lane
/// in flight; rows4: 4 rows per warp; occ: one row per warp at <= 32 registers. linear_group keeps
/// its own kernel.
enum class GemvVariant { automatic, v1, rows4, occ };
inline constexpr Choice<GemvVariant> kGemvVariantChoices[] = {{GemvVariant::automatic, "auto"},
                                                              {GemvVariant::v1, "v1"},
                                                              {GemvVariant::rows4, "rows4"},
                                                              {GemvVariant::occ, "occ"}};

/// The sparse MLA decode's kernel under the batched decode's tiles rule: v2 (the default) streams
/// longer splits and merges them per cluster of 8 over distributed shared memory (FP8 caches, or a
/// forced split count); v1 is the kernel with a combine over every split (BF16 caches under v2,
/// every cache under v1).
enum class MlaDecode { v1, v2 };
inline constexpr Choice<MlaDecode> kMlaDecodeChoices[] = {{MlaDecode::v1, "v1"}, {MlaDecode::v2, "v2"}};

/// The kernel of the batched head (head_argmax_batch): mma, the skinny tensor-core GEMM with its
/// argmax fused (one launch), at every batch size and for both weight types (FP8 rows at up to 16
/// batch rows with FP16 operands, docs/kernels.md); cublaslt, for BF16 rows a cuBLASLt GEMM into a
/// logits scratch, the per-row argmax over it and a finishing launch (three launches); gemv, for
/// FP8 rows at 1 .. cuda::kMaxRowsGemvHead rows the multi-row GEMV with its argmax fused (one
/// launch; more rows take mma); wgmma, for FP8 rows: the warpgroup-MMA kernel (docs/kernels.md,
/// "The head"; two launches: x packed, then the GEMM with its argmax fused), at every
/// batch size; it needs the sm_90a build (CMAKE_CUDA_ARCHITECTURES 90a, the default) and fails with
/// a clear error without it. automatic: the rules of cuda/dispatch.cpp (BF16 rows per batch size,
/// FP8 rows the multi-row GEMV at 1 .. cuda::kMaxRowsGemvHeadAuto rows and cublaslt from 4 rows
/// where cuBLASLt has an FP8 algorithm for the shape, else mma up to 16 rows, wgmma from
/// cuda::kMinRowsWgmmaHead (17) rows where the build has sm_90a), each from its measured table.
/// FP8 rows under cublaslt: x split into two E4M3 parts a row, so that cuBLASLt's FP8 GEMM takes
/// it, the parts' fp32 sums scaled into BF16 logits, then the argmax and finish (docs/kernels.md,
/// "The head"; the FP8 tensor core's rounding: logits within 1/1024 of the largest,
/// not fp32 sums in another order); BF16 rows under gemv or wgmma take what automatic takes (there
/// is no BF16 multi-row or wgmma head).
enum class HeadGemm { automatic, mma, cublaslt, gemv, wgmma };
inline constexpr Choice<HeadGemm> kHeadGemmChoices[] = {{HeadGemm::automatic, "auto"},
                                                        {HeadGemm::mma, "mma"},
                                                        {HeadGemm::cublaslt, "cublaslt"},
                                                        {HeadGemm::gemv, "gemv"},
                                                        {HeadGemm::wgmma, "wgmma"}};

/// The memory pipeline of the grouped expert kernels (moe_experts_grouped, docs/kernels.md "Routed
/// experts"): v1, the weights one 64-column chunk ahead in registers, gate_up's items in
/// runs of 8 per block (the least shared memory: auto's choice where ringpf's rings do not fit);
/// slots, up to cuda::kMaxRowsSlotsMoe rows the single-row kernels for every (row, route) pair
/// (each row the one-row op's bits; more rows take auto's choice above them); ringpf, the weights
/// and the input rows through a per-warp cp.async ring in shared memory several chunks deep,
/// gate_up's items dealt round-robin over every resident block, the weight copies asking the L2
/// for the aligned 256 bytes around each (v1's bits); automatic: slots up to
/// cuda::kMaxRowsSlotsMoeAuto rows, above that ringpf where its rings fit in shared memory, else v1,
/// past 128 rows the block items (slots too; the rule: lib/ops/cuda/dispatch.cu, moe_grouped_plan).
/// The comparison pipelines spread, regs, ring and split live in dev/cuda/moe.cu.
enum class MoePipeline { automatic, v1, slots, ringpf };
inline constexpr Choice<MoePipeline> kMoePipelineChoices[] = {{MoePipeline::automatic, "auto"},
                                                              {MoePipeline::v1, "v1"},
                                                              {MoePipeline::slots, "slots"},
                                                              {MoePipeline::ringpf, "ringpf"}};

/// The kernel of a batched linear (linear / linear_f32 with RowsMode::batched) of 2 or more rows:
/// gemv, the multi-row GEMV (cuda::rows_gemv: every weight read once for all rows, up to
/// cuda::kMaxRowsGemv rows; more rows take cuBLASLt); cublaslt, the cuBLASLt GEMM; automatic, the
/// GEMV up to the row and work limits of cuda/dispatch.cpp and cuBLASLt above them.
enum class RowsLinear { automatic, cublaslt, gemv };
inline constexpr Choice<RowsLinear> kRowsLinearChoices[] = {
    {RowsLinear::automatic, "auto"}, {RowsLinear::cublaslt, "cublaslt"}, {RowsLinear::gemv, "gemv"}};

/// The kernel of the batched MLA decode (mla_decode_batch, 2 or more rows or a batch of one):
/// tiles, one block per (row, head tile of 16, split), by mla_decode and the cache (v1 for BF16
/// caches, v2 for FP8 or a forced split count); shared2, one block per (row, split, 32 heads) whose
/// 2 head tiles share each chunk of selected rows staged once in shared memory through a cp.async
/// ring (v1's scores, one softmax per head tile; two blocks per multiprocessor); shared32, 64 heads
/// a block on chunks of 32 rows (half the barriers and softmax steps per row); automatic, per shape
/// from the measured table in cuda/dispatch.cpp.
enum class MlaBatch { automatic, tiles, shared2, shared32 };
inline constexpr Choice<MlaBatch> kMlaBatchChoices[] = {{MlaBatch::automatic, "auto"},
                                                        {MlaBatch::tiles, "tiles"},
                                                        {MlaBatch::shared2, "shared2"},
                                                        {MlaBatch::shared32, "shared32"}};

/// The kernel of the batched pool scores (indexer_scores_batch): pools4, a warp per 4 pools of a
/// row, lane h holding head h; tiled, a warp per 16 pools of a row on 4 x 4 register tiles of
/// (head, pool) dot products (32 heads; other head counts run pools4); automatic, tiled from the
/// row count of cuda/dispatch.cpp. Both give the same bits.
enum class IndexerScores { automatic, pools4, tiled };
inline constexpr Choice<IndexerScores> kIndexerScoresChoices[] = {
    {IndexerScores::automatic, "auto"}, {IndexerScores::pools4, "pools4"}, {IndexerScores::tiled, "tiled"}};

/// A kernel choice's table, found by its enum (the overload set the field machinery and to_string
/// walk).
constexpr std::span<const Choice<GemvVariant>> choices_of(GemvVariant) { return kGemvVariantChoices; }
constexpr std::span<const Choice<MlaDecode>> choices_of(MlaDecode) { return kMlaDecodeChoices; }
constexpr std::span<const Choice<HeadGemm>> choices_of(HeadGemm) { return kHeadGemmChoices; }
constexpr std::span<const Choice<MoePipeline>> choices_of(MoePipeline) { return kMoePipelineChoices; }
constexpr std::span<const Choice<RowsLinear>> choices_of(RowsLinear) { return kRowsLinearChoices; }
constexpr std::span<const Choice<MlaBatch>> choices_of(MlaBatch) { return kMlaBatchChoices; }
constexpr std::span<const Choice<IndexerScores>> choices_of(IndexerScores) { return kIndexerScoresChoices; }

template <typename E>
concept KernelChoice = requires(E e) {
  choices_of(e);
};

/// The canonical text of a kernel choice ("auto", "rows4", ...), "?" for a value outside its table.
template <KernelChoice E>
constexpr const char* to_string(E value) {
  for (const Choice<E>& c : choices_of(value))
    if (c.value == value) return c.text.data();
  return "?";
}

/// Largest forced split count of the batched MLA decode (mla_batch_splits).
inline constexpr int kMaxMlaBatchSplits = 64;

struct KernelPolicy {
  GemvVariant gemv_variant = GemvVariant::automatic;
  /// k-split of every GEMV (and of linear_group's outputs): 0 = chosen per shape, else 1, 2, 4, 8.
  int gemv_split = 0;
  MlaDecode mla_decode = MlaDecode::v2;
  /// Programmatic dependent launch for eager launches (sm_90 and later; captures never use it).
  bool pdl = true;
  /// The batched BF16 head's GEMM (HeadGemm).
  HeadGemm head_gemm = HeadGemm::automatic;
  /// Splits of the selected rows per (row, head tile) of the batched MLA decode: 0 = chosen per
  /// shape, else 1 .. kMaxMlaBatchSplits. Under mla_decode v1 capped at the chunks of 16 rows a row
  /// has; under v2 rounded up to a multiple of 8 (whole clusters; 1 .. 8 all mean 8), not capped
  /// (a split past the row's chunks is empty), and raised where a split would own more than 32
  /// chunks.
  int mla_batch_splits = 0;
  /// The grouped experts' memory pipeline (MoePipeline).
  MoePipeline moe_pipeline = MoePipeline::automatic;
  /// NCCL communicators created blocking (host calls under a watchdog) or non-blocking (polled).
  /// Read by whoever creates the communicators (dist::Group::connect); the backends ignore it.
  bool nccl_blocking = true;
  /// The batched linears' kernel (RowsLinear).
  RowsLinear rows_linear = RowsLinear::automatic;
  /// The batched MLA decode's kernel (MlaBatch).
  MlaBatch mla_batch = MlaBatch::automatic;
  /// The batched pool scores' kernel (IndexerScores).
  IndexerScores indexer_scores = IndexerScores::automatic;

  friend bool operator==(const KernelPolicy&, const KernelPolicy&) = default;
};

/// The field names in their fixed order: gemv_variant, gemv_split, mla_decode, pdl, nccl_blocking,
/// head_gemm, mla_batch_splits, moe_pipeline, rows_linear, mla_batch, indexer_scores (the order of
/// named()).
const std::vector<std::string_view>& kernel_policy_fields();

/// The canonical text of one field of `p` (its YAML spelling: "auto", "rows4", "4", "on", ...).
/// An unknown field is an Error listing the fields.
std::string field_text(const KernelPolicy& p, std::string_view field);
/// Sets one field of `p` from its text. A bad value is an Error naming the field, the value and
/// the choices (and, for a kernel kept only for comparison, the playground that holds it); an
/// unknown field, one listing the fields (and, for a retired field, why it went).
void parse_field(KernelPolicy& p, std::string_view field, std::string_view text);
/// The accepted values of a field, as a message lists them ("auto, v1, rows4, occ").
std::string field_choices(std::string_view field);
/// The MTPLAB_* variable that overrides a field (env_overrides): "MTPLAB_GEMV_VARIANT", ...
const char* kernel_policy_env(std::string_view field);

/// Every field as a setting descriptor (core/setting.hpp), in kernel_policy_fields() order: its
/// type (a kernel choice, an on/off switch, or a count as text: "auto" or a number), canonical
/// text, parser and whether a results file's identity carries it (the fields that change bits:
/// gemv_variant, gemv_split, mla_decode). The experiment's `kernels:` arms are these
/// (harness/arms.hpp).
const std::vector<Setting<KernelPolicy>>& kernel_policy_settings();

/// (field, canonical text) for every field, in kernel_policy_fields() order.
std::vector<std::pair<std::string, std::string>> named(const KernelPolicy& p);
/// "gemv_variant=auto gemv_split=auto ..." (named() joined), for logs and messages.
std::string to_string(const KernelPolicy& p);

/// Throws an Error naming the field when a field holds a value outside its choices (a policy
/// built by hand); set_kernel_policy calls it.
void validate(const KernelPolicy& p);

/// `base` with each field whose MTPLAB_* variable is set (and not empty) taken from it, parsed
/// strictly (core/env.hpp: a value outside the variable's choices is an Error naming it):
/// MTPLAB_GEMV_VARIANT, MTPLAB_GEMV_SPLIT (1|2|4|8), MTPLAB_MLA_DECODE, MTPLAB_CUDA_PDL (0|1),
/// MTPLAB_NCCL_BLOCKING (0|1), MTPLAB_HEAD_GEMM, MTPLAB_MLA_BATCH_SPLITS (1..64),
/// MTPLAB_MOE_PIPELINE, MTPLAB_ROWS_LINEAR, MTPLAB_MLA_BATCH, MTPLAB_INDEXER_SCORES (a kernel
/// choice's variable takes its table's texts). A retired variable that is set (MTPLAB_MLA_CLUSTERS,
/// MTPLAB_INDEXER_SELECT) is an Error saying why. Every variable that is set is reported in
/// `overridden` (when not null), in field order, as "field=value (VARIABLE)" with the canonical
/// value, also when it equals base's: the environment decided that field. For benchmarks and tuning
/// runs; an experiment records the result and the list.
KernelPolicy env_overrides(const KernelPolicy& base, std::vector<std::string>* overridden);

}  // namespace mtplab::ops
