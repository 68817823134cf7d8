// mtplab's target (docs/target.md): the model the MTP layer drafts for, run for real. L trunk
// layers of the MTP layer's block (DSA attention, then routed experts, or a dense MLP for the
// first first_k_dense_replace layers), the final RMSNorm and the lm_head the MTP layer shares;
// weights synthetic (seeded) or from a checkpoint (model::TargetWeights); sharded over the ranks as
// the MTP block is (heads and o_proj row-parallel, routed experts and the dense / shared MLP
// columns over the ranks, the head by vocabulary when head_sharding is vocab).
//
// What it runs (Target): prefill of a prompt, and the verify forward of a serving step, B sequences
// of R_b rows each (the last accepted token and the k drafts: R_b = k + 1) in one ragged forward
// over all L layers (Block::forward), then the final norm and the head over every row: per row the
// argmax token (lowest id on ties), the post-final-norm hidden (what the MTP layer reads), and under
// sampling the row's TokenStats under the transform (log p of a requested token, as the drafter's
// stats pass computes them) and, when asked, the whole row of BF16 logits. rollback trims a
// sequence to the rows it keeps; the rows after it are written again by the next forward.
//
// Row space: row p of a sequence is token t_p at position p (its caches in every layer at row p);
// its hidden h_p and its argmax predict t_{p+1}. A forward appends a sequence's rows at its length.
//
// Invariants:
// - On the CPU backend a row's hidden, token, stats and logits do not depend on the forward it runs
//   in: a verify of R rows of a sequence gives the bits of R forwards of one row, whatever the other
//   sequences of the batch, the chunking and the rollbacks before it (tested).
// - Collective: with a communicator of several ranks every rank calls every method with the same
//   arguments, and every rank returns the same results.
//
// SyntheticTarget (the trace generator) is a Target on synthetic weights that decodes greedily or by
// sampling. Sampling (io::TraceSampling): the head's BF16 logits l at hidden h_t go through the
// transform (divide by the temperature, keep the top_k largest, keep the top_p mass;
// sample_transformed below), and tokens[t + 1] is drawn by inverse CDF over the kept tokens in id
// order with the uniform sampling_uniform(seed, sequence, t + 1): counter-based, so a sequence's
// tokens do not depend on how many sequences are generated or where.
//
// Batched generation (generate_batch, synthetic_trace's `batch`; generate is a batch of one): up to
// kMaxTargetBatch sequences of one prompt length step through the target together, one forward per
// position over one row per sequence, so each weight is read once per position for all of them
// instead of once per sequence. On the CPU backend a sequence's tokens and hiddens are the same bits
// at every batch size; on CUDA the batched kernels sum in other orders, so a hidden may differ in its
// last bits and a token at a head near-tie.
//
// Synthetic weights: the embedding and lm_head are the MTP weights' own (seed `weight_seed`),
// because the MTP layer uses the target's embedding and head; layer i's block weights come from
// seed `target_seed + 1 + i` and the final norm from `target_seed` (docs/weights.md).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dist/communicator.hpp"
#include "drafter/block.hpp"
#include "drafter/drafter.hpp"
#include "drafter/exchange.hpp"
#include "drafter/options.hpp"
#include "io/trace.hpp"
#include "model/config.hpp"
#include "model/weights.hpp"
#include "ops/ops.hpp"

namespace mtplab::drafter {

/// The most sequences one batched target step of trace generation takes (the batched drafter's
/// largest batch).
inline constexpr int kMaxTargetBatch = 128;

/// How the target runs (per target, not per call).
struct TargetOptions {
  /// The lm_head whole on every rank (none) or its vocab rows split over the ranks (vocab).
  HeadSharding head_sharding = HeadSharding::none;
  /// The cross-rank pick of each row's token when the head is vocab-sharded (every protocol gives
  /// the same tokens; bf16_lanes: 2 ranks only).
  Exchange exchange = Exchange::packed_u64;
  ops::KvDtype kv_cache_dtype = ops::KvDtype::bf16;
  /// > 0: the caches hold sequences of at most this many positions (rounded up to whole index
  /// pools, at most the config's max_seq_len) instead of max_seq_len: memory only, no result changes.
  int max_positions = 0;
  /// The most rows one forward takes; a call with more runs them in consecutive forwards (a
  /// sequence's rows may span two: its later rows read the caches the earlier ones wrote). The
  /// buffers grow to the largest call up to this.
  int max_rows = 512;
};

/// The target's state: a pool of sequence slots, each with its caches in every layer (one
/// SlotCaches per layer) and its length. Slots are taken and released as the drafter's BatchState's
/// (new_sequence takes the lowest free one), so the two pools can be driven in step.
class TargetState {
 public:
  int slots() const { return static_cast<int>(len_.size()); }
  bool live(int slot) const { return slot >= 0 && slot < slots() && live_[static_cast<size_t>(slot)]; }
  int live_count() const;
  /// The rows (positions) the sequence in a live slot holds.
  int seq_len(int slot) const;
  /// Layer l's caches (tests, benchmarks).
  SlotCaches& caches(int layer) { return *caches_.at(static_cast<size_t>(layer)); }

 private:
  friend class Target;
  std::vector<std::unique_ptr<SlotCaches>> caches_;
  std::vector<int> len_;
  std::vector<uint8_t> live_;
};

/// One sequence's rows of a forward: its slot and the tokens of its rows, at positions
/// seq_len(slot), seq_len(slot) + 1, ... (host memory, read during the call).
struct VerifySeq {
  int slot = -1;
  std::span<const int32_t> tokens;
};

/// What a forward computes beyond each row's token and hidden.
struct VerifyExtras {
  /// false: no head (tokens, stats and logits stay empty): the rows only write the caches and give
  /// their hiddens.
  bool head = true;
  /// Per row the TokenStats of its logits under this transform (sampling verification): margin,
  /// log p of the argmax, and log p of requested[row] (NaN without requested tokens). Null: none.
  const SamplingTransform* transform = nullptr;
  /// [rows] global token ids, in row order (needs transform).
  std::span<const int32_t> requested;
  /// Every headed row's whole BF16 logits row ([rows, vocab]; with a vocab-sharded head they are
  /// gathered, one collective per forward).
  bool logits = false;
  /// Every row's routed experts at every layer (VerifyResult::routing): one download of [rows,
  /// top_k] ids per routed layer and chunk.
  bool routing = false;
};

/// What a forward returns. Rows are in call order: sequence b's rows are first_row[b] ..
/// first_row[b + 1] - 1.
struct VerifyResult {
  int rows = 0;
  std::vector<int> first_row;          ///< [B + 1]
  std::vector<bf16> hiddens;           ///< [rows, H]: post-final-norm
  std::vector<int32_t> tokens;         ///< [headed rows]: argmax of the logits (lowest id on ties)
  std::vector<ops::TokenStats> stats;  ///< [headed rows] with a transform
  std::vector<bf16> logits;            ///< [headed rows, vocab] when asked
  /// [rows, layers * top_k] when asked: row r's global expert ids at layer l in columns
  /// l * top_k .. (l + 1) * top_k - 1 (the router's order), -1 at a dense-MLP layer.
  std::vector<int32_t> routing;
};

class Target {
 public:
  /// Uploads `w` (this rank's shard: its plan must be comm's rank and size and the options'
  /// head_sharding) with all its layers. `comm`: the world communicator (nullptr or size 1 for one
  /// rank).
  Target(ops::Backend& be, dist::Communicator* comm, const model::ModelConfig& cfg,
         const model::TargetWeights& w, const TargetOptions& options = {});
  /// Uploads `trunk`'s embedding, head and final norm (its layers are not read), then `layers`
  /// layers made by `layer(i)` one at a time, each uploaded and freed before the next (host memory
  /// holds one layer).
  Target(ops::Backend& be, dist::Communicator* comm, const model::ModelConfig& cfg,
         const model::TargetWeights& trunk, int layers, const std::function<model::LayerWeights(int)>& layer,
         const TargetOptions& options = {});
  ~Target();
  Target(const Target&) = delete;
  Target& operator=(const Target&) = delete;

  int layers() const { return static_cast<int>(blocks_.size()); }
  /// Layers 0 .. dense_layers() - 1 have a dense MLP.
  int dense_layers() const;
  /// The rows each slot's caches hold.
  int capacity() const { return cfg_.max_seq_len; }
  const model::ModelConfig& config() const { return cfg_; }
  const TargetOptions& options() const { return opt_; }
  const VocabShard& shard() const { return shard_; }
  ops::Backend& backend() { return be_; }

  // ---- sequences --------------------------------------------------------------------------------
  /// A pool of `slots` sequence slots, none live.
  std::unique_ptr<TargetState> new_batch(int slots);
  /// Takes the lowest free slot for a new (empty) sequence; an Error when every slot is live.
  int new_sequence(TargetState& state);
  /// Frees a live slot.
  void release(TargetState& state, int slot);
  /// The sequence in `slot` keeps its first `length` rows (0 <= length <= seq_len): after a verify
  /// of rows P .. P + k (the last accepted token and k drafts) that accepted a drafts, length is
  /// P + a + 1. The rows after it are left in the caches and written again by the next forward;
  /// nothing reads them before (a row at position p reads rows <= p only).
  void rollback(TargetState& state, int slot, int length);

  // ---- forwards ---------------------------------------------------------------------------------
  /// The verify forward: the rows of every sequence of `seqs` (distinct live slots, at least one
  /// row each, inside the capacity) through every layer in one ragged forward (up to
  /// options().max_rows rows), then the final norm and the head on every row. Each sequence's
  /// length grows by its rows.
  VerifyResult verify(TargetState& state, std::span<const VerifySeq> seqs, const VerifyExtras& extras = {});
  /// The rows `tokens` of one sequence (a prompt, or any rows appended at its length) with the
  /// head on its last row only: hiddens of every row, tokens (and stats / logits when asked) of
  /// the last row. extras.requested, when given, holds one token (the last row's).
  VerifyResult prefill(TargetState& state, int slot, std::span<const int32_t> tokens,
                       const VerifyExtras& extras = {});

 private:
  struct Row {
    int32_t slot, pos, token;
  };
  void add_layer(const model::LayerWeights& w);
  /// The rows of `seqs` (each at its sequence's length), checked; first_row[b] the first of b.
  std::vector<Row> rows_of(const TargetState& state, std::span<const VerifySeq> seqs,
                           std::vector<int>& first_row) const;
  /// The forward of `rows` (a sequence's rows consecutive and at its length), with the head on the
  /// rows >= first_head_row.
  VerifyResult run(TargetState& state, const std::vector<Row>& rows, std::vector<int> first_row,
                   int first_head_row, const VerifyExtras& extras);
  /// Sizes the buffers of a forward of `rows` rows (and the head's logit rows when `logit_rows`).
  void reserve(int rows, bool logit_rows);
  /// The head on `n` normed rows from row `from` of the chunk: tokens, and stats (of the rows'
  /// `requested` tokens, host, null: none) and logits as `extras` asks, appended to `out`.
  void head(int from, int n, const int32_t* requested, const VerifyExtras& extras, VerifyResult& out);
  /// Rows first .. first + n - 1 of out.routing at `layer`: the routed experts its block chose for
  /// the chunk's n rows (sizes out.routing, -1 everywhere, on the first layer of the first chunk).
  void record_routing(int layer, int first, int n, VerifyResult& out);
  void wait_comm();

  ops::Backend& be_;
  dist::Communicator* comm_;
  int world_ = 1, rank_ = 0;
  model::ModelConfig cfg_;
  TargetOptions opt_;
  VocabShard shard_;
  std::vector<BlockDims> dims_;
  std::vector<std::unique_ptr<Block>> blocks_;
  ops::Array<bf16> embed_, lm_head_, final_norm_;
  // Buffers of one forward, [buf_rows_] rows.
  int buf_rows_ = 0;
  ops::Array<int32_t> slot_, pos_;
  ops::Array<bf16> x_, normed_;
  ops::Array<ops::ArgMax> arg_;
  ops::Array<int32_t> tokens_;
  std::unique_ptr<ExchangeBuffers> xchg_;
  std::unique_ptr<StatsBuffers> stats_;  // the head's logit rows (stats, logits)
};

/// The target of `layers` layers on synthetic weights (model::synthesize_target_weights: seeds as
/// the header comment says), sharded for comm's rank and size and options.head_sharding.
std::unique_ptr<Target> make_synthetic_target(ops::Backend& be, dist::Communicator* comm,
                                              const model::ModelConfig& cfg, int layers, uint64_t weight_seed,
                                              uint64_t target_seed, const TargetOptions& options = {});
/// The target of `layers` synthetic layers (layer i under target_seed + 1 + i, the final norm under
/// target_seed) behind the embedding and lm_head of the MTP weights `w` (synthetic or a
/// checkpoint's; w.plan must be comm's rank and size and options.head_sharding). With synthetic `w`
/// of seed S it is make_synthetic_target(..., layers, S, target_seed, ...).
std::unique_ptr<Target> make_target_behind(ops::Backend& be, dist::Communicator* comm,
                                           const model::ModelConfig& cfg, const model::MtpWeights& w,
                                           int layers, uint64_t target_seed,
                                           const TargetOptions& options = {});
/// The target of the checkpoint's first `layers` layers (model::load_target_weights), sharded as
/// make_synthetic_target.
std::unique_ptr<Target> load_target(ops::Backend& be, dist::Communicator* comm, const model::ModelConfig& cfg,
                                    int layers, const std::string& checkpoint_path,
                                    const TargetOptions& options = {});

/// Trace generation on any target (SyntheticTarget::generate_batch, header comment): the prompts
/// (one length, 1 .. kMaxTargetBatch of them) then `new_tokens` tokens each, greedy or sampled as
/// `sampling` says, one forward per position over one row per sequence; sequence i's uniforms are
/// those of sequence first_sequence + i. Every position has its hidden. On the CPU backend the same
/// bits at every batch size.
/// With `routing`, each sequence's TraceSequence::routing holds every position's routed experts at
/// every layer (VerifyResult::routing's layout).
std::vector<io::TraceSequence> generate_batch(Target& target,
                                              const std::vector<std::vector<int32_t>>& prompts,
                                              int new_tokens, const io::TraceSampling& sampling,
                                              int64_t first_sequence, bool routing = false);

/// The target on synthetic weights that generates traces (header comment).
class SyntheticTarget {
 public:
  /// `max_positions` > 0 sizes the caches for sequences of at most that many positions (rounded
  /// up to whole index pools, at most the config's max_seq_len) instead of max_seq_len: the
  /// capacity changes no result, only memory, which batched generation multiplies by the batch.
  SyntheticTarget(ops::Backend& be, const model::ModelConfig& cfg, int layers, uint64_t weight_seed,
                  uint64_t target_seed, int max_positions = 0);
  ~SyntheticTarget();
  /// Greedy decoding: runs the prompt, then generates `new_tokens` tokens. Returns the whole
  /// sequence (prompt + generated tokens) and the hidden after each token; the hidden of the last
  /// generated token is computed too, so every position has one.
  io::TraceSequence generate(const std::vector<int32_t>& prompt, int new_tokens);
  /// As generate, each new token greedy or sampled as `sampling` says; `sequence` names the
  /// sequence's uniforms (sampling only).
  io::TraceSequence generate(const std::vector<int32_t>& prompt, int new_tokens,
                             const io::TraceSampling& sampling, int64_t sequence);
  /// generate() for every prompt of `prompts` (one length, 1 .. kMaxTargetBatch of them) at
  /// once: sequence i is generate(prompts[i], new_tokens, sampling, first_sequence + i), the same
  /// bits on the CPU backend (header comment).
  std::vector<io::TraceSequence> generate_batch(const std::vector<std::vector<int32_t>>& prompts,
                                                int new_tokens, const io::TraceSampling& sampling,
                                                int64_t first_sequence);
  int layers() const { return target_->layers(); }
  /// The rows the caches hold per sequence.
  int capacity() const { return target_->capacity(); }
  /// The target itself (its verify forward runs on the same weights).
  Target& target() { return *target_; }

 private:
  std::unique_ptr<Target> target_;
};

/// Seeded random prompts (xorshift64 over token ids): the one generator every synthetic trace uses
/// (mtplab trace, the harness, the tests), so the same seed gives the same prompts everywhere.
class PromptGenerator {
 public:
  PromptGenerator(uint64_t seed, int vocab) : state_(seed * 0x9E3779B97F4A7C15ull + 1), vocab_(vocab) {}
  std::vector<int32_t> next(int length);

 private:
  uint64_t state_;
  int vocab_;
};

/// synthetic_trace's sequences group by group, in order (at most `batch` a group, indices set):
/// `fn` takes each group as it is made, so a caller can write it out and let it go.
void synthetic_trace_groups(SyntheticTarget& target, int vocab, int count, int prompt_len, int new_tokens,
                            uint64_t seed, const io::TraceSampling& sampling, int batch,
                            const std::function<void(std::vector<io::TraceSequence>&&)>& fn);

/// `count` sequences of `target`: prompts of `prompt_len` tokens from PromptGenerator(seed), then
/// `new_tokens` tokens each, greedy or as `sampling` says; sequence s gets index s. `batch`
/// (1 .. kMaxTargetBatch): sequences generated together (generate_batch), 1 = one at a time.
/// `progress` (optional) is called after each group with the sequences done so far.
std::vector<io::TraceSequence> synthetic_trace(SyntheticTarget& target, int vocab, int count, int prompt_len,
                                               int new_tokens, uint64_t seed,
                                               const io::TraceSampling& sampling = {}, int batch = 1,
                                               const std::function<void(int)>& progress = {});

/// The synthetic sampler's uniform in [0, 1) for trace token `position` of sequence `sequence`:
///   h = mix(seed ^ 0x73796e7468657469); h = mix(h ^ (sequence * 0x9e3779b97f4a7c15));
///   h = mix(h ^ (position * 0xd1b54a32d192ed03)); u = (h >> 11) * 2^-53   (mix: splitmix64_mix)
double sampling_uniform(int64_t seed, int64_t sequence, int64_t position);

/// Draws a token from BF16 logits [n] under (temperature, top_k, top_p) with uniform u: the
/// logits divided by the temperature; top_k > 0 keeps the tokens whose logit is >= the k-th
/// largest (ties at the threshold kept); top_p < 1 then keeps the tokens whose logit is >= the
/// largest threshold whose kept mass reaches top_p (ties kept); softmax in double over what is
/// kept; the token is the first in id order whose cumulative probability exceeds u.
int32_t sample_transformed(std::span<const bf16> logits, double temperature, int64_t top_k, double top_p,
                           double u);

/// The distribution sample_transformed draws from: per token its probability under (temperature,
/// top_k, top_p), 0 outside the kept set, with sample_transformed's arithmetic, so that draw_token
/// on it with the same uniform gives sample_transformed's token (up to a u within rounding of 1).
std::vector<double> transformed_probabilities(std::span<const bf16> logits, double temperature, int64_t top_k,
                                              double top_p);

/// Inverse CDF in id order: the first token whose cumulative probability exceeds u (prob need not
/// sum to 1: u is scaled by the total); the last token of positive probability when u is within
/// rounding of the total. An Error when no token has positive probability.
int32_t draw_token(std::span<const double> prob, double u);

}  // namespace mtplab::drafter
