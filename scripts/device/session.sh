#!/usr/bin/env bash
# One device call: build with the cuda preset, run every test (CPU and GPU labels), `mtplab info`
# on the GPUs, and optional extra steps. Logs go to $OUT/logs.tar.gz; the end of stdout is a
# summary. Usage: OUT=... scripts/device/session.sh [fixtures] [trained] [bench]
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
OUT=${OUT:-/tmp/mtplab-out}
LOG=$OUT/logs
mkdir -p "$LOG"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
jobs=$(nproc)
t0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t0 ))s"; }
finish() { tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs; rm -rf "$LOG"; }
trap finish EXIT

{ nvidia-smi; nvidia-smi topo -m; nvcc --version; cmake --version; env | grep -E '^(NCCL|CUDA)' ; } >"$LOG/env.txt" 2>&1
nvidia-smi --query-gpu=name,pci.bus_id,clocks.sm,clocks.max.sm --format=csv,noheader
echo "== configure + build ($(elapsed))"
if ! timeout 300 cmake --preset cuda -B build-gpu -G Ninja -DMTPLAB_WERROR=OFF >"$LOG/configure.log" 2>&1; then
  tail -30 "$LOG/configure.log"; exit 1
fi
if ! timeout 400 cmake --build build-gpu -j "$jobs" >"$LOG/build.log" 2>&1; then
  grep -E "error|Error" -A5 "$LOG/build.log" | head -60; exit 1
fi
echo "built ($(elapsed))"
echo "== ctest ($(elapsed))"
timeout 300 ctest --test-dir build-gpu -j 8 -LE slurm --output-on-failure --timeout 200 >"$LOG/ctest.log" 2>&1
grep -E "tests passed|tests failed|Failed|\*\*\*|Not Run|Skipped" "$LOG/ctest.log" | head -40
grep -E "^\s+[0-9]+ - " "$LOG/ctest.log" | head -40
echo "== info on the GPUs ($(elapsed))"
timeout 60 mpirun -np 2 --oversubscribe build-gpu/bin/mtplab info --backend cuda 2>&1 | tee "$LOG/info.txt" | cut -c1-200
for step in "$@"; do
  case $step in
    fixtures)
      echo "== reference fixtures ($(elapsed))"
      mkdir -p "$OUT/ref"
      timeout 240 python3 tests/reference/make_fixtures.py --out "$OUT/ref" >"$LOG/fixtures.log" 2>&1
      echo "make_fixtures rc=$?"; tail -25 "$LOG/fixtures.log"
      timeout 120 python3 tests/reference/check_fixtures.py "$OUT/ref" >"$LOG/check_fixtures.log" 2>&1
      echo "check_fixtures rc=$?"; tail -40 "$LOG/check_fixtures.log"
      ;;
    trained)
      echo "== trained-tiny on the GPUs ($(elapsed))"
      sub=(--set backend=cuda --set 'sweep.grid.skip=[none]' --set 'sweep.grid.context_rows=[cache_only]'
           --set 'sweep.grid.cuda_graph=[off,on]')
      timeout 150 build-gpu/bin/mtplab run experiments/trained-tiny.yaml "${sub[@]}" \
        --set 'sweep.grid.head_sharding=[none]' --out "$LOG/trained-gpu1.h5" 2>"$LOG/trained-gpu1.err" | tail -20
      timeout 150 mpirun -np 2 --oversubscribe build-gpu/bin/mtplab run experiments/trained-tiny.yaml "${sub[@]}" \
        --out "$LOG/trained-gpu2.h5" 2>"$LOG/trained-gpu2.err" | tail -36
      ;;
    bench)
      echo "== kernel benchmark ($(elapsed))"
      timeout 240 build-gpu/bin/mtplab_bench_kernels --out "$LOG" >"$LOG/bench.txt" 2>&1
      echo "bench rc=$?"; tail -45 "$LOG/bench.txt"
      ;;
  esac
done
echo "done ($(elapsed))"
