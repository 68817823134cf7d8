#!/usr/bin/env bash
# The newcomer's first command: installs the missing system packages, configures, builds the one
# binary the main job runs, and runs the main job on 2 ranks: the trained mini model's drafter at
# k = 1, 2, 3 with the BF16 and the FP8 head, its head whole and split over the ranks
# (experiments/quickstart.yaml; about a minute on 2 cores). Safe to re-run: every step is skipped
# or incremental when done, and a second run finds every point in results/quickstart.h5.
#
#   scripts/quickstart.sh                     preset `cpu` (the main job runs on the CPU backend)
#   MTPLAB_PRESET=default scripts/quickstart.sh   the CUDA backend too, when a toolkit is found
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

preset=${MTPLAB_PRESET:-cpu}

install_deps
configure_and_build "$preset" mtplab
bin=$(preset_binary_dir "$preset")/bin

step "main job"
# >>> main job: the quickstart experiment (experiments/quickstart.yaml) on 2 ranks.
run_mpi 2 "$bin/mtplab" run experiments/quickstart.yaml
# <<< main job

printf '\nDone. Next: scripts/test.sh builds the rest and runs the tests; README.md says what the table means.\n'
