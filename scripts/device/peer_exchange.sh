#!/usr/bin/env bash
# One device call (nvidia-h200-x2, under 5 minutes): the exchange-protocol benchmark on 2 GPUs and
# the PyTorch peer's draft step next to mtplab's, on the same weights.
#
#   OUT=/some/dir [BUDGET=s] [SKIP_EXCHANGE=1] scripts/device/peer_exchange.sh
#
# Steps, each under `timeout`, each with its own log in $OUT/logs (tarred at the end):
#   1. configure + build (cuda preset, build-gpu/, no -Werror) of mtplab_bench_exchange,
#      mtplab_export_weights and mtplab_bench_step only;
#   2. mpirun -np 2 mtplab_bench_exchange          -> $OUT/bench_exchange.{txt,csv};
#   3. mtplab_export_weights: bench_step's synthetic weights (seed 11) as a safetensors checkpoint
#      in a scratch dir (/dev/shm when it has room: no disk write of 18 GB);
#   4. mtplab_bench_step --k 1 on those weights' preset -> $OUT/bench_step.txt and its csv;
#   5. bench/peer/peer_step.py on the checkpoint (eager, then a CUDA graph, then torch.compile,
#      each while time remains) -> $OUT/peer_step.{txt,csv}, with the ratio to mtplab.
# Experts: all 288 routed experts when the build left enough time, else 32 (PEER_EXPERTS forces a
# count). Only the 8 routed experts of a step are read, so the step's bytes are the same either way
# (the router's 288 x 4096 weights aside); the summary says which ran. The scratch checkpoint is
# deleted at the end. Exit status: non-zero when the build or a benchmark failed.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
OUT=${OUT:-$root/build-gpu/peer-exchange-out}
LOG=$OUT/logs
mkdir -p "$LOG"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
t0=$(date +%s)
secs() { echo $(($(date +%s) - t0)); }
BUDGET=${BUDGET:-285}  # seconds for everything, under the call's 300
scratch=""
finish() {
  [[ -n $scratch ]] && rm -rf "$scratch"
  tar -C "$OUT" -czf "$OUT/peer_exchange_logs.tar.gz" logs && rm -rf "$LOG"
}
trap finish EXIT
status=0

{ date -u; nvidia-smi; nvidia-smi topo -m; env | grep -E '^(NCCL|CUDA)'; df -h /dev/shm "$root"; free -g;
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
} >"$LOG/env.txt" 2>&1

# ---- 1. build --------------------------------------------------------------------------------------
echo "== configure + build ($(secs)s)"
if ! timeout 90 cmake --preset cuda -B build-gpu -G Ninja -DMTPLAB_WERROR=OFF >"$LOG/configure.log" 2>&1; then
  tail -30 "$LOG/configure.log"
  exit 1
fi
if ! timeout 150 cmake --build build-gpu -j "$(nproc)" --target mtplab_bench_exchange mtplab_export_weights \
  mtplab_bench_step >"$LOG/build.log" 2>&1; then
  grep -E "error" -A5 "$LOG/build.log" | head -60
  exit 1
fi
BIN=build-gpu/bin
echo "built ($(secs)s)"

# ---- 2. exchange protocols on 2 GPUs ----------------------------------------------------------------
if [[ ${SKIP_EXCHANGE:-0} == 1 ]]; then
  echo "== mtplab_bench_exchange skipped (SKIP_EXCHANGE=1)"
else
  echo "== mtplab_bench_exchange, 2 ranks ($(secs)s)"
  timeout 60 mpirun -np 2 --oversubscribe --bind-to none "$BIN/mtplab_bench_exchange" --out "$OUT" \
    >"$OUT/bench_exchange.txt" 2>&1
  rc=$?
  echo "bench_exchange rc=$rc ($(secs)s)"
  [[ $rc -ne 0 ]] && status=1 && tail -20 "$OUT/bench_exchange.txt"
fi

# ---- 3. weights ------------------------------------------------------------------------------------
if [[ -n ${PEER_EXPERTS:-} ]]; then
  experts=$PEER_EXPERTS
elif (($(secs) <= 110)); then
  experts=288
else
  experts=32
fi
shm_free_gb=$(df -BG --output=avail /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)
need_gb=$((experts >= 288 ? 24 : 8))
if [[ -n $shm_free_gb ]] && ((shm_free_gb > need_gb)); then
  scratch=$(mktemp -d /dev/shm/mtplab-peer.XXXXXX)
else
  scratch=$(mktemp -d "$root/build-gpu/peer-scratch.XXXXXX")
fi
preset=configs/glm5.3-flash.yaml
if [[ $experts != 288 ]]; then
  preset=$scratch/glm5.3-flash-e$experts.yaml
  sed -e "s/^name: .*/name: glm5.3-flash-e$experts/" -e "s/^n_routed_experts: .*/n_routed_experts: $experts/" \
    configs/glm5.3-flash.yaml >"$preset"
fi
echo "== export weights: $experts routed experts, scratch $scratch ($(secs)s)"
timeout 100 "$BIN/mtplab_export_weights" --preset "$preset" --seed 11 --out "$scratch/mtp.safetensors" \
  >"$LOG/export.log" 2>&1
rc=$?
cat "$LOG/export.log"
if [[ $rc -ne 0 ]]; then
  echo "export failed: no draft-step comparison"
  exit 1
fi

# ---- 4. mtplab's draft step on the same weights ------------------------------------------------------
echo "== mtplab_bench_step ($(secs)s)"
CUDA_VISIBLE_DEVICES=0 timeout 100 "$BIN/mtplab_bench_step" --preset "$preset" --context 4096 --reps 30 --k 1 \
  --out "$LOG" >"$OUT/bench_step.txt" 2>&1
rc=$?
echo "bench_step rc=$rc ($(secs)s)"
[[ $rc -ne 0 ]] && status=1
cp "$LOG/bench_step.csv" "$OUT/" 2>/dev/null
tail -6 "$OUT/bench_step.txt"

# ---- 5. the PyTorch peer -------------------------------------------------------------------------------
left=$((BUDGET - $(secs)))
echo "== peer_step, $left s left ($(secs)s)"
if ((left > 40)); then
  CUDA_VISIBLE_DEVICES=0 timeout "$left" python3 bench/peer/peer_step.py --weights "$scratch/mtp.safetensors" \
    --preset glm5.3-flash --experts "$experts" --context 4096 --reps 30 --warmup 4 \
    --variants eager,graph,compile --deadline-s $((left - 8)) --mtplab-csv "$OUT/bench_step.csv" --out "$OUT" \
    >"$OUT/peer_step.txt" 2>&1
  rc=$?
  echo "peer_step rc=$rc ($(secs)s)"
  [[ $rc -ne 0 ]] && status=1 && grep -E "Error|error|FAILED" "$OUT/peer_step.txt" | head -20
else
  echo "peer_step SKIPPED: not enough time left"
  status=1
fi

# ---- summary ---------------------------------------------------------------------------------------
echo
echo "== summary ($(secs)s; routed experts $experts; status $status)"
grep -E "^(case|bare_|packed_u64|allgather_|bf16_lanes|wrong)" "$OUT/bench_exchange.txt" 2>/dev/null
grep -E "^packed_u64 - bare" "$OUT/bench_exchange.txt" 2>/dev/null
sed -n '/^draft step (k=1/,/^wrote/p' "$OUT/peer_step.txt" 2>/dev/null | grep -v "^wrote"
exit $status
