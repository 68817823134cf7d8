// Shared helpers of the drafter tests: a tiny model with synthetic weights, a generated trace.
#pragma once
#include <memory>
#include <vector>

#include "drafter/factory.hpp"
#include "drafter/target.hpp"
#include "model/weights.hpp"

namespace mtplab::test {

/// The tiny preset with a short context, so tests stay fast.
inline model::ModelConfig tiny_config(int max_seq_len = 256) {
  model::ModelConfig cfg = model::load_model_preset("tiny");
  cfg.set_max_seq_len(max_seq_len);
  return cfg;
}

/// `count` sequences from the synthetic target: random prompts of `prompt` tokens, then `gen`
/// greedy tokens.
inline std::vector<io::TraceSequence> make_trace(ops::Backend& be, const model::ModelConfig& cfg, int count,
                                                 int prompt, int gen, uint64_t seed) {
  drafter::SyntheticTarget target(be, cfg, 2, 7, seed);
  return drafter::synthetic_trace(target, cfg.vocab, count, prompt, gen, seed);
}

}  // namespace mtplab::test
