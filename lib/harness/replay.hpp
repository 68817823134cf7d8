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
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/numeric.hpp"
#include "drafter/drafter.hpp"
#include "io/trace.hpp"

namespace mtplab::harness {

/// One propose / verify step.
struct StepRecord {
  int32_t sequence = 0;
  int32_t position = 0;  ///< L: the drafts predict t_{L+1}..t_{L+k}
  int32_t accepted = 0;
  std::vector<int32_t> drafts;
  std::vector<int32_t> targets;
};

/// Acceptance as vLLM defines it: rate = accepted / drafted; tau = 1 + mean accepted per step
/// (the target's bonus token counted); per-position rate r_i = P(accepted >= i).
struct AcceptanceStats {
  int64_t steps = 0;
  int64_t drafted = 0;
  int64_t accepted = 0;
  std::vector<int64_t> at_least;  ///< [k]: steps with accepted >= i + 1
  void add(int k, int a);
  double rate() const { return drafted ? static_cast<double>(accepted) / drafted : 0.0; }
  double tau() const { return steps ? 1.0 + static_cast<double>(accepted) / steps : 0.0; }
  std::vector<double> per_position() const;
};

/// Longest prefix of drafts equal to targets.
int accepted_prefix(const std::vector<int32_t>& drafts, const std::vector<int32_t>& targets);

/// Hooks around each step of a replay (either may be empty).
struct ReplayHooks {
  /// Called before each propose (after the prefill for the first step).
  std::function<void()> before_step;
  /// Called after each step's catch-up rows; returning false ends the replay after this step.
  std::function<bool(const StepRecord&)> after_step;
};

/// Replays one sequence with hooks around every step. Returns the steps done.
std::vector<StepRecord> replay_sequence(drafter::MtpDrafter& drafter, const io::TraceSequence& seq,
                                        int sequence_index, int k, int hidden, AcceptanceStats& stats,
                                        const ReplayHooks& hooks);

/// Replays one sequence; calls on_step after every step (may be empty). Returns the steps.
std::vector<StepRecord> replay_sequence(drafter::MtpDrafter& drafter, const io::TraceSequence& seq,
                                        int sequence_index, int k, int hidden, AcceptanceStats& stats,
                                        const std::function<void(const StepRecord&)>& on_step = {});

}  // namespace mtplab::harness
