#!/usr/bin/env bash
# Installs with apt the system packages mtplab needs, and only those that are missing.
#
#   scripts/install-deps.sh            install what is missing (as root), or say what to run
#   scripts/install-deps.sh --check    only report; exit 1 when something is missing
#
# Invariants: nothing is installed or updated when every package is present (no `apt-get update`
# either), so a second run is instant and works offline; `apt-get update` runs at most once.
# Not root and something missing: the packages and the exact sudo command are printed, exit 1.
# The CUDA toolkit is not installed here: the build uses it when it finds one (see README.md).
set -euo pipefail

# Debian 12 names; Ubuntu 24.04 uses the same names.
packages=(
  # build
  build-essential cmake ninja-build git pkg-config clang-format
  # libraries
  libopenmpi-dev openmpi-bin libhdf5-dev libyaml-cpp-dev libgtest-dev googletest
  # analysis notebook
  python3-h5py python3-pandas python3-matplotlib jupyter-nbconvert python3-ipykernel python3-nbformat
  # local Slurm for the slurm tests; libpmix-dev carries the unversioned libpmix.so that Slurm's
  # mpi/pmix plugin loads at run time (without it `srun --mpi=pmix` fails).
  slurm-wlm munge libpmix-dev
)

check_only=0
case "${1:-}" in
  --check) check_only=1 ;;
  "") ;;
  -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
  *) echo "install-deps.sh: unknown argument '$1' (expected --check)" >&2; exit 2 ;;
esac

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
  echo "install-deps.sh: this machine has no dpkg/apt; install by hand the equivalents of:" >&2
  echo "  ${packages[*]}" >&2
  exit 1
fi

if [[ -r /etc/os-release ]]; then
  # shellcheck disable=SC1091
  . /etc/os-release
  case "${ID:-}:${VERSION_ID:-}" in
    debian:12|ubuntu:24.04) ;;
    *) echo "install-deps.sh: note: tested on Debian 12 and Ubuntu 24.04, this is ${PRETTY_NAME:-unknown}" >&2 ;;
  esac
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "install-deps.sh: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps.sh: missing ${#missing[@]} package(s): ${missing[*]}"
if ((check_only)); then exit 1; fi
if [[ $(id -u) -ne 0 ]]; then
  cat >&2 <<MSG

mtplab needs these system packages, and installing them needs root. Run:

  sudo apt-get update && sudo apt-get install -y ${missing[*]}

then run this script again.
MSG
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# No recommends: they add (for example) Fortran coarrays and a TeX-less PDF tool-chain that
# mtplab never uses, and roughly double the download on a fresh machine.
apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install-deps.sh: installed ${missing[*]}"
