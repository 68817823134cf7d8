#!/usr/bin/env bash
# One device call on nvidia-h200-x2 after a change to the kernels or the drafter: build
# build-gpu/ (cuda preset), every GPU test (op tests and the end-to-end ones at 1 and 2 GPUs),
# compute-sanitizer memcheck / racecheck on the norm, router and expert tests, then the benchmarks:
# mtplab_bench_kernels (single launches and graph mode) on GPU 0 while experiments/batch-qidx.yaml
# runs on GPU 1, then mtplab_bench_step, then an ncu per-kernel profile of one eager FP8 draft.
# Every step has a timeout; a failing step does not stop the later ones.
#
#   OUT=/some/dir [SKIP="qidx nopdl cgemm rank"] scripts/device/validate.sh [--no-bench]
#
# SKIP leaves out benchmark steps (to fit a call with other work): qidx (the batch-qidx experiment),
# nopdl (bench_step with programmatic launch off), cgemm (bench_step --context-gemm), rank (the
# rank-scaling experiment on 1 and 2 GPUs).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
FINAL=${OUT:-$root/build-gpu/validate-out}
# Everything goes to $FINAL/logs and is packed into $FINAL/validate.tgz at the end (the device
# tool returns only a few files), beside the summary files named in KEEP.
OUT=$FINAL/logs
mkdir -p "$OUT"
pack() { cp "$OUT"/bench_step*.txt "$OUT"/bench_kernels.txt "$OUT"/bench_exchange*.txt "$FINAL"/ 2>/dev/null; tar -C "$FINAL" -czf "$FINAL/validate.tgz" logs; rm -rf "$OUT"; }
trap pack EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MTPLAB_SOURCE_DIR=$root MTPLAB_SHA_FROM_FILE=1
t0=$(date +%s)
elapsed() { echo "$(($(date +%s) - t0))s"; }
bench=1
[[ ${1:-} == --no-bench ]] && bench=0
skip() { [[ " ${SKIP:-} " == *" $1 "* ]]; }
status=0
{ date -u; nvidia-smi; } >"$OUT/env.txt" 2>&1
echo "== build ($(elapsed))"
if ! timeout 60 cmake --preset cuda -B build-gpu -G Ninja -DMTPLAB_WERROR=OFF >"$OUT/configure.log" 2>&1 ||
   ! timeout 240 cmake --build build-gpu -j "$(nproc)" >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/configure.log" "$OUT/build.log"; exit 1
fi
T=build-gpu/tests
echo "== GPU tests ($(elapsed))"
(CUDA_VISIBLE_DEVICES=1 timeout 300 $T/test_gpu_e2e >"$OUT/test_gpu_e2e.log" 2>&1; echo $? >"$OUT/test_gpu_e2e.rc"
 MTPLAB_CUDA_PDL=0 CUDA_VISIBLE_DEVICES=1 timeout 300 $T/test_gpu_e2e >"$OUT/test_gpu_e2e_nopdl.log" 2>&1
 echo $? >"$OUT/test_gpu_e2e_nopdl.rc") &
CUDA_VISIBLE_DEVICES=0 timeout 200 $T/test_ops_gpu >"$OUT/test_ops_gpu.log" 2>&1
echo "test_ops_gpu rc=$?: $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/test_ops_gpu.log" | tr '\n' ' ')"
grep -A8 "Failure" "$OUT/test_ops_gpu.log" | head -40
CUDA_VISIBLE_DEVICES=0 timeout 200 $T/test_gpu_qidx >"$OUT/test_gpu_qidx.log" 2>&1
echo "test_gpu_qidx rc=$?"; grep -iE "differ|PASSED|FAILED" "$OUT/test_gpu_qidx.log" | head -12
CUDA_VISIBLE_DEVICES=0 timeout 200 $T/test_gpu_context_gemm >"$OUT/test_gpu_context_gemm.log" 2>&1
echo "test_gpu_context_gemm rc=$?"; grep -E "gpu-context-gemm|PASSED|FAILED" "$OUT/test_gpu_context_gemm.log" | head -8
for tool in memcheck racecheck; do
  CUDA_VISIBLE_DEVICES=0 timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $T/test_ops_gpu \
    --gtest_filter='*Norm*:*Moe*tiny*:*Moe*small*:*Fused*tiny*:*Fused*small*' >"$OUT/sanitizer_$tool.log" 2>&1
  echo "sanitizer $tool rc=$? $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log")"
  # The decode (both paths: cp.async ring, cluster merge) and the indexer (both select kernels).
  CUDA_VISIBLE_DEVICES=0 timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 $T/test_ops_gpu \
    --gtest_filter='Models/GpuAttention.Mla/tiny:Models/GpuAttention.IndexerScoresAndSelect/tiny' \
    >"$OUT/sanitizer_${tool}_attention.log" 2>&1
  echo "sanitizer $tool (MLA, indexer) rc=$? $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_${tool}_attention.log")"
done
wait
echo "test_gpu_e2e rc=$(cat "$OUT/test_gpu_e2e.rc")"; grep -E "agree|PASSED|FAILED" "$OUT/test_gpu_e2e.log" | head -20
echo "test_gpu_e2e (MTPLAB_CUDA_PDL=0) rc=$(cat "$OUT/test_gpu_e2e_nopdl.rc")"
grep -E "agree" "$OUT/test_gpu_e2e.log" >"$OUT/agree_pdl.txt"; grep -E "agree" "$OUT/test_gpu_e2e_nopdl.log" >"$OUT/agree_nopdl.txt"
cmp -s "$OUT/agree_pdl.txt" "$OUT/agree_nopdl.txt" && echo "agreement lines identical with and without PDL" || echo "agreement lines DIFFER with and without PDL"
timeout 300 mpirun -np 2 --oversubscribe $T/test_gpu_e2e_mpi >"$OUT/test_gpu_e2e_mpi.log" 2>&1
echo "test_gpu_e2e_mpi rc=$?"; grep -E "^\[  PASSED|^\[  FAILED" "$OUT/test_gpu_e2e_mpi.log" | head -4
timeout 180 mpirun -np 2 --oversubscribe $T/test_dist_nccl >"$OUT/test_dist_nccl.log" 2>&1
echo "test_dist_nccl rc=$?"; grep -E "^\[  PASSED|^\[  FAILED|\[nccl\]" "$OUT/test_dist_nccl.log" | head -6
# A rank dies while its peer waits in NCCL (and the MPI failure modes): every job must end non-zero.
timeout 200 ctest --test-dir build-gpu -R '^dist_failure' --output-on-failure >"$OUT/dist_failure.log" 2>&1
echo "dist_failure rc=$? $(grep -E 'tests passed|tests failed' "$OUT/dist_failure.log")"
if ((bench)); then
  for blocking in 1 0; do
    MTPLAB_NCCL_BLOCKING=$blocking timeout 150 mpirun -np 2 --oversubscribe -x MTPLAB_NCCL_BLOCKING \
      build-gpu/bin/mtplab_bench_exchange --reps 100 --out "$OUT/exchange-blocking$blocking" \
      >"$OUT/bench_exchange_blocking$blocking.txt" 2>&1
    echo "bench_exchange (MTPLAB_NCCL_BLOCKING=$blocking) rc=$?"
    grep -E "^case|^bare_allreduce|^packed_u64|^allgather_pairs|target" "$OUT/bench_exchange_blocking$blocking.txt"
  done
fi
if ((bench)); then
  echo "== bench_kernels (GPU 0) || batch-qidx experiment (GPU 1) ($(elapsed))"
  skip qidx || (CUDA_VISIBLE_DEVICES=1 timeout 240 build-gpu/bin/mtplab run experiments/batch-qidx.yaml \
     --out "$OUT/batch-qidx.h5" >"$OUT/batch-qidx.log" 2>&1; echo $? >"$OUT/batch-qidx.rc") &
  CUDA_VISIBLE_DEVICES=0 timeout 200 build-gpu/bin/mtplab_bench_kernels --reps 60 --out "$OUT" >"$OUT/bench_kernels.txt" 2>&1
  echo "bench_kernels rc=$?"; grep -vE "^\s*$" "$OUT/bench_kernels.txt" | tail -40 | cut -c1-200
  wait
  skip qidx || { echo "batch-qidx rc=$(cat "$OUT/batch-qidx.rc") ($(elapsed))"; tail -8 "$OUT/batch-qidx.log" | cut -c1-220; }
  echo "== bench_step ($(elapsed))"
  CUDA_VISIBLE_DEVICES=0 timeout 200 build-gpu/bin/mtplab_bench_step --context 4096 --reps 30 --k 1,4 --out "$OUT" \
    >"$OUT/bench_step.txt" 2>&1
  echo "bench_step rc=$?"; tail -11 "$OUT/bench_step.txt"
  if ! skip nopdl; then
    echo "== bench_step with programmatic launch off (MTPLAB_CUDA_PDL=0) ($(elapsed))"
    MTPLAB_CUDA_PDL=0 CUDA_VISIBLE_DEVICES=0 timeout 150 build-gpu/bin/mtplab_bench_step --context 4096 --reps 30 --k 4 \
      --out "$OUT/nopdl" >"$OUT/bench_step_nopdl.txt" 2>&1
    echo "bench_step (no PDL) rc=$?"; tail -5 "$OUT/bench_step_nopdl.txt"
  fi
  if ! skip cgemm; then
    echo "== bench_step --context-gemm: the prefill as GEMMs ($(elapsed))"
    CUDA_VISIBLE_DEVICES=0 timeout 120 build-gpu/bin/mtplab_bench_step --context 4096 --reps 10 --k 1 --heads fp8 \
      --graphs on --context-gemm --out "$OUT/cgemm" >"$OUT/bench_step_context_gemm.txt" 2>&1
    echo "bench_step (context_gemm) rc=$?"; grep -h "prefill of" "$OUT/bench_step.txt" "$OUT/bench_step_context_gemm.txt"
    tail -2 "$OUT/bench_step_context_gemm.txt"
  fi
  if ! skip rank; then
    echo "== rank-scaling: the draft step on 1 GPU, then on 2 ($(elapsed))"
    CUDA_VISIBLE_DEVICES=0 timeout 150 build-gpu/bin/mtplab run experiments/rank-scaling.yaml \
      --set 'sweep.grid.head_sharding=[none]' --out "$OUT/rank-scaling-1gpu.h5" >"$OUT/rank-scaling-1gpu.log" 2>&1
    echo "1 GPU rc=$?"
    timeout 300 mpirun -np 2 --oversubscribe build-gpu/bin/mtplab run experiments/rank-scaling.yaml \
      --out "$OUT/rank-scaling-2gpu.h5" >"$OUT/rank-scaling-2gpu.log" 2>&1
    echo "2 GPUs rc=$?"
    python3 - "$OUT" <<'PY' 2>&1 | tee "$OUT/rank-scaling.txt"
import sys
sys.path.insert(0, "analysis")
import mtplab_results as mr
for name in ("rank-scaling-1gpu", "rank-scaling-2gpu"):
    r = mr.Results(f"{sys.argv[1]}/{name}.h5")
    p = r.points
    print(name)
    print(p[["label", "steps", "propose_ms_median", "step_ms_median", "step_ms_rel_spread"]].to_string(index=False))
PY
    # Drafts on 2 GPUs against 1 (the head_sharding: none points; near-ties counted).
    python3 analysis/compare_drafts.py "$OUT/rank-scaling-1gpu.h5" "$OUT/rank-scaling-2gpu.h5" 2>&1 |
      grep -v UNPAIRED | tee -a "$OUT/rank-scaling.txt"
  fi
  [[ ${NCU:-0} == 1 ]] || { echo "== done ($(elapsed))"; exit $status; }
  echo "== ncu: one eager FP8 draft ($(elapsed))"
  CUDA_VISIBLE_DEVICES=0 timeout 150 ncu --clock-control none --profile-from-start off --csv \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size,launch__registers_per_thread \
    build-gpu/bin/mtplab_bench_step --heads fp8 --graphs off --k 1 --reps 3 --warmup 2 --profile --out "$OUT/ncu" \
    >"$OUT/ncu_step.csv" 2>"$OUT/ncu_step.err"
  echo "ncu rc=$?"
fi
echo "== done ($(elapsed))"
