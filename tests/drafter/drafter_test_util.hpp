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
  std::vector<io::TraceSequence> out;
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int s = 0; s < count; ++s) {
    std::vector<int32_t> p(prompt);
    for (auto& t : p) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      t = static_cast<int32_t>(state % static_cast<uint64_t>(cfg.vocab));
    }
    out.push_back(target.generate(p, gen));
    out.back().index = s;
  }
  return out;
}

}  // namespace mtplab::test
