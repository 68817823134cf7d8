#!/usr/bin/env bash
# `mtplab trace` from a checkpoint's trunk and from another trace's prompts, with the routing
# recorded, and `mtplab routing` on it (docs/trace-format.md "Routing", docs/target.md):
# - a synthetic trace with --routing, then the same target written as a checkpoint
#   (export_checkpoint --target) and run with --checkpoint --prompts on that trace: the same tokens,
#   hiddens and routing (trace_tool check's sums), as the loaded target is the synthetic one;
# - --prompts keeps each sequence's prompt and count of new tokens; --new-tokens overrides the count;
# - mtplab routing prints a row per (B, R) and the shape; B = 1, R = 1 has exactly top_k experts;
# - refusals: a trace without routing, --sequences / --prompt-len with --prompts, a batch larger
#   than the places, a checkpoint whose layers are missing.
#
#   test_trace_routing.sh MTPLAB TRACE_TOOL EXPORT_CHECKPOINT
set -uo pipefail
mtplab=$1 trace_tool=$2 export_checkpoint=$3
src=${MTPLAB_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
source "$src/tests/common/script.sh"
work=$(mktemp -d /tmp/mtplab-trace-routing.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1

has() { grep -qF -- "$2" "$1" || { fail "$1 lacks: $2"; cat "$1"; }; }

exits a.log 0 "synthetic trace with routing" "$mtplab" trace --model tiny --layers 2 --seed 5 --weight-seed 7 \
  --sequences 3 --prompt-len 9 --new-tokens 10 --routing --out a.h5
has a.log "routing recorded"
exits ck.log 0 "export the target" "$export_checkpoint" --target tiny 7 5 2 target.safetensors
exits b.log 0 "checkpoint trace from a.h5's prompts" "$mtplab" trace --model tiny --layers 2 \
  --checkpoint target.safetensors --prompts a.h5 --routing --batch 2 --out b.h5
exits ca.log 0 "trace_tool check a.h5" "$trace_tool" check a.h5
exits cb.log 0 "trace_tool check b.h5" "$trace_tool" check b.h5
has ca.log "routing 2 2 8"
grep -q '^route ' ca.log || fail "a.h5's check has no route lines"
# Everything but the provenance line is the same: tokens, hiddens and routing of every sequence.
if ! diff <(grep -v '^prov' ca.log) <(grep -v '^prov' cb.log) >diff.log; then
  fail "the checkpoint target's trace differs from the synthetic one"
  cat diff.log
fi

# --new-tokens with --prompts: each sequence keeps its prompt (9) and runs 4 new tokens.
exits c.log 0 "--prompts with --new-tokens" "$mtplab" trace --model tiny --layers 2 --seed 5 --weight-seed 7 \
  --prompts a.h5 --new-tokens 4 --out c.h5
has c.log "3 sequences, 39 positions"

# mtplab routing: the shape line, a row per (B, R); one row of one sequence routes to top_k.
exits r.log 0 "mtplab routing" "$mtplab" routing a.h5 --batch 1,3 --rows 1,2 --windows 8
has r.log "a.h5: 3 sequences, 2 layers, top_k 2 of 8 experts"
awk '$1 == 1 && $2 == 1 { found = 1; if ($3 != "2.00") bad = 1 } END { exit !(found && !bad) }' r.log ||
  { fail "B 1, R 1 is not exactly top_k = 2 distinct experts"; cat r.log; }
[[ $(grep -cE '^ +[13] +[12] ' r.log) == 4 ]] || { fail "mtplab routing printed not 4 rows"; cat r.log; }

# Refusals.
exits e1.log 1 "routing of a trace without routing" "$mtplab" routing c.h5
has e1.log "c.h5: the trace records no routing"
exits e2.log 1 "--sequences with --prompts" "$mtplab" trace --prompts a.h5 --sequences 2 --out d.h5
has e2.log "--sequences with --prompts"
exits e3.log 1 "--prompt-len with --prompts" "$mtplab" trace --prompts a.h5 --prompt-len 4 --out d.h5
has e3.log "--prompt-len with --prompts"
exits e4.log 1 "a batch past the places" "$mtplab" routing a.h5 --batch 31 --rows 1
has e4.log "30 places of 1 generated rows, fewer than the batch of 31"
exits e5.log 1 "a checkpoint without the layers asked for" "$mtplab" trace --model tiny --layers 3 \
  --checkpoint target.safetensors --prompts a.h5 --out d.h5
has e5.log "target.safetensors"
[[ ! -e d.h5 ]] || fail "a refused trace left d.h5"

echo "$failures failure(s)"
((failures == 0))
