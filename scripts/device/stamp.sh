#!/usr/bin/env bash
# Writes .mtplab-git-sha (sha, then 1 when the tree is dirty) so that a copy of the tree without
# .git, such as the one a remote GPU machine receives, still records its commit in the binary.
# Carry the file with the copy.
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
{ git rev-parse HEAD; if [ -n "$(git status --porcelain --untracked-files=no)" ]; then echo 1; else echo 0; fi; } >.mtplab-git-sha
