// Teacher-forced replay (replay_teacher.hpp): every position, the chain fed the trace's tokens.
#include "harness/replay_teacher.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace mtplab::harness {
namespace {

void check_sequence(const io::TraceSequence& seq, int sequence_index, int hidden) {
  const int N = static_cast<int>(seq.tokens.size());
  const int P = seq.prompt_length;
  MTP_REQUIRE(P >= 2 && P <= N, "sequence ", sequence_index, ": prompt length ", P, " outside 2..", N);
  MTP_REQUIRE(seq.hiddens.size() == static_cast<size_t>(N) * hidden, "sequence ", sequence_index, ": ",
              seq.hiddens.size(), " hidden values for ", N, " positions of ", hidden);
}

const bf16* hidden_row(const io::TraceSequence& s, int r, int hidden) {
  return s.hiddens.data() + static_cast<size_t>(r) * hidden;
}

// The step's record from the drafts of the position L: targets t_{L+1..L+k}, accepted prefix.
StepRecord record_of(const io::TraceSequence& seq, int32_t sequence, int L, int k,
                     std::span<const int32_t> drafts) {
  StepRecord rec;
  rec.sequence = sequence;
  rec.position = L;
  rec.drafts.assign(drafts.begin(), drafts.end());
  rec.targets.assign(seq.tokens.begin() + L + 1, seq.tokens.begin() + L + 1 + k);
  rec.accepted = accepted_prefix(rec.drafts, rec.targets);
  return rec;
}

// The chain tokens of position L: the trace's t_{L+1} .. t_{L+k-1}, appended to `out`.
void append_chain(const io::TraceSequence& seq, int L, int k, std::vector<int32_t>& out) {
  out.insert(out.end(), seq.tokens.begin() + L + 1, seq.tokens.begin() + L + k);
}

}  // namespace

std::vector<StepRecord> replay_teacher_forced(drafter::MtpDrafter& drafter, const io::TraceSequence& seq,
                                              int sequence_index, int k, int hidden,
                                              const ReplayHooks& hooks) {
  check_sequence(seq, sequence_index, hidden);
  const int N = static_cast<int>(seq.tokens.size());
  const int P = seq.prompt_length;
  auto st = drafter.new_sequence();
  drafter.append_rows(*st, seq.tokens.data() + 1, hidden_row(seq, 0, hidden), P - 1, 0,
                      drafter::Phase::prefill);
  if (hooks.after_prefill) hooks.after_prefill();
  std::vector<StepRecord> steps;
  std::vector<int32_t> chain;
  std::vector<drafter::DraftStats> stats;
  for (int L = P; L + k <= N - 1; ++L) {
    if (hooks.before_step) hooks.before_step();
    chain.clear();
    append_chain(seq, L, k, chain);
    drafter::ProposeExtras extras;
    extras.chain_tokens = chain;
    if (hooks.draft_stats) extras.stats = &stats;
    const std::vector<int32_t> drafts =
        drafter.propose(*st, seq.tokens[L], hidden_row(seq, L - 1, hidden), k, extras);
    StepRecord rec = record_of(seq, sequence_index, L, k, drafts);
    if (hooks.draft_stats) rec.stats = stats;
    // Keep only the true row L - 1, then catch up to it (nothing to do under draft_rows rewrite).
    drafter.after_verify(*st, 0);
    const int from = st->seq_len();
    const int n = L - from;
    MTP_REQUIRE(n >= 0, "sequence ", sequence_index, ": drafter holds ", from, " rows, more than the ", L,
                " verified");
    drafter.append_rows(*st, seq.tokens.data() + from + 1, hidden_row(seq, from, hidden), n, from,
                        drafter::Phase::catch_up);
    const bool go_on = !hooks.after_step || hooks.after_step(rec);
    steps.push_back(std::move(rec));
    if (!go_on) break;
  }
  return steps;
}

int64_t replay_teacher_forced_batched(drafter::MtpDrafter& drafter, std::span<const io::TraceSequence> seqs,
                                      int batch_size, int k, int hidden, const BatchReplayHooks& hooks) {
  MTP_REQUIRE(batch_size >= 1 && batch_size <= drafter::kMaxBatch, "batch_size ", batch_size, " outside 1..",
              drafter::kMaxBatch);
  for (const auto& s : seqs) check_sequence(s, static_cast<int>(s.index), hidden);
  const int slots = std::min<int>(batch_size, static_cast<int>(std::max<size_t>(seqs.size(), 1)));
  auto batch = drafter.new_batch(slots);
  struct Live {
    int seq = -1;  // index into seqs
    int L = 0;     // the next position
    int steps = 0;
  };
  std::vector<Live> live(static_cast<size_t>(slots));
  size_t next = 0;
  auto done = [&](const Live& l) {
    return l.L + k > static_cast<int>(seqs[static_cast<size_t>(l.seq)].tokens.size()) - 1;
  };
  // Fills free slots from the trace; a sequence too short for a position leaves at once.
  auto fill = [&]() {
    for (int s = 0; s < slots; ++s) {
      Live& l = live[static_cast<size_t>(s)];
      while (l.seq < 0 && next < seqs.size()) {
        const int si = static_cast<int>(next++);
        const io::TraceSequence& seq = seqs[static_cast<size_t>(si)];
        const int slot = drafter.new_sequence(*batch);
        MTP_REQUIRE(slot == s, "replay: the drafter gave slot ", slot, " where slot ", s, " was free");
        drafter.append_rows(*batch, slot, seq.tokens.data() + 1, hidden_row(seq, 0, hidden),
                            seq.prompt_length - 1, 0, drafter::Phase::prefill);
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
  std::vector<int32_t> chain;
  std::vector<drafter::DraftStats> stats;
  for (;;) {
    rows.clear();
    row_slot.clear();
    chain.clear();
    for (int s = 0; s < slots; ++s) {
      const Live& l = live[static_cast<size_t>(s)];
      if (l.seq < 0) continue;
      const io::TraceSequence& seq = seqs[static_cast<size_t>(l.seq)];
      rows.push_back(
          drafter::BatchRow{s, seq.tokens[static_cast<size_t>(l.L)], hidden_row(seq, l.L - 1, hidden)});
      row_slot.push_back(s);
      append_chain(seq, l.L, k, chain);
    }
    if (rows.empty()) break;
    if (hooks.before_step) hooks.before_step();
    drafter::ProposeExtras extras;
    extras.chain_tokens = chain;
    if (hooks.draft_stats) extras.stats = &stats;
    const std::vector<int32_t> drafts = drafter.propose_batch(*batch, rows, k, extras);
    std::vector<StepRecord> recs;
    recs.reserve(rows.size());
    for (size_t b = 0; b < rows.size(); ++b) {
      const int s = row_slot[b];
      Live& l = live[static_cast<size_t>(s)];
      const io::TraceSequence& seq = seqs[static_cast<size_t>(l.seq)];
      const auto at = static_cast<std::ptrdiff_t>(b * static_cast<size_t>(k));
      recs.push_back(record_of(
          seq, static_cast<int32_t>(seq.index), l.L, k,
          std::span<const int32_t>(drafts).subspan(static_cast<size_t>(at), static_cast<size_t>(k))));
      StepRecord& rec = recs.back();
      rec.batch_rows = static_cast<int32_t>(rows.size());
      if (hooks.draft_stats) rec.stats.assign(stats.begin() + at, stats.begin() + at + k);
      drafter.after_verify(*batch, s, 0);
      const int from = batch->seq_len(s);
      const int n = l.L - from;
      MTP_REQUIRE(n >= 0, "sequence ", seq.index, ": drafter holds ", from, " rows, more than the ", l.L,
                  " verified");
      drafter.append_rows(*batch, s, seq.tokens.data() + from + 1, hidden_row(seq, from, hidden), n, from,
                          drafter::Phase::catch_up);
      ++l.L;
      ++l.steps;
    }
    ++batched_steps;
    const bool go_on = !hooks.after_step || hooks.after_step(recs);
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

std::vector<double> depth_hit_rates(std::span<const int32_t> drafts, std::span<const int32_t> targets, int k,
                                    std::span<const uint8_t> rows) {
  MTP_REQUIRE(k >= 1 && drafts.size() == targets.size() && drafts.size() % static_cast<size_t>(k) == 0,
              "depth_hit_rates: ", drafts.size(), " drafts and ", targets.size(), " targets of k = ", k);
  const size_t n = drafts.size() / static_cast<size_t>(k);
  MTP_REQUIRE(rows.empty() || rows.size() == n, "depth_hit_rates: ", rows.size(), " row flags for ", n,
              " steps");
  std::vector<int64_t> hits(static_cast<size_t>(k), 0);
  int64_t counted = 0;
  for (size_t r = 0; r < n; ++r) {
    if (!rows.empty() && !rows[r]) continue;
    ++counted;
    for (size_t j = 0; j < static_cast<size_t>(k); ++j)
      hits[j] += drafts[r * static_cast<size_t>(k) + j] == targets[r * static_cast<size_t>(k) + j];
  }
  if (counted == 0) return {};
  std::vector<double> out(static_cast<size_t>(k));
  for (size_t j = 0; j < out.size(); ++j)
    out[j] = static_cast<double>(hits[j]) / static_cast<double>(counted);
  return out;
}

}  // namespace mtplab::harness
