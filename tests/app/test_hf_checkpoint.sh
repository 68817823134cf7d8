#!/usr/bin/env bash
# A checkpoint directory used as a user would: config.json (the hand-written tiny glm5_next
# fixture) beside sharded safetensors with model.safetensors.index.json, named by `model:` and
# `weights:`, replayed on a trace.
#
#   test_hf_checkpoint.sh MTPLAB EXPORT_CHECKPOINT MPIEXEC PYTHON
#
# 1. export_checkpoint DIR (tests/app/export_checkpoint.cpp) writes the synthetic weights (seed 1) under the names DIR's
#    config.json implies; mtplab trace writes a synthetic-target trace of the tiny model.
# 2. The drafts replayed with {model: DIR, weights: DIR} equal those of {model: tiny, weights:
#    synthetic seed 1}, point by point (the config is the tiny preset, the weights its synthetic
#    ones); with weights of another seed they differ (the comparison can fail).
# 3. {preset: DIR, max_seq_len: N} overrides a key of the derived config; a trace longer than it
#    is refused, naming model.max_seq_len.
# 4. A config whose num_hidden_layers names a layer the checkpoint lacks: the error lists the layer
#    prefixes the checkpoint holds.
# Exit 77 (skipped) when PYTHON lacks h5py. MTPLAB_SOURCE_DIR = repository root.
set -uo pipefail
mtplab=$1 export_weights=$2 mpiexec=$3 python=$4
src=${MTPLAB_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
source "$src/tests/common/script.sh"
require_python "$python" h5py numpy
work=$(mktemp -d /tmp/mtplab-hf-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
launch=("$mpiexec" -np 1 --oversubscribe --bind-to none "$mtplab")

ck=$work/GLM-tiny
other=$work/GLM-tiny-seed2
for d in "$ck" "$other"; do
  mkdir -p "$d" && cp "$src/tests/data/hf/glm5_next-tiny/config.json" "$d/"
done
"$export_weights" "$ck" 1 "$ck" 800000 >"$work/export.log" 2>&1 ||
  { fail "export into $ck"; cat "$work/export.log"; }
"$export_weights" "$other" 2 "$other/model.safetensors" >>"$work/export.log" 2>&1 ||
  { fail "export into $other"; cat "$work/export.log"; }
[[ -f $ck/model.safetensors.index.json ]] || fail "no model.safetensors.index.json in $ck"
"${launch[@]}" trace --out "$work/t.h5" --model tiny --sequences 3 --prompt-len 12 --new-tokens 24 >"$work/trace.log" 2>&1 ||
  { fail "mtplab trace"; cat "$work/trace.log"; }

# experiment NAME MODEL WEIGHTS: a two-point experiment (head_fp8 off / on) on the trace.
experiment() {
  cat >"$work/$1.yaml" <<EOF
model: $2
weights: $3
trace:
  path: $work/t.h5
measure:
  warmup_steps: 1
output: $work/$1.h5
backend: cpu
draft_len: 3
sweep:
  grid:
    head_fp8: [off, on]
EOF
  "${launch[@]}" run "$work/$1.yaml" >"$work/$1.log" 2>&1
}
experiment preset tiny "{synthetic: {seed: 1}}" || { fail "the tiny preset run"; cat "$work/preset.log"; }
experiment hf "$ck" "{checkpoint: $ck}" || { fail "the checkpoint-directory run"; cat "$work/hf.log"; }
experiment seed2 "$ck" "{checkpoint: $other}" || { fail "the seed-2 run"; cat "$work/seed2.log"; }
experiment override "{preset: $ck, max_seq_len: 1024, name: renamed}" "{checkpoint: $ck}" ||
  { fail "the override run"; cat "$work/override.log"; }

"$python" - "$work" <<'PY' || fail "drafts of the checkpoint directory"
import sys, h5py, numpy as np
w = sys.argv[1]
def drafts(name):
    with h5py.File(f"{w}/{name}.h5", "r") as f:
        pts = f["points"]
        return {p: (pts[p]["drafts"][()], pts[p].attrs["model"]) for p in sorted(pts)}
a, b, c, o = drafts("preset"), drafts("hf"), drafts("seed2"), drafts("override")
assert sorted(a) == sorted(b) == ["p0000", "p0001"], (sorted(a), sorted(b))
for p in a:
    assert a[p][0].size > 0, f"{p}: no drafts"
    assert np.array_equal(a[p][0], b[p][0]), f"{p}: the checkpoint directory drafts differently from the tiny preset"
    assert np.array_equal(a[p][0], o[p][0]), f"{p}: the max_seq_len override changed the drafts"
    assert not np.array_equal(a[p][0], c[p][0]), f"{p}: other weights give the same drafts (the check cannot fail)"
dec = lambda v: v.decode() if isinstance(v, bytes) else str(v)
assert dec(b["p0000"][1]) == "GLM-tiny", b["p0000"][1]
assert dec(o["p0000"][1]) == "renamed", o["p0000"][1]
print("drafts equal to the tiny preset's at", {p: a[p][0].shape for p in a})
PY

# A trace longer than an overridden max_seq_len is refused, naming the key.
experiment short "{preset: $ck, max_seq_len: 16}" "{checkpoint: $ck}" && fail "a 36-position trace ran at max_seq_len 16"
grep -Eq "(more than|exceed) model.max_seq_len 16" "$work/short.log" || { fail "no max_seq_len refusal"; cat "$work/short.log"; }

# A config naming layer 3: the checkpoint holds layer 45.
mkdir -p "$work/wrong"
sed 's/"num_hidden_layers": 45/"num_hidden_layers": 3/' "$src/tests/data/hf/glm5_next-tiny/config.json" >"$work/wrong/config.json"
experiment wrong "$work/wrong" "{checkpoint: $ck}" && fail "a checkpoint without layer 3 loaded"
grep -q 'tensor "model.language_model.layers.3.' "$work/wrong.log" &&
  grep -q "layer prefixes it holds: model.language_model.layers.45." "$work/wrong.log" ||
  { fail "the missing-tensor error does not list the layer prefixes"; cat "$work/wrong.log"; }

((failures == 0)) && echo "test_hf_checkpoint: passed"
exit $((failures > 0))
