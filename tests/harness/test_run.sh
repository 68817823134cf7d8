#!/usr/bin/env bash
# `mtplab run` end to end on 2 ranks with a shrunk synthetic quickstart (tests/harness/synthetic-quickstart.yaml).
#
#   test_run.sh basic   MTPLAB MPIEXEC PYTHON   run, check the file, rerun (skips), refuse a
#                                               different config, --point tasks + merge
#   test_run.sh sigterm MTPLAB MPIEXEC PYTHON   SIGTERM to mpirun mid-run: non-zero exit, the
#                                               file holds the completed points; a rerun resumes
#   test_run.sh sigkill MTPLAB MPIEXEC PYTHON   SIGKILL to the ranks mid-run: the file is still
#                                               valid; a rerun resumes
#   test_run.sh batch   MTPLAB MPIEXEC PYTHON   batch_size 1, 2, 4: the same drafts per (sequence,
#                                               position) at every B, continuous batching
#   test_run.sh qidx    MTPLAB MPIEXEC PYTHON   batch_qidx x context_rows: the selection check's
#                                               counters where it applies, arms_not_applied and a
#                                               log line where it does not (cache_only)
#   test_run.sh teacher MTPLAB MPIEXEC PYTHON   replay speculative x teacher_forced on the trained
#                                               tiny model (vocab-sharded head, BF16 and FP8, B = 1
#                                               and 3): every speculative step is the teacher-forced
#                                               row at its position up to its first miss; margins,
#                                               intervals, per-depth accuracy; record_margins off
#   test_run.sh sampling MTPLAB MPIEXEC PYTHON  verify x draft_proposal x head_sharding x batch_size
#                                               on a sampled synthetic trace, 2 ranks and 1: the
#                                               new attributes and datasets, the coins, invariance;
#                                               the refusals of mismatched traces
# Exit 77 (skipped) when PYTHON lacks h5py / pandas. MTPLAB_SOURCE_DIR = repository root.
set -uo pipefail
mode=$1 mtplab=$2 mpiexec=$3 python=$4
src=${MTPLAB_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
source "$src/tests/common/script.sh"
check="$python $src/tests/harness/check_results.py"
require_python "$python" h5py pandas

work=$(mktemp -d /tmp/mtplab-run-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
exp=$src/tests/harness/synthetic-quickstart.yaml
launch=("$mpiexec" -np 2 --oversubscribe --bind-to none "$mtplab")
# 8 points (skip fixed to none), short sequences: a few seconds on 2 busy cores.
small=(--set trace.synthetic.new_tokens=16 --set 'sweep.grid.skip=[none]' --set measure.warmup_steps=1)

# run LOG ARGS...: mtplab run under mpirun, output to LOG; returns its exit code.
run() {
  local log=$1
  shift
  "${launch[@]}" run "$exp" "$@" >"$log" 2>&1
}

# wait_for_point LOG PID: until the log shows a finished point (or the job ends).
wait_for_point() {
  local i
  for ((i = 0; i < 600; i++)); do
    grep -q ') done in' "$1" && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

case $mode in
  basic)
    out=$work/q.h5
    run "$work/run1.log" "${small[@]}" --out "$out" || { fail "first run exited $?"; cat "$work/run1.log"; }
    $check "$out" --points 8 --sharding-invariant || fail "results of the first run"
    # Rerun: every point is already there.
    run "$work/run2.log" "${small[@]}" --out "$out" || fail "rerun exited $?"
    n=$(grep -c 'already in the results file, skipped' "$work/run2.log")
    ((n == 8)) || { fail "rerun skipped $n points, expected 8"; cat "$work/run2.log"; }
    $check "$out" --points 8 || fail "results after the rerun"
    # Another configuration into the same file is refused, and the file is untouched.
    if run "$work/run3.log" "${small[@]}" --set measure.max_steps=3 --out "$out"; then
      fail "a different configuration was accepted into $out"
    fi
    grep -q 'holds results of a different experiment configuration' "$work/run3.log" ||
      { fail "no clear refusal message"; cat "$work/run3.log"; }
    $check "$out" --points 8 || fail "results after the refused run"
    # A kernel choice made by the environment is the point's configuration: a rerun into the same
    # file with another one is refused, naming the key (the cpu backend records the policy too).
    if MTPLAB_GEMV_SPLIT=2 run "$work/run4.log" "${small[@]}" --out "$out"; then
      fail "a rerun with another kernel choice (MTPLAB_GEMV_SPLIT=2) was accepted into $out"
    fi
    grep -q 'kernels.gemv_split: auto (in the file) vs 2 (this run)' "$work/run4.log" ||
      { fail "the kernel-choice refusal does not name kernels.gemv_split"; cat "$work/run4.log"; }
    MTPLAB_GEMV_SPLIT=2 run "$work/run5.log" "${small[@]}" --point 0 --out "$work/split2.h5" ||
      { fail "a run with MTPLAB_GEMV_SPLIT=2 exited $?"; cat "$work/run5.log"; }
    "$python" - "$work/split2.h5" <<'PY' || fail "the environment override is not recorded per point"
import sys, h5py
g = h5py.File(sys.argv[1], "r")["points"]["p0000"]
dec = lambda v: v.decode() if isinstance(v, bytes) else v
assert dec(g.attrs["kernels.gemv_split"]) == "2", g.attrs["kernels.gemv_split"]
assert [dec(x) for x in g.attrs["kernel_env_overrides"]] == ["gemv_split=2 (MTPLAB_GEMV_SPLIT)"], g.attrs["kernel_env_overrides"]
PY
    # Two array tasks and a merge.
    run "$work/t0.log" "${small[@]}" --point 0 --out "$work/task0.h5" || fail "--point 0 exited $?"
    run "$work/t5.log" "${small[@]}" --point 5 --out "$work/task5.h5" || fail "--point 5 exited $?"
    "$mtplab" merge "$work/merged.h5" "$work/task0.h5" "$work/task5.h5" >"$work/merge.log" 2>&1 ||
      { fail "merge exited $?"; cat "$work/merge.log"; }
    $check "$work/merged.h5" --points 2 || fail "merged file"
    "$python" - "$work/merged.h5" "$out" <<'PY' || fail "merged points differ from the full run's"
import sys, h5py, numpy as np
m, full = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
assert sorted(m["points"]) == ["p0000", "p0005"], list(m["points"])
for p in m["points"]:
    # Drafts are deterministic: the task's point equals the same point of the full run.
    assert (m["points"][p]["drafts"][()] == full["points"][p]["drafts"][()]).all(), p
    assert m["points"][p].attrs["config"] == full["points"][p].attrs["config"], p
PY
    # Files of different configurations do not merge.
    run "$work/t9.log" "${small[@]}" --set measure.max_steps=2 --point 1 --out "$work/other.h5" ||
      fail "--point 1 (other config) exited $?"
    if "$mtplab" merge "$work/bad.h5" "$work/task0.h5" "$work/other.h5" >"$work/merge2.log" 2>&1; then
      fail "merging two configurations was accepted"
    fi
    grep -q 'different experiment configuration' "$work/merge2.log" || { fail "merge refusal unclear"; cat "$work/merge2.log"; }
    [[ ! -e $work/bad.h5 ]] || fail "a refused merge left $work/bad.h5"
    ;;
  sigterm | sigkill)
    out=$work/q.h5
    # Longer sequences, so that the run is still going when the signal comes (without the draft
    # statistics pass, which would add most of a step's time to a test about interruption).
    long=(--set trace.synthetic.new_tokens=60 --set 'sweep.grid.skip=[none]' --set measure.repeats=4
          --set record_margins=off)
    "${launch[@]}" run "$exp" "${long[@]}" --out "$out" >"$work/run.log" 2>&1 &
    pid=$!
    wait_for_point "$work/run.log" "$pid" || { fail "no point finished"; cat "$work/run.log"; }
    if [[ $mode == sigterm ]]; then
      kill -TERM "$pid"
    else
      # The ranks themselves (mpirun's children), by pid: rank 0 may be inside a point's write.
      ranks=$(ps -o pid= --ppid "$pid")
      [[ -n $ranks ]] || fail "no rank processes under mpirun $pid"
      # shellcheck disable=SC2086
      kill -KILL $ranks
    fi
    wait "$pid"
    rc=$?
    echo "mpirun exited $rc after SIG${mode#sig}"
    ((rc != 0)) || fail "an interrupted run exited 0"
    if [[ $mode == sigterm ]]; then
      grep -q 'interrupted by signal 15' "$work/run.log" || { fail "no interruption message"; cat "$work/run.log"; }
      ls "$work"/q.h5.tmp.* >/dev/null 2>&1 && fail "a clean stop left a temporary file"
    fi
    $check "$out" --at-most 8 || { fail "the interrupted file"; cat "$work/run.log"; }
    done_before=$("$python" -c "import h5py,sys; print(len(h5py.File(sys.argv[1],'r')['points']))" "$out")
    run "$work/resume.log" "${long[@]}" --out "$out" || { fail "resume exited $?"; cat "$work/resume.log"; }
    n=$(grep -c 'already in the results file, skipped' "$work/resume.log")
    ((n == done_before)) || fail "resume skipped $n points, the file had $done_before"
    $check "$out" --points 8 --sharding-invariant || fail "results after the resume"
    ;;
  batch)
    out=$work/q.h5
    # batch_size 1, 2, 4 over 5 sequences (continuous batching: slots are refilled), 2 ranks with
    # the head replicated and vocab-sharded, cache-only and full context rows: 12 points.
    batch=(--set trace.synthetic.sequences=5 --set trace.synthetic.new_tokens=16 --set 'sweep.grid.skip=[none]'
           --set 'sweep.grid.head_fp8=[off]' --set 'sweep.grid.batch_size=[1,2,4]' --set measure.warmup_steps=1)
    run "$work/run.log" "${batch[@]}" --out "$out" || { fail "run exited $?"; cat "$work/run.log"; }
    $check "$out" --points 12 --batch --sharding-invariant || { fail "results of the batch_size run"; cat "$work/run.log"; }
    ;;
  qidx)
    out=$work/q.h5
    # 4 points: context_rows [cache_only, full] x batch_qidx [off, on]; 2 repeats, so that the
    # counters are seen to cover every repeat.
    qidx=(--set trace.synthetic.new_tokens=16 --set 'sweep.grid.skip=[none]' --set 'sweep.grid.head_sharding=[none]'
          --set 'sweep.grid.head_fp8=[off]' --set 'sweep.grid.batch_qidx=[off,on]' --set measure.warmup_steps=1
          --set measure.repeats=2)
    run "$work/run.log" "${qidx[@]}" --out "$out" || { fail "run exited $?"; cat "$work/run.log"; }
    $check "$out" --points 4 --qidx || { fail "results of the batch_qidx run"; cat "$work/run.log"; }
    grep -q 'batch_qidx recorded but not applied: context_rows cache_only' "$work/run.log" ||
      { fail "no log line for batch_qidx at context_rows cache_only"; cat "$work/run.log"; }
    n=$(grep -c 'recorded but not applied' "$work/run.log")
    ((n == 1)) || { fail "$n 'not applied' lines, expected 1 (the cache_only point)"; cat "$work/run.log"; }
    grep -q 'qidx sel differ' "$work/run.log" || { fail "no qidx column in the summary table"; cat "$work/run.log"; }
    ;;
  teacher)
    out=$work/t.h5
    tiny=$src/experiments/trained-tiny.yaml
    [[ -f $src/data/trained-tiny/meta.json ]] || { echo "SKIPPED: no data/trained-tiny"; exit 77; }
    cd "$src" || exit 1  # the experiment names its model, weights and trace relative to the repository root
    # 8 points: replay x head_fp8 x batch_size, the head vocab-sharded over the 2 ranks (the stats'
    # cross-rank combine), 3 sequences of the trained tiny trace.
    teach=(--set measure.sequences=3 --set measure.warmup_steps=1 --set 'sweep.grid.draft_len=[3]' --set 'sweep.grid.skip=[none]'
           --set 'sweep.grid.context_rows=[cache_only]' --set 'sweep.grid.head_sharding=[vocab]'
           --set 'sweep.grid.replay=[speculative,teacher_forced]' --set 'sweep.grid.batch_size=[1,3]')
    "${launch[@]}" run "$tiny" "${teach[@]}" --out "$out" >"$work/run.log" 2>&1 ||
      { fail "run exited $?"; cat "$work/run.log"; }
    $check "$out" --points 8 --batch || { fail "results of the replay run"; cat "$work/run.log"; }
    "$python" - "$out" "$src/analysis" <<'PY' || fail "teacher-forced rows against the speculative steps"
import sys
sys.path.insert(0, sys.argv[2])
import numpy as np
import mtplab_results as mr
res = mr.Results(sys.argv[1])
div = res.stored_divergence()
pairs = div[div["axis"] == "replay"]
assert len(pairs) == 4, pairs
for t, s_ in zip(pairs["point"], pairs["reference"]):
    st, ss = res.steps(t), res.steps(s_)
    dt, ds = res.drafts(t), res.drafts(s_)
    k = dt.shape[1]
    at = {(q, p): i for i, (q, p) in enumerate(zip(st["sequence"], st["position"]))}
    g = res.group(t)["sequences"]
    want = int(sum(n - 1 - k - pl + 1 for n, pl in zip(g["length"][()], g["prompt_len"][()])))
    assert len(st) == want, f"p{t}: {len(st)} teacher-forced rows, {want} positions"
    for i, (q, p, a) in enumerate(zip(ss["sequence"], ss["position"], ss["accepted"])):
        j = at[(q, p)]
        assert st["accepted"].values[j] == a, f"p{t} at {(q, p)}: accepted {st['accepted'].values[j]} vs {a}"
        n = min(a + 1, k)
        assert (dt[j, :n] == ds[i, :n]).all(), f"p{t} at {(q, p)}: drafts {dt[j]} vs {ds[i]} (accepted {a})"
    rate, lo, hi = res.teacher_forced_rate(t)
    # The trained model drafts its own greedy text about a third of the time at depth 1.
    assert 0.2 < rate[0] < 0.6, rate
    print(f"p{t}: teacher-forced per-depth {np.round(rate, 3)} [{np.round(lo, 3)}, {np.round(hi, 3)}], "
          f"speculative p{s_} tau {float(res.group(s_).attrs['tau']):.3f} {res.interval(s_, 'tau')}")
fp8 = div[div["axis"] == "head_fp8"]
assert len(fp8) == 4 and (fp8["differ_with_margin"] == fp8["differ_any"]).all(), fp8
PY
    # record_margins off: no draft statistics, the same drafts.
    "${launch[@]}" run "$tiny" "${teach[@]}" --set record_margins=off --point 1 --out "$work/off.h5" >"$work/off.log" 2>&1 ||
      { fail "record_margins off exited $?"; cat "$work/off.log"; }
    $check "$work/off.h5" --points 1 || fail "results with record_margins off"
    "$python" - "$work/off.h5" "$out" <<'PY' || fail "record_margins off changed the drafts or kept the datasets"
import sys, h5py
off, on = h5py.File(sys.argv[1], "r")["points"]["p0001"], h5py.File(sys.argv[2], "r")["points"]["p0001"]
assert "draft_margin" not in off and "draft_logprob" not in off and "draft_margin" in on
assert (off["drafts"][()] == on["drafts"][()]).all()
dec = lambda v: v.decode() if isinstance(v, bytes) else v
assert dec(off.attrs["record_margins"]) == "off", off.attrs["record_margins"]
PY
    ;;
  sampling)
    # A synthetic trace sampled at T = 4 (random weights: at T = 1 the drafter and the target
    # agree on little and most a_i are near 0; at T = 4 they spread over (0, 1)); verify greedy /
    # sampling x draft_proposal (the greedy
    # verification's sampled-proposal point is the same point as its greedy one: excluded) x
    # head_sharding x batch_size: 12 points.
    smp=(--set trace.synthetic.sequences=5 --set trace.synthetic.new_tokens=24 --set trace.synthetic.sampling=sampling
         --set trace.synthetic.temperature=4 --set trace.synthetic.sampling_seed=3 --set temperature=4
         --set sampling_seed=5 --set 'sweep.grid.skip=[none]' --set 'sweep.grid.head_fp8=[off]'
         --set 'sweep.grid.context_rows=[cache_only]' --set 'sweep.grid.verify=[greedy,sampling]'
         --set 'sweep.grid.draft_proposal=[greedy,sampled]' --set 'sweep.grid.batch_size=[1,4]'
         --set 'sweep.exclude=[{verify: greedy, draft_proposal: sampled}]' --set measure.warmup_steps=1)
    out=$work/s2.h5
    run "$work/run.log" "${smp[@]}" --out "$out" || { fail "run exited $?"; cat "$work/run.log"; }
    grep -q 'E\[tau\]' "$work/run.log" || { fail "no E[tau] column in the summary table"; cat "$work/run.log"; }
    grep -q 'target log-probabilities: ' "$work/run.log" || { fail "no target log-probabilities line"; cat "$work/run.log"; }
    # The same experiment on one rank: the reference of the 2-rank steps.
    "$mpiexec" -np 1 --bind-to none "$mtplab" run "$exp" "${smp[@]}" --out "$work/s1.h5" >"$work/run1.log" 2>&1 ||
      { fail "1-rank run exited $?"; cat "$work/run1.log"; }
    $check "$work/s1.h5" --world 1 --points 12 --sampling --batch || fail "results of the 1-rank sampling run"
    $check "$out" --points 12 --sampling --batch --sharding-invariant --reference "$work/s1.h5" ||
      { fail "results of the sampling run"; cat "$work/run.log"; }
    # Refusals before anything runs: a sampling point on a greedy trace, or at another temperature.
    if run "$work/bad1.log" "${smp[@]}" --set trace.synthetic.sampling=greedy --out "$work/bad1.h5"; then
      fail "a sampling point on a greedy trace ran"
    fi
    grep -q 'trace.synthetic: verify: sampling (temperature 4, top_k 0, top_p 1) needs a trace sampled' "$work/bad1.log" ||
      { fail "no clear refusal of a greedy trace"; cat "$work/bad1.log"; }
    if run "$work/bad2.log" "${smp[@]}" --set temperature=0.5 --out "$work/bad2.h5"; then
      fail "a sampling point at another temperature ran"
    fi
    grep -q 'this trace was sampled at temperature 4, top_k 0, top_p 1' "$work/bad2.log" ||
      { fail "no clear refusal of a temperature mismatch"; cat "$work/bad2.log"; }
    [[ ! -e $work/bad1.h5 && ! -e $work/bad2.h5 ]] || fail "a refused run left a results file"
    # A trace file: written greedy by `mtplab trace`, then marked as sampled at top_k 1, with the
    # token at position 10 of sequence 0 moved off the argmax: the point is refused, naming the
    # file, the sequence and the position.
    "$mtplab" trace --out "$work/t.h5" --model tiny --sequences 2 --prompt-len 8 --new-tokens 12 --seed 3 \
      --weight-seed 1 >"$work/trace.log" 2>&1 || { fail "mtplab trace exited $?"; cat "$work/trace.log"; }
    "$python" - "$work/t.h5" <<'PY' || fail "marking the trace as sampled"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    f.attrs["sampling"] = np.bytes_(b"sampling")
    f.attrs["temperature"] = np.float64(1.0)
    f.attrs["top_k"] = np.int64(1)
    f.attrs["top_p"] = np.float64(1.0)
    f.attrs["sampling_seed"] = np.int64(0)
    t = f["tokens"]
    t[10] = (int(t[10]) + 1) % int(f.attrs["vocab"])
PY
    file=(--set "trace={path: $work/t.h5}" --set weights.synthetic.seed=1 --set 'sweep.grid.verify=[sampling]'
          --set 'sweep.grid.head_sharding=[none]' --set 'sweep.grid.head_fp8=[off]' --set 'sweep.grid.skip=[none]'
          --set 'sweep.grid.context_rows=[cache_only]' --set temperature=1.0)
    if run "$work/bad3.log" "${file[@]}" --set top_k=2 --out "$work/bad3.h5"; then
      fail "a point at top_k 2 ran on a trace sampled at top_k 1"
    fi
    grep -q "$work/t.h5: verify: sampling at temperature 1, top_k 2, top_p 1 needs a trace sampled" "$work/bad3.log" ||
      { fail "no clear refusal of a top_k mismatch naming the file"; cat "$work/bad3.log"; }
    if run "$work/bad4.log" "${file[@]}" --set top_k=1 --out "$work/bad4.h5"; then
      fail "a trace whose tokens are outside the top-1 support ran"
    fi
    grep -Eq "$work/t.h5: sequence 0, position 10: token [0-9]+ has log p = -inf .* outside the truncated support" \
      "$work/bad4.log" || { fail "no clear refusal of a token outside the support"; cat "$work/bad4.log"; }
    ;;
  *)
    echo "usage: $0 basic|sigterm|sigkill|batch|qidx|teacher|sampling MTPLAB MPIEXEC PYTHON" >&2
    exit 2
    ;;
esac
((failures == 0)) || { echo "$failures failure(s)"; exit 1; }
echo "ok: $mode"
