#!/usr/bin/env bash
# The output rule (lib/io/output.hpp) and full disks (lib/io/hdf5.cpp), end to end on the binary.
#
#   test_outputs.sh rule MTPLAB       every writer (run, merge, upgrade, trace): a file of another kind is
#                                     never replaced (exit 1 / 2, the file byte-identical); its own
#                                     kind only with --force; an input under another spelling or a
#                                     link is refused; a link is written through (it stays a link)
#                                     and a dangling one refused
#   test_outputs.sh full_disk MTPLAB  creating a results file, appending to one, merge and trace on
#                                     a full tmpfs: "no space left on device", exit 1, no signal, no
#                                     temporary left. Skipped (exit 77) unless root and tmpfs mounts.
#   test_outputs.sh writers MTPLAB    two runs into one output a few seconds apart: the second is
#                                     refused before it computes anything (exit 2, naming the first
#                                     run's pid and command), `check`, a merge --force and an
#                                     upgrade --force into it say so too; after it ends a rerun
#                                     computes nothing; a run killed by SIGKILL leaves no claim
set -uo pipefail
mode=$1 mtplab=$2
src=${MTPLAB_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
source "$src/tests/common/script.sh"

work=$(mktemp -d /tmp/mtplab-outputs-test.XXXXXX)
mnt=$work/full
cleanup() {
  mountpoint -q "$mnt" 2>/dev/null && umount "$mnt"
  rm -rf "$work"
}
trap cleanup EXIT
cd "$work" || exit 1

# One point, two steps: a results file in a second.
cp "$src/tests/harness/synthetic-quickstart.yaml" exp.yaml
small=(--set measure.sequences=1 --set measure.max_steps=2 --set 'sweep.grid.skip=[none]'
       --set 'sweep.grid.context_rows=[full]' --set 'sweep.grid.head_fp8=[off]'
       --set 'sweep.grid.head_sharding=[none]')
tr=(--sequences 2 --prompt-len 8 --new-tokens 8)

# has LOG TEXT: LOG holds TEXT.
has() { grep -qF -- "$2" "$1" || { fail "$1 lacks: $2"; cat "$1"; }; }
# same FILE SUM: FILE's checksum is still SUM (untouched).
same() { [[ "$(sha256sum <"$1")" == "$2" ]] || fail "$1 was changed"; }

if [[ $mode == rule ]]; then
  exits run.log 0 "run into a new file" "$mtplab" run exp.yaml "${small[@]}" --out r.h5
  exits trace.log 0 "trace into a new file" "$mtplab" trace --out t.h5 "${tr[@]}"
  echo "my notes" >notes.txt
  r=$(sha256sum <r.h5) t=$(sha256sum <t.h5) n=$(sha256sum <notes.txt) e=$(sha256sum <exp.yaml)

  # trace: another kind never (with --force neither), its own kind only with --force.
  exits l 1 "trace --out RESULTS" "$mtplab" trace --out r.h5 "${tr[@]}"
  has l "r.h5: exists and is an mtplab results file, not a trace; mtplab trace never replaces another kind"
  exits l 1 "trace --out RESULTS --force" "$mtplab" trace --out r.h5 "${tr[@]}" --force
  has l "not even with --force"
  exits l 1 "trace --out TEXT" "$mtplab" trace --out notes.txt "${tr[@]}" --force
  has l "notes.txt: exists and is a file that is not HDF5"
  exits l 1 "trace --out TRACE" "$mtplab" trace --out t.h5 "${tr[@]}"
  has l "t.h5: exists (a trace); mtplab trace replaces it only with --force"
  same r.h5 "$r"; same notes.txt "$n"; same t.h5 "$t"
  exits l 0 "trace --out TRACE --force" "$mtplab" trace --out t.h5 "${tr[@]}" --force

  # Links: followed (the link stays a link), a dangling one refused and left alone.
  ln -s t.h5 link.h5
  exits l 0 "trace --out LINK-TO-TRACE --force" "$mtplab" trace --out link.h5 "${tr[@]}" --force
  [[ -L link.h5 && $(readlink link.h5) == t.h5 ]] || fail "trace replaced the link link.h5"
  ln -s nowhere.h5 dangling.h5
  exits l 1 "trace --out DANGLING-LINK" "$mtplab" trace --out dangling.h5 "${tr[@]}" --force
  has l "dangling.h5: is a symbolic link to nowhere.h5, which does not exist"
  [[ -L dangling.h5 && ! -e nowhere.h5 ]] || fail "trace wrote through or replaced dangling.h5"

  # merge: an input under another spelling or a link; another kind; its own kind without --force.
  mkdir sub
  exits l 1 "merge into an input (another spelling)" "$mtplab" merge ./sub/../r.h5 r.h5 --force
  has l "is also an input of mtplab merge (r.h5"
  ln -s r.h5 rlink.h5
  exits l 1 "merge into an input (a link)" "$mtplab" merge rlink.h5 r.h5 --force
  has l "is also an input of mtplab merge"
  exits l 1 "merge --out TRACE --force" "$mtplab" merge t.h5 r.h5 --force
  has l "t.h5: exists and is an mtplab trace, not a results file; mtplab merge never replaces"
  exits l 1 "merge --out TEXT --force" "$mtplab" merge notes.txt r.h5 --force
  exits l 0 "merge into a new file" "$mtplab" merge m.h5 r.h5
  m=$(sha256sum <m.h5)
  exits l 1 "merge into an existing results file" "$mtplab" merge m.h5 r.h5
  has l "m.h5: exists (a results file); mtplab merge replaces it only with --force"
  same m.h5 "$m"
  ln -s m.h5 mlink.h5
  exits l 0 "merge --force into a link to a results file" "$mtplab" merge mlink.h5 r.h5 --force
  [[ -L mlink.h5 ]] || fail "merge replaced the link mlink.h5"

  # upgrade: the same rule for NEW.h5 (OLD.h5 is the version-2 file of tests/data).
  cp "$src/tests/data/results-v2.h5" old.h5
  o=$(sha256sum <old.h5) t=$(sha256sum <t.h5)
  exits l 1 "upgrade into the input (another spelling)" "$mtplab" upgrade old.h5 ./sub/../old.h5 --force
  has l "is also an input of mtplab upgrade (old.h5"
  exits l 1 "upgrade --out TRACE --force" "$mtplab" upgrade old.h5 t.h5 --force
  has l "t.h5: exists and is an mtplab trace, not a results file; mtplab upgrade never replaces"
  exits l 1 "upgrade --out TEXT --force" "$mtplab" upgrade old.h5 notes.txt --force
  exits l 0 "upgrade into a new file" "$mtplab" upgrade old.h5 u.h5
  u=$(sha256sum <u.h5)
  exits l 1 "upgrade into an existing results file" "$mtplab" upgrade old.h5 u.h5
  has l "u.h5: exists (a results file); mtplab upgrade replaces it only with --force"
  same u.h5 "$u"; same old.h5 "$o"; same t.h5 "$t"; same notes.txt "$n"
  ln -s u.h5 ulink.h5
  exits l 0 "upgrade --force into a link to a results file" "$mtplab" upgrade old.h5 ulink.h5 --force
  [[ -L ulink.h5 ]] || fail "upgrade replaced the link ulink.h5"

  # run: another kind (exit 2: an input problem, nothing ran), an input, a link (resumed through).
  t=$(sha256sum <t.h5)
  exits l 2 "run --out TRACE" "$mtplab" run exp.yaml "${small[@]}" --out t.h5
  has l "t.h5: exists and is an mtplab trace, not a results file; mtplab run never replaces"
  exits l 2 "run --out EXPERIMENT" "$mtplab" run exp.yaml "${small[@]}" --out ./sub/../exp.yaml
  has l "is also an input of mtplab run (exp.yaml"
  exits l 2 "check --out TRACE" "$mtplab" check exp.yaml "${small[@]}" --out t.h5
  has l "t.h5: exists and is an mtplab trace"
  same t.h5 "$t"; same exp.yaml "$e"; same notes.txt "$n"
  ln -s r.h5 resume.h5
  exits l 0 "run --out LINK-TO-RESULTS (resumed)" "$mtplab" run exp.yaml "${small[@]}" --out resume.h5
  [[ -L resume.h5 ]] || fail "run replaced the link resume.h5"
  ls ./*.tmp.* >/dev/null 2>&1 && fail "temporaries left: $(ls ./*.tmp.*)"
fi

if [[ $mode == full_disk ]]; then
  ((EUID == 0)) || { echo "SKIPPED: mounting a small tmpfs needs root"; exit 77; }
  mkdir -p "$mnt"
  # small_disk SIZE: an empty tmpfs of SIZE at $mnt.
  small_disk() {
    mountpoint -q "$mnt" && umount "$mnt"
    mount -t tmpfs -o "size=$1" tmpfs "$mnt" 2>/dev/null || { echo "SKIPPED: cannot mount a tmpfs"; exit 77; }
  }
  # full WHAT CMD...: CMD fails with exit 1 (not a signal) saying "no space left on device", and
  # leaves no temporary.
  full() {
    local what=$1
    shift
    exits full.log 1 "$what on a full disk" "$@"
    has full.log "no space left on device"
    grep -q "Segmentation\|signal" full.log && { fail "$what: a signal"; cat full.log; }
    ls "$mnt"/*.tmp.* >/dev/null 2>&1 && fail "$what left a temporary: $(ls "$mnt"/*.tmp.*)"
  }
  exits run.log 0 "run into a new file" "$mtplab" run exp.yaml "${small[@]}" --out r.h5

  small_disk 16k  # room for the file, not for its flush at commit
  full "run (creating the results file)" "$mtplab" run exp.yaml "${small[@]}" --out "$mnt/r.h5"
  small_disk 48k  # room for the empty results file, not for its copy to append the point
  full "run (appending a point)" "$mtplab" run exp.yaml "${small[@]}" --out "$mnt/r.h5"
  small_disk 16k
  full "merge" "$mtplab" merge "$mnt/m.h5" r.h5
  full "upgrade" "$mtplab" upgrade "$src/tests/data/results-v2.h5" "$mnt/u.h5"
  small_disk 1m  # the trace is larger: a write fails half-way
  full "trace" "$mtplab" trace --out "$mnt/t.h5" --sequences 64 --prompt-len 32 --new-tokens 200
  [[ -e $mnt/t.h5 ]] && fail "trace left $mnt/t.h5 on a full disk"
fi

if [[ $mode == writers ]]; then
  # A run long enough (8 points, a few seconds each here) that the second starts while it runs.
  long=(--set trace.synthetic.new_tokens=60 --set 'sweep.grid.skip=[none]' --set measure.repeats=8)
  # wait_for LOG PID PATTERN: until LOG holds PATTERN (0), or PID ends / 120 s pass (1).
  wait_for() {
    local i
    for ((i = 0; i < 1200; i++)); do
      grep -q -- "$3" "$1" && return 0
      kill -0 "$2" 2>/dev/null || { grep -q -- "$3" "$1"; return; }
      sleep 0.1
    done
    return 1
  }
  "$mtplab" run exp.yaml "${long[@]}" --out w.h5 >a.log 2>&1 &
  a=$!
  wait_for a.log $a "point 2/8" || { fail "the first run did not reach its second point"; cat a.log; }
  kill -0 $a 2>/dev/null || fail "the first run ended too soon for this test"
  exits b.log 2 "a second run into the same output" "$mtplab" run exp.yaml "${long[@]}" --out w.h5
  has b.log "w.h5: another run is writing this output (pid $a on host "
  has b.log ": mtplab run exp.yaml --set"
  has b.log "two runs into one output would compute the same points twice"
  has b.log "w.h5 is unchanged"
  grep -q "point 1/" b.log && fail "the second run computed a point"
  exits c.log 2 "check while a run writes the output" "$mtplab" check exp.yaml "${long[@]}" --out w.h5
  has c.log "another run is writing this output (pid $a on host "
  exits m.log 1 "merge --force into the output of a live run" "$mtplab" merge w.h5 other.h5 --force
  has m.log "w.h5: another run is writing this output (pid $a on host "
  exits u.log 1 "upgrade --force into the output of a live run" "$mtplab" upgrade other.h5 w.h5 --force
  has u.log "w.h5: another run is writing this output (pid $a on host "
  wait $a
  rc=$?
  ((rc == 0)) || { fail "the first run exited $rc"; cat a.log; }
  [[ -e w.h5.lock ]] && fail "the claim w.h5.lock is left after the run"
  exits d.log 0 "a rerun after the first ended" "$mtplab" run exp.yaml "${long[@]}" --out w.h5
  has d.log "running 0 (8 already in the file)"
  # SIGKILL: the kernel releases the claim; a rerun resumes.
  "$mtplab" run exp.yaml "${long[@]}" --out k.h5 >k.log 2>&1 &
  k=$!
  wait_for k.log $k "point 2/8" || { fail "the run to kill did not reach its second point"; cat k.log; }
  kill -KILL $k
  wait $k 2>/dev/null
  exits k2.log 0 "a rerun after a SIGKILL" "$mtplab" run exp.yaml "${long[@]}" --out k.h5
  has k2.log "already in the file"
fi

((failures == 0)) || { echo "$failures failure(s)"; exit 1; }
echo "all passed"
