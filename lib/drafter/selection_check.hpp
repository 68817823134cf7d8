// The batch_qidx selection check: how often the selection made from the batched (GEMM) indexer
// query differs from the one the per-row (GEMV) query makes, for the same context rows.
//
// Invariants:
// - A selection (ops::Backend::indexer_select) is a row of `width` = K + P - 1 entries: row
//   indices, then -1 padding. Its entries are compared as a SET: the order of entries is not
//   part of the contract, and -1 is padding, never an entry.
// - How many entries a selection holds depends on its position only (min(K/P, complete pools)
//   pools of P rows, plus the tail), so two selections of one row have equal sizes and
//   |B \ R| = |R \ B| = |B (+) R| / 2.
#pragma once
#include <cstdint>

namespace mtplab::drafter {

/// Counters of the selection check, summed over the rows checked.
struct SelectionCheck {
  int64_t rows_checked = 0;    ///< context rows whose two selections were compared
  int64_t rows_differ = 0;     ///< rows whose two selections differ as sets
  int64_t entries_differ = 0;  ///< per row max(|B \ R|, |R \ B|), summed (= |B (+) R| / 2 here)
  /// Rows of chunks of 2 or more rows: a one-row chunk runs the same GEMV in either mode (the
  /// batched path of a backend only starts at 2 rows), so its selection cannot differ.
  int64_t rows_multi = 0;
  double differ_rate() const { return rows_checked ? static_cast<double>(rows_differ) / rows_checked : 0.0; }
  SelectionCheck& operator+=(const SelectionCheck& o) {
    rows_checked += o.rows_checked;
    rows_differ += o.rows_differ;
    entries_differ += o.entries_differ;
    rows_multi += o.rows_multi;
    return *this;
  }
};

/// Compares `rows` pairs of selections, row r being batched[r * width ..] and
/// per_row[r * width ..] (host memory), as sets of row indices with -1 padding ignored.
/// Returns rows_checked = rows, rows_differ and entries_differ (rows_multi is left 0).
SelectionCheck compare_selections(const int32_t* batched, const int32_t* per_row, int rows, int width);

}  // namespace mtplab::drafter
