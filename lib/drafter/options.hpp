// The drafter's arms: every switch of the seed's environment variables, as values an experiment
// sets and the results record. DrafterOptions is the one options struct that crosses from the
// harness to the drafter; drafter_settings() describes each of its fields once (core/setting.hpp),
// and the harness's arm registry (harness/arms.hpp) lifts that table, so each arm is read from the
// experiment straight into its field here. check_options() is the one place where the rules
// between arms (and between an arm and the world size, vocab or backend) are checked, by the
// sweep expansion before anything runs and by the drafter's constructor.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/setting.hpp"
#include "model/sharding.hpp"
#include "ops/ops.hpp"

namespace mtplab::drafter {

/// `head_sharding`: the lm_head replicated, or its vocab rows split over the ranks.
using model::HeadSharding;
/// `context_rows`: prefill / catch-up rows write only the caches, or run the full block.
enum class ContextRows { cache_only, full };
/// `skip`: timing arms. head: stop after the block (draft = token 0); block: run only the head.
enum class Skip { none, head, block };
/// `exchange`: the cross-rank pick of the draft token when the head is vocab-sharded.
enum class Exchange { bf16_lanes, packed_u64, allgather_pairs, allgather_logits };
/// `draft_rows`: after verification, rows a propose built from the drafter's own hiddens are
/// trimmed and rewritten from the target's true hiddens (rewrite), or the rows of accepted drafts
/// are kept and only the rejected ones trimmed (keep).
enum class DraftRows { rewrite, keep };

struct DrafterOptions {
  HeadSharding head_sharding = HeadSharding::none;
  bool head_fp8 = false;
  ContextRows context_rows = ContextRows::cache_only;
  Skip skip = Skip::none;
  Exchange exchange = Exchange::packed_u64;
  DraftRows draft_rows = DraftRows::rewrite;
  /// `draft_len`: k, the drafts of one propose (a propose may ask for fewer; the scratch and the
  /// recorded graphs are sized for this many).
  int draft_len = 3;
  /// `kv_cache_dtype`: the latent KV cache in BF16 or FP8 E4M3 (one fp32 scale per cache).
  ops::KvDtype kv_cache_dtype = ops::KvDtype::bf16;
  /// `cuda_graph`: record the whole propose of k drafts as one CUDA graph per (k, sequence
  /// caches) and replay it (drafter/graph.hpp). Needs a backend that records graphs (cuda), and
  /// refuses exchange bf16_lanes on a vocab-sharded head (it synchronises with the host mid-step).
  bool cuda_graph = false;
  /// `batch_qidx`: with context_rows full, the indexer query projection q_idx = W_qbI c_q of a
  /// chunk of context rows (prefill, catch-up) is one RowsMode::batched linear (one cuBLASLt
  /// GEMM on CUDA) instead of one GEMV per row. The GEMM sums in another order, so near-tied pool
  /// scores can select other pools. No effect with context_rows cache_only (no query rows) or on
  /// propose (one row at a time).
  bool batch_qidx = false;
  /// With batch_qidx (and context_rows full): also compute every context row's per-row (GEMV)
  /// q_idx and selection, outside the timed phase, and count the rows whose selection differs
  /// from the batched one (MtpDrafter::selection_check()). Ignored when batch_qidx is off.
  bool selection_check = true;
  /// `context_gemm`: context rows (prefill and catch-up) run each projection of a chunk of rows
  /// as one batched linear (one cuBLASLt GEMM on the CUDA backend: eh_proj, and the block's
  /// projections of u: kv_a, indexer wk and gate, plus q_a, weights_proj and q_b with
  /// context_rows full) instead of one GEMV per row. On the CPU the two compute the same bits; on
  /// CUDA the GEMM sums in another order, so the caches (and, at near-ties, the drafts) may differ.
  bool context_gemm = false;
  /// `index_share`: the chained drafts 2..k of one propose reuse draft 1's indexer pool selection
  /// (vLLM's and SGLang's index_share_for_mtp_iteration): draft 1 scores the pools and selects as
  /// always; drafts 2..k compute no indexer query, scores or selection and attend to draft 1's
  /// selected pools plus the rows from draft 1's tail to their own position (docs/drafter.md,
  /// "Index share"). The indexer key rows are still written for every row. Every other arm works
  /// with it.
  bool index_share = false;
};

/// The distribution a verifier reads from logits: temperature, then top-k (0: off), then top-p (1: off).
/// (Part of the drafter API, drafter.hpp; here so that the sweep expansion can check it alone.)
/// Not an arm of the drafter: a verifier's choice, passed per call (ProposeExtras, target_logprobs).
struct SamplingTransform {
  double temperature = 1.0;
  int top_k = 0;
  double top_p = 1.0;
};
/// Whether the transform truncates (top_k or top_p active): the support is then not the whole vocab.
inline bool truncates(const SamplingTransform& t) { return t.top_k > 0 || t.top_p < 1.0; }
/// temperature finite and > 0, top_k >= 0, top_p in (0, 1]; an Error naming the key otherwise.
void check_transform(const SamplingTransform& t);

/// What check_options() checks the options against.
struct OptionsContext {
  int world = 1;      ///< ranks the drafter runs on
  int64_t vocab = 0;  ///< the model's vocab (0: not known, vocab rules skipped)
  /// Whether the backend records CUDA graphs: 1 yes, 0 no, -1 not known yet (rules on it skipped).
  int backend_graphs = -1;
};

/// The rules between the arms and their context, in one place: exchange bf16_lanes on a
/// vocab-sharded head runs on exactly 2 ranks and carries token ids below 2^24, and cannot be
/// captured in a graph (it synchronises with the host mid-step); cuda_graph needs a backend that
/// records graphs; draft_len >= 1. Throws an Error naming the arm (its YAML key) that is wrong.
/// index_share needs no rule: it works with every other arm (with draft_len 1 or skip block no
/// chained draft runs the block, so it changes nothing there).
void check_options(const DrafterOptions& o, const OptionsContext& ctx);

/// Every field of DrafterOptions that an experiment sets, as a setting (name, type, values,
/// canonical text), in the order of a point's canonical text. `selection_check` is not one: it is
/// the drafter's own switch for tests, always on in an experiment.
const std::vector<Setting<DrafterOptions>>& drafter_settings();

/// The YAML spelling of every value of each enum, in enum order (the arm registry's choices).
inline constexpr const char* kContextRowsNames[] = {"cache_only", "full"};
inline constexpr const char* kSkipNames[] = {"none", "head", "block"};
inline constexpr const char* kExchangeNames[] = {"bf16_lanes", "packed_u64", "allgather_pairs",
                                                 "allgather_logits"};
inline constexpr const char* kDraftRowsNames[] = {"rewrite", "keep"};
inline constexpr const char* kKvDtypeNames[] = {"bf16", "fp8"};

const char* to_string(ContextRows v);
const char* to_string(Skip v);
const char* to_string(Exchange v);
const char* to_string(DraftRows v);
const char* to_string(ops::KvDtype v);

}  // namespace mtplab::drafter
