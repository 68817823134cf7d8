#!/usr/bin/env bash
# The recorder end to end, in one run on a machine with torch + transformers (the GPU machine):
#   1. build mtplab (cpu preset, the mtplab target only) in the background;
#   2. make_tiny_glm5.py: a tiny random glm5_next checkpoint saved by transformers, plus the MTP
#      layer's tensors under the names its config implies;
#   3. record_trace.py: three traces of the three example prompts: greedy BF16, sampled BF16, and
#      greedy f32 from the model run in fp32 (what BF16 storage would change on the target side);
#   4. mtplab run with model: and weights: the checkpoint directory and trace: each recorded file,
#      and mtplab list with a {preset: DIR, max_seq_len: N} override;
#   5. the traces' attributes (h5py).
# Every log under $OUT; the checkpoint's config.json comes back as $OUT/config.json. Exit status:
# the number of failed steps.
#
#   OUT=/some/dir tools/record_trace/selftest.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
OUT=${OUT:-/tmp/record-trace-selftest}
W=$(mktemp -d /tmp/record-trace.XXXXXX)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MTPLAB_SOURCE_DIR=$root OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
t0=$(date +%s)
elapsed() { echo "$(($(date +%s) - t0))s"; }
failed=0
step() {  # step NAME TIMEOUT CMD...: runs CMD with its output in $OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  echo "== $name ($(elapsed))"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 12 "$OUT/$name.log"
  if ((rc != 0)); then
    echo "!! $name failed (rc $rc)"
    failed=$((failed + 1))
  fi
  return $rc
}

{ date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; python3 -c \
  'import torch, transformers, h5py; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "transformers", transformers.__version__, "h5py", h5py.__version__)'
  python3 -c 'import transformers, inspect; n=[x for x in dir(transformers) if x.startswith("Glm5Next")]; print(n)
import transformers.models.glm5_next.modeling_glm5_next as M; print(inspect.getsourcefile(M))'; } >"$OUT/env.log" 2>&1
cat "$OUT/env.log"

(timeout 200 cmake --preset cpu -B build-selftest -G Ninja -DMTPLAB_WERROR=OFF -DMTPLAB_TESTS=OFF >"$OUT/build.log" 2>&1 &&
 timeout 200 cmake --build build-selftest --target mtplab -j "$(nproc)" >>"$OUT/build.log" 2>&1; echo $? >"$W/build.rc") &
build_pid=$!

ckpt=$W/glm5-tiny
step make_checkpoint 120 python3 tools/record_trace/make_tiny_glm5.py --out "$ckpt"
cp "$ckpt/config.json" "$OUT/config.json" 2>/dev/null
ls -la "$ckpt" >"$OUT/checkpoint_files.log" 2>&1

rec=(python3 tools/record_trace/record_trace.py --model "$ckpt" --prompts tools/record_trace/example_prompts.jsonl
     --max-new-tokens 40 --ignore-eos)
# The four recordings at once (each uses the GPU lightly; their imports dominate).
pids=()
step record_greedy 150 "${rec[@]}" --out "$W/greedy.h5" &
pids+=($!)
step record_sampled 150 "${rec[@]}" --out "$W/sampled.h5" --sampling sampling --temperature 0.8 --top-k 50 \
  --top-p 0.95 --seed 7 &
pids+=($!)
# The fp32 model's two traces take the hidden from the head's input (the other hidden source).
step record_f32 150 "${rec[@]}" --out "$W/f32.h5" --dtype f32 --torch-dtype float32 --hidden-source lm_head_input &
pids+=($!)
step record_bf16_from_f32_model 150 "${rec[@]}" --out "$W/bf16-fp32model.h5" --torch-dtype float32 \
  --hidden-source lm_head_input &
pids+=($!)
wait "${pids[@]}"
for r in greedy sampled f32 bf16-fp32model; do [[ -f $W/$r.h5 ]] || { echo "!! no $r.h5"; failed=$((failed + 1)); }; done

wait $build_pid
echo "== build rc $(cat "$W/build.rc" 2>/dev/null) ($(elapsed))"
tail -n 3 "$OUT/build.log"
mtplab=$root/build-selftest/bin/mtplab
for trace in greedy sampled f32 bf16-fp32model; do
  [[ -f $W/$trace.h5 ]] || continue
  cat >"$W/exp-$trace.yaml" <<EOF
model: $ckpt
weights:
  checkpoint: $ckpt
trace:
  path: $W/$trace.h5
measure:
  warmup_steps: 1
output: $W/results-$trace.h5
backend: cpu
draft_len: 2
sweep:
  grid:
    head_fp8: [off, on]
EOF
  step "mtplab_run_$trace" 120 "$mtplab" run "$W/exp-$trace.yaml"
done
step mtplab_list_override 60 "$mtplab" list "$W/exp-greedy.yaml" --set model.max_seq_len=512 --set model.name=renamed
step trace_attributes 60 python3 - "$W" <<'PY'
import json, sys, h5py, numpy as np
w = sys.argv[1]
for name in ("greedy", "sampled", "f32", "bf16-fp32model"):
    try:
        f = h5py.File(f"{w}/{name}.h5", "r")
    except OSError as e:
        print(name, "missing", e); continue
    a = {k: (v.decode() if isinstance(v, bytes) else v.item() if hasattr(v, "item") else v) for k, v in f.attrs.items()}
    print(f"--- {name}: hiddens {f['hiddens'].dtype} dtype={f['hiddens'].attrs['dtype']} shape {f['hiddens'].shape}, "
          f"tokens {f['tokens'].shape}, offsets {list(f['seq_offsets'][()])}, prompts {list(f['prompt_lengths'][()])}")
    for k in sorted(a):
        if k not in ("config", "hidden_check"):
            print(f"  {k} = {a[k]!r}")
    print("  hidden_check =", json.dumps(json.loads(a["hidden_check"])))
def rd(name):
    try:
        return h5py.File(f"{w}/{name}.h5", "r")
    except OSError:
        return None
g, f32, b16 = rd("greedy"), rd("f32"), rd("bf16-fp32model")
if g and f32:
    print("tokens of the BF16 model and of the fp32 model equal:", np.array_equal(g["tokens"][()], f32["tokens"][()]))
if f32 and b16:
    same_tokens = np.array_equal(f32["tokens"][()], b16["tokens"][()])
    bits = ((f32["hiddens"][()].view(np.uint32) + 0x7FFF + ((f32["hiddens"][()].view(np.uint32) >> 16) & 1)) >> 16).astype(np.uint16)
    print("fp32 model, f32 vs BF16 storage: tokens equal", same_tokens, "; bf16(f32 hiddens) == BF16 trace bits:",
          np.array_equal(bits, b16["hiddens"][()]))
PY
step drafts_f32_vs_bf16 60 python3 - "$W" <<'PY'
import sys, h5py, numpy as np
w = sys.argv[1]
a, b = h5py.File(f"{w}/results-f32.h5", "r"), h5py.File(f"{w}/results-bf16-fp32model.h5", "r")
for p in sorted(a["points"]):
    da, db = a["points"][p]["drafts"][()], b["points"][p]["drafts"][()]
    print(p, "drafts", da.shape, "equal:", np.array_equal(da, db), "acceptance", a["points"][p].attrs["acceptance_rate"],
          b["points"][p].attrs["acceptance_rate"])
    assert np.array_equal(da, db), "the drafter read different values from the f32 and the BF16 trace"
PY
for r in greedy f32 bf16-fp32model; do
  [[ -f $W/results-$r.h5 ]] && python3 - "$W/results-$r.h5" <<'PY' >>"$OUT/results_summary.log" 2>&1
import sys, h5py
f = h5py.File(sys.argv[1], "r")
ix = f["index"]
cols = {k: ix[k][()] for k in ix}
keys = [k for k in cols if any(s in k for s in ("accept", "tau", "status", "head_fp8", "drafted"))]
print(sys.argv[1], {k: [x.decode() if isinstance(x, bytes) else float(x) for x in cols[k]] for k in keys})
PY
done
cat "$OUT/results_summary.log" 2>/dev/null
echo "== done: $failed failed step(s) ($(elapsed))"
exit $failed
