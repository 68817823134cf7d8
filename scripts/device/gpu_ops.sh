#!/usr/bin/env bash
# Builds the CUDA backend, checks every kernel against the CPU reference and benchmarks the
# memory-bound ones, on a machine with an NVIDIA GPU (written for one H200). Logs, CSVs and the
# compiler's resource report go under $OUT (default build-gpu/gpu-ops-out); the end of stdout is
# a summary: test verdicts, then the benchmark table.
#
#   OUT=/some/dir scripts/device/gpu_ops.sh            everything
#   GPU_OPS_SKIP_SANITIZER=1 scripts/device/gpu_ops.sh  without compute-sanitizer
#   GPU_OPS_BENCH_ARGS="--only head" ...                extra arguments for the benchmark
#   GPU_OPS_ALL=1 ...                                   build everything, run every `gpu` test
#
# Invariants: the build directory is build-gpu/ (the `cuda` preset's settings, -B overridden) so
# it never touches another preset's tree; a failing step is reported and the later steps still
# run where they can (a failing test does not hide the benchmark); the exit status is non-zero
# when the build or any GPU op test failed.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
OUT=${OUT:-$root/build-gpu/gpu-ops-out}
mkdir -p "$OUT"
build="build-gpu"
jobs=$(nproc 2>/dev/null || echo 4)
status=0
step() { printf '\n==> %s\n' "$*"; }

step "environment"
{
  date -u
  git rev-parse HEAD 2>/dev/null && git status --short 2>/dev/null | head -50
  nvidia-smi 2>&1
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu --format=csv 2>&1
  command -v nvcc && nvcc --version
  cmake --version | head -1
  for lib in mpi.h H5public.h yaml-cpp/yaml.h gtest/gtest.h; do
    found=$(find /usr/include /usr/local/include /usr/lib/x86_64-linux-gnu/openmpi/include -name "$(basename "$lib")" -path "*$lib" 2>/dev/null | head -1)
    echo "header $lib: ${found:-MISSING}"
  done
} >"$OUT/env.txt" 2>&1
grep -E "MISSING|NVIDIA H|release" "$OUT/env.txt"

step "configure (cuda preset, $build/)"
if ! cmake --preset cuda -B "$build" -G Ninja -DMTPLAB_WERROR=ON >"$OUT/configure.log" 2>&1; then
  echo "configure FAILED (tail of $OUT/configure.log):"
  tail -30 "$OUT/configure.log"
  exit 1
fi
grep "mtplab: CUDA backend" "$OUT/configure.log"

step "build test_ops_gpu and mtplab_bench_kernels ($jobs jobs)"
targets=(test_ops_gpu)
if cmake --build "$build" --target help 2>/dev/null | grep -q mtplab_bench_kernels; then
  targets+=(mtplab_bench_kernels)
fi
if ! cmake --build "$build" --target "${targets[@]}" -j "$jobs" >"$OUT/build.log" 2>&1; then
  echo "build FAILED (tail of $OUT/build.log):"
  tail -40 "$OUT/build.log"
  exit 1
fi
bench_bin=$build/bin/mtplab_bench_kernels
if [[ ! -x $bench_bin ]]; then
  # bench/ is not yet added to the top CMakeLists.txt: build it by hand against the built libraries.
  echo "(mtplab_bench_kernels is not a CMake target yet: building it with nvcc directly)"
  if nvcc -std=c++20 -arch=sm_90 -O3 -lineinfo -Ilib --expt-relaxed-constexpr bench/bench_kernels.cu \
    -o "$build/mtplab_bench_kernels" "$build/lib/libmtplab_ops.a" "$build/lib/libmtplab_core.a" -lcublasLt -lyaml-cpp \
    >>"$OUT/build.log" 2>&1; then
    bench_bin=$build/mtplab_bench_kernels
  else
    echo "bench build FAILED (see build.log)"
    status=1
  fi
fi

step "resource usage and 16-byte loads (cuobjdump)"
ops_lib=$build/lib/libmtplab_ops.a
if command -v cuobjdump >/dev/null; then
  cuobjdump --dump-resource-usage "$ops_lib" >"$OUT/resource_usage.txt" 2>&1
  cuobjdump --dump-sass "$ops_lib" >"$OUT/ops.sass" 2>&1
  echo "LDG.E.128 (16-byte global loads) in the ops library: $(grep -c 'LDG.E.128' "$OUT/ops.sass")"
  echo "local-memory spills (LDL/STL): $(grep -cE '\b(LDL|STL)\b' "$OUT/ops.sass")"
  gzip -f "$OUT/ops.sass"
fi

step "GPU op tests vs the CPU reference (ctest -L gpu)"
ctest_filter=(-R test_ops_gpu)
if [[ -n "${GPU_OPS_ALL:-}" ]]; then
  cmake --build "$build" -j "$jobs" >>"$OUT/build.log" 2>&1 || echo "full build FAILED (see build.log)"
  ctest_filter=()
fi
(cd "$build" && ctest -L gpu "${ctest_filter[@]}" --output-on-failure --timeout 900) >"$OUT/ctest.log" 2>&1
rc=$?
tail -5 "$OUT/ctest.log"
[[ $rc -ne 0 ]] && status=1
# The per-test verdicts, for the summary (the binary repeats what ctest ran, with gtest's output).
"$build/tests/test_ops_gpu" --gtest_brief=0 >"$OUT/test_ops_gpu.log" 2>&1
grep -E "^\[  (FAILED|PASSED|  OK) |^GPU op tests|SKIPPED" "$OUT/test_ops_gpu.log" | sed 's/^/  /' | tail -60

if [[ -z "${GPU_OPS_SKIP_SANITIZER:-}" ]] && command -v compute-sanitizer >/dev/null; then
  step "compute-sanitizer memcheck + racecheck on the tiny shapes"
  for tool in memcheck racecheck; do
    timeout 600 compute-sanitizer --tool "$tool" --error-exitcode 9 "$build/tests/test_ops_gpu" --gtest_filter='*tiny*' \
      >"$OUT/sanitizer_$tool.log" 2>&1
    src=$?
    echo "$tool: exit $src ($(grep -c 'ERROR SUMMARY: 0 errors' "$OUT/sanitizer_$tool.log") clean summaries)"
    grep -m3 -E "Invalid|Race|ERROR SUMMARY" "$OUT/sanitizer_$tool.log" | sed 's/^/    /'
  done
fi

step "benchmarks (glm5.3-flash shapes)"
if [[ -x $bench_bin ]]; then
  # shellcheck disable=SC2086
  "$bench_bin" --out "$OUT/bench" ${GPU_OPS_BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
  [[ ${PIPESTATUS[0]} -ne 0 ]] && status=1
fi

step "done: status $status, files under $OUT"
exit $status
