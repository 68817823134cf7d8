// Hand-built harness::PointResult rows for the results tests, filled as the step recorder fills
// them: a step's bookkeeping columns and the point's sequence table.
#pragma once
#include <cstdint>

#include "harness/results.hpp"

namespace mtplab::test {

/// One step's bookkeeping: its own batch step of one row that touched `experts` experts, measured
/// (not warm-up), every timing column `ms`, and zero block / head / exchange times for its k drafts.
inline void add_step_bookkeeping(harness::PointResult& r, int k, int experts, double ms) {
  r.batch_step.push_back(static_cast<int32_t>(r.batch_step.size()));
  r.batch_rows.push_back(1);
  r.batch_experts.push_back(experts);
  r.warmup.push_back(0);
  for (auto& col : r.timing) col.push_back(ms);
  for (int j = 0; j < k; ++j) {
    r.block_ms.push_back(0);
    r.head_ms.push_back(0);
    r.exchange_ms.push_back(0);
  }
}

/// Sequences 0 and 1 of the point, each with prompt_len prompt rows, `length` rows in all, `steps`
/// steps and no prefill time.
inline void add_two_sequences(harness::PointResult& r, int prompt_len, int length, int steps) {
  for (int32_t s : {0, 1}) {
    r.seq_index.push_back(s);
    r.seq_prompt_len.push_back(prompt_len);
    r.seq_length.push_back(length);
    r.seq_steps.push_back(steps);
    r.seq_prefill_ms.push_back(0);
  }
}

}  // namespace mtplab::test
