#include "harness/replay.hpp"

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

std::vector<StepRecord> replay_sequence(drafter::MtpDrafter& drafter, const io::TraceSequence& seq,
                                        int sequence_index, int k, int hidden, AcceptanceStats& stats,
                                        const ReplayHooks& hooks) {
  const int N = static_cast<int>(seq.tokens.size());
  const int P = seq.prompt_length;
  MTP_REQUIRE(P >= 2 && P <= N, "sequence ", sequence_index, ": prompt length ", P, " outside 2..", N);
  MTP_REQUIRE(seq.hiddens.size() == static_cast<size_t>(N) * hidden, "sequence ", sequence_index, ": ",
              seq.hiddens.size(), " hidden values for ", N, " positions of ", hidden);
  auto hidden_row = [&](int r) { return seq.hiddens.data() + static_cast<size_t>(r) * hidden; };
  auto st = drafter.new_sequence();
  drafter.append_rows(*st, seq.tokens.data() + 1, hidden_row(0), P - 1, 0, drafter::Phase::prefill);
  std::vector<StepRecord> steps;
  int L = P;
  while (L + k <= N - 1) {
    if (hooks.before_step) hooks.before_step();
    StepRecord rec;
    rec.sequence = sequence_index;
    rec.position = L;
    rec.drafts = drafter.propose(*st, seq.tokens[L], hidden_row(L - 1), k);
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

}  // namespace mtplab::harness
