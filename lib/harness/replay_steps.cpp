// The steps both replays share (replay_steps.hpp).
#include "harness/replay_steps.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace mtplab::harness::detail {

void check_sequence(const io::TraceSequence& seq, int sequence_index, int hidden) {
  const int N = static_cast<int>(seq.tokens.size());
  const int P = seq.prompt_length;
  MTP_REQUIRE(P >= 2 && P <= N, "sequence ", sequence_index, ": prompt length ", P, " outside 2..", N);
  MTP_REQUIRE(seq.hiddens.size() == static_cast<size_t>(N) * hidden, "sequence ", sequence_index, ": ",
              seq.hiddens.size(), " hidden values for ", N, " positions of ", hidden);
}

void check_batch(std::span<const io::TraceSequence> seqs, int batch_size, int hidden) {
  MTP_REQUIRE(batch_size >= 1 && batch_size <= drafter::kMaxBatch, "batch_size ", batch_size, " outside 1..",
              drafter::kMaxBatch);
  for (const io::TraceSequence& s : seqs) check_sequence(s, static_cast<int>(s.index), hidden);
}

StepRecord step_record(const io::TraceSequence& seq, int32_t sequence, int L, int k,
                       std::span<const int32_t> drafts) {
  StepRecord rec;
  rec.sequence = sequence;
  rec.position = L;
  rec.drafts.assign(drafts.begin(), drafts.end());
  const auto first = seq.tokens.begin() + L + 1;
  rec.targets.assign(first, first + k);
  return rec;
}

// ---- one sequence ------------------------------------------------------------------------------

BatchReplayHooks one_sequence_hooks(const ReplayHooks& hooks, int k, std::vector<StepRecord>& steps,
                                    AcceptanceStats* stats) {
  BatchReplayHooks b;
  if (hooks.after_prefill) b.after_prefill = [&hooks](int) { hooks.after_prefill(); };
  b.before_step = hooks.before_step;
  b.after_step = [&hooks, k, &steps, stats](const std::vector<StepRecord>& rows) {
    MTP_REQUIRE(rows.size() == 1, "replay: a step of one sequence has ", rows.size(), " rows");
    if (stats) stats->add(k, rows[0].accepted, rows[0].expected_accepted());
    const bool go_on = !hooks.after_step || hooks.after_step(rows[0]);
    steps.push_back(rows[0]);
    return go_on;
  };
  b.draft_stats = hooks.draft_stats;
  return b;
}

const io::TraceSequence& indexed(const io::TraceSequence& seq, int sequence_index,
                                 std::optional<io::TraceSequence>& copy) {
  if (seq.index == sequence_index) return seq;
  copy = seq;
  copy->index = sequence_index;
  return *copy;
}

// ---- ContinuousBatch ---------------------------------------------------------------------------

ContinuousBatch::ContinuousBatch(drafter::MtpDrafter& drafter, std::span<const io::TraceSequence> seqs,
                                 int batch_size, int k, int hidden, const BatchReplayHooks& hooks)
    : drafter_(drafter),
      seqs_(seqs),
      k_(k),
      hidden_(hidden),
      hooks_(hooks),
      slots_(std::min<int>(batch_size, static_cast<int>(std::max<size_t>(seqs.size(), 1)))),
      batch_(drafter.new_batch(slots_)),
      live_(static_cast<size_t>(slots_)) {
  fill();
}

bool ContinuousBatch::done(const Live& l) const {
  return l.L + k_ > static_cast<int>(seqs_[static_cast<size_t>(l.seq)].tokens.size()) - 1;
}

void ContinuousBatch::fill() {
  for (int s = 0; s < slots_; ++s) {
    Live& l = live_[static_cast<size_t>(s)];
    while (l.seq < 0 && next_ < seqs_.size()) {
      const int si = static_cast<int>(next_++);
      const io::TraceSequence& seq = seqs_[static_cast<size_t>(si)];
      const int slot = drafter_.new_sequence(*batch_);
      MTP_REQUIRE(slot == s, "replay: the drafter gave slot ", slot, " where slot ", s, " was free");
      drafter_.append_rows(*batch_, slot, seq.tokens.data() + 1, hidden_row(seq, 0, hidden_),
                           seq.prompt_length - 1, 0, drafter::Phase::prefill);
      if (hooks_.after_prefill) hooks_.after_prefill(si);
      l = Live{si, seq.prompt_length, 0};
      if (done(l)) {
        drafter_.release(*batch_, slot);
        if (hooks_.after_sequence) hooks_.after_sequence(si, 0);
        l = Live{};
      }
    }
  }
}

bool ContinuousBatch::gather() {
  rows_.clear();
  inputs_.clear();
  for (int s = 0; s < slots_; ++s) {
    const Live& l = live_[static_cast<size_t>(s)];
    if (l.seq < 0) continue;
    const io::TraceSequence& seq = seqs_[static_cast<size_t>(l.seq)];
    rows_.push_back(Row{s, l.seq, l.L});
    inputs_.push_back(
        drafter::BatchRow{s, seq.tokens[static_cast<size_t>(l.L)], hidden_row(seq, l.L - 1, hidden_)});
  }
  return !rows_.empty();
}

void ContinuousBatch::begin_step() const {
  if (hooks_.before_step) hooks_.before_step();
}

void ContinuousBatch::advance(size_t b, int keep) {
  const int s = rows_[b].slot;
  Live& l = live_[static_cast<size_t>(s)];
  const io::TraceSequence& seq = seqs_[static_cast<size_t>(l.seq)];
  drafter_.after_verify(*batch_, s, keep);
  const int rows = l.L + keep;  // rows 0 .. L + keep - 1 are the verified prefix
  const int from = batch_->seq_len(s);
  const int n = rows - from;
  MTP_REQUIRE(n >= 0, "sequence ", seq.index, ": drafter holds ", from, " rows, more than the ", rows,
              " verified");
  drafter_.append_rows(*batch_, s, seq.tokens.data() + from + 1, hidden_row(seq, from, hidden_), n, from,
                       drafter::Phase::catch_up);
  l.L = rows + 1;
  ++l.steps;
}

bool ContinuousBatch::finish(const std::vector<StepRecord>& recs) {
  ++batched_steps_;
  const bool go_on = !hooks_.after_step || hooks_.after_step(recs);
  // Finished sequences leave; the next ones take their slots.
  for (int s = 0; s < slots_; ++s) {
    Live& l = live_[static_cast<size_t>(s)];
    if (l.seq >= 0 && (done(l) || !go_on)) {
      drafter_.release(*batch_, s);
      if (hooks_.after_sequence) hooks_.after_sequence(l.seq, l.steps);
      l = Live{};
    }
  }
  if (go_on) fill();
  return go_on;
}

}  // namespace mtplab::harness::detail
