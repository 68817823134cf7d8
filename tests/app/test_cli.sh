#!/usr/bin/env bash
# The binary's front door: no command and an unknown command are usage errors (exit 2, usage on
# stderr); --help is not (exit 0, usage on stdout); --version prints the version, the git commit
# and the backends. A sub-command's bad option is an error (exit 1) that names it: an unknown one
# with the option it most likely meant, a repeated one, a number out of range; no rank tag (MPI is
# not up yet) and no source location unless -v or MTPLAB_DEBUG=1; a bad MTPLAB_DEBUG, MTPLAB_LOG or
# MTPLAB_PROGRESS_S is an error naming it. `mtplab run --help` lists the exit codes.
# Usage: test_cli.sh path/to/mtplab
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

# has_err TEXT: stderr of the last command holds TEXT (fixed string).
has_err() { grep -qF -- "$1" "$tmp/err" || { echo "FAIL: stderr lacks: $1"; cat "$tmp/err"; failures=$((failures + 1)); }; }

if expect 1 "a misspelt option" -- run --pont 1 exp.yaml; then
  has_err 'mtplab run: unknown option "--pont", did you mean --point?'
fi
if expect 1 "an option given twice" -- run exp.yaml --out a.h5 --out=b.h5; then
  has_err 'mtplab run: --out is given more than once'
fi
if expect 1 "a number out of range" -- trace --out t.h5 --sequences 0; then
  has_err 'mtplab trace: --sequences 0 is out of range [1, 1048576]'
fi
if expect 1 "not a number" -- list exp.yaml --ranks=two; then
  has_err 'mtplab list: --ranks expects an integer, got "two"'
fi
if expect 1 "a value not among the choices" -- info --backend tpu; then
  has_err 'mtplab info: --backend "tpu" is not one of auto, cpu, cuda'
fi
if expect 1 "two experiment files" -- run a.yaml b.yaml; then
  has_err 'mtplab run: expected one experiment file, got 2 arguments: "a.yaml", "b.yaml"'
fi
if expect 1 "--point given twice" -- run exp.yaml --point 1 --point 2; then
  has_err 'mtplab run: --point is given more than once'
fi

# No rank tag before MPI is up, no source location unless asked for.
if expect 1 "an argument error" -- run --pont 1 exp.yaml; then
  grep -q '^mtplab run: ' "$tmp/err" || { echo "FAIL: the message does not start the line"; cat "$tmp/err"; failures=$((failures + 1)); }
  if grep -qE 'rank -1|\.cpp:[0-9]+\)' "$tmp/err"; then
    echo "FAIL: an argument error carries a rank tag or a source location"; cat "$tmp/err"; failures=$((failures + 1))
  fi
fi
for verbose in "-v run" "run --verbose" "MTPLAB_DEBUG=1"; do
  if [[ $verbose == MTPLAB_DEBUG=1 ]]; then
    MTPLAB_DEBUG=1 "$mtplab" run --pont 1 exp.yaml >"$tmp/out" 2>"$tmp/err"
  else
    # shellcheck disable=SC2086
    "$mtplab" $verbose --pont 1 exp.yaml >"$tmp/out" 2>"$tmp/err"
  fi
  if grep -qE '^mtplab run: unknown option "--pont".*\(cli\.cpp:[0-9]+\)$' "$tmp/err"; then
    echo "ok: $verbose adds the source location"
  else
    echo "FAIL: $verbose: no source location"; cat "$tmp/err"; failures=$((failures + 1))
  fi
done
if MTPLAB_DEBUG=yes expect 1 "a malformed MTPLAB_DEBUG" -- list exp.yaml; then
  has_err 'MTPLAB_DEBUG=yes is not one of: 0, 1'
fi
# The logging variables are read strictly too: a bad value is an error naming it, not ignored.
if MTPLAB_LOG=verbose expect 1 "a malformed MTPLAB_LOG" -- list exp.yaml; then
  has_err 'MTPLAB_LOG=verbose is not one of: error, warn, info, debug'
fi
if MTPLAB_PROGRESS_S=fast expect 1 "a malformed MTPLAB_PROGRESS_S" -- list --ranks 2 exp.yaml; then
  has_err 'MTPLAB_PROGRESS_S=fast is not a number of seconds >= 0'
fi
if MTPLAB_LOG=loud expect 1 "a malformed MTPLAB_LOG (merge, no MPI)" -- merge "$tmp/m.h5" "$tmp/a.h5"; then
  has_err 'MTPLAB_LOG=loud is not one of: error, warn, info, debug'
fi

if expect 0 "--version" -- --version; then
  grep -qE '^mtplab [0-9]+\.[0-9]+\.[0-9]+$' "$tmp/out" || { echo "FAIL: no version line"; cat "$tmp/out"; failures=$((failures + 1)); }
  grep -qE '^git ([0-9a-f]{40}|unknown)' "$tmp/out" || { echo "FAIL: no git line"; cat "$tmp/out"; failures=$((failures + 1)); }
  grep -qE '^backends: cpu' "$tmp/out" || { echo "FAIL: no backends line"; cat "$tmp/out"; failures=$((failures + 1)); }
fi
if expect 2 "an unknown global option" -- --verison; then
  has_err 'mtplab: unknown option "--verison"'
fi

# The exit codes `mtplab run --help` states (tests/app/test_run_end.sh checks each of them).
if expect 0 "run --help" -- run --help; then
  for code in "0    every requested point" "1    an error" "124  a collective, or the start-up (MTPLAB_STARTUP_TIMEOUT_S), timed out" "130  stopped by SIGINT" \
              "143  stopped by SIGTERM"; do
    grep -qF -- "  $code" "$tmp/out" || { echo "FAIL: run --help lacks exit code: $code"; failures=$((failures + 1)); }
  done
fi

for cmd in info trace list run merge; do
  if expect 0 "$cmd --help" -- "$cmd" --help; then
    grep -q "^usage: mtplab $cmd" "$tmp/out" || { echo "FAIL: $cmd --help has no usage line"; failures=$((failures + 1)); }
  fi
done

((failures == 0)) || { echo "$failures failure(s)"; exit 1; }
