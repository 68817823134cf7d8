// Trace replay: the target is not run; the trace says what it would have emitted.
//
// For a sequence with tokens t_0..t_{N-1}, target hiddens h_0..h_{N-1} (h_i after consuming t_i)
// and prompt length P:
//   prefill   rows 0 .. P-2 = (embed(t_{r+1}), h_r)
//   L = P; while L + k <= N - 1:                       (k targets t_{L+1}..t_{L+k} exist)
//     drafts = propose(t_L, h_{L-1}, k)                 rows L-1 .. written
//     a = longest prefix with drafts_i == t_{L+i}       greedy verification
//     after_verify(a); catch-up rows seq_len .. L+a-1 from the true hiddens
//     L += a + 1                                        a accepted + the target's bonus token
// Sequences end when fewer than k targets remain, so every step drafts exactly k tokens and
// per-position rates compare across steps.
//
// At batch B (replay_batched), B sequences are stepped together: one batched propose drafts for
// every live slot, then each row verifies, trims and catches up on its own, exactly as above. A
// finished sequence releases its slot and the next sequence of the trace takes it (continuous
// batching, in trace order), so a step drafts for min(B, sequences left) rows. Each sequence's
// steps are those of replay_sequence: the same positions, the same verification.
//
// Sampling verification (verify: sampling, docs/acceptance.md) changes the propose and the verify
// of a step, nothing else: the drafter is forced along the trace's tokens (draft i + 1's input
// token is t_{L+i}), reports log q_i(t_{L+i}) under the point's transform, and draft i is accepted
// with probability a_i = min(1, q_i / p_i) (sampled proposal) or [d_i == t_{L+i}] (greedy
// proposal), p_i the target's own probability of the trace token (target_logprobs); the step ends
// at the first draft whose coin u_i = verify_uniform(seed, sequence, L + i) is >= a_i. The
// accepted count then goes to after_verify and the catch-up exactly as under greedy verification.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/numeric.hpp"
#include "drafter/drafter.hpp"
#include "harness/arms.hpp"
#include "io/trace.hpp"

namespace mtplab::harness {

/// One propose / verify step of one sequence.
struct StepRecord {
  int32_t sequence = 0;
  int32_t position = 0;  ///< L: the drafts predict t_{L+1}..t_{L+k}
  int32_t accepted = 0;
  int32_t batch_rows = 1;  ///< sequences the batched step that drafted this row drafted for
  std::vector<int32_t> drafts;
  std::vector<int32_t> targets;
  /// [k] the head's figures of each draft when the replay requested them (draft_stats), else empty.
  std::vector<drafter::DraftStats> stats;
  /// [k] a_i: the probability that the target accepts draft i given that it emits targets[i]
  /// (sampling verification; 0 / 1 under greedy verification: drafts[i] == targets[i]).
  std::vector<float> accept_prob;
  /// E[accepted] of this step with no coins flipped: sum_i prod_{j <= i} a_j.
  double expected_accepted() const;
};

/// Acceptance as vLLM defines it: rate = accepted / drafted; tau = 1 + mean accepted per step
/// (the target's bonus token counted); per-position rate r_i = P(accepted >= i).
struct AcceptanceStats {
  int64_t steps = 0;
  int64_t drafted = 0;
  int64_t accepted = 0;
  std::vector<int64_t> at_least;  ///< [k]: steps with accepted >= i + 1
  /// Sum over steps of each step's expected accepted count (StepRecord::expected_accepted);
  /// equal to `accepted` under greedy verification.
  double expected_accepted = 0;
  void add(int k, int a) { add(k, a, a); }
  void add(int k, int a, double expected);
  double rate() const { return drafted ? static_cast<double>(accepted) / drafted : 0.0; }
  double tau() const { return steps ? 1.0 + static_cast<double>(accepted) / steps : 0.0; }
  /// rate and tau from the expected accepted counts.
  double expected_rate() const { return drafted ? expected_accepted / drafted : 0.0; }
  double expected_tau() const { return steps ? 1.0 + expected_accepted / steps : 0.0; }
  std::vector<double> per_position() const;
};

/// Longest prefix of drafts equal to targets.
int accepted_prefix(const std::vector<int32_t>& drafts, const std::vector<int32_t>& targets);

/// The coin of sampling verification for the draft that predicts trace token `position` of
/// sequence `sequence` (TraceSequence::index): a uniform in [0, 1) that depends on nothing else
/// (counter-based, no generator state), so it is the same on every rank, backend and batch size,
/// in every run, and for every arm of a sweep with the same seed:
///   h = mix(seed ^ 0x6d74706c61622d76); h = mix(h ^ (sequence * 0x9e3779b97f4a7c15));
///   h = mix(h ^ (position * 0xd1b54a32d192ed03)); u = (h >> 11) * 2^-53
/// with mix = splitmix64_mix (core/hash.hpp) and 64-bit wrapping arithmetic.
double verify_uniform(int64_t seed, int64_t sequence, int64_t position);

/// What sampling verification needs beside the trace (ReplayOptions' sampling arms).
struct SamplingVerify {
  DraftProposal proposal = DraftProposal::greedy;
  drafter::SamplingTransform transform;
  int64_t seed = 1;
};
SamplingVerify sampling_verify(const ReplayOptions& r);

/// a_i for one draft: min(1, q / p) = min(1, exp(draft_logprob - target_logprob)) for a sampled
/// proposal (0 when the trace token is outside q's support), [draft == target] for a greedy one.
float accept_probability(DraftProposal proposal, int32_t draft, int32_t target, float draft_logprob,
                         float target_logprob);

/// The target's log p(tokens[t]) for every position t >= prompt_length of each sequence (NaN
/// before it): MtpDrafter::target_logprobs on hidden t - 1 under `transform` (collective when the
/// drafter's head is vocab-sharded). Refuses, naming `trace_name`, the sequence and the position,
/// a token outside the target's truncated support (log p = -inf: a trace sampled with this
/// transform cannot hold it).
std::vector<std::vector<float>> trace_target_logprobs(drafter::MtpDrafter& drafter,
                                                      std::span<const io::TraceSequence> seqs,
                                                      const drafter::SamplingTransform& transform,
                                                      const std::string& trace_name);

/// Refuses sampling verification against a trace that was not sampled with the point's
/// temperature / top_k / top_p, naming `trace_name` and both settings. Greedy verification
/// accepts any trace.
void check_trace_sampling(const ReplayOptions& r, const io::TraceSampling& trace,
                          const std::string& trace_name);

/// Hooks around each step of a replay (any may be empty).
struct ReplayHooks {
  /// After the sequence's prefill rows.
  std::function<void()> after_prefill;
  /// Called before each propose (after the prefill for the first step).
  std::function<void()> before_step;
  /// Called after each step's catch-up rows; returning false ends the replay after this step.
  std::function<bool(const StepRecord&)> after_step;
  /// Request DraftStats on every propose (StepRecord::stats).
  bool draft_stats = false;
};

/// Replays one sequence with hooks around every step. Returns the steps done. With `sampling`
/// (non-null), sampling verification: `target_logprob` holds log p(tokens[t]) for every position
/// t >= prompt_length of the sequence (PointInputs::target_logprobs), `sequence_index` names the
/// sequence's coins.
std::vector<StepRecord> replay_sequence(drafter::MtpDrafter& drafter, const io::TraceSequence& seq,
                                        int sequence_index, int k, int hidden, AcceptanceStats& stats,
                                        const ReplayHooks& hooks, const SamplingVerify* sampling = nullptr,
                                        std::span<const float> target_logprob = {});

/// Hooks around each batched step of replay_batched (any may be empty).
struct BatchReplayHooks {
  /// After the prefill of a sequence that takes a slot (`sequence_index` into the span).
  std::function<void(int sequence_index)> after_prefill;
  /// Before each batched propose (after the prefills of the sequences that joined).
  std::function<void()> before_step;
  /// After every row of a batched step verified and caught up; the rows in slot order. Returning
  /// false ends the replay after this step.
  std::function<bool(const std::vector<StepRecord>&)> after_step;
  /// When a sequence leaves its slot: its index and the steps it took.
  std::function<void(int sequence_index, int steps)> after_sequence;
  /// Request DraftStats on every propose (StepRecord::stats).
  bool draft_stats = false;
};

/// Replays `seqs` at batch `batch_size` (1 .. drafter::kMaxBatch) through the drafter's batched
/// step (MtpDrafter::propose_batch), continuous batching in trace order. StepRecord::sequence is
/// each sequence's TraceSequence::index. Returns the batched steps done. With `sampling`,
/// sampling verification; target_logprob[i] belongs to seqs[i] (as replay_sequence's).
int64_t replay_batched(drafter::MtpDrafter& drafter, std::span<const io::TraceSequence> seqs, int batch_size,
                       int k, int hidden, const BatchReplayHooks& hooks,
                       const SamplingVerify* sampling = nullptr,
                       std::span<const std::vector<float>> target_logprob = {});

/// Replays one sequence; calls on_step after every step (may be empty). Returns the steps.
std::vector<StepRecord> replay_sequence(drafter::MtpDrafter& drafter, const io::TraceSequence& seq,
                                        int sequence_index, int k, int hidden, AcceptanceStats& stats,
                                        const std::function<void(const StepRecord&)>& on_step = {});

}  // namespace mtplab::harness
