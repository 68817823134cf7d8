#!/usr/bin/env bash
# The newcomer's first command: installs the missing system packages, configures, builds, and
# runs the main job on 2 ranks. Safe to re-run: every step is skipped or incremental when done.
#
#   scripts/quickstart.sh                  preset `default` (CUDA backend when a toolkit is found)
#   MTPLAB_PRESET=cpu scripts/quickstart.sh
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

preset=${MTPLAB_PRESET:-default}

install_deps
configure_and_build "$preset"
bin=$(preset_binary_dir "$preset")/bin

step "main job"
# >>> main job: the quickstart experiment (experiments/quickstart.yaml) on 2 ranks.
run_mpi 2 "$bin/mtplab" run experiments/quickstart.yaml
# <<< main job

printf '\nDone. Next: scripts/test.sh runs the tests; README.md and docs/getting-started.md say more.\n'
