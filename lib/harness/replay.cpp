#include "harness/replay.hpp"

#include <cmath>
#include <deque>
#include <limits>
#include <optional>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "harness/replay_steps.hpp"

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
  const std::string point = message("temperature ", r.temperature, ", top_k ", r.top_k, ", top_p ", r.top_p);
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

// One sequence is the batched loop at batch 1: the same steps, verification and records.
std::vector<StepRecord> replay_sequence(drafter::MtpDrafter& drafter, const io::TraceSequence& seq,
                                        int sequence_index, int k, int hidden, AcceptanceStats& stats,
                                        const ReplayHooks& hooks, const SamplingVerify* sampling,
                                        std::span<const float> target_logprob) {
  detail::check_sequence(seq, sequence_index, hidden);
  if (sampling) check_target_logprob(seq, target_logprob);
  std::optional<io::TraceSequence> copy;
  const io::TraceSequence& one = detail::indexed(seq, sequence_index, copy);
  std::vector<std::vector<float>> logp;
  if (sampling) logp.emplace_back(target_logprob.begin(), target_logprob.end());
  std::vector<StepRecord> steps;
  const BatchReplayHooks batch_hooks = detail::one_sequence_hooks(hooks, k, steps, &stats);
  replay_batched(drafter, std::span<const io::TraceSequence>(&one, 1), 1, k, hidden, batch_hooks, sampling,
                 logp);
  return steps;
}

int64_t replay_batched(drafter::MtpDrafter& drafter, std::span<const io::TraceSequence> seqs, int batch_size,
                       int k, int hidden, const BatchReplayHooks& hooks, const SamplingVerify* sampling,
                       std::span<const std::vector<float>> target_logprob) {
  detail::check_batch(seqs, batch_size, hidden);
  if (sampling) {
    MTP_REQUIRE(target_logprob.size() == seqs.size(), "replay: ", target_logprob.size(),
                " target log-probability rows for ", seqs.size(), " sequences");
    for (size_t i = 0; i < seqs.size(); ++i) check_target_logprob(seqs[i], target_logprob[i]);
  }
  std::vector<int32_t> chain, requested;
  std::vector<drafter::DraftStats> draft_stats;
  detail::ContinuousBatch cb(drafter, seqs, batch_size, k, hidden, hooks);
  while (cb.gather()) {
    const auto& rows = cb.rows();
    chain.clear();
    requested.clear();
    if (sampling)
      for (const auto& row : rows)
        forced_tokens(seqs[static_cast<size_t>(row.seq)], row.L, k, chain, requested);
    cb.begin_step();
    std::vector<int32_t> drafts;
    if (sampling) {
      drafter::ProposeExtras extras;
      extras.chain_tokens = chain;
      extras.requested = requested;
      extras.transform = sampling->transform;
      extras.stats = &draft_stats;
      drafts = drafter.propose_batch(cb.batch(), cb.inputs(), k, extras);
      MTP_REQUIRE(draft_stats.size() == rows.size() * static_cast<size_t>(k), "replay: the drafter reported ",
                  draft_stats.size(), " draft stats for ", rows.size(), " x ", k, " drafts");
    } else {
      drafter::ProposeExtras extras;  // the head's figures only when the point records them
      if (hooks.draft_stats) extras.stats = &draft_stats;
      drafts = drafter.propose_batch(cb.batch(), cb.inputs(), k, extras);
    }
    std::vector<StepRecord> recs;
    recs.reserve(rows.size());
    for (size_t b = 0; b < rows.size(); ++b) {
      const io::TraceSequence& seq = seqs[static_cast<size_t>(rows[b].seq)];
      const size_t at = b * static_cast<size_t>(k);
      recs.push_back(
          detail::step_record(seq, static_cast<int32_t>(seq.index), rows[b].L, k,
                              std::span<const int32_t>(drafts).subspan(at, static_cast<size_t>(k))));
      StepRecord& rec = recs.back();
      rec.batch_rows = static_cast<int32_t>(rows.size());
      if (hooks.draft_stats)
        rec.stats.assign(draft_stats.begin() + static_cast<std::ptrdiff_t>(at),
                         draft_stats.begin() + static_cast<std::ptrdiff_t>(at + static_cast<size_t>(k)));
      verify_row(rec, sampling, sampling ? draft_stats.data() + at : nullptr,
                 sampling ? std::span<const float>(target_logprob[static_cast<size_t>(rows[b].seq)])
                          : std::span<const float>());
      cb.advance(b, rec.accepted);
    }
    if (!cb.finish(recs)) break;
  }
  return cb.steps();
}

}  // namespace mtplab::harness
