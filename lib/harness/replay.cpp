#include "harness/replay.hpp"

#include <cmath>
#include <deque>
#include <limits>

#include "core/error.hpp"
#include "core/hash.hpp"

namespace mtplab::harness {

void AcceptanceStats::add(int k, int a, double expected) {
  if (static_cast<int>(at_least.size()) < k) at_least.resize(k, 0);
  ++steps;
  drafted += k;
  accepted += a;
  expected_accepted += expected;
  for (int i = 0; i < a; ++i) ++at_least[i];
}

double StepRecord::expected_accepted() const {
  double sum = 0, prod = 1;
  for (const float a : accept_prob) {
    prod *= a;
    sum += prod;
  }
  return sum;
}

double verify_uniform(int64_t seed, int64_t sequence, int64_t position) {
  return counter_uniform(0x6d74706c61622d76ull, seed, sequence, position);  // "mtplab-v"
}

SamplingVerify sampling_verify(const ReplayOptions& r) {
  SamplingVerify v;
  v.proposal = r.draft_proposal;
  v.transform.temperature = r.temperature;
  v.transform.top_k = r.top_k;
  v.transform.top_p = r.top_p;
  v.seed = r.sampling_seed;
  return v;
}

float accept_probability(DraftProposal proposal, int32_t draft, int32_t target, float draft_logprob,
                         float target_logprob) {
  if (proposal == DraftProposal::greedy) return draft == target ? 1.0f : 0.0f;
  if (std::isinf(draft_logprob) && draft_logprob < 0) return 0.0f;  // the trace token is outside q's support
  const double ratio = std::exp(static_cast<double>(draft_logprob) - static_cast<double>(target_logprob));
  return static_cast<float>(std::min(1.0, ratio));
}

std::vector<std::vector<float>> trace_target_logprobs(drafter::MtpDrafter& drafter,
                                                      std::span<const io::TraceSequence> seqs,
                                                      const drafter::SamplingTransform& transform,
                                                      const std::string& trace_name) {
  std::vector<std::vector<float>> out;
  out.reserve(seqs.size());
  for (const io::TraceSequence& seq : seqs) {
    const int N = static_cast<int>(seq.length());
    const int P = seq.prompt_length;
    std::vector<float> logp(static_cast<size_t>(N), std::numeric_limits<float>::quiet_NaN());
    if (N > P) {
      // Token t was chosen from hidden t - 1: rows t = P .. N - 1.
      const std::vector<float> got = drafter.target_logprobs(
          seq.hiddens.data() + static_cast<size_t>(P - 1) * static_cast<size_t>(seq.hidden),
          seq.tokens.data() + P, N - P, transform);
      MTP_REQUIRE(got.size() == static_cast<size_t>(N - P), "target_logprobs returned ", got.size(),
                  " values for ", N - P, " rows");
      for (int t = P; t < N; ++t) {
        const float lp = got[static_cast<size_t>(t - P)];
        MTP_REQUIRE(
            std::isfinite(lp), trace_name, ": sequence ", seq.index, ", position ", t, ": token ",
            seq.tokens[static_cast<size_t>(t)], " has log p = ", lp,
            " under the target's distribution at temperature ", transform.temperature, ", top_k ",
            transform.top_k, ", top_p ", transform.top_p,
            ": it is outside the truncated support, so the trace was not sampled with these settings");
        logp[static_cast<size_t>(t)] = lp;
      }
    }
    out.push_back(std::move(logp));
  }
  return out;
}

void check_trace_sampling(const ReplayOptions& r, const io::TraceSampling& trace,
                          const std::string& trace_name) {
  if (r.verify != Verify::sampling) return;
  const std::string point = str("temperature ", r.temperature, ", top_k ", r.top_k, ", top_p ", r.top_p);
  MTP_REQUIRE(trace.sampled, trace_name, ": verify: sampling (", point,
              ") needs a trace sampled with the same settings; this trace's continuations are greedy "
              "(verify: greedy replays it)");
  auto same = [](double a, double b) { return std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b)); };
  MTP_REQUIRE(same(trace.temperature, r.temperature) && trace.top_k == r.top_k && same(trace.top_p, r.top_p),
              trace_name, ": verify: sampling at ", point,
              " needs a trace sampled with the same settings; this "
              "trace was sampled at temperature ",
              trace.temperature, ", top_k ", trace.top_k, ", top_p ", trace.top_p,
              " (the acceptance rule is exact only for the distribution the trace was drawn from)");
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

void check_target_logprob(const io::TraceSequence& seq, std::span<const float> logp) {
  MTP_REQUIRE(logp.size() == seq.tokens.size(), "sequence ", seq.index, ": ", logp.size(),
              " target log-probabilities for ", seq.tokens.size(), " positions");
}

// The trace tokens a sampling step at L forces and asks about: chain [k - 1] = t_{L+1}..t_{L+k-1}
// (the input tokens of drafts 2..k), requested [k] = t_{L+1}..t_{L+k}.
void forced_tokens(const io::TraceSequence& seq, int L, int k, std::vector<int32_t>& chain,
                   std::vector<int32_t>& requested) {
  const auto first = seq.tokens.begin() + L + 1;
  chain.insert(chain.end(), first, first + (k - 1));
  requested.insert(requested.end(), first, first + k);
}

// Verification of one row whose drafts and targets are in `rec`: accept_prob and accepted.
// `stats` [k] are the row's DraftStats (sampling), `logp` the sequence's target log-probabilities.
void verify_row(StepRecord& rec, const SamplingVerify* sampling, const drafter::DraftStats* stats,
                std::span<const float> logp) {
  const int k = static_cast<int>(rec.drafts.size());
  rec.accept_prob.assign(static_cast<size_t>(k), 0.0f);
  if (!sampling) {
    rec.accepted = accepted_prefix(rec.drafts, rec.targets);
    for (int i = 0; i < k; ++i) rec.accept_prob[i] = rec.drafts[i] == rec.targets[i] ? 1.0f : 0.0f;
    return;
  }
  for (int i = 0; i < k; ++i) {
    const int t = rec.position + 1 + i;  // the trace position of targets[i]
    rec.accept_prob[i] = accept_probability(sampling->proposal, rec.drafts[i], rec.targets[i],
                                            stats[i].req_logprob, logp[static_cast<size_t>(t)]);
  }
  rec.accepted = 0;
  while (rec.accepted < k && verify_uniform(sampling->seed, rec.sequence, rec.position + 1 + rec.accepted) <
                                 static_cast<double>(rec.accept_prob[static_cast<size_t>(rec.accepted)]))
    ++rec.accepted;
}
}  // namespace

std::vector<StepRecord> replay_sequence(drafter::MtpDrafter& drafter, const io::TraceSequence& seq,
                                        int sequence_index, int k, int hidden, AcceptanceStats& stats,
                                        const ReplayHooks& hooks, const SamplingVerify* sampling,
                                        std::span<const float> target_logprob) {
  check_sequence(seq, sequence_index, hidden);
  if (sampling) check_target_logprob(seq, target_logprob);
  std::vector<int32_t> chain, requested;
  std::vector<drafter::DraftStats> draft_stats;
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
    if (sampling) {
      chain.clear();
      requested.clear();
      forced_tokens(seq, L, k, chain, requested);
      drafter::ProposeExtras extras;
      extras.chain_tokens = chain;
      extras.requested = requested;
      extras.transform = sampling->transform;
      extras.stats = &draft_stats;
      rec.drafts = drafter.propose(*st, seq.tokens[L], hidden_row(L - 1), k, extras);
      MTP_REQUIRE(draft_stats.size() == static_cast<size_t>(k), "replay: the drafter reported ",
                  draft_stats.size(), " draft stats for ", k, " drafts");
    } else {
      drafter::ProposeExtras extras;  // the head's figures only when the point records them
      if (hooks.draft_stats) extras.stats = &draft_stats;
      rec.drafts = drafter.propose(*st, seq.tokens[L], hidden_row(L - 1), k, extras);
    }
    if (hooks.draft_stats) rec.stats = draft_stats;
    rec.targets.assign(seq.tokens.begin() + L + 1, seq.tokens.begin() + L + 1 + k);
    verify_row(rec, sampling, draft_stats.data(), target_logprob);
    drafter.after_verify(*st, rec.accepted);
    const int next_L = L + rec.accepted + 1;
    const int from = st->seq_len();
    const int n = next_L - 1 - from;
    MTP_REQUIRE(n >= 0, "sequence ", sequence_index, ": drafter holds ", from, " rows, more than the ",
                next_L - 1, " verified");
    drafter.append_rows(*st, seq.tokens.data() + from + 1, hidden_row(from), n, from,
                        drafter::Phase::catch_up);
    stats.add(k, rec.accepted, rec.expected_accepted());
    const bool go_on = !hooks.after_step || hooks.after_step(rec);
    steps.push_back(std::move(rec));
    L = next_L;
    if (!go_on) break;
  }
  return steps;
}

int64_t replay_batched(drafter::MtpDrafter& drafter, std::span<const io::TraceSequence> seqs, int batch_size,
                       int k, int hidden, const BatchReplayHooks& hooks, const SamplingVerify* sampling,
                       std::span<const std::vector<float>> target_logprob) {
  MTP_REQUIRE(batch_size >= 1 && batch_size <= drafter::kMaxBatch, "batch_size ", batch_size, " outside 1..",
              drafter::kMaxBatch);
  for (size_t i = 0; i < seqs.size(); ++i) check_sequence(seqs[i], static_cast<int>(seqs[i].index), hidden);
  if (sampling) {
    MTP_REQUIRE(target_logprob.size() == seqs.size(), "replay: ", target_logprob.size(),
                " target log-probability rows for ", seqs.size(), " sequences");
    for (size_t i = 0; i < seqs.size(); ++i) check_target_logprob(seqs[i], target_logprob[i]);
  }
  std::vector<int32_t> chain, requested;
  std::vector<drafter::DraftStats> draft_stats;
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
    chain.clear();
    requested.clear();
    for (int s = 0; s < slots; ++s) {
      const Live& l = live[static_cast<size_t>(s)];
      if (l.seq < 0) continue;
      const io::TraceSequence& seq = seqs[static_cast<size_t>(l.seq)];
      rows.push_back(drafter::BatchRow{s, seq.tokens[static_cast<size_t>(l.L)], hidden_row(seq, l.L - 1)});
      row_slot.push_back(s);
      if (sampling) forced_tokens(seq, l.L, k, chain, requested);
    }
    if (rows.empty()) break;
    if (hooks.before_step) hooks.before_step();
    std::vector<int32_t> drafts;
    if (sampling) {
      drafter::ProposeExtras extras;
      extras.chain_tokens = chain;
      extras.requested = requested;
      extras.transform = sampling->transform;
      extras.stats = &draft_stats;
      drafts = drafter.propose_batch(*batch, rows, k, extras);
      MTP_REQUIRE(draft_stats.size() == rows.size() * static_cast<size_t>(k), "replay: the drafter reported ",
                  draft_stats.size(), " draft stats for ", rows.size(), " x ", k, " drafts");
    } else {
      drafter::ProposeExtras extras;  // the head's figures only when the point records them
      if (hooks.draft_stats) extras.stats = &draft_stats;
      drafts = drafter.propose_batch(*batch, rows, k, extras);
    }
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
        rec.stats.assign(draft_stats.begin() + static_cast<std::ptrdiff_t>(b * k),
                         draft_stats.begin() + static_cast<std::ptrdiff_t>((b + 1) * k));
      verify_row(rec, sampling, sampling ? draft_stats.data() + b * static_cast<size_t>(k) : nullptr,
                 sampling ? std::span<const float>(target_logprob[static_cast<size_t>(l.seq)])
                          : std::span<const float>());
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
