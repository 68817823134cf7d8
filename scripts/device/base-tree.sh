#!/usr/bin/env bash
# Exports the sources of an earlier commit into .base/ (ignored by git) for a same-GPU baseline:
# a timing taken on another card or another day does not compare, so `BASE=1 scripts/device/run.sh
# bench-step` builds this tree's mtplab_bench_step beside the current one and runs the B = 1 step
# with each, in turn, on the same GPU. Only what the bench's build needs goes along (no docs, data,
# tests, analysis); .base/.mtplab-git-sha names the commit, so the baseline binary reports it (not
# the checkout's). Copy .base (and .mtplab-git-sha) to the GPU node with the tree.
#
#   scripts/device/base-tree.sh 29985ee     # the commit whose B = 1 step was 562 / 422 us (H200)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
commit=${1:?usage: scripts/device/base-tree.sh COMMIT}
sha=$(git rev-parse --verify "$commit^{commit}") || { echo "base-tree.sh: no commit '$commit'" >&2; exit 2; }
rm -rf .base
mkdir .base
git archive "$sha" | tar -x -C .base
rm -rf .base/docs .base/data .base/tests .base/analysis .base/experiments
printf '%s\n0\n' "$sha" >.base/.mtplab-git-sha
echo "base-tree.sh: .base/ holds $sha ($(du -sh .base | cut -f1)); copy .base with the tree"
