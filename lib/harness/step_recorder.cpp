// The step recorder (step_recorder.hpp).
#include "harness/step_recorder.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace mtplab::harness {
namespace {
double ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
// Positions a sequence's replay walks through (at least 1, so that an empty one still counts).
int64_t positions_of(const RecordedSequence& s) {
  return std::max<int64_t>(1, s.length - 1 - s.prompt_length);
}
}  // namespace

std::vector<RecordedSequence> recorded_sequences(const std::vector<io::TraceSequence>& seqs) {
  std::vector<RecordedSequence> out;
  out.reserve(seqs.size());
  for (const io::TraceSequence& s : seqs)
    out.push_back(RecordedSequence{s.index, s.prompt_length, s.length()});
  return out;
}

bool records_draft_stats(const PointConfig& p) {
  return p.arms.replay.record_margins && p.arms.drafter.skip != drafter::Skip::head;
}

StepRecorder::StepRecorder(ops::Backend& be, EventPhaseTimer& timer, const PointConfig& p,
                           std::vector<RecordedSequence> seqs, PointResult& r)
    : be_(be),
      timer_(timer),
      p_(p),
      seqs_(std::move(seqs)),
      r_(r),
      k_(p.arms.drafter.draft_len),
      draft_stats_(records_draft_stats(p)),
      teacher_forced_(p.arms.replay.replay == ReplayMode::teacher_forced),
      online_(p.mode == RunMode::online) {
  r_.k = k_;
  r_.online = online_;
  r_.timing.assign(timing_columns().size(), {});
  length_.assign(seqs_.size(), 0);
  for (size_t i = 0; i < seqs_.size(); ++i) {
    by_trace_index_[static_cast<int32_t>(seqs_[i].index)] = static_cast<int>(i);
    total_positions_ += positions_of(seqs_[i]);
  }
}

void StepRecorder::begin_repeat(int rep) {
  rep_ = rep;
  steps_in_repeat_ = 0;
  positions_done_ = 0;
  prefill_ms_.assign(seqs_.size(), 0.0);
  seq_steps_.assign(seqs_.size(), 0);
  advanced_.assign(seqs_.size(), 0);
  started_.assign(seqs_.size(), 0);
}

void StepRecorder::after_prefill(int i) {
  prefill_ms_.at(static_cast<size_t>(i)) += timer_.collect().prefill;
  started_[static_cast<size_t>(i)] = 1;
}

void StepRecorder::before_step() {
  (void)timer_.collect();  // nothing is open between steps; anything closed belongs to no step
  t0_ = Clock::now();
}

void StepRecorder::after_step(const std::vector<StepRecord>& rows) {
  be_.synchronize();
  const auto t1 = Clock::now();
  const PhaseTimes ph = timer_.collect();
  const double cols[] = {ms_between(t0_, t1), ph.propose,      ph.block_total(), ph.head_total(),
                         ph.exchange_total(), ph.after_verify, ph.catch_up,      ph.stats};
  static_assert(std::size(cols) == 8);
  MTP_REQUIRE(r_.timing.size() == std::size(cols), "step recorder: ", r_.timing.size(), " timing columns");
  const int32_t experts = count_experts_ ? count_experts_(static_cast<int>(rows.size())) : 0;
  for (const StepRecord& rec : rows) {
    const size_t row = r_.sequence.size();
    r_.repeat.push_back(rep_);
    r_.sequence.push_back(rec.sequence);
    r_.position.push_back(rec.position);
    r_.accepted.push_back(rec.accepted);
    r_.batch_step.push_back(static_cast<int32_t>(global_step_));
    r_.batch_rows.push_back(rec.batch_rows);
    r_.batch_experts.push_back(experts);
    r_.warmup.push_back(global_step_ < p_.measure.warmup_steps ? 1 : 0);
    for (size_t col = 0; col < r_.timing.size(); ++col) r_.timing[col].push_back(cols[col]);
    if (online_) {
      // The drafter's part of the step (its propose, stats pass, trim and catch-up) and the target's.
      r_.draft_ms.push_back(ph.propose + ph.stats + ph.after_verify + ph.catch_up);
      r_.verify_ms.push_back(ph.verify);
    }
    for (int i = 0; i < k_; ++i) {
      r_.block_ms.push_back(ph.block[static_cast<size_t>(i)]);
      r_.head_ms.push_back(ph.head[static_cast<size_t>(i)]);
      r_.exchange_ms.push_back(ph.exchange[static_cast<size_t>(i)]);
    }
    r_.drafts.insert(r_.drafts.end(), rec.drafts.begin(), rec.drafts.end());
    r_.targets.insert(r_.targets.end(), rec.targets.begin(), rec.targets.end());
    if (draft_stats_) {
      MTP_REQUIRE(rec.stats.size() == static_cast<size_t>(k_), "step recorder: ", rec.stats.size(),
                  " draft stats for ", k_, " drafts at sequence ", rec.sequence, ", position ", rec.position);
      for (const drafter::DraftStats& d : rec.stats) {
        r_.draft_margin.push_back(d.margin);
        r_.draft_logprob.push_back(d.logprob);
      }
    }
    // A replay that does not set a_i (one written before it existed) verified greedily: [d == t].
    StepRecord greedy;
    if (rec.accept_prob.empty())
      for (int i = 0; i < k_; ++i)
        greedy.accept_prob.push_back(
            rec.drafts.at(static_cast<size_t>(i)) == rec.targets.at(static_cast<size_t>(i)) ? 1.0f : 0.0f);
    const StepRecord& probs = rec.accept_prob.empty() ? greedy : rec;
    MTP_REQUIRE(probs.accept_prob.size() == static_cast<size_t>(k_),
                "step recorder: ", probs.accept_prob.size(), " acceptance probabilities for ", k_, " drafts");
    r_.accept_prob.insert(r_.accept_prob.end(), probs.accept_prob.begin(), probs.accept_prob.end());
    const double expected = probs.expected_accepted();
    r_.expected_accepted.push_back(expected);
    if (rep_ == 0) {
      r_.acceptance.add(k_, rec.accepted, expected);
      repeat0_row_[{rec.sequence, rec.position}] = row;
    } else {
      auto it = repeat0_row_.find({rec.sequence, rec.position});
      if (it == repeat0_row_.end() ||
          !std::equal(rec.drafts.begin(), rec.drafts.end(),
                      r_.drafts.begin() + static_cast<std::ptrdiff_t>(it->second * static_cast<size_t>(k_))))
        ++r_.repeat_mismatches;
    }
    auto at = by_trace_index_.find(rec.sequence);
    MTP_REQUIRE(at != by_trace_index_.end(), "step recorder: a step of sequence ", rec.sequence,
                ", which the point does not replay");
    const size_t i = static_cast<size_t>(at->second);
    ++seq_steps_[i];
    // Positions walked: a speculative step moves past its accepted drafts and the bonus token, a
    // teacher-forced position by one.
    advanced_[i] = rec.position + (teacher_forced_ ? 0 : rec.accepted) + 1 - seqs_[i].prompt_length;
  }
  ++global_step_;
  ++steps_in_repeat_;
}

void StepRecorder::after_sequence(int i, int steps, int64_t length) {
  const size_t s = static_cast<size_t>(i);
  MTP_REQUIRE(seq_steps_.at(s) == steps, "step recorder: sequence ", seqs_[s].index, " took ", steps,
              " steps, ", seq_steps_[s], " were recorded");
  positions_done_ += positions_of(seqs_[s]);
  advanced_[s] = 0;
  if (length > 0 && rep_ == 0) length_.at(s) = length;
}

void StepRecorder::end_repeat() {
  if (rep_ != 0) return;
  for (size_t i = 0; i < seqs_.size(); ++i) {
    if (!started_[i]) continue;
    r_.seq_index.push_back(static_cast<int32_t>(seqs_[i].index));
    r_.seq_prompt_len.push_back(seqs_[i].prompt_length);
    r_.seq_length.push_back(static_cast<int32_t>(length_[i] > 0 ? length_[i] : seqs_[i].length));
    r_.seq_steps.push_back(seq_steps_[i]);
    r_.seq_prefill_ms.push_back(prefill_ms_[i]);
  }
}

double StepRecorder::progress() const {
  int64_t live = 0;
  for (int64_t a : advanced_) live += a;
  double frac = total_positions_ ? static_cast<double>(positions_done_ + live) / total_positions_ : 1.0;
  if (p_.measure.max_steps > 0)
    frac = std::max(frac, static_cast<double>(steps_in_repeat_) / p_.measure.max_steps);
  return (rep_ + std::min(frac, 1.0)) / p_.measure.repeats;
}

}  // namespace mtplab::harness
