#!/usr/bin/env bash
# analysis/results.ipynb on fresh quickstart results (schema v3), with the plan file of docs/planning.md's
# worked example (its two figures), and on tests/data/seed-ablations-gpu.h5
# (schema v1) after `mtplab upgrade`: runs a shrunk quickstart on 2 ranks, executes
# the notebook with `jupyter nbconvert --to notebook --execute`, and checks that every figure was
# saved as a non-empty PNG. Exit 77 (skipped) without jupyter, h5py, pandas or matplotlib.
# Usage: test_notebook.sh MTPLAB MPIEXEC PYTHON   (MTPLAB_SOURCE_DIR = repository root)
set -uo pipefail
mtplab=$1 mpiexec=$2 python=$3
src=${MTPLAB_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
command -v jupyter >/dev/null 2>&1 || { echo "SKIPPED: jupyter not found (apt install jupyter-nbconvert)"; exit 77; }
"$python" -c "import h5py, pandas, matplotlib" 2>/dev/null ||
  { echo "SKIPPED: $python lacks h5py, pandas or matplotlib"; exit 77; }
work=$(mktemp -d /tmp/mtplab-nb-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# Every arm of the quickstart, on short sequences.
"$mpiexec" -np 2 --oversubscribe --bind-to none "$mtplab" run "$src/tests/harness/synthetic-quickstart.yaml" \
  --set trace.synthetic.new_tokens=12 --set measure.warmup_steps=1 --out "$work/q.h5" >"$work/run.log" 2>&1 ||
  { echo "FAIL: mtplab run exited $?"; cat "$work/run.log"; exit 1; }

# The plan of docs/planning.md's worked example, for the plan figures.
(cd "$src" && "$mtplab" plan docs/planning/glm5.2-x-glm5.3-flash.yaml --out "$work/plan.h5" --exports "$work/plan-exports") \
  >"$work/plan.log" 2>&1 || { echo "FAIL: mtplab plan exited $?"; cat "$work/plan.log"; exit 1; }

MTPLAB_RESULTS=$work/q.h5 MTPLAB_FIGURES=$work/figures MTPLAB_PLAN=$work/plan.h5 PYDEVD_DISABLE_FILE_VALIDATION=1 \
  timeout 240 jupyter nbconvert --to notebook --execute "$src/analysis/results.ipynb" --output-dir "$work/nb" \
  >"$work/nb.log" 2>&1 || { echo "FAIL: the notebook did not execute"; cat "$work/nb.log"; exit 1; }

failures=0
figs=(acceptance_tau tau_ci expected_tau_k accepted_hist per_position phase_breakdown fp8_divergence fp8_flip_margins
  sharding_latency batch_scaling)
for fig in "${figs[@]}" plan_speedup plan_throughput; do
  f=$work/figures/$fig.png
  if [[ -s $f ]] && [[ $(head -c 8 "$f" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]]; then
    echo "ok: $fig.png ($(stat -c %s "$f") bytes)"
  else
    echo "FAIL: $fig.png missing, empty or not a PNG"
    failures=$((failures + 1))
  fi
done
# The executed notebook carries no error output.
grep -q '"output_type": "error"' "$work/nb/results.ipynb" && { echo "FAIL: a cell raised"; failures=$((failures + 1)); }

# The same notebook on the GPU run of experiments/seed-ablations.yaml kept in tests/data
# (60 points, 2 ranks, CUDA, schema v1) after `mtplab upgrade`: a file written on other machines by
# an older mtplab reads the same way once upgraded; the reader refuses it as it is, naming the fix.
old_results=$src/tests/data/seed-ablations-gpu.h5
gpu_results=$work/seed-ablations-gpu-v3.h5
if [[ -f $old_results ]]; then
  "$python" - "$old_results" "$src/analysis" >"$work/refuse.log" 2>&1 <<'PY' || { echo "FAIL: the reader read a schema v1 file"; cat "$work/refuse.log"; failures=$((failures + 1)); }
import sys
sys.path.insert(0, sys.argv[2])
import mtplab_results as mr
try:
    mr.Results(sys.argv[1])
except ValueError as e:
    assert "schema version 1" in str(e) and "mtplab upgrade" in str(e), e
    print("refused:", e)
else:
    raise SystemExit("read")
PY
  "$mtplab" upgrade "$old_results" "$gpu_results" >"$work/upgrade.log" 2>&1 ||
    { echo "FAIL: mtplab upgrade of $old_results exited $?"; cat "$work/upgrade.log"; exit 1; }
  MTPLAB_RESULTS=$gpu_results MTPLAB_FIGURES=$work/figures-gpu PYDEVD_DISABLE_FILE_VALIDATION=1 \
    timeout 240 jupyter nbconvert --to notebook --execute "$src/analysis/results.ipynb" --output-dir "$work/nb-gpu" \
    >"$work/nb-gpu.log" 2>&1 || { echo "FAIL: the notebook did not execute on $gpu_results"; cat "$work/nb-gpu.log"; exit 1; }
  n=$(find "$work/figures-gpu" -name '*.png' -size +1k | wc -l)
  if ((n == ${#figs[@]})) && ! grep -q '"output_type": "error"' "$work/nb-gpu/results.ipynb"; then
    echo "ok: $n figures from the seed-ablations GPU results (schema v1, upgraded)"
  else
    echo "FAIL: $n of ${#figs[@]} figures (or a cell raised) on $gpu_results (upgraded from $old_results)"
    failures=$((failures + 1))
  fi
fi

# A batch_size sweep: the batch-scaling figure has lines to draw (and the other cells cope).
"$mpiexec" -np 2 --oversubscribe --bind-to none "$mtplab" run "$src/tests/harness/synthetic-quickstart.yaml" \
  --set trace.synthetic.sequences=5 --set trace.synthetic.new_tokens=12 --set measure.warmup_steps=1 \
  --set 'sweep.grid.skip=[none]' --set 'sweep.grid.context_rows=[cache_only]' --set 'sweep.grid.batch_size=[1,2,4]' \
  --out "$work/b.h5" >"$work/run-b.log" 2>&1 || { echo "FAIL: the batch_size run exited $?"; cat "$work/run-b.log"; exit 1; }
MTPLAB_RESULTS=$work/b.h5 MTPLAB_FIGURES=$work/figures-b PYDEVD_DISABLE_FILE_VALIDATION=1 \
  timeout 240 jupyter nbconvert --to notebook --execute "$src/analysis/results.ipynb" --output-dir "$work/nb-b" \
  >"$work/nb-b.log" 2>&1 || { echo "FAIL: the notebook did not execute on the batch_size run"; cat "$work/nb-b.log"; exit 1; }
if [[ -s $work/figures-b/batch_scaling.png ]] && ! grep -q '"output_type": "error"' "$work/nb-b/results.ipynb" &&
   grep -q 'batch scaling: [1-9]' "$work/nb-b/results.ipynb"; then
  echo "ok: batch_scaling.png from a batch_size sweep"
else
  echo "FAIL: no batch-scaling figure from the batch_size sweep (or a cell raised)"
  failures=$((failures + 1))
fi
((failures == 0)) || exit 1
