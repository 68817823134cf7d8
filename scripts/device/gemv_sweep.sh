#!/usr/bin/env bash
# One device call on nvidia-h200 (one GPU) to compare the GEMV kernel variants (MTPLAB_GEMV_VARIANT,
# docs/kernels.md): build test_ops_gpu and mtplab_bench_kernels in build-gpu/ (cuda preset), run the
# variant test (every variant against the CPU reference and v1's bits), time the GEMV cases of
# mtplab_bench_kernels under each variant, then, while time is left, the existing GEMV / linear op
# tests under each variant as the process default. Every step has a timeout; a failing step does not
# stop the later ones. About 3-4 minutes.
#
#   OUT=/some/dir scripts/device/gemv_sweep.sh [VARIANT ...]     (default: v1 rows2 rows4 occ fp8split)
#
# $OUT/gemv_sweep.txt: per case and variant, the graph-mode time per launch and its % of the copy
# bandwidth; $OUT/gemv_sweep.tgz: every log and each variant's bench_kernels.csv.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
FINAL=${OUT:-$root/build-gpu/gemv-sweep-out}
OUT=$FINAL/logs
mkdir -p "$OUT"
pack() { cp "$OUT/gemv_sweep.txt" "$FINAL/" 2>/dev/null; tar -C "$FINAL" -czf "$FINAL/gemv_sweep.tgz" logs; rm -rf "$OUT"; }
trap pack EXIT
export MTPLAB_SOURCE_DIR=$root MTPLAB_SHA_FROM_FILE=1
unset MTPLAB_GEMV_VARIANT MTPLAB_GEMV_SPLIT
t0=$(date +%s)
elapsed() { echo "$(($(date +%s) - t0))"; }
variants=("$@")
((${#variants[@]})) || variants=(v1 rows2 rows4 occ fp8split)
REPS=${REPS:-30}
# The cases of the summary (substrings of mtplab_bench_kernels' names, for --only).
CASES="linear eh_proj,linear q_b,linear kv_b,mla_out_v,linear_fp8 eh_proj,head_argmax bf16,head_argmax fp8,linear o_proj,linear_group"
# The existing GEMV / linear tests: every shape for the linears, tiny and small for the rest.
TESTS='Models/GpuDense.Linear/*:Models/GpuDense.HeadArgmax/tiny:Models/GpuDense.HeadArgmax/small'
TESTS+=':Shapes/GpuFused.LinearGroup*:Models/GpuAttention.Mla/tiny:Models/GpuAttention.Mla/small'
{ date -u; nvidia-smi; git log -1 --oneline 2>/dev/null; } >"$OUT/env.txt" 2>&1

echo "== build ($(elapsed)s)"
if ! timeout 60 cmake --preset cuda -B build-gpu -G Ninja -DMTPLAB_WERROR=OFF >"$OUT/configure.log" 2>&1 ||
   ! timeout 150 cmake --build build-gpu -j "$(nproc)" --target test_ops_gpu mtplab_bench_kernels \
     >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/configure.log" "$OUT/build.log"; exit 1
fi

echo "== variant test: every variant in one run ($(elapsed)s)"
timeout 90 build-gpu/tests/test_ops_gpu --gtest_filter='GpuGemvVariants.*' >"$OUT/test_variants.log" 2>&1
echo "test GpuGemvVariants rc=$?: $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/test_variants.log" | tr '\n' ' ')"
grep -A8 "Failure" "$OUT/test_variants.log" | head -30

for v in "${variants[@]}"; do
  echo "== bench_kernels MTPLAB_GEMV_VARIANT=$v ($(elapsed)s)"
  MTPLAB_GEMV_VARIANT=$v timeout 60 build-gpu/bin/mtplab_bench_kernels --reps "$REPS" --only "$CASES" \
    --out "$OUT/bench_$v" >"$OUT/bench_$v.txt" 2>&1
  echo "rc=$? $(head -1 "$OUT/bench_$v.txt")"
done

for v in "${variants[@]}"; do
  if (($(elapsed) > 200)); then
    echo "== op tests under $v: skipped, $(elapsed)s spent"
    continue
  fi
  echo "== op tests under MTPLAB_GEMV_VARIANT=$v ($(elapsed)s)"
  MTPLAB_GEMV_VARIANT=$v timeout 40 build-gpu/tests/test_ops_gpu --gtest_filter="$TESTS" >"$OUT/test_ops_$v.log" 2>&1
  echo "rc=$?: $(grep -E '^\[  PASSED|^\[  FAILED' "$OUT/test_ops_$v.log" | tr '\n' ' ')"
  grep -A8 "Failure" "$OUT/test_ops_$v.log" | head -20
done

echo "== summary ($(elapsed)s)"
python3 - "$OUT" "${variants[@]}" <<'PY' 2>&1 | tee "$OUT/gemv_sweep.txt"
import csv, os, sys
out, variants = sys.argv[1], sys.argv[2:]
cases = ["linear eh_proj", "linear q_b", "linear kv_b", "mla_out_v", "linear_fp8 eh_proj", "head_argmax bf16",
         "head_argmax fp8", "linear o_proj", "fused u_proj: linear_group"]
rows = {}
for v in variants:
    path = os.path.join(out, f"bench_{v}", "bench_kernels.csv")
    if not os.path.exists(path):
        continue
    with open(path) as f:
        lines = [l for l in f if not l.startswith("#")]
    for r in csv.DictReader(lines):
        if r["graph_median_us"]:
            rows[(r["op"], v)] = (float(r["graph_median_us"]), 100 * float(r["graph_frac_of_copy"]))
print("graph mode (20 launches per graph), per launch: us (% of copy bandwidth)")
print(f"{'case':28}" + "".join(f"{v:>18}" for v in variants))
for c in cases:
    cells = [f"{rows[(c, v)][0]:.2f} ({rows[(c, v)][1]:.1f}%)" if (c, v) in rows else "-" for v in variants]
    print(f"{c:28}" + "".join(f"{x:>18}" for x in cells))
PY
echo "== done ($(elapsed)s)"
