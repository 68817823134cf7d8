// The step recorder: turns the replay's steps, as they happen on this rank, into the rows of a
// PointResult (steps, drafts, per-draft phases, per-sequence rows, repeat-0 acceptance), timing
// each (batched) step with the host clock and the backend's phase events.
//
// Invariants:
// - Every row of one batched step carries that step's timings (one propose for all its rows);
//   `batch_step` tells the rows of one step apart, and summaries count each step once.
// - Acceptance and the per-sequence table come from repeat 0; later repeats only time and check
//   that their drafts equal repeat 0's at the same (sequence, position).
// - The recorder is rank-local: reduce_over_ranks (runner.cpp) makes the point's figures.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "harness/experiment.hpp"
#include "harness/replay.hpp"
#include "harness/results.hpp"
#include "harness/timer.hpp"
#include "io/trace.hpp"
#include "ops/ops.hpp"

namespace mtplab::harness {

/// Whether a point's replay requests the head's figures of every draft (DraftStats: margins and
/// log-probabilities, PointResult::draft_margin / draft_logprob): with record_margins on, wherever
/// the head runs (skip: head has no logits).
bool records_draft_stats(const PointConfig& p);

/// What the recorder needs of a sequence: its index (the steps' `sequence`), prompt length and
/// positions (a replay's trace length; an online run's prompt + max_new_tokens, its horizon).
struct RecordedSequence {
  int64_t index = 0;
  int32_t prompt_length = 0;
  int64_t length = 0;
};
std::vector<RecordedSequence> recorded_sequences(const std::vector<io::TraceSequence>& seqs);

class StepRecorder {
 public:
  /// `seqs`: the point's sequences, in the order the replay (or online run) takes them.
  StepRecorder(ops::Backend& be, EventPhaseTimer& timer, const PointConfig& p,
               std::vector<RecordedSequence> seqs, PointResult& r);

  /// Starts repeat `rep` (0-based).
  void begin_repeat(int rep);
  /// The prefill of trace sequence `i` (an index into the point's sequences) just ran.
  void after_prefill(int i);
  /// A (batched) step starts.
  void before_step();
  /// The rows of the step that just finished (verify and catch-up included).
  void after_step(const std::vector<StepRecord>& rows);
  /// How after_step counts the distinct routed experts of a step of `rows` rows (its batch_experts
  /// column; MtpDrafter::last_distinct_experts). It runs after the step's times are taken, so its
  /// download does not count in them. Without one the column is 0.
  void count_experts(std::function<int(int rows)> count) { count_experts_ = std::move(count); }
  /// Trace sequence `i` left the replay after `steps` steps; `length`: the positions it then held
  /// (an online sequence's prompt and generated tokens; 0 keeps the length it was given).
  void after_sequence(int i, int steps, int64_t length = 0);
  /// Ends the repeat: in repeat 0, the per-sequence rows in trace order.
  void end_repeat();

  int64_t steps_in_repeat() const { return steps_in_repeat_; }
  /// Fraction of the point done (repeats and positions), for the progress line.
  double progress() const;
  int64_t steps() const { return global_step_; }

 private:
  using Clock = std::chrono::steady_clock;
  ops::Backend& be_;
  EventPhaseTimer& timer_;
  const PointConfig& p_;
  std::vector<RecordedSequence> seqs_;
  PointResult& r_;
  int k_ = 0;
  bool draft_stats_ = false;
  bool teacher_forced_ = false;
  bool online_ = false;  // the step table's online columns (draft_ms, verify_ms)
  int rep_ = 0;
  int64_t global_step_ = 0, steps_in_repeat_ = 0;
  Clock::time_point t0_;
  std::function<int(int)> count_experts_;
  std::map<std::pair<int32_t, int32_t>, size_t> repeat0_row_;  // (sequence, position) -> row
  std::map<int32_t, int> by_trace_index_;                      // TraceSequence::index -> i
  // Per sequence of the current repeat: prefill time, steps, positions advanced.
  std::vector<double> prefill_ms_;
  std::vector<int32_t> seq_steps_;
  std::vector<int64_t> advanced_;
  std::vector<int64_t> length_;  // the positions a sequence held when it left (repeat 0; 0: its given length)
  std::vector<uint8_t> started_;  // prefilled in this repeat (a step limit may stop before some)
  int64_t total_positions_ = 0, positions_done_ = 0;
};

}  // namespace mtplab::harness
