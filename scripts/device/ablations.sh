#!/usr/bin/env bash
# One device call on nvidia-h200-x2: build build-gpu/ (cuda preset), run
# experiments/seed-ablations.yaml on the two GPUs (stopped by SIGTERM at $ABLATION_S seconds:
# the completed points stay in the file and a second call resumes), the exchange benchmark, and
# a per-kernel profile of one eager FP8 draft step (ncu, hardware counters, clocks left alone).
#
#   OUT=/some/dir ABLATION_S=400 scripts/device/ablations.sh [--no-build] [--skip-ablations]
#
# Writes $OUT/seed-ablations.h5, $OUT/ablations.log, $OUT/bench_exchange.{txt,csv},
# $OUT/ncu_step.csv, $OUT/bench_step_profile.txt.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
OUT=${OUT:-$root/build-gpu/ablations-out}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MTPLAB_SOURCE_DIR=$root MTPLAB_SHA_FROM_FILE=1
t0=$(date +%s)
elapsed() { echo "$(($(date +%s) - t0))s"; }
build=1 ablations=1
for a in "$@"; do
  case $a in --no-build) build=0 ;; --skip-ablations) ablations=0 ;; *) echo "unknown argument $a"; exit 2 ;; esac
done
{ date -u; nvidia-smi; } >"$OUT/env.txt" 2>&1
if ((build)); then
  echo "== build ($(elapsed))"
  if ! timeout 60 cmake --preset cuda -B build-gpu -G Ninja -DMTPLAB_WERROR=OFF >"$OUT/configure.log" 2>&1 ||
     ! timeout 200 cmake --build build-gpu -j "$(nproc)" --target mtplab mtplab_bench_step mtplab_bench_exchange >"$OUT/build.log" 2>&1; then
    tail -40 "$OUT/configure.log" "$OUT/build.log"; exit 1
  fi
fi
if ((ablations)); then
  echo "== seed-ablations on 2 GPUs ($(elapsed))"
  timeout -s TERM -k 60 "${ABLATION_S:-400}" mpirun -np 2 --oversubscribe build-gpu/bin/mtplab run \
    experiments/seed-ablations.yaml --out "$OUT/seed-ablations.h5" >"$OUT/ablations.log" 2>&1
  echo "seed-ablations rc=$? ($(elapsed))"
  grep -vE "^\s*$" "$OUT/ablations.log" | tail -75 | cut -c1-220
fi
echo "== exchange benchmark ($(elapsed))"
timeout 120 mpirun -np 2 --oversubscribe build-gpu/bin/mtplab_bench_exchange --out "$OUT" >"$OUT/bench_exchange.txt" 2>&1
echo "bench_exchange rc=$?"; tail -16 "$OUT/bench_exchange.txt"
echo "== ncu: one eager FP8 draft ($(elapsed))"
CUDA_VISIBLE_DEVICES=0 timeout 200 ncu --clock-control none --profile-from-start off --csv \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size,launch__registers_per_thread \
  build-gpu/bin/mtplab_bench_step --heads fp8 --graphs off --k 1 --reps 3 --warmup 2 --profile --out "$OUT" \
  >"$OUT/ncu_step.csv" 2>"$OUT/ncu_step.err"
echo "ncu rc=$? ($(elapsed))"; tail -3 "$OUT/ncu_step.err"
echo "== done ($(elapsed))"
