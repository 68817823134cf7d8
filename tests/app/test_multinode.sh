#!/usr/bin/env bash
# Two nodes on one machine, under mpirun: a hostfile of this host and a second name, whose daemon
# (orted) Open MPI's rsh launcher starts through tests/common/fake_ssh.sh, here, in a UTS namespace
# of that name. So the two nodes have two host names and separate process trees, and their ranks
# talk over TCP (--mca btl tcp,self); no network setting is changed.
#
#   test_multinode.sh MTPLAB MPIEXEC PYTHON
#
# - `mtplab info` on 4 ranks, 2 per node: "4 rank(s) on 2 node(s)", hosts HOST HOST N2 N2, local
#   ranks 0 1 0 1, every device cpu;
# - `mtplab run` of a small experiment on the two nodes: its results (the drafts, accepted counts
#   and acceptance figures: tests/harness/cpu_digest.py) equal those of the same run on one node
#   with 4 ranks; the provenance's hosts are HOST HOST N2 N2;
# - the second node dies mid-run (its daemon and its ranks killed at once): the job ends on every
#   rank within 30 s, non-zero, mpirun's report names the node that was lost, and no process of
#   the job is left (mpirun ends the ranks left with SIGTERM, then SIGKILL).
# Exit 77 (skipped) when PYTHON lacks h5py, or no UTS namespace can be made here (unshare --uts
# needs root, or user namespaces). MTPLAB_SOURCE_DIR = repository root.
set -uo pipefail
mtplab=$1 mpiexec=$2 python=$3
src=${MTPLAB_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
source "$src/tests/common/script.sh"
require_python "$python" h5py
agent=$src/tests/common/fake_ssh.sh
if ((EUID == 0)); then
  unshare --uts true 2>/dev/null || { echo "SKIPPED: unshare --uts fails here"; exit 77; }
else
  unshare --user --map-root-user --uts true 2>/dev/null ||
    { echo "SKIPPED: no user namespace for a second host name"; exit 77; }
fi

work=$(mktemp -d /tmp/mtplab-multinode-test.XXXXXX)
job=""  # an mpirun of this test, ended on exit whatever happened
cleanup() {
  [[ -n $job ]] && kill -TERM "$job" 2>/dev/null
  [[ -n ${KEEP:-} ]] && echo "kept $work" || rm -rf "$work"
}
trap cleanup EXIT
cd "$work" || exit 1

host=$(hostname)
node2=mtplab-node2
printf '%s slots=2\n%s slots=2\n' "$host" "$node2" >hosts
two_nodes=("$mpiexec" --hostfile hosts -np 4 --map-by ppr:2:node --bind-to none --mca plm_rsh_agent "$agent"
           --mca btl tcp,self "$mtplab")
one_node=("$mpiexec" -np 4 --oversubscribe --bind-to none --mca btl tcp,self "$mtplab")
exp=$src/tests/harness/synthetic-quickstart.yaml
small=(--set trace.synthetic.new_tokens=16 --set 'sweep.grid.skip=[none]' --set 'sweep.grid.head_fp8=[off]'
       --set measure.warmup_steps=1)
has() { grep -qE -- "$2" "$1" || { fail "$1 lacks: $2"; cat "$1"; }; }

# info: two nodes, two ranks each, local ranks per node.
exits info.log 0 "info on two nodes" "${two_nodes[@]}" info
has info.log '^mtplab [0-9.]+, 4 rank\(s\) on 2 node\(s\), backend cpu'
rows=$(awk '$2 ~ /^[0-3]$/ && $4 == "cpu" { print $1, $2, $3 }' info.log | sort -k2n | paste -sd ' ')
[[ $rows == "$host 0 0 $host 1 1 $node2 2 0 $node2 3 1" ]] ||
  { fail "info rows (host rank local): got [$rows]"; cat info.log; }

# run: the same results as on one node; the hosts in the provenance.
exits one.log 0 "run on one node" "${one_node[@]}" run "$exp" "${small[@]}" --out one.h5
exits two.log 0 "run on two nodes" "${two_nodes[@]}" run "$exp" "${small[@]}" --out two.h5
a=$("$python" "$src/tests/harness/cpu_digest.py" one.h5) b=$("$python" "$src/tests/harness/cpu_digest.py" two.h5)
[[ -n $a && $a == "$b" ]] || { fail "results differ between one node ($a) and two ($b)"; cat two.log; }
hosts=$("$python" -c 'import h5py, sys; print(" ".join(h.decode() if isinstance(h, bytes) else h for h in h5py.File(sys.argv[1])["/"].attrs["hosts"]))' two.h5)
[[ $hosts == "$host $host $node2 $node2" ]] || fail "provenance hosts of the two-node run: [$hosts]"

# A node dies mid-run: its daemon and its ranks killed at once.
long=(--set trace.synthetic.new_tokens=60 --set measure.repeats=8)
"${two_nodes[@]}" run "$exp" "${long[@]}" --out die.h5 >die.log 2>&1 &
job=$!
for ((i = 0; i < 1200; i++)); do
  grep -q ') done in' die.log && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
grep -q ') done in' die.log || { fail "the two-node run finished no point"; cat die.log; }
# mpirun -> sh (fake_ssh.sh's, the ssh client's stand-in, on this node) -> orted -> the second
# node's ranks. The node's processes are the daemon and its ranks.
shell=$(ps -o pid=,args= --ppid "$job" | awk '$2 == "sh" { print $1 }')
# ps pads its pids with spaces, and a padded pid is not a pid to --ppid: trimmed.
daemon=$(ps -o pid= --ppid "$shell" 2>/dev/null | awk '{ print $1 }' | head -n 1)
ranks=$(ps -o pid= --ppid "$daemon" 2>/dev/null | awk '{ print $1 }')
[[ -n $daemon && -n $ranks ]] || fail "the second node's daemon and ranks were not found under mpirun $job"
t0=$(date +%s)
kill -KILL $daemon $ranks
rc=hung
for ((i = 0; i < 300; i++)); do
  if ! kill -0 "$job" 2>/dev/null; then
    wait "$job"
    rc=$?
    job=""
    break
  fi
  sleep 0.1
done
elapsed=$(($(date +%s) - t0))
echo "the job ended ${elapsed} s after the node died, exit $rc"
[[ $rc != hung && $rc != 0 ]] || { fail "a dead node: exit $rc"; cat die.log; }
# mpirun's own report names the node (lost daemon, or its peers' hang-up) before it ends the job.
has die.log "(on node|Peer host:) +$node2"
left=$(pgrep -f "mtplab run $exp ${long[0]}" | paste -sd ' ')
[[ -z $left ]] || { fail "processes of the job are left: $left"; kill -KILL $left 2>/dev/null; }

((failures == 0)) || { echo "$failures failure(s)"; exit 1; }
echo "all passed"
