#!/usr/bin/env bash
# One device call (nvidia-h200-x2, under 10 minutes) for the figures of a session's end: every GPU
# test and the kernel, step and exchange benchmarks (validate.sh without the batch-qidx experiment,
# the PDL-off and context_gemm step runs and rank-scaling), then the PyTorch peer's draft step next
# to mtplab's on the same weights with the time left (peer_exchange.sh without its exchange run).
#
#   OUT=/some/dir scripts/device/final.sh
#
# $OUT/final.tgz: validate.sh's outputs (validate/) and peer_exchange.sh's (peer/), with the
# figures' text files also beside it (a device call returns at most 8 files). LIMIT (s, default
# 570): the whole call's time; the peer gets what validate.sh leaves of it.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
OUT=${OUT:-$root/build-gpu/final-out}
LIMIT=${LIMIT:-570}
t0=$(date +%s)
OUT=$OUT/validate SKIP="qidx nopdl cgemm rank ${SKIP:-}" timeout $((LIMIT - 200)) bash scripts/device/validate.sh
v=$?
left=$((LIMIT - ($(date +%s) - t0) - 10))
echo "== validate.sh rc=$v; $left s left for the peer"
OUT=$OUT/peer SKIP_EXCHANGE=1 BUDGET=$left timeout "$left" bash scripts/device/peer_exchange.sh
p=$?
echo "== peer_exchange.sh rc=$p"
cp "$OUT"/validate/bench_step.txt "$OUT/bench_step.txt" 2>/dev/null
cp "$OUT"/validate/bench_kernels.txt "$OUT"/validate/bench_exchange_blocking1.txt "$OUT"/peer/peer_step.txt "$OUT"/ 2>/dev/null
cp "$OUT"/peer/bench_step.txt "$OUT/bench_step_peer_weights.txt" 2>/dev/null
tar -C "$OUT" -czf "$OUT/final.tgz" validate peer && rm -rf "$OUT/validate" "$OUT/peer"
exit $((v != 0 || p != 0))
