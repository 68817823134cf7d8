// The batched-against-single check of the sampling statistics (test_draft_stats and its 2-rank
// twin): each sequence forced along its true continuation at its own position, drafted alone and
// as one row of a batched step, whose drafts and DraftStats must be the same bits.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/numeric.hpp"
#include "drafter/drafter.hpp"
#include "io/trace.hpp"

namespace mtplab::test {

/// The rows of a forced batched step and what each row drafted alone.
struct ForcedRows {
  std::vector<drafter::BatchRow> rows;
  std::vector<int32_t> chain, requested;          ///< [rows, k - 1] and [rows, k]: row b's extras
  std::vector<int32_t> single_drafts;             ///< [rows, k]
  std::vector<drafter::DraftStats> single_stats;  ///< [rows, k]
  std::vector<bf16> single_ys;                    ///< [rows, k, H] head inputs (with keep_head_inputs)
};

/// Sequence s of `trace` at position lens[s] (s < lens.size()): a slot of `batch` prefilled up to
/// it (row s of the batched step), and a sequence of its own drafted alone under `t`, its chain
/// tokens its true continuation t_{L+1} .. t_{L+k-1}, its requested tokens t_{L+1} .. t_{L+k}.
inline ForcedRows forced_rows(drafter::MtpDrafter& d, drafter::BatchState& batch,
                              const std::vector<io::TraceSequence>& trace, std::span<const int> lens, int k,
                              int H, const drafter::SamplingTransform& t, bool keep_ys) {
  ForcedRows f;
  for (size_t s = 0; s < lens.size(); ++s) {
    const io::TraceSequence& q = trace[s];
    const int L = lens[s];
    const int slot = d.new_sequence(batch);
    d.append_rows(batch, slot, q.tokens.data() + 1, q.hiddens.data(), L - 1, 0);
    f.rows.push_back(
        {slot, q.tokens[static_cast<size_t>(L)], q.hiddens.data() + static_cast<size_t>(L - 1) * H});
    std::vector<int32_t> c(q.tokens.begin() + L + 1, q.tokens.begin() + L + k);
    std::vector<int32_t> r(q.tokens.begin() + L + 1, q.tokens.begin() + L + 1 + k);
    f.chain.insert(f.chain.end(), c.begin(), c.end());
    f.requested.insert(f.requested.end(), r.begin(), r.end());
    auto st = d.new_sequence();
    d.append_rows(*st, q.tokens.data() + 1, q.hiddens.data(), L - 1, 0);
    std::vector<drafter::DraftStats> stats;
    drafter::ProposeExtras x;
    x.chain_tokens = c;
    x.requested = r;
    x.transform = t;
    x.stats = &stats;
    const auto drafts = d.propose(*st, f.rows.back().token, f.rows.back().hidden, k, x);
    f.single_drafts.insert(f.single_drafts.end(), drafts.begin(), drafts.end());
    f.single_stats.insert(f.single_stats.end(), stats.begin(), stats.end());
    if (keep_ys) {
      const auto ys = d.head_inputs();
      f.single_ys.insert(f.single_ys.end(), ys.begin(), ys.end());
    }
  }
  return f;
}

/// The batched step of `f`'s rows with their extras under `t`; `stats` gets its DraftStats.
inline std::vector<int32_t> propose_forced(drafter::MtpDrafter& d, drafter::BatchState& batch,
                                           const ForcedRows& f, int k, const drafter::SamplingTransform& t,
                                           std::vector<drafter::DraftStats>& stats) {
  drafter::ProposeExtras x;
  x.chain_tokens = f.chain;
  x.requested = f.requested;
  x.transform = t;
  x.stats = &stats;
  return d.propose_batch(batch, f.rows, k, x);
}

/// Expects `a` and `b` to be the same bits (margin, logprob, req_logprob).
inline void expect_same_bits(const drafter::DraftStats& a, const drafter::DraftStats& b,
                             const std::string& what) {
  EXPECT_EQ(float_to_bits(a.margin), float_to_bits(b.margin)) << what;
  EXPECT_EQ(float_to_bits(a.logprob), float_to_bits(b.logprob)) << what;
  EXPECT_EQ(float_to_bits(a.req_logprob), float_to_bits(b.req_logprob)) << what;
}

}  // namespace mtplab::test
