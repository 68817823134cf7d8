#!/usr/bin/env bash
# One device call for the CUDA backend issue (written for nvidia-h200-x2): the kernel tests, the
# end-to-end drafter tests on 1 and 2 GPUs, the kernel benchmark and the draft-step benchmark.
# Binaries come from $BIN when they run there (a build carried from another machine, checked
# with ldd), else from a fresh build of just these targets in build-gpu/. Logs go to
# $OUT/gpu_e2e_logs.tar.gz, the benchmark tables to $OUT/*.txt; the end of stdout is a summary.
#
#   OUT=/some/dir [BIN=.devbin] scripts/device/gpu_e2e.sh [skip_bench]
#
# Invariants: every step has a timeout and its own log; a failing step does not stop the later
# ones; GPU 0 runs the op tests and the benchmarks while GPU 1 runs the single-GPU end-to-end
# test, then both run the 2-rank test; the exit status is non-zero when a build or a test failed.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
OUT=${OUT:-$root/build-gpu/gpu-e2e-out}
LOG=$OUT/logs
mkdir -p "$LOG"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
t0=$(date +%s)
elapsed() { echo "$(($(date +%s) - t0))s"; }
finish() { tar -C "$OUT" -czf "$OUT/gpu_e2e_logs.tar.gz" logs && rm -rf "$LOG"; }
trap finish EXIT
status=0
targets=(test_ops_gpu test_gpu_e2e test_gpu_e2e_mpi mtplab_bench_kernels mtplab_bench_step)

{ date -u; nvidia-smi; nvidia-smi topo -m; env | grep -E '^(NCCL|CUDA)'; } >"$LOG/env.txt" 2>&1
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader

BIN=${BIN:-}
use_carried=0
if [[ -n $BIN && -x $BIN/test_gpu_e2e ]]; then
  use_carried=1
  for t in "${targets[@]}"; do
    if [[ ! -x $BIN/$t ]] || ldd "$BIN/$t" | grep -q "not found"; then use_carried=0; fi
  done
  echo "carried binaries in $BIN: $([[ $use_carried == 1 ]] && echo usable || echo 'not usable, building')"
  [[ $use_carried == 0 ]] && ldd "$BIN/test_gpu_e2e" | grep "not found" | head -5
fi
if [[ $use_carried == 0 ]]; then
  echo "== configure + build ($(elapsed))"
  if ! timeout 200 cmake --preset cuda -B build-gpu -G Ninja -DMTPLAB_WERROR=OFF >"$LOG/configure.log" 2>&1; then
    tail -30 "$LOG/configure.log"
    exit 1
  fi
  if ! timeout 400 cmake --build build-gpu -j "$(nproc)" --target "${targets[@]}" >"$LOG/build.log" 2>&1; then
    grep -E "error" -A5 "$LOG/build.log" | head -60
    exit 1
  fi
  mkdir -p build-gpu/e2e-bin
  for t in test_ops_gpu test_gpu_e2e test_gpu_e2e_mpi; do cp build-gpu/tests/$t build-gpu/e2e-bin/; done
  for t in mtplab_bench_kernels mtplab_bench_step; do cp build-gpu/bin/$t build-gpu/e2e-bin/; done
  BIN=build-gpu/e2e-bin
  echo "built ($(elapsed))"
fi
export MTPLAB_SOURCE_DIR=$root

# GPU 1: the single-GPU end-to-end test, in the background.
(CUDA_VISIBLE_DEVICES=1 timeout 300 "$BIN/test_gpu_e2e" >"$LOG/test_gpu_e2e.log" 2>&1; echo $? >"$LOG/test_gpu_e2e.rc") &
e2e_pid=$!

# GPU 0: op tests, the sanitizer on the decode kernel, then the benchmarks.
echo "== test_ops_gpu ($(elapsed))"
CUDA_VISIBLE_DEVICES=0 timeout 240 "$BIN/test_ops_gpu" >"$LOG/test_ops_gpu.log" 2>&1
rc=$?
echo "test_ops_gpu rc=$rc"
[[ $rc -ne 0 ]] && status=1
grep -E "^\[  (FAILED|PASSED) |^GPU op tests" "$LOG/test_ops_gpu.log" | head -30
if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    CUDA_VISIBLE_DEVICES=0 timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 "$BIN/test_ops_gpu" \
      --gtest_filter='*Mla*tiny*:*Mla*small*' >"$LOG/sanitizer_$tool.log" 2>&1
    echo "sanitizer $tool on Mla tiny+small: rc=$? $(grep -m1 'ERROR SUMMARY' "$LOG/sanitizer_$tool.log")"
  done
fi
if [[ ${1:-} != skip_bench ]]; then
  echo "== bench_kernels ($(elapsed))"
  CUDA_VISIBLE_DEVICES=0 timeout 150 "$BIN/mtplab_bench_kernels" --reps 100 --out "$LOG" >"$OUT/bench_kernels.txt" 2>&1
  echo "bench_kernels rc=$?"
  grep -E "copy_d2d|mla_decode|indexer|head_argmax|moe_experts|linear (q_a|kv_a|eh_proj)|rmsnorm" "$OUT/bench_kernels.txt"
  echo "== bench_step ($(elapsed))"
  CUDA_VISIBLE_DEVICES=0 timeout 240 "$BIN/mtplab_bench_step" --context 4096 --reps 30 --k 1,4 --out "$LOG" \
    >"$OUT/bench_step.txt" 2>&1
  echo "bench_step rc=$?"
  tail -16 "$OUT/bench_step.txt"
fi

wait $e2e_pid
rc=$(cat "$LOG/test_gpu_e2e.rc")
echo "== test_gpu_e2e rc=$rc ($(elapsed))"
[[ $rc -ne 0 ]] && status=1
grep -E "^\[  (FAILED|PASSED|  OK) |\[gpu-e2e\]|Failure|Expected|Which is|SKIPPED" "$LOG/test_gpu_e2e.log" | head -40

echo "== test_gpu_e2e_mpi (2 ranks) ($(elapsed))"
timeout 300 mpirun -np 2 --oversubscribe --bind-to none "$BIN/test_gpu_e2e_mpi" >"$LOG/test_gpu_e2e_mpi.log" 2>&1
rc=$?
echo "test_gpu_e2e_mpi rc=$rc"
[[ $rc -ne 0 ]] && status=1
grep -E "^\[  (FAILED|PASSED|  OK) |\[gpu-e2e-mpi\]|Failure|SKIPPED|rank" "$LOG/test_gpu_e2e_mpi.log" | head -30
echo "done: status $status ($(elapsed))"
exit $status
