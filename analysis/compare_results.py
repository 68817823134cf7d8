"""Compares what two mtplab results files measured, apart from time: the same points, configs,
drafts, targets, accepted lengths, acceptance figures, sequences and divergence rows. Timings,
dates, hosts and versions are not compared. Reads schema version 3 (mtplab_results; `mtplab upgrade`
rewrites an older file).

    python3 analysis/compare_results.py A.h5 B.h5        exit 0 when equal, 1 with the differences
    python3 analysis/compare_results.py A.h5 B.h5 --ignore-config kernels.gemv_split
                                     a config key known to differ (e.g. a kernel choice that changes
                                     timing only) is reported, not counted

Use it to show that a change to mtplab leaves results as they were (e.g. a file written before a
restructuring against one written after it), or that two machines agree.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

import mtplab_results as mr  # noqa: E402

POINT_ATTRS = ["label", "steps", "drafted", "accepted", "acceptance_rate", "tau", "per_position",
               "ranks_agree", "repeat_mismatches", "qidx_check_rows", "qidx_check_rows_differ",
               "qidx_check_entries_differ", "qidx_check_rows_multi", "warmup_steps", "repeats", "arms_not_applied"]
STEP_COLUMNS = ["repeat", "sequence", "position", "accepted", "warmup"]
SEQUENCE_COLUMNS = ["sequence", "prompt_len", "length", "steps"]
DIVERGENCE_COLUMNS = ["point", "reference", "axis", "value", "reference_value", "steps", "common_steps",
                      "differ_any", "differ_first", "rate_any", "rate_first"]


def same(a, b):
    a, b = mr._s(a), mr._s(b)
    if isinstance(a, (list, np.ndarray)) or isinstance(b, (list, np.ndarray)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return False
        if a.dtype.kind == "f" or b.dtype.kind == "f":
            return bool(np.array_equal(a.astype(float), b.astype(float), equal_nan=True))
        return bool(np.array_equal(a, b))
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return True
    return a == b


def config_lines(text):
    """A canonical config as {key path: value} (it is YAML written by mtplab: one key per line)."""
    out, stack = {}, []
    for line in mr._s(text).splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip())) // 2
        key, _, value = line.strip().partition(":")
        stack = stack[:depth] + [key]
        if value.strip():
            out[".".join(stack)] = value.strip()
    return out


def compare(path_a, path_b, ignore_config=()):
    a, b = mr.Results(path_a), mr.Results(path_b)
    diffs, ignored = [], set()
    if a.axes != b.axes:
        diffs.append(f"sweep axes {a.axes} vs {b.axes}")
    for ax in a.axes:
        if a.axis_values.get(ax) != b.axis_values.get(ax):
            diffs.append(f"values of axis {ax}: {a.axis_values.get(ax)} vs {b.axis_values.get(ax)}")
    if a.point_names != b.point_names:
        diffs.append(f"points {a.point_names} vs {b.point_names}")
    compared = 0
    for name in sorted(set(a.point_names) & set(b.point_names)):
        ga, gb = a.group(name), b.group(name)
        for attr in POINT_ATTRS:
            if (attr in ga.attrs) != (attr in gb.attrs):
                diffs.append(f"{name}: attribute {attr} only in {'A' if attr in ga.attrs else 'B'}")
            elif attr in ga.attrs and not same(ga.attrs[attr], gb.attrs[attr]):
                diffs.append(f"{name}: {attr} differs")
        ca, cb = config_lines(ga.attrs["config"]), config_lines(gb.attrs["config"])
        for key in sorted(set(ca) | set(cb)):
            if ca.get(key) != cb.get(key):
                if key in ignore_config:
                    ignored.add(f"config {key}: {ca.get(key, '(absent)')} vs {cb.get(key, '(absent)')}")
                    continue
                diffs.append(f"{name}: config {key}: {ca.get(key, '(absent)')} vs {cb.get(key, '(absent)')}")
        asg_a = {k: str(v) for k, v in a.assignment(name).items()}
        asg_b = {k: str(v) for k, v in b.assignment(name).items()}
        if asg_a != asg_b:
            diffs.append(f"{name}: assignment {asg_a} vs {asg_b}")
        for what in ("drafts", "targets"):
            if not same(ga[what][()], gb[what][()]):
                diffs.append(f"{name}: {what} differ")
        for c in STEP_COLUMNS:
            if not same(ga["steps"][c][()], gb["steps"][c][()]):
                diffs.append(f"{name}: steps/{c} differs")
        for c in SEQUENCE_COLUMNS:
            if not same(ga["sequences"][c][()], gb["sequences"][c][()]):
                diffs.append(f"{name}: sequences/{c} differs")
        compared += 1
    da, db = a.stored_divergence(), b.stored_divergence()
    if len(da) != len(db):
        diffs.append(f"/divergence has {len(da)} vs {len(db)} rows")
    else:
        for c in DIVERGENCE_COLUMNS:
            if c in da and c in db and not same(list(da[c]), list(db[c])):
                diffs.append(f"/divergence column {c} differs")
    return compared, len(da), diffs, ignored


def main(argv):
    ignore = []
    while "--ignore-config" in argv:
        i = argv.index("--ignore-config")
        if i + 1 >= len(argv):
            print("--ignore-config needs a key")
            return 2
        ignore.append(argv[i + 1])
        del argv[i:i + 2]
    if len(argv) != 3:
        print(__doc__.strip())
        return 2
    compared, divergence_rows, diffs, ignored = compare(argv[1], argv[2], ignore)
    for d in sorted(ignored):
        print("ignored (--ignore-config):", d)
    for d in diffs:
        print("DIFF:", d)
    verdict = "equal" if not diffs else f"{len(diffs)} difference(s)"
    print(f"{argv[1]} vs {argv[2]}: {compared} point(s), {divergence_rows} divergence row(s) compared: {verdict}")
    return 0 if not diffs else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
