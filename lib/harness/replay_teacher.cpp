// Teacher-forced replay (replay_teacher.hpp): every position, the chain fed the trace's tokens.
#include "harness/replay_teacher.hpp"

#include <algorithm>
#include <optional>

#include "core/error.hpp"
#include "harness/replay_steps.hpp"

namespace mtplab::harness {
namespace {

// The chain tokens of position L: the trace's t_{L+1} .. t_{L+k-1}, appended to `out`.
void append_chain(const io::TraceSequence& seq, int L, int k, std::vector<int32_t>& out) {
  out.insert(out.end(), seq.tokens.begin() + L + 1, seq.tokens.begin() + L + k);
}

}  // namespace

// One sequence is the batched loop at batch 1.
std::vector<StepRecord> replay_teacher_forced(drafter::MtpDrafter& drafter, const io::TraceSequence& seq,
                                              int sequence_index, int k, int hidden,
                                              const ReplayHooks& hooks) {
  detail::check_sequence(seq, sequence_index, hidden);
  std::optional<io::TraceSequence> copy;
  const io::TraceSequence& one = detail::indexed(seq, sequence_index, copy);
  std::vector<StepRecord> steps;
  const BatchReplayHooks batch_hooks = detail::one_sequence_hooks(hooks, k, steps, nullptr);
  replay_teacher_forced_batched(drafter, std::span<const io::TraceSequence>(&one, 1), 1, k, hidden,
                                batch_hooks);
  return steps;
}

// Every position keeps none of its drafts (advance(0)): only the true row L - 1 stays, then the
// catch-up to it (nothing to do under draft_rows rewrite), and the next position is L + 1.
int64_t replay_teacher_forced_batched(drafter::MtpDrafter& drafter, std::span<const io::TraceSequence> seqs,
                                      int batch_size, int k, int hidden, const BatchReplayHooks& hooks) {
  detail::check_batch(seqs, batch_size, hidden);
  std::vector<int32_t> chain;
  std::vector<drafter::DraftStats> stats;
  detail::ContinuousBatch cb(drafter, seqs, batch_size, k, hidden, hooks);
  while (cb.gather()) {
    const auto& rows = cb.rows();
    chain.clear();
    for (const auto& row : rows) append_chain(seqs[static_cast<size_t>(row.seq)], row.L, k, chain);
    cb.begin_step();
    drafter::ProposeExtras extras;
    extras.chain_tokens = chain;
    if (hooks.draft_stats) extras.stats = &stats;
    const std::vector<int32_t> drafts = drafter.propose_batch(cb.batch(), cb.inputs(), k, extras);
    std::vector<StepRecord> recs;
    recs.reserve(rows.size());
    for (size_t b = 0; b < rows.size(); ++b) {
      const io::TraceSequence& seq = seqs[static_cast<size_t>(rows[b].seq)];
      const auto at = static_cast<std::ptrdiff_t>(b * static_cast<size_t>(k));
      recs.push_back(detail::step_record(
          seq, static_cast<int32_t>(seq.index), rows[b].L, k,
          std::span<const int32_t>(drafts).subspan(static_cast<size_t>(at), static_cast<size_t>(k))));
      StepRecord& rec = recs.back();
      rec.accepted = accepted_prefix(rec.drafts, rec.targets);
      rec.batch_rows = static_cast<int32_t>(rows.size());
      if (hooks.draft_stats) rec.stats.assign(stats.begin() + at, stats.begin() + at + k);
      cb.advance(b, 0);
    }
    if (!cb.finish(recs)) break;
  }
  return cb.steps();
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
