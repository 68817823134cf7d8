// mtplab's synthetic target: a small stack of the same DSA + MoE layers with a final norm and
// the lm_head, decoding greedily. It produces traces (tokens + post-final-norm hiddens) with the
// shapes of a model config, for replay when no recorded trace exists.
//
// Weights: the embedding and lm_head are the MTP weights' own (seed `weight_seed`), because the
// MTP layer uses the target's embedding and head; layer i's block weights come from seed
// `target_seed + 1 + i` and the final norm from `target_seed` (docs/weights.md).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "drafter/block.hpp"
#include "io/trace.hpp"
#include "model/config.hpp"
#include "ops/ops.hpp"

namespace mtplab::drafter {

class SyntheticTarget {
 public:
  SyntheticTarget(ops::Backend& be, const model::ModelConfig& cfg, int layers, uint64_t weight_seed,
                  uint64_t target_seed);
  ~SyntheticTarget();
  /// Greedy decoding: runs the prompt, then generates `new_tokens` tokens. Returns the whole
  /// sequence (prompt + generated tokens) and the hidden after each token; the hidden of the last
  /// generated token is computed too, so every position has one.
  io::TraceSequence generate(const std::vector<int32_t>& prompt, int new_tokens);
  int layers() const { return static_cast<int>(blocks_.size()); }

 private:
  ops::Backend& be_;
  model::ModelConfig cfg_;
  std::vector<std::unique_ptr<Block>> blocks_;
  ops::Array<bf16> embed_, lm_head_, final_norm_;
  ops::Array<bf16> x_, h_;
  ops::Array<int32_t> pos_;
  ops::Array<ops::ArgMax> arg_;
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

/// `count` sequences of `target`: prompts of `prompt_len` tokens from PromptGenerator(seed), then
/// `new_tokens` greedy tokens each; sequence s gets index s.
std::vector<io::TraceSequence> synthetic_trace(SyntheticTarget& target, int vocab, int count, int prompt_len,
                                               int new_tokens, uint64_t seed);

}  // namespace mtplab::drafter
