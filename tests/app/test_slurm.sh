#!/usr/bin/env bash
# The Slurm path for real: starts a one-node Slurm (scripts/slurm-local.sh), submits
# slurm/info.sbatch twice with `sbatch --wait` (2 tasks; once launched by `srun --mpi=pmix`, once
# by `mpirun` inside the allocation), checks each log has one info row per rank, stops Slurm.
# Exit 77 (skipped) unless root with Slurm and munge installed.
# Usage: test_slurm.sh path/to/mtplab [mpirun]   (MTPLAB_SOURCE_DIR = repository root)
set -uo pipefail
mtplab=$1
src=${MTPLAB_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
# shellcheck source=tests/app/info_rows.sh
source "$src/tests/app/info_rows.sh"

# shellcheck source=tests/common/slurm.sh
source "$src/tests/common/slurm.sh"
require_slurm
if [[ -n "${2:-}" ]]; then PATH=$(dirname "$2"):$PATH; fi
command -v mpirun >/dev/null 2>&1 || skip "mpirun not found"

start_own_slurm mtplab-slurm-test
echo "srun --mpi=list: $(srun --mpi=list 2>&1 | tr -s '\n\t' ' ')"

# Both jobs at once (the node has at least 4 CPUs): sbatch --wait polls slowly, so this halves
# the test's time.
declare -A submit_pid
for launcher in srun mpirun; do
  timeout 180 sbatch --wait --quiet --ntasks=2 --chdir="$work" --output="$work/info-$launcher.out" \
    --export="ALL,MTPLAB_BIN=$mtplab,MTPLAB_LAUNCHER=$launcher" "$src/slurm/info.sbatch" &
  submit_pid[$launcher]=$!
done
failures=0
for launcher in srun mpirun; do
  log=$work/info-$launcher.out
  if ! wait "${submit_pid[$launcher]}"; then
    echo "FAIL: the $launcher job failed"
    [[ -f $log ]] && cat "$log"
    failures=$((failures + 1))
    continue
  fi
  expect_info_rows "$log" 2 || failures=$((failures + 1))
done
((failures == 0)) || { echo "$failures failure(s)"; exit 1; }
