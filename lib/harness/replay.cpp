#include "harness/replay.hpp"

#include <deque>

#include "core/error.hpp"

namespace mtplab::harness {

void AcceptanceStats::add(int k, int a) {
  if (static_cast<int>(at_least.size()) < k) at_least.resize(k, 0);
  ++steps;
  drafted += k;
  accepted += a;
  for (int i = 0; i < a; ++i) ++at_least[i];
}

std::vector<double> AcceptanceStats::per_position() const {
  std::vector<double> out(at_least.size());
  for (size_t i = 0; i < at_least.size(); ++i)
    out[i] = steps ? static_cast<double>(at_least[i]) / steps : 0.0;
  return out;
}

int accepted_prefix(const std::vector<int32_t>& drafts, const std::vector<int32_t>& targets) {
  int a = 0;
  while (a < static_cast<int>(drafts.size()) && a < static_cast<int>(targets.size()) &&
         drafts[a] == targets[a])
    ++a;
  return a;
}

std::vector<StepRecord> replay_sequence(drafter::MtpDrafter& drafter, const io::TraceSequence& seq,
                                        int sequence_index, int k, int hidden, AcceptanceStats& stats,
                                        const std::function<void(const StepRecord&)>& on_step) {
  ReplayHooks hooks;
  if (on_step)
    hooks.after_step = [&](const StepRecord& rec) {
      on_step(rec);
      return true;
    };
  return replay_sequence(drafter, seq, sequence_index, k, hidden, stats, hooks);
}

namespace {
void check_sequence(const io::TraceSequence& seq, int sequence_index, int hidden) {
  const int N = static_cast<int>(seq.tokens.size());
  const int P = seq.prompt_length;
  MTP_REQUIRE(P >= 2 && P <= N, "sequence ", sequence_index, ": prompt length ", P, " outside 2..", N);
  MTP_REQUIRE(seq.hiddens.size() == static_cast<size_t>(N) * hidden, "sequence ", sequence_index, ": ",
              seq.hiddens.size(), " hidden values for ", N, " positions of ", hidden);
}
}  // namespace

std::vector<StepRecord> replay_sequence(drafter::MtpDrafter& drafter, const io::TraceSequence& seq,
                                        int sequence_index, int k, int hidden, AcceptanceStats& stats,
                                        const ReplayHooks& hooks) {
  check_sequence(seq, sequence_index, hidden);
  const int N = static_cast<int>(seq.tokens.size());
  const int P = seq.prompt_length;
  auto hidden_row = [&](int r) { return seq.hiddens.data() + static_cast<size_t>(r) * hidden; };
  auto st = drafter.new_sequence();
  drafter.append_rows(*st, seq.tokens.data() + 1, hidden_row(0), P - 1, 0, drafter::Phase::prefill);
  if (hooks.after_prefill) hooks.after_prefill();
  std::vector<StepRecord> steps;
  int L = P;
  while (L + k <= N - 1) {
    if (hooks.before_step) hooks.before_step();
    StepRecord rec;
    rec.sequence = sequence_index;
    rec.position = L;
    drafter::ProposeExtras extras;
    if (hooks.draft_stats) extras.stats = &rec.stats;
    rec.drafts = drafter.propose(*st, seq.tokens[L], hidden_row(L - 1), k, extras);
    rec.targets.assign(seq.tokens.begin() + L + 1, seq.tokens.begin() + L + 1 + k);
    rec.accepted = accepted_prefix(rec.drafts, rec.targets);
    drafter.after_verify(*st, rec.accepted);
    const int next_L = L + rec.accepted + 1;
    const int from = st->seq_len();
    const int n = next_L - 1 - from;
    MTP_REQUIRE(n >= 0, "sequence ", sequence_index, ": drafter holds ", from, " rows, more than the ",
                next_L - 1, " verified");
    drafter.append_rows(*st, seq.tokens.data() + from + 1, hidden_row(from), n, from,
                        drafter::Phase::catch_up);
    stats.add(k, rec.accepted);
    const bool go_on = !hooks.after_step || hooks.after_step(rec);
    steps.push_back(std::move(rec));
    L = next_L;
    if (!go_on) break;
  }
  return steps;
}

int64_t replay_batched(drafter::MtpDrafter& drafter, std::span<const io::TraceSequence> seqs, int batch_size,
                       int k, int hidden, const BatchReplayHooks& hooks) {
  MTP_REQUIRE(batch_size >= 1 && batch_size <= drafter::kMaxBatch, "batch_size ", batch_size, " outside 1..",
              drafter::kMaxBatch);
  for (size_t i = 0; i < seqs.size(); ++i) check_sequence(seqs[i], static_cast<int>(seqs[i].index), hidden);
  const int slots = std::min<int>(batch_size, static_cast<int>(std::max<size_t>(seqs.size(), 1)));
  auto batch = drafter.new_batch(slots);
  struct Live {
    int seq = -1;  // index into seqs
    int L = 0;     // the next step's position
    int steps = 0;
  };
  std::vector<Live> live(static_cast<size_t>(slots));
  size_t next = 0;
  auto hidden_row = [&](const io::TraceSequence& s, int r) {
    return s.hiddens.data() + static_cast<size_t>(r) * hidden;
  };
  auto done = [&](const Live& l) {
    return l.L + k > static_cast<int>(seqs[static_cast<size_t>(l.seq)].tokens.size()) - 1;
  };
  // Fills free slots from the trace; a sequence too short for a step leaves at once.
  auto fill = [&]() {
    for (int s = 0; s < slots; ++s) {
      Live& l = live[static_cast<size_t>(s)];
      while (l.seq < 0 && next < seqs.size()) {
        const int si = static_cast<int>(next++);
        const io::TraceSequence& seq = seqs[static_cast<size_t>(si)];
        const int slot = drafter.new_sequence(*batch);
        MTP_REQUIRE(slot == s, "replay: the drafter gave slot ", slot, " where slot ", s, " was free");
        drafter.append_rows(*batch, slot, seq.tokens.data() + 1, hidden_row(seq, 0), seq.prompt_length - 1, 0,
                            drafter::Phase::prefill);
        if (hooks.after_prefill) hooks.after_prefill(si);
        l = Live{si, seq.prompt_length, 0};
        if (done(l)) {
          drafter.release(*batch, slot);
          if (hooks.after_sequence) hooks.after_sequence(si, 0);
          l = Live{};
        }
      }
    }
  };
  int64_t batched_steps = 0;
  fill();
  std::vector<drafter::BatchRow> rows;
  std::vector<int> row_slot;
  for (;;) {
    rows.clear();
    row_slot.clear();
    for (int s = 0; s < slots; ++s) {
      const Live& l = live[static_cast<size_t>(s)];
      if (l.seq < 0) continue;
      const io::TraceSequence& seq = seqs[static_cast<size_t>(l.seq)];
      rows.push_back(drafter::BatchRow{s, seq.tokens[static_cast<size_t>(l.L)], hidden_row(seq, l.L - 1)});
      row_slot.push_back(s);
    }
    if (rows.empty()) break;
    if (hooks.before_step) hooks.before_step();
    drafter::ProposeExtras extras;
    std::vector<drafter::DraftStats> stats;
    if (hooks.draft_stats) extras.stats = &stats;
    const std::vector<int32_t> drafts = drafter.propose_batch(*batch, rows, k, extras);
    std::vector<StepRecord> recs(rows.size());
    for (size_t b = 0; b < rows.size(); ++b) {
      const int s = row_slot[b];
      Live& l = live[static_cast<size_t>(s)];
      const io::TraceSequence& seq = seqs[static_cast<size_t>(l.seq)];
      StepRecord& rec = recs[b];
      rec.sequence = static_cast<int32_t>(seq.index);
      rec.position = l.L;
      rec.batch_rows = static_cast<int32_t>(rows.size());
      rec.drafts.assign(drafts.begin() + static_cast<std::ptrdiff_t>(b * k),
                        drafts.begin() + static_cast<std::ptrdiff_t>((b + 1) * k));
      rec.targets.assign(seq.tokens.begin() + l.L + 1, seq.tokens.begin() + l.L + 1 + k);
      if (hooks.draft_stats)
        rec.stats.assign(stats.begin() + static_cast<std::ptrdiff_t>(b * k),
                         stats.begin() + static_cast<std::ptrdiff_t>((b + 1) * k));
      rec.accepted = accepted_prefix(rec.drafts, rec.targets);
      drafter.after_verify(*batch, s, rec.accepted);
      const int next_L = l.L + rec.accepted + 1;
      const int from = batch->seq_len(s);
      const int n = next_L - 1 - from;
      MTP_REQUIRE(n >= 0, "sequence ", seq.index, ": drafter holds ", from, " rows, more than the ",
                  next_L - 1, " verified");
      drafter.append_rows(*batch, s, seq.tokens.data() + from + 1, hidden_row(seq, from), n, from,
                          drafter::Phase::catch_up);
      l.L = next_L;
      ++l.steps;
    }
    ++batched_steps;
    const bool go_on = !hooks.after_step || hooks.after_step(recs);
    // Finished sequences leave; the next ones take their slots.
    for (int s = 0; s < slots; ++s) {
      Live& l = live[static_cast<size_t>(s)];
      if (l.seq >= 0 && (done(l) || !go_on)) {
        drafter.release(*batch, s);
        if (hooks.after_sequence) hooks.after_sequence(l.seq, l.steps);
        l = Live{};
      }
    }
    if (!go_on) break;
    fill();
  }
  return batched_steps;
}

}  // namespace mtplab::harness
