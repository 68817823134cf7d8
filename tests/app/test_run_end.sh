#!/usr/bin/env bash
# How `mtplab run` ends: with an error, a signal or a stuck rank, and the exit code
# `mtplab run --help` states for each (tests/harness/synthetic-quickstart.yaml, shrunk).
#
#   test_run_end.sh errors   MTPLAB MPIEXEC PYTHON   under mpirun -np 2: a bad experiment, a bad
#                                                    option, a refused results file and a --point
#                                                    out of range are each printed once (rank 0),
#                                                    exit 1, no MPI_Abort, no source location
#   test_run_end.sh sigint   ...   one process, SIGINT (a Ctrl-C): note at once, "interrupted by
#                                  signal 2 (Interrupt)", exit 130, the file valid
#   test_run_end.sh sigterm  ...   one process, SIGTERM: exit 143, no temporary file left
#   test_run_end.sh second   ...   one process, a second SIGTERM during the graceful stop (while the
#                                  synthetic trace is generated): stops at once, exit 143, a note,
#                                  the file still valid with its points; a rerun resumes
#   test_run_end.sh agree    ...   mpirun -np 2, SIGINT to rank 1 and SIGTERM to rank 0 (their own
#                                  signals, not mpirun's): the ranks agree on SIGINT, exit 130
#   test_run_end.sh launcher ...   mpirun -np 2, SIGINT to mpirun (what a terminal's Ctrl-C does):
#                                  the ranks get mpirun's SIGTERM, and the note says it came from
#                                  mpirun and why
#   test_run_end.sh startup  ...   mpirun -np 2, rank 1 stopped (SIGSTOP) before mtplab starts, while
#                                  rank 0 waits in MPI initialisation: the job ends within
#                                  MTPLAB_STARTUP_TIMEOUT_S (3 s) + a margin, exit 124, rank 0 names
#                                  rank 1 as stopped; no results file
#   test_run_end.sh stop     ...   mpirun -np 2, rank 1 stopped (SIGSTOP) mid-run: the job ends
#                                  within MTPLAB_COLLECTIVE_TIMEOUT_S (3 s) + a margin, exit 124,
#                                  rank 0 names the collective and rank 1; the file valid
# Exit 77 (skipped) when PYTHON lacks h5py / pandas. MTPLAB_SOURCE_DIR = repository root.
set -uo pipefail
mode=$1 mtplab=$2 mpiexec=$3 python=$4
src=${MTPLAB_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
source "$src/tests/common/script.sh"
check="$python $src/tests/harness/check_results.py"
world=2
case $mode in sigint | sigterm | second) world=1 ;; esac
check="$check --world $world"
require_python "$python" h5py pandas

work=$(mktemp -d /tmp/mtplab-end-test.XXXXXX)
stopped=""  # a rank this test stopped, killed on exit whatever happened
cleanup() {
  [[ -n $stopped ]] && kill -KILL "$stopped" 2>/dev/null
  [[ -n ${KEEP:-} ]] && echo "kept $work" || rm -rf "$work"
}
trap cleanup EXIT
exp=$src/tests/harness/synthetic-quickstart.yaml
launch=("$mpiexec" -np 2 --oversubscribe --bind-to none "$mtplab")
# 8 points, long enough that a run is still going when the test acts.
long=(--set trace.synthetic.new_tokens=60 --set 'sweep.grid.skip=[none]' --set measure.repeats=4)
has() { grep -qE -- "$2" "$1" || { fail "$3"; cat "$1"; }; }
count() { grep -cE -- "$2" "$1"; }

# wait_for LOG PID PATTERN [TENTHS]: until LOG matches PATTERN (0), or the job ends / time passes (1).
wait_for() {
  local i n=${4:-1200}
  for ((i = 0; i < n; i++)); do
    grep -qE -- "$3" "$1" && return 0
    kill -0 "$2" 2>/dev/null || { grep -qE -- "$3" "$1"; return; }
    sleep 0.1
  done
  return 1
}

# finish PID SECONDS: waits for PID (a child of this shell) at most SECONDS; sets rc to its exit
# code, or to "hung".
finish() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    if ! kill -0 "$1" 2>/dev/null; then
      wait "$1"
      rc=$?
      return
    fi
    sleep 0.1
  done
  rc=hung
}

# rank_pid MPIRUN_PID RANK: the pid of that world rank among mpirun's children.
rank_pid() {
  local p
  for p in $(ps -o pid= --ppid "$1"); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$p"
      return
    fi
  done
}

case $mode in
  errors)
    # A misspelt key: every rank reads the file, rank 0 alone prints, nobody aborts.
    sed 's/^trace:/trce:/' "$exp" >"$work/typo.yaml"
    "${launch[@]}" run "$work/typo.yaml" --out "$work/x.h5" >"$work/typo.log" 2>&1
    rc=$?
    ((rc == 1)) || fail "a bad experiment under mpirun exited $rc, expected 1"
    n=$(count "$work/typo.log" 'missing required key "trace"')
    ((n == 1)) || { fail "the error was printed $n times"; cat "$work/typo.log"; }
    has "$work/typo.log" '^\[rank 0@[^]]+\] [^ ]*typo.yaml:[0-9]+:1: trce: missing required key "trace" \(did you mean "trace" instead of "trce"\?\)$' \
      "the message is not rank 0's, at the misspelt key, without a source location"
    if grep -q 'MPI_ABORT' "$work/typo.log"; then fail "an error every rank knows ended with MPI_Abort"; cat "$work/typo.log"; fi
    # A bad option, before MPI is up: once, and without a rank tag.
    "${launch[@]}" run "$exp" --pont 1 >"$work/opt.log" 2>&1
    rc=$?
    ((rc == 1)) || fail "a bad option under mpirun exited $rc, expected 1"
    n=$(count "$work/opt.log" 'unknown option "--pont"')
    ((n == 1)) || { fail "the option error was printed $n times"; cat "$work/opt.log"; }
    has "$work/opt.log" '^mtplab run: unknown option "--pont", did you mean --point\?' "the option error is tagged"
    # A results file of another configuration: rank 0 alone reads it; the refusal is agreed.
    small=(--set trace.synthetic.new_tokens=16 --set 'sweep.grid.skip=[none]' --set measure.warmup_steps=1)
    "${launch[@]}" run "$exp" "${small[@]}" --point 0 --out "$work/a.h5" >"$work/a.log" 2>&1 ||
      { fail "a one-point run exited $?"; cat "$work/a.log"; }
    "${launch[@]}" run "$exp" "${small[@]}" --set measure.max_steps=3 --point 0 --out "$work/a.h5" \
      >"$work/other.log" 2>&1
    rc=$?
    # The input check before the run reports it (exit 2: nothing ran), once, by rank 0.
    ((rc == 2)) || fail "a refused results file exited $rc, expected 2"
    n=$(count "$work/other.log" 'holds results of a different experiment configuration')
    ((n == 1)) || { fail "the refusal was printed $n times"; cat "$work/other.log"; }
    if grep -q 'MPI_ABORT' "$work/other.log"; then fail "the refusal ended with MPI_Abort"; cat "$work/other.log"; fi
    "${launch[@]}" run "$exp" "${small[@]}" --point 99 --out "$work/b.h5" >"$work/range.log" 2>&1
    rc=$?
    ((rc == 1)) || fail "--point 99 exited $rc, expected 1"
    n=$(count "$work/range.log" '--point 99 is out of range: the experiment has 8 point\(s\), 0..7')
    ((n == 1)) || { fail "the range error was printed $n times"; cat "$work/range.log"; }
    ;;
  sigint | sigterm)
    sig=${mode#sig}
    sig=${sig^^}
    [[ $mode == sigint ]] && want=130 || want=143
    : >"$work/run.log"
    "$mtplab" run "$exp" "${long[@]}" --out "$work/q.h5" >"$work/run.log" 2>&1 &
    pid=$!
    wait_for "$work/run.log" "$pid" ') done in' || { fail "no point finished"; cat "$work/run.log"; }
    kill "-$sig" "$pid"
    finish "$pid" 120
    [[ $rc == "$want" ]] || { fail "SIG$sig: exit $rc, expected $want"; cat "$work/run.log"; }
    num=$([[ $sig == INT ]] && echo 2 || echo 15)
    has "$work/run.log" "^\[rank 0@[^]]+\] signal $num \([A-Za-z]+\): stopping at the next step boundary; .*q.h5 keeps every completed point" \
      "no note at the signal"
    has "$work/run.log" "interrupted by signal $num \([A-Za-z]+\) after [0-9]+ point\(s\) this run" "no interruption message"
    ls "$work"/q.h5.tmp.* >/dev/null 2>&1 && fail "a clean stop left a temporary file"
    $check "$work/q.h5" --at-most 8 || fail "the interrupted file"
    ;;
  second)
    # A trace that takes seconds to generate (about 5 s on an idle core), so that both signals land
    # while it is made: the graceful stop waits for the first step boundary, after it. Few steps
    # per point, so that the first run is short.
    gen=(--set trace.synthetic.sequences=32 --set trace.synthetic.layers=16 --set trace.synthetic.new_tokens=40
         --set measure.max_steps=5 --set 'sweep.grid.skip=[none]')
    "$mtplab" run "$exp" "${gen[@]}" --point 0 --out "$work/q.h5" >"$work/first.log" 2>&1 ||
      { fail "the first run exited $?"; cat "$work/first.log"; }
    : >"$work/run.log"
    "$mtplab" run "$exp" "${gen[@]}" --out "$work/q.h5" >"$work/run.log" 2>&1 &
    pid=$!
    wait_for "$work/run.log" "$pid" '\(p1\) ' || { fail "point p1 never started"; cat "$work/run.log"; }
    kill -TERM "$pid"
    wait_for "$work/run.log" "$pid" 'stopping at the next step boundary' 100 || fail "no note after the first SIGTERM"
    kill -TERM "$pid"
    finish "$pid" 30
    [[ $rc == 143 ]] || { fail "two SIGTERMs: exit $rc, expected 143"; cat "$work/run.log"; }
    has "$work/run.log" '^\[rank 0@[^]]+\] signal 15 \(Terminated\) again: stopping now, exit 143; .*q.h5 keeps every completed point, since a point is written whole or not at all \(no temporary file is left\)$' \
      "no note at the second SIGTERM"
    if grep -q 'interrupted by signal' "$work/run.log"; then fail "the second signal did not stop at once"; fi
    ls "$work"/q.h5.tmp.* >/dev/null 2>&1 && fail "two SIGTERMs left a temporary file: $(ls "$work"/q.h5.tmp.*)"
    $check "$work/q.h5" --at-most 8 || fail "the file after two SIGTERMs"
    "$mtplab" run "$exp" "${gen[@]}" --point 0 --out "$work/q.h5" >"$work/resume.log" 2>&1 ||
      { fail "a rerun exited $?"; cat "$work/resume.log"; }
    has "$work/resume.log" 'already in the results file, skipped' "the rerun did not find the point written before"
    ;;
  agree)
    : >"$work/run.log"
    "${launch[@]}" run "$exp" "${long[@]}" --out "$work/q.h5" >"$work/run.log" 2>&1 &
    pid=$!
    wait_for "$work/run.log" "$pid" ') done in' || { fail "no point finished"; cat "$work/run.log"; }
    r0=$(rank_pid "$pid" 0) r1=$(rank_pid "$pid" 1)
    [[ -n $r0 && -n $r1 ]] || fail "rank processes not found under mpirun $pid"
    kill -INT "$r1"
    kill -TERM "$r0"
    finish "$pid" 120
    [[ $rc == 130 ]] || { fail "SIGINT + SIGTERM: mpirun exited $rc, expected 130 (the ranks' 128 + SIGINT)"; cat "$work/run.log"; }
    has "$work/run.log" 'interrupted by signal 2 \(Interrupt\)' "the ranks did not agree on SIGINT"
    $check "$work/q.h5" --at-most 8 || fail "the interrupted file"
    ;;
  launcher)
    : >"$work/run.log"
    "${launch[@]}" run "$exp" "${long[@]}" --out "$work/q.h5" >"$work/run.log" 2>&1 &
    pid=$!
    wait_for "$work/run.log" "$pid" ') done in' || { fail "no point finished"; cat "$work/run.log"; }
    kill -INT "$pid"
    finish "$pid" 120
    [[ $rc != hung && $rc != 0 ]] || { fail "SIGINT to mpirun: exit $rc"; cat "$work/run.log"; }
    has "$work/run.log" "^\[rank 0@[^]]+\] signal 15 \(Terminated\) from $(basename "$mpiexec"), the launcher \(Open MPI's stops a job with SIGTERM for a Ctrl-C, a SIGTERM or a SIGHUP it receives\): stopping at the next step boundary" \
      "the note does not say that the SIGTERM came from mpirun"
    $check "$work/q.h5" --at-most 8 || fail "the interrupted file"
    ;;
  startup)
    # Rank 1 stops before it starts mtplab (a wrapper shell stops itself, then would exec it).
    export MTPLAB_STARTUP_TIMEOUT_S=3
    t0=$(date +%s)
    "$mpiexec" -np 2 --oversubscribe --bind-to none sh -c \
      'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then kill -STOP $$; fi; exec "$0" "$@"' \
      "$mtplab" run "$exp" "${long[@]}" --out "$work/q.h5" >"$work/run.log" 2>&1 &
    pid=$!
    finish "$pid" 60
    elapsed=$(($(date +%s) - t0))
    if [[ $rc == hung ]]; then  # end what is left: mpirun, and the stopped rank by its pid
      stopped=$(rank_pid "$pid" 1)
      kill -TERM "$pid" 2>/dev/null
    fi
    echo "the job ended after ${elapsed} s with exit $rc"
    [[ $rc == 124 ]] || { fail "a rank stopped at start-up: exit $rc, expected 124"; cat "$work/run.log"; }
    ((elapsed <= 3 + 20)) || fail "the job took ${elapsed} s to end after a 3 s start-up timeout"
    has "$work/run.log" '^\[rank 0@[^]]+\] start-up did not complete within 3 s \(MTPLAB_STARTUP_TIMEOUT_S\): waiting in MPI initialisation \(MPI_Init_thread\), which needs every rank of the job; rank 1 is stopped \(pid [0-9]+ on this host: SIGSTOP, a debugger or a suspended job\); ending the job$' \
      "rank 0 did not name rank 1 as stopped at start-up"
    n=$(count "$work/run.log" 'start-up did not complete')
    ((n == 1)) || { fail "the start-up timeout was reported $n times"; cat "$work/run.log"; }
    [[ -e $work/q.h5 ]] && fail "a job that never started left $work/q.h5"
    ;;
  stop)
    export MTPLAB_COLLECTIVE_TIMEOUT_S=3
    : >"$work/run.log"
    "${launch[@]}" run "$exp" "${long[@]}" --out "$work/q.h5" >"$work/run.log" 2>&1 &
    pid=$!
    wait_for "$work/run.log" "$pid" ') done in' || { fail "no point finished"; cat "$work/run.log"; }
    stopped=$(rank_pid "$pid" 1)
    [[ -n $stopped ]] || fail "rank 1 not found under mpirun $pid"
    t0=$(date +%s)
    kill -STOP "$stopped"
    finish "$pid" 60
    elapsed=$(($(date +%s) - t0))
    echo "the job ended after ${elapsed} s with exit $rc"
    [[ $rc == 124 ]] || { fail "a stopped rank: exit $rc, expected 124"; cat "$work/run.log"; }
    ((elapsed <= 3 + 20)) || fail "the job took ${elapsed} s to end after a 3 s timeout"
    has "$work/run.log" '^\[rank 0@[^]]+\] MPI .+ did not complete within 3 s \(MTPLAB_COLLECTIVE_TIMEOUT_S, group of 2 rank\(s\)\): rank 1 has not arrived \(no answer within 0.5 s: stopped, hung, or busy outside a collective\); ending the job$' \
      "rank 0 did not name the collective and rank 1"
    # Once: rank 1, continued by the job's end, does not report its own wait for the time it was
    # stopped.
    n=$(count "$work/run.log" 'did not complete within')
    ((n == 1)) || { fail "the timeout was reported $n times"; cat "$work/run.log"; }
    $check "$work/q.h5" --at-most 8 || fail "the file after the timeout"
    ;;
  *)
    echo "unknown mode $mode"
    exit 2
    ;;
esac
((failures == 0)) || { echo "$failures failure(s)"; exit 1; }
echo "ok: $mode"
