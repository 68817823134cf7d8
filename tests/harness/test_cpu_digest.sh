#!/usr/bin/env bash
# The CPU bits of every shipped experiment, held as digests (tests/harness/cpu-digest.txt).
#
# Each experiments/*.yaml runs on the CPU backend, every point of its grid, shrunk where it is sized
# for a GPU (the tiny model, short synthetic sequences, CUDA-only axes cut to one value) or for a
# long CPU run (fewer sequences and steps); tests/harness/cpu_digest.py hashes every point's drafts,
# targets, accepted and expected counts, accept probabilities, margins and acceptance figures. The
# test fails when any experiment's digest differs from the held one, or when an experiment is
# missing from either side. A change that is meant to move the CPU's bits regenerates the file:
#
#   MTPLAB_DIGEST_UPDATE=1 ctest --test-dir build -R harness.cpu_digest
#
# and says why in its commit. To find which point moved: run the experiment as below and compare
# `cpu_digest.py --points` of both files.
# Usage: test_cpu_digest.sh MTPLAB MPIEXEC PYTHON   (MTPLAB_SOURCE_DIR = repository root)
# Exit 77 (skipped) without h5py and numpy.
set -uo pipefail
mtplab=$1 mpiexec=$2 python=$3
src=${MTPLAB_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
source "$src/tests/common/script.sh"
require_python "$python" h5py numpy
held=$src/tests/harness/cpu-digest.txt
work=$(mktemp -d /tmp/mtplab-cpu-digest.XXXXXX)
# MTPLAB_DIGEST_KEEP=1 keeps the results files (the path is printed) to compare points afterwards.
if [[ "${MTPLAB_DIGEST_KEEP:-}" == "1" ]]; then echo "results kept in $work"; else trap 'rm -rf "$work"' EXIT; fi

# The GPU-sized experiments at the tiny shape on the CPU (their arms as shipped, but cuda_graph).
tiny=(--set model.preset=tiny --set backend=cpu --set trace.synthetic.prompt_len=40
  --set trace.synthetic.new_tokens=16 --set measure.warmup_steps=2)
declare -A ranks args
ranks[quickstart]=2
args[quickstart]="--set measure.sequences=4"
ranks[trained-tiny]=2
args[trained-tiny]="--set measure.sequences=3 --set measure.max_steps=24"
ranks[trained-mini]=2
args[trained-mini]="--set measure.sequences=1 --set measure.max_steps=10 --set measure.warmup_steps=1"
ranks[temperature]=1
args[temperature]="--set measure.sequences=4 --set measure.max_steps=24"
ranks[index-share-trained-tiny]=1
args[index-share-trained-tiny]="--set measure.sequences=4"
ranks[batch-qidx]=1
args[batch-qidx]="${tiny[*]} --set model.max_seq_len=128"
ranks[batch-scaling]=1
args[batch-scaling]="${tiny[*]} --set model.max_seq_len=128 --set trace.synthetic.sequences=20 --set measure.max_steps=10 --set sweep.grid.batch_size=[1,2,4,8,16] --set sweep.grid.cuda_graph=[off]"
ranks[index-share]=1
args[index-share]="${tiny[*]} --set model.max_seq_len=128 --set cuda_graph=off"
ranks[rank-scaling]=2
args[rank-scaling]="${tiny[*]} --set model.max_seq_len=128 --set trace.synthetic.sequences=10 --set measure.max_steps=8 --set sweep.grid.cuda_graph=[off] --set measure.repeats=1"
ranks[online-trained-mini]=2
args[online-trained-mini]="--set measure.sequences=4 --set online.max_new_tokens=16 --set measure.warmup_steps=1"
ranks[online-plan-check]=1
args[online-plan-check]="--set backend=cpu --set trace.synthetic.sequences=8 --set trace.synthetic.new_tokens=8 --set online.max_new_tokens=8 --set measure.warmup_steps=1 --set sweep.grid.batch_size=[1,4]"
ranks[online-flash]=1
args[online-flash]="${tiny[*]} --set model.max_seq_len=128 --set cuda_graph=off --set online.max_new_tokens=16 --set trace.synthetic.sequences=12 --set measure.max_steps=16 --set sweep.grid.batch_size=[1,4,16]"
ranks[seed-ablations]=2
args[seed-ablations]="${tiny[*]} --set model.max_seq_len=128 --set measure.repeats=1 --set measure.warmup_steps=2"

: >"$work/digest.txt"
for yaml in "$src"/experiments/*.yaml; do
  name=$(basename "$yaml" .yaml)
  if [[ -z "${ranks[$name]:-}" ]]; then
    fail "experiments/$name.yaml has no entry in test_cpu_digest.sh (add its ranks and shrink)"
    continue
  fi
  read -r -a extra <<<"${args[$name]}"
  start=$SECONDS
  (cd "$src" && "$mpiexec" -np "${ranks[$name]}" --oversubscribe --bind-to none "$mtplab" run "$yaml" "${extra[@]}" \
    --out "$work/$name.h5") >"$work/$name.log" 2>&1 || { fail "$name: mtplab run exited $?"; tail -30 "$work/$name.log"; continue; }
  line=$("$python" "$src/tests/harness/cpu_digest.py" "$work/$name.h5") || { fail "$name: cpu_digest.py failed"; continue; }
  echo "$name $line" >>"$work/digest.txt"
  echo "$name: $line ($((SECONDS - start)) s)"
done

if [[ "${MTPLAB_DIGEST_UPDATE:-}" == "1" ]]; then
  ((failures == 0)) || { echo "not updating $held: $failures failure(s)"; exit 1; }
  cp "$work/digest.txt" "$held"
  echo "updated $held"
  exit 0
fi
[[ -f "$held" ]] || { echo "FAIL: $held is missing (MTPLAB_DIGEST_UPDATE=1 writes it)"; exit 1; }
if ! diff <(sort "$held") <(sort "$work/digest.txt") >"$work/diff.txt"; then
  fail "the CPU bits moved (< held, > this build):"
  cat "$work/diff.txt"
fi
((failures == 0)) && echo "ok: $(wc -l <"$held") experiments, every point's CPU bits as held"
exit $((failures > 0))
