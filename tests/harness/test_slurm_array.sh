#!/usr/bin/env bash
# The Slurm path of an experiment for real: starts a one-node Slurm (scripts/slurm-local.sh),
# submits a 2-point quickstart as a job array with 2 tasks per point (slurm/submit.sh, srun
# --mpi=pmix) and its dependent merge job, waits, and checks the merged file. Stops Slurm.
# Exit 77 (skipped) unless root with Slurm and munge installed.
# Usage: test_slurm_array.sh MTPLAB PYTHON   (MTPLAB_SOURCE_DIR = repository root)
set -uo pipefail
mtplab=$1 python=$2
src=${MTPLAB_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
# shellcheck source=tests/common/slurm.sh
source "$src/tests/common/slurm.sh"
require_slurm
"$python" -c "import h5py, pandas" 2>/dev/null || skip "$python lacks h5py or pandas"

start_own_slurm mtplab-slurm-array

cd "$work" || exit 1
# 2 points (head_fp8 off / on, a vocab-sharded head), short sequences.
sets=(--set 'sweep.grid.head_sharding=[vocab]' --set 'sweep.grid.context_rows=[cache_only]'
      --set 'sweep.grid.skip=[none]' --set trace.synthetic.new_tokens=16 --set measure.warmup_steps=1)
MTPLAB_BIN=$mtplab timeout 240 "$src/slurm/submit.sh" "$src/tests/harness/synthetic-quickstart.yaml" --ranks 2 --parallel 2 \
  --time 00:05:00 --out "$work/merged.h5" "${sets[@]}" --wait -- --chdir="$work" >"$work/submit.log" 2>&1
rc=$?
cat "$work/submit.log"
failures=0
if ((rc != 0)); then
  echo "FAIL: submit.sh / the merge job exited $rc"
  failures=$((failures + 1))
fi
for f in "$work"/mtplab-exp_*_*.out "$work"/mtplab-merge_*.out; do
  [[ -f $f ]] && { echo "---- $(basename "$f")"; cat "$f"; }
done
n=$(ls "$work"/mtplab-exp_*_[01].out 2>/dev/null | wc -l)
((n == 2)) || { echo "FAIL: expected 2 array task logs (%x_%A_%a), found $n"; failures=$((failures + 1)); }
"$python" "$src/tests/harness/check_results.py" "$work/merged.h5" --points 2 || failures=$((failures + 1))
"$python" - "$work/merged.h5" <<'PY' || failures=$((failures + 1))
import sys, h5py
f = h5py.File(sys.argv[1], "r")
env = [e.decode() if isinstance(e, bytes) else e for e in f["points"]["p0000"].attrs.get("argv", [])]
assert "--point" in env, env
tasks = [t.decode() if isinstance(t, bytes) else t for t in f.attrs["merged_from"]]
assert len(tasks) == 2, tasks
print("ok: merged from", tasks)
PY
((failures == 0)) || { echo "$failures failure(s)"; exit 1; }
echo "ok: slurm array + merge"
