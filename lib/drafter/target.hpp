// mtplab's synthetic target: a small stack of the same DSA + MoE layers with a final norm and
// the lm_head, decoding greedily or by sampling. It produces traces (tokens + post-final-norm
// hiddens) with the shapes of a model config, for replay when no recorded trace exists.
//
// Sampling (io::TraceSampling): the head's BF16 logits l at hidden h_t go through the transform
// (divide by the temperature, keep the top_k largest, keep the top_p mass; sample_transformed
// below), and tokens[t + 1] is drawn by inverse CDF over the kept tokens in id order with the
// uniform sampling_uniform(seed, sequence, t + 1): counter-based, so a sequence's tokens do not
// depend on how many sequences are generated or where.
//
// Batched generation (generate_batch, synthetic_trace's `batch`; generate is a batch of one): up to
// kMaxTargetBatch sequences of one prompt length step through the target together, one
// Block::forward per position over one row per sequence, so each weight is read once per position
// for all of them instead of once per sequence. On the CPU backend a sequence's tokens and hiddens
// are the same bits at every batch size (the block, rmsnorm and head_argmax_batch compute each row
// as the single-row reference does); on CUDA the batched kernels sum in other orders, so a hidden
// may differ in its last bits and a token at a head near-tie.
//
// Weights: the embedding and lm_head are the MTP weights' own (seed `weight_seed`), because the
// MTP layer uses the target's embedding and head; layer i's block weights come from seed
// `target_seed + 1 + i` and the final norm from `target_seed` (docs/weights.md).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "drafter/block.hpp"
#include "io/trace.hpp"
#include "model/config.hpp"
#include "ops/ops.hpp"

namespace mtplab::drafter {

/// The most sequences one batched target step takes (the batched drafter's largest batch).
inline constexpr int kMaxTargetBatch = 128;

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
  std::vector<io::TraceSequence> generate_batch(const std::vector<std::vector<int32_t>>& prompts, int new_tokens,
                                                const io::TraceSampling& sampling, int64_t first_sequence);
  int layers() const { return static_cast<int>(blocks_.size()); }
  /// The rows the caches hold per sequence.
  int capacity() const { return cfg_.max_seq_len; }

 private:
  ops::Backend& be_;
  model::ModelConfig cfg_;
  std::vector<std::unique_ptr<Block>> blocks_;
  ops::Array<bf16> embed_, lm_head_, final_norm_;
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

}  // namespace mtplab::drafter
