#!/usr/bin/env bash
# `mtplab info` on N ranks prints exactly one table row per rank.
# Usage: test_info.sh N launcher... path/to/mtplab   (e.g. 2 mpiexec -n 2 --oversubscribe mtplab)
set -uo pipefail
np=$1
shift
# shellcheck source=tests/app/info_rows.sh
source "$(dirname "${BASH_SOURCE[0]}")/info_rows.sh"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" info >"$out" 2>&1
rc=$?
if ((rc != 0)); then
  echo "FAIL: '$* info' exited $rc"
  cat "$out"
  exit 1
fi
expect_info_rows "$out" "$np"
