#!/usr/bin/env bash
# Rank scaling on one multi-GPU node (nvidia-h200-x2, -x4 or -x8), one device call per few rank
# counts: for each N of $NS that the node has GPUs for, the end-to-end GPU test at N ranks
# (drafts at N ranks against 1, every arm), mtplab_bench_exchange at N ranks (every protocol next
# to bare NCCL collectives of the same size), and experiments/rank-scaling.yaml at N ranks (head
# none / vocab, every exchange protocol, graph off / on, B = 1, 8, 64), its drafts compared with
# the 1-GPU run's (analysis/compare_drafts.py; near-ties counted). The node's topology
# (nvidia-smi topo -m) and NCCL version go to env.txt.
#
#   OUT=/some/dir [NS="1 2 4 8"] [BUILD=0] [EXP_S=150] scripts/device/scaling.sh
#
# NS defaults to every count of 1 2 4 8 the node has GPUs for. N = 1 must have run (in this call
# or an earlier one into the same $OUT, e.g. NS=1 first) for the drafts to be compared. Each
# experiment gets at most EXP_S seconds (SIGTERM: the points done stay in its file; run it again
# into the same $OUT to resume). Everything is packed into $OUT/scaling.tgz, the summary
# (scaling.txt) beside it; the exit status is non-zero when a step failed.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
FINAL=${OUT:-$root/build-gpu/scaling-out}
OUT=$FINAL/logs
mkdir -p "$OUT"
pack() { cp "$OUT/scaling.txt" "$FINAL/" 2>/dev/null; tar -C "$FINAL" -czf "$FINAL/scaling.tgz" logs; }
trap pack EXIT
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MTPLAB_SOURCE_DIR=$root \
  MTPLAB_SHA_FROM_FILE=1
t0=$(date +%s)
elapsed() { echo "$(($(date +%s) - t0))s"; }
status=0
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
NS=${NS:-$(for n in 1 2 4 8; do ((n <= gpus)) && printf '%s ' "$n"; done)}
EXP_S=${EXP_S:-150}
{
  date -u
  nvidia-smi
  nvidia-smi topo -m
  hdr=$(find /usr/include /usr/local/include /usr/local/cuda/include -name nccl.h 2>/dev/null | head -1)
  [[ -n $hdr ]] && grep -E '^#define NCCL_(MAJOR|MINOR|PATCH) ' "$hdr"
} >"$OUT/env.txt" 2>&1
echo "== $gpus GPU(s); rank counts: $NS ($(elapsed))" | tee "$OUT/scaling.txt"
if [[ ${BUILD:-1} != 0 ]]; then
  echo "== build ($(elapsed))"
  if ! timeout 60 cmake --preset cuda -B build-gpu -G Ninja -DMTPLAB_WERROR=OFF >"$OUT/configure.log" 2>&1 ||
     ! timeout 240 cmake --build build-gpu -j "$(nproc)" >"$OUT/build.log" 2>&1; then
    tail -40 "$OUT/configure.log" "$OUT/build.log"; exit 1
  fi
fi
summary() {  # the points of one results file: label, steps, propose and step medians
  python3 - "$1" <<'PY' 2>&1
import sys
sys.path.insert(0, "analysis")
import mtplab_results as mr
p = mr.Results(sys.argv[1]).points
print(sys.argv[1])
print(p[["label", "steps", "propose_ms_median", "step_ms_median", "step_ms_rel_spread"]].to_string(index=False))
PY
}
for n in $NS; do
  if ((n > gpus)); then
    echo "== $n ranks: skipped, $gpus GPU(s) on this node" | tee -a "$OUT/scaling.txt"
    status=1
    continue
  fi
  h5="$OUT/rank-scaling-${n}gpu.h5"
  if ((n == 1)); then
    echo "== 1 GPU: experiments/rank-scaling.yaml, head none ($(elapsed))"
    CUDA_VISIBLE_DEVICES=0 timeout -s TERM "$EXP_S" build-gpu/bin/mtplab run experiments/rank-scaling.yaml \
      --set 'sweep.grid.head_sharding=[none]' --out "$h5" >"$OUT/rank-scaling-1gpu.log" 2>&1
    rc=$?; echo "rc=$rc"; ((rc == 0)) || status=1
  else
    echo "== $n ranks: test_gpu_e2e_mpi ($(elapsed))"
    timeout 300 mpirun -np "$n" --oversubscribe build-gpu/tests/test_gpu_e2e_mpi >"$OUT/test_gpu_e2e_mpi-$n.log" 2>&1
    rc=$?; echo "rc=$rc"; ((rc == 0)) || status=1
    grep -E "PASSED|FAILED|SKIPPED" "$OUT/test_gpu_e2e_mpi-$n.log" | sort | uniq -c | head -5
    echo "== $n ranks: mtplab_bench_exchange ($(elapsed))"
    timeout 180 mpirun -np "$n" --oversubscribe build-gpu/bin/mtplab_bench_exchange --out "$OUT/exchange-$n" \
      >"$OUT/bench_exchange-$n.txt" 2>&1
    rc=$?; echo "rc=$rc"; ((rc == 0)) || status=1
    tail -12 "$OUT/bench_exchange-$n.txt" | tee -a "$OUT/scaling.txt"
    echo "== $n ranks: experiments/rank-scaling.yaml ($(elapsed))"
    extra=()
    ((n == 2)) && extra=(--set 'sweep.grid.exchange=[packed_u64,allgather_pairs,allgather_logits,bf16_lanes]')
    timeout -s TERM "$EXP_S" mpirun -np "$n" --oversubscribe build-gpu/bin/mtplab run experiments/rank-scaling.yaml \
      "${extra[@]}" --out "$h5" >"$OUT/rank-scaling-${n}gpu.log" 2>&1
    rc=$?; echo "rc=$rc"; ((rc == 0)) || status=1
  fi
  summary "$h5" | tee -a "$OUT/scaling.txt"
  if ((n > 1)) && [[ -f $OUT/rank-scaling-1gpu.h5 ]]; then
    echo "-- drafts at $n ranks against 1 (near-ties counted)" | tee -a "$OUT/scaling.txt"
    python3 analysis/compare_drafts.py "$OUT/rank-scaling-1gpu.h5" "$h5" 2>&1 | grep -v UNPAIRED |
      tee -a "$OUT/scaling.txt"
  fi
done
echo "== done ($(elapsed)), status $status"
exit $status
