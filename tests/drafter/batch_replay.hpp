// Scripted replays for the batched-drafting tests: the same sequences through the single-sequence
// drafter one at a time, and through propose_batch with continuous batching (a finished
// sequence's slot takes the next one), with the same accepted counts per (sequence, step).
//
// The accepted counts come from a script, not from comparing drafts with the trace: random
// synthetic weights accept almost nothing, and the point is that sequences advance by different
// amounts, so one batch holds rows at positions that diverge step by step. The catch-up rows
// still come from the trace's true hiddens, as in harness/replay.hpp.
#pragma once
#include <algorithm>
#include <deque>
#include <functional>
#include <optional>
#include <vector>

#include "core/str.hpp"
#include "drafter/drafter.hpp"
#include "drafter/options.hpp"
#include "io/trace.hpp"
#include "model/sharding.hpp"

namespace mtplab::test {

/// A case of the multi-rank batch tests: the head's sharding, its exchange and the context rows.
struct ShardCase {
  model::HeadSharding sharding;
  drafter::Exchange exchange;
  drafter::ContextRows context = drafter::ContextRows::cache_only;
};

inline std::string name_of(const ShardCase& c) {
  return str(model::to_string(c.sharding), "/", drafter::to_string(c.exchange), "/",
             drafter::to_string(c.context));
}

/// Prompt lengths for `count` sequences that spread over lo .. lo + span - 1: sequence s gets
/// lo + (s * step) % span.
inline std::vector<int> spread_prompts(size_t count, int lo, size_t step, size_t span) {
  std::vector<int> p(count);
  for (size_t s = 0; s < count; ++s) p[s] = lo + static_cast<int>((s * step) % span);
  return p;
}

/// The accepted count of step `step` of sequence `seq` (0 .. k), varied over both.
inline int scripted_accepted(int seq, int step, int k) {
  return (seq * 7 + step * 3 + seq * step + 1) % (k + 1);
}

/// Every step's drafts of every sequence, in order: drafts[s] = step 0's k drafts, step 1's, ...
using SequenceDrafts = std::vector<std::vector<int32_t>>;

/// One sequence's replay position.
struct ReplayCursor {
  int seq = 0;
  int L = 0;
  int step = 0;
};

inline const bf16* hidden_row(const io::TraceSequence& t, int r, int H) {
  return t.hiddens.data() + static_cast<size_t>(r) * H;
}

/// The single-sequence drafter on sequence `t` (sequence s of the script) alone from prompt length
/// P; `after_propose(drafts)` after every propose, before its verification.
inline void replay_scripted(drafter::MtpDrafter& d, const io::TraceSequence& t, size_t s, int P, int k, int H,
                            const std::function<void(const std::vector<int32_t>& drafts)>& after_propose) {
  const int N = static_cast<int>(t.tokens.size());
  auto st = d.new_sequence();
  d.append_rows(*st, t.tokens.data() + 1, hidden_row(t, 0, H), P - 1, 0);
  for (int L = P, step = 0; L + k <= N - 1; ++step) {
    after_propose(d.propose(*st, t.tokens[static_cast<size_t>(L)], hidden_row(t, L - 1, H), k));
    const int a = scripted_accepted(static_cast<int>(s), step, k);
    d.after_verify(*st, a);
    const int next_L = L + a + 1;
    const int from = st->seq_len(0);
    d.append_rows(*st, t.tokens.data() + from + 1, hidden_row(t, from, H), next_L - 1 - from, from,
                  drafter::Phase::catch_up);
    L = next_L;
  }
}

/// The single-sequence drafter on each sequence alone; prompts[s] is sequence s's prompt length.
inline SequenceDrafts replay_single(drafter::MtpDrafter& d, const std::vector<io::TraceSequence>& trace,
                                    const std::vector<int>& prompts, int k, int H) {
  SequenceDrafts out(trace.size());
  for (size_t s = 0; s < trace.size(); ++s)
    replay_scripted(d, trace[s], s, prompts[s], k, H, [&](const std::vector<int32_t>& drafts) {
      out[s].insert(out[s].end(), drafts.begin(), drafts.end());
    });
  return out;
}

struct BatchedReplay {
  SequenceDrafts drafts;
  int batched_steps = 0;  ///< propose_batch calls
  int max_rows = 0;       ///< the largest batch drafted
  int slot_reuses = 0;    ///< sequences that took a slot another sequence had released
};

/// The same sequences through propose_batch with `slots` slots: each step drafts for every live
/// sequence at once (rows in an order that changes from step to step), then each verifies, rolls
/// back and catches up on its own; a finished sequence releases its slot and the next sequence
/// takes it. `before_step` / `after_step` (either may be empty) run right before and right after
/// each propose_batch, with its row count.
inline BatchedReplay replay_batched(drafter::MtpDrafter& d, const std::vector<io::TraceSequence>& trace,
                                    const std::vector<int>& prompts, int k, int H, int slots,
                                    std::optional<drafter::BatchPadding> padding = std::nullopt,
                                    const std::function<void(int)>& before_step = {},
                                    const std::function<void(int)>& after_step = {}) {
  BatchedReplay out;
  out.drafts.resize(trace.size());
  auto batch = d.new_batch(slots, padding);
  std::vector<std::optional<ReplayCursor>> live(static_cast<size_t>(slots));
  std::vector<uint8_t> used(static_cast<size_t>(slots), 0);
  std::deque<int> pending;
  for (size_t s = 0; s < trace.size(); ++s) pending.push_back(static_cast<int>(s));
  auto steps_left = [&](const ReplayCursor& c) {
    return c.L + k <= static_cast<int>(trace[static_cast<size_t>(c.seq)].tokens.size()) - 1;
  };
  auto admit = [&] {
    while (!pending.empty() && batch->live_count() < batch->slots()) {
      const int s = pending.front();
      pending.pop_front();
      const int slot = d.new_sequence(*batch);
      if (used[static_cast<size_t>(slot)]) ++out.slot_reuses;
      used[static_cast<size_t>(slot)] = 1;
      const io::TraceSequence& t = trace[static_cast<size_t>(s)];
      const int P = prompts[static_cast<size_t>(s)];
      d.append_rows(*batch, slot, t.tokens.data() + 1, hidden_row(t, 0, H), P - 1, 0);
      const ReplayCursor c{s, P, 0};
      if (steps_left(c)) {
        live[static_cast<size_t>(slot)] = c;
      } else {
        d.release(*batch, slot);
      }
    }
  };
  admit();
  for (int round = 0;; ++round) {
    std::vector<int> order;
    for (int slot = 0; slot < slots; ++slot)
      if (live[static_cast<size_t>(slot)]) order.push_back(slot);
    if (order.empty()) break;
    if (round % 2) std::reverse(order.begin(), order.end());
    if (round % 3 == 2)
      std::rotate(order.begin(), order.begin() + static_cast<ptrdiff_t>(order.size() / 2), order.end());
    std::vector<drafter::BatchRow> rows;
    for (int slot : order) {
      const ReplayCursor& c = *live[static_cast<size_t>(slot)];
      const io::TraceSequence& t = trace[static_cast<size_t>(c.seq)];
      rows.push_back({slot, t.tokens[static_cast<size_t>(c.L)], hidden_row(t, c.L - 1, H)});
    }
    if (before_step) before_step(static_cast<int>(rows.size()));
    const auto drafts = d.propose_batch(*batch, rows, k);
    if (after_step) after_step(static_cast<int>(rows.size()));
    ++out.batched_steps;
    out.max_rows = std::max(out.max_rows, static_cast<int>(rows.size()));
    for (size_t b = 0; b < rows.size(); ++b) {
      const int slot = rows[b].slot;
      ReplayCursor& c = *live[static_cast<size_t>(slot)];
      const io::TraceSequence& t = trace[static_cast<size_t>(c.seq)];
      auto& mine = out.drafts[static_cast<size_t>(c.seq)];
      mine.insert(mine.end(), drafts.begin() + static_cast<ptrdiff_t>(b * k),
                  drafts.begin() + static_cast<ptrdiff_t>((b + 1) * k));
      const int a = scripted_accepted(c.seq, c.step, k);
      d.after_verify(*batch, slot, a);
      const int next_L = c.L + a + 1;
      const int from = batch->seq_len(slot);
      d.append_rows(*batch, slot, t.tokens.data() + from + 1, hidden_row(t, from, H), next_L - 1 - from, from,
                    drafter::Phase::catch_up);
      c.L = next_L;
      ++c.step;
      if (!steps_left(c)) {
        d.release(*batch, slot);
        live[static_cast<size_t>(slot)].reset();
      }
    }
    admit();
  }
  return out;
}

}  // namespace mtplab::test
