// Online runs (`mode: online`, docs/experiments.md "Online runs"): the target really verifies.
// Each step of a batch of live sequences:
//
//   the drafter proposes k drafts for every live sequence (one batched propose)
//   the target verifies each sequence's rows [t_L, d_1 .. d_k] at positions L .. L + k (one forward)
//   greedy: accept d_{i+1} while it equals row i's token (the argmax); the bonus is row a's token
//   sampling: accept d_{i+1} with probability min(1, p_i(d) / q_i(d)), else emit a token drawn from
//             norm(max(0, p_i - q_i)) and end; all accepted: the bonus is drawn from p_k
//   the target rolls back to L + a + 1 rows, the drafter trims its rows (after_verify) and catches
//   up from the target's hiddens of rows L .. L + a; the next step starts at L + a + 1
//
// with draft_len 0 no drafter runs: each step is one row per sequence, the target decoding alone.
// A sequence starts with the prefill of its prompt (P tokens: the target's rows 0 .. P - 1 and
// its first token t_P; the drafter's context rows 0 .. P - 2) and takes steps while a step's k
// drafts lie within its first max_new_tokens tokens after the prompt (L + k <= P + max_new_tokens
// - 1): replay's rule over a trace of max_new_tokens new tokens (harness/replay.hpp), so every step
// drafts k tokens and an online run takes the steps a replay of the same target's trace takes. A
// finished sequence's slot takes the next prompt (continuous batching); the drafter's and the
// target's slot pools are driven in step (both take the lowest free slot).
//
// Sampling (verify: sampling) draws from the target's logits rows under the point's transform
// (drafter::transformed_probabilities: sample_transformed's distribution). The drafter's proposal
// is its argmax (draft_proposal: greedy), so q_i is the point mass at d_i: draft i is accepted with
// probability p_i(d_i), the residual is p_i without d_i. Uniforms are counter-based per (sequence,
// position): the acceptance coin of the draft at position t is verify_uniform(seed, sequence, t),
// the token emitted at position t (a residual's or the bonus) uses sampling_uniform(seed, sequence,
// t), which is the synthetic target's sampler (drafter/target.hpp), so at draft_len 0 an online
// run emits the tokens of the target's own sampled generation with the same seed.
//
// Invariants:
// - On the CPU backend greedy online steps are those of a replay of the trace the same target
//   generated from the same prompts: the same drafts and accepted counts, bit for bit (a target
//   row's bits do not depend on the forward it runs in, docs/target.md).
// - Lossless: greedy online tokens are the target's greedy continuation at every draft length.
// - Collective: with several ranks every rank runs the same loop and takes the same decisions (the
//   target's tokens and gathered logits are the same on every rank).
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/setting.hpp"
#include "drafter/drafter.hpp"
#include "drafter/target.hpp"
#include "harness/replay.hpp"

namespace mtplab::harness {

/// `mode`: what a point runs: a replay of a trace (the target not run) or an online run.
enum class RunMode { replay, online };
inline constexpr const char* kRunModeNames[] = {"replay", "online"};
const char* to_string(RunMode m);

/// `online.target`: where the target's trunk layers come from. synthetic: seeded layers
/// (online.target_seed) behind the point's embedding and lm_head (its weights', synthetic or a
/// checkpoint's); checkpoint: the embedding, head, final norm and layers of weights.checkpoint
/// (drafter::load_target).
enum class TargetSource { synthetic, checkpoint };
inline constexpr const char* kTargetSourceNames[] = {"synthetic", "checkpoint"};
const char* to_string(TargetSource t);

/// The `online:` settings of a point (mode: online).
struct OnlineOptions {
  /// A sequence takes steps while a step's drafts lie within its first max_new_tokens tokens after
  /// the prompt (header comment).
  int max_new_tokens = 64;
  /// The target's trunk layers (the synthetic trace's `layers` gives the same target).
  int target_layers = 2;
  /// The synthetic trunk's seed: final norm under it, layer i under target_seed + 1 + i (the
  /// synthetic trace's `seed` gives the same target).
  int64_t target_seed = 1;
  TargetSource target = TargetSource::synthetic;
  friend bool operator==(const OnlineOptions&, const OnlineOptions&) = default;
};

/// The `online:` group's settings, in schema order (keys of the block; the experiment names them
/// online.<key>).
const std::vector<Setting<OnlineOptions>>& online_settings();

/// A prompt of an online run: the sequence index that names its uniforms and its results rows, and
/// its tokens.
struct Prompt {
  int64_t index = 0;
  std::vector<int32_t> tokens;
};

/// What an online run did to one sequence.
struct OnlineSequence {
  int64_t index = 0;
  int prompt_length = 0;
  /// The prompt, then every token the target emitted (t_P from the prefill, then a + 1 a step).
  std::vector<int32_t> tokens;
  int steps = 0;
};

/// How an online run goes.
struct OnlineRun {
  int draft_len = 0;  ///< k (0: no drafter, the target decodes alone)
  int batch_size = 1;
  int max_new_tokens = 64;
  /// Sampling verification (non-null): its transform and seed; draft_proposal must be greedy.
  const SamplingVerify* sampling = nullptr;
};

/// Hooks around the steps (any may be empty).
struct OnlineHooks {
  /// After the prefill of the prompt `prompt_index` (an index into the span) that takes a slot.
  std::function<void(int prompt_index)> after_prefill;
  /// Before each step (after the prefills of the sequences that joined).
  std::function<void()> before_step;
  /// After every row of a step was verified, rolled back and caught up; the rows in slot order.
  /// Returning false ends the run after this step.
  std::function<bool(const std::vector<StepRecord>&)> after_step;
  /// When a sequence leaves its slot.
  std::function<void(int prompt_index, const OnlineSequence&)> after_sequence;
  /// Request DraftStats on every propose (StepRecord::stats).
  bool draft_stats = false;
  /// Times the target's forwards: Phase::prefill around each prefill, Phase::verify around each
  /// step's verify. Null: untimed.
  drafter::PhaseTimer* timer = nullptr;
};

/// Runs `prompts` (each of at least one token) through `target` and, with draft_len >= 1,
/// `drafter` (its draft_len >= run.draft_len; null with draft_len 0), `run.batch_size`
/// (1 .. drafter::kMaxBatch) sequences at a time. StepRecord per row of a step: its sequence
/// (Prompt::index), position L, accepted a, batch_rows, the drafts, targets[i] the token the
/// target emitted at position L + 1 + i (-1 past the step's last token), accept_prob[i] the
/// probability that the verifier accepts draft i given drafts 1 .. i - 1 were (greedy: 0 / 1).
/// Returns the steps taken. Collective over the target's (and drafter's) communicator.
int64_t run_online(drafter::Target& target, drafter::MtpDrafter* drafter, std::span<const Prompt> prompts,
                   const OnlineRun& run, const OnlineHooks& hooks = {});

/// Speculative sampling of one step's k drafts (draft i predicts position L + 1 + i):
/// p [k + 1] the target's distributions of the step's rows, q [k] the drafter's (an empty row: the
/// point mass at drafts[i], a greedy proposal), each over the whole vocab. Draft i is accepted when
/// coin(i) < min(1, p_i(d_i) / q_i(d_i)) (0 when q_i(d_i) = 0); at the first rejection the token
/// emitted is drawn by inverse CDF (drafter::draw_token) from norm(max(0, p_i - q_i)) with draw(i),
/// and the step ends. accept_prob[i] is min(1, p_i(d_i) / q_i(d_i)) for every i, rejected or not.
struct SpeculativeStep {
  int accepted = 0;
  /// The token emitted at the first rejection (-1 when every draft was accepted: the caller draws
  /// the bonus from p_k).
  int32_t residual_token = -1;
  std::vector<float> accept_prob;
};
SpeculativeStep speculative_step(std::span<const std::vector<double>> p,
                                 std::span<const std::vector<double>> q, std::span<const int32_t> drafts,
                                 const std::function<double(int)>& coin,
                                 const std::function<double(int)>& draw);

}  // namespace mtplab::harness
