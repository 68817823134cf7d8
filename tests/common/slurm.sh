# Shared by the tests that start a real one-node Slurm (tests/app/test_slurm.sh,
# tests/harness/test_slurm_array.sh). Source it with $src set to the repository root.

skip() { echo "SKIPPED: $*"; exit 77; }

# require_slurm: skips (exit 77) unless root with Slurm and munge installed.
require_slurm() {
  [[ $(id -u) -eq 0 ]] || skip "needs root to start slurmctld, slurmd and munged"
  local t
  for t in munged slurmctld slurmd sbatch srun sinfo scontrol; do
    command -v "$t" >/dev/null 2>&1 || skip "$t not found (scripts/install-deps.sh installs slurm-wlm and munge)"
  done
}

# start_own_slurm NAME: a cluster of the test's own (scripts/slurm-local.sh) under a fresh
# $work=/tmp/NAME.XXXXXX, so that a `slurm-local.sh start` by hand or another test run is left
# alone; its environment is taken into this shell. On exit Slurm stops and $work goes. Exits 1
# when Slurm does not start.
start_own_slurm() {
  work=$(mktemp -d "/tmp/$1.XXXXXX")
  export MTPLAB_SLURM_DIR=$work/slurm
  trap stop_own_slurm EXIT
  "$src/scripts/slurm-local.sh" start || { echo "FAIL: local Slurm did not start"; exit 1; }
  eval "$("$src/scripts/slurm-local.sh" env)"
}

stop_own_slurm() {
  "$src/scripts/slurm-local.sh" stop >/dev/null
  rm -rf "$work"
}
