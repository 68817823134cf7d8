#include "drafter/selection_check.hpp"

#include <algorithm>
#include <iterator>
#include <vector>

#include "core/error.hpp"

namespace mtplab::drafter {
namespace {
// The row's entries without the -1 padding, sorted.
void as_set(const int32_t* row, int width, std::vector<int32_t>& out) {
  out.clear();
  for (int i = 0; i < width; ++i)
    if (row[i] != -1) out.push_back(row[i]);
  std::sort(out.begin(), out.end());
}
}  // namespace

SelectionCheck compare_selections(const int32_t* batched, const int32_t* per_row, int rows, int width) {
  MTP_REQUIRE(rows >= 0 && width >= 0, "selection check: ", rows, " rows of width ", width);
  SelectionCheck c;
  std::vector<int32_t> b, r, only;
  for (int row = 0; row < rows; ++row) {
    const size_t off = static_cast<size_t>(row) * width;
    as_set(batched + off, width, b);
    as_set(per_row + off, width, r);
    ++c.rows_checked;
    if (b == r) continue;
    ++c.rows_differ;
    only.clear();
    std::set_difference(b.begin(), b.end(), r.begin(), r.end(), std::back_inserter(only));
    const int64_t b_not_r = static_cast<int64_t>(only.size());
    only.clear();
    std::set_difference(r.begin(), r.end(), b.begin(), b.end(), std::back_inserter(only));
    c.entries_differ += std::max(b_not_r, static_cast<int64_t>(only.size()));
  }
  return c;
}

}  // namespace mtplab::drafter
