#!/usr/bin/env bash
# app.format: every C++ / CUDA source the repository tracks is laid out as .clang-format says
# (clang-format --dry-run --Werror). Prints each file that differs and how to fix it; exit 1 when
# one does. Without clang-format: exit 77 (skipped), except under CI=true, where it is an error
# (scripts/install-deps.sh installs it).
#   test_format.sh SOURCE_DIR
set -uo pipefail
src=${1:?usage: test_format.sh SOURCE_DIR}
cd "$src" || exit 2
if ! command -v clang-format >/dev/null 2>&1; then
  if [[ ${CI:-} == true ]]; then
    echo "app.format: clang-format not found (scripts/install-deps.sh installs it)" >&2
    exit 1
  fi
  echo "app.format: clang-format not found: skipped"
  exit 77
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' '*.h')
else
  mapfile -t files < <(find apps bench dev lib tests tools -type f \( -name '*.cpp' -o -name '*.hpp' \
    -o -name '*.cu' -o -name '*.cuh' -o -name '*.h' \) 2>/dev/null | sort)
fi
((${#files[@]} > 0)) || { echo "app.format: no C++ / CUDA sources found under $src" >&2; exit 1; }
bad=()
for f in "${files[@]}"; do
  [[ -f $f ]] || continue
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "app.format: ${#bad[@]} of ${#files[@]} files differ from .clang-format ($(clang-format --version)):"
  printf '  %s\n' "${bad[@]}"
  echo "fix: clang-format -i ${bad[*]:0:3}$( ((${#bad[@]} > 3)) && echo " ...")"
  exit 1
fi
echo "app.format: ${#files[@]} files laid out as .clang-format says"
