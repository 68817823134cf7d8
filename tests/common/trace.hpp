// Model presets and traces for the tests that run a drafter: a preset with a short context (so
// tests stay fast) and sequences from the synthetic target.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "drafter/target.hpp"
#include "io/trace.hpp"
#include "model/config.hpp"

namespace mtplab::test {

/// Model preset `name` with its context cut to `max_seq_len` rows.
inline model::ModelConfig preset(const std::string& name, int max_seq_len) {
  model::ModelConfig cfg = model::load_model_preset(name);
  cfg.set_max_seq_len(max_seq_len);
  return cfg;
}

/// The tiny preset with a short context.
inline model::ModelConfig tiny_config(int max_seq_len = 256) { return preset("tiny", max_seq_len); }

/// `count` sequences from the synthetic target (2 layers, weight seed 7): random prompts of
/// `prompt` tokens, then `gen` greedy tokens.
inline std::vector<io::TraceSequence> make_trace(ops::Backend& be, const model::ModelConfig& cfg, int count,
                                                 int prompt, int gen, uint64_t seed) {
  drafter::SyntheticTarget target(be, cfg, 2, 7, seed);
  return drafter::synthetic_trace(target, cfg.vocab, count, prompt, gen, seed);
}

}  // namespace mtplab::test
