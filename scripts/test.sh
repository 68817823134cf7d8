#!/usr/bin/env bash
# Installs the missing system packages, builds, and runs every test with ctest. GPU tests skip
# (exit 77) without a GPU; Slurm tests skip unless root with Slurm installed. CI runs exactly this
# with CI=true, which selects the `ci` preset (warnings are errors). Without CI or MTPLAB_PRESET it
# builds in the tree quickstart.sh configured (build/, preset `cpu`), or with `default` when none.
#
#   scripts/test.sh                 all tests
#   scripts/test.sh -L unit         extra arguments go to ctest (-L mpi, -R name, ...)
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# The preset: MTPLAB_PRESET; else `ci` under CI; else the one that configured build/ (so that the
# build quickstart.sh made is reused, not reconfigured); else `default`.
if [[ -n "${MTPLAB_PRESET:-}" ]]; then
  preset=$MTPLAB_PRESET
elif [[ "${CI:-}" == "true" ]]; then
  preset=ci
else
  preset=$(recorded_preset default)
  preset=${preset:-default}
fi

install_deps
configure_and_build "$preset"

# The ctest preset of the same name when there is one (default, ci), else the build directory.
if ctest --list-presets 2>/dev/null | grep -q "\"$preset\""; then
  ctest_where=(--preset "$preset")
else
  ctest_where=(--test-dir "$(preset_binary_dir "$preset")" --output-on-failure --timeout 300)
fi
step "tests (ctest ${ctest_where[*]})"
ctest "${ctest_where[@]}" -j "$mtplab_jobs" "$@"
