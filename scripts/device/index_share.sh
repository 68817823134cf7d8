#!/usr/bin/env bash
# One device call for the index_share arm on one H200: build the targets it needs (cuda preset,
# warnings not errors), then
#   bench: mtplab_bench_step at the glm5.3-flash shape, contexts 4096 and 16384 rows, k = 3, BF16
#          head, cuda_graph on, index_share off and on: the single-sequence step (B = 1) and the
#          batched step at B = 16, on the same weights (one synthesis);
#   test:  test_gpu_index_share (CUDA vs CPU with index_share on, tiny and small, B = 1 and 3,
#          graphs on / off; the op against the CPU);
#   exp:   experiments/index-share.yaml (index_share x draft_len 2..4), output results in $OUT.
# STEPS (default "bench test exp") picks steps; the test and the experiment run side by side after
# the bench (the bench alone, so its figures see an idle GPU). The experiment resumes from
# $RESUME_H5 when given (a partial results file of an earlier call). Every step has a timeout and
# a log under $OUT; a failing step does not stop the others.
#
#   OUT=/some/dir [STEPS="bench test exp"] [RESUME_H5=file.h5] scripts/device/index_share.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
OUT=${OUT:-$root/build-gpu/index-share-out}
STEPS=${STEPS:-"bench test exp"}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MTPLAB_SOURCE_DIR=$root MTPLAB_SHA_FROM_FILE=1 NCCL_NVLS_ENABLE=0
t0=$(date +%s)
elapsed() { echo "$(($(date +%s) - t0))s"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }
status=0

echo "== build ($(elapsed))"
targets=(mtplab mtplab_bench_step test_gpu_index_share)
if ! timeout 60 cmake --preset cuda -B build-gpu -G Ninja -DMTPLAB_WERROR=OFF >"$OUT/build.log" 2>&1 ||
   ! timeout 170 cmake --build build-gpu -j 16 --target "${targets[@]}" >>"$OUT/build.log" 2>&1; then
  tail -30 "$OUT/build.log"
  exit 1
fi

if has bench; then
  echo "== bench ($(elapsed))"
  timeout 110 build-gpu/bin/mtplab_bench_step --context 4096,16384 --k 3 --heads bf16 --graphs on \
    --index-share off,on --batch 16 --with-single --reps 20 --warmup 4 --out "$OUT" \
    >"$OUT/bench_step.txt" 2>&1 || status=1
  grep -v "^drafter" "$OUT/bench_step.txt" | tail -22
fi

pids=()
if has test; then
  echo "== test_gpu_index_share ($(elapsed), in the background)"
  (timeout 120 build-gpu/tests/test_gpu_index_share >"$OUT/test_gpu_index_share.log" 2>&1; echo "rc=$?" >>"$OUT/test_gpu_index_share.log") &
  pids+=($!)
fi
if has exp; then
  echo "== experiments/index-share.yaml ($(elapsed), in the background)"
  [[ -n "${RESUME_H5:-}" && -f "$RESUME_H5" ]] && cp "$RESUME_H5" "$OUT/index-share.h5"
  (timeout --signal=TERM "${EXP_S:-150}" build-gpu/bin/mtplab run experiments/index-share.yaml --out "$OUT/index-share.h5" \
    >"$OUT/index-share.log" 2>&1; echo "rc=$?" >>"$OUT/index-share.log") &
  pids+=($!)
fi
for p in "${pids[@]}"; do wait "$p"; done
if has test; then
  grep -E "^\[gpu-index-share\].*compared|PASSED|FAILED|OK \]|rc=" "$OUT/test_gpu_index_share.log" | tail -20
  grep -q "rc=0" "$OUT/test_gpu_index_share.log" || status=1
fi
if has exp; then
  tail -16 "$OUT/index-share.log"
  grep -q "rc=0" "$OUT/index-share.log" || status=1
fi
echo "== done ($(elapsed)), status $status"
exit $status
