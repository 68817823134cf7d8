// The MTP drafter (the seed's Glm5NextMtpHead): from the target's hidden state and the next token
// it proposes k draft tokens, one `forward_one` each:
//
//   e = enorm(E[token]); h = hnorm(hidden); x0 = eh_proj [e ; h]
//   x1 = block(x0)                      DSA + routed MoE, plain residual
//   y  = shared_head.norm(x1); draft = argmax(lm_head y)    (vocab-sharded: a cross-rank pick)
//   chaining: the next draft feeds (draft, y) at position + 1
//
// Row space (docs/model.md): drafter row r is (embed(tokens[r+1]), hidden[r]); its KV slot, indexer
// row and position are all r. Rows are written densely: a write anywhere but the current length
// is an Error (and counted), never a silent no-op.
//
// One step of replay: propose(state, t_L, h_{L-1}, k) writes rows L-1 .. L+k-2 and returns the
// drafts; after_verify(state, a) trims the rows built from the drafter's own hiddens (DraftRows);
// append_rows then writes the catch-up rows from the target's true hiddens up to row L+a-1.
//
// cuda_graph on (DrafterOptions): the first propose runs op by op (it sizes the backend's
// scratch), later ones replay a CUDA graph of the whole step per (k, sequence caches); only
// Phase::propose is timed then (the inner phases are inside the graph). The drafter owns the
// graphs: destroy it, or call release_graphs(), before the communicator it was built with.
// Every block forward is one ragged batch of rows (Block::forward): a propose's draft row, a
// batched step's B rows, a chunk of one sequence's context rows. Context rows under
// context_rows full run the whole block (all rows' caches first, then each row's selection and
// attention; their outputs are discarded), under cache_only only the cache writes. With batch_qidx
// the chunk's indexer queries are one batched linear; with the selection check on, each chunk's
// per-row selections are then computed and compared outside the timed phase (the phase's events
// are closed around it).
// NCCL: every host read after collectives goes through comm->wait() (bounded by the collective
// timeout) before the download, never a bare stream synchronise.
//
// Batched drafting (docs/drafter.md): a BatchState is a pool of sequence slots whose caches live
// in one allocation per kind (SlotCaches); propose_batch drafts for B of them in one step, every
// op over the B rows at once, each row at its own position through (slot, pos) in backend memory.
// Context rows (append_rows) and rollback (after_verify) stay per sequence. A sequence's drafts do
// not depend on the batch it is drafted in (bit for bit on the CPU).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "dist/communicator.hpp"
#include "drafter/block.hpp"
#include "drafter/exchange.hpp"
#include "drafter/options.hpp"
#include "drafter/selection_check.hpp"
#include "model/config.hpp"
#include "ops/ops.hpp"

namespace mtplab::drafter {

/// Timing hooks: the harness records backend events at these boundaries.
/// `stats`: the sampling statistics of a propose with ProposeExtras::stats (after the drafts, once
/// per propose / propose_batch), so Phase::propose stays comparable with a greedy propose.
/// `verify`: the target's verify forward of an online step (harness/online.hpp marks it).
enum class Phase { prefill, propose, block, head, exchange, after_verify, catch_up, stats, verify };
const char* to_string(Phase p);
class PhaseTimer {
 public:
  virtual ~PhaseTimer() = default;
  virtual void begin(Phase phase, int index) = 0;
  virtual void end(Phase phase, int index) = 0;
};

/// This rank's vocab rows [v0, v0 + n) of the lm_head (model::ShardPlan::vocab), and the largest
/// shard's row count (allgather_logits pads every shard to it).
struct VocabShard {
  int64_t v0 = 0;
  int64_t n = 0;
  int64_t stride = 0;
};
VocabShard vocab_shard(const model::ShardPlan& plan);

/// The head and front weights in backend memory (the block's are in BlockWeights).
struct FrontWeights {
  ops::Array<bf16> embed;             // [V, H], whole on every rank
  ops::Array<bf16> enorm, hnorm;      // [H]
  ops::Array<bf16> eh_proj;           // [H, 2H]: embedding columns first
  ops::Array<bf16> shared_head_norm;  // [H]
  ops::Array<bf16> lm_head;           // [n, H]: this rank's vocab rows
  ops::Array<fp8e4m3> lm_head_fp8;    // [n, H] E4M3, present when head_fp8 is on
  ops::Array<float> lm_head_scale;    // [n] one fp32 scale per row
};

/// The host-side row bookkeeping of one sequence (single or in a batch's slot).
struct RowCounters {
  int seq_len = 0;
  int propose_start = -1;  ///< row the pending propose started at; -1: none pending
  int last_drafted = 0;
  int rows_written_by_propose = 0;
  int refused_writes = 0;
};

/// Largest decode batch one propose_batch drafts for.
inline constexpr int kMaxBatch = 128;
/// The CUDA graph bucket of a batch of B rows: the smallest of 1, 2, 4, ..., 128 that holds B.
int batch_bucket(int rows);

/// How propose_batch lays out B rows: exactly B, or padded up to batch_bucket(B) with padded
/// rows (slot -1, which read and write nothing), so one recorded graph serves every B of a bucket.
enum class BatchPadding { exact, bucket };

/// The drafter's state: a pool of sequence slots, each with its own caches (in one SlotCaches
/// allocation per kind) and its own row bookkeeping. A slot holds one sequence from
/// MtpDrafter::new_sequence(batch) until release(batch, slot); a released slot takes the next
/// sequence (continuous batching). One sequence is a batch of one (MtpDrafter::new_sequence()).
class BatchState {
 public:
  BatchState(ops::Backend& be, const BlockDims& dims, int slots, BatchPadding padding)
      : caches(be, dims, slots),
        rows_(static_cast<size_t>(slots)),
        live_(static_cast<size_t>(slots), 0),
        padding_(padding) {}
  int slots() const { return caches.slots(); }
  BatchPadding padding() const { return padding_; }
  /// Whether slot s holds a sequence, and how many do.
  bool live(int slot) const { return slot >= 0 && slot < slots() && live_[static_cast<size_t>(slot)]; }
  int live_count() const;
  /// The sequence in slot s (a live slot only): its rows, the row its pending propose started at
  /// (-1: none), the drafts of its last propose, and the writes refused because they were not at
  /// its length.
  int seq_len(int slot) const { return at(slot).seq_len; }
  int propose_start(int slot) const { return at(slot).propose_start; }
  int last_drafted(int slot) const { return at(slot).last_drafted; }
  int refused_writes(int slot) const { return at(slot).refused_writes; }
  SlotCaches caches;

 private:
  friend class MtpDrafter;
  const RowCounters& at(int slot) const;
  RowCounters& at(int slot) { return const_cast<RowCounters&>(std::as_const(*this).at(slot)); }
  std::vector<RowCounters> rows_;
  std::vector<uint8_t> live_;
  BatchPadding padding_;
};

/// One row of a batched propose: the sequence's slot, its input token t_L and the target's
/// hidden h_{L-1} (host, BF16 [H]).
struct BatchRow {
  int slot = -1;
  int32_t token = 0;
  const bf16* hidden = nullptr;
};

/// What the head's logits say about one draft, beside its token.
struct DraftStats {
  float margin = 0;       ///< top-1 minus top-2 logit (raw BF16 logits, no transform)
  float logprob = 0;      ///< log q(draft token) under the transform
  float req_logprob = 0;  ///< log q(requested token) under the transform; -inf outside the support
                          ///< (NaN when the call gave no requested tokens)
};

/// Extras of one propose / propose_batch (default: today's behaviour, nothing more computed).
struct ProposeExtras {
  /// Row-major [rows, k - 1]: the input token of draft i + 1 is chain_tokens[row][i] instead of
  /// draft i (teacher forcing, sampling verification). Empty: the drafter's own drafts (today).
  std::span<const int32_t> chain_tokens;
  /// Row-major [rows, k]: the token whose req_logprob is reported per draft. Empty: none.
  std::span<const int32_t> requested;
  SamplingTransform transform;
  /// When non-null, resized to rows * k and filled (row-major [rows, k]).
  std::vector<DraftStats>* stats = nullptr;
};

class StepGraphs;

class MtpDrafter {
 public:
  /// `comm` is the world communicator (nullptr or size 1 for a single rank).
  MtpDrafter(ops::Backend& be, dist::Communicator* comm, const model::ModelConfig& cfg, BlockDims dims,
             FrontWeights front, BlockWeights block, VocabShard shard, DrafterOptions options);
  ~MtpDrafter();

  // ---- one sequence: a batch of one ------------------------------------------------------------
  /// A batch of one slot whose slot 0 holds a new sequence (empty: no rows). The calls below
  /// without a slot are the batch calls on that slot; they refuse a batch of more slots.
  std::unique_ptr<BatchState> new_sequence();
  void append_rows(BatchState& one, const int32_t* next_tokens, const bf16* hiddens, int n, int row_base,
                   Phase phase = Phase::prefill);
  std::vector<int32_t> propose(BatchState& one, int32_t token, const bf16* hidden, int k,
                               const ProposeExtras& extras = {});
  void after_verify(BatchState& one, int accepted);

  // ---- batched drafting (docs/drafter.md, "Batched drafting") --------------------------------
  /// A pool of `slots` sequence slots (1 .. any; a step drafts for up to kMaxBatch of them).
  /// padding: by default bucket when cuda_graph is on (one graph per bucket), else exact.
  std::unique_ptr<BatchState> new_batch(int slots, std::optional<BatchPadding> padding = std::nullopt);
  /// Takes the lowest free slot for a new sequence (empty: no rows) and returns it; an Error
  /// when every slot is live.
  int new_sequence(BatchState& batch);
  /// Frees slot s (its sequence is finished; a pending propose is dropped).
  void release(BatchState& batch, int slot);
  /// A new sequence whose rows are a copy of the sequence in slot `from` (its caches and row
  /// count; no pending propose): a shared prefix, e.g. one prefilled context for every slot of a
  /// benchmark. Returns its slot; an Error when every slot is live or `from` has a pending propose.
  int fork_sequence(BatchState& batch, int from);
  /// Writes n context rows of the sequence in `slot` starting at row_base: row r = (embed(
  /// next_tokens[r]), hiddens[r]), next_tokens[r] being tokens[row_base + r + 1] of the trace, as
  /// ragged forwards of up to 256 rows of that sequence. Host inputs; hiddens BF16 [n, H]. row_base
  /// must equal the sequence's length, else an Error (and the refusal is counted).
  void append_rows(BatchState& batch, int slot, const int32_t* next_tokens, const bf16* hiddens, int n,
                   int row_base, Phase phase = Phase::prefill);
  /// k drafts from (token, hidden) for each of the B = rows.size() sequences (1 .. kMaxBatch,
  /// distinct live slots, none with a pending propose), each at its own position seq_len(slot), in
  /// one step: every op of a draft runs once for all B rows (docs/drafter.md). Returns drafts
  /// [B, k] row-major (row b's drafts at b * k). Row b's drafts equal those of that sequence
  /// drafted alone, bit for bit on the CPU backend. Writes k rows per sequence (none with skip:
  /// block). Phases are timed once per step.
  /// Extras (docs/drafter.md, "Sampling statistics"), row b's at row b of each array: chain tokens
  /// [B, k - 1] replace the input of drafts 2..k (drafts, rows and rollback are then those of a
  /// propose that had drafted them), and `stats` [B, k] gets each draft's DraftStats under the
  /// transform (one stats pass for all rows and drafts, timed in Phase::stats after the drafts).
  /// Refused: sizes other than those, tokens outside the vocab, requested without stats, stats
  /// with skip: head (no head runs).
  std::vector<int32_t> propose_batch(BatchState& batch, std::span<const BatchRow> rows, int k,
                                     const ProposeExtras& extras = {});
  /// The target's log p(tokens[r]) for n trace rows: lm_head(hiddens[r]) with the BF16 head (no
  /// norm), the transform, at the requested token. hiddens [n, H] host BF16; vocab-sharded: every
  /// rank returns the same values (collective). Batches rows internally (e.g. 64 per head call).
  std::vector<float> target_logprobs(const bf16* hiddens, const int32_t* tokens, int n,
                                     const SamplingTransform&);
  /// Trims the rows of the sequence in `slot`'s last propose that must not stay: keeps the first
  /// (true-hidden) row under DraftRows::rewrite, the `accepted` rows of accepted drafts under
  /// DraftRows::keep.
  void after_verify(BatchState& batch, int slot, int accepted);
  /// The distinct routed experts (global ids, ascending) of the last draft of the last propose
  /// (over its first `rows` rows; a batch of one: its top_k ids):
  /// downloads the router's choice, so call it outside timed phases. Empty with skip: block or
  /// before any propose.
  std::vector<int32_t> last_experts(int rows);
  /// last_experts(rows).size(): what the step's routed-expert bytes scale with.
  int last_distinct_experts(int rows) { return static_cast<int>(last_experts(rows).size()); }

  /// Destroys the recorded CUDA graphs (they are re-recorded when needed). Call before the
  /// communicator goes if the drafter outlives it.
  void release_graphs() noexcept;
  /// Graph recordings so far (0 with cuda_graph off): replays reuse graphs, tests check it.
  int graph_recordings() const;

  /// For tests: keep every draft's head input y (post shared_head.norm) of the last propose,
  /// readable with batch_head_inputs() as BF16 [B, k, H] on the host (row b's draft i at
  /// (b * k + i) * H; head_inputs(): [k, H] of a batch of one). Off by default (one copy per draft).
  void keep_head_inputs(bool on);
  std::vector<bf16> head_inputs();
  std::vector<bf16> batch_head_inputs();

  /// The batch_qidx selection check so far (DrafterOptions::selection_check): every context row
  /// that ran the full block with batch_qidx on, its selection from the batched q_idx against the
  /// one from the per-row q_idx. All zero when the check is off.
  const SelectionCheck& selection_check() const { return check_; }
  void reset_selection_check() { check_ = {}; }
  /// Whether context rows run the selection check (batch_qidx on, context_rows full, check on).
  bool checks_selection() const;

  const DrafterOptions& options() const { return opt_; }
  const VocabShard& shard() const { return shard_; }
  void set_timer(PhaseTimer* timer) { timer_ = timer; }
  ops::Backend& backend() { return be_; }

 private:
  /// The MTP front of one context row (token, its slot, hidden; backend memory) into x0.
  void front(const int32_t* token_dev, const int32_t* slot_dev, const bf16* hidden_dev, bf16* x0);
  /// context_gemm: the front of the `rows` staged context rows into row_x_, eh_proj batched.
  void front_rows(int rows);
  /// append_rows on any sequence's caches: rc's rules and counts, slot `slot` of `caches` the
  /// caches it writes; the rows are appended at rc.seq_len, one ragged forward per chunk.
  void append_rows_to(RowCounters& rc, SlotCaches& caches, int slot, const int32_t* next_tokens,
                      const bf16* hiddens, int n, int row_base, Phase phase);
  /// after_verify's checks, and its trim of rc (returns the new length).
  void require_verify(const RowCounters& rc, int accepted) const;
  int trim_rows(RowCounters& rc, int accepted);
  /// The selection check of the chunk of context rows the block's last forward ran on `rb`.
  void check_chunk(const ops::RowBatch& rb, SlotCaches& caches);
  /// Sizes the batched step's buffers for `rows` padded rows (drops the graphs when they move).
  void reserve_batch(int rows);
  /// The MTP front of n batched rows: tokens [n], hiddens [n, H] -> batch_x_.
  void front_batch(int n, const int32_t* tokens_dev, const bf16* hiddens_dev);
  /// The k drafts of a batched step of n (padded) rows; returns the rows written per sequence.
  int draft_step_batch(BatchState& batch, int n, int k);
  void head_pick_batch(int draft_index, int n, int32_t* tokens_out);
  /// The checks of a call's extras for `rows` rows of k drafts; whether it has chain tokens.
  bool check_extras(const ProposeExtras& x, int rows, int k) const;
  /// Sizes stats_ for the k drafts of `rows` rows (drops the graphs when the buffers move).
  void reserve_stats(int rows);
  /// The stats pass of the last step over rows = k * n logit rows (Phase::stats), then their
  /// download into `out` [B, k] (row b draft i from buffer row i * n + b).
  void stats_pass(int k, int n, int B, bool with_requested, bool truncate, std::vector<DraftStats>& out);
  /// Where the head writes draft i's logits when the step keeps them (null otherwise).
  bf16* step_logits(int draft_index, int n);
  /// comm->wait() when collectives may be pending on a multi-rank communicator.
  void wait_comm();
  void mark_begin(Phase p, int i) {
    if (timer_) timer_->begin(p, i);
  }
  void mark_end(Phase p, int i) {
    if (timer_) timer_->end(p, i);
  }

  ops::Backend& be_;
  dist::Communicator* comm_;
  int world_ = 1, rank_ = 0;
  int hidden_ = 0;
  int64_t vocab_ = 0;
  float eps_ = 1e-5f;
  DrafterOptions opt_;
  VocabShard shard_;
  FrontWeights fw_;
  Block block_;
  PhaseTimer* timer_ = nullptr;

  // Scratch in backend memory.
  ops::Array<bf16> concat_;  // [2H]: one context row's [e ; h] (context_gemm off)
  ops::Array<int32_t> row_tokens_, row_positions_, row_slots_;  // context-row staging
  ops::Array<bf16> row_hiddens_;
  ops::Array<bf16> row_x_;       // [row_chunk, H]: the block inputs of a chunk
  ops::Array<bf16> row_concat_;  // [row_chunk, 2H]: the fronts' [e; h] rows (context_gemm)
  int row_chunk_ = 0;
  SelectionCheck check_;
  std::vector<int32_t> check_batched_, check_per_row_;  // host copies of a chunk's selections
  int max_rows_ = 0;
  bool keep_head_inputs_ = false;
  ops::Array<bf16> batch_head_inputs_;  // [max_draft, rows, H] when keep_head_inputs is on
  int last_batch_k_ = 0, last_batch_n_ = 0, last_batch_rows_ = 0;
  bool proposed_ = false;  // a propose ran (last_experts)
  // The batched step's buffers, [batch_rows_] rows (padded rows included).
  int batch_rows_ = 0;
  ops::Array<int32_t> batch_slot_;      // [rows]: slot per row, -1 padded
  ops::Array<int32_t> batch_pos_;       // [max_draft, rows]: draft i's positions at i * rows
  ops::Array<int32_t> batch_tokens_;    // [1 + max_draft, rows]: input tokens, then each draft's
  ops::Array<bf16> batch_hidden_;       // [rows, H]
  ops::Array<bf16> batch_concat_;       // [rows, 2H]
  ops::Array<bf16> batch_x_, batch_y_;  // [rows, H]
  std::unique_ptr<ExchangeBuffers> batch_xchg_;
  // Extras of the step being drafted (set per call, read while recording: graph key variants).
  bool step_chain_ = false;               // drafts 2..k read chain_tokens (chain_ / batch_chain_)
  bool step_logits_ = false;              // the head keeps every draft's logits in stats_ for the stats pass
  ops::Array<int32_t> batch_chain_;       // [max_draft - 1, rows] draft-major, as batch_tokens_
  std::unique_ptr<StatsBuffers> stats_;   // [max_draft * rows] logit rows, draft-major
  bool stats_warm_ = false;               // an op-by-op stats pass has sized the backend's scratch
  std::unique_ptr<StatsBuffers> target_;  // target_logprobs' chunk of rows
  ops::Array<bf16> target_hidden_;        // [chunk, H]
  ops::Array<int32_t> target_slot_;       // [chunk] zeros: every row live
  ops::Array<ops::ArgMax> target_max_;    // [chunk] (the head's argmax, unused)
  std::vector<int32_t> batch_warm_;       // padded row counts an op-by-op step has run at (cuda_graph)
  std::unique_ptr<StepGraphs> graphs_;    // last member: destroyed first
};

/// Builds BlockDims for this rank from the model config and the world size.
BlockDims block_dims(const model::ModelConfig& cfg, int world, int rank, ops::KvDtype kv_dtype);

}  // namespace mtplab::drafter
