# shellcheck shell=bash
# Sourced by quickstart.sh and test.sh: the shared steps (install what is missing, configure with
# a CMake preset using Ninja, build with every core). Not meant to be run on its own.
# Invariants: runs from the repository root; every step stops the script on failure (set -e in
# the caller); the preset decides the build directory (build/ for default, cpu, cuda; build-ci/
# for ci), and the build directory records which preset configured it (.mtplab-preset).

mtplab_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$mtplab_root" || exit 1

mtplab_jobs=$(nproc 2>/dev/null || echo 2)

step() { printf '\n==> %s\n' "$*"; }

# The build directory a configure preset writes to (the presets' binaryDir, read from the file
# so that this stays true when the presets change).
preset_binary_dir() {
  local preset=$1
  python3 - "$preset" <<'PY' 2>/dev/null || echo build
import json, sys
presets = {p["name"]: p for p in json.load(open("CMakePresets.json"))["configurePresets"]}
p = presets.get(sys.argv[1], {})
while "binaryDir" not in p and "inherits" in p:
    p = presets[p["inherits"] if isinstance(p["inherits"], str) else p["inherits"][0]]
print(p.get("binaryDir", "${sourceDir}/build").replace("${sourceDir}/", ""))
PY
}

install_deps() {
  step "system packages"
  scripts/install-deps.sh
}

# The preset that configured a build directory, as configure_and_build recorded it (empty when
# none did): test.sh builds and tests in the tree quickstart.sh left, whatever its preset.
recorded_preset() {
  local dir
  dir=$(preset_binary_dir "${1:-default}")
  cat "$dir/.mtplab-preset" 2>/dev/null || true
}

# configure_and_build PRESET [TARGET...]: configures with Ninja the first time (an existing build
# directory keeps its generator), then builds the targets (everything when none are named).
configure_and_build() {
  local preset=$1 dir
  shift
  dir=$(preset_binary_dir "$preset")
  step "configure (preset $preset, $dir/)"
  if [[ -f "$dir/CMakeCache.txt" ]]; then
    cmake --preset "$preset"
  else
    cmake --preset "$preset" -G Ninja
  fi
  echo "$preset" >"$dir/.mtplab-preset"
  local targets=()
  (($#)) && targets=(--target "$@")
  step "build (${*:-everything}, $mtplab_jobs jobs)"
  cmake --build --preset "$preset" -j "$mtplab_jobs" "${targets[@]}"
}

# mpirun with what a laptop or a container needs: more ranks than cores, no pinning, and the
# root opt-in only when we are root (Open MPI refuses root without it).
run_mpi() {
  local np=$1
  shift
  if [[ $(id -u) -eq 0 ]]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
  mpirun --oversubscribe --bind-to none -np "$np" "$@"
}
