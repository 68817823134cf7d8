// What the online-run tests share (test_online.cpp, test_online_mpi.cpp): the tiny preset's
// target and drafter on weights where they agree often enough for steps to accept 0 .. k drafts,
// prompts of spread lengths, the online loop and the replay collected as step records, and the
// trace the same target generates from the same prompts.
//
// Why the weights are shaped: random synthetic weights make a drafter that almost never agrees with
// the target (acceptance ~0), and a test of the accepting paths (rollback, catch-up from the
// target's hiddens, the bonus token) needs steps that accept 0 .. k drafts. Here the drafter's
// eh_proj passes the token's embedding through (the hidden half scaled down) and every block, the
// drafter's and the target's layers, writes to its residual at 0.15 of its scale: both then lean
// to the token the lm_head prefers after the current one, and the context (the caches: attention
// over the sequence's rows, the experts) still decides about half of the drafts. About 0.5 drafts
// are accepted a step, a sixth of the steps accept every draft, 60% none.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "common/trace.hpp"
#include "core/numeric.hpp"
#include "drafter/factory.hpp"
#include "drafter/target.hpp"
#include "harness/online.hpp"
#include "harness/replay.hpp"
#include "model/weights.hpp"

namespace mtplab::test {

/// eh_proj = [I * e ; W_h * h]: the embedding half the identity scaled by `e`, the hidden half
/// scaled by `h`.
inline void pass_embedding(model::MtpWeights& w, float e, float h) {
  const int64_t H = w.eh_proj.shape.at(0);
  for (int64_t i = 0; i < H; ++i)
    for (int64_t j = 0; j < 2 * H; ++j) {
      bf16& x = w.eh_proj.data[static_cast<size_t>(i * 2 * H + j)];
      x = j < H ? to_bf16(i == j ? e : 0.0f) : to_bf16(to_float(x) * h);
    }
}

/// The scale of every block's writes to its residual (header comment).
inline constexpr float kQuiet = 0.15f;

/// A block's writes to the residual (attention's o_proj, the experts' and the shared expert's down
/// projections) scaled by `s`.
inline void quiet_block(model::AttentionWeights& a, model::MoeWeights& m, float s) {
  for (model::TensorBF16* t : {&a.o_proj, &m.experts_down, &m.shared_down})
    for (bf16& x : t->data) x = to_bf16(to_float(x) * s);
}

/// The tiny preset (256 positions) with its MTP weights (seed 11) sharded for `rank` of `world`
/// with the head whole or split, made to agree with the target often (header comment).
inline model::MtpWeights online_weights(const model::ModelConfig& cfg, int rank = 0, int world = 1,
                                        model::HeadSharding hs = model::HeadSharding::none) {
  const model::ShardPlan plan = model::make_shard_plan(cfg, rank, world, hs);
  model::MtpWeights w = model::synthesize_mtp_weights(cfg, plan, 11);
  pass_embedding(w, 1.0f, 0.25f);
  quiet_block(w.attn, w.moe, kQuiet);
  return w;
}

/// The target of `layers` layers behind `w` (drafter::make_target_behind's) with each layer's
/// writes scaled as online_weights scales the drafter's block.
inline std::unique_ptr<drafter::Target> online_target(ops::Backend& be, dist::Communicator* comm,
                                                      const model::ModelConfig& cfg,
                                                      const model::MtpWeights& w, int layers,
                                                      uint64_t target_seed,
                                                      const drafter::TargetOptions& o = {}) {
  return std::make_unique<drafter::Target>(
      be, comm, cfg, model::target_trunk_of(cfg, w, target_seed), layers,
      [&](int i) {
        model::LayerWeights l =
            model::synthesize_layer_weights(cfg, w.plan, i, target_seed + 1 + static_cast<uint64_t>(i));
        quiet_block(l.attn, l.moe, kQuiet);
        return l;
      },
      o);
}

/// `count` prompts from PromptGenerator(seed) of lengths lo, lo + 3, ... (spread over 4 values).
inline std::vector<harness::Prompt> online_prompts(int count, int vocab, uint64_t seed, int lo = 9) {
  drafter::PromptGenerator gen(seed, vocab);
  std::vector<harness::Prompt> out;
  for (int s = 0; s < count; ++s) out.push_back(harness::Prompt{s, gen.next(lo + 3 * (s % 4))});
  return out;
}

/// What an online run or a replay produced: the step records in order, and (online) the sequences.
struct OnlineOutcome {
  std::vector<harness::StepRecord> steps;
  std::vector<harness::OnlineSequence> seqs;  ///< in the order they finished
};

inline OnlineOutcome run_online_collect(drafter::Target& target, drafter::MtpDrafter* drafter,
                                        const std::vector<harness::Prompt>& prompts,
                                        const harness::OnlineRun& run) {
  OnlineOutcome out;
  harness::OnlineHooks hooks;
  hooks.after_step = [&](const std::vector<harness::StepRecord>& rows) {
    out.steps.insert(out.steps.end(), rows.begin(), rows.end());
    return true;
  };
  hooks.after_sequence = [&](int, const harness::OnlineSequence& s) { out.seqs.push_back(s); };
  harness::run_online(target, drafter, prompts, run, hooks);
  return out;
}

/// The trace `target` generates from `prompts` (each alone: prompts of different lengths, and
/// sequence i's uniforms are those of index prompts[i].index), `new_tokens` tokens each, greedy or
/// sampled; sequence i has index prompts[i].index.
inline std::vector<io::TraceSequence> online_trace(drafter::Target& target,
                                                   const std::vector<harness::Prompt>& prompts,
                                                   int new_tokens, const io::TraceSampling& sampling = {}) {
  std::vector<io::TraceSequence> out;
  for (const harness::Prompt& p : prompts) {
    out.push_back(
        std::move(drafter::generate_batch(target, {p.tokens}, new_tokens, sampling, p.index).front()));
    out.back().index = p.index;
  }
  return out;
}

/// The replay of `seqs` at batch B, its step records in order.
inline OnlineOutcome replay_collect(drafter::MtpDrafter& drafter, const std::vector<io::TraceSequence>& seqs,
                                    int B, int k, int hidden,
                                    const harness::SamplingVerify* sampling = nullptr,
                                    std::span<const std::vector<float>> logp = {}) {
  OnlineOutcome out;
  harness::BatchReplayHooks hooks;
  hooks.after_step = [&](const std::vector<harness::StepRecord>& rows) {
    out.steps.insert(out.steps.end(), rows.begin(), rows.end());
    return true;
  };
  harness::replay_batched(drafter, seqs, B, k, hidden, hooks, sampling, logp);
  return out;
}

}  // namespace mtplab::test
