#!/usr/bin/env bash
# experiments/rank-scaling.yaml on the CPU backend at 1, 2, 4 and 8 ranks, shrunk to the tiny model
# (its batch_size, head_sharding and exchange axes as shipped, eager only), then the checks that do
# not need a GPU:
# - every rank count runs every point, and the file's own comparisons hold: the arms that must not
#   change drafts (head_sharding, exchange) and the batch (batch_draft_mismatches: the CPU drafts
#   a sequence at batch B bit for bit as at batch 1) show no differing step;
# - analysis/compare_drafts.py pairs every point of the 1-rank file with the N-rank file's, over the
#   same steps, and prints its counts (the sharded block adds the ranks' partial sums in another
#   order, so a few flips at small margins are expected and reported, not failed);
# - compare_drafts.py --require-equal: a file against itself exits 0, a file against one that lacks
#   some of its points exits 1, a missing file exits 2.
# Exit 77 (skipped) without h5py, pandas and numpy.
# Usage: test_rank_scaling.sh MTPLAB MPIEXEC PYTHON   (MTPLAB_SOURCE_DIR = repository root)
set -uo pipefail
mtplab=$1 mpiexec=$2 python=$3
src=${MTPLAB_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
"$python" -c "import h5py, pandas, numpy" 2>/dev/null || { echo "SKIPPED: $python lacks h5py, pandas or numpy"; exit 77; }
work=$(mktemp -d /tmp/mtplab-rank-scaling.XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
shrink=(--set model.preset=tiny --set model.max_seq_len=256 --set backend=cpu --set 'sweep.grid.cuda_graph=[off]'
  --set trace.synthetic.sequences=10 --set trace.synthetic.prompt_len=32 --set trace.synthetic.new_tokens=12
  --set 'sweep.grid.batch_size=[1,4]' --set measure.max_steps=12 --set measure.warmup_steps=1)
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

for n in 1 2 4 8; do
  "$mpiexec" -np "$n" --oversubscribe --bind-to none "$mtplab" run "$src/experiments/rank-scaling.yaml" "${shrink[@]}" \
    --out "$work/r$n.h5" >"$work/r$n.log" 2>&1 || { fail "$n rank(s): mtplab run exited $?"; cat "$work/r$n.log"; continue; }
  # Every point, and no differing step along the axes that must not change drafts.
  MTPLAB_SRC=$src "$python" - "$work/r$n.h5" "$n" <<'EOF' || fail "$n rank(s): the file's own comparisons"
import os, sys
sys.path.insert(0, os.path.join(os.environ["MTPLAB_SRC"], "analysis"))
import mtplab_results as mr
res, ranks = mr.Results(sys.argv[1]), sys.argv[2]
bad = []
if len(res.point_names) != 8:
    bad.append(f"{len(res.point_names)} points, 8 expected")
if int(res.attrs["world_size"]) != int(ranks):
    bad.append(f"world_size {res.attrs['world_size']}")
div = res.stored_divergence()
for axis in ("head_sharding", "exchange", "batch_size"):
    rows = div[div["axis"] == axis]
    if rows.empty:
        bad.append(f"no divergence row along {axis}")
    # (a batch_size point drafts for more sequences than its batch-1 reference: fewer common steps)
    elif (rows["differ_any"] != 0).any() or (rows["common_steps"] == 0).any() or (
            axis != "batch_size" and (rows["common_steps"] != rows["steps"]).any()):
        bad.append(f"drafts differ along {axis}: {rows[['point', 'reference', 'differ_any', 'common_steps']].values.tolist()}")
mism = res.points.set_index("name")["batch_draft_mismatches"]
b = res.points.set_index("name")["batch_size"].astype(int)
if (mism[b > 1] != 0).any() or (mism[b == 1] != -1).any():
    bad.append(f"batch_draft_mismatches {mism.to_dict()}")
for m in bad:
    print(f"{sys.argv[1]}: {m}")
if not bad:
    print(f"ok: {ranks} rank(s), {len(res.point_names)} points, no differing step along head_sharding, exchange, batch_size")
sys.exit(1 if bad else 0)
EOF
done

# Across rank counts: every point paired, over all of its steps.
for n in 2 4 8; do
  [[ -f $work/r1.h5 && -f $work/r$n.h5 ]] || continue
  out=$("$python" "$src/analysis/compare_drafts.py" "$work/r1.h5" "$work/r$n.h5") || fail "compare_drafts 1 vs $n exited $?"
  echo "$out" | tail -1
  grep -q "UNPAIRED" <<<"$out" && fail "1 vs $n: unpaired points"
  grep -q " 8 point(s) paired, 240 common step(s)" <<<"$out" || fail "1 vs $n: not every point and step paired: $(tail -1 <<<"$out")"
done

# --require-equal and the exit codes.
if [[ -f $work/r2.h5 ]]; then
  "$python" "$src/analysis/compare_drafts.py" "$work/r2.h5" "$work/r2.h5" --require-equal >"$work/self.txt" ||
    fail "a file against itself under --require-equal exited $?"
  grep -q "240 common step(s), 0 differ" "$work/self.txt" || fail "a file against itself: $(tail -1 "$work/self.txt")"
  "$mpiexec" -np 2 --oversubscribe --bind-to none "$mtplab" run "$src/experiments/rank-scaling.yaml" "${shrink[@]}" \
    --set 'sweep.grid.batch_size=[1]' --out "$work/part.h5" >"$work/part.log" 2>&1 || fail "the partial run exited $?"
  "$python" "$src/analysis/compare_drafts.py" "$work/r2.h5" "$work/part.h5" --require-equal >"$work/part.txt"
  rc=$?
  ((rc == 1)) && grep -q "UNPAIRED" "$work/part.txt" || fail "points without a partner under --require-equal: exit $rc"
  "$python" "$src/analysis/compare_drafts.py" "$work/r2.h5" "$work/none.h5" >/dev/null
  rc=$?
  ((rc == 2)) || fail "a missing file: exit $rc, 2 expected"
fi
((failures == 0)) && echo "ok: rank-scaling on the CPU backend at 1, 2, 4 and 8 ranks"
exit $((failures > 0))
