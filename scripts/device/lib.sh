# shellcheck shell=bash disable=SC2034
# (SC2034: the variables set here are read by the scripts that source this file.)
# Sourced by scripts/device/run.sh: what every GPU-node script
# needs, written once. Not meant to be run on its own.
#
# Sets: dev_root (the repository root, also the working directory), OUT (every output goes under
# it; default build-gpu/out), LOG ($OUT/logs: one log per step), and the environment the binaries
# and tests expect (Open MPI as root, MTPLAB_SOURCE_DIR, MTPLAB_SHA_FROM_FILE=1 so that
# .mtplab-git-sha from scripts/device/stamp.sh names the commit of a tree copied without .git,
# NCCL_NVLS_ENABLE=0, unbuffered Python).
#
# Functions:
#   step TEXT                    a heading on stdout, with the seconds since the start
#   run NAME SECONDS CMD...      CMD under `timeout SECONDS`, stdout and stderr to $LOG/NAME.log;
#                                prints "NAME rc=N"; a non-zero rc sets dev_status=1 and returns it.
#                                At SECONDS CMD gets SIGTERM (an experiment keeps the points it
#                                finished), 30 s later SIGKILL; TIMEOUT_SIGNAL picks another.
#   gpu_build [TARGET...]        configure the `gpu` preset (build-gpu/) and build the targets
#                                (everything when none); BUILD=0 skips it (use the build there)
#   gpu_guard                    exit 3 when GPU=text is set and the first GPU's name lacks it
#   gpu_count                    the number of GPUs nvidia-smi lists (0 without a driver)
#   env_report                   date, nvidia-smi, topology, nvcc / cmake / NCCL versions, git
#                                commit -> $OUT/env.txt
#   keep NAME...                 copy $LOG/NAME.log to $OUT/NAME.txt (the tables worth reading)
#   pack NAME                    $OUT/NAME.tgz of $LOG (PACK=1 in run.sh does it at the end)
# DRY_RUN=1: `run` and `gpu_build` print the commands they would run and run nothing; the GPU
# checks pass.

dev_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$dev_root" || exit 1
OUT=${OUT:-$dev_root/build-gpu/out}
mkdir -p "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/logs
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MTPLAB_SOURCE_DIR=$dev_root \
  MTPLAB_SHA_FROM_FILE=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
DRY_RUN=${DRY_RUN:-0}
BUILD_DIR=build-gpu
BIN=$BUILD_DIR/bin
TESTS_BIN=$BUILD_DIR/tests
dev_t0=$(date +%s)
dev_status=0

elapsed() { echo "$(($(date +%s) - dev_t0))s"; }
step() { echo "== $* ($(elapsed))"; }
dry() { [[ $DRY_RUN == 1 ]]; }

run() {
  local name=$1 secs=$2 rc
  shift 2
  if dry; then
    echo "  [dry run] timeout $secs $* >$LOG/$name.log"
    return 0
  fi
  timeout -s "${TIMEOUT_SIGNAL:-TERM}" -k 30 "$secs" "$@" >"$LOG/$name.log" 2>&1
  rc=$?
  echo "$name rc=$rc"
  ((rc == 0)) || dev_status=1
  return $rc
}

gpu_count() {
  if dry; then echo "${DRY_GPUS:-2}"; return; fi
  nvidia-smi -L 2>/dev/null | grep -c '^GPU'
}

gpu_guard() {
  local name
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  echo "GPU: ${name:-none found} ($(gpu_count) in all)"
  if [[ -n ${GPU:-} && $name != *"$GPU"* ]] && ! dry; then
    echo "GPU=$GPU asked for, this machine has '${name:-no GPU}': nothing run" >&2
    exit 3
  fi
}

env_report() {
  dry && return 0
  {
    date -u
    git -C "$dev_root" log -1 --oneline 2>/dev/null || cat "$dev_root/.mtplab-git-sha" 2>/dev/null
    nvidia-smi
    nvidia-smi topo -m
    nvcc --version
    cmake --version | head -1
    local hdr
    hdr=$(find /usr/include /usr/local/include /usr/local/cuda/include -name nccl.h 2>/dev/null | head -1)
    [[ -n $hdr ]] && grep -E '^#define NCCL_(MAJOR|MINOR|PATCH) ' "$hdr"
    env | grep -E '^(NCCL|CUDA|MTPLAB)_'
  } >"$OUT/env.txt" 2>&1
}

gpu_build() {
  if [[ ${BUILD:-1} == 0 ]]; then
    echo "build skipped (BUILD=0): using $BUILD_DIR/ as it is"
    return 0
  fi
  local targets=()
  (($#)) && targets=(--target "$@")
  step "build ($BUILD_DIR/, preset gpu${1:+: $*})"
  run configure 300 cmake --preset gpu || { tail -30 "$LOG/configure.log"; exit 1; }
  run build 600 cmake --build --preset gpu -j "$(nproc)" "${targets[@]}" ||
    { grep -E "error" -A5 "$LOG/build.log" | head -60; exit 1; }
}

keep() {
  dry && return 0
  local f
  for f in "$@"; do [[ -f $LOG/$f.log ]] && cp "$LOG/$f.log" "$OUT/$f.txt"; done
  return 0
}

pack() {
  dry && return 0
  tar -C "$OUT" -czf "$OUT/$1.tgz" logs && echo "logs packed into $OUT/$1.tgz"
}
