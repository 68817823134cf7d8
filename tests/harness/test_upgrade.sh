#!/usr/bin/env bash
# `mtplab upgrade` and results schema version 3 end to end (docs/results-schema.md):
# - the version-2 file of tests/data upgrades into the results file that a rerun of its recorded
#   experiment resumes (every point already there), and reads with the analysis reader
#   (tests/harness/check_results.py);
# - the version-1 GPU file of tests/data upgrades, and check_results.py recomputes its figures
#   (acceptance, histogram, bootstrap intervals) from the steps and finds the ones written;
# - old files are refused by run (resume), merge and the reader with the advice to upgrade; upgrade
#   refuses a version-3 input and an OLD.h5 that does not exist, naming the file;
# - a run with arms at values other than their defaults: the reader's arms() of every point are
#   the config's, every arm and kernel field is there, and the /index columns agree.
# Usage: test_upgrade.sh MTPLAB PYTHON   (MTPLAB_SOURCE_DIR = repository root)
# Exit 77 (skipped) without h5py, numpy and pandas.
set -uo pipefail
mtplab=$1 python=$2
src=${MTPLAB_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
source "$src/tests/common/script.sh"
require_python "$python" h5py numpy pandas
check="$python $src/tests/harness/check_results.py"
work=$(mktemp -d /tmp/mtplab-upgrade-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1

# has LOG TEXT: LOG holds TEXT.
has() { grep -qF -- "$2" "$1" || { fail "$1 lacks: $2"; cat "$1"; }; }

v1=$src/tests/data/seed-ablations-gpu.h5
v2=$src/tests/data/results-v2.h5

# Version 2: upgraded, then resumed by a rerun of its own experiment (nothing runs).
exits up2.log 0 "upgrade of the version-2 file" "$mtplab" upgrade "$v2" v2-up.h5
has up2.log "(results schema version 2) to v2-up.h5 (version 3): 2 point(s)"
"$python" -c 'import sys, h5py; print(h5py.File(sys.argv[1], "r").attrs["experiment_yaml"].decode())' "$v2" >exp2.yaml
exits resume.log 0 "rerun into the upgraded file" "$mtplab" run exp2.yaml --out v2-up.h5
has resume.log "2 of 2 point(s) done, a run adds the other 0"
has resume.log "done: 0 point(s) written"
$check v2-up.h5 --points 2 --world 1 || fail "the upgraded version-2 file"

# Version 1: upgraded; every figure recomputed from the steps by the reader's checks.
exits up1.log 0 "upgrade of the version-1 file" "$mtplab" upgrade "$v1" v1-up.h5
has up1.log "(results schema version 1) to v1-up.h5 (version 3): 60 point(s)"
has up1.log "identity inputs: not recorded"
$check v1-up.h5 --points 60 --world 2 || fail "the upgraded version-1 file"

# Old files refused where they are read, with the advice.
cp "$v2" old.h5
exits merge.log 1 "merge of a version-2 file" "$mtplab" merge m.h5 old.h5
has merge.log "old.h5: results schema version 2; mtplab merge reads version 3 only: run \`mtplab upgrade old.h5 NEW.h5\`"
[[ -e m.h5 ]] && fail "a refused merge wrote m.h5"
exits run.log 2 "resume of a version-2 file" "$mtplab" run exp2.yaml --out old.h5
has run.log "old.h5: results schema version 2; mtplab run (resume) reads version 3 only: run \`mtplab upgrade old.h5 NEW.h5\`"
cmp -s old.h5 "$v2" || fail "a refused resume changed old.h5"
"$python" - old.h5 "$src/analysis" >reader.log 2>&1 <<'PY' || { fail "the reader read a version-2 file"; cat reader.log; }
import sys
sys.path.insert(0, sys.argv[2])
import mtplab_results as mr
try:
    mr.Results(sys.argv[1])
except ValueError as e:
    assert "results schema version 2" in str(e) and "mtplab upgrade old.h5 NEW.h5" in str(e), e
else:
    raise SystemExit("read a version-2 file")
PY
exits again.log 1 "upgrade of a version-3 file" "$mtplab" upgrade v2-up.h5 again.h5
has again.log "v2-up.h5: already results schema version 3; there is nothing to upgrade"
exits none.log 1 "upgrade of a missing file" "$mtplab" upgrade missing.h5 x.h5
has none.log "missing.h5: no such file"
[[ -e again.h5 || -e x.h5 ]] && fail "a refused upgrade wrote its output"

# Arms away from their defaults, through the writer and the reader.
cat >arms.yaml <<'YAML'
model: {preset: tiny, max_seq_len: 64}
weights: {synthetic: {seed: 3}}
trace: {synthetic: {sequences: 2, prompt_len: 8, new_tokens: 8, seed: 5, layers: 1}}
measure: {warmup_steps: 1, sequences: 0, max_steps: 3, repeats: 1}
backend: cpu
draft_len: 2
head_fp8: on
context_rows: full
draft_rows: keep
batch_qidx: on
kv_cache_dtype: fp8
context_gemm: on
index_share: on
batch_size: 2
record_margins: off
kernels: {gemv_variant: occ, gemv_split: 4, mla_decode: v1, pdl: off, nccl_blocking: off, head_gemm: mma,
          mla_batch_splits: 8, moe_pipeline: ringpf, rows_linear: gemv, mla_batch: tiles, indexer_scores: tiled}
sweep: {grid: {exchange: [packed_u64, allgather_pairs], replay: [speculative, teacher_forced]}}
YAML
exits arms.log 0 "a run with arms away from their defaults" "$mtplab" run arms.yaml --out arms.h5
"$python" - arms.h5 "$src/analysis" <<'PY' || fail "the arms as the reader reads them"
import sys
sys.path.insert(0, sys.argv[2])
import mtplab_results as mr
res = mr.Results(sys.argv[1])
arms = list(res.attrs["arms"])
assert len(arms) > 30 and "kernels.moe_pipeline" in arms and "index_share" in arms, arms
want = {"draft_len": 2, "head_fp8": "on", "context_rows": "full", "draft_rows": "keep", "batch_qidx": "on",
        "kv_cache_dtype": "fp8", "context_gemm": "on", "index_share": "on", "batch_size": 2,
        "record_margins": "off", "kernels.gemv_variant": "occ", "kernels.gemv_split": "4",
        "kernels.mla_decode": "v1", "kernels.pdl": "off", "kernels.nccl_blocking": "off", "kernels.head_gemm": "mma",
        "kernels.mla_batch_splits": "8", "kernels.moe_pipeline": "ringpf", "kernels.rows_linear": "gemv",
        "kernels.mla_batch": "tiles", "kernels.indexer_scores": "tiled"}
points = res.points
assert len(points) == 4, len(points)
for name in res.point_names:
    a = res.arms(name)
    assert list(a) == arms, (list(a), arms)
    config = mr.config_dict(res.group(name).attrs["config"])
    for arm, value in a.items():
        assert arm in config, (name, arm)
        # Typed as the arm's type (int, float, str); the config holds its canonical text.
        assert (value == config[arm]) if isinstance(value, str) else (float(value) == float(config[arm])), \
            (name, arm, value, config[arm])
        row = points[points["name"] == name].iloc[0]
        assert str(row[arm]) == str(value) or float(row[arm]) == float(value), (name, arm, row[arm], value)
    for arm, value in want.items():
        assert a[arm] == value, (name, arm, a[arm], value)
    assert a["exchange"] == res.assignment(name)["exchange"] and a["replay"] == res.assignment(name)["replay"]
    # The kernel each op ran: on the CPU backend the reference, "cpu", for every op noted.
    kernels = res.kernels(name)
    assert "linear" in kernels and set(kernels.values()) == {"cpu"}, kernels
print("arms read back:", len(arms), "per point,", len(points), "points")
PY

((failures == 0)) || { echo "$failures failure(s)"; exit 1; }
echo "all passed"
