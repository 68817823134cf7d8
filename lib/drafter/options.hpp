// The drafter's arms: every switch of the seed's environment variables, as values an experiment
// sets and the results record.
#pragma once
#include <string>
#include <vector>

#include "model/sharding.hpp"

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
  int max_draft_len = 4;
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
};

const char* to_string(ContextRows v);
const char* to_string(Skip v);
const char* to_string(Exchange v);
const char* to_string(DraftRows v);
/// Parsers; an unknown value is an Error listing the choices.
ContextRows parse_context_rows(const std::string& s);
Skip parse_skip(const std::string& s);
Exchange parse_exchange(const std::string& s);
DraftRows parse_draft_rows(const std::string& s);

}  // namespace mtplab::drafter
