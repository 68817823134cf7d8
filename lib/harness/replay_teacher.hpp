// Teacher-forced replay (`replay: teacher_forced`): the evaluation MTP training reports.
//
// For a sequence with tokens t_0..t_{N-1}, hiddens h_0..h_{N-1} and prompt length P, at EVERY
// position L = P, P + 1, ..., N - 1 - k (whatever a speculative step would have accepted):
//   drafts = propose(t_L, h_{L-1}, k, chain_tokens = t_{L+1} .. t_{L+k-1})
//     draft j (1-based) reads the trace's token t_{L+j-1} as its input, not draft j - 1: each depth
//     is conditioned on the true prefix, as in training
//   depth j is accepted iff draft j == t_{L+j}          (per-depth, conditional accuracy)
//   accepted = the longest such prefix                   (what a speculative step at L accepts:
//     up to the first miss every chain token equals the drafter's own draft, so the drafts are
//     those an unforced propose would give)
//   after_verify(0): the drafter keeps the true row L - 1 only; catch-up rows up to row L - 1
//     (none under draft_rows rewrite), so the next position starts from the trace's rows
// Positions are the steps of the results (one row each); a sequence ends when fewer than k
// targets remain, as in speculative replay.
//
// At batch B the sequences are stepped together exactly as replay_batched steps them (continuous
// batching in trace order), each row at its own position with its own chain tokens; a sequence's
// drafts do not depend on B.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "drafter/drafter.hpp"
#include "harness/replay.hpp"
#include "io/trace.hpp"

namespace mtplab::harness {

/// Teacher-forced replay of one sequence, hooks as replay_sequence's (ReplayHooks::draft_stats
/// requests the drafts' DraftStats). Returns the positions drafted, in order.
std::vector<StepRecord> replay_teacher_forced(drafter::MtpDrafter& drafter, const io::TraceSequence& seq,
                                              int sequence_index, int k, int hidden,
                                              const ReplayHooks& hooks);

/// Teacher-forced replay of `seqs` at batch `batch_size` through propose_batch, continuous batching
/// in trace order, hooks as replay_batched's. Returns the batched steps done.
int64_t replay_teacher_forced_batched(drafter::MtpDrafter& drafter, std::span<const io::TraceSequence> seqs,
                                      int batch_size, int k, int hidden, const BatchReplayHooks& hooks);

/// Per depth j (0-based), the fraction of steps whose draft j equals its target: the teacher-forced
/// accuracy of depth j + 1 when the steps are teacher-forced positions. drafts and targets are
/// [steps, k] row-major; `rows` selects the steps counted (empty: all). Empty when no step counts.
std::vector<double> depth_hit_rates(std::span<const int32_t> drafts, std::span<const int32_t> targets, int k,
                                    std::span<const uint8_t> rows = {});

}  // namespace mtplab::harness
