#!/usr/bin/env bash
# One device call that measures the draft step after the fused ops (linear_group,
# residual_add_rmsnorm): build build-gpu/ with the cuda preset (warnings not errors), the GPU
# tests through ctest -L gpu (test_ops_gpu, test_gpu_e2e, test_gpu_e2e_mpi: 2 GPUs), the fused
# kernels next to the separate ops they replace, then the draft step with its launches per draft.
# Written for nvidia-h200-x2; whole script under 5 minutes (every step has a timeout).
#
#   OUT=/some/dir scripts/device/perf_step.sh
#
# Invariants: a failing step does not stop the later ones; each step logs to $OUT/<step>.log; the
# exit status is non-zero when the build or a test failed.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
OUT=${OUT:-$root/build-gpu/perf-step-out}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MTPLAB_SOURCE_DIR=$root
t0=$(date +%s)
elapsed() { echo "$(($(date +%s) - t0))s"; }
status=0
{ date -u; nvidia-smi; } >"$OUT/env.txt" 2>&1

echo "== build ($(elapsed))"
targets=(test_ops_gpu test_gpu_e2e test_gpu_e2e_mpi mtplab_bench_kernels mtplab_bench_step)
if ! timeout 60 cmake --preset cuda -B build-gpu -G Ninja -DMTPLAB_WERROR=OFF >"$OUT/configure.log" 2>&1 ||
   ! timeout 150 cmake --build build-gpu -j "$(nproc)" --target "${targets[@]}" >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/configure.log" "$OUT/build.log"
  exit 1
fi

echo "== ctest -L gpu ($(elapsed))"
(cd build-gpu && timeout 100 ctest -L gpu --output-on-failure -j 2 >"$OUT/ctest_gpu.log" 2>&1) || status=1
grep -E "tests passed|Failed|\*\*\*" "$OUT/ctest_gpu.log" | head -20

echo "== mtplab_bench_kernels --only fused ($(elapsed))"
CUDA_VISIBLE_DEVICES=0 timeout 40 build-gpu/bin/mtplab_bench_kernels --only fused --reps 100 --out "$OUT" \
  >"$OUT/bench_kernels_fused.txt" 2>&1 || status=1
cat "$OUT/bench_kernels_fused.txt"

echo "== mtplab_bench_step ($(elapsed))"
CUDA_VISIBLE_DEVICES=0 timeout 120 build-gpu/bin/mtplab_bench_step --context 4096 --reps 30 --k 1,4 --out "$OUT" \
  >"$OUT/bench_step.txt" 2>&1 || status=1
tail -12 "$OUT/bench_step.txt"
echo "== done ($(elapsed)), status $status"
exit $status
