# Shared by the tests' shell scripts that run mtplab (tests/app, tests/harness). Source it with
# $src set to the repository root: it lets mpirun run as root and oversubscribe the cores, and
# keeps the failure count that the script's exit status reports.

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

failures=0
# fail MESSAGE: one failure, printed.
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# exits LOG RC WHAT CMD...: runs CMD, its output to LOG; a failure naming WHAT (LOG shown) unless
# it exits RC.
exits() {
  local log=$1 want=$2 what=$3
  shift 3
  "$@" >"$log" 2>&1
  local rc=$?
  ((rc == want)) || { fail "$what exited $rc, expected $want"; cat "$log"; }
}

# require_python PYTHON MODULE...: skips (exit 77) unless PYTHON imports every MODULE.
require_python() {
  local python=$1
  shift
  local modules
  modules=$(IFS=,; echo "$*")
  "$python" -c "import $modules" 2>/dev/null || { echo "SKIPPED: $python lacks ${modules//,/ or }"; exit 77; }
}
