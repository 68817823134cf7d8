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
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/numeric.hpp"
#include "drafter/drafter.hpp"
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

/// Replays one sequence with hooks around every step. Returns the steps done.
std::vector<StepRecord> replay_sequence(drafter::MtpDrafter& drafter, const io::TraceSequence& seq,
                                        int sequence_index, int k, int hidden, AcceptanceStats& stats,
                                        const ReplayHooks& hooks);

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
/// each sequence's TraceSequence::index. Returns the batched steps done.
int64_t replay_batched(drafter::MtpDrafter& drafter, std::span<const io::TraceSequence> seqs, int batch_size,
                       int k, int hidden, const BatchReplayHooks& hooks);

/// Replays one sequence; calls on_step after every step (may be empty). Returns the steps.
std::vector<StepRecord> replay_sequence(drafter::MtpDrafter& drafter, const io::TraceSequence& seq,
                                        int sequence_index, int k, int hidden, AcceptanceStats& stats,
                                        const std::function<void(const StepRecord&)>& on_step = {});

}  // namespace mtplab::harness
