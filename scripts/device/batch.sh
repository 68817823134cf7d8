#!/usr/bin/env bash
# One device call (one H200, under 10 minutes) for batched drafting: the GPU tests, the B = 1
# draft step (against its earlier figures), mtplab_bench_step --batch over B = 1 .. 128 and, when
# the PyTorch peer script is given (PEER=path/to/torch_graph_peer_batched.py), the peer in the same
# call, then the side-by-side table (bench/peer/batch_ratio.py). NCU=1 adds a per-kernel profile
# of the eager batched step at NCU_BATCHES (default 1,2,16,128), both heads, summarised per kernel
# by scripts/device/ncu_summary.py. TESTS=0 leaves the GPU tests out; TESTS=regex runs only those.
# EXP=1 runs experiments/batch-scaling.yaml into $OUT/batch-scaling.h5 (EXP_S seconds at most, then
# SIGTERM: the points done stay in the file; the log names the synthetic trace's generation time).
# STEP_ARGS adds arguments to the batched mtplab_bench_step (e.g. "--router-bias-scale 0.2").
# EQ=1 (with PEER) runs the batched bench a second time with --router-bias-scale 0.2, so that its
# steps route to as many distinct experts as the peer's, into $OUT/eq/, and prints that ratio table
# too (docs/performance.md, session 17). GPU=H200 (any text) stops at once, before the build, when
# the first GPU's name does not contain it: a call that asked for one kind and got another spends
# seconds, not minutes. BASE=1 builds the earlier commit exported into .base/ by
# scripts/device/base-tree.sh and runs its B = 1 step and the current one in turn, BASE_RUNS times each (2)
# (bench_step_b1_base.txt): "B = 1 stays as fast as commit X" measured on this call's GPU.
#
#   OUT=/some/dir [GPU=H200] [BASE=1] [PEER=file.py [EQ=1]] [BATCHES=1,2,4,8,16,32,64,128] [REPS=20] [NCU=1]
#     scripts/device/batch.sh
#
# $OUT: build.log, gpu_tests.log, bench_step.txt (B = 1), bench_step_batch.txt / .csv, peer.txt /
# torch_graph_peer_batched.json, batch_ratio.txt, eq/ (EQ=1), bench_step_b1_base.txt (BASE=1),
# ncu_batch.csv / ncu_batch.txt, batch-scaling.h5 / .log.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
OUT=${OUT:-$root/build-gpu/batch-out}
BATCHES=${BATCHES:-1,2,4,8,16,32,64,128}
REPS=${REPS:-20}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 MTPLAB_SHA_FROM_FILE=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
step() { echo "== $1 ($(date +%T))"; }
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "GPU: ${gpu_name:-none found}"
if [[ -n ${GPU:-} && $gpu_name != *"$GPU"* ]]; then
  echo "batch.sh: GPU=$GPU asked for, this machine has '${gpu_name:-no GPU}': nothing run" >&2
  exit 3
fi
step build
{ cmake --preset cuda -B build-gpu -DMTPLAB_WERROR=OFF && cmake --build build-gpu -j"$(nproc)"; } >"$OUT/build.log" 2>&1 ||
  { tail -40 "$OUT/build.log"; exit 1; }
TESTS=${TESTS:-1}
if [[ $TESTS != 0 ]]; then
  step "GPU tests"
  sel=(); [[ $TESTS != 1 ]] && sel=(-R "$TESTS")
  timeout 280 ctest --test-dir build-gpu -L gpu -LE mpi "${sel[@]}" -j 3 --output-on-failure --timeout 270 \
    >"$OUT/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "tests passed|Failed|\*\*\*" "$OUT/gpu_tests.log" | head -20
fi
step "draft step, B = 1"
timeout 120 build-gpu/bin/mtplab_bench_step --k 1 --graphs on --reps 30 --out "$OUT" >"$OUT/bench_step.txt" 2>&1
echo "rc=$?"; tail -6 "$OUT/bench_step.txt"
if [[ ${BASE:-0} == 1 ]]; then
  step "B = 1 against the baseline tree .base/ (scripts/device/base-tree.sh), in turn, same GPU"
  if [[ -f .base/CMakeLists.txt ]]; then
    { (cd .base && cmake --preset cuda -B build-base -DMTPLAB_WERROR=OFF -DMTPLAB_TESTS=OFF &&
        cmake --build build-base -j"$(nproc)" --target mtplab_bench_step); } >"$OUT/base_build.log" 2>&1 ||
      { echo "baseline build failed:"; tail -20 "$OUT/base_build.log"; }
    if [[ -x .base/build-base/bin/mtplab_bench_step ]]; then
      for ((i = 1; i <= ${BASE_RUNS:-2}; i++)); do
        for who in base head; do
          bin=build-gpu/bin/mtplab_bench_step; [[ $who == base ]] && bin=.base/build-base/bin/mtplab_bench_step
          echo "=== $who, run $i" >>"$OUT/bench_step_b1_base.txt"
          timeout 120 "$bin" --context 4096 --k 1 --graphs on --reps 30 --out "$OUT/base_$who$i" \
            >>"$OUT/bench_step_b1_base.txt" 2>&1
          echo "$who run $i rc=$?"
        done
      done
      grep -E "^=== |git |^(bf16|fp8) " "$OUT/bench_step_b1_base.txt"
    fi
  else
    echo "BASE=1 but no .base/ here: run scripts/device/base-tree.sh COMMIT and carry .base"
  fi
fi
step "batched draft step"
timeout 240 build-gpu/bin/mtplab_bench_step --batch "$BATCHES" --k 1 --graphs on --reps "$REPS" --out "$OUT" ${STEP_ARGS:-} \
  >"$OUT/bench_step_batch.txt" 2>&1
echo "rc=$?"; tail -20 "$OUT/bench_step_batch.txt"
if [[ -n ${PEER:-} && -f $PEER ]]; then
  step "PyTorch peer"
  OUT=$OUT BATCHES=$BATCHES REPS=$REPS PYTHONUNBUFFERED=1 timeout 180 python3 "$PEER" >"$OUT/peer.txt" 2>&1
  echo "rc=$?"; tail -20 "$OUT/peer.txt"
  python3 bench/peer/batch_ratio.py "$OUT/bench_step_batch.csv" "$OUT/torch_graph_peer_batched.json" \
    >"$OUT/batch_ratio.txt" 2>&1
  cat "$OUT/batch_ratio.txt"
  if [[ ${EQ:-0} == 1 ]]; then
    step "batched draft step, the peer's routing (--router-bias-scale 0.2)"
    mkdir -p "$OUT/eq"
    timeout 240 build-gpu/bin/mtplab_bench_step --batch "$BATCHES" --k 1 --graphs on --reps "$REPS" \
      --router-bias-scale 0.2 --out "$OUT/eq" >"$OUT/eq/bench_step_batch.txt" 2>&1
    echo "rc=$?"
    python3 bench/peer/batch_ratio.py "$OUT/eq/bench_step_batch.csv" "$OUT/torch_graph_peer_batched.json" \
      >"$OUT/eq/batch_ratio.txt" 2>&1
    cat "$OUT/eq/batch_ratio.txt"
  fi
fi
if [[ ${NCU:-0} == 1 ]]; then
  NCU_BATCHES=${NCU_BATCHES:-1,2,16,128}
  step "ncu, eager batched step at B = $NCU_BATCHES"
  timeout 240 ncu --clock-control none --cache-control none --profile-from-start off --csv \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    build-gpu/bin/mtplab_bench_step --batch "$NCU_BATCHES" --k 1 --graphs off --reps 2 --warmup 1 --profile \
    --out "$OUT/ncu" >"$OUT/ncu_batch.csv" 2>"$OUT/ncu_batch.err"
  echo "ncu rc=$?"
  labels=$(for h in bf16 fp8; do for b in ${NCU_BATCHES//,/ }; do printf '%s:%s,' "$h" "$b"; done; done)
  python3 scripts/device/ncu_summary.py "$OUT/ncu_batch.csv" --reps 2 --labels "${labels%,}" \
    >"$OUT/ncu_batch.txt" 2>&1
  echo "summary rc=$?"; head -c 6000 "$OUT/ncu_batch.txt"
fi
if [[ ${EXP:-0} == 1 ]]; then
  step "experiments/batch-scaling.yaml"
  timeout -s TERM "${EXP_S:-240}" build-gpu/bin/mtplab run experiments/batch-scaling.yaml --out "$OUT/batch-scaling.h5" \
    >"$OUT/batch-scaling.log" 2>&1
  echo "rc=$?"; grep -E "synthetic trace|point|error" "$OUT/batch-scaling.log" | tail -12
fi
