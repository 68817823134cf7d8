// The steps that speculative replay (replay.cpp) and teacher-forced replay (replay_teacher.cpp)
// share, internal to the harness: checking a sequence, its prefill, the record of a step, and
// the end of every step, after_verify(keep) then the catch-up rows from the trace's true hiddens
// up to row L + keep, the next position being L + keep + 1. A speculative step keeps its
// accepted drafts (keep = accepted); a teacher-forced position keeps none (keep = 0: the next
// position is L + 1). ContinuousBatch steps a batch of slots, a finished sequence leaving its slot
// to the next one of the trace (continuous batching, in trace order); one sequence is a batch of
// one. What differs between the replays, the propose and the verification, stays theirs.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "drafter/drafter.hpp"
#include "harness/replay.hpp"
#include "io/trace.hpp"

namespace mtplab::harness::detail {

/// Refuses a prompt outside 2 .. N or hiddens that are not N x `hidden`, naming the sequence.
void check_sequence(const io::TraceSequence& seq, int sequence_index, int hidden);
/// Refuses a batch size outside 1 .. drafter::kMaxBatch, then checks every sequence.
void check_batch(std::span<const io::TraceSequence> seqs, int batch_size, int hidden);

/// The target's hidden h_r of the sequence (host BF16 [hidden]).
inline const bf16* hidden_row(const io::TraceSequence& seq, int r, int hidden) {
  return seq.hiddens.data() + static_cast<size_t>(r) * static_cast<size_t>(hidden);
}

/// The record of the step at position L: `sequence`, L, the drafts and the k targets
/// t_{L+1} .. t_{L+k}.
StepRecord step_record(const io::TraceSequence& seq, int32_t sequence, int L, int k,
                       std::span<const int32_t> drafts);

/// The hooks of one sequence's replay as the batched loop's at batch 1, with its steps collected
/// into `steps` and counted into `stats` (when not null) before hooks.after_step sees each.
BatchReplayHooks one_sequence_hooks(const ReplayHooks& hooks, int k, std::vector<StepRecord>& steps,
                                    AcceptanceStats* stats);
/// `seq` under the index `sequence_index` (a copy only when its own index differs).
const io::TraceSequence& indexed(const io::TraceSequence& seq, int sequence_index,
                                 std::optional<io::TraceSequence>& copy);

/// `seqs` stepped at batch `batch_size` through the drafter's batched step, continuous batching in
/// trace order: slots are filled at construction and after each finished step (a sequence too
/// short for a step leaves at once); each step is gather, begin_step, the replay's propose_batch
/// and per row its verify and advance, then finish. The sequences must be checked (check_batch).
class ContinuousBatch {
 public:
  /// A row of the step: its slot, its sequence (index into seqs), its position L.
  struct Row {
    int slot;
    int seq;
    int L;
  };
  ContinuousBatch(drafter::MtpDrafter& drafter, std::span<const io::TraceSequence> seqs, int batch_size,
                  int k, int hidden, const BatchReplayHooks& hooks);
  /// The live rows of the next step, in slot order (rows() and inputs()); false when none is left.
  bool gather();
  const std::vector<Row>& rows() const { return rows_; }
  /// The rows as propose_batch takes them: slot, t_L, h_{L-1}.
  const std::vector<drafter::BatchRow>& inputs() const { return inputs_; }
  drafter::BatchState& batch() { return *batch_; }
  /// hooks.before_step.
  void begin_step() const;
  /// Row b of the step: after_verify(keep), the catch-up rows up to row L + keep, its next
  /// position L + keep + 1.
  void advance(size_t b, int keep);
  /// After every row advanced: hooks.after_step(recs); the finished sequences leave (every one
  /// when the hook ended the replay) and the next ones take their slots. False ends the replay.
  bool finish(const std::vector<StepRecord>& recs);
  /// The batched steps done.
  int64_t steps() const { return batched_steps_; }

 private:
  struct Live {
    int seq = -1;  // index into seqs
    int L = 0;     // the next step's position
    int steps = 0;
  };
  bool done(const Live& l) const;
  void fill();
  drafter::MtpDrafter& drafter_;
  std::span<const io::TraceSequence> seqs_;
  int k_, hidden_;
  const BatchReplayHooks& hooks_;
  int slots_;
  std::unique_ptr<drafter::BatchState> batch_;
  std::vector<Live> live_;
  size_t next_ = 0;
  std::vector<Row> rows_;
  std::vector<drafter::BatchRow> inputs_;
  int64_t batched_steps_ = 0;
};

}  // namespace mtplab::harness::detail
