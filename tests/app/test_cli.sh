#!/usr/bin/env bash
# The binary's front door: no command and an unknown command are usage errors (exit 2, usage on
# stderr); --help is not (exit 0, usage on stdout). Usage: test_cli.sh path/to/mtplab
set -uo pipefail
mtplab=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

# expect CODE DESCRIPTION -- ARGS...: runs mtplab ARGS, checks the exit code.
expect() {
  local want=$1 what=$2 rc
  shift 3
  "$mtplab" "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  if ((rc != want)); then
    echo "FAIL: $what: exit $rc, expected $want"; cat "$tmp/out" "$tmp/err"; failures=$((failures + 1))
    return 1
  fi
  echo "ok: $what (exit $rc)"
}

if expect 2 "unknown command" -- no-such-command; then
  grep -q 'unknown command "no-such-command"' "$tmp/err" ||
    { echo "FAIL: stderr does not name the unknown command"; cat "$tmp/err"; failures=$((failures + 1)); }
  grep -q '^usage: mtplab' "$tmp/err" || { echo "FAIL: no usage on stderr"; failures=$((failures + 1)); }
  [[ ! -s "$tmp/out" ]] || { echo "FAIL: unknown command wrote to stdout"; failures=$((failures + 1)); }
fi
expect 2 "no command" -- || true
if expect 0 "--help" -- --help; then
  grep -q '^  info ' "$tmp/out" || { echo "FAIL: --help does not list info"; failures=$((failures + 1)); }
fi

((failures == 0)) || { echo "$failures failure(s)"; exit 1; }
