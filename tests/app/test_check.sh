#!/usr/bin/env bash
# `mtplab check` and the checks `mtplab run` makes before it creates its output, end to end on the
# trained tiny model's checkpoint and trace (copied, then corrupted one way at a time).
#
#   test_check.sh single MTPLAB MPIEXEC PYTHON   one process: check's lines and exit codes; a run
#                                                that fails on its inputs leaves no results file and
#                                                the corrected rerun goes through; NaN weights, NaN
#                                                hiddens, measure.sequences above the trace's count;
#                                                a rerun or merge on other inputs is refused naming
#                                                the key; stale temporaries removed; backend not
#                                                sweepable; check = run: sampling verification on
#                                                a greedy trace or at another temperature, an output
#                                                directory that cannot be written (check and run both
#                                                exit 2, run creates and computes nothing), run's
#                                                advice keeping --set, --out and --point; sampling
#                                                keys under greedy logged; batch_size above the
#                                                sequences read a warning; backend cuda without a
#                                                GPU tells "built without CUDA" from "no driver"
#   test_check.sh np2 MTPLAB MPIEXEC PYTHON      under mpirun -np 2: the verdict is shared (every
#                                                rank exits non-zero), rank 0 prints the report once;
#                                                the advice keeps --ranks 2; an MTPLAB_* variable
#                                                on one rank only refused by check and run
# Exit 77 (skipped) when PYTHON lacks h5py. MTPLAB_SOURCE_DIR = repository root.
set -uo pipefail
mode=$1 mtplab=$2 mpiexec=$3 python=$4
src=${MTPLAB_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
source "$src/tests/common/script.sh"
require_python "$python" h5py

work=$(mktemp -d /tmp/mtplab-check-test.XXXXXX)
cleanup() {
  mountpoint -q "$work/ro" 2>/dev/null && umount "$work/ro"
  chmod -R u+w "$work" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

cp "$src/data/trained-tiny/model.safetensors" "$src/data/trained-tiny/trace.h5" \
   "$src/data/trained-tiny/trained-tiny.yaml" "$work/"
exp=$work/exp.yaml
cat >"$exp" <<EOF
model: $work/trained-tiny.yaml
weights: {checkpoint: $work/model.safetensors}
trace: {path: $work/trace.h5}
measure: {warmup_steps: 1, sequences: 2, max_steps: 4}
output: $work/out/r.h5
backend: cpu
draft_len: 3
EOF

# nan_tensor IN OUT NAME: a copy of checkpoint IN with every element of tensor NAME (BF16) NaN.
nan_tensor() {
  "$python" - "$@" <<'PY'
import json, struct, sys, shutil
src, dst, name = sys.argv[1:4]
shutil.copyfile(src, dst)
with open(dst, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    t = json.loads(f.read(n))[name]
    assert t["dtype"] == "BF16", t
    b, e = t["data_offsets"]
    f.seek(8 + n + b)
    f.write(b"\xc0\x7f" * ((e - b) // 2))
PY
}
# set_hidden FILE ROW COL BITS: one hidden of a trace (uint16 BF16 bits), in place.
set_hidden() {
  "$python" - "$@" <<'PY'
import sys, h5py
path, row, col, bits = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4], 0)
with h5py.File(path, "r+") as f:
    f["hiddens"][row, col] = bits
PY
}
has() { grep -qF -- "$2" "$1" || { fail "$1 lacks: $2"; cat "$1"; }; }
hnorm=model.language_model.layers.45.hnorm.weight

case $mode in
  single)
    # --help names the command.
    "$mtplab" check --help >"$work/help.log" 2>&1 || fail "check --help exited $?"
    has "$work/help.log" "usage: mtplab check EXP.yaml"
    "$mtplab" --help | grep -q '^  check ' || fail "mtplab --help does not list check"

    # 1. Clean inputs: one line per input, OK, exit 0; nothing is created.
    exits "$work/c1.log" 0 "check of clean inputs" "$mtplab" check "$exp"
    has "$work/c1.log" "ok       experiment $exp: 1 point(s) for 1 rank(s), backend cpu"
    has "$work/c1.log" "ok       checkpoint $work/model.safetensors: "
    has "$work/c1.log" "ok       trace $work/trace.h5: 16 sequence(s) of "
    has "$work/c1.log" "ok       output $work/out/r.h5: new file; 1 directory to create under $work (writable)"
    tail -n 1 "$work/c1.log" | grep -qx OK || fail "the clean check does not end with OK"
    [[ ! -e $work/out ]] || fail "check created $work/out"

    # 2. All-NaN hnorm: it used to run to exit 0 drafting token 0 everywhere. Now check names the
    #    tensor and its first bad element, and run refuses before creating anything.
    nan_tensor "$work/model.safetensors" "$work/nan.safetensors" "$hnorm"
    nan=(--set "weights.checkpoint=$work/nan.safetensors")
    exits "$work/c2.log" 2 "check of a NaN checkpoint" "$mtplab" check "$exp" "${nan[@]}"
    has "$work/c2.log" "PROBLEM  checkpoint $work/nan.safetensors"
    has "$work/c2.log" "problem: tensor \"$hnorm\" in $work/nan.safetensors (BF16 [128]): element [0] (flat index 0) is NaN, the first non-finite value"
    has "$work/c2.log" "a shard does not load"
    grep -qx '[0-9]* problem(s)' <(tail -n 1 "$work/c2.log") || fail "no 'N problem(s)' line"
    exits "$work/r2.log" 2 "run on a NaN checkpoint" "$mtplab" run "$exp" "${nan[@]}" --out "$work/nan.h5"
    has "$work/r2.log" "no results file was created"
    [[ ! -e $work/nan.h5 ]] || fail "a run refused on its inputs left $work/nan.h5"

    # 3. A run that fails on its inputs (a missing trace) leaves no file, so the corrected rerun
    #    into the same output is not refused as "a different experiment configuration".
    exits "$work/r3.log" 2 "run on a missing trace" "$mtplab" run "$exp" --set "trace.path=$work/missing.h5" --out "$work/fix.h5"
    has "$work/r3.log" "$work/missing.h5"
    [[ ! -e $work/fix.h5 ]] || fail "a run refused on its inputs left $work/fix.h5"
    "$mtplab" run "$exp" --out "$work/fix.h5" >"$work/r3b.log" 2>&1 || { fail "the corrected rerun exited $?"; cat "$work/r3b.log"; }

    # 4. measure.sequences above the trace's 16 sequences: a problem (it used to replay 16 silently).
    exits "$work/c4.log" 2 "check with measure.sequences=99" "$mtplab" check "$exp" --set measure.sequences=99
    has "$work/c4.log" "problem: measure.sequences 99 exceeds the trace's 16 sequence(s): the points would replay 16 and record 99 (point p0000)"

    # 5. A NaN hidden (sequence 0, position 3, element 5).
    cp "$work/trace.h5" "$work/nan-trace.h5"
    set_hidden "$work/nan-trace.h5" 3 5 0x7fc0
    exits "$work/c5.log" 2 "check of a NaN trace" "$mtplab" check "$exp" --set "trace.path=$work/nan-trace.h5"
    has "$work/c5.log" "problem: $work/nan-trace.h5: sequence 0, position 3 (row 3), element 5: hidden is NaN"

    # 6. A results file never mixes inputs: the same configuration on another trace (one hidden
    #    changed, still finite) is refused, naming the trace; so is a merge of the two.
    "$mtplab" run "$exp" --out "$work/a.h5" >"$work/r6.log" 2>&1 || { fail "run into a.h5 exited $?"; cat "$work/r6.log"; }
    cp "$work/trace.h5" "$work/trace.orig.h5"
    set_hidden "$work/trace.h5" 0 0 0x3f81
    exits "$work/r6b.log" 2 "a rerun on another trace" "$mtplab" run "$exp" --out "$work/a.h5"
    has "$work/r6b.log" "holds results of a different experiment configuration"
    grep -q "trace $work/trace.h5: fnv1a64 [0-9a-f]\{16\} (16 sequences, [0-9]* positions, hidden 128, vocab 4096) (in the file) vs fnv1a64 [0-9a-f]\{16\} (16 sequences" "$work/r6b.log" ||
      { fail "the refusal does not name the trace's fingerprint"; cat "$work/r6b.log"; }
    "$mtplab" run "$exp" --out "$work/b.h5" >"$work/r6c.log" 2>&1 || { fail "run into b.h5 exited $?"; cat "$work/r6c.log"; }
    if "$mtplab" merge "$work/ab.h5" "$work/a.h5" "$work/b.h5" >"$work/m6.log" 2>&1; then
      fail "a merge of files of two traces was accepted"
    fi
    has "$work/m6.log" "they differ in: trace $work/trace.h5: fnv1a64 "
    has "$work/m6.log" "(in $work/a.h5) vs fnv1a64 "
    [[ ! -e $work/ab.h5 ]] || fail "a refused merge left $work/ab.h5"
    cp "$work/trace.orig.h5" "$work/trace.h5"

    # 7. Stale temporaries: a dead writer's is reported by check and removed by the next run, with a
    #    log line; a live process's is left alone.
    sleep 0 &
    dead=$!
    wait "$dead"
    touch "$work/a.h5.tmp.$dead" "$work/a.h5.tmp.$$"
    "$mtplab" check "$exp" --out "$work/a.h5" >"$work/c7.log" 2>&1 || { fail "check of a.h5 exited $?"; cat "$work/c7.log"; }
    has "$work/c7.log" "warning: 1 temporary file(s) of a killed writer ($work/a.h5.tmp.$dead): the next run into this output removes them"
    has "$work/c7.log" "exists, same configuration and inputs: 1 of 1 point(s) done"
    "$mtplab" run "$exp" --out "$work/a.h5" >"$work/r7.log" 2>&1 || { fail "resume of a.h5 exited $?"; cat "$work/r7.log"; }
    has "$work/r7.log" "removed $work/a.h5.tmp.$dead: a temporary file of a killed writer"
    [[ ! -e $work/a.h5.tmp.$dead ]] || fail "the dead writer's temporary is still there"
    [[ -e $work/a.h5.tmp.$$ ]] || fail "a live process's temporary was removed"

    # 8. backend cannot be swept (docs/experiments.md): the code now says so too.
    exits "$work/l8.log" 1 "a swept backend: list" "$mtplab" list "$exp" --set 'sweep.grid.backend=[cpu]'
    has "$work/l8.log" '"backend" cannot be swept'
    has "$work/l8.log" "one run uses one backend"

    # 9. check = run: what run refuses before it starts, check refuses, with the same words and
    #    exit 2; run creates nothing and its advice repeats its own arguments (--set, --out).
    #    both LOG WORDS ARGS...: check and run (into a new file) of ARGS, each exit 2 naming WORDS.
    both() {
      local log=$1 words=$2
      shift 2
      exits "$work/$log.check.log" 2 "check $*" "$mtplab" check "$exp" "$@"
      has "$work/$log.check.log" "$words"
      exits "$work/$log.run.log" 2 "run $*" "$mtplab" run "$exp" "$@" --out "$work/$log.h5"
      has "$work/$log.run.log" "$words"
      has "$work/$log.run.log" "no results file was created"
      [[ ! -e $work/$log.h5 ]] || fail "run $* left $work/$log.h5"
    }
    # Sampling verification on a greedy trace.
    both c9 "$work/trace.h5: verify: sampling (temperature 1, top_k 0, top_p 1) needs a trace sampled with the same settings; this trace's continuations are greedy" \
      --set verify=sampling
    has "$work/c9.run.log" "\`mtplab check $exp --set verify=sampling --out $work/c9.h5\` repeats these checks without running"
    # A temperature other than the trace's (a copy with sampling attributes).
    cp "$work/trace.h5" "$work/sampled.h5"
    "$python" - "$work/sampled.h5" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    f.attrs["sampling"] = np.bytes_(b"sampling")
    f.attrs["temperature"] = np.float64(0.7)
    f.attrs["top_k"] = np.int64(0)
    f.attrs["top_p"] = np.float64(1.0)
    f.attrs["sampling_seed"] = np.int64(5)
PY
    both c10 "this trace was sampled at temperature 0.7, top_k 0, top_p 1" \
      --set "trace.path=$work/sampled.h5" --set verify=sampling --set 'temperature=0.9'
    has "$work/c10.run.log" "\`mtplab check $exp --set trace.path=$work/sampled.h5 --set verify=sampling --set temperature=0.9 --out $work/c10.h5\`"
    exits "$work/c10b.log" 0 "check at the trace's temperature" "$mtplab" check "$exp" \
      --set "trace.path=$work/sampled.h5" --set verify=sampling --set temperature=0.7
    # A value that needs quoting is quoted in the advice; --point is kept.
    exits "$work/c11.log" 2 "run --point 0 on a greedy trace" "$mtplab" run "$exp" --set 'verify= sampling' \
      --point 0 --out "$work/c11.h5"
    has "$work/c11.log" "\`mtplab check $exp --set 'verify= sampling' --out $work/c11.h5 --point 0\`"

    # 10. An output whose directory cannot be written: a new file there, and an existing results file
    #     that the run would add points to (it used to pass check, compute a point, then fail).
    two=(--set 'sweep.grid.draft_len=[2,3]')
    mkdir -p "$work/ro"
    exits "$work/r12.log" 0 "run --point 0 into ro/r.h5" "$mtplab" run "$exp" "${two[@]}" --point 0 --out "$work/ro/r.h5"
    sum=$(sha256sum <"$work/ro/r.h5")
    readonly_dir=""
    if ((EUID != 0)); then
      chmod a-w "$work/ro" && readonly_dir=chmod
    elif mount --bind "$work/ro" "$work/ro" 2>/dev/null; then
      mount -o remount,bind,ro "$work/ro" 2>/dev/null && readonly_dir=mount || umount "$work/ro"
    fi
    if [[ -n $readonly_dir ]]; then
      exits "$work/c12.log" 2 "check of a results file in a read-only directory" "$mtplab" check "$exp" "${two[@]}" --out "$work/ro/r.h5"
      has "$work/c12.log" "exists, same configuration and inputs: 1 of 2 point(s) done"
      has "$work/c12.log" "problem: directory $work/ro is not writable ("
      has "$work/c12.log" "so no point can be added to $work/ro/r.h5"
      exits "$work/r12b.log" 2 "run into a results file in a read-only directory" "$mtplab" run "$exp" "${two[@]}" --out "$work/ro/r.h5"
      has "$work/r12b.log" "$work/ro/r.h5 is unchanged"
      grep -q "point 1/" "$work/r12b.log" && fail "run computed a point it cannot write"
      [[ "$(sha256sum <"$work/ro/r.h5")" == "$sum" ]] || fail "$work/ro/r.h5 changed"
      exits "$work/c12b.log" 2 "check of a new file in a read-only directory" "$mtplab" check "$exp" --out "$work/ro/new.h5"
      has "$work/c12b.log" "problem: directory $work/ro is not writable ("
      [[ $readonly_dir == mount ]] && umount "$work/ro"
      [[ $readonly_dir == chmod ]] && chmod u+w "$work/ro"
    else
      echo "note: no read-only directory here (neither chmod as a user nor a bind mount as root): case 10 skipped"
    fi

    # 11. Nothing silently accepted. Keys a point's verification ignores are logged (sampling settings
    #     under verify: greedy); a batch_size above the sequences read is a warning of check and run.
    exits "$work/l13.log" 0 "list with a temperature under greedy" "$mtplab" list "$exp" --set temperature=0.7 --set top_k=5
    has "$work/l13.log" "temperature (not in effect without verify=sampling): ignored in every point (normalised to its default"
    has "$work/l13.log" "top_k (not in effect without verify=sampling): ignored in every point"
    exits "$work/c14.log" 0 "check with batch_size above the sequences read" "$mtplab" check "$exp" --set batch_size=8
    has "$work/c14.log" "warning: batch_size 8 is above the 2 sequence(s) the point reads: at most 2 run together, so it measures batches of 2 while its configuration says 8 (point p0000)"
    exits "$work/r14.log" 0 "run with batch_size above the sequences read" "$mtplab" run "$exp" --set batch_size=8 --out "$work/b8.h5"
    has "$work/r14.log" "warn: trace $work/trace.h5: batch_size 8 is above the 2 sequence(s) the point reads"
    # 12. backend cuda without a usable GPU: "built without CUDA" only when it is so; a CUDA build
    #     without a driver or device quotes CUDA's error. check and run alike (exit 2, nothing created).
    if "$mtplab" --version | grep -q 'built without CUDA'; then
      both c15 "backend cuda: this mtplab was built without CUDA (MTPLAB_CUDA=OFF or no toolkit)" --set backend=cuda
    else
      # A CUDA build with no device visible, whatever this machine has.
      CUDA_VISIBLE_DEVICES="" both c15 "backend cuda: no usable GPU on host " --set backend=cuda
      grep -q "built without" "$work/c15.check.log" "$work/c15.run.log" && fail "a CUDA build says it was built without CUDA"
    fi
    ;;
  np2)
    launch=("$mpiexec" -np 2 --oversubscribe --bind-to none "$mtplab")
    "${launch[@]}" check "$exp" >"$work/n1.log" 2>&1 || { fail "np2 check of clean inputs exited $?"; cat "$work/n1.log"; }
    has "$work/n1.log" "ok       checkpoint $work/model.safetensors: "
    has "$work/n1.log" "every rank's shard loads"
    nan_tensor "$work/model.safetensors" "$work/nan.safetensors" "$hnorm"
    "${launch[@]}" check "$exp" --set "weights.checkpoint=$work/nan.safetensors" >"$work/n2.log" 2>&1
    rc=$?
    ((rc != 0)) || fail "np2 check of a NaN checkpoint exited 0"
    n=$(grep -c '^PROBLEM  checkpoint' "$work/n2.log")
    ((n == 1)) || { fail "the report was printed $n times, expected once (rank 0)"; cat "$work/n2.log"; }
    n=$(grep -c "problem: .*hnorm.weight" "$work/n2.log")
    ((n == 1)) || { fail "the NaN tensor is named $n times, expected once (the scan, the ranks' loads agree)"; cat "$work/n2.log"; }
    "${launch[@]}" run "$exp" --set "weights.checkpoint=$work/nan.safetensors" --out "$work/nan.h5" >"$work/n3.log" 2>&1
    rc=$?
    ((rc != 0)) || fail "np2 run on a NaN checkpoint exited 0"
    [[ ! -e $work/nan.h5 ]] || fail "an np2 run refused on its inputs left $work/nan.h5"
    # An MTPLAB_* variable set on one rank only: check and run refuse it, naming the variable and the
    # ranks (a kernel variable used to become the point's recorded policy, from rank 0 alone).
    one_rank=("$mpiexec" -np 2 --oversubscribe --bind-to none sh -c \
      'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then export MTPLAB_GEMV_VARIANT=v1 MTPLAB_LOG=debug; fi; exec "$0" "$@"' "$mtplab")
    "${one_rank[@]}" check "$exp" >"$work/n5.log" 2>&1
    rc=$?
    ((rc == 2)) || { fail "np2 check with a variable on rank 1 only exited $rc, expected 2"; cat "$work/n5.log"; }
    has "$work/n5.log" "problem: MTPLAB_GEMV_VARIANT is not the same on every rank: unset on rank 0 ("
    has "$work/n5.log" "; \"v1\" on rank 1 ("
    has "$work/n5.log" "problem: MTPLAB_LOG is not the same on every rank: unset on rank 0 ("
    "${one_rank[@]}" run "$exp" --out "$work/env.h5" >"$work/n6.log" 2>&1
    rc=$?
    ((rc == 2)) || { fail "np2 run with a variable on rank 1 only exited $rc, expected 2"; cat "$work/n6.log"; }
    has "$work/n6.log" "MTPLAB_GEMV_VARIANT is not the same on every rank"
    [[ ! -e $work/env.h5 ]] || fail "a run with a variable on one rank only left $work/env.h5"
    # The advice keeps the run's rank count, --set and --out.
    has "$work/n3.log" "\`mtplab check $exp --ranks 2 --set weights.checkpoint=$work/nan.safetensors --out $work/nan.h5\` repeats these checks"
    "${launch[@]}" run "$exp" --out "$work/ok.h5" >"$work/n4.log" 2>&1 || { fail "np2 run exited $?"; cat "$work/n4.log"; }
    ;;
  *)
    echo "unknown mode $mode"
    exit 2
    ;;
esac

((failures == 0)) || { echo "$failures failure(s)"; exit 1; }
echo "all checks passed ($mode)"
