# shellcheck shell=bash
# Sourced by the app tests: reads the table that `mtplab info` prints at rank 0.
# What is relied on: a header line with a column named exactly `rank`, and after it one row per
# rank whose field in that column (counting whitespace-separated fields; the columns before it
# hold no spaces) is the rank's number. Banner and note lines are ignored.

# Prints the rank numbers of the table's rows in `file`, one a line, sorted numerically.
info_ranks() {
  awk '!col { for (i = 1; i <= NF; i++) if ($i == "rank") { col = i; next } ; next }
       $col ~ /^[0-9]+$/ { print $col }' "$1" | sort -n
}

# Succeeds when `file` has exactly one row for each of ranks 0..np-1; otherwise explains.
expect_info_rows() {
  local file=$1 np=$2 want got
  want=$(seq 0 $((np - 1)))
  got=$(info_ranks "$file")
  if [[ "$got" != "$want" ]]; then
    echo "FAIL: expected one info row for each of ranks 0..$((np - 1)) in $file, got ranks [$(paste -sd ' ' <<<"$got")]"
    echo "---- $file"
    cat "$file"
    return 1
  fi
  echo "ok: $np rows (ranks $(paste -sd ' ' <<<"$got")) in $(basename "$file")"
}
