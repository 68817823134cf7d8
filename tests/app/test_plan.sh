#!/usr/bin/env bash
# `mtplab plan` end to end: the worked example of docs/planning.md (its one command) prints the
# inputs, the warning that its cost files come from two commits, tau(k), the speedup table and the
# best k at every B from 1 to 128, and writes the plan file and the exports; the exported profile
# planned again gives the same best k; the engine files parse (python3 json / yaml); acceptance from
# a replay of the trained tiny model gives tau intervals; the refusals name the file and the key
# (a missing (B, R), a synthetic-weights results point, an existing output); online points as
# acceptance and costs (the prediction against them) and as the fixed cost beside benchmark files
# (their disagreements said); the analysis code (analysis/*.py and the notebook's cells) compiles.
# Usage: test_plan.sh path/to/mtplab PYTHON   (MTPLAB_SOURCE_DIR = repository root)
set -uo pipefail
mtplab=$1 python=$2
src=${MTPLAB_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
work=$(mktemp -d /tmp/mtplab-plan-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$src" || exit 1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
has() { grep -qF -- "$2" "$1" || { fail "$1 lacks: $2"; sed -n '1,80p' "$1"; }; }

example=docs/planning/glm5.2-x-glm5.3-flash.yaml
# The example's plan, its outputs in the test's directory (never under the repository's results/).
n=0
plan() { n=$((n + 1)); "$mtplab" plan "$example" --out "$work/p$n.h5" --exports "$work/x$n" "$@"; }
# The worked example, as docs/planning.md runs it (outputs moved into the test's directory).
"$mtplab" plan "$example" --out "$work/plan.h5" --exports "$work/exports" >"$work/out" 2>"$work/err" ||
  { fail "the worked example exited $?"; cat "$work/out" "$work/err"; exit 1; }
has "$work/out" "acceptance profile docs/planning/glm5.2-mtp-speed-bench-coding.json"
has "$work/out" "git 7b6daf5, device NVIDIA H200"
has "$work/out" "git 85f3590, device NVIDIA H200"
has "$work/out" "warning: the cost files disagree on the git commit: 7b6daf5"
has "$work/out" "note: draft(B, 2) = 2 x draft(B, 1)"
has "$work/out" "best k per concurrency"
# One row per planned B in the best-k table, each with a best k in 0..4 and a verdict.
rows=$(sed -n '/^best k per concurrency/,/^$/p' "$work/out" | grep -cE '^(1|2|4|8|16|32|64|128) +[0-4] +[01]\.[0-9]{3} .*distinguishable')
[[ $rows == 8 ]] || { fail "the best-k table has $rows rows of B, not 8"; cat "$work/out"; }
[[ $(head -c 4 "$work/plan.h5" | od -An -tx1 | tr -d ' \n') == 89484446 ]] || fail "plan.h5 is not an HDF5 file"
for f in vllm-speculative-config.json trtllm-speculative-config.yaml sglang-launch-flags.json acceptance-profile.json; do
  [[ -s $work/exports/$f ]] || fail "no export $f"
done

# The engine files parse with the engines' own readers' formats, and agree with the printed table.
"$python" - "$work/exports" "$work/out" <<'PY' || fail "the exports do not parse or disagree with the table"
import json, re, sys
d, out = sys.argv[1], open(sys.argv[2]).read()
best = {}
section = out.split("best k per concurrency")[1].split("\n\n")[0]
for line in section.splitlines()[1:]:
    m = re.match(r"^(\d+) +(\d+) ", line)
    if m:
        best[int(m.group(1))] = int(m.group(2))
v = json.load(open(f"{d}/vllm-speculative-config.json"))
ranges = {tuple(map(int, key.split("-"))): k for key, k in v["num_speculative_tokens_per_batch_size"].items()}
def vllm_k(b):
    for (lo, hi), k in ranges.items():
        if lo <= b <= hi:
            return min(k, v["num_speculative_tokens"])
for b, k in best.items():
    assert vllm_k(b) == k, (b, k, vllm_k(b))
assert v["num_speculative_tokens"] == max(best.values())
s = json.load(open(f"{d}/sglang-launch-flags.json"))
for r in s["ranges"]:
    for b, k in best.items():
        if r["lo"] <= b <= r["hi"]:
            assert r["k"] == k and (r["flags"] == "" if k == 0 else f"--speculative-num-steps {k} " in r["flags"]), r
p = json.load(open(f"{d}/acceptance-profile.json"))
assert p["schema"] == "mtplab-acceptance-profile" and p["accepted_length"][:4] == [1.84, 2.5, 2.99, 3.33], p
assert p["vllm_synthetic_acceptance_rates"] == sorted(p["vllm_synthetic_acceptance_rates"], reverse=True)
try:
    import yaml
except ImportError:
    yaml = None
if yaml:
    t = yaml.safe_load(open(f"{d}/trtllm-speculative-config.yaml"))["speculative_config"]
    keys = sorted(t["draft_len_schedule"])
    for b, k in best.items():
        up = [x for x in keys if x >= b]
        assert (t["draft_len_schedule"][up[0]] if up else 0) == k, (b, k)
print("exports agree with the table:", best)
PY

# The exported profile, planned again, gives the same best k per B (the round trip of the profile).
plan --profile "$work/exports/acceptance-profile.json" >"$work/again" 2>&1 ||
  { fail "planning the exported profile exited $?"; cat "$work/again"; }
best_of() { sed -n '/^best k per concurrency/,/^$/p' "$1" | awk 'NR > 2 && NF { print $1, $2 }'; }
[[ "$(best_of "$work/out")" == "$(best_of "$work/again")" ]] ||
  { fail "the exported profile plans another best k"; diff <(best_of "$work/out") <(best_of "$work/again"); }

# An existing output is not replaced without --force; with it, it is.
"$mtplab" plan "$example" --out "$work/plan.h5" --exports "$work/x2" >"$work/o2" 2>"$work/e2" &&
  fail "an existing plan file was replaced without --force"
has "$work/e2" "$work/plan.h5"
[[ ! -e $work/x2 ]] || fail "the exports were written although the plan file was refused"
"$mtplab" plan "$example" --out "$work/plan.h5" --exports "$work/exports" --force >"$work/o3" 2>&1 ||
  fail "--force did not replace the outputs"

# A cost point the files do not have: the file and the missing (B, R) named.
plan --k-max 5 >"$work/o4" 2>"$work/e4" && fail "k_max 5 was planned without R = 6 rows"
has "$work/e4" "h200-bench_verify-glm5.3-flash.csv): no layer row at (B = 1, R = 6) (needed for k = 5 at B = 1)"
plan --batch 1,3 >"$work/o5" 2>"$work/e5" && fail "B = 3 was planned without its rows"
has "$work/e5" "no layer row at (B = 3, R = 1)"
plan --set costs.head=fp16 >"$work/o6" 2>"$work/e6" && fail "a bad head was taken"
has "$work/e6" "costs.head"

# Acceptance from replay: the trained tiny model's results, with bootstrap intervals over sequences.
"$mtplab" run experiments/trained-tiny.yaml --set 'sweep.grid.draft_len=[1,2,3,4]' --set 'sweep.grid.head_fp8=[off]' \
  --set 'sweep.grid.head_sharding=[none]' --set 'sweep.grid.context_rows=[cache_only]' --set 'sweep.grid.skip=[none]' \
  --set measure.sequences=6 --out "$work/tiny.h5" >"$work/run.log" 2>&1 || { fail "the trained tiny replay exited $?"; cat "$work/run.log"; }
plan --results "$work/tiny.h5" >"$work/o7" 2>"$work/e7" ||
  { fail "planning the trained tiny results exited $?"; cat "$work/o7" "$work/e7"; }
has "$work/o7" "acceptance results $work/tiny.h5: git"
has "$work/o7" "6 sequence(s); points p0000 (draft_len 1"
grep -qE '^1  [0-9.]+  \[[0-9.]+, [0-9.]+\]  p0000 of ' "$work/o7" || { fail "tau(1) has no interval"; cat "$work/o7"; }

# Synthetic weights: the run marks its acceptance, and the planner refuses it naming file and point.
"$mtplab" run tests/harness/synthetic-quickstart.yaml --set trace.synthetic.new_tokens=8 --set measure.warmup_steps=1 \
  --set 'sweep.grid.draft_len=[2]' --set 'sweep.grid.head_fp8=[off]' --set 'sweep.grid.head_sharding=[none]' \
  --set 'sweep.grid.context_rows=[cache_only]' --set 'sweep.grid.skip=[none]' --out "$work/syn.h5" >"$work/syn.log" 2>&1 ||
  { fail "the synthetic run exited $?"; cat "$work/syn.log"; }
has "$work/syn.log" "* acceptance and tau not meaningful: synthetic weights"
grep -qE '^p0 .* [0-9.]+\* +[0-9.]+\* ' "$work/syn.log" || { fail "the run's table does not mark the point"; cat "$work/syn.log"; }
plan --results "$work/syn.h5" >"$work/o8" 2>"$work/e8" && fail "synthetic-weights acceptance was planned"
has "$work/e8" "$work/syn.h5: point p0000 ("
has "$work/e8" "its acceptance is not meaningful and cannot be a plan's acceptance source: synthetic weights (seed"

# Online points (experiments/online-plan-check.yaml, small, on the CPU): acceptance and every cost
# from them, the prediction printed against each point; then their fixed cost beside the worked
# example's benchmark files, where the GPU, the model and the commit disagree and the plan says so.
"$mtplab" run experiments/online-plan-check.yaml --set backend=cpu --set trace.synthetic.sequences=8 \
  --set online.max_new_tokens=12 --set measure.warmup_steps=1 --set 'sweep.grid.batch_size=[1,4]' \
  --set 'sweep.grid.draft_len=[0,1,2]' --out "$work/online.h5" >"$work/online.log" 2>&1 ||
  { fail "the online run exited $?"; cat "$work/online.log"; }
"$mtplab" plan --set 'model={preset: data/trained-mini/trained-mini.yaml, layers: 4}' --results "$work/online.h5" \
  --points p2,p4 --online "$work/online.h5" --set costs.online_terms=all --set resamples=200 \
  --out "$work/online-plan.h5" >"$work/o9" 2>"$work/e9" || { fail "planning the online points exited $?"; cat "$work/o9" "$work/e9"; }
has "$work/o9" "costs.online [draft, verify, fixed] $work/online.h5: git "
has "$work/o9" "prediction against the online points (costs.online)"
rows=$(sed -n '/^prediction against the online points/,/^$/p' "$work/o9" | grep -cE '^[14] +[0-2] +p000[0-5] of ')
[[ $rows == 6 ]] || { fail "the prediction table has $rows rows, not 6"; cat "$work/o9"; }
plan --batch 1,4 --online "$work/online.h5" >"$work/o10" 2>"$work/e10" ||
  { fail "the online fixed cost beside the benchmark files exited $?"; cat "$work/o10" "$work/e10"; }
has "$work/o10" "costs.fixed: online points of $work/online.h5: c(B) = the mean over their measured rows at B of step_ms - propose_ms - verify_ms"
has "$work/o10" "warning: the cost files disagree on the GPU: NVIDIA H200"
has "$work/o10" "cpu ($work/online.h5)"
has "$work/o10" "warning: the cost files disagree on the model preset: glm5.3-flash"
plan --online "$work/online.h5" >"$work/o11" 2>"$work/e11" && fail "B = 2 was planned without an online point there"
has "$work/e11" "costs.online ($work/online.h5): no online point at B = 2"

# The analysis code compiles (no pandas or matplotlib needed): the modules and the notebook's cells.
"$python" -m py_compile analysis/mtplab_results.py analysis/compare_results.py analysis/compare_drafts.py ||
  fail "analysis/*.py does not compile"
"$python" - analysis/results.ipynb <<'PY' || fail "a notebook cell does not compile"
import json, sys
nb = json.load(open(sys.argv[1]))
for i, c in enumerate(nb["cells"]):
    if c["cell_type"] == "code":
        compile("".join(c["source"]), f"{sys.argv[1]} cell {i}", "exec")
print("notebook cells compile")
PY

((failures == 0)) && echo "test_plan: ok" || echo "test_plan: $failures failure(s)"
exit $((failures > 0))
